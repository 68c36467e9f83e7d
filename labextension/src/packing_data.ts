/**
 * Pure transforms of the packing view: placements (OLLA's address plan, Steiner et al. 2022 Sec. 4.2,
 * and the simulated caching allocator's blocks) -> rectangles in (step, address) space, their pixel
 * rectangles in a raster of a given window, the hit test and text of the view's own hover, and the
 * few plotly traces drawn with the raster (legend keys and one empty anchor per subplot).
 *
 * Why a raster: plotly draws 10k rectangles either as 10k shapes or as filled SVG subpaths, which took
 * 1.5-2.3 s in headless Chromium; painting them into one canvas image takes milliseconds, and the view
 * repaints it for the visible window after every zoom so it stays sharp.  Why its own hover: plotly's
 * hover needs a point trace of every tensor (a WebGL context and 20k prebuilt hover strings, about a
 * third of the remaining draw time), while a linear hit test of the rectangles under the cursor takes
 * well under a millisecond and builds one text.
 */
import {
  CATEGORY_COLORS,
  categoryOrder,
  chooseUnit,
  escapeHtml,
  FALLBACK_COLOR,
  formatBytes,
  PackingDoc,
  PlacementDoc,
  PlanDoc
} from './transforms';

/** Plotly category (solvers.simulate's _CATEGORY_OF) of a data node kind. */
export function kindCategory(kind: string): string {
  const table: Record<string, string> = {
    parameter: 'parameters',
    buffer: 'buffers',
    input: 'inputs',
    optimizer_state: 'optimizer_state',
    parameter_gradient: 'parameter_gradients',
    gradient: 'gradients',
    activation: 'activations',
    saved: 'activations',
    output: 'outputs',
    communication: 'communication',
    runtime: 'runtime'
  };
  return table[kind] ?? kind;
}

/** One category's rectangles, flattened [x0, y0, x1, y1, ...]: x in steps (end exclusive), y in the unit. */
export interface RectLayer {
  category: string;
  color: string;
  rects: number[];
}

/** One side of the packing chart. */
export interface PackingPanel {
  layers: RectLayer[];
  /** the placements drawn, their rectangles [x0, y0, x1, y1, ...] and categories in the same order */
  placements: readonly PlacementDoc[];
  boxes: number[];
  categories: string[];
  /** the data extent: steps [0, xmax), addresses [0, ymax) in the unit */
  xmax: number;
  ymax: number;
}

