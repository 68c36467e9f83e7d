/**
 * The packing view: where every tensor lives in memory over time, for the planned packing (OLLA's
 * address plan) and for PyTorch's caching allocator (simulated by solvers.allocator) side by side.
 * The rectangles are painted into one canvas image per panel, placed on the plot's data axes and
 * repainted for the visible window after every zoom, pan or resize; the hover is the view's own: a hit
 * test of the rectangles under the cursor (packing_data.ts).  So 10k tensors draw in a fraction of a
 * second.  Tensor names reach the tooltip through textContent only.
 */
import {
  addressFilter,
  addressFilterLabel,
  changingRange,
  hitTest,
  PackingPanel,
  packingFigure,
  packingTraces,
  pixelRects,
  placementLines,
  Window
} from './packing_data';
import { themedAxis, themedLayout } from './theme';
import { PlanDoc } from './transforms';
import { element, loadedPlotly, loadPlotly, observeTheme, PlotlyModule, themeColors } from './ui';
import type { PlanView } from './views';

/**
 * The parts of plotly's internal full layout the repaint and the hover read: each axis's range, pixel
 * offset and length in the plot div, and its pixel -> data conversion.
 */
type FullAxis = { range: [number, number]; _offset: number; _length: number; p2c(px: number): number };
type LegendClick = { curveNumber: number; data: { legendgroup?: string }[] };
type PlotDiv = HTMLDivElement & {
  _fullLayout?: Record<string, FullAxis | undefined>;
  on?(event: 'plotly_relayout', handler: (update: Record<string, unknown>) => void): void;
  on?(
    event: 'plotly_legendclick' | 'plotly_legenddoubleclick',
    handler: (click: LegendClick) => boolean
  ): void;
};

/** The packing figure's height in CSS pixels (the plot div is pinned to it: see `draw`). */
const PACKING_HEIGHT = 460;

/** Paint one panel's rectangles, as seen through `win`, into a PNG data URL of the given pixel size. */
function paint(
  panel: PackingPanel,
  win: Window,
  width: number,
  height: number,
  hidden: ReadonlySet<string>
): string {
  const canvas = document.createElement('canvas');
  canvas.width = Math.max(1, Math.round(width));
  canvas.height = Math.max(1, Math.round(height));
  const g = canvas.getContext('2d');
  if (!g) {
    throw new Error('memviz: this browser gives no 2D canvas to draw the packing on');
  }
  for (const layer of panel.layers.filter(l => !hidden.has(l.category))) {
    const px = pixelRects(layer.rects, win, canvas.width, canvas.height);
    g.fillStyle = layer.color;
    g.beginPath();
    for (let i = 0; i < px.length; i += 4) {
      g.rect(px[i], px[i + 1], px[i + 2], px[i + 3]);
    }
    g.fill();
  }
  return canvas.toDataURL('image/png');
}

export class PackingView implements PlanView {
  readonly node = element('div', 'jp-memviz-packing');
  private readonly _plot: PlotDiv = element('div', 'jp-memviz-plot');
  private readonly _message = element('div', 'jp-memviz-packing-message');
  private readonly _tip = element('div', 'jp-memviz-packing-tip');
  /** the outline of the tensor under the cursor: a sliver among bands is seen whole */
  private readonly _outline = element('div', 'jp-memviz-packing-outline');
  private readonly _zoomChanging = element('button', 'jp-memviz-packing-zoom-changing jp-mod-styled');
  private readonly _zoomAll = element('button', 'jp-memviz-packing-zoom-all jp-mod-styled', 'All addresses');
  /** which address range is shown: the pressed button says it too (`_showFilter`) */
  private readonly _filter = element('span', 'jp-memviz-packing-filter');
  private readonly _tools = element('div', 'jp-memviz-packing-tools');
  private _unit = '';
  private readonly _stopTheme: () => void;
  private _disposed = false;
  private _drawn = false;
  private _listening = false;
  private _doc: PlanDoc | null = null;
  private _panels: PackingPanel[] = [];
  /** categories switched off in the legend: neither painted nor hovered */
  private readonly _hidden = new Set<string>();

