/**
 * Screenshots of every view of a plan at a given size, to look at (issue 18: "screenshots of every
 * view at 12 layers and at 5k ops are looked at").  Not a test: nothing is asserted beyond the views
 * being drawn.  MEMVIZ_SHOTS_NOTEBOOKS: comma-separated notebook paths, each showing a plan document
 * (first output) and a Planner (second); MEMVIZ_SHOTS_OUT: the folder the PNGs go to.
 */
import { expect, test } from '@jupyterlab/galata';
import * as path from 'path';

import { SETTINGS, openAndRunAll } from '../tests/helpers';

test.use({ mockSettings: SETTINGS, viewport: { width: 1280, height: 1400 } });

const OUT = process.env.MEMVIZ_SHOTS_OUT ?? 'shots';
const NOTEBOOKS = (process.env.MEMVIZ_SHOTS_NOTEBOOKS ?? '').split(',').filter(s => s);

for (const notebook of NOTEBOOKS) {
  const name = path.basename(notebook, '.ipynb');
  test(`views of ${name}`, async ({ page, tmpPath }) => {
    test.setTimeout(1200000);
    await openAndRunAll(page, tmpPath, path.basename(notebook), path.dirname(notebook));
    const shot = (el: ReturnType<typeof page.locator>, file: string) =>
      el.screenshot({ path: path.join(OUT, `${name}-${file}.png`) });
    const editor = page.locator('.jp-memviz-chunk-editor .js-plotly-plot');
    await expect(
      page.locator('.jp-memviz-plan, .jp-memviz-chunk-editor .js-plotly-plot').first()
    ).toBeVisible({
      timeout: 1100000
    });
    if (await editor.count()) {
      // a ChunkEditor: its chart and the first region rows
      await editor.scrollIntoViewIfNeeded();
      await shot(editor, 'chunk-regions');
      await shot(page.locator('.jp-memviz-chunk-editor'), 'chunk-editor');
      return;
    }
    const view = page.locator('.jp-memviz-plan').first();
    await expect(view.locator('.js-plotly-plot').first()).toBeVisible({ timeout: 600000 });
    await view.scrollIntoViewIfNeeded();
    await shot(view, 'memory');
    await view.locator('.jp-memviz-tab[data-tab="Packing"]').click();
    const packing = view.locator('.jp-memviz-tabpanel[data-tab="Packing"]');
    await expect(packing.locator('image').first()).toBeAttached({ timeout: 120000 });
    await shot(view, 'packing');
    const zoom = packing.locator('.jp-memviz-packing-zoom-changing');
    if (await zoom.isEnabled()) {
      await zoom.click();
      await page.waitForTimeout(1500);
      const box = (await packing.locator('.nsewdrag').first().boundingBox())!;
      await page.mouse.move(box.x + box.width * 0.62, box.y + box.height * 0.3);
      await page.waitForTimeout(300);
      await shot(view, 'packing-changing');
    }
    await view.locator('.jp-memviz-tab[data-tab="Graph"]').click();
    const graph = view.locator('.jp-memviz-graph');
    await expect(graph.locator('svg')).toBeVisible({ timeout: 300000 });
    await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 300000 });
    await shot(view, 'graph');
    // point at the first forward block: its phase-crossing edges light up
    const block = graph
      .locator('g.node.module')
      .filter({ has: page.locator('title', { hasText: /\[forward\]/ }) });
    if ((await block.count()) > 2) {
      await block.nth(2).hover();
      await page.waitForTimeout(300);
      await shot(view, 'graph-hover');
    }
    await graph.locator('.jp-memviz-graph-fit').click();
    await shot(view, 'graph-fit');
    const planner = page.locator('.jp-memviz-planner').first();
    await expect(planner.locator('.js-plotly-plot').first()).toBeVisible({ timeout: 600000 });
    await planner.scrollIntoViewIfNeeded();
    await shot(planner, 'planner');
  });
}
