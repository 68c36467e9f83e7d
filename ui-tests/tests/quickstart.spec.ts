import { expect, test } from '@jupyterlab/galata';
import * as path from 'path';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// The user's first notebook, examples/quickstart.ipynb, exactly as shipped (with the models.py it
// imports): profile, plan at 60%, the plan's chart, the interactive planner, export and the 3-step check.
test('the quickstart notebook runs: plan chart, planner and an exact export', async ({ page, tmpPath }) => {
  const examples = path.resolve(__dirname, '..', '..', 'examples');
  await page.contents.uploadFile(path.join(examples, 'models.py'), `${tmpPath}/models.py`);
  await openAndRunAll(page, tmpPath, 'quickstart.ipynb', 'examples');

  // The plan's MIME bundle: a memory chart whose peak readout says how far below eager it is.
  const chart = page.locator('.jp-memviz-plan').first();
  await expect(chart.locator('.js-plotly-plot')).toBeVisible({ timeout: 180000 });
  await expect(chart.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value')).toHaveText(
    /MiB \(-\d+\.\d% vs eager .* MiB\)/
  );

  // The planner widget with its slider, and the last cell's check that the export is exact.
  const planner = page.locator('.jp-memviz-planner');
  await expect(planner.locator('.js-plotly-plot')).toBeVisible({ timeout: 180000 });
  await expect(planner.locator('.jp-memviz-budget-slider')).toBeEnabled();
  // (the cell's source holds the same words: look in its output)
  const ok = page.locator('.jp-OutputArea-output', { hasText: 'QUICKSTART OK: exported outputs' });
  await expect(ok).toContainText('equal the original over 3 steps', { timeout: 180000 });
  await page.screenshot({ path: test.info().outputPath('quickstart.png') });
});
