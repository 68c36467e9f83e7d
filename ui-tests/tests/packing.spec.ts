import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// packing.ipynb shows a 10,000-tensor plan: the packing tab must stay interactive at that size (the
// rectangles are a few WebGL polygon traces, not 10k plotly shapes).  The render time is a benchmark:
// printed, not asserted tightly.
test('the packing tab draws 10k tensors, planned and allocator side by side', async ({ page, tmpPath }) => {
  await openAndRunAll(page, tmpPath, 'packing.ipynb');

  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.jp-memviz-tabpanel[data-tab="Memory"] .js-plotly-plot')).toBeVisible({
    timeout: 120000
  });
  // Registered views (the CD graph) follow the two built-in tabs.
  await expect(view.locator('.jp-memviz-tab').nth(0)).toHaveText('Memory');
  await expect(view.locator('.jp-memviz-tab').nth(1)).toHaveText('Packing');

  // Time from the click to the drawn packing chart (plotly is already loaded by the memory tab).
  const ms = await page.evaluate(async () => {
    const root = document.querySelector('.jp-memviz-plan')!;
    const frame = (): Promise<void> => new Promise(r => requestAnimationFrame(() => r()));
    const t0 = performance.now();
    (root.querySelector('.jp-memviz-tab[data-tab="Packing"]') as HTMLElement).click();
    const panel = root.querySelector('.jp-memviz-tabpanel[data-tab="Packing"]')!;
    while (!panel.querySelector('.xtick') || !panel.querySelector('canvas')) {
      await frame();
    }
    await frame();
    return performance.now() - t0;
  });
  console.log(`packing chart, 10001 planned tensors + 10001 allocator blocks: ${ms.toFixed(0)} ms to draw`);
  expect(ms).toBeLessThan(10000);

  const packing = view.locator('.jp-memviz-tabpanel[data-tab="Packing"]');
  await expect(packing.locator('.annotation-text').first()).toContainText('planned packing');
  await expect(packing.locator('.annotation-text').nth(1)).toContainText('caching allocator');
  await expect(view.locator('.jp-memviz-tabpanel[data-tab="Memory"]')).toBeHidden();
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  await packing.screenshot({ path: test.info().outputPath('packing.png') });

  await page.theme.setDarkTheme();
  await view.locator('.jp-memviz-tab[data-tab="Memory"]').click();
  await view.locator('.jp-memviz-tab[data-tab="Packing"]').click();
  await packing.screenshot({ path: test.info().outputPath('packing-dark.png') });
  await view.locator('.jp-memviz-tab[data-tab="Memory"]').click();
  await view.screenshot({ path: test.info().outputPath('memory-dark.png') });
});
