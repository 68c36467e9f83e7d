/**
 * The chunk-region editor widget (Python side memviz/chunk_editor.py).  The kernel owns every
 * estimate; this view draws `doc_json` and writes the user's region edits to `regions_json`.
 *
 * Synced traits: doc_json (str: curves, regions, estimate), regions_json (str: [{start, end, chunks,
 * outputs}]), error (str: why the kernel rejected the last edit), export_path, export_overwrite,
 * export_request, export_result (as in the Planner).
 */
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import {
  applyEdit,
  draggedEdges,
  EditorDoc,
  editorFigure,
  estimateLines,
  parseEditorDoc,
  RegionField,
  regionEdits
} from './chunkeditor_data';
import { MODULE_NAME, MODULE_VERSION } from './version';

type PlotlyModule = typeof import('plotly.js-dist-min').default;
let plotlyPromise: Promise<PlotlyModule> | null = null;
function loadPlotly(): Promise<PlotlyModule> {
  plotlyPromise ??= import('plotly.js-dist-min').then(m => m.default);
  return plotlyPromise;
}

export class ChunkEditorModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      _model_name: ChunkEditorModel.model_name,
      _model_module: ChunkEditorModel.model_module,
      _model_module_version: ChunkEditorModel.model_module_version,
      _view_name: ChunkEditorModel.view_name,
      _view_module: ChunkEditorModel.view_module,
      _view_module_version: ChunkEditorModel.view_module_version,
      doc_json: '',
      regions_json: '[]',
      error: '',
      export_path: '',
      export_overwrite: false,
      export_request: 0,
      export_result: ''
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
  static model_name = 'ChunkEditorModel';
  static model_module = MODULE_NAME;
  static model_module_version = MODULE_VERSION;
  static view_name = 'ChunkEditorView';
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

function themeColor(node: HTMLElement, name: string, fallback: string): string {
  return getComputedStyle(node).getPropertyValue(name).trim() || fallback;
}

export class ChunkEditorView extends DOMWidgetView {
  private _doc: EditorDoc | null = null;
  private readonly _plot = element('div', 'jp-memviz-chunk-plot');
  private readonly _estimate = element('div', 'jp-memviz-chunk-estimate');
  private readonly _error = element('div', 'jp-memviz-chunk-error');
  private readonly _table = element('div', 'jp-memviz-chunk-regions');
  private readonly _exportPath = element('input', 'jp-memviz-export-path');
  private readonly _exportButton = element('button', 'jp-memviz-export jp-mod-styled', 'Export');
  private readonly _overwriteButton = element(
    'button',
    'jp-memviz-overwrite jp-mod-styled jp-mod-warn',
    'Overwrite'
  );
  private readonly _exportResult = element('div', 'jp-memviz-export-result');

  render(): void {
    this.el.classList.add('jp-memviz-chunk-editor');
    this._exportPath.type = 'text';
    this._exportPath.spellcheck = false;
    this._exportPath.addEventListener('change', () => this._send({ export_path: this._exportPath.value }));
    this._exportButton.addEventListener('click', () => this._requestExport(false));
    this._overwriteButton.hidden = true;
    this._overwriteButton.addEventListener('click', () => this._requestExport(true));
    const exporter = element('div', 'jp-memviz-exporter');
    exporter.append(this._exportPath, this._exportButton, this._overwriteButton);
    this.el.append(this._estimate, this._error, this._table, this._plot, exporter, this._exportResult);

    this.listenTo(this.model, 'change:doc_json', this._docChanged);
    this.listenTo(this.model, 'change:error', this._errorChanged);
    this.listenTo(this.model, 'change:export_path', this._exportPathChanged);
    this.listenTo(this.model, 'change:export_result', this._exportResultChanged);
    this._exportPathChanged();
    this._errorChanged();
    this._docChanged();
  }

  private _send(values: Record<string, unknown>): void {
    this.model.set(values);
    this.touch();
  }

  private _edit(index: number, field: RegionField, value: number): void {
    if (!this._doc) {
      return;
    }
    this._error.textContent = 'checking…';
    this._send({ regions_json: JSON.stringify(applyEdit(this._doc, index, field, value)) });
  }

