/**
 * The module hierarchy of a plan's CD-graph (Rockmate Sec. 3.1's computation/data graph) and the DOT
 * drawn for one state of it (graph.ts lays it out with Graphviz in a worker).
 *
 * Each phase (forward, backward, optimizer) is a tree of the model's module paths ("blocks.3.attn"): a
 * collapsed module is one node standing for every op under it, an expanded one a cluster holding its
 * sub-modules and its own ops.  A graph of any size thus starts as a few dozen nodes and is opened
 * where the user looks (issue 18 item 2: the flat drawing of a 12-layer GPT took 8-33 s to lay out and
 * "expand blocks" froze the tab).  Parameters, buffers and optimizer state are not drawn: each is read
 * by ops in all three phases, and their edges would tie the drawing into knots; an op's tooltip names
 * them and search finds them.
 *
 * Every name comes from the plan document, which is untrusted: `dotString` escapes it for a DOT quoted
 * string and for the SVG text Graphviz writes, and SVG ids are only `c<n>`, `d<n>`, `m<n>` and `r<n>`.
 * Pure (no DOM), so it runs under node's test runner.
 */
import { ComputeDoc, DataDoc, PlanDoc, formatBytes } from './transforms';

/** One module of one phase; `id` is its index in `ModuleTree.modules`. */
export interface ModuleNode {
  id: number;
  phase: string;
  /** the module path ("" for the phase's root) */
  path: string;
  parent: number | null;
  children: number[];
  /** ops whose module is exactly this one */
  computes: number[];
  /** ops in this module and below */
  total: number;
  /** of those, ops the plan runs more than once */
  recomputed: number;
  depth: number;
}

export type Fate = 'kept' | 'recomputed' | 'freed_early' | 'unused' | 'input' | 'gradient' | 'output';

export interface ModuleTree {
  modules: ModuleNode[];
  /** the phase roots, in phase order */
  roots: number[];
  /** compute id -> the module node holding it */
  moduleOf: number[];
  /** compute id -> times the planned schedule runs it */
  runs: number[];
  /** data id -> produced more than once by the plan */
  freedEarly: boolean[];
  /** compute id -> the module it is drawn in when it has none of its own (`placedModule`), else null */
  placedIn: (string | null)[];
  /** module path -> qualified class name (the plan's `graph.meta.module_classes`; empty in version 1) */
  classes: ReadonlyMap<string, string>;
}

/** What an SVG id drawn here stands for. */
export type NodeRef =
  | { kind: 'compute'; id: number }
  | { kind: 'data'; id: number }
  | { kind: 'module'; id: number }
  | { kind: 'run'; id: number };

/** Data kinds drawn as nodes of their own (the others appear in tooltips and search only). */
const DRAWN_KINDS = new Set(['activation', 'saved', 'gradient', 'parameter_gradient', 'output', 'input']);

const PHASES = ['forward', 'backward', 'optimizer'];

/**
 * Attributes of an edge from one phase to another (a saved activation read by the backward).  It does
 * not rank its ends (`constraint=false`): each phase stacks its own layers, and the edges' fan across
 * the drawing is hidden until one of its ends is pointed at (class `cross`, graph.ts).
 */
function crossEdge(a: string, b: string): string {
  return `style=dashed, color="#9e9e9e", constraint=false, class="cross from-${a} to-${b}"`;
}

/** The module tree of `doc`'s graph with each op's run count in the planned schedule. */
export function buildTree(doc: PlanDoc): ModuleTree {
  const computes = doc.graph.computes;
  const runs = new Array<number>(computes.length).fill(0);
  const made = new Array<number>(doc.graph.datas.length).fill(0);
  for (const [op, id] of doc.planned.schedule) {
    if (op === 'compute' && id >= 0 && id < computes.length) {
      runs[id]++;
      for (const o of computes[id].outputs ?? []) {
        made[o] = (made[o] ?? 0) + 1;
      }
    }
  }
  const modules: ModuleNode[] = [];
  const byKey = new Map<string, number>();
  const roots: number[] = [];
  const node = (phase: string, path: string, parent: number | null, depth: number): number => {
    const key = `${phase}\u0000${path}`;
    let id = byKey.get(key);
    if (id === undefined) {
      id = modules.length;
      modules.push({ id, phase, path, parent, children: [], computes: [], total: 0, recomputed: 0, depth });
      byKey.set(key, id);
      if (parent === null) {
        roots.push(id);
      } else {
        modules[parent].children.push(id);
      }
    }
    return id;
  };
  const phases = [...PHASES, ...new Set(computes.map(phaseOf).filter(p => !PHASES.includes(p)))];
  const present = new Set(computes.map(phaseOf));
  for (const p of phases.filter(p => present.has(p))) {
    node(p, '', null, 0);
  }
  const placedIn = placedModules(computes);
  const moduleOf = computes.map(c => {
    const phase = phaseOf(c);
    let at = node(phase, '', null, 0);
    const parts = (placedIn[c.id] ?? c.module ?? '').split('.').filter(s => s.length > 0);
    for (let i = 0; i < parts.length; i++) {
      at = node(phase, parts.slice(0, i + 1).join('.'), at, i + 1);
    }
    modules[at].computes.push(c.id);
    for (let m: number | null = at; m !== null; m = modules[m].parent) {
      modules[m].total++;
      modules[m].recomputed += runs[c.id] > 1 ? 1 : 0;
    }
    return at;
  });
  return {
    modules,
    roots,
    moduleOf,
    runs,
    freedEarly: made.map(n => n > 1),
    placedIn,
    classes: classesOf(doc)
  };
}

/** The plan's module classes (path -> qualified class name), strings only: a hand-edited file may hold
 * anything there, and a class name is text from user code. */
function classesOf(doc: PlanDoc): Map<string, string> {
  const raw = doc.graph.meta?.module_classes;
  const classes = new Map<string, string>();
  if (typeof raw === 'object' && raw !== null && !Array.isArray(raw)) {
    for (const [path, cls] of Object.entries(raw)) {
      if (typeof cls === 'string' && cls) {
        classes.set(path, cls);
      }
    }
  }
  return classes;
}

