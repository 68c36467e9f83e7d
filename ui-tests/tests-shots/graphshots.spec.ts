// Scratch (not committed): Graph view screenshots with the final build.
import { expect, test } from '@jupyterlab/galata';
import { SETTINGS, openAndRunAll } from '../tests/helpers';

test.use({ mockSettings: SETTINGS, viewport: { width: 1400, height: 1000 } });
const OUT = '/work/shots';

for (const tag of ['gpt12', 'gpt100']) {
  test(`graph shots ${tag}`, async ({ page, tmpPath }) => {
    test.setTimeout(900000);
    await openAndRunAll(page, tmpPath, `${tag}_graph.ipynb`, '/tmp/g18/shots');
    const view = page.locator('.jp-memviz-plan').first();
    await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 600000 });
    await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
    const graph = view.locator('.jp-memviz-graph');
    await expect(graph.locator('svg')).toBeVisible({ timeout: 120000 });
    await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 120000 });
    await view.scrollIntoViewIfNeeded();
    await view.screenshot({ path: `${OUT}/${tag}-graph.png` });
    await graph.locator('.jp-memviz-graph-fit').click();
    await view.screenshot({ path: `${OUT}/${tag}-graph-fit.png` });
    const layer = graph.locator('svg g.node.module', { has: page.locator('title', { hasText: /^blocks\.3 \[forward\]/ }) });
    if (await layer.count()) {
      await layer.click();
      await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 120000 });
      await page.waitForTimeout(500);
      await view.screenshot({ path: `${OUT}/${tag}-graph-open-block.png` });
    }
    const search = graph.locator('.jp-memviz-graph-search');
    await search.fill('blocks.5.qkv.weight');
    await search.press('Enter');
    await page.waitForTimeout(1000);
    await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 120000 });
    await page.waitForTimeout(500);
    await view.screenshot({ path: `${OUT}/${tag}-graph-search.png` });
    const hit = graph.locator('svg g.node.jp-memviz-graph-hit > title');
    console.log(tag, 'hit tooltip:', await hit.textContent());
  });
}
