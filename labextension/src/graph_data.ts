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
