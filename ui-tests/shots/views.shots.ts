/**
 * Screenshots of every view of a plan at a given size, to look at (issue 18: "screenshots of every
 * view at 12 layers and at 5k ops are looked at").  Not a test: nothing is asserted beyond the views
 * being drawn.  MEMVIZ_SHOTS_NOTEBOOKS: comma-separated notebook paths, each showing either a plan
 * document (first output) and a Planner (second), or a ChunkEditor, or a WhatIf; MEMVIZ_SHOTS_REPORTS:
 * comma-separated offline report files (`memviz report`); MEMVIZ_SHOTS_OUT: the folder the PNGs go to.
 */
import { expect, test } from '@jupyterlab/galata';
import * as path from 'path';
import { pathToFileURL } from 'url';

import { SETTINGS, openAndRunAll } from '../tests/helpers';

test.use({ mockSettings: SETTINGS, viewport: { width: 1280, height: 1400 } });

const OUT = process.env.MEMVIZ_SHOTS_OUT ?? 'shots';
const NOTEBOOKS = (process.env.MEMVIZ_SHOTS_NOTEBOOKS ?? '').split(',').filter(s => s);
const REPORTS = (process.env.MEMVIZ_SHOTS_REPORTS ?? '').split(',').filter(s => s);

for (const report of REPORTS) {
  const name = path.basename(report, '.html');
  test(`views of the report ${name}`, async ({ context }) => {
    test.setTimeout(600000);
    // a plain page: galata's own resolves every address against JupyterLab's
    const page = await context.newPage();
    await page.setViewportSize({ width: 1280, height: 1000 });
    await page.goto(pathToFileURL(report).href);
    const view = page.locator('.jp-memviz-plan');
    await expect(view.locator('.js-plotly-plot').first()).toBeVisible({ timeout: 300000 });
    await page.screenshot({ path: path.join(OUT, `${name}-report-memory.png`), fullPage: true });
    await view.locator('.jp-memviz-tab[data-tab="Packing"]').click();
    await expect(view.locator('.jp-memviz-tabpanel[data-tab="Packing"] image').first()).toBeAttached({
      timeout: 120000
    });
    await page.screenshot({ path: path.join(OUT, `${name}-report-packing.png`) });
    await view.locator('.jp-memviz-tab[data-tab="Graph"]').click();
    const graph = view.locator('.jp-memviz-graph');
    await expect(graph.locator('svg')).toBeVisible({ timeout: 300000 });
    await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 300000 });
    await page.screenshot({ path: path.join(OUT, `${name}-report-graph.png`) });
  });
}