  constructor() {
    this._tip.hidden = true;
    this._outline.hidden = true;
    this._filter.setAttribute('role', 'status');
    this._tools.append(this._zoomChanging, this._zoomAll, this._filter);
    this._zoomChanging.addEventListener('click', () => void this._zoomTo(this._changing()));
    this._zoomAll.addEventListener('click', () => void this._zoomTo(null));
    this.node.append(this._message, this._tools, this._plot, this._tip, this._outline);
    this._plot.addEventListener('mousemove', event => this._hover(event));
    this._plot.addEventListener('mouseleave', () => {
      this._tip.hidden = true;
      this._outline.hidden = true;
    });
    this._stopTheme = observeTheme(() => {
      if (this._doc) {
        void this.draw(this._doc);
      }
    });
  }

  update(doc: PlanDoc): Promise<void> {
    return this.draw(doc);
  }

  /** Render the packing of `doc`; resolves once plotly has drawn the axes and the rectangles. */
  async draw(doc: PlanDoc): Promise<void> {
    this._doc = doc;
    // plotly.react shows every legend key again: so are the rectangles.
    this._hidden.clear();
    const figure = packingFigure(doc);
    this._panels = figure.panels;
    if (figure.panels.length === 0) {
      this._message.textContent = 'This plan has no packing (plan with a strategy that packs, e.g. "olla").';
      this._plot.hidden = true;
      this._tools.hidden = true;
      return;
    }
    this._message.textContent = '';
    this._plot.hidden = false;
    this._tools.hidden = false;
    const changing = this._changing();
    this._zoomChanging.disabled = changing === null;
    this._zoomChanging.textContent = changing
      ? `Addresses that change: ${changing[0].toFixed(1)}\u2013${changing[1].toFixed(1)} ${figure.unit.name}`
      : 'Addresses that change: all of them';
    this._zoomChanging.title =
      'zoom the address axis to where tensors come and go, above what every step holds';
    this._unit = figure.unit.name;
    const colors = themeColors(this.node);
    const axis = themedAxis(colors);
    const two = figure.panels.length > 1;
    const ymax = Math.max(...figure.panels.map(p => p.ymax), 1e-9);
    // The div's own CSS height is the figure's.  plotly's resize (`Plots.resize`, on every tab switch
    // and output resize) drops `layout.height` and turns autosize on; every later relayout, such as the
    // repaint after a legend click, then reads the div's computed height.  Read during plotly's redraw
    // of the legend, an unpinned div measured its CSS min-height (420 px), not 460: the figure shrank by
    // 40 px and the x-axis titles sank onto the legend (reproduced with the CPU throttled: packing.spec).
    this._plot.style.height = `${PACKING_HEIGHT}px`;
    const layout: Record<string, unknown> = {
      ...themedLayout(colors),
      height: PACKING_HEIGHT,
      // the bottom margin holds the x-axis titles and, below them, the legend; the top one a title's
      // third line when it has one (what the time limit cut, packingCutNote)
      margin: { l: 60, r: 20, t: figure.titles.some(t => t.split('<br>').length > 2) ? 72 : 56, b: 76 },
      // The view hovers itself (see _hover): plotly has no points to hover.
      hovermode: false,
      // At the figure's bottom edge (plotly's container reference), not a fraction of the plot's height
      // below it: there its top sat 8 px above the x-axis titles' bottom.
      legend: { orientation: 'h', yref: 'container', y: 0, yanchor: 'bottom' },
      // Explicit ranges: the image is not data plotly autoranges over, and double-click returns here.
      xaxis: {
        ...axis,
        domain: two ? [0, 0.48] : [0, 1],
        range: [0, figure.panels[0].xmax],
        title: { text: 'schedule step' }
      },
      yaxis: { ...axis, title: { text: `address (${figure.unit.name})` }, range: [0, ymax] },
      annotations: figure.titles.map((text, i) => ({
        // Centred over its own subplot (plotly's "x domain" reference), whatever the figure width.
        xref: i === 0 ? 'x domain' : 'x2 domain',
        yref: 'paper',
        x: 0.5,
        xanchor: 'center',
        y: 1.02,
        yanchor: 'bottom',
        showarrow: false,
        // Built from numbers and fixed words only (packing_data.ts), nothing from the plan's names.
        text,
        font: { size: 12, color: colors.font }
      }))
    };
    if (two) {
      layout.xaxis2 = {
        ...axis,
        domain: [0.52, 1],
        anchor: 'y2',
        range: [0, figure.panels[1].xmax],
        title: { text: 'schedule step' }
      };
      // Same address scale on both sides so the allocator's extra reserved memory is visible.
      layout.yaxis2 = { ...axis, anchor: 'x2', matches: 'y', showticklabels: false };
    }
    const Plotly = await loadPlotly();
    if (this._disposed) {
      return;
    }
    await Plotly.react(
      this._plot,
      packingTraces(figure.panels) as unknown as Record<string, unknown>[],
      layout,
      {
        displaylogo: false,
        responsive: true
      }
    );
    this._drawn = true;
    this._listen(Plotly);
    this._showFilter();
    await this._repaint(Plotly);
  }

