/**
 * The Graph view: the plan's computation/data graph (Rockmate Sec. 3.1) by module, colored by each
 * node's fate in the planned schedule (issue 18 item 2).
 *
 * - Modules start collapsed beyond what draws in a glance (`OPEN_NODES`); a click on a module opens it,
 *   a click on an open module's frame closes it (graph_tree.ts).  Repeated blocks start as one counted
 *   node ("12 x h"); a click draws them one by one (`blockRuns`).
 * - Graphviz lays the drawing out in a Web Worker (graph_layout.ts): the page never waits on dot.  A
 *   drawing above `MAX_NODES` is refused before layout, and one that takes over `LAYOUT_TIMEOUT_MS` is
 *   abandoned, leaving the last drawing on screen.
 * - Fit to view, zoom buttons, wheel zoom, drag to pan; search by op, module or tensor name opens the
 *   modules around the hit and centers it; tooltips (SVG titles) give real names, never ids.
 *
 * The DOT is built here from the plan document's graph, which is untrusted (a notebook output, a report
 * someone sent): graph_tree.ts escapes every name, and the only markup inserted into the page is the
 * SVG Graphviz writes, cut down to an allow-list of elements and attributes (svg_sanitize.ts); titles
 * are set as text.
 */
import { FIT_MIN_SCALE, MIN_LABEL_PX, Rect, fitReadable, focusView, zoomAt, View } from './graph_data';
import { LayoutClient, LayoutError } from './graph_layout';
import {
  BlockRun,
  LEGEND,
  ancestors,
  blockRuns,
  ModuleTree,
  NodeRef,
  SearchHit,
  buildTree,
  collapse,
  defaultExpansion,
  openTwins,
  openCost,
  parseNodeId,
  refId,
  revealCompute,
  search,
  toDot,
  tooltipFor,
  visibleCount,
  withTwins
} from './graph_tree';
import { allowedElement, sanitizeSvg } from './svg_sanitize';
import { PlanDoc } from './transforms';
import { PlanView, registerPlanView } from './views';

/** Nodes a graph opens with at most (modules opened level by level up to it). */
export const OPEN_NODES = 150;
/** Nodes above which a drawing is refused before layout (dot grows faster than linearly). */
export const MAX_NODES = 1500;
/** A layout running longer is abandoned (the worker is terminated). */
export const LAYOUT_TIMEOUT_MS = 60000;

/** Graph tab: module tree, search, fit and zoom, layout in a worker. */
export class GraphView implements PlanView {
  readonly node: HTMLElement;
  private readonly status: HTMLSpanElement;
  private readonly searchBox: HTMLInputElement;
  private readonly searchStatus: HTMLSpanElement;
  /** what Fit did when it could not show the whole drawing legibly, or where a landing left some out */
  private readonly fitNote: HTMLSpanElement;
  private readonly canvas: HTMLDivElement;
  private readonly stage: HTMLDivElement;
  private readonly layouts = new LayoutClient();
  private doc: PlanDoc | null = null;
  private tree: ModuleTree | null = null;
  /** the expansion on screen (or being laid out) */
  private expanded = new Set<number>();
  /** the expansion last drawn, restored when a layout is refused or abandoned */
  private drawn = new Set<number>();
  /** runs of repeated blocks drawn one by one (`BlockRun.key`); the others are one node each */
  private unrolled = new Set<string>();
  /** the runs on screen, for their tooltips */
  private runs: BlockRun[] = [];
  private hits: SearchHit[] = [];
  private hitIndex = -1;
  /**
   * what the next drawing is centered on: an opened module with its twins, a search hit; empty: the
   * forward and backward phases side by side
   */
  private focus: NodeRef[] = [];
  /** what the next drawing must show whole besides `focus` (the first block of a run just unrolled) */
  private reveal: NodeRef | null = null;
  /** the search hit outlined in the drawing */
  private highlight: NodeRef | null = null;
  private view: View = { x: 0, y: 0, k: 1 };
  private size = { w: 0, h: 0 };
  private drag: { x: number; y: number; moved: boolean } | null = null;
  private generation = 0;
  /** the node whose phase-crossing edges are lit */
  private lit: string | null = null;

