/**
 * Pure data transforms from a `memviz.plan/1` document (ARCHITECTURE.md, "Plan JSON") to plotly traces
 * and header readouts.  No DOM and no plotly import here, so the module runs under node's test runner.
 *
 * Every op, module, tensor and model name in a plan is untrusted text (a saved notebook can carry any
 * plan): whatever ends up in plotly hover text, which plotly parses as pseudo-HTML, goes through
 * `escapeHtml` first.
 */

/** The breakdown categories in stacking order; mirrors `solvers.CATEGORIES` (checked by a test). */
export const CATEGORIES: readonly string[] = [
  'parameters',
  'buffers',
  'inputs',
  'optimizer_state',
  'parameter_gradients',
  'gradients',
  'activations',
  'outputs',
  'communication',
  'runtime',
  'workspace'
];

/** One color per category, readable on both the light and the dark JupyterLab theme. */
export const CATEGORY_COLORS: Readonly<Record<string, string>> = {
  parameters: '#4c78a8',
  buffers: '#72b7b2',
  inputs: '#9d755d',
  optimizer_state: '#b279a2',
  parameter_gradients: '#f58518',
  gradients: '#eeca3b',
  activations: '#54a24b',
  outputs: '#ff9da6',
  communication: '#e45756',
  runtime: '#79706e',
  workspace: '#bab0ac'
};
export const FALLBACK_COLOR = '#888888';

export interface TimelineDoc {
  step_bytes: number[];
  by_category: Record<string, number[]>;
  peak_bytes: number;
  peak_step: number;
  total_time: number;
  recomputes?: number;
  valid?: boolean;
}

export interface ComputeDoc {
  id: number;
  name: string;
  op: string;
  phase?: string;
  module?: string;
  source?: string;
  inputs?: number[];
  outputs?: number[];
  /** seconds, measured or estimated by memviz.profile */
  time?: number;
  temp_bytes?: number;
}

export interface DataDoc {
  id: number;
  name: string;
  bytes: number;
  kind: string;
  shape?: number[] | null;
  dtype?: string | null;
  /** the compute node writing it; null for parameters, buffers, inputs and optimizer state */
  producer?: number | null;
  /** the compute nodes reading it (solvers.Graph.to_dict) */
  consumers?: number[];
}

/**
 * One placed tensor: live over schedule steps [start, end) (end exclusive, as solvers.olla and
 * solvers.allocator write it), at addresses [offset, offset + size).  An allocator block with a null
 * `data` is the workspace of compute node `compute`.
 */
export interface PlacementDoc {
  data: number | null;
  compute?: number | null;
  start: number;
  end: number;
  offset: number;
  size: number;
}

/** The planned packing and the caching-allocator simulation (ARCHITECTURE.md, "Plan JSON"). */
export interface PackingDoc {
  buffers: PlacementDoc[];
  peak_bytes: number;
  lower_bound?: number;
  fragmentation: number;
  /** where the time limit stopped the packer (solvers.olla.pack): its answer may improve with time */
  time_cuts?: string[];
  /** the greedy orders that placed every buffer ("start" always: best fit in start order) */
  greedy_orders?: string[];
  allocator?: AllocatorDoc | null;
}

/**
 * solvers.allocator's caching-allocator simulation of the planned schedule; `reserved[i]` and
 * `allocated[i]` are the bytes reserved from the device and held by blocks during step i.
 */
export interface AllocatorDoc {
  reserved_bytes: number;
  fragmentation: number;
  blocks: PlacementDoc[];
  reserved?: number[];
  allocated?: number[];
}

export type StepDoc = [string, number];

export interface ScheduledTimeline {
  schedule: StepDoc[];
  timeline: TimelineDoc;
  /** The graph this schedule runs on when it is not the plan's (an autochunk plan's unchunked baseline). */
  graph?: PlanDoc['graph'];
}

export interface PlanDoc {
  schema: string;
  strategy: string;
  budget_bytes: number | null;
  /** predicted step time over eager's (`Plan.time_overhead`; absent in older plan files) */
  time_overhead?: number;
  /** `time_overhead` at the quartiles of the step pairs the profile measured (`Plan.time_overhead_range`) */
  time_overhead_range?: [number, number] | null;
  model?: { name?: string; mode?: string };
  device?: { name?: string; estimated?: boolean; capacity_bytes?: number | null };
  graph: {
    computes: ComputeDoc[];
    datas: DataDoc[];
    /** `module_classes`: module path -> qualified class name (memviz.plan/2; absent in version 1) */
    meta?: { module_classes?: Record<string, string> } & Record<string, unknown>;
  };
  baseline?: ScheduledTimeline | null;
  planned: ScheduledTimeline;
  solver_stats?: {
    solver?: string;
    status?: string;
    gap?: number | null;
    seconds?: number;
    /** where the wall-clock safety cap, not counted work, stopped a solver (`Plan.time_cuts`) */
    extra?: { time_cuts?: unknown } | null;
  } | null;
  frontier?: FrontierEntry[];
  packing?: PackingDoc | null;
}

/** One point of the budget frontier (`time_overhead` is a ratio: 1.0 = no slowdown). */
export interface FrontierEntry {
  budget_bytes: number;
  peak_bytes: number;
  time_overhead: number;
  strategy: string;
}

