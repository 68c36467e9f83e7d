/**
 * The plan view: a readout header, the memory-over-time chart (drawn with the plotly.js bundled in this
 * extension: no CDN, so saved notebooks render offline), an x-axis switch (schedule step or estimated
 * time) and the step inspector: clicking the chart lists the largest tensors resident at that step.
 * Names from the plan only ever reach the DOM through textContent, or through plotly after
 * `escapeHtml` (see transforms.ts).
 */
import { inspectStep, MODULE_DEPTH, StepInspection } from './inspect_data';
import {
  backwardStart,
  categoryShares,
  escapeHtml,
  formatBytes,
  hasStepTimes,
  hoverBoxLeft,
  PlanDoc,
  planFigure,
  planReadouts,
  planTitle,
  stepEdges,
  XAxis
} from './transforms';
import { ThemeColors, themedAxis, themedLayout } from './theme';
import { element, loadedPlotly, loadPlotly, observeTheme, themeColors } from './ui';

/** A shaded x range (schedule steps) of the memory chart, e.g. a chunked region. */
export interface Region {
  x0: number;
  x1: number;
  label: string;
}

/** How many tensors the step inspector lists. */
const INSPECT_LIMIT = 10;

/** Readouts as labelled spans (the chart header's). */
export function readoutSpans(
  readouts: readonly { label: string; value: string; warning?: boolean }[]
): HTMLElement[] {
  return readouts.map(r => {
    const item = element(
      'span',
      r.warning ? 'jp-memviz-readout jp-memviz-readout-warning' : 'jp-memviz-readout'
    );
    item.dataset.readout = r.label;
    if (r.warning) {
      item.setAttribute('role', 'note');
    }
    item.append(
      element('span', 'jp-memviz-readout-label', `${r.label}: `),
      element('span', 'jp-memviz-readout-value', r.value)
    );
    return item;
  });
}

/** The inspector table of one step: plain text cells. */
function inspectionTable(
  inspection: StepInspection,
  layers: { category: string; bytes: number }[]
): HTMLElement[] {
  const caption = element(
    'div',
    'jp-memviz-inspect-caption',
    `step ${inspection.step}: ${inspection.action} — ${inspection.count} tensors resident, ` +
      `${formatBytes(inspection.totalBytes)}; the ${inspection.largest.length} largest:`
  );
  // what the compact hover leaves out: the op's source line and the chart's layers at this step
  const details = [
    ...(inspection.source ? [`source: ${inspection.source}`] : []),
    `layers: ${layers.map(l => `${l.category} ${formatBytes(l.bytes)}`).join(', ') || 'none'}`
  ];
  const layersLine = element('div', 'jp-memviz-inspect-layers', details.join(' · '));
  const table = element('table', 'jp-memviz-inspect-table');
  const head = element('tr', '');
  for (const title of ['tensor', 'kind', 'bytes', 'producer op', 'module']) {
    head.append(element('th', '', title));
  }
  table.append(head);
  for (const row of inspection.largest) {
    const tr = element('tr', 'jp-memviz-inspect-row');
    tr.append(
      element('td', '', row.name),
      element('td', '', row.kind),
      element('td', 'jp-memviz-inspect-bytes', formatBytes(row.bytes)),
      element('td', '', row.producer || '—'),
      element('td', '', row.module || '—')
    );
    table.append(tr);
  }
  return [caption, layersLine, table, ...moduleTable(inspection)];
}