  /** Press the button of the address range shown (neither after a drag zoom) and name the range. */
  private _showFilter(): void {
    const ya = this._plot._fullLayout?.yaxis;
    if (!ya) {
      return;
    }
    const ymax = Math.max(...this._panels.map(p => p.ymax), 1e-9);
    const range: [number, number] = [ya.range[0], ya.range[1]];
    const filter = addressFilter(range, this._changing(), ymax);
    for (const [button, pressed] of [
      [this._zoomChanging, filter === 'changing'],
      [this._zoomAll, filter === 'all']
    ] as const) {
      button.classList.toggle('jp-mod-current', pressed);
      button.setAttribute('aria-pressed', String(pressed));
    }
    this._filter.dataset.filter = filter;
    this._filter.textContent = addressFilterLabel(filter, range, this._unit);
  }

  /** The changing address range over every panel (the planned one first), or null. */
  private _changing(): [number, number] | null {
    const ranges = this._panels.map(changingRange).filter((r): r is [number, number] => r !== null);
    return ranges.length ? [Math.min(...ranges.map(r => r[0])), Math.max(...ranges.map(r => r[1]))] : null;
  }

  /** Set the address axis to `range` (null: all addresses); the image repaints on plotly's relayout. */
  private async _zoomTo(range: [number, number] | null): Promise<void> {
    const Plotly = loadedPlotly();
    if (!Plotly || !this._drawn) {
      return;
    }
    const ymax = Math.max(...this._panels.map(p => p.ymax), 1e-9);
    this._outline.hidden = true;
    await (await Plotly).relayout(this._plot, { 'yaxis.range': range ?? [0, ymax] });
  }

  /** Repaint the rectangles for the axes' current ranges and pixel sizes. */
  private async _repaint(Plotly: PlotlyModule): Promise<void> {
    const full = this._plot._fullLayout;
    if (!full || this._disposed) {
      return;
    }
    const images = this._panels.flatMap((panel, i) => {
      const xname = i === 0 ? 'xaxis' : `xaxis${i + 1}`;
      const yname = i === 0 ? 'yaxis' : `yaxis${i + 1}`;
      const xa = full[xname];
      const ya = full[yname];
      if (!xa || !ya || xa._length <= 0 || ya._length <= 0) {
        return [];
      }
      const win = { x0: xa.range[0], x1: xa.range[1], y0: ya.range[0], y1: ya.range[1] };
      // Device pixels, so the image is as sharp as the screen.
      const ratio = window.devicePixelRatio || 1;
      return [
        {
          source: paint(panel, win, xa._length * ratio, ya._length * ratio, this._hidden),
          xref: xname.replace('axis', ''),
          yref: yname.replace('axis', ''),
          x: win.x0,
          y: win.y1,
          sizex: win.x1 - win.x0,
          sizey: win.y1 - win.y0,
          xanchor: 'left',
          yanchor: 'top',
          sizing: 'stretch',
          // over the grid lines, as the rectangles of a trace would be
          layer: 'above'
        }
      ];
    });
    await Plotly.relayout(this._plot, { images });
  }