/** Strategies `memviz.plan` accepts (DESIGN.md, public API), for the planner's selector. */
export const STRATEGIES: readonly string[] = [
  'auto',
  'checkmate',
  'checkmate-lp',
  'rotor',
  'rockmate',
  'sqrt',
  'olla',
  'autochunk',
  'none'
];

/** Escape text for plotly's pseudo-HTML (and for HTML in general). */
export function escapeHtml(text: unknown): string {
  return String(text)
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&#39;');
}

const UNITS: ReadonlyArray<[string, number]> = [
  ['GiB', 2 ** 30],
  ['MiB', 2 ** 20],
  ['KiB', 2 ** 10]
];

/** The largest binary unit in which `maxBytes` is at least 1 (bytes for tiny graphs). */
export function chooseUnit(maxBytes: number): { name: string; scale: number } {
  for (const [name, scale] of UNITS) {
    if (Math.abs(maxBytes) >= scale) {
      return { name, scale };
    }
  }
  return { name: 'B', scale: 1 };
}

export function formatBytes(bytes: number): string {
  const { name, scale } = chooseUnit(bytes);
  return scale === 1 ? `${bytes} B` : `${(bytes / scale).toFixed(2)} ${name}`;
}

function fail(what: string): never {
  throw new Error(`not a memviz plan document: ${what}`);
}

function isNumberArray(value: unknown): value is number[] {
  return Array.isArray(value) && value.every(v => typeof v === 'number' && Number.isFinite(v));
}

function checkTimeline(obj: unknown, where: string): ScheduledTimeline {
  if (typeof obj !== 'object' || obj === null) {
    fail(`"${where}" must be an object`);
  }
  const st = obj as Partial<ScheduledTimeline>;
  if (!Array.isArray(st.schedule)) {
    fail(`"${where}.schedule" must be a list of steps`);
  }
  const tl = st.timeline as Partial<TimelineDoc> | undefined;
  if (typeof tl !== 'object' || tl === null || !isNumberArray(tl.step_bytes)) {
    fail(`"${where}.timeline.step_bytes" must be a list of numbers`);
  }
  const n = tl.step_bytes.length;
  if (st.schedule.length !== n) {
    fail(`"${where}" has ${st.schedule.length} schedule steps but ${n} timeline entries`);
  }
  if (typeof tl.by_category !== 'object' || tl.by_category === null) {
    fail(`"${where}.timeline.by_category" must be an object`);
  }
  for (const [cat, series] of Object.entries(tl.by_category)) {
    if (!isNumberArray(series) || series.length !== n) {
      fail(`"${where}.timeline.by_category.${cat}" must be ${n} numbers`);
    }
  }
  if (typeof tl.peak_bytes !== 'number' || typeof tl.peak_step !== 'number') {
    fail(`"${where}.timeline" needs numeric peak_bytes and peak_step`);
  }
  return st as ScheduledTimeline;
}

/**
 * A plan document sent in two parts (the planner widget: `plan_base_json`, the members every plan it
 * shows shares, sent once, and `plan_json`, the rest): the base's members overlaid with the part's,
 * the part's winning.  A missing or empty base leaves the part as it is.  Checked by `parsePlan` after.
 */
export function mergePlanParts(base: unknown, part: unknown): unknown {
  const isObject = (v: unknown): v is Record<string, unknown> =>
    typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObject(part)) {
    fail('expected a JSON object');
  }
  return isObject(base) ? { ...base, ...part } : part;
}

/**
 * The plan document versions drawn: version 2 added the graph's `meta.module_classes`, version 3 its
 * `meta.autocast`, which the views do not draw (planfile.py).
 */
export const READABLE_SCHEMAS = ['memviz.plan/1', 'memviz.plan/2', 'memviz.plan/3'];

/**
 * Check the parts of a plan the renderer reads and return it typed; throws an Error that says what is
 * wrong (the full JSON Schema check happens in Python when a plan file is loaded).
 */
export function parsePlan(data: unknown): PlanDoc {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) {
    fail('expected a JSON object');
  }
  const doc = data as Partial<PlanDoc>;
  if (typeof doc.schema !== 'string' || !doc.schema.startsWith('memviz.plan/')) {
    fail(`"schema" must be one of ${READABLE_SCHEMAS.join(', ')}`);
  }
  if (!READABLE_SCHEMAS.includes(doc.schema)) {
    fail(
      `schema ${JSON.stringify(doc.schema)} is not supported by this extension (expected ${READABLE_SCHEMAS.join(' or ')})`
    );
  }
  const graph = doc.graph;
  if (
    typeof graph !== 'object' ||
    graph === null ||
    !Array.isArray(graph.computes) ||
    !Array.isArray(graph.datas)
  ) {
    fail('"graph" must hold "computes" and "datas" lists');
  }
  checkTimeline(doc.planned, 'planned');
  if (doc.baseline !== undefined && doc.baseline !== null) {
    checkTimeline(doc.baseline, 'baseline');
  }
  if (doc.budget_bytes !== undefined && doc.budget_bytes !== null && typeof doc.budget_bytes !== 'number') {
    fail('"budget_bytes" must be a number or null');
  }
  if (doc.packing !== undefined && doc.packing !== null) {
    checkPacking(doc.packing);
  }
  return doc as PlanDoc;
}

