import { IJupyterLabPageFixture, expect, test } from '@jupyterlab/galata';
import type { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// the readable floor of a fitted drawing (graph_data.ts: 8 px / (10 pt * 4/3))
const FIT_MIN_SCALE = 0.6;
// a notebook's output in JupyterLab's default layout on a 1280 px screen (a 250 px file browser)
const OUTPUT_PX = 848;

/** Runs `notebook` (in `folder`, helpers' default if none) in an `OUTPUT_PX` wide output and opens its
 * plan's Graph tab, laid out. */
async function openGraphTab(
  page: IJupyterLabPageFixture,
  tmpPath: string,
  notebook: string,
  folder?: string
): Promise<{ graph: Locator; svg: Locator; canvas: Locator }> {
  await page.setViewportSize({ width: 1280, height: 900 });
  await openAndRunAll(page, tmpPath, notebook, folder);
  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  // The 848 px output these tests are about: after openAndRunAll's reload JupyterLab restores its left
  // sidebar at 250 px in most runs but at 316 px in some (ci35, ci36 and a local full run: a 782 px
  // output, where block 3 opened beside its twin, 823 px at the readable floor, cannot land whole and
  // its forward frame was cut 22 px).  The screen is widened by what the sidebar took.
  const output = async () => Math.round((await view.boundingBox())!.width);
  const width = await output();
  if (width !== OUTPUT_PX) {
    await page.setViewportSize({ width: 1280 + OUTPUT_PX - width, height: 900 });
  }
  await expect.poll(output).toBe(OUTPUT_PX);
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
  const graph = view.locator('.jp-memviz-graph');
  const svg = graph.locator('svg');
  await expect(svg).toBeVisible({ timeout: 60000 });
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
  return { graph, svg, canvas: graph.locator('.jp-memviz-graph-canvas') };
}

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
  // 19 ops + 20 drawn tensors of the notebook's 6-layer chain (its 6 parameters are named in tooltips,
  // not drawn); rotor at its minimum recomputes 4 ops
  await expect(svg.locator('g.node')).toHaveCount(19 + 20);
  const recomputed = svg.locator('g.node.recomputed');
  expect(await recomputed.count()).toBe(4);
  await expect(recomputed.first().locator('path, polygon').first()).toHaveAttribute('fill', '#ffb74d');
  expect(await svg.locator('g.node.freed_early').count()).toBeGreaterThan(0);
  // the legend names every fate; hostile names are text in the SVG, never elements
  await expect(graph.locator('.jp-memviz-graph-legend')).toContainText('computed more than once');
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  await expect(svg.locator('g.node#c2 text').first()).toContainText('<img src=x onerror=alert(1)>"];evil');
  // the tooltip is the op's real name, what it reads and writes, never the internal id
  const tip = svg.locator('g.node#c2 > title');
  await expect(tip).toContainText('<img src=x onerror=alert(1)>"];evil');
  await expect(tip).toContainText('reads: ');
  await expect(tip).toContainText('w2');
  await expect(svg.locator('g.node#d0 > title')).toContainText('x: input');
  await graph.screenshot({ path: test.info().outputPath('graph.png') });

  // Fit: this chain (forward and backward in one tall column) would need a scale under the label floor
  // (0.6: 10 pt labels at 8 px) to show whole, so Fit shows the most of it that stays readable, at the
  // floor, and says so
  await graph.locator('.jp-memviz-graph-fit').click();
  await expect(graph).toHaveAttribute('data-fit', 'readable');
  await expect(graph.locator('.jp-memviz-graph-fit-note')).toContainText(
    /^Fit: the smallest readable scale, 60%/
  );
  const k = Number(await graph.getAttribute('data-scale'));
  expect(k).toBeCloseTo(FIT_MIN_SCALE, 3);
  const [c, d] = [
    (await graph.locator('.jp-memviz-graph-canvas').boundingBox())!,
    (await svg.boundingBox())!
  ];
  expect(d.x).toBeGreaterThanOrEqual(c.x - 1);
  expect(d.x + d.width).toBeLessThanOrEqual(c.x + c.width + 1);

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

test('a 5.4k-op graph opens by module: open and close on click, search, real tooltips, fit, no freeze', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000);
  await openAndRunAll(page, tmpPath, 'graph_scale.ipynb');
  await expect(page.locator('.jp-memviz-plan')).toHaveCount(2, { timeout: 120000 });
  const view = page.locator('.jp-memviz-plan').nth(1);
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
  const graph = view.locator('.jp-memviz-graph');
  const svg = graph.locator('svg');
  await expect(svg).toBeVisible({ timeout: 60000 });

  // collapsed by module: a few modules and ops, not 14k nodes (the layers' runs and the mixer of both
  // phases)
  const modules = svg.locator('g.node.module');
  expect(await modules.count()).toBeGreaterThanOrEqual(4);
  expect(await svg.locator('g.node').count()).toBeLessThanOrEqual(150);
  await expect(graph.locator('.jp-memviz-graph-status')).toContainText('modules closed');
  // a module opens with its twins in the other phases or stays closed with them: the 110 layers of
  // both phases are one counted node each, so their container opens (it stayed one closed box, its
  // 110 members counted one by one against the glance, issue 18)
  const phaseLayers = (phase: string) =>
    modules.filter({ has: page.locator('title', { hasText: new RegExp(`^layers \\[${phase}\\]`) }) });
  await expect(phaseLayers('forward')).toHaveCount(0);
  await expect(phaseLayers('backward')).toHaveCount(0);
  await graph.screenshot({ path: test.info().outputPath('graph-scale-twins.png') });
  // it lands readable (labels >= 8 px) with the forward and the backward both in view (it opened at
  // its top-left corner, the backward cut off, issue 18)
  const canvas = graph.locator('.jp-memviz-graph-canvas');
  const inView = async (el: ReturnType<typeof svg.locator>): Promise<boolean> => {
    const [c, b] = [(await canvas.boundingBox())!, (await el.boundingBox())!];
    return b.x < c.x + c.width && b.x + b.width > c.x && b.y < c.y + c.height && b.y + b.height > c.y;
  };
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  const phase = (name: string) =>
    svg
      .locator('g.cluster, g.node.module')
      .filter({ has: page.locator(':scope > title', { hasText: new RegExp(`^${name} \\(`) }) });
  for (const name of ['forward', 'backward']) {
    expect(await inView(phase(name).first()), `${name} in view`).toBe(true);
  }
  // the forward left of the backward, always (dot sometimes drew the backward column left here)
  const phaseX = async (name: string) => (await phase(name).first().boundingBox())!.x;
  expect(await phaseX('forward')).toBeLessThan(await phaseX('backward'));
  const layer = modules.filter({ has: page.locator('title', { hasText: 'layers.57 [forward]' }) });
  await expect(layer).toHaveCount(0);
  const press = async (el: ReturnType<typeof svg.locator>): Promise<void> =>
    el
      .locator('path, polygon')
      .first()
      .evaluate(e => {
        for (const type of ['pointerdown', 'pointerup']) {
          e.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
        }
      });
  // the 110 alike layers of each phase are one counted node (issue 18), a click draws them
  const runs = svg.locator('g.node.run');
  const run = (phase: string) =>
    runs.filter({
      has: page.locator(':scope > title', {
        hasText: new RegExp(`^layers\\.0 \\.\\. layers\\.109 \\[${phase}\\]`)
      })
    });
  await expect(run('forward')).toHaveCount(1, { timeout: 60000 });
  await expect(run('backward')).toHaveCount(1);
  await expect(run('forward')).toContainText('110 x layers [0..109]');
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
  await press(run('forward'));
  await expect(layer).toHaveCount(1, { timeout: 60000 });
  await expect(runs).toHaveCount(0);
  // the click unrolled the backward's layers with the forward's: both phases show their 110 layers
  await expect(modules.locator('title', { hasText: /^layers\.57 \[backward\]/ })).toHaveCount(1);
  // and lands on what it opened, readable: both 110-layer frames across the view from their top, not
  // the two frames fitted whole at a 2% scale (issue 18)
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  const layerFrames = svg
    .locator('g.cluster')
    .filter({ has: page.locator(':scope > title', { hasText: /^layers \[(forward|backward)\]/ }) });
  await expect(layerFrames).toHaveCount(2);
  const c0 = (await canvas.boundingBox())!;
  for (const frame of await layerFrames.all()) {
    const b = (await frame.boundingBox())!;
    expect(b.x).toBeGreaterThanOrEqual(c0.x - 1);
    expect(b.x + b.width).toBeLessThanOrEqual(c0.x + c0.width + 1);
    expect(b.y).toBeGreaterThanOrEqual(c0.y - 1);
    expect(b.y).toBeLessThan(c0.y + c0.height / 2);
  }
  await graph.screenshot({ path: test.info().outputPath('graph-scale-twins-opened.png') });
  await expect(layer.locator('title')).toContainText('ops, 0 recomputed');
  expect(await modules.locator('title').allTextContents()).not.toContain(expect.stringMatching(/^[cdm]\d+$/));

  // Fit honours a minimum label size (issue 18): this drawing whole would put its 10 pt labels under
  // 8 px, so Fit shows the most of it that stays readable (the phases' ladder is narrow: its whole
  // width) and says so; the user pans the rest.  Zoom in magnifies, Fit comes back, zoom out still
  // goes lower.
  const fit = graph.locator('.jp-memviz-graph-fit');
  const note = graph.locator('.jp-memviz-graph-fit-note');
  await fit.click();
  const kind = await graph.getAttribute('data-fit');
  expect(kind).toBe('readable');
  const fitted = Number(await graph.getAttribute('data-scale'));
  expect(fitted).toBeCloseTo(FIT_MIN_SCALE, 3);
  await expect(note).toContainText(/^Fit: the smallest readable scale, 60%/);
  await expect(note).toContainText('Drag to pan');
  // its whole width in view, and it covers the canvas's height (no blank band above or below it)
  const [c, d] = [(await canvas.boundingBox())!, (await svg.boundingBox())!];
  expect(d.x).toBeGreaterThanOrEqual(c.x - 1);
  expect(d.x + d.width).toBeLessThanOrEqual(c.x + c.width + 1);
  expect(d.y).toBeLessThanOrEqual(c.y + 9);
  expect(d.y + d.height).toBeGreaterThanOrEqual(c.y + c.height - 9);
  await graph.screenshot({ path: test.info().outputPath('graph-scale-fit.png') });
  await graph.locator('.jp-memviz-graph-zoom-in').click();
  await graph.locator('.jp-memviz-graph-zoom-in').click();
  expect(Number(await graph.getAttribute('data-scale'))).toBeCloseTo(fitted * 2.25, 3);
  await expect(note).toBeEmpty();
  await fit.click();
  expect(Number(await graph.getAttribute('data-scale'))).toBeCloseTo(fitted, 3);
  for (let i = 0; i < 3; i++) {
    await graph.locator('.jp-memviz-graph-zoom-out').click();
  }
  expect(Number(await graph.getAttribute('data-scale'))).toBeCloseTo(fitted / 3.375, 3);
  await fit.click();

  // a click on a module opens it (a frame holding its ops); a click on the frame's label closes it
  const id = (await layer.getAttribute('id'))!;
  const drawn = await svg.locator('g.node').count();
  await layer.click();
  await expect(svg.locator(`g.cluster#${id}`)).toBeVisible({ timeout: 60000 });
  expect(await svg.locator('g.node').count()).toBeGreaterThan(drawn);
  // its sub-modules and its own ops (the residual adds) are drawn in the frame
  await expect(svg.locator(`g.cluster#${id} > title`)).toContainText('layers.57 [forward]');
  await expect(modules.locator('title', { hasText: /^layers\.57\.mlp \[forward\]/ })).toHaveCount(1);
  await expect(svg.locator('g.node > title', { hasText: /^add2_57: / })).toHaveCount(1);
  // a click on the open module's frame (not on a node) closes it; dispatched on the frame's outline,
  // as the top of the canvas may lie under JupyterLab's sticky notebook toolbar
  await graph.screenshot({ path: test.info().outputPath('graph-scale-opened.png') });
  await svg
    .locator(`g.cluster#${id} > path, g.cluster#${id} > polygon`)
    .first()
    .evaluate(el => {
      for (const type of ['pointerdown', 'pointerup']) {
        el.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
      }
    });
  await expect(svg.locator(`g.node#${id}`)).toBeVisible({ timeout: 60000 });

  // the size cap: opening the 900-op "mixer [backward]" would draw about 2000 nodes, above the
  // 1500-node cap; it is refused before any layout and the drawing stays as it is
  const mixer = modules.filter({ has: page.locator('title', { hasText: /^mixer \[backward\]/ }) });
  const shownBefore = await svg.locator('g.node').count();
  // (dispatched on the node: at the readable scale it may lie outside the canvas, which does not scroll)
  await mixer
    .locator('path, polygon')
    .first()
    .evaluate(el => {
      for (const type of ['pointerdown', 'pointerup']) {
        el.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
      }
    });
  await expect(graph.locator('.jp-memviz-graph-status')).toHaveText(
    /^Opening it would draw \d+ nodes, above the 1500-node cap: close another module first\.$/
  );
  expect(await graph.getAttribute('data-layout')).toBeNull();
  expect(await svg.locator('g.node').count()).toBe(shownBefore);

  // search by tensor name: a parameter is not drawn, its first reader is found and outlined
  const search = graph.locator('.jp-memviz-graph-search');
  await search.fill('layers.3.mlp.fc1.weight');
  await search.press('Enter');
  await expect(graph.locator('.jp-memviz-graph-search-status')).toContainText('layers.3.mlp.fc1.weight');
  const hit = svg.locator('g.node.jp-memviz-graph-hit');
  await expect(hit).toHaveCount(1, { timeout: 60000 });
  await expect(hit.locator('title')).toContainText('fc1_3: ');
  await expect(hit.locator('title')).toContainText('reads: ');

  // the page stays responsive while a big layout runs in the worker: search an op of the 300-op
  // "mixer" module (about 600 nodes to lay out); the zoom button reacts before the layout is done
  await search.fill('mix_200');
  await search.press('Enter');
  await expect(graph).toHaveAttribute('data-layout', 'running');
  const scale = await graph.getAttribute('data-scale');
  await graph.locator('.jp-memviz-graph-zoom-in').click();
  expect(await graph.getAttribute('data-scale')).not.toBe(scale);
  expect(await graph.getAttribute('data-layout')).toBe('running');
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 120000 });
  await expect(hit.locator('title')).toContainText('mix_200: ', { timeout: 60000 });
  await expect(graph.locator('.jp-memviz-graph-search-status')).toContainText('1 of ');
  await graph.screenshot({ path: test.info().outputPath('graph-scale.png') });
});

