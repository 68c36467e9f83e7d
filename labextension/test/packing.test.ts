import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import {
  addressFilter,
  addressFilterLabel,
  changingRange,
  hitTest,
  kindCategory,
  packingFigure,
  packingTraces,
  pixelRects,
  placementLines
} from '../src/packing_data';
import { CATEGORIES, formatBytes, parsePlan, PlanDoc } from '../src/transforms';
import { HOSTILE, python, samplePlan } from './sample';

// A solvers-built document: OLLA's packing and the caching-allocator simulation of its planned schedule.
const SAMPLE: PlanDoc = samplePlan();

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
      // Four numbers per rectangle, in the layers and in placement order for the hit test.
      assert.equal(
        panel.layers.reduce((n, l) => n + l.rects.length, 0),
        placements.length * 4
      );
      assert.equal(panel.boxes.length, placements.length * 4);
      assert.equal(panel.placements, placements);
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

  it('says in the title when the time limit cut the packer', () => {
    assert.doesNotMatch(packingFigure(SAMPLE).titles[0], /time limit/);
    const doc = clone();
    doc.packing!.time_cuts = ['olla: greedy packing'];
    doc.packing!.greedy_orders = ['start'];
    assert.match(
      packingFigure(doc).titles[0],
      /fragmentation [0-9.]+%<br>time limit reached: greedy in start order only$/
    );
    doc.packing!.greedy_orders = ['start', 'taw'];
    doc.packing!.time_cuts = ['olla: canonical packing search'];
    assert.match(packingFigure(doc).titles[0], /time limit reached: search cut short$/);
    doc.packing!.time_cuts = [];
    assert.doesNotMatch(packingFigure(doc).titles[0], /time limit/);
  });

  it('finds the tensor under the cursor and describes it in plain text', () => {
    const figure = packingFigure(SAMPLE);
    const panel = figure.panels[0];
    const s = figure.unit.scale;
    for (const p of SAMPLE.packing!.buffers) {
      // the centre of each rectangle hits its own placement (a valid packing has no overlaps)
      const x = (p.start + Math.max(p.end, p.start + 1)) / 2;
      assert.equal(hitTest(panel, x, (p.offset + p.size / 2) / s), p);
    }
    assert.equal(hitTest(panel, -1, 0), null);
    // a category switched off in the legend is not hit
    const p = SAMPLE.packing!.buffers[0];
    const x = (p.start + p.end) / 2;
    const y = (p.offset + p.size / 2) / s;
    const category = kindCategory(SAMPLE.graph.datas[p.data!].kind);
    assert.equal(hitTest(panel, x, y, new Set([category])), null);
    assert.equal(hitTest(panel, x, y, new Set(['workspace'])), p);
    assert.equal(hitTest(panel, 0, panel.ymax + 1), null);
    const doc = clone();
    const first = doc.packing!.buffers[0];
    doc.graph.datas[first.data!].name = HOSTILE;
    // textContent in the view: the name stays the raw string, never markup
    assert.deepEqual(placementLines(doc, first), [
      `${HOSTILE} [${doc.graph.datas[first.data!].shape!.join(', ')}]`,
      `${doc.graph.datas[first.data!].kind}, 8.00 MiB`,
      `steps ${first.start}–${first.end - 1}, offset ${formatBytes(first.offset)}` // where the packer put it
    ]);
    assert.deepEqual(
      placementLines(doc, { data: null, compute: 1, start: 1, end: 2, offset: 0, size: 2 * 2 ** 20 }),
      ['workspace of relu', 'workspace, 2.00 MiB', 'steps 1–1, offset 0 B']
    );
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
  it('anchors each panel on its own axes and keys each category once, drawing nothing', () => {
    const figure = packingFigure(SAMPLE);
    const traces = packingTraces(figure.panels);
    assert.ok(traces.every(t => t.x.length === 1 && t.x[0] === null && t.hoverinfo === 'skip'));
    const keys = traces.filter(t => t.showlegend);
    const categories = new Set(figure.panels.flatMap(p => p.layers.map(l => l.category)));
    assert.deepEqual(new Set(keys.map(k => k.legendgroup)), categories);
    assert.equal(keys.length, categories.size);
    const anchors = traces.filter(t => !t.showlegend);
    assert.deepEqual(
      anchors.map(t => [t.xaxis, t.yaxis]),
      [
        ['x', 'y'],
        ['x2', 'y2']
      ]
    );
  });

  it('escapes category names in the legend', () => {
    const doc = clone();
    doc.graph.datas[doc.packing!.buffers[0].data!].kind = HOSTILE;
    const names = packingTraces(packingFigure(doc).panels).map(t => t.name);
    assert.ok(names.some(n => n.includes('&lt;img')));
    assert.ok(names.every(n => !n.includes('<img')));
  });
});

describe('addressFilter', () => {
  it("names the shown address range: a button's, or a drag zoom", () => {
    const changing: [number, number] = [2.4, 8.2];
    assert.equal(addressFilter([2.4, 8.2], changing, 8.2), 'changing');
    // plotly echoes the range back as floats
    assert.equal(addressFilter([2.4000000001, 8.2], changing, 8.2), 'changing');
    assert.equal(addressFilter([0, 8.2], changing, 8.2), 'all');
    assert.equal(addressFilter([0, 8.2], null, 8.2), 'all');
    assert.equal(addressFilter([3, 5], changing, 8.2), 'custom');
    assert.equal(addressFilter([2.4, 8.2], null, 8.2), 'custom');
    assert.equal(
      addressFilterLabel('changing', [2.4, 8.2], 'MiB'),
      'showing: the addresses that change, 2.4\u20138.2 MiB'
    );
    assert.match(addressFilterLabel('all', [0, 8.2], 'MiB'), /^showing: all addresses, 0\.0/);
    assert.match(addressFilterLabel('custom', [3, 5], 'KiB'), /zoomed range .*3\.0\u20135\.0 KiB$/);
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

describe('kindCategory', () => {
  it('maps every solvers.DataKind to the category solvers.simulate counts it in', () => {
    const fromPython: Record<string, string> = JSON.parse(
      python([
        '-c',
        'import json; from solvers import DataKind; from solvers.simulate import category; ' +
          'print(json.dumps({k.value: category(k) for k in DataKind}))'
      ])
    );
    assert.ok('communication' in fromPython);
    for (const [kind, category] of Object.entries(fromPython)) {
      assert.equal(kindCategory(kind), category, kind);
      assert.ok(CATEGORIES.includes(category), category);
    }
  });
});

describe('changingRange', () => {
  const panel = (boxes: number[]): Parameters<typeof changingRange>[0] => ({
    layers: [],
    placements: [],
    boxes,
    categories: boxes.filter((_, i) => i % 4 === 0).map(() => 'x'),
    xmax: 10,
    ymax: Math.max(...boxes.filter((_, i) => i % 4 === 3))
  });
  it('starts above what every step holds and ends at the top', () => {
    // a parameter over the whole schedule at [0, 4), a gradient from step 6 at [4, 5), an activation at [5, 9)
    assert.deepEqual(changingRange(panel([0, 0, 10, 4, 6, 4, 10, 5, 1, 5, 6, 9])), [4, 9]);
  });
  it('is null when nothing is fixed at the bottom', () => {
    assert.equal(changingRange(panel([0, 0, 5, 4, 5, 0, 10, 4])), null);
    assert.equal(changingRange(panel([0, 0, 10, 4])), null);
  });
});
