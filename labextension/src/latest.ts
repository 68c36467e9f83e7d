/**
 * Draw only the latest of values that arrive faster than they can be drawn (the planner's plans while
 * the budget slider is dragged): a value pushed while nothing is being drawn is drawn at once; one
 * pushed while a draw runs, or before the frame that paints it, waits, replacing any value already
 * waiting, and is drawn in that frame.  So a burst of plans costs one draw per frame and the chart ends
 * on the last plan, never on a queue of stale ones.  Pure logic: the frame scheduler is passed in
 * (`requestAnimationFrame` in the browser).
 */
export class LatestOnly<T> {
  private _waiting: { value: T } | null = null;
  private _busy = false;

  constructor(
    private readonly _draw: (value: T) => void | Promise<void>,
    private readonly _nextFrame: (callback: () => void) => void
  ) {}

  /** Whether a draw is running or not yet painted (a pushed value would wait). */
  get busy(): boolean {
    return this._busy;
  }

  /** Draw `value` now, or as the latest waiting value once the current draw has been painted. */
  push(value: T): void {
    this._waiting = { value };
    if (!this._busy) {
      this._run();
    }
  }

  private _run(): void {
    const next = this._waiting;
    this._waiting = null;
    this._busy = next !== null;
    if (next === null) {
      return;
    }
    const painted = (): void => this._nextFrame(() => this._run());
    let drawn: void | Promise<void> = undefined;
    try {
      drawn = this._draw(next.value);
    } catch (err) {
      console.error('memviz: drawing failed', err);
    }
    // A failed draw must not stop later ones.
    Promise.resolve(drawn).then(painted, err => {
      console.error('memviz: drawing failed', err);
      painted();
    });
  }
}