function isPlacement(p: unknown): boolean {
  if (typeof p !== 'object' || p === null) {
    return false;
  }
  const r = p as Record<string, unknown>;
  const finite = (k: string): boolean => typeof r[k] === 'number' && Number.isFinite(r[k]);
  // A null data is an allocator block holding a compute step's workspace.
  return ['start', 'end', 'offset', 'size'].every(finite) && (r.data === null || finite('data'));
}

function checkPlacements(value: unknown, where: string): void {
  if (!Array.isArray(value) || !value.every(isPlacement)) {
    fail(`"${where}" must be a list of {data, start, end, offset, size} numbers`);
  }
}

function checkPacking(packing: PackingDoc): void {
  checkPlacements(packing.buffers, 'packing.buffers');
  if (packing.allocator !== undefined && packing.allocator !== null) {
    checkPlacements(packing.allocator.blocks, 'packing.allocator.blocks');
  }
}

/**
 * What a schedule step does, as escaped hover HTML: step index, op and module path (`source`: and its
 * source line, for the baseline of another graph, whose steps the inspector does not list).
 */
export function stepHover(doc: PlanDoc, step: StepDoc | undefined, index: number, source = false): string {
  const head = `step ${index}`;
  if (!step) {
    return head;
  }
  const [kind, id] = step;
  if (kind === 'compute') {
    const c = doc.graph.computes[id];
    if (!c) {
      return `${head}: compute #${escapeHtml(id)}`;
    }
    const lines = [`${head}: <b>${escapeHtml(c.name)}</b> (${escapeHtml(c.op)})`];
    if (c.module) {
      lines.push(`module: ${escapeHtml(c.module)}`);
    }
    if (source && c.source) {
      lines.push(`source: ${escapeHtml(c.source)}`);
    }
    return lines.join('<br>');
  }
  if (kind === 'free') {
    const d = doc.graph.datas[id];
    return d
      ? `${head}: free <b>${escapeHtml(d.name)}</b> (${escapeHtml(d.kind)}, ${formatBytes(d.bytes)})`
      : `${head}: free #${escapeHtml(id)}`;
  }
  return `${head}: ${escapeHtml(kind)} #${escapeHtml(id)}`;
}

/**
 * The planned bytes of each memory layer at `step` (the chart's stacked areas; plain text labels), the
 * layers that hold nothing there left out: the click's inspection lists them, the hover does not.
 */
export function categoryShares(doc: PlanDoc, step: number): { category: string; bytes: number }[] {
  const byCategory = doc.planned.timeline.by_category;
  return categoryOrder(byCategory)
    .map(cat => ({ category: cat.replace(/_/g, ' '), bytes: byCategory[cat][step] ?? 0 }))
    .filter(share => share.bytes !== 0);
}

/** Categories present in a timeline, in `CATEGORIES` order, unknown future ones after them. */
export function categoryOrder(byCategory: Record<string, number[]>): string[] {
  const present = Object.keys(byCategory);
  const known = CATEGORIES.filter(c => present.includes(c));
  return known.concat(present.filter(c => !CATEGORIES.includes(c)));
}

/** A plotly trace as plain data (the subset of plotly's attributes used here). */
export interface Trace {
  type: 'scatter';
  name: string;
  x: number[];
  /** null: a gap in the line */
  y: (number | null)[];
  mode: 'lines' | 'markers' | 'lines+markers' | 'markers+text';
  hovertext?: string[];
  hoverinfo?: 'text' | 'skip';
  stackgroup?: string;
  fillcolor?: string;
  line?: { color?: string; width?: number; dash?: string; shape?: 'hv' | 'linear' };
  marker?: { color?: string; size?: number; symbol?: string };
  text?: string[];
  textposition?: string;
  legendgroup?: string;
  showlegend?: boolean;
}

export interface Figure {
  traces: Trace[];
  unit: { name: string; scale: number };
  steps: number;
  /** x axis title, and the seconds per x unit on the time axis (1 on the step axis) */
  xTitle: string;
  xscale: number;
}

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}

/** What the memory chart's x axis counts: schedule steps, or estimated seconds of compute. */
export type XAxis = 'step' | 'time';

/**
 * The x coordinate where each step of `schedule` starts, plus where the last one ends (n + 1 values):
 * the step index, or the summed time of the compute steps before it (graph per-op times; a
 * recomputation counts again, frees take no time), so the time axis shows where the schedule spends
 * its time.
 */
export function stepEdges(doc: PlanDoc, schedule: readonly StepDoc[], axis: XAxis): number[] {
  if (axis === 'step') {
    return range(schedule.length + 1);
  }
  const edges = [0];
  let t = 0;
  for (const [kind, id] of schedule) {
    if (kind === 'compute') {
      t += doc.graph.computes[id]?.time ?? 0;
    }
    edges.push(t);
  }
  return edges;
}

/** True when the plan's per-op times give a time axis (a graph without times has none). */
export function hasStepTimes(doc: PlanDoc): boolean {
  const edges = stepEdges(doc, doc.planned.schedule, 'time');
  return edges[edges.length - 1] > 0;
}

const TIME_UNITS: ReadonlyArray<[string, number]> = [
  ['s', 1],
  ['ms', 1e-3],
  ['µs', 1e-6]
];