  constructor(private readonly onSelectCompute: (computeId: number) => void) {
    this.node = document.createElement('div');
    this.node.className = 'jp-memviz-graph';
    const toolbar = document.createElement('div');
    toolbar.className = 'jp-memviz-graph-toolbar';
    this.searchBox = document.createElement('input');
    this.searchBox.type = 'search';
    this.searchBox.className = 'jp-memviz-graph-search';
    this.searchBox.placeholder = 'find op, module or tensor';
    this.searchBox.setAttribute('aria-label', 'find an op, module or tensor by name');
    this.searchBox.addEventListener('keydown', e => {
      if (e.key === 'Enter') {
        e.preventDefault();
        this.find(e.shiftKey ? -1 : 1);
      }
      e.stopPropagation(); // JupyterLab's notebook shortcuts must not see the typing
    });
    this.searchStatus = document.createElement('span');
    this.searchStatus.className = 'jp-memviz-graph-search-status';
    const button = (cls: string, text: string, title: string, run: () => void): HTMLButtonElement => {
      const b = document.createElement('button');
      b.className = `jp-memviz-graph-${cls}`;
      b.textContent = text;
      b.title = title;
      b.addEventListener('click', run);
      return b;
    };
    const canvasCenter = (): [number, number] => [this.canvas.clientWidth / 2, this.canvas.clientHeight / 2];
    toolbar.append(
      this.searchBox,
      this.searchStatus,
      button(
        'fit',
        'Fit',
        `fit the drawing to the view, labels at least ${MIN_LABEL_PX} px high (a larger drawing: the most of it that stays so, then pan)`,
        () => this.fit()
      ),
      button('zoom-in', '+', 'zoom in', () => this.zoom(1.5, ...canvasCenter())),
      button('zoom-out', '\u2212', 'zoom out', () => this.zoom(1 / 1.5, ...canvasCenter())),
      button('collapse', 'Collapse all', 'close every module', () => this.collapseAll()),
      this.crossToggle()
    );
    this.status = document.createElement('span');
    this.status.className = 'jp-memviz-graph-status';
    this.status.setAttribute('role', 'status');
    const info = document.createElement('div');
    info.className = 'jp-memviz-graph-info';
    this.fitNote = document.createElement('span');
    this.fitNote.className = 'jp-memviz-graph-fit-note';
    info.append(this.status, this.fitNote, this.legend());
    this.canvas = document.createElement('div');
    this.canvas.className = 'jp-memviz-graph-canvas';
    this.canvas.style.overflow = 'hidden';
    this.canvas.style.position = 'relative';
    this.canvas.style.height = '600px';
    this.canvas.style.cursor = 'grab';
    this.stage = document.createElement('div');
    this.stage.className = 'jp-memviz-graph-stage';
    this.stage.style.transformOrigin = '0 0';
    this.canvas.append(this.stage);
    this.node.append(toolbar, info, this.canvas);
    this.canvas.addEventListener('wheel', this.onWheel, { passive: false });
    this.canvas.addEventListener('pointerdown', this.onPointerDown);
    this.canvas.addEventListener('pointermove', this.onPointerMove);
    this.canvas.addEventListener('pointerup', this.onPointerUp);
    this.canvas.addEventListener('pointerover', this.onPointerOver);
  }

  update(doc: PlanDoc): Promise<void> {
    this.doc = doc;
    this.tree = buildTree(doc);
    this.expanded = defaultExpansion(doc, this.tree, OPEN_NODES);
    this.unrolled = new Set();
    this.drawn = new Set();
    this.hits = [];
    this.hitIndex = -1;
    this.focus = [];
    this.searchStatus.textContent = '';
    return this.render();
  }

  dispose(): void {
    this.generation++;
    this.layouts.dispose();
    this.canvas.removeEventListener('wheel', this.onWheel);
    this.node.remove();
  }