  /** Show the tensor under the cursor, if any, in the tooltip. */
  private _hover(event: MouseEvent): void {
    const full = this._plot._fullLayout;
    const doc = this._doc;
    this._tip.hidden = true;
    this._outline.hidden = true;
    if (!full || !doc || event.buttons !== 0) {
      return;
    }
    const bounds = this._plot.getBoundingClientRect();
    const px = event.clientX - bounds.left;
    const py = event.clientY - bounds.top;
    this._panels.forEach((panel, i) => {
      const xa = full[i === 0 ? 'xaxis' : `xaxis${i + 1}`];
      const ya = full[i === 0 ? 'yaxis' : `yaxis${i + 1}`];
      if (
        !xa ||
        !ya ||
        px < xa._offset ||
        px > xa._offset + xa._length ||
        py < ya._offset ||
        py > ya._offset + ya._length
      ) {
        return;
      }
      const hit = hitTest(panel, xa.p2c(px - xa._offset), ya.p2c(py - ya._offset), this._hidden);
      if (!hit) {
        return;
      }
      this._tip.replaceChildren(...placementLines(doc, hit).map(line => element('div', '', line)));
      // Right of the cursor on the left half, left of it on the right half: never past the plot's edge.
      const right = px > bounds.width / 2;
      this._tip.style.left = `${right ? px - 12 : px + 12}px`;
      this._tip.style.transform = right ? 'translateX(-100%)' : '';
      this._tip.style.top = `${py + this._plot.offsetTop + 12}px`;
      this._tip.hidden = false;
      this._outlineBox(panel, panel.placements.indexOf(hit), xa, ya);
    });
  }

  /** Outline placement `index` of `panel` (clipped to the plot area), over the image. */
  private _outlineBox(panel: PackingPanel, index: number, xa: FullAxis, ya: FullAxis): void {
    const b = panel.boxes.slice(4 * index, 4 * index + 4);
    const px = (v: number): number =>
      xa._offset + ((v - xa.range[0]) / (xa.range[1] - xa.range[0])) * xa._length;
    const py = (v: number): number =>
      ya._offset + (1 - (v - ya.range[0]) / (ya.range[1] - ya.range[0])) * ya._length;
    const clampX = (v: number): number => Math.min(Math.max(v, xa._offset), xa._offset + xa._length);
    const clampY = (v: number): number => Math.min(Math.max(v, ya._offset), ya._offset + ya._length);
    const [left, right] = [clampX(px(b[0])), clampX(px(b[2]))];
    const [top, bottom] = [clampY(py(b[3])), clampY(py(b[1]))];
    const s = this._outline.style;
    s.left = `${this._plot.offsetLeft + left - 2}px`;
    s.top = `${this._plot.offsetTop + top - 2}px`;
    s.width = `${Math.max(right - left, 1)}px`;
    s.height = `${Math.max(bottom - top, 1)}px`;
    this._outline.hidden = false;
  }

  /**
   * Once per plot div (plotly keeps handlers across `react`): repaint after zoom, pan and resize, and
   * when a legend key switches a category (the keys are empty traces: the rectangles are the image).
   */
  private _listen(Plotly: PlotlyModule): void {
    if (this._listening || !this._plot.on) {
      return;
    }
    this._listening = true;
    this._plot.on('plotly_relayout', update => {
      // Our own image update comes back through this event: repainting on it would never stop.
      if (Object.keys(update).every(key => key.startsWith('images'))) {
        return;
      }
      this._showFilter();
      void this._repaint(Plotly);
    });
    this._plot.on('plotly_legendclick', click => {
      const category = click.data[click.curveNumber]?.legendgroup;
      if (category) {
        if (!this._hidden.delete(category)) {
          this._hidden.add(category);
        }
        void this._repaint(Plotly);
      }
      return true; // plotly greys the key out (or back in)
    });
    // Isolating one key would have to repaint by plotly's rules too: one click per category is enough.
    this._plot.on('plotly_legenddoubleclick', () => false);
  }

  resize(): void {
    if (this._drawn && this._plot.isConnected) {
      void loadedPlotly()?.then(Plotly => Plotly.Plots.resize(this._plot));
    }
  }

  dispose(): void {
    this._disposed = true;
    this._stopTheme();
    if (this._drawn) {
      void loadedPlotly()?.then(Plotly => Plotly.purge(this._plot));
    }
  }
}