test('a 12-layer GPT opens whole across an 848 px output, readable; an opened block lands beside its twin', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(240000);
  const { graph, svg, canvas } = await openGraphTab(page, tmpPath, 'graph_gpt.ipynb');
  let c = (await canvas.boundingBox())!;
  expect(Math.round(c.width)).toBe(OUTPUT_PX);
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  // the collapsed hierarchy: every block of both phases is one box (a ladder: block i's backward
  // beside its forward), and both phases' frames lie across the view whole, side to side (the
  // phases side by side were 1.3-2.6x the output's width: the first view showed their inner halves)
  const titled = (sel: string, re: RegExp) =>
    svg.locator(sel).filter({ has: page.locator(':scope > title', { hasText: re }) });
  // the 12 alike blocks of each phase open as one counted node, beside its twin, whole in view
  const run = (phase: string) =>
    titled('g.node.run', new RegExp(`^blocks\\.0 \\.\\. blocks\\.11 \\[${phase}\\]`));
  for (const phase of ['forward', 'backward']) {
    await expect(run(phase)).toHaveCount(1);
    await expect(run(phase)).toContainText('12 x blocks [0..11]');
    await expect(titled('g.node.module', new RegExp(`^blocks\\.\\d+ \\[${phase}\\]`))).toHaveCount(0);
    const r = (await run(phase).boundingBox())!;
    expect(r.x, `${phase} run in view`).toBeGreaterThanOrEqual(c.x - 1);
    expect(r.x + r.width).toBeLessThanOrEqual(c.x + c.width + 1);
    expect(r.y).toBeGreaterThanOrEqual(c.y - 1);
    expect(r.y + r.height).toBeLessThanOrEqual(c.y + c.height + 1);
  }
  const [rf, rb] = [(await run('forward').boundingBox())!, (await run('backward').boundingBox())!];
  expect(Math.abs(rf.y - rb.y), 'the run beside its backward twin').toBeLessThan(rf.height);
  await graph.screenshot({ path: test.info().outputPath('graph-gpt12-runs.png') });
  // a click draws them one by one, in both phases
  await run('forward')
    .locator('path, polygon')
    .first()
    .evaluate(el => {
      for (const type of ['pointerdown', 'pointerup']) {
        el.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
      }
    });
  await expect(svg.locator('g.node.run')).toHaveCount(0, { timeout: 60000 });
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
  // the canvas again: the page may have scrolled while the new drawing replaced the old
  c = (await canvas.boundingBox())!;
  await graph.screenshot({ path: test.info().outputPath('graph-gpt12-unrolled.png') });
  for (const phase of ['forward', 'backward']) {
    await expect(titled('g.node.module', new RegExp(`^blocks\\.\\d+ \\[${phase}\\]`))).toHaveCount(12);
    const frame = (await titled('g.cluster', new RegExp(`^${phase} \\(`)).boundingBox())!;
    expect(frame.x, `${phase} frame's left edge in view`).toBeGreaterThanOrEqual(c.x - 1);
    expect(frame.x + frame.width, `${phase} frame's right edge in view`).toBeLessThanOrEqual(
      c.x + c.width + 1
    );
    expect(frame.y, `${phase} frame's top in view`).toBeGreaterThanOrEqual(c.y - 1);
    expect(frame.y).toBeLessThan(c.y + c.height);
    // and its bottom: the whole collapsed hierarchy without panning (its 12 blocks stacked made it
    // 1760 px tall; they wrap into two rows of 6 now, each beside its twin row)
    expect(frame.y + frame.height, `${phase} frame's bottom in view`).toBeLessThanOrEqual(c.y + c.height + 1);
  }
  // the forward left of the backward (dot once swapped the columns at 5.4k ops)
  const left = async (phase: string) =>
    (await titled('g.cluster', new RegExp(`^${phase} \\(`)).boundingBox())!.x;
  expect(await left('forward')).toBeLessThan(await left('backward'));
  const twin = async (phase: string) =>
    (await titled('g.node.module', new RegExp(`^blocks\\.3 \\[${phase}\\]`)).boundingBox())!;
  const [f, b] = [await twin('forward'), await twin('backward')];
  expect(Math.abs(f.y - b.y), 'block 3 beside its backward').toBeLessThan(f.height);
  await graph.screenshot({ path: test.info().outputPath('graph-gpt12.png') });

  // open block 3: its backward opens with it, and the view lands on both, readable
  await titled('g.node.module', /^blocks\.3 \[forward\]/)
    .locator('path, polygon')
    .first()
    .evaluate(el => {
      for (const type of ['pointerdown', 'pointerup']) {
        el.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
      }
    });
  for (const phase of ['forward', 'backward']) {
    await expect(titled('g.cluster', new RegExp(`^blocks\\.3 \\[${phase}\\]`))).toHaveCount(1, {
      timeout: 60000
    });
  }
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  const c2 = (await canvas.boundingBox())!; // the status line above it may have wrapped differently
  for (const phase of ['forward', 'backward']) {
    const frame = (await titled('g.cluster', new RegExp(`^blocks\\.3 \\[${phase}\\]`)).boundingBox())!;
    expect(frame.x, `opened ${phase} block in view`).toBeGreaterThanOrEqual(c2.x - 1);
    expect(frame.x + frame.width).toBeLessThanOrEqual(c2.x + c2.width + 1);
    expect(frame.y, `opened ${phase} block's top in view`).toBeGreaterThanOrEqual(c2.y - 1);
    expect(frame.y).toBeLessThan(c2.y + c2.height / 2);
  }
  await graph.screenshot({ path: test.info().outputPath('graph-gpt12-open.png') });
});