  /** "saved-activation edges": show every edge between phases (else only those of the node pointed at). */
  private crossToggle(): HTMLElement {
    const label = document.createElement('label');
    label.className = 'jp-memviz-graph-cross';
    label.title =
      'edges from one phase to another (activations the backward reads) are shown for the node under the pointer; tick to show them all';
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.addEventListener('change', () =>
      this.stage.classList.toggle('jp-memviz-graph-cross-shown', box.checked)
    );
    label.append(box, document.createTextNode(' all phase-crossing edges'));
    return label;
  }

  /** Light the phase-crossing edges touching the node under the pointer (hidden otherwise). */
  private readonly onPointerOver = (e: PointerEvent): void => {
    const id = (e.target as Element | null)?.closest?.('g.node')?.getAttribute('id') ?? null;
    if (id === this.lit) {
      return;
    }
    for (const el of Array.from(this.stage.querySelectorAll('g.edge.jp-memviz-graph-lit'))) {
      el.classList.remove('jp-memviz-graph-lit');
    }
    this.lit = id;
    if (id && parseNodeId(id)) {
      // ids are only c<n>, d<n>, m<n> (parseNodeId), so they are safe in a selector
      for (const el of Array.from(
        this.stage.querySelectorAll(`g.edge.cross.from-${id}, g.edge.cross.to-${id}`)
      )) {
        el.classList.add('jp-memviz-graph-lit');
      }
    }
  };

  private legend(): HTMLElement {
    const box = document.createElement('span');
    box.className = 'jp-memviz-graph-legend';
    for (const row of LEGEND) {
      const item = document.createElement('span');
      item.style.marginLeft = '8px';
      const swatch = document.createElement('span');
      swatch.style.cssText =
        'display:inline-block;width:10px;height:10px;border:1px solid #888;margin-right:3px';
      swatch.style.background = row.color;
      item.append(swatch, document.createTextNode(row.text));
      box.append(item);
    }
    return box;
  }

  /** Draw `this.expanded`; on refusal or failure go back to the last drawing's expansion. */
  private async render(): Promise<void> {
    const generation = ++this.generation;
    const { doc, tree } = this;
    if (!doc || !tree) {
      return;
    }
    const nodes = visibleCount(doc, tree, this.expanded);
    if (nodes > MAX_NODES) {
      this.status.textContent =
        `Not drawn: ${nodes} nodes is above the ${MAX_NODES}-node layout cap. ` +
        'Close a module (click its frame) or open a smaller one.';
      this.expanded = new Set(this.drawn);
      return;
    }
    const ops = doc.graph.computes.length;
    this.status.textContent = `Laying out ${nodes} nodes (${ops} ops)\u2026`;
    this.node.dataset.layout = 'running';
    let svg: string;
    try {
      svg = await this.layouts.layout(toDot(doc, tree, this.expanded, this.unrolled), LAYOUT_TIMEOUT_MS);
    } catch (err) {
      if (generation !== this.generation) {
        return; // a newer request cancelled this one
      }
      delete this.node.dataset.layout;
      const why =
        err instanceof LayoutError && err.reason === 'timeout' ? `${err.message}: ` : `${String(err)}: `;
      this.status.textContent = `${why}the previous drawing is kept. Open fewer modules.`;
      this.expanded = new Set(this.drawn);
      return;
    }
    if (generation !== this.generation) {
      return;
    }
    delete this.node.dataset.layout;
    // Parsed as SVG, not as HTML; only Graphviz's own drawing survives `sanitizeSvg`.
    const parsed = new DOMParser().parseFromString(svg, 'image/svg+xml').documentElement;
    if (parsed.localName !== 'svg' || !allowedElement(parsed)) {
      this.status.textContent = 'Graphviz returned no SVG.';
      return;
    }
    sanitizeSvg(parsed);
    this.runs = blockRuns(doc, tree, this.expanded, this.unrolled);
    const drawing = document.importNode(parsed, true) as unknown as SVGSVGElement;
    this.titleNodes(drawing);
    this.stage.replaceChildren(drawing);
    this.lit = null;
    this.drawn = new Set(this.expanded);
    // a run of repeated blocks is one closed node
    const inRuns = this.runs.reduce((n, r) => n + r.members.length - 1, 0);
    const closed = tree.modules.filter(m => !this.expanded.has(m.id) && this.isShown(m.id)).length - inRuns;
    // the nodes on screen: `nodes` (the layout cap's bound) counts each run's members; a 12-layer and
    // a 24-layer GPT's overviews, the same 28 nodes, read "72 nodes" and "120 nodes"
    this.status.textContent =
      `${drawing.querySelectorAll('g.node').length} nodes for ${ops} ops` +
      (closed
        ? `; ${closed} modules closed: click one to open it, click an open module's frame to close it`
        : '');
    this.size = this.measure(drawing);
    // an opened module's id is now its frame's; on first drawing, the phases' frames (or boxes)
    const focus = this.focus.length
      ? this.focus
      : tree.roots
          .filter(r => tree.modules[r].phase !== 'optimizer')
          .map(r => ({ kind: 'module', id: r }) as NodeRef);
    const find = (ref: NodeRef): Element | null => this.stage.querySelector(`#${refId(ref)}`);
    // the frames of the phases holding the focus: in view side to side when that stays readable
    const phases = [
      ...new Set(focus.flatMap(ref => (ref.kind === 'module' ? [ancestors(tree, ref.id)[0]] : [])))
    ];
    // what the user opened or found (an opened module comes before its twins, `withTwins`), or the
    // first block of the run they unrolled
    const primary = this.focus.length ? find(this.focus[0]) : this.reveal ? find(this.reveal) : null;
    this.reveal = null;
    this.land(
      focus.map(find).filter(el => el !== null),
      phases.map(m => find({ kind: 'module', id: m })).filter(el => el !== null),
      primary
    );
  }

