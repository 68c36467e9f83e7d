import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// packing.ipynb shows a 10,000-tensor plan: the packing tab must stay interactive at that size (the
// rectangles are one canvas image per panel, repainted on zoom, with the view's own hover; not 10k
// plotly shapes or SVG subpaths).  The render time is a benchmark: printed, not asserted tightly.
test('the packing tab draws 10k tensors, planned and allocator side by side', async ({ page, tmpPath }) => {
  await openAndRunAll(page, tmpPath, 'packing.ipynb');

  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.jp-memviz-tabpanel[data-tab="Memory"] .js-plotly-plot')).toBeVisible({
    timeout: 120000
  });
  // Registered views (the CD graph) follow the two built-in tabs.
  await expect(view.locator('.jp-memviz-tab').nth(0)).toHaveText('Memory');
  await expect(view.locator('.jp-memviz-tab').nth(1)).toHaveText('Packing');
  // The allocator's layer on the memory chart is named for what it is (issue 18 item 1).
  await expect(view.locator('.legendtext', { hasText: 'reserved by the allocator' })).toHaveCount(1);
  await expect(view.locator('.legendtext', { hasText: 'fragmentation' })).toHaveCount(0);
  // A plan with both an allocator model (a CUDA-like device) and a budget: its live peak (76 KiB) is
  // under the 1 MiB budget, but what the allocator reserves (2 MiB) is not, and that is the verdict.
  const fits = view.locator('.jp-memviz-readout', {
    has: page.locator('.jp-memviz-readout-label', { hasText: /^fits: $/ })
  });
  await expect(fits).toHaveCount(1);
  await expect(fits.locator('.jp-memviz-readout-value')).toHaveText(
    "NO: reserved by the allocator 2.00 MiB > 1.00 MiB (the export runs PyTorch's allocator, not the packed addresses)"
  );

  // Time from the click to the drawn packing chart (plotly is already loaded by the memory tab).
  const ms = await page.evaluate(async () => {
    const root = document.querySelector('.jp-memviz-plan')!;
    const frame = (): Promise<void> => new Promise(r => requestAnimationFrame(() => r()));
    const t0 = performance.now();
    (root.querySelector('.jp-memviz-tab[data-tab="Packing"]') as HTMLElement).click();
    const panel = root.querySelector('.jp-memviz-tabpanel[data-tab="Packing"]')!;
    while (!panel.querySelector('.xtick') || panel.querySelectorAll('image').length < 2) {
      await frame();
    }
    await frame();
    return performance.now() - t0;
  });
  // printed, never asserted: a wall-clock bound is flaky on a loaded machine (issue 18 item 10); the wait
  // above is the behaviour (the chart is drawn), the test's time limit its only bound
  console.log(`packing chart, 10001 planned tensors + 10001 allocator blocks: ${ms.toFixed(0)} ms to draw`);

  const packing = view.locator('.jp-memviz-tabpanel[data-tab="Packing"]');
  await expect(packing.locator('.annotation-text').first()).toContainText('planned packing');
  await expect(packing.locator('.annotation-text').nth(1)).toContainText('caching allocator');
  await expect(view.locator('.jp-memviz-tabpanel[data-tab="Memory"]')).toBeHidden();
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  await packing.screenshot({ path: test.info().outputPath('packing.png') });

  const image = packing.locator('image').first();
  const href = async (): Promise<string> => {
    const source = (await image.getAttribute('href')) ?? '';
    return `${source.length}:${source.slice(-200)}`;
  };
  const before = await href();
  // Hovering the input's band (the top 4 KiB of the planned packing, live throughout) names it.
  const at = await packing.evaluate(el => {
    type Axis = { _offset: number; c2p(v: number): number };
    const gd = el.querySelector('.js-plotly-plot') as unknown as HTMLElement & {
      _fullLayout: { xaxis: Axis; yaxis: Axis };
    };
    const { xaxis, yaxis } = gd._fullLayout;
    const r = gd.getBoundingClientRect();
    return { x: r.left + xaxis._offset + xaxis.c2p(10000), y: r.top + yaxis._offset + yaxis.c2p(74) };
  });
  await page.mouse.move(at.x, at.y);
  const tip = packing.locator('.jp-memviz-packing-tip');
  await expect(tip).toBeVisible();
  await expect(tip).toContainText('input, 4.00 KiB');
  await packing.screenshot({ path: test.info().outputPath('packing-hover.png') });

  // The figure keeps its height across a legend click on a busy machine (issue 18: 40 px shorter, the
  // x-axis titles on the legend).  A busy machine on demand: the CPU throttled 8x through the DevTools
  // protocol, and a tab round trip, whose plotly resize drops the layout's height (autosize from then on).
  const figure = (): Promise<{ height: number; div: number; titleBottom: number; legendTop: number }> =>
    packing.evaluate(el => {
      const gd = el.querySelector('.js-plotly-plot') as unknown as HTMLElement & {
        _fullLayout: { height: number };
      };
      const title = gd.querySelector('.g-xtitle')!.getBoundingClientRect();
      const legend = gd.querySelector('.legend')!.getBoundingClientRect();
      return {
        height: gd._fullLayout.height,
        div: gd.getBoundingClientRect().height,
        titleBottom: title.bottom,
        legendTop: legend.top
      };
    });
  const laidOut = await figure();
  expect(laidOut.titleBottom).toBeLessThanOrEqual(laidOut.legendTop);
  const real = page
    .context()
    .pages()
    .find(p => p.url() === page.url())!;
  const cdp = await page.context().newCDPSession(real);
  await cdp.send('Emulation.setCPUThrottlingRate', { rate: 8 });
  await view.locator('.jp-memviz-tab[data-tab="Memory"]').click();
  await view.locator('.jp-memviz-tab[data-tab="Packing"]').click();
  // plotly's resize has run (it sets autosize on the user layout)
  await expect
    .poll(() =>
      packing.evaluate(
        el =>
          (el.querySelector('.js-plotly-plot') as unknown as { layout: { autosize?: boolean } }).layout
            .autosize
      )
    )
    .toBe(true);
  const throttledKey = packing.locator('.legend .traces', { hasText: 'inputs' }).locator('.legendtoggle');
  const beforeClick = await href();
  await throttledKey.click();
  await expect.poll(href, { timeout: 60000 }).not.toEqual(beforeClick);
  const afterOff = await figure();
  await throttledKey.click();
  await expect.poll(href, { timeout: 60000 }).toEqual(beforeClick);
  const afterOn = await figure();
  await cdp.send('Emulation.setCPUThrottlingRate', { rate: 1 });
  await packing.screenshot({ path: test.info().outputPath('packing-after-legend-clicks-throttled.png') });
  for (const after of [afterOff, afterOn]) {
    expect(after).toEqual(laidOut);
  }

  // Switching "inputs" off in the legend takes its band out of the image and out of the hover.
  const shown = await href();
  // the painted image's size: a redraw at another size would differ for that reason alone
  const size = (): Promise<string> =>
    image.evaluate(el => `${el.getAttribute('width')}x${el.getAttribute('height')}`);
  const shownSize = await size();
  const inputsKey = packing.locator('.legend .traces', { hasText: 'inputs' }).locator('.legendtoggle');
  await inputsKey.click();
  await expect.poll(href).not.toEqual(shown);
  await page.mouse.move(at.x + 5, at.y);
  await expect(tip).toBeHidden();
  await packing.screenshot({ path: test.info().outputPath('packing-inputs-off.png') });
  await inputsKey.click();
  // Session 20 once saw another image here (7470 vs 7870 characters) with a budget on this plan; the
  // budget does not reach the packing view (it paints from the packing alone), and it did not recur
  // with either budget in this notebook: the image is the same size and the same bytes.
  await expect.poll(size).toEqual(shownSize);
  await expect.poll(href).toEqual(shown);

  // Drag-zoom into the first tenth of the planned panel: its image is repainted for the new window.
  const box = (await packing.locator('.nsewdrag').first().boundingBox())!;
  await page.mouse.move(box.x + 4, box.y + 10);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width / 10, box.y + box.height - 10, { steps: 5 });
  await page.mouse.up();
  await expect.poll(href).not.toEqual(before);
  const range = await packing.evaluate(el => {
    const gd = el.querySelector('.js-plotly-plot') as unknown as {
      _fullLayout: { xaxis: { range: number[] } };
    };
    return gd._fullLayout.xaxis.range;
  });
  expect(range[1]).toBeLessThan(5000);
  await page.mouse.move(box.x + 30, box.y + box.height / 2);
  await packing.screenshot({ path: test.info().outputPath('packing-zoomed.png') });

  await page.theme.setDarkTheme();
  await view.locator('.jp-memviz-tab[data-tab="Memory"]').click();
  await view.locator('.jp-memviz-tab[data-tab="Packing"]').click();
  await packing.screenshot({ path: test.info().outputPath('packing-dark.png') });
  await view.locator('.jp-memviz-tab[data-tab="Memory"]').click();
  await view.screenshot({ path: test.info().outputPath('memory-dark.png') });
});