/** The largest time unit in which `seconds` is at least 1 (nanoseconds below a microsecond). */
export function timeUnit(seconds: number): { name: string; scale: number } {
  for (const [name, scale] of TIME_UNITS) {
    if (Math.abs(seconds) >= scale) {
      return { name, scale };
    }
  }
  return { name: 'ns', scale: 1e-9 };
}

/**
 * Bytes PyTorch's caching allocator (solvers.allocator, simulated on the planned schedule) reserves
 * beyond what the plan has live during each planned step: the fragmentation layer of the memory chart.
 * Null when the plan carries no per-step allocator series for this schedule.
 */
export function fragmentationSeries(doc: PlanDoc): number[] | null {
  const reserved = doc.packing?.allocator?.reserved;
  const live = doc.planned.timeline.step_bytes;
  if (!isNumberArray(reserved) || reserved.length !== live.length || live.length === 0) {
    return null;
  }
  return reserved.map((r, i) => Math.max(r - live[i], 0));
}

/** The steps of `schedule` that run a compute node a second (or later) time: its recomputations. */
export function recomputeSteps(schedule: readonly StepDoc[]): number[] {
  const seen = new Set<number>();
  const out: number[] = [];
  schedule.forEach(([kind, id], i) => {
    if (kind === 'compute') {
      if (seen.has(id)) {
        out.push(i);
      }
      seen.add(id);
    }
  });
  return out;
}

/** The first planned step that runs a backward compute node (where the backward pass starts), or null. */
export function backwardStart(doc: PlanDoc): number | null {
  const i = doc.planned.schedule.findIndex(
    ([kind, id]) => kind === 'compute' && doc.graph.computes[id]?.phase === 'backward'
  );
  return i >= 0 ? i : null;
}

/**
 * The left edge (pixels from the figure's left) of the memory chart's unified hover box, `width` wide,
 * for the hovered point at `pointX`: right of the point where the box ends inside the plot area (whose
 * right edge is `plotRight`), else left of it, else flush with the plot area's right edge.  plotly keeps
 * the box inside the whole figure only, so right of a point near the plot's right edge it lay over the
 * legend beside the plot (issue 18's screenshots); `gap` keeps it off the point, as plotly's does.
 */
export function hoverBoxLeft(pointX: number, width: number, plotRight: number, gap = 6): number {
  if (pointX + gap + width <= plotRight) {
    return pointX + gap;
  }
  if (pointX - gap - width >= 0) {
    return pointX - gap - width;
  }
  return Math.max(0, plotRight - width);
}

/**
 * Where the peak marker's label goes so that the forward/backward boundary (drawn at the left edge of
 * step `backward`) never crosses it: right of the marker from the boundary on (the label starts past the
 * marker's centre, so a peak on the line itself is clear of it), left of it before; centred without a
 * boundary (inference).
 */
export function peakLabelPosition(peakStep: number, backward: number | null): string {
  if (backward === null) {
    return 'top center';
  }
  return peakStep >= backward ? 'top right' : 'top left';
}

/**
 * For each planned step, the eager baseline step that runs the same op (compute node; a recomputation
 * maps to the op's one eager run), or for a free step the one of the last compute before it; -1 before
 * any.  A baseline carrying a graph of its own (a captured model's eager run, whose in-place ops hold
 * other bytes) is matched by op name when it names every planned op, once each: its ids are its own.
 * Null when no op is shared (an autochunk plan's unchunked model): the baseline keeps its own hover.
 * Matching ids alone left a captured GPT's hover comparing planned "bmm_44" with eager's "free
 * addmm_18" at the same step index (issue 18 item 3, seen at 12 layers).
 */
export function baselineStepsByOp(doc: PlanDoc): number[] | null {
  const baseline = doc.baseline;
  if (!baseline) {
    return null;
  }
  // the key of a compute node shared by both graphs: its id, or its name across two graphs
  let key = (id: number): number | string | undefined => id;
  let baseKey = key;
  if (baseline.graph) {
    const names = baseline.graph.computes.map(c => c.name);
    const known = new Set(names);
    if (known.size !== names.length || !doc.graph.computes.every(c => known.has(c.name))) {
      return null;
    }
    key = id => doc.graph.computes[id]?.name;
    baseKey = id => baseline.graph!.computes[id]?.name;
  }
  const eagerStep = new Map<number | string | undefined, number>();
  baseline.schedule.forEach(([kind, id], i) => {
    if (kind === 'compute' && !eagerStep.has(baseKey(id))) {
      eagerStep.set(baseKey(id), i);
    }
  });
  let last = -1;
  return doc.planned.schedule.map(([kind, id]) => {
    if (kind === 'compute') {
      last = eagerStep.get(key(id)) ?? last;
    }
    return last;
  });
}

/** A trace slot with nothing to draw, out of the legend and the hover. */
const EMPTY_SLOT: Omit<Trace, 'name'> = {
  type: 'scatter',
  x: [],
  y: [],
  mode: 'lines',
  stackgroup: 'planned',
  hoverinfo: 'skip',
  showlegend: false
};

/**
 * Legend name of the layer PyTorch's caching allocator reserves beyond the live bytes (the kernel
 * simulates it only for devices that use one: CUDA).
 */