  private _docChanged(): void {
    const text: string = this.model.get('doc_json');
    if (!text) {
      return;
    }
    try {
      this._doc = parseEditorDoc(JSON.parse(text));
    } catch (err) {
      this._error.textContent = `memviz: cannot render this chunk plan: ${(err as Error).message}`;
      return;
    }
    this._errorChanged();
    const doc = this._doc;
    this._estimate.replaceChildren(
      ...estimateLines(doc).map(line => element('span', 'jp-memviz-readout', line))
    );
    this._table.replaceChildren(...doc.regions.map((r, i) => this._regionRow(doc, i)));
    void this._draw(doc);
  }

  private _regionRow(doc: EditorDoc, index: number): HTMLElement {
    const r = doc.regions[index];
    const row = element('div', 'jp-memviz-chunk-region');
    row.dataset.region = String(index);
    const last = String(doc.nodes.length - 1);
    const number = (
      field: RegionField,
      label: string,
      value: number,
      min: string,
      max?: string
    ): HTMLElement => {
      const input = element('input', `jp-memviz-chunk-${field}`);
      input.type = 'number';
      input.min = min;
      if (max !== undefined) {
        input.max = max;
      }
      input.value = String(value);
      input.addEventListener('change', () => this._edit(index, field, Number(input.value)));
      const wrap = element('label', 'jp-memviz-chunk-field', `${label} `);
      wrap.append(input);
      return wrap;
    };
    const dims = Object.values(r.outputs);
    const name = (pos: number): string => `${doc.nodes[pos]?.op ?? '?'} ${doc.nodes[pos]?.name ?? ''}`;
    row.append(
      element('span', 'jp-memviz-chunk-title', `region ${index + 1}`),
      number('x0', 'start', r.x0, '0', last),
      element('span', 'jp-memviz-chunk-node', name(r.x0)),
      number('x1', 'end', r.x1, '0', last),
      element('span', 'jp-memviz-chunk-node', name(r.x1)),
      number('dim', 'dim', dims[0] ?? 0, '0'),
      number('chunks', 'chunks', r.chunks, '1'),
      element(
        'span',
        'jp-memviz-chunk-est',
        `${(r.memory_bytes / 2 ** 20).toFixed(2)} MiB, +${(100 * r.slowdown).toFixed(1)}% time`
      )
    );
    return row;
  }

  private async _draw(doc: EditorDoc): Promise<void> {
    const Plotly = await loadPlotly();
    const fig = editorFigure(doc, {
      font: themeColor(this.el, '--jp-ui-font-color1', '#333333'),
      muted: themeColor(this.el, '--jp-ui-font-color2', '#888888'),
      region: themeColor(this.el, '--jp-brand-color1', '#1976d2')
    });
    // Shapes are draggable: moving a region's edge sends the new start/end node to the kernel.
    await Plotly.react(
      this._plot,
      fig.data as never,
      fig.layout as never,
      {
        responsive: true,
        displaylogo: false,
        edits: { shapePosition: true }
      } as never
    );
    const plot = this._plot as unknown as {
      removeAllListeners?: (e: string) => void;
      on?: (e: string, f: (event: Record<string, unknown>) => void) => void;
    };
    plot.removeAllListeners?.('plotly_relayout');
    plot.on?.('plotly_relayout', (event: Record<string, unknown>) => {
      const doc = this._doc;
      const moved = draggedEdges(event);
      if (moved.length === 0 || !doc) {
        return;
      }
      let edits = regionEdits(doc);
      for (const [index, field, value] of moved) {
        edits = applyEdit(doc, index, field, value, edits);
      }
      this._error.textContent = 'checking…';
      this._send({ regions_json: JSON.stringify(edits) });
    });
  }

  private _errorChanged(): void {
    this._error.textContent = this.model.get('error');
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

  private _exportPathChanged(): void {
    this._exportPath.value = this.model.get('export_path');
  }

  private _exportResultChanged(): void {
    const text: string = this.model.get('export_result');
    let result: { ok?: boolean; paths?: string[]; exists?: string[]; message?: string };
    try {
      result = text ? JSON.parse(text) : {};
    } catch {
      this._exportResult.textContent = text;
      return;
    }
    if (!text) {
      this._exportResult.textContent = '';
    } else if (result.ok) {
      this._exportResult.textContent = `exported: ${(result.paths ?? []).join(', ')}`;
    } else {
      this._exportResult.textContent = result.message ?? 'export failed';
      this._overwriteButton.hidden = !(result.exists && result.exists.length > 0);
    }
  }
}