/** The step's resident bytes per module (`moduleBreakdown`), the largest `INSPECT_LIMIT`; plain text. */
function moduleTable(inspection: StepInspection): HTMLElement[] {
  const shown = inspection.byModule.slice(0, INSPECT_LIMIT);
  const rest = inspection.byModule.length - shown.length;
  const caption = element(
    'div',
    'jp-memviz-inspect-subcaption',
    `by module (producing op's module, ${MODULE_DEPTH} levels)` +
      (rest > 0 ? `; ${rest} more not listed:` : ':')
  );
  const table = element('table', 'jp-memviz-inspect-table jp-memviz-inspect-modules');
  const head = element('tr', '');
  for (const title of ['module', 'bytes', 'share', 'tensors']) {
    head.append(element('th', '', title));
  }
  table.append(head);
  for (const share of shown) {
    const tr = element('tr', 'jp-memviz-inspect-module');
    const percent = inspection.totalBytes > 0 ? (100 * share.bytes) / inspection.totalBytes : 0;
    tr.append(
      element('td', '', share.module),
      element('td', 'jp-memviz-inspect-bytes', formatBytes(share.bytes)),
      element('td', 'jp-memviz-inspect-bytes', `${percent.toFixed(1)}%`),
      element('td', 'jp-memviz-inspect-bytes', String(share.count))
    );
    table.append(tr);
  }
  return [caption, table];
}

type PlotPoint = { curveNumber: number; pointNumber: number; x: number };
type ClickablePlot = HTMLElement & {
  on?: (event: string, handler: (data: { points?: PlotPoint[] }) => void) => void;
  /** plotly's full layout: the x axis's range and pixel extent in the figure */
  _fullLayout?: { xaxis?: { range: [number, number]; _offset: number; _length: number } };
};

export class PlanChart {
  readonly node: HTMLDivElement;
  private readonly _header = element('div', 'jp-memviz-readouts');
  private readonly _toolbar = element('div', 'jp-memviz-chart-toolbar');
  private readonly _axisButtons: Record<XAxis, HTMLButtonElement> = {
    step: element('button', 'jp-memviz-xaxis jp-mod-styled', 'x: schedule step'),
    time: element('button', 'jp-memviz-xaxis jp-mod-styled', 'x: estimated time')
  };
  private readonly _plot = element('div', 'jp-memviz-plot');
  private readonly _inspector = element('div', 'jp-memviz-inspect');
  private readonly _stopTheme: () => void;
  private _doc: PlanDoc | null = null;
  private _disposed = false;
  private _marked: number | null = null;
  private _regions: Region[] = [];
  private _axis: XAxis = 'step';
  /** the strategy the user selected (the planner's selector), so the readouts relate the plan to it */
  private _selected: string | null = null;
  /** trace indices drawn from the planned schedule (point number = planned step) */
  private _plannedTraces = new Set<number>();
  private _listening = false;
  /** the hovered point's x in pixels from the figure's left (null: none), where the hover box belongs */
  private _hoverX: number | null = null;
  /** re-places plotly's unified hover box each time plotly draws it (`_placeHover`) */
  private readonly _hoverObserver = new MutationObserver(() => this._placeHover());

  constructor() {
    this.node = element('div', 'jp-memviz-chart');
    for (const axis of ['step', 'time'] as const) {
      const button = this._axisButtons[axis];
      button.dataset.axis = axis;
      button.addEventListener('click', () => this.setAxis(axis));
    }
    const hint = element(
      'span',
      'jp-memviz-chart-hint',
      'click the chart to list the tensors live at a step, and their bytes by module'
    );
    this._toolbar.append(this._axisButtons.step, this._axisButtons.time, hint);
    this.node.append(this._header, this._toolbar, this._plot, this._inspector);
    this._stopTheme = observeTheme(() => this._redraw());
  }

  /** Draw a vertical marker at planned step `step` (null removes it), e.g. for a clicked graph node. */
  markStep(step: number | null): void {
    this._marked = step;
    this._redraw();
  }

  /** Shade the given x ranges (schedule steps), each labelled at its top. */
  setRegions(regions: Region[]): void {
    this._regions = regions.map(r => ({ ...r }));
    this._redraw();
  }

  /** The strategy selected in the planner (null: none, e.g. a static plan): the readouts relate to it. */
  set selected(strategy: string | null) {
    if (strategy !== this._selected) {
      this._selected = strategy;
      if (this._doc) {
        this._header.replaceChildren(...readoutSpans(planReadouts(this._doc, strategy)));
      }
    }
  }

  /** Plot against schedule steps or against estimated time. */
  setAxis(axis: XAxis): void {
    this._axis = axis;
    this._redraw();
  }