test('a captured 12-layer GPT opens whole in the canvas at a readable scale, its blocks counted', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(240000);
  const { graph, svg, canvas } = await openGraphTab(page, tmpPath, 'graph_gpt_captured.ipynb');
  await expect(svg.locator('g.node.run')).toHaveCount(2);
  // the status counts the nodes drawn (it counted each run's members: examples.models' 12-layer GPT's
  // 28-node overview read "72 nodes"), and a module of one op says so ("1 ops" before)
  const drawn = await svg.locator('g.node').count();
  await expect(graph.locator('.jp-memviz-graph-status')).toHaveText(
    new RegExp(`^${drawn} nodes for \\d+ ops;`)
  );
  await expect(
    svg
      .locator('g.node.module text')
      .filter({ hasText: /^1 ops?$/ })
      .first()
  ).toHaveText('1 op');
  // named by the blocks' class (the demo's `memviz.demo.Block`, from FX's nn_module_stack) and their
  // path, the full class in the tooltip
  for (const run of await svg.locator('g.node.run').all()) {
    await expect(run.locator('text').first()).toHaveText(/^12 x Block\s+blocks\.0\.\.11$/);
    await expect(run.locator(':scope > title')).toContainText('class: memviz.demo.Block');
  }
  const inside = async (el: ReturnType<typeof svg.locator>, what: string): Promise<void> => {
    const [c, b] = [(await canvas.boundingBox())!, (await el.boundingBox())!];
    expect(b.x, `${what}: left`).toBeGreaterThanOrEqual(c.x - 1);
    expect(b.x + b.width, `${what}: right`).toBeLessThanOrEqual(c.x + c.width + 1);
    expect(b.y, `${what}: top`).toBeGreaterThanOrEqual(c.y - 1);
    expect(b.y + b.height, `${what}: bottom`).toBeLessThanOrEqual(c.y + c.height + 1);
  };
  await graph.screenshot({ path: test.info().outputPath('graph-gpt12-captured.png') });
  // it lands on both phases' frames whole inside the canvas, labels >= 8 px: at dot's default spacing
  // this overview was 820 pt tall, its frames whole only at scale 0.55 (issue 18)
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  for (const phase of ['forward', 'backward']) {
    const frame = svg
      .locator('g.cluster')
      .filter({ has: page.locator(':scope > title', { hasText: new RegExp(`^${phase} \\(`) }) });
    await inside(frame, `${phase} frame`);
  }
  // Fit agrees: the whole drawing (Graphviz's margin too) readable, no note
  await graph.locator('.jp-memviz-graph-fit').click();
  await expect(graph).toHaveAttribute('data-fit', 'whole');
  await expect(graph.locator('.jp-memviz-graph-fit-note')).toBeEmpty();
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  await inside(svg, 'the drawing');
});

