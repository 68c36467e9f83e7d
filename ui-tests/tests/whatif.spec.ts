import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// whatif.ipynb: memviz.WhatIf on a GPT2Config (24 layers, hidden 2048, seq 2048, micro-batch 4, bf16) on
// an A100 40 GB, shown twice.  Issue 18 item 7: pinned configurations side by side, each estimate from
// the kernel, the assumptions shown, the config's name as text.
test('what-if compares pinned configurations side by side and shows its assumptions', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000);
  await openAndRunAll(page, tmpPath, 'whatif.ipynb');

  const panel = page.locator('.jp-memviz-whatif').first();
  const other = page.locator('.jp-memviz-whatif').nth(1);
  await expect(panel.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  const verdict = panel.locator('.jp-memviz-whatif-verdict');
  await expect(verdict).toContainText('does not fit');

  // the user's config name is text: no element made from it, no script run
  await expect(panel.locator('.jp-memviz-whatif-config')).toContainText(
    '<img src=x onerror="window.memvizInjected = 1">gpt-1.3b · layers 24'
  );
  expect(await page.locator('.jp-memviz-whatif img').count()).toBe(0);
  expect(await page.evaluate(() => (window as unknown as Record<string, unknown>).memvizInjected)).toBe(
    undefined
  );

  // the assumptions, as solvers.analytic states them
  const assumptions = panel.locator('.jp-memviz-whatif-assumptions');
  await expect(assumptions).toContainText('fp32 master weights');
  await expect(assumptions).toContainText('34sbh + 5as^2b');
  // GPT-2's 50257 tokens padded as Megatron pads them (a multiple of 128 x tp), not refused for tp > 1
  await expect(assumptions).toContainText('vocab 50257 padded to 50304');

  const rows = panel.locator('.jp-memviz-whatif-row');
  const ticks = panel.locator('.xtick');
  await expect(rows).toHaveCount(1);

  // pin TP 1 (does not fit), then TP 2 (fits), then move the control on to TP 4
  await panel.locator('.jp-memviz-whatif-pin').click();
  await expect(rows).toHaveCount(2, { timeout: 30000 });
  const tp = panel.locator('.jp-memviz-whatif-tp');
  await tp.selectOption('2');
  await expect(verdict).toContainText('fits: 6.06 GiB free');
  await expect(assumptions).toContainText(
    'vocab 50257 padded to 50432 (Megatron: a multiple of 128 x t = 256)'
  );
  await expect(panel.locator('.jp-memviz-whatif-error')).toHaveText('');
  await panel.locator('.jp-memviz-whatif-pin').click();
  await expect(rows).toHaveCount(3, { timeout: 30000 });
  await tp.selectOption('4');
  await expect(rows.nth(2)).toContainText('tp4', { timeout: 30000 });

  // three bars (one per configuration, four categories each), each with its verdict
  await expect(ticks).toHaveCount(3);
  await expect(panel.locator('.barlayer path')).toHaveCount(12);
  await expect(rows.nth(0)).toContainText('tp1 pp1 mb4 no-recompute');
  await expect(rows.nth(0).locator('td').nth(6)).toHaveText('does not fit');
  await expect(rows.nth(1)).toContainText('tp2 pp1 mb4 no-recompute');
  await expect(rows.nth(1).locator('td').nth(6)).toHaveText('fits');
  // each bar is named by its settings and device, not "pinned 1"
  await expect(ticks).toHaveText([
    'tp1 pp1 mb4no-recomputea100-40gb',
    'tp2 pp1 mb4no-recomputea100-40gb',
    'tp4 pp1 mb4no-recomputea100-40gb · current'
  ]);
  await expect(rows.nth(2).locator('td').nth(6)).toHaveText('fits');
  // the total above each verdict, as the table has it (plotly draws the two lines as one text)
  const totals = await Promise.all([0, 1, 2].map(i => rows.nth(i).locator('td').nth(3).innerText()));
  await expect(panel.locator('.annotation-text')).toHaveText([
    `${totals[0]}does not fit`,
    `${totals[1]}fits`,
    `${totals[2]}fits`
  ]);
  await panel
    .locator('.jp-memviz-whatif-plot')
    .screenshot({ path: test.info().outputPath('whatif-compare.png') });
  await panel
    .locator('.jp-memviz-whatif-compare')
    .screenshot({ path: test.info().outputPath('whatif-compare-table.png') });
  await assumptions.screenshot({ path: test.info().outputPath('whatif-assumptions.png') });

  // the pins live in the widget's model: the second view of it shows them too
  await expect(other.locator('.jp-memviz-whatif-row')).toHaveCount(3);

  // remove the first pinned configuration
  await rows.nth(0).locator('.jp-memviz-whatif-unpin').click();
  await expect(rows).toHaveCount(2, { timeout: 30000 });
  await expect(rows.nth(0)).toContainText('tp2');
  await expect(ticks).toHaveCount(2);
  await expect(other.locator('.jp-memviz-whatif-row')).toHaveCount(2);
  await panel.screenshot({ path: test.info().outputPath('whatif-unpinned.png') });

  // an fp32 model (issue 18: its assumptions said "2 B/param", mixed precision's): fp32 weights and
  // gradients, Adam's two fp32 moments and no master copy, as the kernel decides
  const fp32 = page.locator('.jp-memviz-whatif').nth(2).locator('.jp-memviz-whatif-assumptions');
  await fp32.scrollIntoViewIfNeeded();
  const value = (name: string) =>
    fp32.locator('dt', { hasText: new RegExp(`^${name}$`) }).locator('xpath=following-sibling::dd[1]');
  await expect(value('activation dtype')).toHaveText('4 B per value');
  await expect(value('parameters')).toHaveText('4 B per parameter');
  await expect(value('gradients')).toHaveText('4 B per parameter');
  await expect(value('optimizer state')).toHaveText(
    '8 B per parameter = 4 (fp32 Adam first moment) + 4 (fp32 Adam second moment)'
  );
  await fp32.screenshot({ path: test.info().outputPath('whatif-fp32-assumptions.png') });
});
