/**
 * The packing view: where every tensor lives in memory over time, for the planned packing (OLLA's
 * address plan) and for PyTorch's caching allocator (simulated by solvers.allocator) side by side.
 * Rectangles are drawn as a few WebGL polygon traces (transforms.ts `packingFigure`), so 10k tensors
 * stay interactive.
 */
import { PlanDoc, packingFigure } from './transforms';
import { themedAxis, themedLayout } from './theme';
import { element, loadedPlotly, loadPlotly, observeTheme, themeColors } from './ui';
import type { PlanView } from './views';

export class PackingView implements PlanView {
  readonly node = element('div', 'jp-memviz-packing');
  private readonly _plot = element('div', 'jp-memviz-plot');
  private readonly _message = element('div', 'jp-memviz-packing-message');
  private readonly _stopTheme: () => void;
  private _disposed = false;
  private _drawn = false;
  private _doc: PlanDoc | null = null;

  constructor() {
    this.node.append(this._message, this._plot);
    this._stopTheme = observeTheme(() => {
      if (this._doc) {
        void this.draw(this._doc);
      }
    });
  }

  update(doc: PlanDoc): Promise<void> {
    return this.draw(doc);
  }

  /** Render the packing of `doc`; resolves once plotly has drawn. */
  async draw(doc: PlanDoc): Promise<void> {
    this._doc = doc;
    const figure = packingFigure(doc);
    if (figure.traces.length === 0) {
      this._message.textContent = 'This plan has no packing (plan with a strategy that packs, e.g. "olla").';
      this._plot.hidden = true;
      return;
    }
    this._message.textContent = '';
    this._plot.hidden = false;
    const colors = themeColors(this.node);
    const axis = themedAxis(colors);
    const two = figure.titles.length > 1;
    const yTitle = { text: `address (${figure.unit.name})` };
    const layout: Record<string, unknown> = {
      ...themedLayout(colors),
      height: 460,
      margin: { l: 60, r: 20, t: 56, b: 40 },
      hovermode: 'closest',
      legend: { orientation: 'h', y: -0.15, yanchor: 'top' },
      xaxis: { ...axis, domain: two ? [0, 0.48] : [0, 1], title: { text: 'schedule step' } },
      yaxis: { ...axis, title: yTitle, rangemode: 'tozero' },
      annotations: figure.titles.map((text, i) => ({
        // Centred over its own subplot (plotly's "x domain" reference), whatever the figure width.
        xref: i === 0 ? 'x domain' : 'x2 domain',
        yref: 'paper',
        x: 0.5,
        xanchor: 'center',
        y: 1.02,
        yanchor: 'bottom',
        showarrow: false,
        // Built from numbers and fixed words only (transforms.ts), nothing from the plan's names.
        text,
        font: { size: 12, color: colors.font }
      }))
    };
    if (two) {
      layout.xaxis2 = { ...axis, domain: [0.52, 1], anchor: 'y2', title: { text: 'schedule step' } };
      // Same address scale on both sides so the allocator's extra reserved memory is visible.
      layout.yaxis2 = { ...axis, anchor: 'x2', matches: 'y', showticklabels: false };
    }
    const Plotly = await loadPlotly();
    if (this._disposed) {
      return;
    }
    await Plotly.react(this._plot, figure.traces as unknown as Record<string, unknown>[], layout, {
      displaylogo: false,
      responsive: true
    });
    this._drawn = true;
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