/**
 * The class of module `path` as a label shows it: the last segment of its qualified name
 * ("transformers.models.gpt2.modeling_gpt2.GPT2Block" -> "GPT2Block"; a class defined in a function,
 * "f.<locals>.Block", -> "Block"), or null where the plan names none (a version 1 file, a hand-built graph).
 */
export function shortClass(tree: ModuleTree, path: string): string | null {
  const cls = tree.classes.get(path);
  return cls ? cls.slice(cls.lastIndexOf('.') + 1) || cls : null;
}

/**
 * Where each op without a module of its own is drawn: inside the deepest module holding both the
 * nearest op before it and the nearest op after it in its phase (graph order), or null (left at the
 * phase's root).  Autograd's residual-gradient sums carry no module, yet run in the middle of one
 * block's backward: left at the root, each tied two blocks together, and dot laid every collapsed
 * backward block on one rank beside a column of sums (issue 18 item 2, the 12-layer drawing).
 */
export function placedModules(computes: readonly ComputeDoc[]): (string | null)[] {
  const out = new Array<string | null>(computes.length).fill(null);
  const own = (c: ComputeDoc): string => c.module ?? '';
  const nearest = (i: number, step: number): string => {
    for (let j = i + step; j >= 0 && j < computes.length; j += step) {
      if (phaseOf(computes[j]) !== phaseOf(computes[i])) {
        return '';
      }
      if (own(computes[j])) {
        return own(computes[j]);
      }
    }
    return '';
  };
  computes.forEach((c, i) => {
    if (own(c)) {
      return;
    }
    const [a, b] = [nearest(i, -1).split('.'), nearest(i, 1).split('.')];
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n] && a[n] !== '') {
      n++;
    }
    out[c.id] = n > 0 ? a.slice(0, n).join('.') : null;
  });
  return out;
}

function phaseOf(c: ComputeDoc): string {
  return typeof c.phase === 'string' && c.phase ? c.phase : 'forward';
}

/** The modules from a root down to `m` (inclusive). */
export function ancestors(tree: ModuleTree, m: number): number[] {
  const out: number[] = [];
  for (let at: number | null = m; at !== null; at = tree.modules[at].parent) {
    out.unshift(at);
  }
  return out;
}

/** The node standing for compute `c` under `expanded`: itself, or its outermost collapsed module. */
export function representative(tree: ModuleTree, expanded: ReadonlySet<number>, c: number): NodeRef {
  for (const m of ancestors(tree, tree.moduleOf[c])) {
    if (!expanded.has(m)) {
      return { kind: 'module', id: m };
    }
  }
  return { kind: 'compute', id: c };
}

/** Whether data node `d` is drawn under `expanded` (its producer drawn as an op of its own). */
export function dataDrawn(
  doc: PlanDoc,
  tree: ModuleTree,
  expanded: ReadonlySet<number>,
  d: DataDoc
): boolean {
  if (!DRAWN_KINDS.has(d.kind)) {
    return false;
  }
  if (d.producer === null || d.producer === undefined) {
    // an input is drawn beside the first op reading it, when that op is drawn
    const first = (d.consumers ?? [])[0];
    return first !== undefined && representative(tree, expanded, first).kind === 'compute';
  }
  return representative(tree, expanded, d.producer).kind === 'compute';
}

/** The nodes opening `m` adds to the drawing: its ops, their drawn tensors and its sub-modules, less itself. */
export function openCost(doc: PlanDoc, tree: ModuleTree, m: number): number {
  const mod = tree.modules[m];
  return mod.children.length - 1 + mod.computes.reduce((n, c) => n + placedNodes(doc, c), 0);
}

/** The nodes op `c` draws: itself and the tensors placed at it (as toDot places them: at their
 * producer, an input at its first reader). */
function placedNodes(doc: PlanDoc, c: number): number {
  const op = doc.graph.computes[c];
  let n = 1;
  n += (op.outputs ?? []).filter(o => drawnKind(doc, o) && doc.graph.datas[o].producer === c).length;
  n += (op.inputs ?? []).filter(i => {
    const d = doc.graph.datas[i];
    return drawnKind(doc, i) && (d.producer === null || d.producer === undefined) && d.consumers?.[0] === c;
  }).length;
  return n;
}

/**
 * The nodes opening `m` adds with its runs of repeated blocks closed (`childRuns`), as `toDot` draws
 * them: each run one node, the ops it absorbs (autograd's residual sums between a backward's blocks)
 * and their tensors inside it.  `openCost` counts every member and every sum: at 92 layers a GPT's
 * "blocks" of both phases cost 460 nodes by it, above `OPEN_NODES`, and stayed one closed box each,
 * though opened they draw one counted node each; that overview, without its runs, was laid out at
 * dot's default spacing, too tall to fit readable, and opened at 1:1 with its bottom cut (issue 18).
 */
export function runOpenCost(
  doc: PlanDoc,
  tree: ModuleTree,
  m: number,
  order: ReadonlyMap<string, number> = forwardOrder(doc, tree)
): number {
  let n = openCost(doc, tree, m);
  for (const members of childRuns(tree, m, order)) {
    n -= members.length - 1;
    n -= absorbedOps(doc, tree, m, members).reduce((k, c) => k + placedNodes(doc, c), 0);
  }
  return n;
}

/** How many nodes the drawing of `expanded` has (collapsed modules, ops, drawn tensors). */
export function visibleCount(doc: PlanDoc, tree: ModuleTree, expanded: ReadonlySet<number>): number {
  let n = tree.roots.length;
  const walk = (m: number): void => {
    if (expanded.has(m)) {
      n += openCost(doc, tree, m);
      tree.modules[m].children.forEach(walk);
    }
  };
  tree.roots.forEach(walk);
  return n;
}

function drawnKind(doc: PlanDoc, d: number): boolean {
  const data = doc.graph.datas[d];
  return data !== undefined && DRAWN_KINDS.has(data.kind);
}

