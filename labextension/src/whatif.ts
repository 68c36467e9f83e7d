/**
 * The transformer what-if widget (Python side memviz/views/whatif.py).  Controls write tp, sp, recompute,
 * pp, micro_batch and device; the kernel answers with `result_json` (bytes per category from
 * solvers.analytic, capacity, verdict, the estimate's assumptions).  "Pin" appends the current settings
 * to the synced `pinned` list, which the kernel answers in `compare_json`; the view draws the pinned
 * configurations and the current one side by side (a stacked bar each against its capacity) with a
 * table, and keeps no state of its own: a re-rendered view shows the same pins.
 */
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import { element, loadPlotly, observeTheme, themeColors, widgetDefaults } from './ui';
import {
  WhatIfResult,
  WhatIfRow,
  WhatIfSettings,
  compareFigure,
  comparisonCells,
  parseComparison,
  parseWhatIf
} from './whatif_data';

export class WhatIfModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      ...widgetDefaults('WhatIfModel', 'WhatIfView'),
      config_json: '',
      devices_json: '',
      tp: 1,
      sp: false,
      recompute: 'none',
      pp: 1,
      micro_batch: 1,
      device: 'h100',
      result_json: '',
      error: '',
      config_name: '',
      pinned: [],
      compare_json: '[]',
      max_pinned: 0
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
}

function options(select: HTMLSelectElement, values: string[]): void {
  select.replaceChildren(...values.map(v => Object.assign(element('option', '', v), { value: v })));
}

export class WhatIfView extends DOMWidgetView {
  private readonly _tp = element('select', 'jp-memviz-whatif-tp');
  private readonly _sp = element('input', 'jp-memviz-whatif-sp');
  private readonly _recompute = element('select', 'jp-memviz-whatif-recompute');
  private readonly _pp = element('input', 'jp-memviz-whatif-pp');
  private readonly _micro = element('input', 'jp-memviz-whatif-micro');
  private readonly _device = element('select', 'jp-memviz-whatif-device');
  private readonly _config = element('div', 'jp-memviz-whatif-config');
  private readonly _verdict = element('div', 'jp-memviz-whatif-verdict');
  private readonly _error = element('div', 'jp-memviz-whatif-error');
  private readonly _plot = element('div', 'jp-memviz-whatif-plot');
  private readonly _pin = element('button', 'jp-memviz-whatif-pin jp-mod-styled', 'pin this configuration');
  private readonly _table = element('table', 'jp-memviz-whatif-compare');
  private readonly _assumptions = element('details', 'jp-memviz-whatif-assumptions');
  private _current: WhatIfResult | null = null;
  private _stopTheme: (() => void) | null = null;
  private _generation = 0;

  render(): void {
    this.el.classList.add('jp-memviz-whatif');
    options(this._tp, ['1', '2', '4', '8', '16', '32']);
    options(this._recompute, ['none', 'selective', 'full']);
    this._sp.type = 'checkbox';
    for (const input of [this._pp, this._micro]) {
      input.type = 'number';
      input.min = '1';
    }
    const label = (text: string, control: HTMLElement): HTMLElement => {
      const l = element('label', 'jp-memviz-whatif-field', `${text} `);
      l.append(control);
      return l;
    };
    const controls = element('div', 'jp-memviz-controls');
    controls.append(
      label('tensor parallel', this._tp),
      label('sequence parallel', this._sp),
      label('recompute', this._recompute),
      label('pipeline stages', this._pp),
      label('micro-batch', this._micro),
      label('device', this._device),
      this._pin
    );
    this._pin.addEventListener('click', () => this._pinCurrent());
    this._assumptions.open = true;
    this._tp.addEventListener('change', () => this._send({ tp: Number(this._tp.value) }));
    this._sp.addEventListener('change', () => this._send({ sp: this._sp.checked }));
    this._recompute.addEventListener('change', () => this._send({ recompute: this._recompute.value }));
    this._pp.addEventListener('change', () => this._send({ pp: Number(this._pp.value) }));
    this._micro.addEventListener('change', () => this._send({ micro_batch: Number(this._micro.value) }));
    this._device.addEventListener('change', () => this._send({ device: this._device.value }));
    this.el.append(
      this._config,
      controls,
      this._verdict,
      this._error,
      this._plot,
      this._table,
      this._assumptions
    );

    this.listenTo(this.model, 'change', this._settingsChanged);
    this.listenTo(this.model, 'change:result_json', this._resultChanged);
    this.listenTo(this.model, 'change:compare_json', this._draw);
    this._stopTheme = observeTheme(() => void this._resultChanged());
    this._settingsChanged();
    this._resultChanged();
  }

  remove(): void {
    this._stopTheme?.();
    super.remove();
  }

  private _send(values: Record<string, unknown>): void {
    this.model.set(values);
    this.touch();
  }

  /** Pins the kernel's current settings (not the controls': they may hold a rejected value). */
  private _pinCurrent(): void {
    const settings = this._current?.settings;
    if (!settings) {
      return;
    }
    this._send({ pinned: [...this._pinned(), { ...settings }] });
  }

