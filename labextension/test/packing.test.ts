import { strict as assert } from 'node:assert';
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import { describe, it } from 'node:test';

import { kindCategory, packingFigure, packingTraces, pixelRects } from '../src/packing_data';
import { CATEGORIES, parsePlan, PlanDoc } from '../src/transforms';

// Compiled to labextension/lib/test-cjs/test/: the repository root is four levels up.
const ROOT = path.resolve(__dirname, '..', '..', '..', '..');
const HOSTILE = '<img src=x onerror=alert(1)>';

// A solvers-built document: OLLA's packing and the caching-allocator simulation of its planned schedule.
const SAMPLE: PlanDoc = parsePlan(
  JSON.parse(
    execFileSync(process.env.PYTHON ?? 'python3', [path.join('labextension', 'test', 'sample_plan.py')], {
      cwd: ROOT,
      env: { ...process.env, PYTHONPATH: ROOT },
      encoding: 'utf8'
    })
  )
);

function clone(): PlanDoc {
  return JSON.parse(JSON.stringify(SAMPLE)) as PlanDoc;
}

describe('packingFigure', () => {
  it('puts every placement in its category layer, both packings side by side', () => {
    const figure = packingFigure(SAMPLE);
    const packing = SAMPLE.packing!;
    assert.equal(figure.panels.length, 2);
    for (const [panel, placements] of [
      [figure.panels[0], packing.buffers],
      [figure.panels[1], packing.allocator!.blocks]
    ] as const) {
      // Four numbers per rectangle; one hover point per placement.
      assert.equal(
        panel.layers.reduce((n, l) => n + l.rects.length, 0),
        placements.length * 4
      );
      assert.equal(panel.hover.text.length, placements.length);
      const kinds = new Set(
        placements.map(p => (p.data === null ? 'workspace' : kindCategory(SAMPLE.graph.datas[p.data].kind)))
      );
      assert.deepEqual(new Set(panel.layers.map(l => l.category)), kinds);
      assert.equal(
        panel.ymax,
        placements.reduce((m, p) => Math.max(m, p.offset + p.size), 0) / figure.unit.scale
      );
    }
    // A rectangle spans its lifetime [start, end) and its address range, in the chosen unit.
    const first = packing.buffers[0];
    const layer = figure.panels[0].layers.find(
      l => l.category === kindCategory(SAMPLE.graph.datas[first.data!].kind)
    )!;
    const s = figure.unit.scale;
    assert.deepEqual(layer.rects.slice(0, 4), [
      first.start,
      first.offset / s,
      first.end,
      (first.offset + first.size) / s
    ]);
    assert.match(figure.titles[0], /fragmentation 0\.0%/);
    assert.match(figure.titles[1], /caching allocator/);
  });

  it('escapes tensor names in hover text', () => {
    const doc = clone();
    const placed = doc.packing!.buffers[0].data!;
    doc.graph.datas[placed].name = HOSTILE;
    const hover = packingFigure(doc).panels.flatMap(p => p.hover.text);
    assert.ok(hover.some(h => h.startsWith('&lt;img src=x')));
    assert.ok(hover.every(h => !h.includes('<img')));
  });

  it('keeps 10k tensors in a handful of traces', () => {
    const doc = clone();
    const buffers = Array.from({ length: 10000 }, (_, i) => ({
      data: i % doc.graph.datas.length,
      start: i % 100,
      end: (i % 100) + 5,
      offset: (i % 997) * 1024,
      size: 1024
    }));
    doc.packing = { ...doc.packing!, buffers };
    const t0 = performance.now();
    const figure = packingFigure(doc);
    const traces = packingTraces(figure.panels);
    console.log(
      `packingFigure + traces, 10k planned tensors + allocator: ${(performance.now() - t0).toFixed(1)} ms`
    );
    assert.ok(traces.length <= CATEGORIES.length + figure.panels.length);
  });

  it('is empty without a packing and rejects malformed placements', () => {
    assert.equal(packingFigure({ ...SAMPLE, packing: null }).panels.length, 0);
    const bad = JSON.parse(JSON.stringify(SAMPLE));
    bad.packing.buffers = [{ data: 1, start: 0 }];
    assert.throws(() => parsePlan(bad), /packing.buffers/);
  });
});

describe('packingTraces', () => {
  it('keys each category once and gives each panel its hover points on its own axes', () => {
    const figure = packingFigure(SAMPLE);
    const traces = packingTraces(figure.panels);
    const keys = traces.filter(t => t.showlegend);
    const categories = new Set(figure.panels.flatMap(p => p.layers.map(l => l.category)));
    assert.equal(keys.length, categories.size);
    assert.ok(
      keys.every(k => k.x.length === 1 && k.x[0] === null),
      'legend keys draw nothing'
    );
    const hover = traces.filter(t => t.type === 'scattergl');
    assert.deepEqual(
      hover.map(t => [t.xaxis, t.yaxis, t.hovertext!.length]),
      [
        ['x', 'y', SAMPLE.packing!.buffers.length],
        ['x2', 'y2', SAMPLE.packing!.allocator!.blocks.length]
      ]
    );
  });
});

describe('pixelRects', () => {
  const win = { x0: 0, x1: 10, y0: 0, y1: 100 };

  it('maps (step, address) to pixels with addresses growing upwards', () => {
    // steps [2, 4), addresses [50, 100) in a 100 x 200 raster: 20 px wide from x 20, the top half
    assert.deepEqual(pixelRects([2, 50, 4, 100], win, 100, 200), [20, 0, 20, 100]);
    assert.deepEqual(pixelRects([0, 0, 10, 25], win, 100, 200), [0, 150, 100, 50]);
  });

  it('clips to the window, drops what lies outside and keeps thin rectangles one pixel wide', () => {
    const zoomed = { x0: 5, x1: 10, y0: 0, y1: 100 };
    assert.deepEqual(pixelRects([4, 0, 6, 100], zoomed, 50, 100), [0, 0, 10, 100]);
    assert.deepEqual(pixelRects([0, 0, 5, 100], zoomed, 50, 100), []);
    assert.deepEqual(pixelRects([6, 10, 6.01, 10.01], zoomed, 50, 100), [10, 89.99, 1, 1]);
  });
});
