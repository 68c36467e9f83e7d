import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import {
  addRegion,
  applyEdit,
  draggedEdges,
  EditorDoc,
  editorFigure,
  estimateLines,
  regionListCaption,
  visibleRows,
  labelRows,
  regionLabels,
  parseEditorDoc,
  regionEdits,
  removeRegion
} from '../src/chunkeditor_data';
import { TEST_COLORS } from './colors';

function doc(): EditorDoc {
  return parseEditorDoc({
    nodes: [
      { name: 'x', op: 'input' },
      { name: 'mm', op: 'linear' },
      { name: '<img src=x onerror=alert(1)>', op: 'softmax' },
      { name: 'out', op: 'linear' }
    ],
    baseline: [0, 4096, 8192, 4096],
    chunked: [0, 1024, 2048, 4096],
    regions: [
      {
        start: 'mm',
        end: '<img src=x onerror=alert(1)>',
        x0: 1,
        x1: 2,
        chunks: 4,
        extent: 128,
        outputs: { '<img src=x onerror=alert(1)>': 1 },
        dims: {},
        memory_bytes: 2048,
        slowdown: 0.05
      }
    ],
    estimate: {
      requested_bytes: 3000,
      baseline_peak_bytes: 8192,
      achieved_bytes: 4096,
      met: false,
      slowdown: 0.05
    }
  });
}

