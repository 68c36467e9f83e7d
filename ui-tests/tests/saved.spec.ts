import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// planner_saved.ipynb: a memviz.Planner on a 13-layer MLP, then the kernel moves its slider to the
// frontier's largest budget (no recomputation).  Saved and reopened on a fresh kernel (no widget model),
// the output draws that last plan, static, instead of "Error displaying widget: model not found".
test('a saved Planner without its kernel renders its last plan', async ({ page, tmpPath }) => {
  test.setTimeout(300000);
  await openAndRunAll(page, tmpPath, 'planner_saved.ipynb');

  const live = page.locator('.jp-memviz-planner');
  await expect(live.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  const strategy = (root: ReturnType<typeof page.locator>) =>
    root.locator('.jp-memviz-readout[data-readout="strategy"] .jp-memviz-readout-value');
  const peak = (root: ReturnType<typeof page.locator>) =>
    root.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value');
  // the kernel's move reached the view: the last plan is the eager one (auto's choice there)
  await expect(strategy(live)).toHaveText('none (chosen by auto)', { timeout: 120000 });
  await expect(page.locator('.jp-memviz-refining')).toBeEmpty({ timeout: 60000 });
  const lastPeak = await peak(live).textContent();
  expect(lastPeak).toMatch(/\(\+0\.0% vs eager/);
  await page.waitForTimeout(1500); // the view keeps the plan it shows in the output (debounced)
  // (galata's notebook.save() looks for the current tab by role and also finds the plan view's tabs)
  await page
    .locator('.jp-Notebook')
    .first()
    .click({ position: { x: 5, y: 5 } });
  await page.keyboard.press('Control+s');
  const title = page.locator('.lm-TabBar-tab', { hasText: 'planner_saved.ipynb' });
  await expect(title).not.toHaveClass(/jp-mod-dirty/, { timeout: 30000 });

  // no widget model any more: shut the kernel down and open the notebook again
  const kernels = await (await page.request.get('/api/kernels')).json();
  for (const kernel of kernels as { id: string }[]) {
    await page.request.delete(`/api/kernels/${kernel.id}`);
  }
  await page.reload({ waitForIsReady: false } as Parameters<typeof page.reload>[0]);
  await page.locator('#jupyterlab-splash').waitFor({ state: 'detached' });
  await page.notebook.activate('planner_saved.ipynb');

  const snapshot = page.locator('.jp-memviz-snapshot');
  await expect(snapshot.locator('.jp-memviz-snapshot-note')).toContainText('no kernel', { timeout: 60000 });
  await expect(snapshot.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  await expect(strategy(snapshot)).toHaveText('none');
  await expect(peak(snapshot)).toHaveText(lastPeak ?? '');
  await expect(page.getByText('Error displaying widget')).toHaveCount(0);
  await expect(page.locator('.jp-memviz-planner')).toHaveCount(0);
  await snapshot.screenshot({ path: test.info().outputPath('planner-saved.png') });
});