/**
 * The expansion a graph opens with: the module hierarchy first, then its leaves' ops.
 *
 * Modules holding sub-modules (and the phases) open level by level (shallowest first, in graph order)
 * while the drawing stays within `limit` nodes; leaf modules (a layer's ops and their tensors) open
 * only when the whole hierarchy opened and every leaf fits too, so a toy opens fully and a real model shows its structure as
 * closed boxes.  Opening the leaves a level allowed put a 12-layer GPT's LayerNorm and dropout frames,
 * each op's tensors side by side, into a drawing 1.3x wider than a notebook at the smallest readable
 * scale, the phases' outer halves cut off (issue 18).
 *
 * Alike siblings (children of one module with as many ops, a model's repeated blocks) open together
 * or not at all: a drawing with blocks 0-4 open and 5-11 closed compares unlike things (the 12-layer
 * drawing did).  Siblings unlike each other open one by one, so a large one does not keep the small
 * ones beside it closed.  A module and its twins in the other phases (the same path: a block's forward
 * and its backward) open together too: at 100 layers the forward's blocks opened and the backward's
 * stayed one "2899 ops" box, lopsided.  A 5k-op model opens at its layers, a toy fully open.  Runs
 * of repeated blocks (`childRuns`) never open here: each is drawn as one counted node, and their
 * parent costs what it draws (`runOpenCost`), so 92 layers open as 12 do: one "92 x Block" per phase.
 */
export function defaultExpansion(doc: PlanDoc, tree: ModuleTree, limit: number): Set<number> {
  const expanded = new Set<number>();
  // repeated blocks stay closed: each run is one node (`blockRuns`), opened by a click
  const order = forwardOrder(doc, tree);
  const inRun = new Set(tree.modules.flatMap(m => childRuns(tree, m.id, order).flat()));
  let count = tree.roots.length;
  const leaves: number[] = [];
  // a run stays closed, so the hierarchy is not all open: the leaves beside it stay closed too (opened,
  // the 12-layer GPT's embeddings and head with their tensors made the drawing wider than the output
  // once its blocks were unrolled)
  let closedHierarchy = inRun.size > 0;
  // the phases open one by one (a phase's root may be many ops: the optimizer's step); below them each
  // level opens in step across the open phases: a module's twin sits at its depth, under its parent's
  let frontier: number[][] = tree.roots.map(r => [r]);
  while (frontier.length > 0) {
    const next: number[][] = [];
    for (const group of frontier) {
      const cost = group.reduce((n, m) => n + runOpenCost(doc, tree, m, order), 0);
      if (count + cost > limit) {
        closedHierarchy = true;
        continue; // stays closed; a smaller group further on may still open
      }
      count += cost;
      for (const m of group) {
        expanded.add(m);
        const children = tree.modules[m].children;
        leaves.push(...children.filter(c => tree.modules[c].children.length === 0 && !inRun.has(c)));
        next.push(
          ...alikeGroups(
            tree,
            children.filter(c => tree.modules[c].children.length > 0 && !inRun.has(c))
          )
        );
      }
    }
    frontier = mergeTwins(tree, next);
  }
  const leafCost = leaves.reduce((n, m) => n + openCost(doc, tree, m), 0);
  if (!closedHierarchy && count + leafCost <= limit) {
    leaves.forEach(m => expanded.add(m));
  }
  return expanded;
}

/**
 * `groups` (one level of every open phase) with the groups holding a module path in common merged into
 * the first of them, so that a module's twins in the other phases (its backward, its parameters'
 * optimizer step) open with it or stay closed with it.
 */
function mergeTwins(tree: ModuleTree, groups: number[][]): number[][] {
  const merged: number[][] = [];
  const byPath = new Map<string, number[]>();
  for (const group of groups) {
    const target = group.map(m => byPath.get(tree.modules[m].path)).find(g => g !== undefined);
    const into = target ?? [];
    if (!target) {
      merged.push(into);
    }
    into.push(...group);
    for (const m of group) {
      byPath.set(tree.modules[m].path, into);
    }
  }
  return merged;
}

/** `siblings` grouped by op count, each group in graph order, groups in order of their first member. */
function alikeGroups(tree: ModuleTree, siblings: readonly number[]): number[][] {
  const groups = new Map<number, number[]>();
  for (const m of siblings) {
    const total = tree.modules[m].total;
    groups.set(total, [...(groups.get(total) ?? []), m]);
  }
  return [...groups.values()];
}

/**
 * `m` and its closed twins in the other phases that are drawn (their parent open): what a click on
 * `m` opens, so a block's forward and backward open together, as `defaultExpansion` opens them.
 */
export function withTwins(tree: ModuleTree, expanded: ReadonlySet<number>, m: number): number[] {
  return [m, ...twinsOf(tree, m, o => !expanded.has(o.id) && (o.parent === null || expanded.has(o.parent)))];
}

/**
 * `m` and its open twins in the other phases (the same path): what a click on `m`'s frame closes, as
 * `withTwins` is what a click on it opens.  Closing the forward block alone left its backward open, an
 * open frame beside a closed box (issue 18).
 */
export function openTwins(tree: ModuleTree, expanded: ReadonlySet<number>, m: number): number[] {
  return [m, ...twinsOf(tree, m, o => expanded.has(o.id))];
}

/** `m`'s twins (the modules of its path in the other phases) that `keep` accepts. */
function twinsOf(tree: ModuleTree, m: number, keep: (o: ModuleTree['modules'][number]) => boolean): number[] {
  const path = tree.modules[m].path;
  return tree.modules.filter(o => o.id !== m && o.path === path && keep(o)).map(o => o.id);
}

/** The modules to open so that compute `c` is drawn as an op of its own. */
export function revealCompute(tree: ModuleTree, expanded: ReadonlySet<number>, c: number): Set<number> {
  return new Set([...expanded, ...ancestors(tree, tree.moduleOf[c])]);
}

/** Close `m` and everything under it. */
export function collapse(tree: ModuleTree, expanded: ReadonlySet<number>, m: number): Set<number> {
  const out = new Set(expanded);
  const walk = (at: number): void => {
    out.delete(at);
    tree.modules[at].children.forEach(walk);
  };
  walk(m);
  return out;
}

/** One search hit: the op to show and, for a tensor, the tensor. */
export interface SearchHit {
  compute: number;
  data: number | null;
  /** what matched, for the status line */
  text: string;
}