test('blocks are named by their class, a hostile class name is text; a version 1 plan still draws', async ({
  page,
  tmpPath
}) => {
  await page.setViewportSize({ width: 1280, height: 900 });
  await openAndRunAll(page, tmpPath, 'graph_classes.ipynb');
  const views = page.locator('.jp-memviz-plan');
  await expect(views).toHaveCount(2, { timeout: 120000 });
  const hostile = '<img src=x onerror=alert(1)>';
  // the first output is a memviz.plan/3 document, the second the same plan as a version 1 file
  const runs: Locator[] = [];
  for (const i of [0, 1]) {
    const view = views.nth(i);
    await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
    await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
    const graph = view.locator('.jp-memviz-graph');
    await expect(graph.locator('svg')).toBeVisible({ timeout: 60000 });
    await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
    runs.push(graph.locator('svg g.node.run'));
  }
  // each phase's 3 alike blocks are one counted node named by their class, shown as text
  await expect(runs[0]).toHaveCount(2);
  for (const run of await runs[0].all()) {
    const label = run.locator('text').first();
    await expect(label).toContainText(`3 x ${hostile}`);
    await expect(label).toContainText('blocks.0..2');
    await expect(run.locator(':scope > title')).toContainText(`class: app.${hostile}`);
  }
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  // the version 1 file names no class: its blocks keep their container's name
  await expect(runs[1]).toHaveCount(2);
  for (const run of await runs[1].all()) {
    await expect(run).toContainText('3 x blocks [0..2]');
    await expect(run.locator(':scope > title')).not.toContainText('class:');
  }
  await views.nth(0).screenshot({ path: test.info().outputPath('graph-classes.png') });
});