export const FRAGMENTATION = 'reserved by the allocator';
const FRAGMENTATION_COLOR = '#9e9e9e';
/** Recomputation marks: the red of the categories' palette not used by a stacked category. */
const RECOMPUTE_COLOR = '#d62728';

/**
 * Plan -> traces: the planned timeline as stacked areas by category (all-zero categories dropped), the
 * simulated allocator's fragmentation stacked on top when the plan has it, under a line of the planned
 * total that carries the hover text of each step (with eager's bytes at the same op), a mark on each
 * recomputation, the baseline as a dotted line, the budget as a dashed line and a marker on the
 * planned peak.  Bytes are scaled to one binary unit chosen from the largest
 * value shown; x is the step index or the estimated time (`axis`), then in `xunit`.
 */
export function planFigure(
  doc: PlanDoc,
  colors: { planned: string; baseline: string; budget: string; peak: string },
  axis: XAxis = 'step'
): Figure {
  const planned = doc.planned;
  const baseline = doc.baseline ?? null;
  const n = planned.timeline.step_bytes.length;
  const m = baseline ? baseline.timeline.step_bytes.length : 0;
  const fragmentation = fragmentationSeries(doc);
  // reduce, not Math.max(...): spreading a 100k-step series overflows the call stack
  const reserved = fragmentation
    ? planned.timeline.step_bytes.reduce((top, v, i) => Math.max(top, v + fragmentation[i]), 0)
    : 0;
  const maxBytes = Math.max(
    planned.timeline.peak_bytes,
    baseline ? baseline.timeline.peak_bytes : 0,
    doc.budget_bytes ?? 0,
    reserved
  );
  const unit = chooseUnit(maxBytes);
  const plannedEdges = stepEdges(doc, planned.schedule, axis);
  // an autochunk plan's baseline runs on the unchunked graph it carries, not on the planned one
  const baseDoc = baseline?.graph ? { ...doc, graph: baseline.graph } : doc;
  const baselineEdges = baseline ? stepEdges(baseDoc, baseline.schedule, axis) : [0];
  // Edges only grow: the last one is the schedule's total time.
  const end = Math.max(plannedEdges[plannedEdges.length - 1], baselineEdges[baselineEdges.length - 1]);
  const xunit = axis === 'time' ? timeUnit(end) : { name: '', scale: 1 };
  const px = plannedEdges.slice(0, n).map(x => x / xunit.scale);
  const plannedSteps = planned.schedule.map((s, i) => stepHover(doc, s, i));
  const traces: Trace[] = [];

  // The layers stay out of the hover: one line per layer made the unified box cover half a 12-layer
  // chart.  Their bytes at a step are in the click's inspection (`categoryShares`).
  const area = (name: string, series: number[], color: string): void => {
    traces.push({
      type: 'scatter',
      name: escapeHtml(name),
      x: px,
      y: series.map(v => v / unit.scale),
      mode: 'lines',
      stackgroup: 'planned',
      fillcolor: color,
      line: { color, width: 0.5, shape: 'hv' },
      hoverinfo: 'skip'
    });
  };
  for (const cat of categoryOrder(planned.timeline.by_category)) {
    const series = planned.timeline.by_category[cat];
    if (series.some(v => v !== 0)) {
      area(cat.replace(/_/g, ' '), series, CATEGORY_COLORS[cat] ?? FALLBACK_COLOR);
    }
  }
  if (fragmentation) {
    area(FRAGMENTATION, fragmentation, FRAGMENTATION_COLOR);
  } else {
    // An empty slot: the trace list keeps its shape whether or not a plan has packing (the slider
    // alternates frontier plans without and refined plans with it), and plotly redraws a changed
    // trace list from scratch, slower than a redraw of the same traces.
    traces.push({ ...EMPTY_SLOT, name: FRAGMENTATION });
  }

  // The planned total carries the whole hover, three short lines: the step's op (recomputed or not), its
  // module, and planned against what eager holds when it runs the same op, aligned by op, not by step
  // index (a plan that recomputes or reorders runs a different op at eager's index).  The source line,
  // the layers and the tensors are in the click's inspection.
  const recomputed = recomputeSteps(planned.schedule);
  const isRecompute = new Set(recomputed);
  const byOp = baselineStepsByOp(doc);
  const eagerAt = (i: number): string => {
    const j = byOp?.[i] ?? -1;
    return byOp && j >= 0 && baseline
      ? ` · eager at this op ${formatBytes(baseline.timeline.step_bytes[j])} (eager step ${j})`
      : '';
  };
  traces.push({
    type: 'scatter',
    name: 'planned total',
    x: px,
    y: planned.timeline.step_bytes.map(v => v / unit.scale),
    mode: 'lines',
    line: { color: colors.planned, width: 1, shape: 'hv' },
    hoverinfo: 'text',
    hovertext: planned.timeline.step_bytes.map((v, i) => {
      // the flag goes on the op's line (the first: names are escaped, so no '<br>' comes from the plan)
      const [op, ...rest] = plannedSteps[i].split('<br>');
      const flag = isRecompute.has(i) ? ' · <i>recomputed</i>' : '';
      return [op + flag, ...rest, `planned ${formatBytes(v)}${eagerAt(i)}`].join('<br>');
    })
  });
  // A mark on each recomputation (always one trace, empty when none: the trace list keeps its shape).
  traces.push({
    type: 'scatter',
    name: `recomputation (${recomputed.length})`,
    x: recomputed.map(i => px[i]),
    y: recomputed.map(i => planned.timeline.step_bytes[i] / unit.scale),
    mode: 'markers',
    marker: { color: RECOMPUTE_COLOR, size: 7, symbol: 'x-thin-open' },
    hoverinfo: 'skip',
    showlegend: recomputed.length > 0
  });

  if (baseline) {
    // Drawn by op, as the hover compares: at each planned step, eager's bytes while it runs the same
    // op (a gap before the plan's first shared op).  Drawn by step index, the dotted line set eager's
    // step i under the plan's step i, another op as soon as the plan recomputes or reorders one
    // (issue 18 item 3).  Only a baseline sharing no op (an autochunk plan's unchunked model) keeps
    // its own steps and its own hover.
    const line: Trace = {
      type: 'scatter',
      name: 'baseline (eager)',
      x: byOp ? px : baselineEdges.slice(0, m).map(x => x / xunit.scale),
      y: byOp
        ? byOp.map(j => (j >= 0 ? baseline.timeline.step_bytes[j] / unit.scale : null))
        : baseline.timeline.step_bytes.map(v => v / unit.scale),
      mode: 'lines',
      line: { color: colors.baseline, width: 1.5, dash: 'dot', shape: 'hv' },
      hoverinfo: byOp ? 'skip' : 'text'
    };
    if (!byOp) {
      line.hovertext = baseline.schedule.map(
        (s, i) =>
          `baseline ${stepHover(baseDoc, s, i, true)}<br>total: ${formatBytes(baseline.timeline.step_bytes[i])}`
      );
    }
    traces.push(line);
  }

  if (typeof doc.budget_bytes === 'number') {
    const last = axis === 'step' ? Math.max(n, byOp ? 0 : m, 1) - 1 : end / xunit.scale;
    traces.push({
      type: 'scatter',
      name: 'budget',
      x: [0, last],
      y: [doc.budget_bytes / unit.scale, doc.budget_bytes / unit.scale],
      mode: 'lines',
      line: { color: colors.budget, width: 1.5, dash: 'dash' },
      hoverinfo: 'text',
      hovertext: [`budget ${formatBytes(doc.budget_bytes)}`, `budget ${formatBytes(doc.budget_bytes)}`]
    });
  }

  const peakStep = Math.max(planned.timeline.peak_step, 0);
  const backward = backwardStart(doc);
  if (n > 0) {
    const peak = planned.timeline.peak_bytes;
    traces.push({
      type: 'scatter',
      name: 'peak',
      x: [px[peakStep] ?? 0],
      y: [peak / unit.scale],
      mode: 'markers+text',
      marker: { color: colors.peak, size: 10, symbol: 'triangle-down' },
      text: [`peak ${formatBytes(peak)}`],
      // on the peak's side of the forward/backward line, which a training plan's peak often sits on:
      // centred, the dash line crossed the label (issue 18's screenshots)
      textposition: peakLabelPosition(peakStep, backward),
      hoverinfo: 'text',
      // the planned total's entry beside it names the step
      hovertext: [`<b>peak ${formatBytes(peak)}</b>`]
    });
  }
  const xTitle = axis === 'time' ? `estimated time (${xunit.name}, summed per-op times)` : 'schedule step';
  // a baseline drawn by op spans the planned steps
  return { traces, unit, steps: Math.max(n, byOp ? 0 : m), xTitle, xscale: xunit.scale };
}