  private _pinned(): WhatIfSettings[] {
    return (this.model.get('pinned') as WhatIfSettings[] | undefined) ?? [];
  }

  private _unpin(index: number): void {
    this._send({ pinned: this._pinned().filter((_, i) => i !== index) });
  }

  private _settingsChanged(): void {
    const devices = this.model.get('devices_json') as string;
    options(this._device, devices ? Object.keys(JSON.parse(devices) as object) : []);
    const tp = String(this.model.get('tp'));
    if (!Array.from(this._tp.options).some(o => o.value === tp)) {
      this._tp.append(Object.assign(element('option', '', tp), { value: tp }));
    }
    this._tp.value = tp;
    this._sp.checked = Boolean(this.model.get('sp'));
    this._recompute.value = this.model.get('recompute');
    this._pp.value = String(this.model.get('pp'));
    this._micro.value = String(this.model.get('micro_batch'));
    this._device.value = this.model.get('device');
    const error = String(this.model.get('error') ?? '');
    this._error.textContent = error;
    // A rejected setting leaves the last valid estimate in place: say it no longer matches the controls.
    this._verdict.hidden = error !== '';
    this._plot.classList.toggle('jp-mod-stale', error !== '');
    this._plot.title = error ? 'estimate for the last valid settings' : '';
    const config = this.model.get('config_json') as string;
    if (config) {
      const c = JSON.parse(config) as Record<string, unknown>;
      // the name comes from a user's config (name_or_path): text only
      const name = String(this.model.get('config_name') ?? '');
      this._config.textContent = [
        ...(name ? [name] : []),
        ...['layers', 'hidden', 'heads', 'seq', 'vocab'].map(k => `${k} ${String(c[k])}`)
      ].join(' · ');
    }
    this._pin.disabled =
      !this._current || error !== '' || this._pinned().length >= Number(this.model.get('max_pinned'));
  }

  private async _resultChanged(): Promise<void> {
    const text: string = this.model.get('result_json');
    if (!text) {
      return;
    }
    let result;
    try {
      result = parseWhatIf(JSON.parse(text));
    } catch (err) {
      this._error.textContent = `memviz: cannot draw this estimate: ${(err as Error).message}`;
      return;
    }
    this._verdict.textContent = result.verdict;
    this._verdict.dataset.fits = String(result.fits);
    this._current = result;
    this._settingsChanged();
    this._showAssumptions(result.assumptions);
    await this._draw();
  }

  private _showAssumptions(rows: { name: string; value: string }[]): void {
    const list = element('dl', 'jp-memviz-whatif-assumption-list');
    for (const r of rows) {
      list.append(element('dt', '', r.name), element('dd', '', r.value));
    }
    this._assumptions.replaceChildren(
      element('summary', '', 'assumptions of the estimate (solvers.analytic)'),
      list
    );
  }

  /** The pinned rows from the kernel, then the current (last valid) estimate. */
  private _rows(): WhatIfRow[] {
    let pinned: WhatIfRow[] = [];
    try {
      pinned = parseComparison(JSON.parse(String(this.model.get('compare_json') || '[]')));
    } catch (err) {
      this._error.textContent = `memviz: cannot draw the pinned configurations: ${(err as Error).message}`;
    }
    return this._current ? [...pinned, this._current] : pinned;
  }

  private _fillTable(rows: WhatIfRow[]): void {
    const head = element('tr', '');
    for (const h of ['', 'settings', 'device', 'total per device', 'capacity', 'headroom', 'verdict', '']) {
      head.append(element('th', '', h));
    }
    const body = rows.map((r, i) => {
      const tr = element('tr', 'jp-memviz-whatif-row');
      tr.dataset.fits = String(r.error ? false : r.fits);
      for (const cell of comparisonCells(r)) {
        tr.append(element('td', '', cell));
      }
      const action = element('td', '');
      if (r !== this._current) {
        const remove = element('button', 'jp-memviz-whatif-unpin jp-mod-styled', 'remove');
        remove.title = `unpin ${r.name}`;
        remove.addEventListener('click', () => this._unpin(i));
        action.append(remove);
      }
      tr.append(action);
      return tr;
    });
    this._table.replaceChildren(element('thead', ''), element('tbody', ''));
    this._table.tHead?.append(head);
    this._table.tBodies[0].append(...body);
  }

  private async _draw(): Promise<void> {
    const rows = this._rows();
    this._fillTable(rows);
    if (rows.length === 0) {
      return;
    }
    const fig = compareFigure(rows, themeColors(this.el));
    // Answers can arrive while plotly is still loading: only the latest one draws.
    const generation = ++this._generation;
    const Plotly = await loadPlotly();
    if (generation !== this._generation) {
      return;
    }
    await Plotly.react(
      this._plot,
      fig.data as never,
      fig.layout as never,
      {
        responsive: true,
        displaylogo: false
      } as never
    );
  }
}
