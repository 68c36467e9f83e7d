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

/** The smallest scale a drawing opens at: labels stay legible (Fit shows the whole drawing). */
export const READABLE_SCALE = 0.75;

/**
 * The view a drawing opens with: the whole drawing when it is legible so (`fitView`), else at
 * `READABLE_SCALE` with its top-left corner in view (drag to pan; Fit shows all of it).  A wide
 * drawing is not shrunk to the box's width: at 12 layers that gave labels nobody could read.
 */
export function openView(drawing: { w: number; h: number }, box: { w: number; h: number }, margin = 8): View {
  const fit = fitView(drawing, box, margin);
  if (fit.k >= READABLE_SCALE || drawing.w <= 0) {
    return fit;
  }
  const k = READABLE_SCALE;
  return { k, x: Math.max(margin, (box.w - drawing.w * k) / 2), y: margin };
}

/**
 * The smallest scale Fit goes down to: Graphviz's 10 pt labels (13.3 CSS px at 1:1) stay at least 8 px
 * high.  Below it a 12-layer drawing fitted whole showed labels nobody could read (issue 18); the zoom
 * buttons and the wheel still go lower when the user asks.
 */
export const MIN_LABEL_PX = 8;
export const FIT_MIN_SCALE = MIN_LABEL_PX / (10 * (4 / 3));

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