/** One header readout: a label and its value, both plain text (set with textContent); a warning is
 * shown as one. */
export interface Readout {
  label: string;
  value: string;
  warning?: boolean;
}

function percent(x: number): string {
  return `${x >= 0 ? '+' : ''}${(100 * x).toFixed(1)}%`;
}

/**
 * The overhead readout of a plan whose predicted step time is `overhead` times eager's.  An eager plan
 * ("none") is the eager step itself (`memviz.apply` leaves the model as it is): 0.  Its
 * `Plan.time_overhead` is what `memviz.export`'s module is predicted to take, the executor's own per-step
 * costs against eager's autograd as the profile measured them, which can be below eager's (a small MLP on
 * a CPU: -15%); that figure is named as the exported module's, never as the plan's overhead.
 */
export function overheadReadout(
  strategy: string,
  overhead: number,
  spread: [number, number] | null = null
): string {
  // how exact it is (issue 18: shown as exact, it moved ~10 points between runs of one plan): the
  // prediction at the quartiles of the step pairs the profile timed, else that nothing measured it
  const exact = spread
    ? ` (${percent(spread[0] - 1)} to ${percent(spread[1] - 1)} at the measured steps' quartiles)`
    : ' (spread not measured)';
  if (strategy !== 'none') {
    return percent(overhead - 1) + exact;
  }
  // under 0.05 points it would print as +0.0% / -0.0%: nothing to add
  return Math.abs(overhead - 1) < 0.0005
    ? '0 (eager)'
    : `0 (eager) · exported module ${percent(overhead - 1)}${exact}`;
}