// packing_gpt.ipynb: a 2-layer GPT with AdamW, packed: parameters and optimizer state fill the bottom.
test('the packing zooms to the addresses that change and outlines the tensor under the cursor', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000);
  await openAndRunAll(page, tmpPath, 'packing_gpt.ipynb');
  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot').first()).toBeVisible({ timeout: 180000 });
  await view.locator('.jp-memviz-tab[data-tab="Packing"]').click();
  const packing = view.locator('.jp-memviz-tabpanel[data-tab="Packing"]');
  await expect(packing.locator('image').first()).toBeAttached({ timeout: 60000 });
  const yrange = (): Promise<number[]> =>
    packing.evaluate(el => {
      const gd = el.querySelector('.js-plotly-plot') as unknown as {
        _fullLayout: { yaxis: { range: number[] } };
      };
      return [...gd._fullLayout.yaxis.range];
    });
  expect((await yrange())[0]).toBe(0);
  const zoom = packing.locator('.jp-memviz-packing-zoom-changing');
  const all = packing.locator('.jp-memviz-packing-zoom-all');
  const filter = packing.locator('.jp-memviz-packing-filter');
  await expect(zoom).toBeEnabled();
  await expect(zoom).toContainText('Addresses that change');
  // the active address filter is shown (issue 18: nothing said which one was): its button pressed, and
  // the range named
  await expect(all).toHaveAttribute('aria-pressed', 'true');
  await expect(zoom).toHaveAttribute('aria-pressed', 'false');
  await expect(filter).toHaveText(/^showing: all addresses, 0\.0/);
  const image = packing.locator('image').first();
  const before = await image.getAttribute('href');
  await zoom.click();
  await expect.poll(async () => (await yrange())[0]).toBeGreaterThan(0);
  await expect(zoom).toHaveAttribute('aria-pressed', 'true');
  await expect(all).toHaveAttribute('aria-pressed', 'false');
  await expect(zoom).toHaveClass(/jp-mod-current/);
  await expect(filter).toHaveText(/^showing: the addresses that change, /);
  await expect(filter).toHaveAttribute('data-filter', 'changing');
  const [lo, hi] = await yrange();
  expect(hi).toBeGreaterThan(lo);
  await expect.poll(() => image.getAttribute('href')).not.toEqual(before);
  // hovering a tensor in the zoomed range names it and outlines its rectangle
  const box = (await packing.locator('.nsewdrag').first().boundingBox())!;
  const outline = packing.locator('.jp-memviz-packing-outline');
  const tip = packing.locator('.jp-memviz-packing-tip');
  let found = false;
  for (let fy = 0.95; fy > 0.05 && !found; fy -= 0.05) {
    await page.mouse.move(box.x + box.width * 0.3, box.y + box.height * fy);
    found = await tip.isVisible();
  }
  expect(found).toBe(true);
  await expect(outline).toBeVisible();
  const o = (await outline.boundingBox())!;
  expect(o.width).toBeGreaterThan(0);
  expect(o.x).toBeGreaterThanOrEqual(box.x - 3);
  await packing.screenshot({ path: test.info().outputPath('packing-changing.png') });
  await packing.locator('.jp-memviz-packing-zoom-all').click();
  await expect.poll(async () => (await yrange())[0]).toBe(0);
  await expect(all).toHaveAttribute('aria-pressed', 'true');
  await expect(zoom).toHaveAttribute('aria-pressed', 'false');
  await expect(filter).toHaveAttribute('data-filter', 'all');
  // a drag zoom is neither button's range: neither is pressed, and the label says so
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.6, { steps: 5 });
  await page.mouse.up();
  await expect(filter).toHaveAttribute('data-filter', 'custom');
  await expect(filter).toContainText('zoomed range');
  await expect(all).toHaveAttribute('aria-pressed', 'false');
  await expect(zoom).toHaveAttribute('aria-pressed', 'false');
  await packing.screenshot({ path: test.info().outputPath('packing-custom-zoom.png') });
});