/**
 * Ops whose name, op or module path contains `query` (case-insensitive), then tensors by name (each
 * shown at its producer, or at its first reader for a parameter, input or optimizer state).
 */
export function search(doc: PlanDoc, query: string): SearchHit[] {
  const q = query.trim().toLowerCase();
  if (!q) {
    return [];
  }
  const hits: SearchHit[] = [];
  for (const c of doc.graph.computes) {
    if (`${c.name}\u0000${c.op}\u0000${c.module ?? ''}`.toLowerCase().includes(q)) {
      hits.push({ compute: c.id, data: null, text: c.name });
    }
  }
  for (const d of doc.graph.datas) {
    if (d.name.toLowerCase().includes(q)) {
      const at = d.producer ?? (d.consumers ?? [])[0];
      if (at !== undefined && at !== null) {
        hits.push({ compute: at, data: d.id, text: d.name });
      }
    }
  }
  return hits;
}

/** The fate color of a drawn op (memviz/plans/cdgraph.py FATES). */
export function computeFate(tree: ModuleTree, c: number): Fate {
  const n = tree.runs[c] ?? 0;
  return n === 0 ? 'unused' : n > 1 ? 'recomputed' : 'kept';
}

export function dataFate(doc: PlanDoc, tree: ModuleTree, d: DataDoc): Fate {
  if (d.kind === 'input') {
    return 'input';
  }
  if (d.kind === 'gradient' || d.kind === 'parameter_gradient') {
    return 'gradient';
  }
  if (d.producer !== null && d.producer !== undefined && (tree.runs[d.producer] ?? 0) === 0) {
    return 'unused';
  }
  if (tree.freedEarly[d.id]) {
    return 'freed_early';
  }
  return d.kind === 'output' ? 'output' : 'kept';
}

/** One legend row of the drawing. */
export interface LegendRow {
  fate: Fate | 'module';
  color: string;
  text: string;
}

/** Fill colors; the fates' match memviz/plans/cdgraph.py FATES. */
export const LEGEND: readonly LegendRow[] = [
  { fate: 'module', color: '#e3f2fd', text: 'module (click to open)' },
  { fate: 'kept', color: '#c6e2ff', text: 'computed once, kept until last use' },
  { fate: 'recomputed', color: '#ffb74d', text: 'computed more than once' },
  { fate: 'freed_early', color: '#ef9a9a', text: 'freed, later recomputed' },
  { fate: 'unused', color: '#eeeeee', text: 'not run by the plan' },
  { fate: 'input', color: '#fff59d', text: 'input' },
  { fate: 'gradient', color: '#d1c4e9', text: 'gradient' },
  { fate: 'output', color: '#ffffff', text: 'output' }
];

/** The fill of an open module's frame. */
const OPEN_FILL = '#f5f9fc';

const COLOR = Object.fromEntries(LEGEND.map(r => [r.fate, r.color])) as Record<LegendRow['fate'], string>;

/**
 * `text` as the inside of a DOT double-quoted string whose content Graphviz writes into SVG: `& < >`
 * become entities (Graphviz decodes entities in labels, so a name never opens a tag or an entity),
 * backslashes are doubled (`\N`, `\l` ... are DOT escapes), quotes escaped, line breaks DOT's `\n`.
 * The same rules as memviz/plans/cdgraph.py `dot_escape`.
 */
export function dotString(text: string): string {
  return String(text)
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/\\/g, '\\\\')
    .replace(/"/g, '\\"')
    .replace(/\r/g, '')
    .replace(/\n/g, '\\n');
}

/**
 * The short name of module path `path`: its last segment, with its container's for a numbered item
 * ("transformer.h.3" -> "h.3": "3" alone says nothing), the full path being in the tooltip.
 */
function shortPath(path: string): string {
  const parts = path.split('.');
  return parts.slice(numbered(path) && parts.length > 1 ? -2 : -1).join('.');
}

/**
 * The label of module `m`: its class first, then its short path ("GPT2Block h.3", "LayerNorm ln_1"), or
 * the last path segment alone where the plan names no class (the phase for a root).
 */
export function moduleLabel(tree: ModuleTree, m: number): string {
  const mod = tree.modules[m];
  if (mod.path === '') {
    return mod.phase;
  }
  const cls = shortClass(tree, mod.path);
  return cls ? `${cls} ${shortPath(mod.path)}` : mod.path.slice(mod.path.lastIndexOf('.') + 1);
}

/** The label of open module `m`'s frame: its class, then its full path ("GPT2Block transformer.h.3"). */
function frameLabel(tree: ModuleTree, m: number): string {
  const mod = tree.modules[m];
  const cls = mod.path === '' ? null : shortClass(tree, mod.path);
  return cls ? `${cls} ${mod.path}` : mod.path || mod.phase;
}

/** "1 op", "24 ops": a module holding one op (an Embedding, a LayerNorm) read "1 ops". */
export function opCount(n: number): string {
  return `${n} op${n === 1 ? '' : 's'}`;
}

/** The tooltip of a module: its full path, phase, class and what it holds. */
export function moduleTooltip(tree: ModuleTree, m: number): string {
  const mod = tree.modules[m];
  const where = mod.path === '' ? `${mod.phase} (ops outside any module)` : `${mod.path} [${mod.phase}]`;
  const cls = mod.path === '' ? undefined : tree.classes.get(mod.path);
  return `${where}\n${cls ? `class: ${cls}\n` : ''}${opCount(mod.total)}, ${mod.recomputed} recomputed`;
}

/** The tooltip of an op: name, ATen op, phase, run count, module, source line and what it reads. */
export function computeTooltip(doc: PlanDoc, tree: ModuleTree, c: number): string {
  const op = doc.graph.computes[c];
  const runs = tree.runs[c] ?? 0;
  const lines = [
    `${op.name}: ${op.op} [${phaseOf(op)}]${runs > 1 ? ` run ${runs} times` : runs ? '' : ' not run'}`
  ];
  if (op.module) {
    const cls = tree.classes.get(op.module);
    lines.push(`module: ${op.module}${cls ? ` (${cls})` : ''}`);
  } else if (tree.placedIn[c]) {
    lines.push(`module: none (drawn in ${tree.placedIn[c]}, where it runs)`);
  }
  if (op.source) {
    lines.push(op.source);
  }
  const reads = (op.inputs ?? []).map(i => doc.graph.datas[i]).filter(d => d !== undefined);
  if (reads.length) {
    lines.push(`reads: ${reads.map(d => d.name).join(', ')}`);
  }
  const writes = (op.outputs ?? []).map(i => doc.graph.datas[i]).filter(d => d !== undefined);
  if (writes.length) {
    lines.push(`writes: ${writes.map(d => `${d.name} (${formatBytes(d.bytes)})`).join(', ')}`);
  }
  return lines.join('\n');
}

