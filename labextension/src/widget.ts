/**
 * The planner widget (ipywidgets DOMWidget, Python side memviz/widget.py): the plan chart of chart.ts,
 * a budget slider over the plan's precomputed frontier, a strategy selector and an export button.  The
 * kernel owns the planning; the view draws `plan_json` and writes the user's choices back.
 *
 * Synced traits: plan_base_json (str: a JSON object, the members every plan of this planner shares:
 * graph, baseline, frontier, model, device; sent once), plan_json (str: the rest of the shown plan's
 * memviz.plan/1 document; drawn as `{...base, ...plan}`, see `mergePlanParts`), view_needs (list of str,
 * written by the view: the optional members its visible tab draws, e.g. "cdgraph" for the Graph tab;
 * the kernel leaves them out otherwise), budget_index (int:
 * index into the frontier, -1 = the plan as first made), strategy (str), status (str: summary or error
 * from the kernel), export_path (str), export_overwrite (bool), export_request (int: incremented to ask
 * for an export), export_result (str: JSON {"ok", "paths" | "exists", "message"} from the kernel),
 * refining (str: what the kernel is still solving for the shown budget, e.g. the selected strategy while
 * the frontier's own plan is shown; '' once the shown plan is final).
 * Optional: strategies (list of str) replaces the selector's default options.
 */
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import { readoutSpans } from './chart';
import { sliderReadouts } from './inspect_data';
import { LatestOnly } from './latest';
import { PLAN_SHOWN_EVENT } from './snapshot';
import {
  frontierLabel,
  isErrorStatus,
  mergePlanParts,
  nearestFrontierIndex,
  parsePlan,
  PlanDoc,
  STRATEGIES
} from './transforms';
import { element, EXPORT_DEFAULTS, Exporter, showAsError, widgetDefaults } from './ui';
import './graph'; // registers the CD-graph tab
import { PlanTabs } from './views';

export class PlannerModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      ...widgetDefaults('PlannerModel', 'PlannerView'),
      ...EXPORT_DEFAULTS,
      plan_json: '',
      plan_base_json: '',
      view_needs: [],
      budget_index: -1,
      strategy: 'auto',
      strategies: [],
      status: '',
      refining: ''
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
}

export class PlannerView extends DOMWidgetView {
  private _chart: PlanTabs | null = null;
  private _doc: PlanDoc | null = null;
  /** `plan_base_json` parsed, and the text it was parsed from: it is sent once, parsed once */
  private _base: { text: string; value: unknown } = { text: '', value: null };
  private readonly _slider = element('input', 'jp-memviz-budget-slider');
  private readonly _sliderLabel = element('span', 'jp-memviz-budget-label');
  private readonly _readouts = element('span', 'jp-memviz-slider-readouts');
  private readonly _refining = element('span', 'jp-memviz-refining');
  private readonly _select = element('select', 'jp-memviz-strategy-select');
  private readonly _status = element('div', 'jp-memviz-status');
  /**
   * The chart draws only the latest plan: while dragging, plans that arrive while one is being drawn
   * (or before it is painted) are skipped, so the curve follows the slider instead of a queue.
   */
  private readonly _drawer = new LatestOnly<PlanDoc>(
    doc => this._chart?.update(doc),
    callback => requestAnimationFrame(callback)
  );
  private readonly _exporter = new Exporter({
    get: name => this.model.get(name),
    send: values => this._send(values)
  });

