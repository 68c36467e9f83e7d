/**
 * The planner widget (ipywidgets DOMWidget, Python side memviz/views/widget.py): the plan chart of chart.ts,
 * a budget slider over the plan's precomputed frontier, a strategy selector and an export button.  The
 * kernel owns the planning; the view draws `plan_json` and writes the user's choices back.
 *
 * Synced traits: plan_base_json (str: a JSON object, the members every plan of this planner shares:
 * graph, baseline, frontier, model, device; sent once), plan_json (str: the rest of the shown plan's
 * memviz.plan/3 document; drawn as `{...base, ...plan}`, see `mergePlanParts`), view_needs (list of str,
 * written by the view: the optional members its visible tab draws, e.g. "cdgraph" for the Graph tab;
 * the kernel leaves them out otherwise), budget_index (int:
 * index into the frontier, -1 = the plan as first made), strategy (str), status (str: summary or error
 * from the kernel), export_path (str), export_overwrite (bool), export_request (int: incremented to ask
 * for an export), export_result (str: JSON {"ok", "paths" | "exists", "message"} from the kernel),
 * refining (str: what the kernel is still solving for the shown budget, e.g. the selected strategy while
 * the frontier's own plan is shown; '' once the shown plan is final), solve_limit_s (float: the most a
 * solve takes; the progress bar runs against it), cancel_request (int: incremented to cancel the solve in
 * progress), budget_bytes + budget_request (int, int: a typed budget in bytes, solved when the request
 * count changes), presets (list of {label, bytes}: device capacities offered for the typed budget).
 * Optional: strategies (list of str) replaces the selector's default options.
 *
 * The plan drawn is described once, by the chart's readouts; the slider's label names only the budget,
 * and the status line carries only the kernel's errors and notes.
 */
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import { LatestOnly } from './latest';
import { PLAN_SHOWN_EVENT } from './snapshot';
import {
  budgetLabel,
  chooseUnit,
  formatBytes,
  frontierEnds,
  sliderWithoutFrontier,
  BYTE_SLIDER_STEPS,
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
      refining: '',
      solve_limit_s: 0,
      cancel_request: 0,
      budget_bytes: 0,
      budget_request: 0,
      presets: []
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
}

/** Keys the budget slider handles itself: JupyterLab must not also act on them (cell navigation). */
const SLIDER_KEYS = new Set([
  'ArrowLeft',
  'ArrowRight',
  'ArrowUp',
  'ArrowDown',
  'PageUp',
  'PageDown',
  'Home',
  'End'
]);

/** Units of the typed budget. */
const TYPED_UNITS: ReadonlyArray<[string, number]> = [
  ['GiB', 2 ** 30],
  ['MiB', 2 ** 20]
];

export class PlannerView extends DOMWidgetView {
  private _chart: PlanTabs | null = null;
  private _doc: PlanDoc | null = null;
  /** `plan_base_json` parsed, and the text it was parsed from: it is sent once, parsed once */
  private _base: { text: string; value: unknown } = { text: '', value: null };
  private readonly _slider = element('input', 'jp-memviz-budget-slider');
  private readonly _sliderLabel = element('span', 'jp-memviz-budget-label');
  private readonly _minimum = element('span', 'jp-memviz-budget-min');
  private readonly _eager = element('span', 'jp-memviz-budget-max');
  private readonly _typed = element('input', 'jp-memviz-budget-input');
  private readonly _unit = element('select', 'jp-memviz-budget-unit');
  private readonly _presets = element('select', 'jp-memviz-budget-presets');
  private readonly _refining = element('span', 'jp-memviz-refining');
  private readonly _progress = element('progress', 'jp-memviz-progress');
  private readonly _cancel = element('button', 'jp-memviz-cancel jp-mod-styled', 'Cancel');
  private readonly _select = element('select', 'jp-memviz-strategy-select');
  private readonly _status = element('div', 'jp-memviz-status');
  /** when the kernel started refining (performance.now()), and the timer moving the progress bar */
  private _solveStart = 0;
  private _ticker: number | null = null;
  private _unitChosen = false;
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
    this._slider.setAttribute('aria-label', 'memory budget');
    const budget = element('div', 'jp-memviz-budget');
    const title = element('span', 'jp-memviz-budget-title', 'budget');
    budget.append(title, this._minimum, this._slider, this._eager, this._sliderLabel);
    // Every index is sent while dragging: frontier plans are cached by the kernel, so it answers fast.
    this._slider.addEventListener('input', () => {
      const index = Number(this._slider.value);
      this._showBudget(index);
      // Until the kernel answers, the readouts describe the previous plan: say so.
      this.el.classList.add('jp-mod-pending');
      this._send({ budget_index: index });
    });
    // The range input moves itself on these keys (and fires `input`); JupyterLab's notebook shortcuts
    // (arrows select cells in command mode) must not see them too.
    this._slider.addEventListener('keydown', event => {
      if (SLIDER_KEYS.has(event.key)) {
        event.stopPropagation();
      }
    });

