/**
 * The chunk-region editor widget (Python side memviz/views/chunk_editor.py).  The kernel owns every
 * estimate; this view draws `doc_json` and writes the user's region edits to `regions_json`.
 *
 * Synced traits: doc_json (str: curves, regions, estimate), regions_json (str: [{start, end, chunks,
 * outputs}]; a region without outputs is one the user added: the kernel picks its dims), error (str: why the kernel rejected the last edit), export_path, export_overwrite,
 * export_request, export_result (as in the Planner).
 */
import { DOMWidgetModel, DOMWidgetView, ISerializers } from '@jupyter-widgets/base';

import {
  addRegion,
  applyEdit,
  draggedEdges,
  EditorDoc,
  editorFigure,
  estimateLines,
  parseEditorDoc,
  RegionEdit,
  RegionField,
  regionEdits,
  regionListCaption,
  removeRegion,
  visibleRows
} from './chunkeditor_data';
import {
  element,
  EXPORT_DEFAULTS,
  Exporter,
  loadPlotly,
  observeTheme,
  themeColors,
  widgetDefaults
} from './ui';

export class ChunkEditorModel extends DOMWidgetModel {
  defaults(): Backbone.ObjectHash {
    return {
      ...super.defaults(),
      ...widgetDefaults('ChunkEditorModel', 'ChunkEditorView'),
      ...EXPORT_DEFAULTS,
      doc_json: '',
      regions_json: '[]',
      error: ''
    };
  }

  static serializers: ISerializers = { ...DOMWidgetModel.serializers };
}

export class ChunkEditorView extends DOMWidgetView {
  private _doc: EditorDoc | null = null;
  private readonly _plot = element('div', 'jp-memviz-chunk-plot');
  private readonly _estimate = element('div', 'jp-memviz-chunk-estimate');
  private readonly _error = element('div', 'jp-memviz-chunk-error');
  private readonly _table = element('div', 'jp-memviz-chunk-regions');
  /** which regions the list shows, and that it scrolls: a hidden (overlay) scrollbar said nothing */
  private readonly _caption = element('div', 'jp-memviz-chunk-caption');
  private readonly _resize = new ResizeObserver(() => this._showCaption());
  private readonly _add = element('button', 'jp-memviz-chunk-add jp-mod-styled', 'Add region');
  private readonly _exporter = new Exporter({
    get: name => this.model.get(name),
    send: values => this._send(values)
  });
  private _stopTheme: (() => void) | null = null;

  render(): void {
    this.el.classList.add('jp-memviz-chunk-editor');
    this._add.title = 'a new region at the chunked peak; the kernel picks its chunk dims';
    this._add.addEventListener('click', () => {
      const edits = this._doc ? addRegion(this._doc) : null;
      if (edits) {
        this._sendRegions(edits);
      }
    });
    // The chart first, then the regions in a box of their own height: at 115 regions the rows ran to
    // 9,000 px and pushed the chart out of sight below them (issue 18's screenshots at 5k ops).
    this.el.append(
      this._estimate,
      this._error,
      this._plot,
      this._caption,
      this._table,
      this._add,
      this._exporter.row,
      this._exporter.result
    );

    this._table.addEventListener('scroll', () => this._showCaption());
    this._resize.observe(this._table);
    this.listenTo(this.model, 'change:doc_json', this._docChanged);
    this.listenTo(this.model, 'change:error', this._errorChanged);
    this.listenTo(this.model, 'change:export_path', () => this._exporter.pathChanged());
    this.listenTo(this.model, 'change:export_result', () => this._exporter.resultChanged());
    this._stopTheme = observeTheme(() => {
      if (this._doc) {
        void this._draw(this._doc);
      }
    });
    this._exporter.pathChanged();
    this._errorChanged();
    this._docChanged();
  }

  remove(): void {
    this._resize.disconnect();
    this._stopTheme?.();
    super.remove();
  }

