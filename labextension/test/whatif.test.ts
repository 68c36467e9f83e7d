import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import {
  WhatIfRow,
  compareFigure,
  comparisonCells,
  parseComparison,
  parseWhatIf,
  shortVerdict,
  tickText,
  wrapWords
} from '../src/whatif_data';
import { TEST_COLORS } from './colors';

const GIB = 2 ** 30;

describe('what-if transforms', () => {
  const current = parseWhatIf({
    name: 'current',
    label: 'tp2 pp1 mb4 no-recompute',
    bars: [
      { label: 'parameters', bytes: 2 * GIB },
      { label: 'activations', bytes: 6 * GIB }
    ],
    total: 8 * GIB,
    capacity: 16 * GIB,
    headroom: 8 * GIB,
    fits: true,
    verdict: 'fits: 8.00 GiB free per device',
    device: '<b>v100</b>',
    assumptions: [{ name: 'activation dtype', value: '2 B per value' }]
  });
  const pinned = parseComparison([
    {
      name: 'pinned 1',
      label: 'tp1 sp pp1 mb4 full-recompute',
      device: 'a100-40gb',
      bars: [
        { label: 'parameters', bytes: 4 * GIB },
        { label: 'activations', bytes: 40 * GIB }
      ],
      total: 44 * GIB,
      capacity: 40 * GIB,
      headroom: -4 * GIB,
      fits: false,
      verdict: 'does not fit',
      error: ''
    },
    { name: 'pinned 2', label: '', device: '', error: 'heads (16) must be divisible by tp (3)' }
  ]);
  const rows: WhatIfRow[] = [...pinned, current];

  it('draws one stacked bar per configuration from the kernel bytes, each with its capacity and verdict', () => {
    const fig = compareFigure(rows, TEST_COLORS);
    assert.equal(fig.layout.barmode, 'stack');
    const traces = fig.data as { name: string; x: string[]; y: (number | null)[] }[];
    assert.deepEqual(
      traces.map(t => t.name),
      ['parameters', 'activations']
    );
    assert.deepEqual(traces[0].x, [0, 1, 2]);
    // each bar is named by its settings, not 'pinned 1'; the device escaped
    assert.deepEqual((fig.layout.xaxis as { ticktext: string[] }).ticktext, [
      'tp1 sp pp1 mb4<br>full-recompute<br>a100-40gb',
      'pinned 2',
      'tp2 pp1 mb4<br>no-recompute<br>&lt;b&gt;v100&lt;/b&gt; · current'
    ]);
    // bytes as sent, a rejected pinned configuration has no bar
    assert.deepEqual(traces[1].y, [40, null, 6]);
    const lines = fig.layout.shapes as { x0: number; x1: number; y0: number }[];
    assert.deepEqual(
      lines.map(l => [l.y0, (l.x0 + l.x1) / 2]),
      [
        [40, 0],
        [16, 2]
      ]
    );
    const verdicts = (fig.layout.annotations as { text: string }[]).map(a => a.text);
    // each bar's total above its verdict: a bar far below its capacity is a pixel tall
    assert.deepEqual(verdicts, ['44.00 GiB<br>does not fit', 'error', '8.00 GiB<br>fits']);
    assert.ok(!JSON.stringify(fig).includes('<b>'), 'device names are escaped');
    assert.equal((fig.layout.font as { color: string }).color, TEST_COLORS.font);
  });

  it('fills the table from the kernel numbers and says why a pinned configuration failed', () => {
    assert.deepEqual(comparisonCells(pinned[0]), [
      'pinned 1',
      'tp1 sp pp1 mb4 full-recompute',
      'a100-40gb',
      '44.00 GiB',
      '40.00 GiB',
      '-4.00 GiB',
      'does not fit'
    ]);
    assert.equal(comparisonCells(pinned[1])[6], 'heads (16) must be divisible by tp (3)');
    assert.equal(comparisonCells(pinned[1])[3], '—');
    assert.equal(shortVerdict({ ...current, capacity: null, fits: null }), 'no capacity');
  });

  it('keeps the assumptions and rejects malformed answers', () => {
    assert.deepEqual(current.assumptions, [{ name: 'activation dtype', value: '2 B per value' }]);
    assert.deepEqual(parseWhatIf({ bars: [], total: 0, verdict: '' }).assumptions, []);
    assert.throws(() => parseWhatIf({ bars: [] }), /what-if/);
    assert.throws(() => parseComparison({}), /comparison/);
    assert.throws(() => parseComparison([{ label: 'x' }]), /name missing/);
  });

  it('wraps a settings name at spaces and escapes a hostile one', () => {
    assert.deepEqual(wrapWords('tp2 sp pp1 mb4 selective-recompute', 16), [
      'tp2 sp pp1 mb4',
      'selective-recompute'
    ]);
    const hostile = tickText({
      name: 'pinned 1',
      label: '<img src=x onerror=alert(1)>',
      device: 'h100',
      error: ''
    });
    assert.ok(!hostile.includes('<img'), hostile);
  });
});
