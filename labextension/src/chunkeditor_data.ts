/**
 * Pure data transforms of the chunk-region editor (memviz/views/chunk_editor.py computes every number):
 * parse the kernel's document, build the plotly figure (curves + shaded, draggable regions), turn a
 * user's edit into the region list sent back.  Node and op names are untrusted: escaped for plotly.
 */
import { ThemeColors, themedAxis, themedLayout } from './theme';
import { escapeHtml, formatBytes } from './transforms';

export interface EditorRegion {
  start: string;
  end: string;
  x0: number;
  x1: number;
  chunks: number;
  extent: number;
  outputs: Record<string, number>;
  dims: Record<string, number>;
  memory_bytes: number;
  slowdown: number;
}

export interface EditorDoc {
  nodes: { name: string; op: string }[];
  baseline: number[];
  chunked: number[];
  regions: EditorRegion[];
  estimate: {
    requested_bytes: number | null;
    baseline_peak_bytes: number;
    achieved_bytes: number;
    met: boolean;
    slowdown: number;
  };
}

/**
 * What the kernel accepts in `regions_json`.  A region without `outputs` is a new one: the kernel
 * picks its chunk dims (memviz.ChunkEditor.new_region).
 */
export interface RegionEdit {
  start: string;
  end: string;
  chunks: number;
  outputs?: Record<string, number>;
}

export function parseEditorDoc(data: unknown): EditorDoc {
  const d = data as Partial<EditorDoc>;
  if (!d || !Array.isArray(d.nodes) || !Array.isArray(d.baseline) || !Array.isArray(d.chunked)) {
    throw new Error('not a memviz chunk-editor document: nodes, baseline and chunked curves missing');
  }
  if (d.baseline.length !== d.nodes.length || d.chunked.length !== d.nodes.length) {
    throw new Error('not a memviz chunk-editor document: curves and nodes differ in length');
  }
  if (!Array.isArray(d.regions) || typeof d.estimate !== 'object' || d.estimate === null) {
    throw new Error('not a memviz chunk-editor document: regions or estimate missing');
  }
  return d as EditorDoc;
}

/** The edit list for the kernel, from the document's regions. */
export function regionEdits(doc: EditorDoc): RegionEdit[] {
  return doc.regions.map(r => ({ start: r.start, end: r.end, chunks: r.chunks, outputs: { ...r.outputs } }));
}

/** The edit list without region `index` (the row's Remove). */
export function removeRegion(doc: EditorDoc, index: number): RegionEdit[] {
  return regionEdits(doc).filter((_, i) => i !== index);
}

/**
 * The edit list with a new region (Add region): at the node where the chunked curve peaks outside
 * every region, with `chunks` chunks and no dims, so the kernel picks the legal chunk flow around it
 * with the lowest peak.  Null when every node is inside a region.
 */
export function addRegion(doc: EditorDoc, chunks = 2): RegionEdit[] | null {
  const inside = (i: number): boolean => doc.regions.some(r => r.x0 <= i && i <= r.x1);
  let best = -1;
  doc.chunked.forEach((bytes, i) => {
    if (!inside(i) && (best < 0 || bytes > doc.chunked[best])) {
      best = i;
    }
  });
  if (best < 0) {
    return null;
  }
  const at = doc.nodes[best].name;
  return [...regionEdits(doc), { start: at, end: at, chunks }];
}

export type RegionField = 'x0' | 'x1' | 'chunks' | 'dim';

/**
 * Apply one user edit to region `index`: an edge moved to node position `value` (rounded and clamped
 * to the graph), a new chunk count (sent as typed: the kernel validates it), or a new chunk dim for
 * every output of the region.  `base` is
 * the edit list to start from (the document's regions by default); it is not modified.
 */
export function applyEdit(
  doc: EditorDoc,
  index: number,
  field: RegionField,
  value: number,
  base: readonly RegionEdit[] = regionEdits(doc)
): RegionEdit[] {
  const edits = base.map(e => ({ ...e, outputs: { ...e.outputs } }));
  const edit = edits[index];
  if (!edit) {
    throw new Error(`no chunk region ${index}`);
  }
  const last = doc.nodes.length - 1;
  const pos = Math.min(Math.max(Math.round(value), 0), last);
  if (field === 'x0') {
    edit.start = doc.nodes[pos].name;
  } else if (field === 'x1') {
    edit.end = doc.nodes[pos].name;
  } else if (field === 'chunks') {
    // as typed: the kernel refuses a count that is not an integer of at least 2 and says why (0 was
    // once read as 1 here, a plan worse than unchunked)
    edit.chunks = value;
  } else {
    edit.outputs = Object.fromEntries(Object.keys(edit.outputs ?? {}).map(k => [k, Math.round(value)]));
  }
  return edits;
}

/**
 * Region edges moved by dragging a shape: plotly's relayout event has keys like "shapes[1].x0".
 * Returns [region index, field, value] for each edge moved.
 */