/** A plan's `time_overhead_range` when it is two finite ratios in order (a plan file is untrusted). */
export function overheadSpread(doc: PlanDoc): [number, number] | null {
  const r = doc.time_overhead_range;
  return Array.isArray(r) &&
    r.length === 2 &&
    r.every(x => typeof x === 'number' && Number.isFinite(x) && x >= 0) &&
    r[0] <= r[1]
    ? [r[0], r[1]]
    : null;
}

/**
 * Header readouts, the one description of the plan drawn: strategy (against the selector's `selected`
 * one), planned peak (vs baseline), time overhead, recomputations, budget, fit verdict, solver status.
 */
export function planReadouts(doc: PlanDoc, selected: string | null = null): Readout[] {
  const planned = doc.planned.timeline;
  const baseline = doc.baseline?.timeline;
  const out: Readout[] = [{ label: 'strategy', value: strategyReadout(String(doc.strategy), selected) }];
  let peak = formatBytes(planned.peak_bytes);
  if (baseline && baseline.peak_bytes > 0) {
    peak += ` (${percent(planned.peak_bytes / baseline.peak_bytes - 1)} vs eager ${formatBytes(baseline.peak_bytes)})`;
  }
  out.push({ label: 'peak', value: peak });
  // the kernel's prediction (op times plus the measured fixed costs) when the plan carries it, as
  // Plan.summary() says it; older plan files: the ratio of op times
  const overhead =
    typeof doc.time_overhead === 'number' && Number.isFinite(doc.time_overhead)
      ? doc.time_overhead
      : baseline && baseline.total_time > 0
        ? planned.total_time / baseline.total_time
        : null;
  if (overhead !== null) {
    out.push({
      label: 'overhead',
      value: overheadReadout(String(doc.strategy), overhead, overheadSpread(doc))
    });
  }
  if (typeof planned.recomputes === 'number') {
    out.push({ label: 'recomputes', value: String(planned.recomputes) });
  }
  if (typeof doc.budget_bytes === 'number') {
    out.push({ label: 'budget', value: formatBytes(doc.budget_bytes) });
    out.push({ label: 'fits', value: fitVerdict(doc, doc.budget_bytes) });
  }
  if (doc.solver_stats?.status) {
    out.push({ label: 'solver', value: solverSummary(doc.solver_stats) });
  }
  const cuts = timeCuts(doc);
  if (cuts.length) {
    out.push({
      label: 'time limit',
      value: `stopped by the time limit in ${cuts.join(', ')}: may differ between runs`,
      warning: true
    });
  }
  return out;
}

/**
 * Where the wall-clock safety cap cut a solver while planning (`solver_stats.extra.time_cuts`, a list
 * of strings in the schema): a plan file is untrusted, so anything but strings is dropped, and repeats
 * are named once.
 */
export function timeCuts(doc: PlanDoc): string[] {
  const cuts = doc.solver_stats?.extra?.time_cuts;
  if (!Array.isArray(cuts)) {
    return [];
  }
  return [...new Set(cuts.filter((c): c is string => typeof c === 'string' && c.trim() !== ''))];
}

/**
 * Whether the plan fits its budget, and on what it is judged: on a device with a caching allocator
 * (the plan carries its simulation) the reserved peak, since the export runs the schedule through that
 * allocator and does not lay tensors out at the packed addresses; elsewhere the live bytes.
 */
export function fitVerdict(doc: PlanDoc, budget: number): string {
  const reserved = doc.packing?.allocator?.reserved_bytes;
  const [held, what, how] =
    typeof reserved === 'number'
      ? [
          reserved,
          'reserved by the allocator',
          "the export runs PyTorch's allocator, not the packed addresses"
        ]
      : [
          doc.planned.timeline.peak_bytes,
          'live peak',
          // without packing the kernel has not simulated the allocator yet (a frontier plan on the slider)
          doc.packing ? 'no caching allocator on this device' : 'allocator not simulated for this plan yet'
        ];
  const fits = held <= budget;
  return `${fits ? 'yes' : 'NO'}: ${what} ${formatBytes(held)} ${fits ? '≤' : '>'} ${formatBytes(budget)} (${how})`;
}

/**
 * The solver's result in a few words: status and proven gap (exact solvers), or that a heuristic
 * proves no bound; the solve time when known.
 */
export function solverSummary(stats: PlanDoc['solver_stats']): string {
  if (!stats || !stats.status) {
    return 'no solver statistics';
  }
  const head = `${stats.solver ?? ''} ${stats.status}`.trim();
  let gap = '';
  if (typeof stats.gap === 'number') {
    gap = `, gap ${(100 * stats.gap).toFixed(1)}%`;
  } else if (stats.status === 'heuristic') {
    gap = ', no optimality bound';
  }
  const seconds = typeof stats.seconds === 'number' ? ` in ${stats.seconds.toFixed(2)} s` : '';
  return `${head}${gap}${seconds}`;
}

/** Chart title: model name and mode, as escaped pseudo-HTML for plotly. */
export function planTitle(doc: PlanDoc): string {
  const name = doc.model?.name ?? 'model';
  const mode = doc.model?.mode ? ` (${doc.model.mode})` : '';
  const device = doc.device?.name ? ` on ${doc.device.name}${doc.device.estimated ? ', estimated' : ''}` : '';
  return escapeHtml(`${name}${mode}${device}`);
}

/**
 * The budget slider's label: the budget alone, in bytes and as a share of the eager peak (the plan drawn
 * for it is described once, in the chart's readouts).  Plain text.
 */
