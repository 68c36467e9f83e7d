/**
 * The plan view: a readout header and the memory-over-time chart, drawn with the plotly.js bundled
 * in this extension (no CDN, so saved notebooks render offline).  Names from the plan only ever reach
 * the DOM through textContent, or through plotly after `escapeHtml` (see transforms.ts).
 */
import { escapeHtml, PlanDoc, planFigure, planReadouts, planTitle } from './transforms';

/** A shaded x range (schedule steps) of the memory chart, e.g. a chunked region. */
export interface Region {
  x0: number;
  x1: number;
  label: string;
}

type PlotlyModule = typeof import('plotly.js-dist-min').default;

// Loaded on first use: the plotly chunk is ~4.7 MB and most notebooks never show a plan.
let plotlyPromise: Promise<PlotlyModule> | null = null;
export function loadPlotly(): Promise<PlotlyModule> {
  plotlyPromise ??= import('plotly.js-dist-min').then(m => m.default);
  return plotlyPromise;
}

/** Theme colors read from JupyterLab's CSS variables (plotly cannot resolve var(...) itself). */
export function themeColors(node: HTMLElement): Record<string, string> {
  const style = getComputedStyle(node);
  const read = (name: string, fallback: string): string => style.getPropertyValue(name).trim() || fallback;
  return {
    font: read('--jp-ui-font-color1', '#333333'),
    muted: read('--jp-ui-font-color2', '#666666'),
    grid: read('--jp-border-color2', '#dddddd'),
    family: read('--jp-ui-font-family', 'sans-serif'),
    budget: read('--jp-error-color1', '#d32f2f'),
    peak: read('--jp-ui-font-color0', '#000000'),
    region: read('--jp-brand-color2', '#90caf9'),
    marker: read('--jp-warn-color1', '#f57c00')
  };
}

export class PlanChart {
  readonly node: HTMLDivElement;
  private readonly _header: HTMLDivElement;
  private readonly _plot: HTMLDivElement;
  private readonly _themeObserver: MutationObserver;
  private _doc: PlanDoc | null = null;
  private _disposed = false;
  private _marked: number | null = null;
  private _regions: Region[] = [];

  constructor() {
    this.node = document.createElement('div');
    this.node.className = 'jp-memviz-chart';
    this._header = document.createElement('div');
    this._header.className = 'jp-memviz-readouts';
    this._plot = document.createElement('div');
    this._plot.className = 'jp-memviz-plot';
    this.node.append(this._header, this._plot);
    // Re-color when the user switches between the light and the dark theme.
    this._themeObserver = new MutationObserver(() => {
      if (this._doc) {
        void this.draw(this._doc);
      }
    });
    this._themeObserver.observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-name'] });
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

  get markedStep(): number | null {
    return this._marked;
  }

  private _redraw(): void {
    if (this._doc) {
      void this.draw(this._doc);
    }
  }

  /** Plotly shapes and annotations for the step marker and the shaded regions (labels escaped). */
  private _overlays(colors: Record<string, string>): { shapes: unknown[]; annotations: unknown[] } {
    const shapes: unknown[] = this._regions.map(r => ({
      type: 'rect',
      xref: 'x',
      yref: 'paper',
      x0: r.x0,
      x1: r.x1,
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
      x: (r.x0 + r.x1) / 2,
      y: 1,
      yanchor: 'bottom',
      showarrow: false,
      text: escapeHtml(r.label),
      font: { size: 10, color: colors.muted }
    }));
    if (this._marked !== null) {
      shapes.push({
        type: 'line',
        xref: 'x',
        yref: 'paper',
        x0: this._marked,
        x1: this._marked,
        y0: 0,
        y1: 1,
        line: { color: colors.marker, width: 2 }
      });
    }
    return { shapes, annotations };
  }

  /** Render `doc` (header and chart); resolves once plotly has drawn. */
  async draw(doc: PlanDoc): Promise<void> {
    this._doc = doc;
    this._header.replaceChildren(
      ...planReadouts(doc).map(r => {
        const item = document.createElement('span');
        item.className = 'jp-memviz-readout';
        item.dataset.readout = r.label;
        const label = document.createElement('span');
        label.className = 'jp-memviz-readout-label';
        label.textContent = `${r.label}: `;
        const value = document.createElement('span');
        value.className = 'jp-memviz-readout-value';
        value.textContent = r.value;
        item.append(label, value);
        return item;
      })
    );
    const colors = themeColors(this.node);
    const figure = planFigure(doc, {
      planned: colors.font,
      baseline: colors.muted,
      budget: colors.budget,
      peak: colors.peak
    });
    const axis = { color: colors.font, gridcolor: colors.grid, zerolinecolor: colors.grid };
    const layout = {
      title: { text: planTitle(doc), font: { size: 13 } },
      height: 420,
      margin: { l: 60, r: 20, t: 40, b: 40 },
      paper_bgcolor: 'rgba(0,0,0,0)',
      plot_bgcolor: 'rgba(0,0,0,0)',
      font: { color: colors.font, family: colors.family },
      // One box per x: the planned step (op, module, source), its breakdown and the baseline's step.
      hovermode: 'x unified',
      legend: { orientation: 'h', y: -0.25, yanchor: 'top', traceorder: 'normal' },
      xaxis: { ...axis, title: { text: 'schedule step' } },
      yaxis: { ...axis, title: { text: `memory (${figure.unit.name})` }, rangemode: 'tozero' },
      ...this._overlays(colors)
    };
    const Plotly = await loadPlotly();
    if (this._disposed) {
      return;
    }
    await Plotly.react(this._plot, figure.traces as unknown as Record<string, unknown>[], layout, {
      displaylogo: false,
      responsive: true
    });
  }

  resize(): void {
    if (this._doc && plotlyPromise && this._plot.isConnected) {
      void plotlyPromise.then(Plotly => Plotly.Plots.resize(this._plot));
    }
  }

  dispose(): void {
    this._disposed = true;
    this._themeObserver.disconnect();
    if (plotlyPromise) {
      void plotlyPromise.then(Plotly => Plotly.purge(this._plot));
    }
  }
}