  get markedStep(): number | null {
    return this._marked;
  }

  /** Mark planned step `step` and list the largest tensors resident while it runs. */
  inspect(step: number): void {
    if (!this._doc) {
      return;
    }
    this._inspector.replaceChildren(
      ...inspectionTable(inspectStep(this._doc, step, INSPECT_LIMIT), categoryShares(this._doc, step))
    );
    this._inspector.dataset.step = String(step);
    this.markStep(step);
  }

  private _redraw(): void {
    if (this._doc) {
      void this.draw(this._doc);
    }
  }

  /** Plotly shapes and annotations for the step marker and the shaded regions (labels escaped). */
  private _overlays(
    colors: ThemeColors,
    x: (step: number) => number,
    backward: number | null
  ): { shapes: unknown[]; annotations: unknown[] } {
    const shapes: unknown[] = this._regions.map(r => ({
      type: 'rect',
      xref: 'x',
      yref: 'paper',
      x0: x(r.x0),
      x1: x(r.x1),
      y0: 0,
      y1: 1,
      fillcolor: colors.region,
      opacity: 0.18,
      line: { width: 0 },
      layer: 'below'
    }));
    const annotations: unknown[] = this._regions.map(r => ({
      xref: 'x',
      yref: 'paper',
      x: (x(r.x0) + x(r.x1)) / 2,
      y: 1,
      yanchor: 'bottom',
      showarrow: false,
      text: escapeHtml(r.label),
      font: { size: 10, color: colors.muted }
    }));
    if (backward !== null) {
      // where the backward pass starts: forward left of the line, backward right of it
      shapes.push({
        type: 'line',
        xref: 'x',
        yref: 'paper',
        x0: x(backward),
        x1: x(backward),
        y0: 0,
        y1: 1,
        line: { color: colors.muted, width: 1, dash: 'dashdot' }
      });
      annotations.push({
        xref: 'x',
        yref: 'paper',
        x: x(backward),
        // just above the plot (the top margin leaves it a row under the title): a training plan's peak
        // label sits inside the plot near the top of this line
        y: 1,
        xanchor: 'center',
        yanchor: 'bottom',
        showarrow: false,
        text: '← forward | backward →',
        font: { size: 10, color: colors.muted }
      });
    }
    if (this._marked !== null) {
      shapes.push({
        type: 'line',
        xref: 'x',
        yref: 'paper',
        x0: x(this._marked),
        x1: x(this._marked),
        y0: 0,
        y1: 1,
        line: { color: colors.marker, width: 2 }
      });
    }
    return { shapes, annotations };
  }

  private _drawToolbar(doc: PlanDoc): void {
    const timed = hasStepTimes(doc);
    if (!timed && this._axis === 'time') {
      this._axis = 'step';
    }
    const time = this._axisButtons.time;
    time.disabled = !timed;
    time.title = timed ? 'x = summed per-op compute time of the schedule' : 'this plan has no per-op times';
    for (const [axis, button] of Object.entries(this._axisButtons)) {
      button.classList.toggle('jp-mod-current', axis === this._axis);
      button.setAttribute('aria-pressed', String(axis === this._axis));
    }
  }

