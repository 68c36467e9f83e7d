/**
 * Pure geometry of the Graph view (graph.ts): zoom about a point and fit a drawing to the view.
 */

/** The stage's transform: translate (x, y) then scale k. */
export interface View {
  x: number;
  y: number;
  k: number;
}

/** Zoom about a point: new scale (clamped) and translation keeping (px, py) fixed on screen. */
export function zoomAt(view: View, px: number, py: number, factor: number): View {
  const k = Math.min(20, Math.max(0.01, view.k * factor));
  const f = k / view.k;
  return { x: px - (px - view.x) * f, y: py - (py - view.y) * f, k };
}

/**
 * The view showing a whole `drawing` (its size at scale 1) centered in `box`, never magnified above 1:1
 * (a three-node graph stays readable size); a drawing larger than the box is shrunk to fit, down to
 * the zoom floor.
 */
export function fitView(drawing: { w: number; h: number }, box: { w: number; h: number }, margin = 8): View {
  if (drawing.w <= 0 || drawing.h <= 0 || box.w <= 0 || box.h <= 0) {
    return { x: 0, y: 0, k: 1 };
  }
  const k = Math.max(0.01, Math.min(1, (box.w - 2 * margin) / drawing.w, (box.h - 2 * margin) / drawing.h));
  return { x: (box.w - drawing.w * k) / 2, y: (box.h - drawing.h * k) / 2, k };
}

/**
 * The smallest scale Fit goes down to: Graphviz's 10 pt labels (13.3 CSS px at 1:1) stay at least 8 px
 * high.  Below it a 12-layer drawing fitted whole showed labels nobody could read (issue 18); the zoom
 * buttons and the wheel still go lower when the user asks.
 */
export const MIN_LABEL_PX = 8;
export const FIT_MIN_SCALE = MIN_LABEL_PX / (10 * (4 / 3));

/** A part of a drawing, in drawing pixels at scale 1. */
export interface Rect {
  x: number;
  y: number;
  w: number;
  h: number;
}

/**
 * The view a drawing lands on, centered on `target` (what the user opened: a module with its twins in
 * the other phases, a search hit, or on first drawing the forward and backward phases side by side):
 * all of `target` when that keeps labels readable (scale >= `FIT_MIN_SCALE`, never above 1:1), else
 * its full width when readable, else `FIT_MIN_SCALE` centered on it; a target too tall for the box
 * shows its top.  Where `target` is wider than the box at that scale, the view slides from centered
 * just enough to show `primary` (the module the user opened, inside `target`) whole: in a 782 px output
 * block 3 opened beside its twin (823 px at the floor) had both frames cut 22 px.  Clamped so no empty
 * band shows beside a drawing larger than the box.  Before, an opened module was fitted whole whatever
 * the scale (its 110 layers at 5% scale), and the first drawing opened at its top-left corner with the
 * backward column cut off (issue 18).
 */
export function focusView(
  target: Rect,
  drawing: { w: number; h: number },
  box: { w: number; h: number },
  primary: Rect | null = null,
  margin = 8
): View {
  if (target.w <= 0 || target.h <= 0 || box.w <= 2 * margin || box.h <= 2 * margin) {
    return { x: 0, y: 0, k: 1 };
  }
  const room = { w: box.w - 2 * margin, h: box.h - 2 * margin };
  const whole = Math.min(1, room.w / target.w, room.h / target.h);
  const k = whole >= FIT_MIN_SCALE ? whole : Math.max(FIT_MIN_SCALE, Math.min(1, room.w / target.w));
  const centered = box.w / 2 - (target.x + target.w / 2) * k;
  // the least slide that brings `primary` whole into the box (none when it is wider than the room)
  const x =
    primary && primary.w * k <= room.w
      ? Math.min(Math.max(centered, margin - primary.x * k), box.w - margin - (primary.x + primary.w) * k)
      : centered;
  const y = target.h * k <= room.h ? box.h / 2 - (target.y + target.h / 2) * k : margin - target.y * k;
  return { k, x: clampAxis(x, drawing.w * k, box.w, margin), y: clampAxis(y, drawing.h * k, box.h, margin) };
}

/** How `fitReadable` showed the drawing: all of it, or its full width / a readable part of it to pan. */
export type FitKind = 'whole' | 'width' | 'readable';

/** Clamp a translation so the drawing (extent `size` at the view's scale) covers as much of `box` as it
 * can: no empty band beside an edge of a drawing larger than the box; a smaller one is centered. */
function clampAxis(t: number, size: number, box: number, margin: number): number {
  if (size + 2 * margin <= box) {
    return (box - size) / 2;
  }
  return Math.min(margin, Math.max(box - margin - size, t));
}

/**
 * Fit to view with a floor on the label size: the whole drawing when it is legible so (`fitView`);
 * else its full width when that is legible (scale >= `FIT_MIN_SCALE`), else `FIT_MIN_SCALE`.  The
 * drawing point at the box's center stays there (Fit does not jump away from what the user looks at),
 * clamped so no empty band shows beside the drawing; drag to pan the rest.
 */
export function fitReadable(
  drawing: { w: number; h: number },
  box: { w: number; h: number },
  current: View,
  margin = 8
): { view: View; kind: FitKind } {
  const whole = fitView(drawing, box, margin);
  if (whole.k >= FIT_MIN_SCALE || drawing.w <= 0 || drawing.h <= 0 || box.w <= 0 || box.h <= 0) {
    return { view: whole, kind: 'whole' };
  }
  const widthK = Math.min(1, (box.w - 2 * margin) / drawing.w);
  const k = Math.max(FIT_MIN_SCALE, widthK);
  // the drawing point under the box's center, kept there
  const cx = (box.w / 2 - current.x) / current.k;
  const cy = (box.h / 2 - current.y) / current.k;
  const view = {
    k,
    x: clampAxis(box.w / 2 - cx * k, drawing.w * k, box.w, margin),
    y: clampAxis(box.h / 2 - cy * k, drawing.h * k, box.h, margin)
  };
  return { view, kind: widthK >= FIT_MIN_SCALE ? 'width' : 'readable' };
}
