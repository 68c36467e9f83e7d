import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// planner.ipynb answers the view's traits from two precomputed plans (frontier index 0: eager, 40 MiB
// budget; index 1: one recomputation, 32 MiB), so this checks the view's side of the widget contract.
test('the planner widget sends slider, strategy and export requests and redraws', async ({
  page,
  tmpPath
}) => {
  await openAndRunAll(page, tmpPath, 'planner.ipynb');

  const view = page.locator('.jp-memviz-planner');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  const peak = view.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value');
  const strategy = view.locator('.jp-memviz-readout[data-readout="strategy"] .jp-memviz-readout-value');
  const status = view.locator('.jp-memviz-status');
  await expect(peak).toHaveText('29.00 MiB (-21.6% vs eager 37.00 MiB)');
  // budget_index is -1 (the plan as made): the slider sits on the frontier point covering its budget.
  await expect(view.locator('.jp-memviz-budget-label')).toHaveText(
    '32.00 MiB: peak 29.00 MiB, time x1.125 (checkmate)'
  );
  // Beside the slider: the shown plan's peak, time overhead and solver status.
  const readout = (label: string) =>
    view.locator(`.jp-memviz-slider-readout[data-readout="${label}"] .jp-memviz-readout-value`);
  await expect(readout('peak')).toHaveText('29.00 MiB');
  await expect(readout('time overhead')).toHaveText('+12.5%');
  await expect(readout('solver')).toHaveText('hand heuristic, no optimality bound in 0.00 s');
  await view.screenshot({ path: test.info().outputPath('planner.png') });

  // Drag the slider from its right end to its left end (frontier index 0): the kernel answers with the
  // eager plan.
  // The widget is taller than the viewport: bring the slider back before measuring where to drag.
  await view.locator('.jp-memviz-budget-slider').scrollIntoViewIfNeeded();
  const box = await view.locator('.jp-memviz-budget-slider').boundingBox();
  expect(box).not.toBeNull();
  const y = box!.y + box!.height / 2;
  await page.mouse.move(box!.x + box!.width - 4, y);
  await page.mouse.down();
  await page.mouse.move(box!.x + 2, y, { steps: 8 });
  await page.mouse.up();
  await expect(status).toHaveText('kernel: budget_index=0 strategy=checkmate');
  await expect(view.locator('.jp-memviz-budget-label')).toHaveText(
    '40.00 MiB: peak 37.00 MiB, time x1.000 (none)'
  );
  await expect(peak).toHaveText('37.00 MiB (+0.0% vs eager 37.00 MiB)');
  await expect(strategy).toHaveText('none');
  await expect(readout('peak')).toHaveText('37.00 MiB');
  await expect(readout('time overhead')).toHaveText('+0.0%');
  await expect(view.locator('.jp-memviz-slider-readouts')).not.toHaveClass(/jp-mod-pending/);
  expect(await view.locator('.scatterlayer .trace path.js-fill').count()).toBeGreaterThanOrEqual(6);

  await view.locator('.jp-memviz-strategy-select').selectOption('rotor');
  await expect(status).toHaveText('kernel: budget_index=0 strategy=rotor');

  // Export never overwrites silently: the kernel reports the existing file, a second click confirms.
  const result = view.locator('.jp-memviz-export-result');
  const overwrite = view.locator('.jp-memviz-overwrite');
  await expect(overwrite).toBeHidden();
  await view.locator('.jp-memviz-export').click();
  await expect(result).toHaveText('memviz_export/model_opt.py already exists');
  // a refusal to overwrite is a question, not an error
  await expect(result).not.toHaveClass(/jp-mod-error/);
  await expect(overwrite).toBeVisible();
  await overwrite.click();
  await expect(result).toHaveText('exported: memviz_export/model_opt.py');
  await expect(result).not.toHaveClass(/jp-mod-error/);
  await expect(overwrite).toBeHidden();

  // A failed export is shown as an error (the theme's error colour, announced), not as grey status text.
  const path = view.locator('.jp-memviz-export-path');
  await path.fill('missing/model_opt.py');
  await path.press('Enter');
  await view.locator('.jp-memviz-export').click();
  await expect(result).toHaveText('FileNotFoundError: missing/model_opt.py');
  await expect(result).toHaveClass(/jp-mod-error/);
  await expect(result).toHaveAttribute('role', 'alert');
  const colors = await result.evaluate(node => ({
    shown: getComputedStyle(node).color,
    error: getComputedStyle(node).getPropertyValue('--jp-error-color1').trim(),
    status: getComputedStyle(node.parentElement!.querySelector('.jp-memviz-status')!).color
  }));
  expect(colors.shown).not.toBe(colors.status);
  const probe = await page.evaluate(color => {
    const span = document.createElement('span');
    span.style.color = color;
    document.body.append(span);
    const rgb = getComputedStyle(span).color;
    span.remove();
    return rgb;
  }, colors.error);
  expect(colors.shown).toBe(probe);
  await view.screenshot({ path: test.info().outputPath('planner-after.png') });
});