export function budgetLabel(budget: number, eagerPeak: number | null): string {
  const share = eagerPeak && eagerPeak > 0 ? ` (${Math.round((100 * budget) / eagerPeak)}% of eager)` : '';
  return `${formatBytes(budget)}${share}`;
}

/**
 * The slider's two ends: the smallest budget the frontier has a checked plan for (its first row's plan
 * peak: a budget equal to it is feasible) and the eager peak at its top; null without a frontier.
 */
export function frontierEnds(
  frontier: readonly FrontierEntry[]
): { minimum: number; eager: number; minimumBudget: number } | null {
  if (frontier.length === 0) {
    return null;
  }
  const lowest = frontier.reduce((a, b) => (b.budget_bytes < a.budget_bytes ? b : a));
  const highest = frontier.reduce((a, b) => (b.budget_bytes > a.budget_bytes ? b : a));
  return { minimum: lowest.peak_bytes, minimumBudget: lowest.budget_bytes, eager: highest.budget_bytes };
}

/** Positions of the slider when it stands for bytes rather than frontier rows (no frontier). */
export const BYTE_SLIDER_STEPS = 1000;

/**
 * The slider of a plan without a frontier (`frontier=False`, or not computed yet): no smallest feasible
 * budget is known, so its ends are 0 B and the eager peak, and it sits where the plan's budget lies
 * between them (at its left end it said "60% of eager" at 100 layers).  `value` is in
 * 0..`BYTE_SLIDER_STEPS`; null without a budget or an eager peak to place it by.
 */
export function sliderWithoutFrontier(
  budget: number | null,
  eagerPeak: number | null
): { value: number; minimumText: string; eagerText: string; note: string } | null {
  if (budget === null || eagerPeak === null || !(eagerPeak > 0)) {
    return null;
  }
  const share = Math.min(Math.max(budget / eagerPeak, 0), 1);
  return {
    value: Math.round(share * BYTE_SLIDER_STEPS),
    minimumText: formatBytes(0),
    eagerText: `eager ${formatBytes(eagerPeak)}`,
    note: 'no frontier: the smallest feasible budget is not known; type a budget to plan another'
  };
}

/**
 * A chart readout for the strategy of the plan drawn, saying how it relates to the selector's choice
 * (`selected`): chosen by auto, or the frontier's plan shown while the selected strategy is solved or
 * after it found none.
 */
export function strategyReadout(shown: string, selected: string | null): string {
  if (!selected || selected === shown) {
    return shown;
  }
  if (selected === 'auto') {
    return `${shown} (chosen by auto)`;
  }
  return `${shown} (the frontier's plan; ${selected} selected)`;
}

/**
 * The frontier point a plan's budget corresponds to: the smallest frontier budget at or above it, or the
 * largest frontier budget when the plan's budget exceeds them all or the plan has none; -1 if no frontier.
 */
export function nearestFrontierIndex(frontier: readonly FrontierEntry[], budget: number | null): number {
  if (frontier.length === 0) {
    return -1;
  }
  let best = -1;
  frontier.forEach((entry, i) => {
    if (
      budget !== null &&
      entry.budget_bytes >= budget &&
      (best < 0 || entry.budget_bytes < frontier[best].budget_bytes)
    ) {
      best = i;
    }
  });
  if (best >= 0) {
    return best;
  }
  let largest = 0;
  frontier.forEach((entry, i) => {
    if (entry.budget_bytes > frontier[largest].budget_bytes) {
      largest = i;
    }
  });
  return largest;
}

/** The planned schedule step that first runs compute node `computeId`, or null if it never runs. */
export function computeStep(doc: PlanDoc, computeId: number): number | null {
  const index = doc.planned.schedule.findIndex(([kind, id]) => kind === 'compute' && id === computeId);
  return index >= 0 ? index : null;
}

/** What the export row shows for the kernel's `export_result` JSON, and whether it is an error. */
export interface ExportOutcome {
  message: string;
  error: boolean;
  /** files the kernel refused to overwrite: the Overwrite button is offered */
  exists: string[];
}

export function exportOutcome(text: string): ExportOutcome {
  if (!text) {
    return { message: '', error: false, exists: [] };
  }
  let result: { ok?: unknown; paths?: unknown; exists?: unknown; message?: unknown };
  try {
    result = JSON.parse(text);
  } catch {
    return { message: `export failed: the kernel answered ${text}`, error: true, exists: [] };
  }
  const strings = (value: unknown): string[] =>
    Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
  const note = typeof result.message === 'string' ? result.message : '';
  if (result.ok === true) {
    const exported = `exported: ${strings(result.paths).join(', ')}`;
    return { message: note ? `${exported} (${note})` : exported, error: false, exists: [] };
  }
  const exists = strings(result.exists);
  // a refusal to overwrite is a question (the Overwrite button answers it), not a failure
  return { message: note || 'export failed', error: exists.length === 0, exists };
}

/**
 * Whether the Planner's status line is an error: the kernel words a failed solve `error: ...`
 * (memviz/views/widget.py), and the view's own parse failures `memviz: cannot ...`.
 */
export function isErrorStatus(status: string): boolean {
  return /^(error:|memviz: cannot )/.test(status);
}