  /** Whether module `m` is on screen (its parent open). */
  private isShown(m: number): boolean {
    const parent = this.tree?.modules[m].parent;
    return parent === null || parent === undefined || this.expanded.has(parent);
  }

  /** Graphviz titles every node with its DOT id: replace each with the real names, as text. */
  private titleNodes(svg: Element): void {
    const { doc, tree } = this;
    if (!doc || !tree) {
      return;
    }
    for (const g of Array.from(svg.querySelectorAll('g.node, g.cluster'))) {
      const ref = parseNodeId(g.getAttribute('id'));
      const title = g.querySelector(':scope > title');
      if (ref && title) {
        title.textContent = tooltipFor(doc, tree, ref, this.runs);
      }
    }
  }

  private measure(svg: SVGSVGElement): { w: number; h: number } {
    // Graphviz sizes the drawing in points; the page lays it out in CSS pixels at scale 1
    this.view = { x: 0, y: 0, k: 1 };
    this.applyView();
    const r = svg.getBoundingClientRect();
    return { w: r.width, h: r.height };
  }

  private fit(): void {
    this.focus = [];
    const { view, kind } = fitReadable(
      this.size,
      { w: this.canvas.clientWidth, h: this.canvas.clientHeight },
      this.view
    );
    this.view = view;
    this.applyView();
    this.node.dataset.fit = kind;
    const scale = `${Math.round(100 * view.k)}%`;
    this.fitNote.textContent =
      kind === 'whole'
        ? ''
        : `Fit: the smallest readable scale, ${scale}; the whole drawing would put labels under ` +
          `${MIN_LABEL_PX} px. Drag to pan, \u2212 to zoom out further.`;
  }

  /**
   * Land on `els` (an opened module's frame and its twins', a search hit; none: the whole drawing):
   * centered, readable, `primary` whole where `els` do not fit (`focusView`); Fit and zoom out still
   * reach the whole drawing.
   */
  private land(els: Element[], frames: Element[] = [], primary: Element | null = null): void {
    const stage = this.stage.getBoundingClientRect();
    const k0 = this.view.k;
    // each element's box in drawing pixels (undo the stage's current transform), then their union
    const union = (list: Element[]): Rect | null => {
      const boxes = list.map(el => el.getBoundingClientRect());
      if (!boxes.length) {
        return null;
      }
      const x0 = Math.min(...boxes.map(b => b.left));
      const y0 = Math.min(...boxes.map(b => b.top));
      const x1 = Math.max(...boxes.map(b => b.right));
      const y1 = Math.max(...boxes.map(b => b.bottom));
      return { x: (x0 - stage.left) / k0, y: (y0 - stage.top) / k0, w: (x1 - x0) / k0, h: (y1 - y0) / k0 };
    };
    const box = { w: this.canvas.clientWidth, h: this.canvas.clientHeight };
    const target = union(els) ?? { x: 0, y: 0, ...this.size };
    const across = union([...els, ...frames]);
    // The phases' frames side to side, the target's height: three twins opened at 6.5k ops landed on
    // the twins alone, the optimizer's frame cut at the right edge.  Only where that width stays readable.
    const widened =
      across && across.w * FIT_MIN_SCALE <= box.w - 16 ? { ...target, x: across.x, w: across.w } : target;
    this.view = focusView(widened, this.size, box, primary ? union([primary]) : null);
    this.applyView();
    this.fitNote.textContent = this.offView(box);
  }

