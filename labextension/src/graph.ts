/**
 * The CD-graph view: the plan's computation/data graph (Rockmate Sec. 3.1) laid out by Graphviz
 * compiled to WebAssembly, colored by each node's fate in the planned schedule (memviz/cdgraph.py).
 *
 * The DOT comes from the plan document (memviz/cdgraph.py escapes every name for DOT and HTML, but a
 * document may have been edited); the only markup inserted into the page is the SVG Graphviz writes
 * from it, cut down to an allow-list of elements and attributes (svg_sanitize.ts).  Graphviz is loaded lazily in its
 * own webpack chunk, so plans never shown as a graph do not pay for the wasm download.
 */
import { LEGEND, cdgraphOf, chooseDot, CdGraphDoc, parseNodeId, startCollapsed, zoomAt } from './graph_data';
import { allowedElement, sanitizeSvg } from './svg_sanitize';
import { PlanDoc } from './transforms';
import { PlanView, registerPlanView } from './views';

type Graphviz = { dot(source: string): string };
let graphvizPromise: Promise<Graphviz> | null = null;

/** One Graphviz instance per page, fetched on first use. */
function loadGraphviz(): Promise<Graphviz> {
  if (!graphvizPromise) {
    graphvizPromise = import(/* webpackChunkName: "memviz-graphviz" */ '@hpcc-js/wasm-graphviz').then(m =>
      m.Graphviz.load()
    );
  }
  return graphvizPromise;
}

/** CD-graph tab: collapse toggle, legend, pan (drag) and zoom (wheel); a click on a compute node
 * calls `onSelectCompute(id)`. */
export class GraphView implements PlanView {
  readonly node: HTMLElement;
  private readonly toolbar: HTMLDivElement;
  private readonly toggle: HTMLButtonElement;
  private readonly status: HTMLSpanElement;
  private readonly canvas: HTMLDivElement;
  private readonly stage: HTMLDivElement;
  private cd: CdGraphDoc | null = null;
  private collapsed = false;
  private view = { x: 0, y: 0, k: 1 };
  private drag: { x: number; y: number; moved: boolean } | null = null;
  private generation = 0;
  /** the DOT is the largest member of a plan: a sender may keep it back until this tab is shown */
  readonly needs = ['cdgraph'] as const;

  constructor(private readonly onSelectCompute: (computeId: number) => void) {
    this.node = document.createElement('div');
    this.node.className = 'jp-memviz-graph';
    this.toolbar = document.createElement('div');
    this.toolbar.className = 'jp-memviz-graph-toolbar';
    this.toggle = document.createElement('button');
    this.toggle.className = 'jp-memviz-graph-toggle';
    this.toggle.addEventListener('click', () => {
      this.collapsed = !this.collapsed;
      void this.render();
    });
    this.status = document.createElement('span');
    this.status.className = 'jp-memviz-graph-status';
    this.toolbar.append(this.toggle, this.status, this.legend());
    this.canvas = document.createElement('div');
    this.canvas.className = 'jp-memviz-graph-canvas';
    this.canvas.style.overflow = 'hidden';
    this.canvas.style.position = 'relative';
    this.canvas.style.height = '600px';
    this.canvas.style.cursor = 'grab';
    this.stage = document.createElement('div');
    this.stage.style.transformOrigin = '0 0';
    this.canvas.append(this.stage);
    this.node.append(this.toolbar, this.canvas);
    this.canvas.addEventListener('wheel', this.onWheel, { passive: false });
    this.canvas.addEventListener('pointerdown', this.onPointerDown);
    this.canvas.addEventListener('pointermove', this.onPointerMove);
    this.canvas.addEventListener('pointerup', this.onPointerUp);
  }

  update(doc: PlanDoc): Promise<void> {
    this.cd = cdgraphOf(doc);
    this.collapsed = this.cd !== null && startCollapsed(this.cd);
    return this.render();
  }

  dispose(): void {
    this.generation++;
    this.canvas.removeEventListener('wheel', this.onWheel);
    this.node.remove();
  }

  private legend(): HTMLElement {
    const box = document.createElement('span');
    box.className = 'jp-memviz-graph-legend';
    for (const row of LEGEND) {
      const item = document.createElement('span');
      item.style.marginLeft = '8px';
      const swatch = document.createElement('span');
      swatch.style.cssText = `display:inline-block;width:10px;height:10px;border:1px solid #888;margin-right:3px`;
      swatch.style.background = row.color;
      item.append(swatch, document.createTextNode(row.text));
      box.append(item);
    }
    return box;
  }

  private async render(): Promise<void> {
    const generation = ++this.generation;
    const cd = this.cd;
    this.toggle.disabled = !cd || cd.collapsed_dot === null;
    this.toggle.textContent = this.collapsed ? 'Expand blocks' : 'Collapse identical blocks';
    this.stage.replaceChildren();
    if (!cd) {
      this.status.textContent = 'This plan has no CD-graph (saved by an older memviz): re-save it.';
      return;
    }
    this.status.textContent = 'Laying out…';
    let svg: string;
    try {
      svg = (await loadGraphviz()).dot(chooseDot(cd, this.collapsed));
    } catch (err) {
      this.status.textContent = `Graphviz failed: ${String(err)}`;
      return;
    }
    if (generation !== this.generation) {
      return; // a newer update or toggle superseded this layout
    }
    // Parsed as SVG, not as HTML.  The DOT came with the document, which may be untrusted (a notebook
    // output, a report someone sent): only Graphviz's own drawing survives `sanitizeSvg`.
    const parsed = new DOMParser().parseFromString(svg, 'image/svg+xml').documentElement;
    if (parsed.localName !== 'svg' || !allowedElement(parsed)) {
      this.status.textContent = 'Graphviz returned no SVG.';
      return;
    }
    sanitizeSvg(parsed);
    this.stage.append(document.importNode(parsed, true));
    this.status.textContent = `${cd.nodes ?? ''} nodes${this.collapsed ? ', identical blocks collapsed' : ''}`;
    this.view = { x: 0, y: 0, k: 1 };
    this.applyView();
  }

  private applyView(): void {
    const { x, y, k } = this.view;
    this.stage.style.transform = `translate(${x}px, ${y}px) scale(${k})`;
  }

  private readonly onWheel = (e: WheelEvent): void => {
    e.preventDefault();
    const r = this.canvas.getBoundingClientRect();
    this.view = zoomAt(this.view, e.clientX - r.left, e.clientY - r.top, Math.exp(-e.deltaY * 0.002));
    this.applyView();
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
    const g = (e.target as Element | null)?.closest?.('g.node');
    const ref = parseNodeId(g?.getAttribute('id'));
    if (ref?.kind === 'compute') {
      this.onSelectCompute(ref.id);
    }
  };
}

/** The "Graph" tab of every plan shell; clicking a compute node marks its step on the memory chart. */
registerPlanView({ label: 'Graph', create: host => new GraphView(id => host.selectCompute(id)) });