/** The visible (step, address) window of a panel. */
export interface Window {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

/** Placements -> one rectangle layer per category (in stacking order), plus the rectangles in order. */
export function packingPanel(doc: PlanDoc, placements: readonly PlacementDoc[], scale: number): PackingPanel {
  const groups = new Map<string, number[]>();
  const boxes: number[] = [];
  const categories: string[] = [];
  let xmax = 0;
  let ymax = 0;
  for (const p of placements) {
    const cat = p.data === null ? 'workspace' : kindCategory(doc.graph.datas[p.data]?.kind ?? 'unknown');
    let rects = groups.get(cat);
    if (!rects) {
      rects = [];
      groups.set(cat, rects);
    }
    const x0 = p.start;
    const x1 = Math.max(p.end, p.start + 1);
    const y0 = p.offset / scale;
    const y1 = (p.offset + p.size) / scale;
    rects.push(x0, y0, x1, y1);
    boxes.push(x0, y0, x1, y1);
    categories.push(cat);
    xmax = Math.max(xmax, x1);
    ymax = Math.max(ymax, y1);
  }
  const order = categoryOrder(Object.fromEntries([...groups.keys()].map(k => [k, []])));
  const layers = order.map(category => ({
    category,
    color: CATEGORY_COLORS[category] ?? FALLBACK_COLOR,
    rects: groups.get(category)!
  }));
  return { layers, placements, boxes, categories, xmax, ymax };
}

/**
 * The address range [lo, hi) (in the unit) where memory changes over the schedule: above the lowest
 * tensor that does not live through the whole schedule, up to the top.  Below it lie only what every
 * step holds (parameters, optimizer state ...): zooming to the range gives the interleaved bands of
 * gradients and activations the whole height (at 100 layers they were slivers above 115 MiB of
 * 147).  Null when nothing below the top is fixed.
 */
export function changingRange(panel: PackingPanel): [number, number] | null {
  const b = panel.boxes;
  let lo = Infinity;
  for (let i = 0; i < b.length; i += 4) {
    if (b[i] > 0 || b[i + 2] < panel.xmax) {
      lo = Math.min(lo, b[i + 1]);
    }
  }
  return lo > 0 && lo < panel.ymax ? [lo, panel.ymax] : null;
}

/** Which address filter the packing shows: a zoom button's range, or one the user dragged. */
export type AddressFilter = 'changing' | 'all' | 'custom';

/**
 * The filter the address axis's `range` is: `changing` (the `changingRange` button's), `all` ([0, ymax]:
 * the other button's, and a double-click's) or `custom` (a drag zoom), equal within a millionth of the
 * top address (plotly echoes ranges back as floats).  Nothing showed which filter was active (issue 18).
 */
export function addressFilter(
  range: readonly [number, number],
  changing: readonly [number, number] | null,
  ymax: number
): AddressFilter {
  const eps = 1e-6 * Math.max(ymax, 1e-9);
  const same = (r: readonly [number, number]): boolean =>
    Math.abs(range[0] - r[0]) <= eps && Math.abs(range[1] - r[1]) <= eps;
  if (changing && same(changing)) {
    return 'changing';
  }
  return same([0, ymax]) ? 'all' : 'custom';
}

/** The line naming the shown address range: which filter, and its addresses in `unit`. */
export function addressFilterLabel(
  filter: AddressFilter,
  range: readonly [number, number],
  unit: string
): string {
  const span = `${range[0].toFixed(1)}\u2013${range[1].toFixed(1)} ${unit}`;
  const what = {
    changing: 'the addresses that change',
    all: 'all addresses',
    custom: 'a zoomed range (double-click the chart: all addresses)'
  }[filter];
  return `showing: ${what}, ${span}`;
}

/** The placement whose rectangle holds (x, y) (step, address in the unit), or null; `hidden`
 * categories (switched off in the legend) are not drawn, so they are not hit either. */
export function hitTest(
  panel: PackingPanel,
  x: number,
  y: number,
  hidden: ReadonlySet<string> = new Set()
): PlacementDoc | null {
  const b = panel.boxes;
  for (let i = 0; i < b.length; i += 4) {
    if (x >= b[i] && x < b[i + 2] && y >= b[i + 1] && y < b[i + 3] && !hidden.has(panel.categories[i / 4])) {
      return panel.placements[i / 4];
    }
  }
  return null;
}

/**
 * What the hover says about one placement, as plain-text lines (the view sets them with textContent,
 * so names need no escaping): name and shape, kind and size, lifetime and address.
 */
export function placementLines(doc: PlanDoc, p: PlacementDoc): string[] {
  const last = Math.max(p.end, p.start + 1) - 1;
  const where = `steps ${p.start}–${last}, offset ${formatBytes(p.offset)}`;
  if (p.data === null) {
    const name = doc.graph.computes[p.compute ?? -1]?.name ?? 'a compute step';
    return [`workspace of ${name}`, `workspace, ${formatBytes(p.size)}`, where];
  }
  const d = doc.graph.datas[p.data];
  const shape = d?.shape ? ` [${d.shape.join(', ')}]` : '';
  return [`${d?.name ?? `data ${p.data}`}${shape}`, `${d?.kind ?? 'unknown'}, ${formatBytes(p.size)}`, where];
}

/** Both packings side by side: the planned one, then the allocator simulation when the plan has it. */
export function packingFigure(doc: PlanDoc): {
  panels: PackingPanel[];
  unit: { name: string; scale: number };
  titles: string[];
} {
  const packing = doc.packing;
  if (!packing) {
    return { panels: [], unit: chooseUnit(0), titles: [] };
  }
  const allocator = packing.allocator ?? null;
  const top = (ps: readonly PlacementDoc[]): number => ps.reduce((m, p) => Math.max(m, p.offset + p.size), 0);
  const unit = chooseUnit(Math.max(top(packing.buffers), allocator ? top(allocator.blocks) : 0));
  const panels = [packingPanel(doc, packing.buffers, unit.scale)];
  const titles = [
    `planned packing<br>${formatBytes(packing.peak_bytes)}, fragmentation ` +
      `${(100 * packing.fragmentation).toFixed(1)}%${packingCutNote(packing)}`
  ];
  if (allocator) {
    panels.push(packingPanel(doc, allocator.blocks, unit.scale));
    titles.push(
      `PyTorch caching allocator (simulated)<br>${formatBytes(allocator.reserved_bytes)}, ` +
        `fragmentation ${(100 * allocator.fragmentation).toFixed(1)}%`
    );
  }
  return { panels, unit, titles };
}

/**
 * What the time limit cut in the planned packing, for its title ('' when nothing): the packer always
 * completes best fit in start order, so a cut leaves a complete greedy placement whose search (or other
 * greedy orders) did not run to the end; a larger time limit may lower its peak.
 */
export function packingCutNote(packing: PackingDoc): string {
  const cuts = (packing.time_cuts ?? []).filter(c => typeof c === 'string' && c.trim() !== '');
  if (!cuts.length) {
    return '';
  }
  const orders = packing.greedy_orders ?? [];
  const what =
    orders.length === 1 && orders[0] === 'start' ? 'greedy in start order only' : 'search cut short';
  return `<br>time limit reached: ${what}`;
}

/**
 * Pixel rectangles [left, top, width, height, ...] of `rects` in a `width` x `height` raster showing
 * `win` (addresses grow upwards).  Rectangles outside the window are dropped; a rectangle thinner
 * than a pixel is drawn one pixel wide or tall, so a short-lived or small tensor stays visible.
 */
export function pixelRects(rects: readonly number[], win: Window, width: number, height: number): number[] {
  const sx = width / (win.x1 - win.x0);
  const sy = height / (win.y1 - win.y0);
  const out: number[] = [];
  for (let i = 0; i < rects.length; i += 4) {
    const x0 = rects[i];
    const y0 = rects[i + 1];
    const x1 = rects[i + 2];
    const y1 = rects[i + 3];
    if (x1 <= win.x0 || x0 >= win.x1 || y1 <= win.y0 || y0 >= win.y1) {
      continue;
    }
    const left = (Math.max(x0, win.x0) - win.x0) * sx;
    const right = (Math.min(x1, win.x1) - win.x0) * sx;
    const top = (win.y1 - Math.min(y1, win.y1)) * sy;
    const bottom = (win.y1 - Math.max(y0, win.y0)) * sy;
    out.push(left, top, Math.max(right - left, 1), Math.max(bottom - top, 1));
  }
  return out;
}

/** A plotly trace of the packing chart (a legend key or a subplot's empty anchor) as plain data. */
export interface PackingTrace {
  type: 'scatter';
  name: string;
  x: readonly null[];
  y: readonly null[];
  mode: 'markers';
  marker?: { color: string; size: number; symbol: string };
  hoverinfo: 'skip';
  legendgroup?: string;
  showlegend: boolean;
  xaxis: string;
  yaxis: string;
}

/**
 * The traces drawn with the rasters, all empty (the rectangles are the images): one anchor per panel
 * so plotly lays out its subplot, and one legend key per category.  Panel i uses axes x/y, x2/y2, ...
 */
export function packingTraces(panels: readonly PackingPanel[]): PackingTrace[] {
  const traces: PackingTrace[] = [];
  const keyed = new Set<string>();
  panels.forEach((panel, i) => {
    const axes = { xaxis: i === 0 ? 'x' : `x${i + 1}`, yaxis: i === 0 ? 'y' : `y${i + 1}` };
    const empty = { type: 'scatter', x: [null], y: [null], mode: 'markers', hoverinfo: 'skip' } as const;
    traces.push({ ...empty, name: '', showlegend: false, ...axes });
    for (const layer of panel.layers) {
      if (!keyed.has(layer.category)) {
        keyed.add(layer.category);
        traces.push({
          ...empty,
          name: escapeHtml(layer.category.replace(/_/g, ' ')),
          marker: { color: layer.color, size: 10, symbol: 'square' },
          legendgroup: layer.category,
          showlegend: true,
          ...axes
        });
      }
    }
  });
  return traces;
}
