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
 * `FIT_MIN_SCALE` centered on it, the most of it that stays readable; a target too tall for the box
 * shows its top.  Where `target` does not fit the box at that scale, the view slides from there just
 * enough to show `primary` (what the user clicked, inside `target`) whole: in a 782 px output block 3
 * opened beside its twin (823 px at the floor) had both frames cut 22 px, and the blocks of a
 * 92-layer run unrolled lay below the fold.  Clamped so no empty band shows beside a drawing larger
 * than the box.  Before, an opened module was fitted whole whatever the scale (its 110 layers at 5%
 * scale), then a narrow target too tall to fit readable landed at its full width, that is at 1:1 for a
 * drawing narrower than the box: the 92-layer overview opened at 100%, its bottom cut, where 60%
 * showed nearly all of it (issue 18).
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
  const k = Math.max(whole, FIT_MIN_SCALE);
  // the least slide from `t` that brings `primary` (its start and extent on one axis) whole into the
  // box (none when it is larger than the room)
  const slide = (t: number, start: number, size: number, boxSize: number): number =>
    primary && size * k <= boxSize - 2 * margin
      ? Math.min(Math.max(t, margin - start * k), boxSize - margin - (start + size) * k)
      : t;
  const x = slide(box.w / 2 - (target.x + target.w / 2) * k, primary?.x ?? 0, primary?.w ?? 0, box.w);
  const top = target.h * k <= room.h ? box.h / 2 - (target.y + target.h / 2) * k : margin - target.y * k;
  const y = slide(top, primary?.y ?? 0, primary?.h ?? 0, box.h);
  return { k, x: clampAxis(x, drawing.w * k, box.w, margin), y: clampAxis(y, drawing.h * k, box.h, margin) };
}

/** How `fitReadable` showed the drawing: all of it, or the readable part of it around the center, to pan. */
export type FitKind = 'whole' | 'readable';

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
 * else `FIT_MIN_SCALE`, the most of it that stays legible.  The drawing point at the box's center stays
 * there (Fit does not jump away from what the user looks at), clamped so no empty band shows beside the
 * drawing; drag to pan the rest.  (Fit once showed such a drawing at its full width, capped at 1:1:
 * "its full width at 100%" for the 92-layer overview, narrower than the box, its bottom cut.)
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
  const k = FIT_MIN_SCALE;
  // the drawing point under the box's center, kept there
  const cx = (box.w / 2 - current.x) / current.k;
  const cy = (box.h / 2 - current.y) / current.k;
  const view = {
    k,
    x: clampAxis(box.w / 2 - cx * k, drawing.w * k, box.w, margin),
    y: clampAxis(box.h / 2 - cy * k, drawing.h * k, box.h, margin)
  };
  return { view, kind: 'readable' };
}