  private _send(values: Record<string, unknown>): void {
    this.model.set(values);
    this.touch();
  }

  private _edit(index: number, field: RegionField, value: number): void {
    if (this._doc) {
      this._sendRegions(applyEdit(this._doc, index, field, value));
    }
  }

  private _sendRegions(edits: RegionEdit[]): void {
    this._error.textContent = 'checking…';
    this._send({ regions_json: JSON.stringify(edits) });
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
    this._showRegions(doc);
    void this._draw(doc);
  }

  /** The region rows, from the kernel's accepted plan (a rejected value never stays in its input). */
  private _showRegions(doc: EditorDoc): void {
    this._table.replaceChildren(...doc.regions.map((r, i) => this._regionRow(doc, i)));
    this._add.disabled = addRegion(doc) === null;
    this._showCaption();
  }

  /** The caption over the region list: how many regions, which are in view, and that the list scrolls. */
  private _showCaption(): void {
    const view = this._table.getBoundingClientRect();
    const rows = Array.from(this._table.children).map(row => {
      const box = row.getBoundingClientRect();
      return { top: box.top - view.top, bottom: box.bottom - view.top };
    });
    const shown = visibleRows(rows, this._table.clientHeight);
    this._caption.textContent = regionListCaption(rows.length, shown);
    this._caption.dataset.scrolls = String(shown !== null && shown[1] - shown[0] + 1 < rows.length);
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
    // the node's own name first ("matmul_10 (matmul)"): it is what tells the rows apart once shortened
    const name = (pos: number): string => {
      const node = doc.nodes[pos];
      return node ? `${node.name} (${node.op})` : '?';
    };
    // The edges' op names get a line of their own under the fields, the row's whole width: squeezed
    // between the fields at 848 px they were cut to "matmu…" (issue 18).  Still ellipsized when even
    // that is too narrow, the tooltip holding the full name.
    const node = (label: string, pos: number): HTMLElement => {
      const span = element('span', 'jp-memviz-chunk-node', name(pos));
      span.title = name(pos);
      span.dataset.edge = label;
      const wrap = element('span', 'jp-memviz-chunk-node-label', `${label}: `);
      wrap.append(span);
      return wrap;
    };
    const names = element('div', 'jp-memviz-chunk-names');
    names.append(node('from', r.x0), node('to', r.x1));
    const estimate = `${(r.memory_bytes / 2 ** 20).toFixed(2)} MiB, +${(100 * r.slowdown).toFixed(1)}% time`;
    // in a narrow output the estimate shrinks to an ellipsis too: the tooltip keeps it whole
    const est = element('span', 'jp-memviz-chunk-est', estimate);
    est.title = estimate;
    const remove = element('button', 'jp-memviz-chunk-remove jp-mod-styled', 'Remove');
    remove.addEventListener('click', () => this._sendRegions(removeRegion(doc, index)));
    const fields = element('div', 'jp-memviz-chunk-fields');
    fields.append(
      element('span', 'jp-memviz-chunk-title', `region ${index + 1}`),
      number('x0', 'start', r.x0, '0', last),
      number('x1', 'end', r.x1, '0', last),
      number('dim', 'dim', dims[0] ?? 0, '0'),
      number('chunks', 'chunks', r.chunks, '2', String(r.extent)),
      est,
      remove
    );
    row.append(fields, names);
    return row;
  }

  private async _draw(doc: EditorDoc): Promise<void> {
    const Plotly = await loadPlotly();
    const fig = editorFigure(doc, themeColors(this.el), this._plot.clientWidth || this.el.clientWidth || 800);
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
      this._sendRegions(edits);
    });
  }

  private _errorChanged(): void {
    const error: string = this.model.get('error') ?? '';
    this._error.textContent = error;
    if (error && this._doc) {
      // the kernel kept its plan: the inputs go back to its values (and a dragged shape to its place)
      this._showRegions(this._doc);
      void this._draw(this._doc);
    }
  }
}