test('a 92-layer GPT opens fitted, its blocks counted; an unrolled run lands on its blocks; close mirrors open', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000);
  // graph_gpt.ipynb's GPT-shaped graph at 92 layers (3.7k ops, the shots' 5k GPT's structure: root
  // ops, a "blocks" container, the backward's residual sums between blocks), planned in eager order
  const source = JSON.parse(
    fs.readFileSync(path.resolve(__dirname, '..', 'notebooks', 'graph_gpt.ipynb'), 'utf8')
  );
  const cell = source.cells[1];
  const text = (cell.source as string[]).join('');
  expect(text).toContain('gpt_like(12)');
  cell.source = [text.replace('gpt_like(12)', 'gpt_like(92)')];
  const folder = test.info().outputPath('notebooks');
  fs.mkdirSync(folder, { recursive: true });
  fs.writeFileSync(path.join(folder, 'graph_gpt92.ipynb'), JSON.stringify(source));
  const { graph, svg, canvas } = await openGraphTab(page, tmpPath, 'graph_gpt92.ipynb', folder);
  const titled = (sel: string, re: RegExp) =>
    svg.locator(sel).filter({ has: page.locator(':scope > title', { hasText: re }) });
  const inside = async (el: Locator, what: string): Promise<void> => {
    const [c, b] = [(await canvas.boundingBox())!, (await el.boundingBox())!];
    expect(b.x, `${what}: left`).toBeGreaterThanOrEqual(c.x - 1);
    expect(b.x + b.width, `${what}: right`).toBeLessThanOrEqual(c.x + c.width + 1);
    expect(b.y, `${what}: top`).toBeGreaterThanOrEqual(c.y - 1);
    expect(b.y + b.height, `${what}: bottom`).toBeLessThanOrEqual(c.y + c.height + 1);
  };
  // the 92 blocks of each phase are one counted node, as the 12 are (their container stayed closed,
  // its members counted one by one against the glance, and the overview opened at 1:1, its bottom cut)
  const run = (phase: string) =>
    titled('g.node.run', new RegExp(`^blocks\\.0 \\.\\. blocks\\.91 \\[${phase}\\]`));
  for (const phase of ['forward', 'backward']) {
    await expect(run(phase)).toHaveCount(1);
    await expect(run(phase)).toContainText('92 x blocks [0..91]');
  }
  // it opens fitted: both phases' frames whole in the canvas, readable, no hint of more to pan
  const scale = Number(await graph.getAttribute('data-scale'));
  expect(scale).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  expect(scale).toBeLessThan(1);
  for (const phase of ['forward', 'backward']) {
    await inside(titled('g.cluster', new RegExp(`^${phase} \\(`)), `${phase} frame`);
  }
  await expect(graph.locator('.jp-memviz-graph-fit-note')).toBeEmpty();
  await graph.screenshot({ path: test.info().outputPath('graph-gpt92.png') });
  await graph.locator('.jp-memviz-graph-fit').click();
  await expect(graph).toHaveAttribute('data-fit', 'whole');

  // a click on the forward's run draws its blocks one by one and lands with its first block in view
  // (the view stayed on the drawing's top-left, the blocks out of sight: the click seemed to do nothing)
  const press = (el: Locator) =>
    el
      .locator('path, polygon')
      .first()
      .evaluate(e => {
        for (const type of ['pointerdown', 'pointerup']) {
          e.dispatchEvent(new PointerEvent(type, { bubbles: true, clientX: 10, clientY: 10 }));
        }
      });
  await press(run('forward'));
  const block = (i: number, phase: string) =>
    titled('g.node.module', new RegExp(`^blocks\\.${i} \\[${phase}\\]`));
  await expect(block(0, 'forward')).toHaveCount(1, { timeout: 60000 });
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
  expect(Number(await graph.getAttribute('data-scale'))).toBeGreaterThanOrEqual(FIT_MIN_SCALE - 1e-4);
  await inside(block(0, 'forward'), 'the first unrolled block');
  // the drawing runs on below: the view says so
  await expect(graph.locator('.jp-memviz-graph-fit-note')).toContainText('More of the drawing lies below');
  await graph.screenshot({ path: test.info().outputPath('graph-gpt92-unrolled.png') });

  // open block 0 (its backward twin opens with it), then close it by its forward frame: both close
  await press(block(0, 'forward'));
  for (const phase of ['forward', 'backward']) {
    await expect(titled('g.cluster', new RegExp(`^blocks\\.0 \\[${phase}\\]`))).toHaveCount(1, {
      timeout: 60000
    });
  }
  await expect(graph).not.toHaveAttribute('data-layout', 'running', { timeout: 60000 });
  await press(titled('g.cluster', /^blocks\.0 \[forward\]/));
  for (const phase of ['forward', 'backward']) {
    await expect(block(0, phase), `${phase} block 0 closed`).toHaveCount(1, { timeout: 60000 });
  }
  await expect(svg.locator('g.cluster > title', { hasText: /^blocks\.0 \[/ })).toHaveCount(0);
});