/** The tooltip of a tensor: name, kind, size, shape and dtype. */
export function dataTooltip(doc: PlanDoc, d: number): string {
  const data = doc.graph.datas[d];
  const shape = Array.isArray(data.shape) ? ` [${data.shape.join(', ')}]` : '';
  return `${data.name}: ${data.kind} ${formatBytes(data.bytes)}${shape}${data.dtype ? ` ${data.dtype}` : ''}`;
}

/** The tooltip for an SVG id drawn by `toDot`, or null for an id it does not write. */
export function tooltipFor(
  doc: PlanDoc,
  tree: ModuleTree,
  ref: NodeRef,
  runs: readonly BlockRun[] = []
): string {
  if (ref.kind === 'run') {
    const run = runs.find(r => r.members[0] === ref.id);
    return run ? runTooltip(tree, run) : moduleTooltip(tree, ref.id);
  }
  return ref.kind === 'module'
    ? moduleTooltip(tree, ref.id)
    : ref.kind === 'compute'
      ? computeTooltip(doc, tree, ref.id)
      : dataTooltip(doc, ref.id);
}

/** Map an SVG id written by `toDot` ("c12", "d34", "m3", "r5") back to its node; null otherwise. */
export function parseNodeId(svgId: string | null | undefined): NodeRef | null {
  const m = /^([cdmr])(\d+)$/.exec(svgId ?? '');
  if (!m) {
    return null;
  }
  const kind = ({ c: 'compute', d: 'data', m: 'module', r: 'run' } as const)[m[1] as 'c' | 'd' | 'm' | 'r'];
  return { kind, id: Number(m[2]) };
}

/** The SVG id `toDot` gives `ref`'s node. */
export function refId(ref: NodeRef): string {
  return `${ref.kind[0]}${ref.id}`;
}

/**
 * The collapsed overview's spacing (a drawing holding a run of repeated blocks): ranks closer (inches;
 * 0.2 elsewhere) and two-line labels (a closed module's name and op count, a tensor's name and size)
 * in tighter boxes (dot's node `margin`, inches), the text itself unchanged.  At the default spacing the
 * captured 12-layer GPT's overview (its top-level ops and their tensors in one column, the backward's
 * residual sums beside it) was 820 pt tall, whole at scale 0.55 in the 600 px view, under
 * `FIT_MIN_SCALE`: it opened on its top half, the blocks below the fold (issue 18); it is 683 pt now,
 * whole at 0.64.  Unrolled drawings keep dot's defaults: their Fit and landing were tuned at them.
 */
export const COMPACT_SPACING = { ranksep: 0.1, margin: '0.11,0.02' };

/**
 * DOT for `expanded`: expanded modules as clusters (id `m<n>`), collapsed ones as box3d nodes, ops as
 * rounded boxes (`c<n>`), drawn tensors as ellipses (`d<n>`); edges producer -> tensor -> reader, or
 * straight between the nodes standing for producer and reader when the tensor is not drawn.  Dot's
 * crossing minimisation and network simplex are capped (`mclimit`, `nslimit`): a slightly worse
 * drawing, laid out in a bounded time.
 */
