import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import { parseWhatIf, whatIfFigure } from '../src/whatif_data';
import { TEST_COLORS } from './colors';

const GIB = 2 ** 30;

describe('what-if transforms', () => {
  const result = parseWhatIf({
    bars: [
      { label: 'parameters', bytes: 2 * GIB },
      { label: 'activations', bytes: 6 * GIB }
    ],
    total: 8 * GIB,
    capacity: 16 * GIB,
    fits: true,
    verdict: 'fits: 8.00 GiB free per device',
    device: '<b>v100</b>'
  });

  it('stacks the kernel bytes without recomputing them and draws the capacity line', () => {
    const fig = whatIfFigure(result, TEST_COLORS);
    assert.equal(fig.layout.barmode, 'stack');
    assert.deepEqual(
      (fig.data as { y: number[] }[]).map(t => t.y[0]),
      [2, 6]
    );
    const [line] = fig.layout.shapes as { y0: number }[];
    assert.equal(line.y0, 16);
    assert.equal((line as unknown as { line: { color: string } }).line.color, TEST_COLORS.error);
    assert.equal((fig.layout.font as { color: string }).color, TEST_COLORS.font);
    assert.ok(!JSON.stringify(fig).includes('<b>'), 'device names are escaped');
  });

  it('omits the capacity line without a preset and rejects malformed results', () => {
    const fig = whatIfFigure({ ...result, capacity: null, fits: null }, TEST_COLORS);
    assert.deepEqual(fig.layout.shapes, []);
    assert.throws(() => parseWhatIf({ bars: [] }), /what-if/);
  });
});
