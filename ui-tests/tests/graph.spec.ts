import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

test('the Graph tab draws the CD-graph colored by the plan; clicking a compute marks its step', async ({
  page,
  tmpPath
}) => {
  await openAndRunAll(page, tmpPath, 'graph.ipynb');

  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();

  const graph = view.locator('.jp-memviz-graph');
  const svg = graph.locator('svg');
  await expect(svg).toBeVisible({ timeout: 60000 });
  // 19 computes + 26 data nodes of the notebook's 6-layer chain; rotor at its minimum recomputes 4 ops
  await expect(svg.locator('g.node')).toHaveCount(19 + 26);
  const recomputed = svg.locator('g.node.recomputed');
  expect(await recomputed.count()).toBe(4);
  await expect(recomputed.first().locator('path, polygon').first()).toHaveAttribute('fill', '#ffb74d');
  expect(await svg.locator('g.node.freed_early').count()).toBeGreaterThan(0);
  // the legend names every fate; hostile names are text in the SVG, never elements
  await expect(graph.locator('.jp-memviz-graph-legend')).toContainText('computed more than once');
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  await expect(svg.locator('g.node#c2 text').first()).toContainText('<img src=x onerror=alert(1)>"];evil');
  await graph.screenshot({ path: test.info().outputPath('graph.png') });

  // wheel zoom scales the stage
  const stage = svg.locator('xpath=..');
  const box = await graph.locator('.jp-memviz-graph-canvas').boundingBox();
  await page.mouse.move(box!.x + 100, box!.y + 100);
  await page.mouse.wheel(0, -300);
  await expect.poll(() => stage.evaluate(el => (el as HTMLElement).style.transform)).toContain('scale(');

  // clicking a recomputed compute switches to the memory chart with its step marked
  await recomputed.first().click();
  await expect(view.locator('.js-plotly-plot')).toBeVisible();
  await expect(graph).toBeHidden();
  await view.screenshot({ path: test.info().outputPath('graph-click-memory.png') });
});