for (const notebook of NOTEBOOKS) {
  const name = path.basename(notebook, '.ipynb');
  test(`views of ${name}`, async ({ page, tmpPath }) => {
    test.setTimeout(1200000);
    await openAndRunAll(page, tmpPath, path.basename(notebook), path.dirname(notebook));
    const shot = (el: ReturnType<typeof page.locator>, file: string) =>
      el.screenshot({ path: path.join(OUT, `${name}-${file}.png`) });
    const editor = page.locator('.jp-memviz-chunk-editor .js-plotly-plot');
    // the first WhatIf (a notebook may show one panel twice)
    const whatif = page.locator('.jp-memviz-whatif').first();
    await expect(
      page
        .locator(
          '.jp-memviz-plan, .jp-memviz-chunk-editor .js-plotly-plot, .jp-memviz-whatif .js-plotly-plot'
        )
        .first()
    ).toBeVisible({
      timeout: 1100000
    });
    if (await editor.count()) {
      // a ChunkEditor: its chart and the first region rows (a notebook may show a WhatIf after it)
      await editor.first().scrollIntoViewIfNeeded();
      await shot(editor.first(), 'chunk-regions');
      await shot(page.locator('.jp-memviz-chunk-editor').first(), 'chunk-editor');
      if (!(await whatif.count())) {
        return;
      }
    }
    if (await whatif.count()) {
      // a WhatIf: the first configuration, then it and three more pinned side by side (recompute
      // selective, then TP 2 with sequence parallelism: GPT-2's 50257 tokens padded as Megatron pads them)
      await whatif.scrollIntoViewIfNeeded();
      await shot(whatif, 'whatif');
      const rows = whatif.locator('.jp-memviz-whatif-row');
      const steps: [string, string, string][] = [
        ['.jp-memviz-whatif-recompute', 'selective', 'selective-recompute'],
        ['.jp-memviz-whatif-tp', '2', 'tp2'],
        ['.jp-memviz-whatif-recompute', 'full', 'full-recompute']
      ];
      for (const [control, value, label] of steps) {
        const count = await rows.count();
        await whatif.locator('.jp-memviz-whatif-pin').click({ timeout: 60000 });
        await expect(rows).toHaveCount(count + 1, { timeout: 60000 });
        await whatif.locator(control).selectOption(value, { timeout: 60000 });
        await expect(rows.last()).toContainText(label, { timeout: 60000 });
      }
      await whatif.locator('.jp-memviz-whatif-sp').check({ timeout: 60000 });
      await expect(rows.last()).toContainText('tp2 sp', { timeout: 60000 });
      await shot(whatif, 'whatif-compare');
      return;
    }
    const view = page.locator('.jp-memviz-plan').first();
    await expect(view.locator('.js-plotly-plot').first()).toBeVisible({ timeout: 600000 });
    await view.scrollIntoViewIfNeeded();
    await shot(view, 'memory');
    // point into the backward (60% across the plot): the hover names the step's op and module and
    // breaks the memory down by module
    const plot = view.locator('.js-plotly-plot .nsewdrag').first();
    const area = await plot.boundingBox();
    if (area) {
      await page.mouse.move(area.x + area.width * 0.6, area.y + area.height * 0.5);
      await page.waitForTimeout(500);
      await shot(view, 'memory-hover');
      await page.mouse.move(0, 0);
    }
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
      // dispatched: the view lands on the phases' boundary, the block may lie outside the canvas
      await block.nth(2).locator('path, polygon').first().dispatchEvent('pointerover', { bubbles: true });
      await page.waitForTimeout(300);
      await shot(view, 'graph-hover');
    }
    await graph.locator('.jp-memviz-graph-fit').click();
    await shot(view, 'graph-fit');
    if ((await graph.getAttribute('data-fit')) !== 'whole') {
      // Fit stopped at the readable floor: what the whole drawing is, zoomed out below it
      for (let i = 0; i < 4; i++) {
        await graph.locator('.jp-memviz-graph-zoom-out').click();
      }
      await shot(view, 'graph-zoomed-out');
      await graph.locator('.jp-memviz-graph-fit').click();
    }
    // a click as the view takes it (pointer down and up on the node's shape), wherever the node lies
    const press = (node: ReturnType<typeof page.locator>) =>
      node
        .locator('path, polygon')
        .first()
        .evaluate(el => {
          for (const type of ['pointerdown', 'pointerup']) {
            el.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
          }
        });
    const laidOut = () => expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 300000 });
    // open that block (its twin in the backward opens with it): the view lands on the two, readable
    if ((await block.count()) > 2) {
      const id = (await block.nth(2).getAttribute('id'))!;
      await press(block.nth(2));
      await expect(graph.locator(`g.cluster#${id}`)).toBeAttached({ timeout: 300000 });
      await laidOut();
      await shot(view, 'graph-open-twins');
      // closed again (a click on its frame): the overview
      await press(graph.locator(`g.cluster#${id}`));
      await expect(graph.locator(`g.node#${id}`)).toBeAttached({ timeout: 300000 });
      await laidOut();
    }
    // the repeated blocks, from the collapsed overview: the forward's counted node unrolled (one closed
    // node per block, both phases; the view slides to show the first block), then that block opened
    const run = graph
      .locator('g.node.run')
      .filter({ has: page.locator('title', { hasText: /\[forward\]/ }) })
      .first();
    // a model whose blocks' container opens closed (examples.models' GPT names it "blocks"; 92 layers
    // did before runs cost one node, graph_tree.ts runOpenCost): opened, it shows the counted node
    const container = graph
      .locator('g.node.module')
      .filter({ has: page.locator(':scope > title', { hasText: /^blocks \[forward\]/ }) });
    if (!(await run.count()) && (await container.count())) {
      await press(container.first());
      await expect(run).toHaveCount(1, { timeout: 300000 });
      await laidOut();
      await shot(view, 'graph-open-blocks');
    }
    if (await run.count()) {
      const first = ((await run.locator(':scope > title').textContent()) ?? '').split(' .. ')[0];
      await press(run);
      const member = graph
        .locator('g.node.module')
        .filter({ has: page.locator(':scope > title', { hasText: `${first} [forward]` }) });
      await expect(member).toHaveCount(1, { timeout: 300000 });
      await laidOut();
      await shot(view, 'graph-unrolled');
      await graph.locator('.jp-memviz-graph-fit').click();
      await shot(view, 'graph-unrolled-fit');
      const id = (await member.getAttribute('id'))!;
      await press(member);
      await expect(graph.locator(`g.cluster#${id}`)).toBeAttached({ timeout: 300000 });
      await laidOut();
      await shot(view, 'graph-open-block');
    }
    const planner = page.locator('.jp-memviz-planner').first();
    if (!(await planner.count())) {
      return; // a notebook showing the plan alone
    }
    await expect(planner.locator('.js-plotly-plot').first()).toBeVisible({ timeout: 600000 });
    await planner.scrollIntoViewIfNeeded();
    await shot(planner, 'planner');
    // one budget change, as a user makes it: the slider one frontier point down (the keyboard), then
    // the re-planned view once the kernel's answer and any refining solve are drawn
    const pending = /jp-mod-(pending|solving)/;
    await expect(planner).not.toHaveClass(pending, { timeout: 600000 });
    await planner.locator('.jp-memviz-budget-slider').focus();
    await page.keyboard.press('ArrowLeft');
    await expect(planner).not.toHaveClass(pending, { timeout: 600000 });
    await page.waitForTimeout(500);
    await shot(planner, 'planner-budget');
  });
}