export function draggedEdges(event: Record<string, unknown>): [number, 'x0' | 'x1', number][] {
  const out: [number, 'x0' | 'x1', number][] = [];
  for (const [key, value] of Object.entries(event)) {
    const m = /^shapes\[(\d+)\]\.(x0|x1)$/.exec(key);
    if (m && typeof value === 'number') {
      out.push([Number(m[1]), m[2] as 'x0' | 'x1', value]);
    }
  }
  return out;
}

/**
 * The estimate readout lines: the chunked peak against the budget (the line drawn on the chart, with
 * its share of it), the unchunked peak, slowdown, regions.
 */
export function estimateLines(doc: EditorDoc): string[] {
  const e = doc.estimate;
  const budget =
    e.requested_bytes === null
      ? 'none'
      : `${formatBytes(e.requested_bytes)} (${((100 * e.achieved_bytes) / Math.max(e.requested_bytes, 1)).toFixed(0)}% of it)`;
  const worse = doc.regions.length > 0 && e.achieved_bytes >= e.baseline_peak_bytes;
  const notes = `${e.met ? '' : ' (not met)'}${worse ? ' (no lower than unchunked: export refused)' : ''}`;
  return [
    `chunked peak ${formatBytes(e.achieved_bytes)} vs budget ${budget}${notes}`,
    `unchunked peak ${formatBytes(e.baseline_peak_bytes)}`,
    `estimated slowdown ${(100 * e.slowdown).toFixed(1)}%`,
    `${doc.regions.length} region${doc.regions.length === 1 ? '' : 's'}`
  ];
}

/**
 * The rows (0-based [first, last]) wholly or mostly in a scrolled list's view: each row's top and bottom
 * relative to the view's top, the view `height` pixels tall; a row counts when over half of it shows.
 * Null when none does (an empty list, or one not laid out yet).
 */
export function visibleRows(
  rows: readonly { top: number; bottom: number }[],
  height: number
): [number, number] | null {
  const shown = rows.flatMap((r, i) => {
    const seen = Math.min(r.bottom, height) - Math.max(r.top, 0);
    return seen > (r.bottom - r.top) / 2 ? [i] : [];
  });
  return shown.length ? [shown[0], shown[shown.length - 1]] : null;
}

/**
 * The region list's caption: the count, and when some rows are out of view which ones show and that
 * the list scrolls (issue 18: 12 regions showed 8, with nothing saying so where scrollbars overlay).
 */
export function regionListCaption(total: number, shown: [number, number] | null): string {
  const count = `${total} region${total === 1 ? '' : 's'}`;
  if (shown === null || shown[1] - shown[0] + 1 >= total) {
    return count;
  }
  const more = shown[1] < total - 1 ? 'scroll down for more' : 'scroll up for the first ones';
  return `${count}: ${shown[0] + 1}\u2013${shown[1] + 1} in view, ${more}`;
}

/** Pixels per character of a region label (plotly's 12 px sans-serif, generously) and per label row. */
const LABEL_CHAR_PX = 7;
const LABEL_ROW_PX = 16;

/**
 * A row for each region label so that no two labels in a row overlap: labels are centered on their
 * regions, `widthPx` is the plot area's width for `nodes` op positions, and each label goes to the
 * lowest row where it clears the labels already there (greedy interval colouring, left to right).  At
 * 12 layers the 12 labels, on one row, were written over each other.
 */
export function labelRows(
  regions: readonly { x0: number; x1: number }[],
  texts: readonly string[],
  nodes: number,
  widthPx: number
): number[] {
  const pxPerNode = widthPx / Math.max(1, nodes - 1);
  const spans = regions.map((r, i) => {
    const center = ((r.x0 + r.x1) / 2) * pxPerNode;
    const half = (texts[i].length * LABEL_CHAR_PX) / 2 + 4;
    return { i, lo: center - half, hi: center + half };
  });
  const rows = new Array<number>(regions.length).fill(0);
  const ends: number[] = []; // right end of the last label in each row
  for (const s of [...spans].sort((a, b) => a.lo - b.lo)) {
    let row = ends.findIndex(end => end <= s.lo);
    if (row < 0) {
      row = ends.length;
      ends.push(s.hi);
    } else {
      ends[row] = s.hi;
    }
    rows[s.i] = row;
  }
  return rows;
}

/** Label rows at most; more and the labels shorten, then thin out. */
const MAX_LABEL_ROWS = 3;

/**
 * The region labels drawn: "region i: n chunks" in rows that keep them apart (`labelRows`); where
 * that takes over `MAX_LABEL_ROWS` rows (a 115-layer model has 115 regions) the labels are the region
 * numbers, and if those still need more, every second, fourth ... region is labelled.
 */