    // A typed budget, or a device's capacity: solved for exactly that many bytes.
    const typed = element('div', 'jp-memviz-budget-typed');
    this._typed.type = 'number';
    this._typed.min = '0';
    this._typed.step = 'any';
    this._typed.placeholder = 'budget';
    this._typed.setAttribute('aria-label', 'budget to plan for');
    this._unit.setAttribute('aria-label', 'budget unit');
    this._unit.replaceChildren(
      ...TYPED_UNITS.map(([name]) => Object.assign(element('option', '', name), { value: name }))
    );
    this._unit.addEventListener('change', () => (this._unitChosen = true));
    const set = element('button', 'jp-memviz-budget-set jp-mod-styled', 'Plan');
    set.addEventListener('click', () => this._submitTyped());
    this._typed.addEventListener('keydown', event => {
      event.stopPropagation(); // typing digits must not run notebook shortcuts
      if (event.key === 'Enter') {
        this._submitTyped();
      }
    });
    this._presets.setAttribute('aria-label', 'device capacity presets');
    this._presets.addEventListener('change', () => this._submitPreset());
    typed.append(this._typed, this._unit, set, this._presets);

    const strategy = element('label', 'jp-memviz-strategy', 'solve with ');
    strategy.append(this._select);
    this._select.addEventListener('change', () => this._send({ strategy: this._select.value }));

    // What the kernel is solving: a bar against the solve's time limit and Cancel.
    const solving = element('div', 'jp-memviz-solving');
    this._refining.setAttribute('aria-live', 'polite');
    this._progress.setAttribute('aria-label', 'solve time used of its limit');
    this._cancel.addEventListener('click', () =>
      this._send({ cancel_request: Number(this.model.get('cancel_request') ?? 0) + 1 })
    );
    solving.append(this._progress, this._cancel, this._refining);