  /**
   * A hint naming the sides where the drawing runs past the canvas (empty when it is all in view):
   * there is no scrollbar to tell.  Past by less than `slack` px is Graphviz's padding around the frames.
   */
  private offView(box: { w: number; h: number }, slack = 8): string {
    const { x, y, k } = this.view;
    const sides = [
      y + this.size.h * k > box.h + slack ? 'below' : '',
      y < -slack ? 'above' : '',
      x + this.size.w * k > box.w + slack ? 'to the right' : '',
      x < -slack ? 'to the left' : ''
    ].filter(s => s);
    return sides.length
      ? `More of the drawing lies ${sides.join(' and ')}: drag to pan, \u2212 to zoom out, Fit for the most that stays readable.`
      : '';
  }

  private zoom(factor: number, px: number, py: number): void {
    this.view = zoomAt(this.view, px, py, factor);
    this.applyView();
  }

  private applyView(): void {
    const { x, y, k } = this.view;
    this.fitNote.textContent = ''; // a later zoom, pan or drawing replaces what Fit did
    delete this.node.dataset.fit;
    this.stage.style.transform = `translate(${x}px, ${y}px) scale(${k})`;
    this.node.dataset.scale = k.toFixed(4);
  }

  private collapseAll(): void {
    this.expanded = new Set();
    this.unrolled = new Set();
    this.focus = [];
    void this.render();
  }

  /**
   * Open module `m`, with its twins in the other phases while the drawing stays within the cap (else
   * `m` alone), unless `m` alone would pass it.
   */
  private open(m: number): void {
    const { doc, tree } = this;
    if (!doc || !tree) {
      return;
    }
    const before = visibleCount(doc, tree, this.expanded);
    const after = before + openCost(doc, tree, m);
    if (after > MAX_NODES) {
      this.status.textContent = `Opening it would draw ${after} nodes, above the ${MAX_NODES}-node cap: close another module first.`;
      return;
    }
    const twins = withTwins(tree, this.expanded, m);
    const all = before + twins.reduce((n, t) => n + openCost(doc, tree, t), 0);
    const opened = all <= MAX_NODES ? twins : [m];
    this.expanded = new Set([...this.expanded, ...opened]);
    this.focus = opened.map(id => ({ kind: 'module', id }) as NodeRef);
    void this.render();
  }

  /**
   * Draw the blocks of `run` (in every phase: its key) one by one, each a closed module; the view lands
   * on the phases side by side, as on first drawing (the blocks wrap in rows beside their twins there),
   * slid to show the run's first block whole.
   */
  private unroll(run: BlockRun): void {
    this.unrolled = new Set([...this.unrolled, run.key]);
    this.focus = [];
    // its first block in view: at 92 layers the unrolled column ran far below the phases' top, where
    // the view landed, and the click seemed to do nothing (issue 18)
    this.reveal = { kind: 'module', id: run.members[0] };
    void this.render();
  }

  /** Close module `m` and its open twins in the other phases (`openTwins`: as `open` opens them). */
  private close(m: number): void {
    const tree = this.tree;
    if (tree) {
      const closing = openTwins(tree, this.expanded, m);
      this.expanded = closing.reduce((open, t) => collapse(tree, open, t), this.expanded);
      this.focus = closing.map(id => ({ kind: 'module', id }) as NodeRef);
      void this.render();
    }
  }