export function toDot(
  doc: PlanDoc,
  tree: ModuleTree,
  expanded: ReadonlySet<number>,
  unrolled: ReadonlySet<string> = new Set()
): string {
  const runs = blockRuns(doc, tree, expanded, unrolled);
  const runOf = new Map<string, number>(); // "m<member>" / "c<absorbed op>" -> the run's first member
  for (const run of runs) {
    run.members.forEach(m => runOf.set(`m${m}`, run.members[0]));
    run.absorbed.forEach(c => runOf.set(`c${c}`, run.members[0]));
  }
  const drawnAs = (ref: NodeRef): string => {
    const head = runOf.get(refId(ref));
    return head === undefined ? refId(ref) : `r${head}`;
  };
  const compact = runs.length > 0;
  const lines = [
    'digraph memviz {',
    `  graph [rankdir=TB, newrank=true, nodesep=0.15, ranksep=${compact ? COMPACT_SPACING.ranksep : 0.2}, splines=line, mclimit=0.05, remincross=false, nslimit=1, nslimit1=1,`,
    '         fontname="Helvetica", fontsize=11, labeljust=l, style="rounded", color="#90a4ae"];',
    `  node [fontname="Helvetica", fontsize=10, height=0.3${compact ? `, margin="${COMPACT_SPACING.margin}"` : ''}, style=filled];`,
    '  edge [color="#888888", arrowsize=0.6];'
  ];
  const drawnData = new Set<number>();
  for (const d of doc.graph.datas) {
    // a tensor placed at an op inside a run is the run's
    const at = d.producer ?? (d.consumers ?? [])[0];
    if (dataDrawn(doc, tree, expanded, d) && !(at !== undefined && runOf.has(`c${at}`))) {
      drawnData.add(d.id);
    }
  }
  const inputsAt = new Map<number, number[]>();
  for (const d of drawnData) {
    const data = doc.graph.datas[d];
    const at = data.producer ?? (data.consumers ?? [])[0];
    if (at !== undefined && at !== null) {
      inputsAt.set(at, [...(inputsAt.get(at) ?? []), d]);
    }
  }
  const emit = (m: number, indent: string): void => {
    const mod = tree.modules[m];
    const run = runs.find(r => r.members[0] === m);
    if (run) {
      const fill = run.members.some(x => tree.modules[x].recomputed > 0) ? COLOR.recomputed : COLOR.module;
      lines.push(
        `${indent}"r${m}" [id="r${m}", class="module run", shape=box3d, peripheries=2, fillcolor="${fill}", ` +
          `label="${dotString(runLabel(tree, run))}"];`
      );
      return;
    }
    if (runOf.has(`m${m}`)) {
      return; // drawn by its run's node
    }
    if (!expanded.has(m)) {
      const fill = mod.recomputed > 0 ? COLOR.recomputed : COLOR.module;
      const label = `${moduleLabel(tree, m)}\n${opCount(mod.total)}${mod.recomputed ? `, ${mod.recomputed} recomputed` : ''}`;
      lines.push(
        `${indent}"m${m}" [id="m${m}", class="module", shape=box3d, fillcolor="${fill}", label="${dotString(label)}"];`
      );
      return;
    }
    lines.push(`${indent}subgraph "cluster_m${m}" {`);
    // a module's frame is filled so a click anywhere on it (not on a node) closes it; a phase's frame is
    // not, or a click on the background would close the whole phase (its label still does)
    const fill = mod.parent === null ? 'style="rounded"' : `style="rounded,filled"; fillcolor="${OPEN_FILL}"`;
    lines.push(
      `${indent}  id="m${m}"; class="module-open"; ${fill}; label="${dotString(frameLabel(tree, m))}";`
    );
    for (const c of mod.computes.filter(c => !runOf.has(`c${c}`))) {
      const op = doc.graph.computes[c];
      const fate = computeFate(tree, c);
      const runs = tree.runs[c] > 1 ? ` (x${tree.runs[c]})` : '';
      lines.push(
        `${indent}  "c${c}" [id="c${c}", class="${fate}", shape=box, style="filled,rounded", ` +
          `fillcolor="${COLOR[fate]}", label="${dotString(op.name + runs)}"];`
      );
      for (const d of inputsAt.get(c) ?? []) {
        const data = doc.graph.datas[d];
        const fate = dataFate(doc, tree, data);
        lines.push(
          `${indent}  "d${d}" [id="d${d}", class="${fate}", shape=ellipse, fillcolor="${COLOR[fate]}", ` +
            `label="${dotString(`${data.name}\n${formatBytes(data.bytes)}`)}"];`
        );
      }
    }
    for (const child of mod.children) {
      emit(child, indent + '  ');
    }
    lines.push(`${indent}}`);
  };
  const firstNode = new Map<number, string>();
  for (const r of tree.roots) {
    const from = lines.length;
    emit(r, '  ');
    const first = lines
      .slice(from)
      .map(line => /^\s*"([cdmr]\d+)" \[id=/.exec(line)?.[1])
      .find(id => id !== undefined);
    if (first) {
      firstNode.set(r, first);
    }
  }
  const seen = new Set<string>();
  // The backward runs the forward's layers in reverse: its edges are laid out reversed (drawn with
  // the arrow still at the reader), so each layer's backward ranks beside its forward and a saved
  // activation is a short rung of a ladder, not an edge across the whole drawing (which made dot
  // route thousands of virtual nodes: minutes at 1k nodes).
  const edge = (a: string, b: string, from: string, to: string): void => {
    const key = `${a}>${b}`;
    if (a === b || seen.has(key)) {
      return;
    }
    seen.add(key);
    if (from === 'backward' && to === 'backward') {
      lines.push(`  "${b}" -> "${a}" [dir=back];`);
    } else {
      lines.push(from !== to ? `  "${a}" -> "${b}" [${crossEdge(a, b)}];` : `  "${a}" -> "${b}";`);
    }
  };
  for (const op of doc.graph.computes) {
    const target = drawnAs(representative(tree, expanded, op.id));
    const phase = phaseOf(op);
    for (const i of op.inputs ?? []) {
      const producer = doc.graph.datas[i]?.producer;
      if (producer === null || producer === undefined) {
        if (drawnData.has(i)) {
          edge(`d${i}`, target, 'forward', phase);
        }
        continue;
      }
      const from = phaseOf(doc.graph.computes[producer]);
      edge(
        drawnData.has(i) ? `d${i}` : drawnAs(representative(tree, expanded, producer)),
        target,
        from,
        phase
      );
    }
    for (const o of op.outputs ?? []) {
      if (drawnData.has(o) && doc.graph.datas[o].producer === op.id) {
        edge(target, `d${o}`, phase, phase);
      }
    }
  }
  lines.push(...phaseOrder(tree, firstNode));
  const rows = closedRows(doc, tree, expanded, runs);
  const name = (m: number): string => (runs.some(r => r.members[0] === m) ? `"r${m}"` : `"m${m}"`);
  lines.push(...siblingChain(tree, rows, name));
  lines.push(...twinRanks(tree, rows, name));
  lines.push('}');
  return lines.join('\n');
}

/**
 * A closed module and its closed twins in the other phases (the same path: a block's forward and its
 * backward) on one rank, so block i's backward sits beside block i's forward: a ladder whose rungs are
 * the activations the backward reads, and a block opened with its twin opens beside it.  Without
 * this the backward's residual-gradient sums (an op and a tensor between each two blocks) made its
 * column three times as tall as the forward's, and a block's twin landed 700 px below it, off-screen
 * (issue 18, 12 layers).  Needs `newrank`: ranks across clusters.  A wrapped row (`closedRows`) ranks
 * with its twin rows the same way: blocks 0-5 of the forward and of the backward on one rank.

 */
function twinRanks(tree: ModuleTree, rows: readonly number[][], name: (m: number) => string): string[] {
  const byPath = new Map<string, number[][]>();
  for (const row of rows) {
    const head = tree.modules[row[0]];
    // the optimizer's modules are no twins: its step reads each parameter once, in no layer order
    const key = head.phase === 'optimizer' ? `optimizer\u0000${head.path}` : head.path;
    byPath.set(key, [...(byPath.get(key) ?? []), row]);
  }
  const phaseIndex = (row: readonly number[]): number => {
    const i = PHASES.indexOf(tree.modules[row[0]].phase);
    return i < 0 ? PHASES.length : i;
  };
  return [...byPath.values()]
    .filter(group => group.length > 1 || group[0].length > 1)
    .flatMap(group => {
      const names = [...group]
        .sort((a, b) => phaseIndex(a) - phaseIndex(b))
        .flat()
        .map(name);
      return [`  { rank=same; ${names.join('; ')}; }`];
    });
}

/** The first op of each module path in the forward phase: the order siblings stack in every phase. */
function forwardOrder(doc: PlanDoc, tree: ModuleTree): Map<string, number> {
  const order = new Map<string, number>();
  for (const c of doc.graph.computes) {
    const mod = tree.modules[tree.moduleOf[c.id]];
    if (mod.phase !== 'forward') {
      continue;
    }
    const parts = mod.path.split('.');
    for (let i = 1; i <= parts.length; i++) {
      const path = parts.slice(0, i).join('.');
      if (!order.has(path)) {
        order.set(path, c.id);
      }
    }
  }
  return order;
}

/**
 * The phases left to right in phase order: an invisible point with an edge to a node of each phase, whose
 * out-edges dot keeps in the order given (`ordering=out`).  At 5.4k ops dot sometimes drew the backward
 * column left of the forward, with nothing in the drawing to say so; invisible flat edges between the
 * phases' twins did not stop it (dot orders clusters as wholes).
 */
function phaseOrder(tree: ModuleTree, firstNode: ReadonlyMap<number, string>): string[] {
  const anchors = tree.roots.map(r => firstNode.get(r)).filter((a): a is string => a !== undefined);
  if (anchors.length < 2) {
    return [];
  }
  return [
    '  "phase-order" [shape=point, style=invis, width=0, height=0, ordering=out];',
    ...anchors.map(a => `  "phase-order" -> "${a}" [style=invis];`)
  ];
}

/**
 * Consecutive closed siblings alike (as many ops each: a model's repeated blocks) beyond this many wrap
 * into rows of about this many, read left to right, top to bottom: a 12-layer GPT's 12 blocks of both
 * phases stacked were 1760 px tall, three times the Graph view's height at the smallest readable scale.
 */
export const WRAP_COLUMNS = 6;

/**
 * Runs up to this many wrap (four rows): a longer run needs panning wrapped or not, and its rows were
 * too wide for both phases at a readable scale in a narrow output (110 layers: the frames were cut at
 * both sides), where a column pans down.
 */
export const WRAP_MAX = 4 * WRAP_COLUMNS;

/**
 * The closed children of each open module in the forward's order (block 0 above block 1 in the
 * backward too, beside its forward twin), in rows: a run of more than `WRAP_COLUMNS` (and at most
 * `WRAP_MAX`) alike siblings split into balanced rows (12 blocks: two rows of 6), every other child a
 * row of its own.
 */
export function closedRows(
  doc: PlanDoc,
  tree: ModuleTree,
  expanded: ReadonlySet<number>,
  runs: readonly BlockRun[] = []
): number[][] {
  const order = forwardOrder(doc, tree);
  // a run of repeated blocks is one node: its first member stands for it, the others are not drawn
  const hidden = new Set(runs.flatMap(r => r.members.slice(1)));
  // Modules holding ops of their own in some phase (a captured GPT's backward "blocks": autograd's
  // residual sums between the blocks): their children never wrap in any phase, as the ops and tensors
  // between two rows made the captured 12-layer GPT's first view wider than the output, cut at both
  // sides; a column keeps each block beside its twin.
  const ownOps = new Set(tree.modules.filter(m => m.computes.length > 0).map(m => m.path));
  const rows: number[][] = [];
  for (const m of expanded) {
    const mod = tree.modules[m];
    const closed = inForwardOrder(
      tree,
      order,
      m,
      mod.children.filter(ch => !expanded.has(ch) && !hidden.has(ch))
    );
    for (let i = 0; i < closed.length;) {
      let j = i + 1;
      while (j < closed.length && tree.modules[closed[j]].total === tree.modules[closed[i]].total) {
        j++;
      }
      const run = closed.slice(i, j);
      const wrap = run.length > WRAP_COLUMNS && run.length <= WRAP_MAX && !ownOps.has(mod.path);
      const cols = wrap ? Math.ceil(run.length / Math.ceil(run.length / WRAP_COLUMNS)) : 1;
      for (let r = 0; r < run.length; r += cols) {
        rows.push(run.slice(r, r + cols));
      }
      i = j;
    }
  }
  return rows;
}

/**
 * Invisible edges laying each open module's closed children out in `rows` (consecutive within one
 * module): a row left to right, its first member below the previous row's first.  Without them dot put
 * siblings joined only through their parent's ops on one rank, a row across the page.
 */
function siblingChain(tree: ModuleTree, rows: readonly number[][], name: (m: number) => string): string[] {
  const out: string[] = [];
  rows.forEach((row, r) => {
    for (let i = 1; i < row.length; i++) {
      out.push(`  ${name(row[i - 1])} -> ${name(row[i])} [style=invis];`);
    }
    const above = rows[r - 1];
    if (above && tree.modules[above[0]].parent === tree.modules[row[0]].parent) {
      out.push(`  ${name(above[0])} -> ${name(row[0])} [style=invis, weight=10];`);
    }
  });
  return out;
}

/** `children` of module `m` in the forward's order (`forwardOrder`). */
function inForwardOrder(
  tree: ModuleTree,
  order: ReadonlyMap<string, number>,
  m: number,
  children: readonly number[]
): number[] {
  const first = (ch: number): number => {
    const at = order.get(tree.modules[ch].path);
    // modules the forward lacks keep their own order (reversed in the backward, which runs it so)
    const own = Math.min(...tree.modules[ch].computes, Infinity);
    return at ?? (tree.modules[m].phase === 'backward' ? -own : own);
  };
  return [...children].sort((a, b) => first(a) - first(b));
}

/**
 * Repeated blocks this many or more in a row are drawn as one counted node ("12 x h"), opened by a
 * click: a captured 12-layer GPT's blocks, one box each, were a column taller than the view (its
 * backward's residual sums between the blocks keep them from wrapping into rows, `closedRows`), and
 * twelve alike boxes say less than "12 x" (Rockmate Sec. 4 solves such identical blocks once, too).
 */
export const RUN_MIN = 3;

/** A run of repeated blocks drawn as one node, id `r<its first member>`. */
export interface BlockRun {
  /** the closed sibling modules it stands for, in the forward's order */
  members: number[];
  /** the parent's ops without a module of their own that run between two members (autograd's
   * residual-gradient sums between a backward's blocks): drawn inside the run, not between its rows */
  absorbed: number[];
  /** what a click unrolls: the whole run's first path, the same in every phase (its twins unroll too) */
  key: string;
}

/** The structure two repeated blocks share: their op count and, child by child, name and op count. */
function shape(tree: ModuleTree, m: number): string {
  const mod = tree.modules[m];
  const leaf = (p: string): string => p.slice(p.lastIndexOf('.') + 1);
  return `${mod.total}:${mod.children.map(c => `${leaf(tree.modules[c].path)}=${tree.modules[c].total}`).join(',')}`;
}

/** A module path whose last part is an index (`h.3`, `layers.11`, `0`): a ModuleList's or Sequential's item. */
function numbered(path: string): boolean {
  return /(^|\.)\d+$/.test(path);
}

/**
 * The runs of `RUN_MIN` or more consecutive children of module `m` (forward's order) that are numbered
 * items of one container with the same `shape`: a model's repeated blocks.
 */
export function childRuns(tree: ModuleTree, m: number, order: ReadonlyMap<string, number>): number[][] {
  const kids = inForwardOrder(tree, order, m, tree.modules[m].children);
  const runs: number[][] = [];
  for (let i = 0; i < kids.length;) {
    let j = i + 1;
    const key = shape(tree, kids[i]);
    if (numbered(tree.modules[kids[i]].path)) {
      while (j < kids.length && numbered(tree.modules[kids[j]].path) && shape(tree, kids[j]) === key) {
        j++;
      }
    }
    if (j - i >= RUN_MIN) {
      runs.push(kids.slice(i, j));
    }
    i = j;
  }
  return runs;
}

/**
 * The runs drawn as one node under `expanded`: in each open module, each `childRuns` run not in
 * `unrolled` (by `BlockRun.key`); a member opened (a search hit inside it) splits its run, and the
 * closed stretches either side of it stay runs when long enough.
 */
export function blockRuns(
  doc: PlanDoc,
  tree: ModuleTree,
  expanded: ReadonlySet<number>,
  unrolled: ReadonlySet<string>
): BlockRun[] {
  const order = forwardOrder(doc, tree);
  const out: BlockRun[] = [];
  for (const m of expanded) {
    for (const run of childRuns(tree, m, order)) {
      const key = tree.modules[run[0]].path;
      if (unrolled.has(key)) {
        continue;
      }
      let part: number[] = [];
      for (const member of [...run, -1]) {
        if (member >= 0 && !expanded.has(member)) {
          part.push(member);
          continue;
        }
        if (part.length >= RUN_MIN) {
          out.push({ members: part, absorbed: absorbedOps(doc, tree, m, part), key });
        }
        part = [];
      }
    }
  }
  return out;
}

/** The ops of module `m` without a module of their own whose nearest ops either side run inside `members`. */
function absorbedOps(doc: PlanDoc, tree: ModuleTree, m: number, members: readonly number[]): number[] {
  const computes = doc.graph.computes;
  const paths = members.map(x => tree.modules[x].path);
  const inside = (path: string): boolean => paths.some(p => path === p || path.startsWith(`${p}.`));
  const nearest = (i: number, step: number): string => {
    for (let j = i + step; j >= 0 && j < computes.length; j += step) {
      if (phaseOf(computes[j]) !== phaseOf(computes[i])) {
        return '';
      }
      if (computes[j].module) {
        return computes[j].module as string;
      }
    }
    return '';
  };
  return tree.modules[m].computes.filter(
    c => !computes[c].module && inside(nearest(c, -1)) && inside(nearest(c, 1))
  );
}

/**
 * The label of a run: "12 x GPT2Block  h.0..11" (the members' class, their container's last segment and
 * first and last index; the full paths are in the tooltip), or "12 x h [0..11]" where the plan names no
 * class or the members' classes differ; then the ops each and recomputed.
 */
export function runLabel(tree: ModuleTree, run: BlockRun): string {
  const [first, last] = [tree.modules[run.members[0]], tree.modules[run.members[run.members.length - 1]]];
  const container = first.path.includes('.') ? first.path.slice(0, first.path.lastIndexOf('.')) : first.phase;
  const index = (p: string): string => p.slice(p.lastIndexOf('.') + 1);
  const name = container.slice(container.lastIndexOf('.') + 1);
  const recomputed = run.members.reduce((n, m) => n + tree.modules[m].recomputed, 0);
  const cls = runClass(tree, run);
  const head = cls
    ? `${run.members.length} x ${cls}  ${name}.${index(first.path)}..${index(last.path)}`
    : `${run.members.length} x ${name} [${index(first.path)}..${index(last.path)}]`;
  return `${head}\n${opCount(first.total)} each${recomputed ? `, ${recomputed} recomputed` : ''}`;
}

/** The qualified class every member of `run` has, or null where one has none or they differ. */
function runClass(tree: ModuleTree, run: BlockRun, short = true): string | null {
  const classes = new Set(run.members.map(m => tree.classes.get(tree.modules[m].path)));
  const [cls] = classes;
  if (classes.size !== 1 || !cls) {
    return null;
  }
  return short ? shortClass(tree, tree.modules[run.members[0]].path) : cls;
}

/** The tooltip of a run: its first and last path, phase, what each member holds, how to open it. */
export function runTooltip(tree: ModuleTree, run: BlockRun): string {
  const [first, last] = [tree.modules[run.members[0]], tree.modules[run.members[run.members.length - 1]]];
  const recomputed = run.members.reduce((n, m) => n + tree.modules[m].recomputed, 0);
  const between = run.absorbed.length ? `, ${opCount(run.absorbed.length)} between them` : '';
  const cls = runClass(tree, run, false);
  return (
    `${first.path} .. ${last.path} [${first.phase}]\n` +
    (cls ? `class: ${cls}\n` : '') +
    `${run.members.length} alike blocks of ${opCount(first.total)} each${between}, ${recomputed} recomputed\n` +
    'click to draw them one by one'
  );
}
