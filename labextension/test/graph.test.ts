import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  cdgraphOf,
  chooseDot,
  COLLAPSE_ABOVE,
  LEGEND,
  parseNodeId,
  startCollapsed,
  zoomAt
} from '../src/graph_data';

test('svg ids map back to compute, data and block nodes', () => {
  assert.deepEqual(parseNodeId('c12'), { kind: 'compute', id: 12 });
  assert.deepEqual(parseNodeId('d0'), { kind: 'data', id: 0 });
  assert.deepEqual(parseNodeId('b3'), { kind: 'block', id: 3 });
  for (const bad of ['node1', 'c', 'c1x', 'edge3', '', null, undefined, 'c-1']) {
    assert.equal(parseNodeId(bad), null, String(bad));
  }
});

test('legend has one row per fate with a hex color', () => {
  const fates = LEGEND.map(r => r.fate);
  assert.equal(new Set(fates).size, fates.length);
  for (const f of ['kept', 'recomputed', 'freed_early', 'parameter', 'gradient', 'optimizer_state']) {
    assert.ok(fates.includes(f), f);
  }
  assert.ok(LEGEND.every(r => /^#[0-9a-f]{6}$/.test(r.color)));
});

test('big graphs start collapsed when a collapsed dot exists', () => {
  const big = { dot: 'E', collapsed_dot: 'C', nodes: COLLAPSE_ABOVE + 1 };
  assert.equal(startCollapsed(big), true);
  assert.equal(startCollapsed({ ...big, nodes: 10 }), false);
  assert.equal(startCollapsed({ ...big, collapsed_dot: null }), false);
  assert.equal(chooseDot(big, true), 'C');
  assert.equal(chooseDot(big, false), 'E');
  assert.equal(chooseDot({ ...big, collapsed_dot: null }, true), 'E');
});

test('cdgraph field of untrusted documents', () => {
  assert.equal(cdgraphOf(null), null);
  assert.equal(cdgraphOf({}), null);
  assert.equal(cdgraphOf({ cdgraph: { dot: 3 } }), null);
  assert.deepEqual(cdgraphOf({ cdgraph: { dot: 'x', collapsed_dot: 5, nodes: 'many' } }), {
    dot: 'x',
    collapsed_dot: null,
    nodes: undefined
  });
});

test('zoom keeps the pointer fixed and clamps the scale', () => {
  const v = zoomAt({ x: 10, y: 20, k: 1 }, 100, 50, 2);
  assert.equal(v.k, 2);
  // the graph point under the pointer before and after is the same
  assert.equal((100 - 10) / 1, (100 - v.x) / v.k);
  assert.equal((50 - 20) / 1, (50 - v.y) / v.k);
  assert.equal(zoomAt({ x: 0, y: 0, k: 1 }, 0, 0, 1e6).k, 20);
});