describe('chunk editor transforms', () => {
  it('rejects documents that are not chunk-editor documents', () => {
    assert.throws(() => parseEditorDoc({ nodes: [] }), /chunk-editor/);
    assert.throws(
      () => parseEditorDoc({ nodes: [{ name: 'a', op: 'b' }], baseline: [], chunked: [1] }),
      /length/
    );
  });

  it('edits a region: edges snap to node names, chunk count and dim change, the input is kept', () => {
    const d = doc();
    assert.deepEqual(applyEdit(d, 0, 'chunks', 8)[0].chunks, 8);
    assert.equal(applyEdit(d, 0, 'x1', 2.6)[0].end, 'out');
    assert.equal(applyEdit(d, 0, 'x0', -5)[0].start, 'x');
    assert.deepEqual(applyEdit(d, 0, 'dim', 2)[0].outputs, { '<img src=x onerror=alert(1)>': 2 });
    assert.equal(d.regions[0].chunks, 4);
    const two = applyEdit(d, 0, 'x0', 0, applyEdit(d, 0, 'chunks', 2));
    assert.deepEqual(two, [{ start: 'x', end: d.regions[0].end, chunks: 2, outputs: d.regions[0].outputs }]);
    assert.throws(() => applyEdit(d, 3, 'chunks', 2), /no chunk region 3/);
    assert.deepEqual(regionEdits(d)[0].chunks, 4);
  });

  it('sends a chunk count as typed, never 0 read as 1 (the kernel refuses it and says why)', () => {
    const d = doc();
    assert.equal(applyEdit(d, 0, 'chunks', 0)[0].chunks, 0);
    assert.equal(applyEdit(d, 0, 'chunks', 2.5)[0].chunks, 2.5);
  });

  it('removes a region and adds one at the chunked peak outside every region, dims left to the kernel', () => {
    const d = doc();
    assert.deepEqual(removeRegion(d, 0), []);
    // the chunked curve peaks at node 3 ('out', 4096 bytes), outside region 1..2
    assert.deepEqual(addRegion(d, 3), [...regionEdits(d), { start: 'out', end: 'out', chunks: 3 }]);
    const full = { ...d, regions: [{ ...d.regions[0], x0: 0, x1: 3 }] };
    assert.equal(addRegion(full), null);
  });

  it('reads dragged shape edges from a plotly relayout event', () => {
    assert.deepEqual(draggedEdges({ 'shapes[0].x0': 1.2, 'shapes[0].x1': 3, 'xaxis.range[0]': 0 }), [
      [0, 'x0', 1.2],
      [0, 'x1', 3]
    ]);
    assert.deepEqual(draggedEdges({ autosize: true }), []);
  });

  it('states the chunked peak against the budget and escapes names in the figure', () => {
    const d = doc();
    assert.match(
      estimateLines(d)[0],
      /^chunked peak 4.00 KiB vs budget 2.93 KiB \(137% of it\) \(not met\)$/
    );
    const worse = { ...d, estimate: { ...d.estimate, achieved_bytes: 9000 } };
    assert.match(estimateLines(worse)[0], /\(not met\) \(no lower than unchunked: export refused\)$/);
    const fig = editorFigure(d, TEST_COLORS);
    const text = JSON.stringify(fig);
    assert.ok(!text.includes('<img'), 'untrusted names must be escaped');
    assert.ok(text.includes('&lt;img'));
    assert.equal((fig.layout.shapes as unknown[]).length, 1);
  });

  it('draws the budget as a line and marks the chunked peak (issue 18: the budget was not drawn)', () => {
    const d = doc();
    const fig = editorFigure(d, TEST_COLORS);
    const traces = fig.data as { name: string; x: number[]; y: number[] }[];
    const budget = traces.find(t => t.name.startsWith('budget'))!;
    assert.equal(budget.name, 'budget 2.93 KiB');
    assert.deepEqual(budget.y, [3000 / 1024, 3000 / 1024]);
    assert.deepEqual(budget.x, [0, d.nodes.length - 1]);
    const peak = traces.find(t => t.name.startsWith('chunked peak'))!;
    const top = Math.max(...d.chunked);
    assert.deepEqual(peak.x, [d.chunked.indexOf(top)]);
    assert.deepEqual(peak.y, [top / 1024]);
    const none = editorFigure({ ...d, estimate: { ...d.estimate, requested_bytes: null } }, TEST_COLORS);
    assert.ok(!(none.data as { name: string }[]).some(t => t.name.startsWith('budget')));
  });

  it('says which regions a scrolled list shows', () => {
    const rows = Array.from({ length: 12 }, (_, i) => ({ top: 52 * i - 60, bottom: 52 * i - 14 }));
    // scrolled 60 px down a 420 px view: row 0 is out, row 1 mostly in, rows up to 9 in view
    assert.deepEqual(visibleRows(rows, 420), [1, 8]);
    assert.equal(regionListCaption(12, [1, 8]), '12 regions: 2\u20139 in view, scroll down for more');
    assert.equal(
      regionListCaption(12, [4, 11]),
      '12 regions: 5\u201312 in view, scroll up for the first ones'
    );
    assert.equal(regionListCaption(3, [0, 2]), '3 regions');
    assert.equal(regionListCaption(1, null), '1 region');
    assert.equal(visibleRows([], 300), null);
  });

  it('puts region labels in rows so that no two overlap on the page', () => {
    // 12 regions of 8 ops every 31 ops over 400 ops (a 12-layer GPT's attention), on an 870 px plot
    const regions = Array.from({ length: 12 }, (_, i) => ({ x0: 18 + 31 * i, x1: 25 + 31 * i }));
    const texts = regions.map((_, i) => `region ${i + 1}: 4 chunks`);
    const rows = labelRows(regions, texts, 400, 800);
    assert.ok(Math.max(...rows) >= 1, 'one row cannot hold them');
    const box = (i: number): [number, number] => {
      const c = ((regions[i].x0 + regions[i].x1) / 2) * (800 / 399);
      return [c - texts[i].length * 3.5, c + texts[i].length * 3.5];
    };
    for (let i = 0; i < 12; i++) {
      for (let j = i + 1; j < 12; j++) {
        const [a, b] = [box(i), box(j)];
        assert.ok(
          rows[i] !== rows[j] || a[1] <= b[0] || b[1] <= a[0],
          `labels ${i + 1} and ${j + 1} overlap`
        );
      }
    }
    // far apart labels share the first row; the figure's top margin makes room for every row
    assert.deepEqual(
      labelRows(
        [
          { x0: 0, x1: 1 },
          { x0: 300, x1: 301 }
        ],
        ['a', 'b'],
        400,
        800
      ),
      [0, 0]
    );
    const d = doc();
    const many = {
      ...d,
      nodes: Array.from({ length: 400 }, (_, i) => ({ name: `n${i}`, op: 'mm' })),
      regions: regions.map(r => ({ ...d.regions[0], ...r }))
    };
    const fig = editorFigure(many, TEST_COLORS, 870);
    const shifts = (fig.layout.annotations as { yshift: number }[]).map(a => a.yshift);
    assert.ok(Math.max(...shifts) > 0);
    assert.ok((fig.layout.margin as { t: number }).t >= 30 + Math.max(...shifts));
  });

  it('shortens and thins the labels of 115 regions to three rows, none overlapping', () => {
    const regions = Array.from({ length: 115 }, (_, i) => ({ x0: 20 + 43 * i, x1: 27 + 43 * i, chunks: 4 }));
    const labels = regionLabels(regions, 5000, 800);
    assert.ok(labels.length > 10 && labels.length < 115);
    assert.ok(labels.every(l => l.row < 3 && l.text === String(l.index + 1)));
    const rows = labelRows(
      labels.map(l => regions[l.index]),
      labels.map(l => l.text),
      5000,
      800
    );
    assert.deepEqual(
      rows,
      labels.map(l => l.row)
    );
    // twelve fit with their full text
    assert.ok(regionLabels(regions.slice(0, 12), 600, 800).every(l => l.text.startsWith('region ')));
  });
});