    // The solve's progress sits beside the solver it runs, not on a row of its own: idle, that row kept
    // its height empty (so nothing moves when a solve starts), a gap above the export field.
    const solveRow = element('div', 'jp-memviz-solve-row');
    solveRow.append(strategy, solving);
    const controls = element('div', 'jp-memviz-controls');
    controls.append(budget, typed, solveRow, this._exporter.row);
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
    this.listenTo(this.model, 'change:presets', this._presetsChanged);
    this.listenTo(this.model, 'change:export_path', () => this._exporter.pathChanged());
    this.listenTo(this.model, 'change:export_result', () => this._exporter.resultChanged());
    this._strategiesChanged();
    this._statusChanged();
    this._refiningChanged();
    this._presetsChanged();
    this._exporter.pathChanged();
    this._planChanged();
  }

  private _send(values: Record<string, unknown>): void {
    this.model.set(values);
    this.touch();
  }

  private _submitTyped(): void {
    const value = Number(this._typed.value);
    const scale = TYPED_UNITS.find(([name]) => name === this._unit.value)?.[1] ?? 2 ** 30;
    if (!this._typed.value || !Number.isFinite(value) || value <= 0) {
      this._status.textContent = 'memviz: cannot plan for that budget: type a positive number';
      showAsError(this._status, true);
      return;
    }
    this._requestBudget(Math.round(value * scale));
  }

  private _submitPreset(): void {
    const bytes = Number(this._presets.value);
    this._presets.value = '';
    if (bytes > 0) {
      // the typed field shows what is being planned, in its unit
      const scale = TYPED_UNITS.find(([name]) => name === this._unit.value)?.[1] ?? 2 ** 30;
      this._typed.value = String(Number((bytes / scale).toFixed(3)));
      this._requestBudget(bytes);
    }
  }

  private _requestBudget(bytes: number): void {
    this.el.classList.add('jp-mod-pending');
    this._send({ budget_bytes: bytes, budget_request: Number(this.model.get('budget_request') ?? 0) + 1 });
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
    this.el.classList.remove('jp-mod-pending');
    const frontier = this._doc?.frontier ?? [];
    const ends = frontierEnds(frontier);
    const unplaced = ends ? null : this._withoutFrontier();
    this._slider.max = String(unplaced ? BYTE_SLIDER_STEPS : Math.max(frontier.length - 1, 0));
    this._slider.disabled = frontier.length < 2;
    this._minimum.textContent = ends ? `min ${formatBytes(ends.minimum)}` : (unplaced?.minimumText ?? '');
    this._minimum.title = ends
      ? `the smallest budget with a checked plan: ${formatBytes(ends.minimum)} (the slider's left end, ` +
        `${formatBytes(ends.minimumBudget)}, is the frontier's smallest budget)`
      : (unplaced?.note ?? '');
    this._eager.textContent = ends ? `eager ${formatBytes(ends.eager)}` : (unplaced?.eagerText ?? '');
    this._slider.title = unplaced?.note ?? '';
    if (ends && !this._unitChosen) {
      // the typed budget's unit follows the model's size until the user picks one
      this._unit.value = chooseUnit(ends.eager).name === 'GiB' ? 'GiB' : 'MiB';
    }
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

  /** The slider's placement for a plan without a frontier (`sliderWithoutFrontier`), else null. */
  private _withoutFrontier(): ReturnType<typeof sliderWithoutFrontier> {
    if (!this._doc || (this._doc.frontier ?? []).length > 0) {
      return null;
    }
    return sliderWithoutFrontier(this._doc.budget_bytes, this._doc.baseline?.timeline.peak_bytes ?? null);
  }

  private _budgetChanged(): void {
    const unplaced = this._withoutFrontier();
    if (unplaced && this._doc) {
      // no frontier rows to index: the slider stands for bytes from 0 to eager, at the plan's budget
      this._slider.value = String(unplaced.value);
      this._setBudgetText(this._doc.budget_bytes, ' · no frontier');
      return;
    }
    let index: number = this.model.get('budget_index');
    if (index < 0 && this._doc) {
      // The plan as first made, or a typed budget: place the slider where its budget sits on the frontier.
      index = nearestFrontierIndex(this._doc.frontier ?? [], this._doc.budget_bytes);
      this._slider.value = String(Math.max(index, 0));
      this._setBudgetText(this._doc.budget_bytes);
      return;
    }
    this._slider.value = String(Math.max(index, 0));
    this._showBudget(index);
  }

  private _showBudget(index: number): void {
    const entry = index >= 0 ? this._doc?.frontier?.[index] : undefined;
    this._setBudgetText(entry ? entry.budget_bytes : null);
  }

  private _setBudgetText(budget: number | null, suffix = ''): void {
    const eager = this._doc?.baseline?.timeline.peak_bytes ?? null;
    const text = budget === null ? '' : budgetLabel(budget, eager) + suffix;
    this._sliderLabel.textContent = text;
    this._slider.setAttribute('aria-valuetext', text);
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
    if (this._chart) {
      this._chart.memory.chart.selected = current || null;
    }
  }

  private _presetsChanged(): void {
    const presets = (this.model.get('presets') ?? []) as { label?: unknown; bytes?: unknown }[];
    const options = presets
      .filter(p => typeof p.bytes === 'number' && p.bytes > 0)
      .map(p =>
        Object.assign(element('option', '', `${String(p.label ?? '')}: ${formatBytes(p.bytes as number)}`), {
          value: String(p.bytes)
        })
      );
    const head = Object.assign(element('option', '', 'device capacity…'), { value: '' });
    this._presets.replaceChildren(head, ...options);
    this._presets.hidden = options.length === 0;
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
    this.el.classList.toggle('jp-mod-solving', refining !== '');
    if (refining && this._ticker === null) {
      this._solveStart = performance.now();
      this._ticker = window.setInterval(() => this._tick(), 250);
      this._tick();
    } else if (!refining && this._ticker !== null) {
      window.clearInterval(this._ticker);
      this._ticker = null;
    }
  }

  /** Move the progress bar: seconds spent against the solve's time limit (an upper bound, not a forecast). */
  private _tick(): void {
    const limit = Number(this.model.get('solve_limit_s') ?? 0);
    const spent = (performance.now() - this._solveStart) / 1000;
    if (limit > 0) {
      this._progress.max = limit;
      this._progress.value = Math.min(spent, limit);
    } else {
      this._progress.removeAttribute('value'); // indeterminate
    }
    this._progress.title = `${spent.toFixed(0)} s` + (limit > 0 ? ` of at most ${limit.toFixed(0)} s` : '');
  }

  processLuminoMessage(msg: Parameters<DOMWidgetView['processLuminoMessage']>[0]): void {
    super.processLuminoMessage(msg);
    if (msg.type === 'resize' || msg.type === 'after-show' || msg.type === 'after-attach') {
      this._chart?.resize();
    }
  }

  remove(): void {
    if (this._ticker !== null) {
      window.clearInterval(this._ticker);
      this._ticker = null;
    }
    this._chart?.dispose();
    this._chart = null;
    super.remove();
  }
}