  render(): void {
    this.el.classList.add('jp-memviz-planner');

    this._slider.type = 'range';
    this._slider.min = '0';
    this._slider.step = '1';
    const budget = element('label', 'jp-memviz-budget', 'budget ');
    budget.append(this._slider, this._sliderLabel);
    // Peak, time overhead and solver status of the plan shown, beside the slider that picks it.
    this._readouts.setAttribute('aria-live', 'polite');
    this._refining.setAttribute('aria-live', 'polite');
    // Every index is sent while dragging: frontier plans are cached by the kernel, so it answers fast.
    this._slider.addEventListener('input', () => {
      const index = Number(this._slider.value);
      this._showBudget(index);
      // Until the kernel answers, the readouts describe the previous plan: say so.
      this._readouts.classList.add('jp-mod-pending');
      this._send({ budget_index: index });
    });

    const strategy = element('label', 'jp-memviz-strategy', 'strategy ');
    strategy.append(this._select);
    this._select.addEventListener('change', () => this._send({ strategy: this._select.value }));

    const controls = element('div', 'jp-memviz-controls');
    controls.append(budget, this._readouts, this._refining, strategy, this._exporter.row);
    this._chart = new PlanTabs();
    this.el.append(controls, this._status, this._exporter.result, this._chart.node);

    // The kernel sends the optional members the visible tab draws (the Graph tab's DOT) only on demand.
    this._chart.onNeeds(needs => {
      const current = (this.model.get('view_needs') ?? []) as string[];
      if (current.join('\n') !== needs.join('\n')) {
        this._send({ view_needs: [...needs] });
      }
    });

    this.listenTo(this.model, 'change:plan_json change:plan_base_json', this._planChanged);
    this.listenTo(this.model, 'change:budget_index', this._budgetChanged);
    this.listenTo(this.model, 'change:strategy change:strategies', this._strategiesChanged);
    this.listenTo(this.model, 'change:status', this._statusChanged);
    this.listenTo(this.model, 'change:refining', this._refiningChanged);
    this.listenTo(this.model, 'change:export_path', () => this._exporter.pathChanged());
    this.listenTo(this.model, 'change:export_result', () => this._exporter.resultChanged());
    this._strategiesChanged();
    this._statusChanged();
    this._refiningChanged();
    this._exporter.pathChanged();
    this._planChanged();
  }

  private _send(values: Record<string, unknown>): void {
    this.model.set(values);
    this.touch();
  }

  private _planChanged(): void {
    const text: string = this.model.get('plan_json');
    this._doc = null;
    if (text) {
      try {
        const merged = mergePlanParts(this._parsedBase(), JSON.parse(text));
        this._doc = parsePlan(merged);
        // the notebook output keeps the plan shown: a saved notebook without a kernel draws it (snapshot.ts)
        this.el.dispatchEvent(new CustomEvent(PLAN_SHOWN_EVENT, { bubbles: true, detail: merged }));
      } catch (err) {
        this._status.textContent = `memviz: cannot render this plan: ${(err as Error).message}`;
        showAsError(this._status, true);
      }
    }
    this._readouts.classList.remove('jp-mod-pending');
    this._readouts.replaceChildren(
      ...(this._doc ? readoutSpans(sliderReadouts(this._doc), 'jp-memviz-slider-readout') : [])
    );
    const frontier = this._doc?.frontier ?? [];
    this._slider.max = String(Math.max(frontier.length - 1, 0));
    this._slider.disabled = frontier.length < 2;
    this._budgetChanged();
    if (this._doc) {
      this._drawer.push(this._doc);
    }
  }

  private _parsedBase(): unknown {
    const text: string = this.model.get('plan_base_json') ?? '';
    if (text !== this._base.text) {
      this._base = { text, value: text ? JSON.parse(text) : null };
    }
    return this._base.value;
  }

  private _budgetChanged(): void {
    let index: number = this.model.get('budget_index');
    if (index < 0 && this._doc) {
      // The plan as first made: show where its budget sits on the frontier without re-planning.
      index = nearestFrontierIndex(this._doc.frontier ?? [], this._doc.budget_bytes);
    }
    this._slider.value = String(Math.max(index, 0));
    this._showBudget(index);
  }

  private _showBudget(index: number): void {
    const entry = index >= 0 ? this._doc?.frontier?.[index] : undefined;
    this._sliderLabel.textContent = entry ? frontierLabel(entry) : '';
  }

  private _strategiesChanged(): void {
    const current: string = this.model.get('strategy');
    const given = this.model.get('strategies') as string[];
    const names = [...(given.length > 0 ? given : STRATEGIES)];
    if (current && !names.includes(current)) {
      names.unshift(current);
    }
    this._select.replaceChildren(
      ...names.map(name => Object.assign(element('option', '', name), { value: name }))
    );
    this._select.value = current;
  }

  private _statusChanged(): void {
    const status: string = this.model.get('status') ?? '';
    this._status.textContent = status;
    showAsError(this._status, isErrorStatus(status));
  }

  private _refiningChanged(): void {
    // The kernel's own words: the plan drawn is not the selected strategy's yet, or lacks its packing.
    const refining: string = this.model.get('refining') ?? '';
    this._refining.textContent = refining ? `${refining}…` : '';
  }

  processLuminoMessage(msg: Parameters<DOMWidgetView['processLuminoMessage']>[0]): void {
    super.processLuminoMessage(msg);
    if (msg.type === 'resize' || msg.type === 'after-show' || msg.type === 'after-attach') {
      this._chart?.resize();
    }
  }

  remove(): void {
    this._chart?.dispose();
    this._chart = null;
    super.remove();
  }
}
