import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import { LatestOnly } from '../src/latest';

/** A hand-driven frame scheduler and a draw that records its values and resolves when told. */
function harness(async: boolean): {
  latest: LatestOnly<number>;
  drawn: number[];
  frame(): void;
  finish(): Promise<void>;
  frames(): number;
} {
  const drawn: number[] = [];
  const callbacks: (() => void)[] = [];
  const resolvers: (() => void)[] = [];
  const latest = new LatestOnly<number>(
    value => {
      drawn.push(value);
      return async ? new Promise<void>(resolve => resolvers.push(resolve)) : undefined;
    },
    callback => callbacks.push(callback)
  );
  return {
    latest,
    drawn,
    frame: () => callbacks.splice(0).forEach(cb => cb()),
    // settle the running draw and let its continuation request the next frame
    finish: async () => {
      resolvers.splice(0).forEach(resolve => resolve());
      await new Promise(resolve => setImmediate(resolve));
    },
    frames: () => callbacks.length
  };
}

const tick = (): Promise<void> => new Promise(resolve => setImmediate(resolve));

describe('LatestOnly', () => {
  it('draws a value pushed while idle at once', () => {
    const { latest, drawn } = harness(true);
    latest.push(1);
    assert.deepEqual(drawn, [1]);
    assert.equal(latest.busy, true);
  });

  it('draws only the latest of the values pushed while an asynchronous draw runs', async () => {
    const h = harness(true);
    h.latest.push(1);
    h.latest.push(2);
    h.latest.push(3);
    h.latest.push(4);
    assert.deepEqual(h.drawn, [1]);
    assert.equal(h.frames(), 0); // nothing waits for a frame while the draw runs
    await h.finish();
    assert.deepEqual(h.drawn, [1]); // drawn, not yet painted
    h.frame();
    assert.deepEqual(h.drawn, [1, 4]);
    await h.finish();
    h.frame();
    assert.deepEqual(h.drawn, [1, 4]);
    assert.equal(h.latest.busy, false);
    h.latest.push(5); // idle again: at once
    assert.deepEqual(h.drawn, [1, 4, 5]);
  });

  it('coalesces values pushed after a synchronous draw until its frame', async () => {
    const h = harness(false);
    h.latest.push(1);
    await tick();
    h.latest.push(2);
    h.latest.push(3);
    assert.deepEqual(h.drawn, [1]);
    h.frame();
    assert.deepEqual(h.drawn, [1, 3]);
    await tick();
    h.frame();
    assert.equal(h.latest.busy, false);
    assert.deepEqual(h.drawn, [1, 3]);
  });

  it('goes on drawing after a draw that throws or rejects', async () => {
    const drawn: number[] = [];
    const callbacks: (() => void)[] = [];
    const error = console.error;
    console.error = () => undefined;
    try {
      const latest = new LatestOnly<number>(
        value => {
          drawn.push(value);
          if (value === 1) {
            throw new Error('broken');
          }
          return value === 2 ? Promise.reject(new Error('broken')) : undefined;
        },
        callback => callbacks.push(callback)
      );
      latest.push(1);
      latest.push(2);
      await tick();
      callbacks.splice(0).forEach(cb => cb());
      assert.deepEqual(drawn, [1, 2]);
      latest.push(3);
      await tick();
      callbacks.splice(0).forEach(cb => cb());
      assert.deepEqual(drawn, [1, 2, 3]);
    } finally {
      console.error = error;
    }
  });
});