export function regionLabels(
  regions: readonly { x0: number; x1: number; chunks: number }[],
  nodes: number,
  widthPx: number
): { index: number; text: string; row: number }[] {
  const layout = (shown: number[], text: (i: number) => string) => {
    const texts = shown.map(text);
    const rows = labelRows(
      shown.map(i => regions[i]),
      texts,
      nodes,
      widthPx
    );
    return shown.map((index, k) => ({ index, text: texts[k], row: rows[k] }));
  };
  const all = regions.map((_, i) => i);
  const fits = (ls: { row: number }[]) => ls.every(l => l.row < MAX_LABEL_ROWS);
  const full = layout(all, i => `region ${i + 1}: ${regions[i].chunks} chunks`);
  if (fits(full)) {
    return full;
  }
  for (let step = 1; ; step *= 2) {
    const short = layout(
      all.filter(i => i % step === 0),
      i => String(i + 1)
    );
    if (fits(short) || step >= regions.length) {
      return short;
    }
  }
}

/**
 * Plotly traces and layout: unchunked and chunked activation curves, regions as draggable rectangles,
 * their labels in as many rows above the plot as keep them apart (`labelRows`; `widthPx`: the plot's
 * width on the page).
 */
export function editorFigure(
  doc: EditorDoc,
  colors: ThemeColors,
  widthPx = 800
): { data: unknown[]; layout: Record<string, unknown> } {
  const x = doc.nodes.map((_, i) => i);
  const hover = doc.nodes.map(n => `${escapeHtml(n.op)} ${escapeHtml(n.name)}`);
  const peak = Math.max(1, ...doc.baseline, ...doc.chunked, doc.estimate.requested_bytes ?? 0);
  const unit = peak >= 2 ** 20 ? 2 ** 20 : 2 ** 10;
  const unitName = unit === 2 ** 20 ? 'MiB' : 'KiB';
  const trace = (name: string, ys: number[], color: string, dash: string): unknown => ({
    type: 'scatter',
    mode: 'lines',
    name,
    x,
    y: ys.map(b => b / unit),
    text: hover,
    hovertemplate: `%{text}<br>%{y:.2f} ${unitName}<extra>${name}</extra>`,
    line: { color, dash, shape: 'hv' }
  });
  const shapes = doc.regions.map(r => ({
    type: 'rect',
    xref: 'x',
    yref: 'paper',
    x0: r.x0,
    x1: r.x1,
    y0: 0,
    y1: 1,
    fillcolor: colors.region,
    opacity: 0.2,
    line: { width: 1, color: colors.region }
  }));
  // the bottom margin holds the x-axis title and, below it, the legend's two rows at most (four keys)
  const margin = { t: 30, r: 10, b: 96, l: 60 };
  const width = Math.max(100, widthPx - margin.l - margin.r);
  const labels = regionLabels(doc.regions, doc.nodes.length, width);
  const nrows = Math.max(1, ...labels.map(l => l.row + 1));
  const annotations = labels.map(l => ({
    xref: 'x',
    yref: 'paper',
    x: (doc.regions[l.index].x0 + doc.regions[l.index].x1) / 2,
    y: 1,
    yanchor: 'bottom',
    yshift: l.row * LABEL_ROW_PX,
    showarrow: false,
    text: l.text,
    font: { color: colors.font }
  }));
  // The budget as a line across the curves and the chunked peak marked on its curve: how far under (or
  // over) the budget the chunked plan is reads off the chart (issue 18: the budget was not drawn).
  const marks: unknown[] = [];
  const budget = doc.estimate.requested_bytes;
  if (budget !== null) {
    marks.push({
      type: 'scatter',
      mode: 'lines',
      name: `budget ${formatBytes(budget)}`,
      x: [0, Math.max(doc.nodes.length - 1, 1)],
      y: [budget / unit, budget / unit],
      hoverinfo: 'skip',
      line: { color: colors.error, dash: 'dash', width: 1.5 }
    });
  }
  const peakAt = doc.chunked.indexOf(Math.max(...doc.chunked));
  if (peakAt >= 0) {
    marks.push({
      type: 'scatter',
      mode: 'markers',
      name: `chunked peak ${formatBytes(doc.chunked[peakAt])}`,
      x: [peakAt],
      y: [doc.chunked[peakAt] / unit],
      text: [`${escapeHtml(doc.nodes[peakAt].op)} ${escapeHtml(doc.nodes[peakAt].name)}`],
      hovertemplate: `%{text}<br>chunked peak %{y:.2f} ${unitName}<extra></extra>`,
      marker: { color: colors.peak, size: 10, symbol: 'triangle-down' }
    });
  }
  return {
    data: [
      trace('unchunked', doc.baseline, colors.muted, 'dot'),
      trace('chunked', doc.chunked, colors.font, 'solid'),
      ...marks
    ],
    layout: {
      ...themedLayout(colors),
      shapes,
      annotations,
      xaxis: { ...themedAxis(colors), title: { text: 'op index' } },
      yaxis: { ...themedAxis(colors), title: { text: `activations (${unitName})` }, rangemode: 'tozero' },
      margin: { ...margin, t: margin.t + (nrows - 1) * LABEL_ROW_PX },
      // at the figure's bottom edge, not a fraction of the plot below it: wrapped to two rows in a narrow
      // output (once the budget and the peak had keys) it lay over the x-axis title
      legend: { orientation: 'h', yref: 'container', y: 0, yanchor: 'bottom' }
    }
  };
}
