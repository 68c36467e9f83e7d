import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

const HOSTILE = '<img src=x onerror=alert(1)>';

test('a plan document renders as a memory-over-time chart', async ({ page, tmpPath }) => {
  await openAndRunAll(page, tmpPath, 'plan.ipynb');

  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });

  // The stacked areas (7 non-zero categories) plus the baseline and budget lines are drawn as SVG paths.
  // (A flat line has an empty bounding box, which playwright calls hidden: check the filled areas' visibility.)
  const fills = view.locator('.scatterlayer .trace path.js-fill');
  await expect(fills.first()).toBeVisible();
  expect(await fills.count()).toBe(7);
  const lines = view.locator('.scatterlayer .trace path.js-line');
  expect(await lines.count()).toBeGreaterThanOrEqual(9);
  // The activations area follows the schedule: a step curve with one vertex pair per schedule step.
  const d = (await fills.nth(4).getAttribute('d')) ?? '';
  expect(d.split(/[HV]/).length).toBeGreaterThan(16);

  await expect(view.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value')).toHaveText(
    '29.00 MiB (-21.6% vs eager 37.00 MiB)'
  );
  await expect(
    view.locator('.jp-memviz-readout[data-readout="strategy"] .jp-memviz-readout-value')
  ).toHaveText('checkmate');
  // The plan's one recomputation is marked, and the forward/backward boundary drawn and labelled.
  await expect(view.locator('.legendtext', { hasText: 'recomputation (1)' })).toHaveCount(1);
  await expect(view.locator('.annotation-text', { hasText: 'forward | backward' })).toHaveCount(1);
  await expect(view.locator('.shapelayer path')).toHaveCount(1);

  // Hovering the peak marker names the step and its op; the hostile names stay text.
  // (plotly's drag layer sits on top of the traces, so move the mouse to the marker's position.)
  await view.screenshot({ path: test.info().outputPath('plan-chart.png') });
  const box = await view.locator('.scatterlayer .trace:last-child .points path').first().boundingBox();
  expect(box).not.toBeNull();
  await page.mouse.move(box!.x + box!.width / 2, box!.y + box!.height / 2);
  // The unified hover box at the peak's step: the peak, the planned step's op and what eager holds when
  // it runs that same op (eager step 4: the plan runs an extra free first), not eager's step 5.
  const hover = view.locator('.hoverlayer');
  await expect(hover).toContainText('peak 29.00 MiB');
  await expect(hover).toContainText('step 5: tanh_backward (aten.tanh_backward)');
  await expect(hover).toContainText('planned 29.00 MiB · eager at this op 37.00 MiB (eager step 4)');
  await expect(hover).not.toContainText('baseline step');
  // compact (issue 18: the box covered half a 12-layer chart): the peak and three lines of the step,
  // no line per memory layer, no source line (both are in the click's inspection below)
  await expect(hover).not.toContainText('activations');
  await expect(hover).not.toContainText('source:');
  // (plotly draws the unified box as a legend in the hover layer): under a third of the plot's height
  const unified = hover.locator('.legend');
  await expect(unified).toBeVisible();
  const boxHeight = (await unified.boundingBox())!.height;
  const plotHeight = (await view.locator('.nsewdrag').first().boundingBox())!.height;
  expect(boxHeight).toBeLessThan(plotHeight / 3);
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  expect(await view.locator('.gtitle').textContent()).toContain('<img src=x onerror=alert(1)>');

  await view.screenshot({ path: test.info().outputPath('plan-chart-hover.png') });

  // Issue 18's screenshots: the peak (here at the first backward step, on the forward/backward line)
  // had its label centred on that dash line, and the hover box lay over the legend right of the plot.
  const rect = (selector: string) =>
    view
      .locator(selector)
      .first()
      .evaluate(el => {
        const r = el.getBoundingClientRect();
        return { left: r.left, right: r.right, top: r.top, bottom: r.bottom };
      });
  const apart = (
    a: { left: number; right: number; top: number; bottom: number },
    b: { left: number; right: number; top: number; bottom: number }
  ) => a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top;
  const boundary = await rect('.shapelayer path');
  const peakLabel = await rect('.scatterlayer .trace:last-child .textpoint text');
  expect(apart(peakLabel, boundary), 'the peak label and the forward/backward line overlap').toBe(true);
  const legend = await rect('.infolayer .legend');
  const area = (await view.locator('.nsewdrag').first().boundingBox())!;
  for (const f of [0.05, 0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97]) {
    await page.mouse.move(area.x + area.width * f, area.y + area.height * 0.5);
    await expect(unified).toBeVisible();
    // past plotly's hover throttle (50 ms): the box drawn for this point, not the last one
    await page.waitForTimeout(300);
    expect(
      apart(await rect('.hoverlayer .legend'), legend),
      `the hover box at ${f} of the plot's width covers the legend`
    ).toBe(true);
  }
  await view.screenshot({ path: test.info().outputPath('plan-chart-hover-right.png') });

  // Clicking the peak's step lists the largest tensors resident there; the hostile module path is text.
  await page.mouse.click(box!.x + box!.width / 2, box!.y + box!.height / 2);
  const inspector = view.locator('.jp-memviz-inspect');
  await expect(inspector.locator('.jp-memviz-inspect-caption')).toContainText(
    'step 5: compute tanh_backward (aten.tanh_backward) — 6 tensors resident, 29.00 MiB'
  );
  // what the hover leaves out: the op's source line and the bytes of each layer at this step
  await expect(inspector.locator('.jp-memviz-inspect-layers')).toContainText(/layers: parameters \d/);
  const rows = inspector.locator('.jp-memviz-inspect-row');
  await expect(rows).toHaveCount(6);
  await expect(rows.first().locator('td')).toHaveText(['a2', 'saved', '8.00 MiB', 'aten.relu', HOSTILE]);
  await expect(rows.last().locator('td')).toHaveText(['loss', 'output', '4 B', 'aten.sum', '—']);
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  // ... and their bytes by module (the producing op's module, two levels), every resident byte counted
  const modules = inspector.locator('.jp-memviz-inspect-module');
  await expect(modules).toHaveCount(5);
  await expect(modules.first().locator('td')).toHaveText(['(top level)', '8.00 MiB', '27.6%', '2']);
  await expect(modules.filter({ hasText: HOSTILE }).locator('td')).toHaveText([
    HOSTILE,
    '8.00 MiB',
    '27.6%',
    '1'
  ]);
  // the clicked step is marked on the chart, beside the line where the backward pass starts
  await expect(view.locator('.shapelayer path')).toHaveCount(2);
  await page.mouse.move(0, 0);
  await view.screenshot({ path: test.info().outputPath('plan-chart-inspect.png') });
  await inspector.scrollIntoViewIfNeeded();
  await inspector.screenshot({ path: test.info().outputPath('plan-inspector.png') });

  // The x axis switches to the estimated time of the schedule (every op of this plan takes 1 s).
  await view.locator('.jp-memviz-xaxis[data-axis="time"]').click();
  await expect(view.locator('.g-xtitle')).toContainText('estimated time (s');
  await expect(rows).toHaveCount(6);
  await view.screenshot({ path: test.info().outputPath('plan-chart-time.png') });
  await view.locator('.jp-memviz-xaxis[data-axis="step"]').click();
  await expect(view.locator('.g-xtitle')).toHaveText('schedule step');

  // Switching to the dark theme re-colors the chart from JupyterLab's CSS variables.
  const tick = view.locator('.xtick text').first();
  const lightFill = await tick.evaluate(el => getComputedStyle(el).fill);
  await page.theme.setDarkTheme();
  await expect.poll(() => tick.evaluate(el => getComputedStyle(el).fill)).not.toBe(lightFill);
  await page.mouse.move(0, 0);
  await view.screenshot({ path: test.info().outputPath('plan-chart-dark.png') });
});
