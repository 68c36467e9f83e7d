import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import { themedAxis, themedLayout } from '../src/theme';
import { TEST_COLORS } from './colors';

describe('theme', () => {
  it('builds every chart background, font and axis from the theme colors', () => {
    assert.deepEqual(themedLayout(TEST_COLORS), {
      paper_bgcolor: 'rgba(0,0,0,0)',
      plot_bgcolor: 'rgba(0,0,0,0)',
      font: { color: '#010101', family: 'serif' }
    });
    assert.deepEqual(themedAxis(TEST_COLORS), {
      color: '#010101',
      gridcolor: '#030303',
      zerolinecolor: '#030303'
    });
  });
});
