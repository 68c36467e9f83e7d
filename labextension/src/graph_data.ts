/**
 * Pure helpers of the CD-graph view (graph.ts): which DOT to show, how an SVG element maps back to a
 * compute/data node of the plan, and the legend.  The DOT itself is built in Python
 * (memviz/cdgraph.py) and shipped in the plan document's optional "cdgraph" field.
 */

/** The plan document's "cdgraph" field (memviz.cdgraph.cdgraph_dict). */
export interface CdGraphDoc {
  dot: string;
  collapsed_dot: string | null;
  nodes?: number;
}

/** Above this many nodes the collapsed graph is shown first (memviz.cdgraph.COLLAPSE_ABOVE). */
export const COLLAPSE_ABOVE = 400;

/** One legend row; colors match memviz.cdgraph.FATES. */
export interface LegendRow {
  fate: string;
  color: string;
  text: string;
}

export const LEGEND: readonly LegendRow[] = [
  { fate: 'kept', color: '#c6e2ff', text: 'computed once, kept until last use' },
  { fate: 'recomputed', color: '#ffb74d', text: 'computed more than once' },
  { fate: 'freed_early', color: '#ef9a9a', text: 'freed, later recomputed' },
  { fate: 'unused', color: '#eeeeee', text: 'not run by the plan' },
  { fate: 'parameter', color: '#c8e6c9', text: 'parameter / buffer' },
  { fate: 'input', color: '#fff59d', text: 'input' },
  { fate: 'gradient', color: '#d1c4e9', text: 'gradient' },
  { fate: 'optimizer_state', color: '#b2dfdb', text: 'optimizer state' },
  { fate: 'runtime', color: '#d7ccc8', text: 'device runtime (cuBLAS workspaces)' },
  { fate: 'output', color: '#ffffff', text: 'output' }
];

/** What a clicked SVG node stands for. */
export type NodeRef =
  { kind: 'compute'; id: number } | { kind: 'data'; id: number } | { kind: 'block'; id: number };

const KINDS: Record<string, NodeRef['kind']> = { c: 'compute', d: 'data', b: 'block' };

/** Map an SVG element id written by memviz.cdgraph ("c12", "d34", "b3") back to the node; null otherwise. */
export function parseNodeId(svgId: string | null | undefined): NodeRef | null {
  const m = /^([cdb])(\d+)$/.exec(svgId ?? '');
  if (!m) {
    return null;
  }
  return { kind: KINDS[m[1]], id: Number(m[2]) } as NodeRef;
}

/** Whether the view starts collapsed: only when a collapsed DOT exists and the graph is big. */
export function startCollapsed(cd: CdGraphDoc): boolean {
  return cd.collapsed_dot !== null && (cd.nodes ?? 0) > COLLAPSE_ABOVE;
}

/** The DOT to render for the toggle state (the expanded one when there is no collapsed DOT). */
export function chooseDot(cd: CdGraphDoc, collapsed: boolean): string {
  return collapsed && cd.collapsed_dot !== null ? cd.collapsed_dot : cd.dot;
}

/** The "cdgraph" field of an untrusted plan document, or null when absent or malformed. */
export function cdgraphOf(doc: unknown): CdGraphDoc | null {
  const cd = (doc as { cdgraph?: unknown } | null)?.cdgraph as Partial<CdGraphDoc> | undefined;
  if (!cd || typeof cd.dot !== 'string') {
    return null;
  }
  const collapsed = typeof cd.collapsed_dot === 'string' ? cd.collapsed_dot : null;
  const nodes = typeof cd.nodes === 'number' ? cd.nodes : undefined;
  return { dot: cd.dot, collapsed_dot: collapsed, nodes };
}

/** Zoom about a point: new scale (clamped) and translation keeping (px, py) fixed on screen. */
export function zoomAt(
  view: { x: number; y: number; k: number },
  px: number,
  py: number,
  factor: number
): { x: number; y: number; k: number } {
  const k = Math.min(20, Math.max(0.05, view.k * factor));
  const f = k / view.k;
  return { x: px - (px - view.x) * f, y: py - (py - view.y) * f, k };
}