// End to end with the real memviz.Planner on `memviz demo`'s model: dragging re-plans in the kernel.
test('memviz.Planner re-plans when the budget slider is dragged', async ({ page, tmpPath }) => {
  await openAndRunAll(page, tmpPath, 'planner_demo.ipynb');

  const view = page.locator('.jp-memviz-planner');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  const peak = view.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value');
  const status = view.locator('.jp-memviz-status');
  const label = view.locator('.jp-memviz-budget-label');
  await expect(status).toContainText('memviz plan');
  await expect(label).toHaveText(/MiB: peak .* MiB, time x\d\.\d{3} \(.+\)/);
  // Latency of the slider, timed in the browser: from the input event the view listens to until the
  // kernel's plan is drawn (readouts no longer pending, plotly has re-plotted the memory curve), and,
  // when the kernel refines the frontier's plan with the selected strategy, until that one is drawn.
  // Printed per move, never asserted: a shared machine under load makes any wall-clock bound flaky, so
  // the latency target lives with the benchmarks (the brief's rule); this test asserts behaviour only.
  // First visits are timed before the drag below (which visits the indices it crosses), revisits after.
  const moveTo = (
    index: number
  ): Promise<{ answered: number; shown: number; refined: number; strategy: string }> =>
    page.evaluate(async index => {
      type PlotDiv = HTMLElement & { on(event: string, fn: () => void): void };
      const root = document.querySelector('.jp-memviz-planner')!;
      const slider = root.querySelector('.jp-memviz-budget-slider') as HTMLInputElement;
      const readouts = root.querySelector('.jp-memviz-slider-readouts')!;
      const gd = root.querySelector('.jp-memviz-tabpanel[data-tab="Memory"] .js-plotly-plot') as PlotDiv;
      const refining = (): boolean => !!root.querySelector('.jp-memviz-refining:not(:empty)');
      const frame = (): Promise<void> => new Promise(r => requestAnimationFrame(() => r()));
      let plotted = 0;
      gd.on('plotly_afterplot', () => plotted++);
      // when the kernel's answer reaches the view (it clears the pending mark before drawing)
      let answered = -1;
      const observer = new MutationObserver(() => {
        if (answered < 0 && !readouts.classList.contains('jp-mod-pending')) {
          answered = performance.now() - t0;
        }
      });
      observer.observe(readouts, { attributes: true, attributeFilter: ['class'] });
      const t0 = performance.now();
      slider.value = String(index);
      slider.dispatchEvent(new Event('input', { bubbles: true }));
      while (
        (readouts.classList.contains('jp-mod-pending') || plotted === 0) &&
        performance.now() - t0 < 60000
      ) {
        await frame();
      }
      await frame();
      const shown = performance.now() - t0;
      // The kernel sends the refined plan, then clears the refining note: wait for both.
      const drawn = plotted;
      const wasRefining = refining();
      while (wasRefining && (refining() || plotted === drawn) && performance.now() - t0 < 60000) {
        await frame();
      }
      const refined = performance.now() - t0;
      const strategy = root.querySelector(
        '.jp-memviz-readout[data-readout="strategy"] .jp-memviz-readout-value'
      );
      observer.disconnect();
      return { answered, shown, refined, strategy: strategy?.textContent ?? '' };
    }, index);
  const drawn: number[] = [];
  const timeVisits = async (visits: [string, number][]): Promise<void> => {
    for (const [what, index] of visits) {
      const t = await moveTo(index);
      drawn.push(t.shown);
      console.log(
        `planner slider ${what} (frontier index ${index}): kernel answer in ${t.answered.toFixed(0)} ms, ` +
          `plan drawn in ${t.shown.toFixed(0)} ms, ` +
          `final plan (${t.strategy}) in ${t.refined.toFixed(0)} ms`
      );
      // every move is drawn (moveTo gives up waiting after 60 s)
      expect(t.shown).toBeLessThan(60000);
    }
  };
  await timeVisits([
    ['first visit', 0],
    ['first visit', 1],
    ['first visit', 2]
  ]);
  const before = { peak: await peak.textContent(), status: await status.textContent() };

  // Drag to the right end: the frontier's largest budget, so no remat (strategy none, eager peak).
  // The widget is taller than the viewport: bring the slider back before measuring where to drag.
  await view.locator('.jp-memviz-budget-slider').scrollIntoViewIfNeeded();
  const box = await view.locator('.jp-memviz-budget-slider').boundingBox();
  expect(box).not.toBeNull();
  const y = box!.y + box!.height / 2;
  await page.mouse.move(box!.x + 4, y);
  await page.mouse.down();
  await page.mouse.move(box!.x + box!.width - 2, y, { steps: 8 });
  await page.mouse.up();
  await expect(status).not.toHaveText(before.status ?? '', { timeout: 60000 });
  // The frontier's own plan is shown at once; the selected strategy's (with its packing) follows.
  await expect(view.locator('.jp-memviz-refining')).toBeEmpty({ timeout: 60000 });
  await expect(peak).not.toHaveText(before.peak ?? '');
  // the largest budget: no recomputation, the peak at eager's (a reordered plan may sit a hair below)
  await expect(peak).toHaveText(/\([+-]0\.0% vs eager/);
  await expect(label).toContainText('time x1.000');
  // the real plan's solver status beside the slider; a CPU plan has no caching-allocator layer (the CPU
  // allocator caches no segments) and is judged on its live peak
  await expect(
    view.locator('.jp-memviz-slider-readout[data-readout="solver"] .jp-memviz-readout-value')
  ).toHaveText(/(optimal|feasible|heuristic)/);
  await expect(view.locator('.legendtext', { hasText: 'reserved by the allocator' })).toHaveCount(0);
  await expect(view.locator('.legendtext', { hasText: 'fragmentation' })).toHaveCount(0);
  await expect(view.locator('.jp-memviz-readout[data-readout="fits"] .jp-memviz-readout-value')).toHaveText(
    /^yes: live peak .* \(no caching allocator on this device\)$/
  );
  await view.screenshot({ path: test.info().outputPath('planner-demo.png') });

  // Export on its default path (a folder that does not exist yet): the real kernel writes, verified.
  const result = view.locator('.jp-memviz-export-result');
  await expect(view.locator('.jp-memviz-export-path')).toHaveValue('memviz_export/model_opt.py');
  await view.locator('.jp-memviz-export').click();
  await expect(result).toHaveText(
    /^exported: memviz_export\/model_opt\.py, memviz_export\/model_opt\.plan\.json, memviz_export\/model_opt\.html/,
    { timeout: 120000 }
  );
  await expect(result).not.toHaveClass(/jp-mod-error/);

  const last = Number(await view.locator('.jp-memviz-budget-slider').getAttribute('max'));
  // (the slider stands at `last` after the drag: move away first, or nothing changes)
  await timeVisits([
    ['revisit', 1],
    ['revisit', last],
    ['revisit', 2],
    ['revisit', 0]
  ]);
  // The kernel sends the CD-graph only while the Graph tab is shown (view_needs): it arrives on demand.
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
  await expect(view.locator('.jp-memviz-graph svg g.node').first()).toBeVisible({ timeout: 60000 });
  await expect(view.locator('.jp-memviz-graph-status')).not.toContainText('has no CD-graph');

  const sorted = [...drawn].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)];
  console.log(`planner slider: plan drawn in ${median.toFixed(0)} ms (median of ${drawn.length} moves)`);
});