  /** Render `doc` (header and chart); resolves once plotly has drawn. */
  async draw(doc: PlanDoc): Promise<void> {
    if (doc !== this._doc) {
      // A new plan: the old inspection names tensors of another schedule.
      this._inspector.replaceChildren();
      delete this._inspector.dataset.step;
    }
    this._doc = doc;
    this._header.replaceChildren(...readoutSpans(planReadouts(doc, this._selected)));
    this._drawToolbar(doc);
    const colors = themeColors(this.node);
    const figure = planFigure(
      doc,
      { planned: colors.font, baseline: colors.muted, budget: colors.error, peak: colors.peak },
      this._axis
    );
    this._plannedTraces = new Set(
      figure.traces.flatMap((t, i) => (t.stackgroup === 'planned' || t.name === 'planned total' ? [i] : []))
    );
    const edges = stepEdges(doc, doc.planned.schedule, this._axis);
    const x = (step: number): number =>
      (edges[Math.min(Math.max(step, 0), edges.length - 1)] ?? 0) / figure.xscale;
    const axis = themedAxis(colors);
    const layout = {
      ...themedLayout(colors),
      title: { text: planTitle(doc), font: { size: 13 } },
      height: 420,
      margin: { l: 60, r: 20, t: 56, b: 40 },
      // One box per x: the planned step (op, module, source), its breakdown and the baseline's step.
      hovermode: 'x unified',
      // A vertical legend right of the plot: plotly widens the margin for it, so it never overlaps the
      // x-axis title (a horizontal one below the plot did once it wrapped to two rows).
      legend: { orientation: 'v', x: 1.02, xanchor: 'left', y: 1, yanchor: 'top', traceorder: 'normal' },
      xaxis: { ...axis, title: { text: figure.xTitle } },
      yaxis: { ...axis, title: { text: `memory (${figure.unit.name})` }, rangemode: 'tozero' },
      ...this._overlays(colors, x, backwardStart(doc))
    };
    const Plotly = await loadPlotly();
    if (this._disposed) {
      return;
    }
    await Plotly.react(this._plot, figure.traces as unknown as Record<string, unknown>[], layout, {
      displaylogo: false,
      responsive: true
    });
    this._listenForClicks();
  }

  /**
   * Once per plot div (plotly keeps handlers across `react`): a click inspects the planned step; a hover
   * records the point the unified box belongs to, and the box is kept inside the plot area, off the
   * legend (`hoverBoxLeft`).  plotly redraws the box on every mouse move but reports a hover only when
   * the point changes: an observer of the plot's DOM places each drawing, before it is painted.
   */
  private _listenForClicks(): void {
    const plot = this._plot as ClickablePlot;
    if (this._listening || !plot.on) {
      return;
    }
    this._listening = true;
    plot.on('plotly_click', data => {
      const point = data.points?.find(p => this._plannedTraces.has(p.curveNumber));
      if (point) {
        this.inspect(point.pointNumber);
      }
    });
    plot.on('plotly_hover', data => {
      const points = data.points ?? [];
      const point = points.find(p => this._plannedTraces.has(p.curveNumber)) ?? points[0];
      const xa = plot._fullLayout?.xaxis;
      this._hoverX =
        point && xa && xa.range[1] !== xa.range[0]
          ? xa._offset + ((point.x - xa.range[0]) / (xa.range[1] - xa.range[0])) * xa._length
          : null;
      this._placeHover();
    });
    // plotly may reuse the box's group and only move it: its transform is watched too
    this._hoverObserver.observe(this._plot, {
      childList: true,
      subtree: true,
      attributes: true,
      attributeFilter: ['transform']
    });
  }

  /** Move the unified hover box (drawn by plotly as a legend in its hover layer) inside the plot area. */
  private _placeHover(): void {
    const plot = this._plot as ClickablePlot;
    const box = this._plot.querySelector<SVGGElement>('.hoverlayer .legend');
    const xa = plot._fullLayout?.xaxis;
    if (!box || !xa || this._hoverX === null) {
      return;
    }
    const at = /translate\(\s*([-\d.e]+)[\s,]+([-\d.e]+)\s*\)/.exec(box.getAttribute('transform') ?? '');
    if (!at) {
      return;
    }
    const left = hoverBoxLeft(this._hoverX, box.getBoundingClientRect().width, xa._offset + xa._length);
    // idempotent: setting the same transform again would only wake the observer once more
    if (Math.abs(left - Number(at[1])) > 0.5) {
      box.setAttribute('transform', `translate(${left},${at[2]})`);
    }
  }

  resize(): void {
    const plotly = loadedPlotly();
    if (this._doc && plotly && this._plot.isConnected) {
      void plotly.then(Plotly => Plotly.Plots.resize(this._plot));
    }
  }

  dispose(): void {
    this._disposed = true;
    this._hoverObserver.disconnect();
    this._stopTheme();
    void loadedPlotly()?.then(Plotly => Plotly.purge(this._plot));
  }
}
