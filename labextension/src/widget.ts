/**
 * The planner widget (ipywidgets DOMWidget, Python side memviz/widget.py): the plan chart of chart.ts,
 * a budget slider over the plan's precomputed frontier, a strategy selector and an export button.  The
 * kernel owns the planning; the view draws `plan_json` and writes the user's choices back.
 *
 * Synced traits: plan_json (str: a memviz.plan/1 document with its "frontier"), budget_index (int:
 * index into the frontier, -1 = the plan as first made), strategy (str), status (str: summary or error
 * from the kernel), export_path (str), export_overwrite (bool), export_request (int: incremented to ask
 * for an export), export_result (str: JSON {"ok", "paths" | "exists", "message"} from the kernel).
 * Optional: strategies (list of str) replaces the selector's default options.
 */
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import { frontierLabel, nearestFrontierIndex, parsePlan, PlanDoc, STRATEGIES } from './transforms';
import { MODULE_NAME, MODULE_VERSION } from './version';
import './graph'; // registers the CD-graph tab
import { PlanTabs } from './views';

export class PlannerModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      _model_name: PlannerModel.model_name,
      _model_module: PlannerModel.model_module,
      _model_module_version: PlannerModel.model_module_version,
      _view_name: PlannerModel.view_name,
      _view_module: PlannerModel.view_module,
      _view_module_version: PlannerModel.view_module_version,
      plan_json: '',
      budget_index: -1,
      strategy: 'auto',
      strategies: [],
      status: '',
      export_path: '',
      export_overwrite: false,
      export_request: 0,
      export_result: ''
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
  static model_name = 'PlannerModel';
  static model_module = MODULE_NAME;
  static model_module_version = MODULE_VERSION;
  static view_name = 'PlannerView';
  static view_module = MODULE_NAME;
  static view_module_version = MODULE_VERSION;
}

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  el.className = className;
  if (text !== undefined) {
    el.textContent = text;
  }
  return el;
}

export class PlannerView extends DOMWidgetView {
  private _chart: PlanTabs | null = null;
  private _doc: PlanDoc | null = null;
  private readonly _slider = element('input', 'jp-memviz-budget-slider');
  private readonly _sliderLabel = element('span', 'jp-memviz-budget-label');
  private readonly _select = element('select', 'jp-memviz-strategy-select');
  private readonly _status = element('div', 'jp-memviz-status');
  private readonly _exportPath = element('input', 'jp-memviz-export-path');
  private readonly _exportButton = element('button', 'jp-memviz-export jp-mod-styled', 'Export');
  private readonly _overwriteButton = element(
    'button',
    'jp-memviz-overwrite jp-mod-styled jp-mod-warn',
    'Overwrite'
  );
  private readonly _exportResult = element('div', 'jp-memviz-export-result');

  render(): void {
    this.el.classList.add('jp-memviz-planner');

    this._slider.type = 'range';
    this._slider.min = '0';
    this._slider.step = '1';
    const budget = element('label', 'jp-memviz-budget', 'budget ');
    budget.append(this._slider, this._sliderLabel);
    // Every index is sent while dragging: frontier plans are cached by the kernel, so it answers fast.
    this._slider.addEventListener('input', () => {
      const index = Number(this._slider.value);
      this._showBudget(index);
      this._send({ budget_index: index });
    });

    const strategy = element('label', 'jp-memviz-strategy', 'strategy ');
    strategy.append(this._select);
    this._select.addEventListener('change', () => this._send({ strategy: this._select.value }));

    this._exportPath.type = 'text';
    this._exportPath.spellcheck = false;
    this._exportPath.addEventListener('change', () => this._send({ export_path: this._exportPath.value }));
    this._exportButton.addEventListener('click', () => this._requestExport(false));
    // Shown only after the kernel reported existing files: overwriting is always an explicit second click.
    this._overwriteButton.hidden = true;
    this._overwriteButton.addEventListener('click', () => this._requestExport(true));
    const exporter = element('span', 'jp-memviz-exporter');
    exporter.append(this._exportPath, this._exportButton, this._overwriteButton);

    const controls = element('div', 'jp-memviz-controls');
    controls.append(budget, strategy, exporter);
    this._chart = new PlanTabs();
    this.el.append(controls, this._status, this._exportResult, this._chart.node);

    this.listenTo(this.model, 'change:plan_json', this._planChanged);
    this.listenTo(this.model, 'change:budget_index', this._budgetChanged);
    this.listenTo(this.model, 'change:strategy change:strategies', this._strategiesChanged);
    this.listenTo(this.model, 'change:status', this._statusChanged);
    this.listenTo(this.model, 'change:export_path', this._exportPathChanged);
    this.listenTo(this.model, 'change:export_result', this._exportResultChanged);
    this._strategiesChanged();
    this._statusChanged();
    this._exportPathChanged();
    this._planChanged();
  }

  private _send(values: Record<string, unknown>): void {
    this.model.set(values);
    this.touch();
  }

  private _requestExport(overwrite: boolean): void {
    this._overwriteButton.hidden = true;
    this._exportResult.textContent = 'exporting…';
    this._send({
      export_path: this._exportPath.value,
      export_overwrite: overwrite,
      export_request: (this.model.get('export_request') as number) + 1
    });
  }

  private _planChanged(): void {
    const text: string = this.model.get('plan_json');
    this._doc = null;
    if (text) {
      try {
        this._doc = parsePlan(JSON.parse(text));
      } catch (err) {
        this._status.textContent = `memviz: cannot render this plan: ${(err as Error).message}`;
      }
    }
    const frontier = this._doc?.frontier ?? [];
    this._slider.max = String(Math.max(frontier.length - 1, 0));
    this._slider.disabled = frontier.length < 2;
    this._budgetChanged();
    if (this._doc) {
      void this._chart?.update(this._doc);
    }
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
    this._status.textContent = this.model.get('status');
  }

  private _exportPathChanged(): void {
    this._exportPath.value = this.model.get('export_path');
  }

  private _exportResultChanged(): void {
    const text: string = this.model.get('export_result');
    if (!text) {
      this._exportResult.textContent = '';
      return;
    }
    let result: { ok?: boolean; paths?: string[]; exists?: string[]; message?: string };
    try {
      result = JSON.parse(text);
    } catch {
      this._exportResult.textContent = text;
      return;
    }
    if (result.ok) {
      this._exportResult.textContent = `exported: ${(result.paths ?? []).join(', ')}`;
    } else {
      this._exportResult.textContent = result.message ?? 'export failed';
      this._overwriteButton.hidden = !(result.exists && result.exists.length > 0);
    }
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