  /** Go to the next (`step` 1) or previous (-1) search hit, opening the modules around it. */
  private find(step: number): void {
    const { doc, tree } = this;
    if (!doc || !tree) {
      return;
    }
    const query = this.searchBox.value;
    if (this.hits.length === 0 || this.searchBox.dataset.query !== query) {
      this.hits = search(doc, query);
      this.hitIndex = step > 0 ? -1 : 0;
      this.searchBox.dataset.query = query;
    }
    if (this.hits.length === 0) {
      this.searchStatus.textContent = query.trim() ? 'no match' : '';
      return;
    }
    this.hitIndex = (this.hitIndex + step + this.hits.length) % this.hits.length;
    const hit = this.hits[this.hitIndex];
    this.searchStatus.textContent = `${this.hitIndex + 1} of ${this.hits.length}: ${hit.text}`;
    const opened = revealCompute(tree, this.expanded, hit.compute);
    if (visibleCount(doc, tree, opened) > MAX_NODES) {
      // keep only the hit's own path open
      this.expanded = revealCompute(tree, new Set(), hit.compute);
    } else {
      this.expanded = opened;
    }
    const shownData = hit.data !== null && doc.graph.datas[hit.data]?.producer === hit.compute;
    this.highlight = shownData
      ? { kind: 'data', id: hit.data as number }
      : { kind: 'compute', id: hit.compute };
    this.focus = [this.highlight];
    void this.render().then(() => this.markHit());
  }

  private markHit(): void {
    for (const el of Array.from(this.stage.querySelectorAll('.jp-memviz-graph-hit'))) {
      el.classList.remove('jp-memviz-graph-hit');
    }
    let el = this.highlight ? this.stage.querySelector(`#${refId(this.highlight)}`) : null;
    if (!el && this.highlight?.kind === 'data' && this.hits[this.hitIndex]) {
      el = this.stage.querySelector(`#c${this.hits[this.hitIndex].compute}`);
    }
    el?.classList.add('jp-memviz-graph-hit');
  }

  private readonly onWheel = (e: WheelEvent): void => {
    e.preventDefault();
    const r = this.canvas.getBoundingClientRect();
    this.zoom(Math.exp(-e.deltaY * 0.002), e.clientX - r.left, e.clientY - r.top);
  };

  private readonly onPointerDown = (e: PointerEvent): void => {
    this.drag = { x: e.clientX, y: e.clientY, moved: false };
  };

  private readonly onPointerMove = (e: PointerEvent): void => {
    if (!this.drag) {
      return;
    }
    const dx = e.clientX - this.drag.x;
    const dy = e.clientY - this.drag.y;
    if (!this.drag.moved && Math.abs(dx) + Math.abs(dy) < 4) {
      return; // a click, not a drag yet
    }
    this.drag = { x: e.clientX, y: e.clientY, moved: true };
    this.canvas.style.cursor = 'grabbing';
    this.view = { ...this.view, x: this.view.x + dx, y: this.view.y + dy };
    this.applyView();
  };

  private readonly onPointerUp = (e: PointerEvent): void => {
    const wasDrag = this.drag?.moved ?? false;
    this.drag = null;
    this.canvas.style.cursor = 'grab';
    if (wasDrag) {
      return;
    }
    const target = e.target as Element | null;
    const node = parseNodeId(target?.closest?.('g.node')?.getAttribute('id'));
    if (node?.kind === 'module') {
      this.open(node.id);
      return;
    }
    if (node?.kind === 'run') {
      const run = this.runs.find(r => r.members[0] === node.id);
      if (run) {
        this.unroll(run);
      }
      return;
    }
    if (node?.kind === 'compute') {
      this.onSelectCompute(node.id);
      return;
    }
    const frame = parseNodeId(target?.closest?.('g.cluster')?.getAttribute('id'));
    if (!node && frame?.kind === 'module') {
      this.close(frame.id);
    }
  };
}

/** The "Graph" tab of every plan shell; clicking an op marks its step on the memory chart. */
registerPlanView({ label: 'Graph', create: host => new GraphView(id => host.selectCompute(id)) });
