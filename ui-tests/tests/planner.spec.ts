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
  const label = view.locator('.jp-memviz-budget-label');
  const slider = view.locator('.jp-memviz-budget-slider');
  await expect(peak).toHaveText('29.00 MiB (-21.6% vs eager 37.00 MiB)');
  await expect(strategy).toHaveText('checkmate');
  // One plan, described once: the chart's readouts; the slider's label names the budget alone, and its
  // ends the smallest budget with a checked plan and the eager one.
  await expect(view.locator('[data-readout="peak"]')).toHaveCount(1);
  await expect(view.locator('[data-readout="strategy"]')).toHaveCount(1);
  await expect(view.locator('.jp-memviz-slider-readout')).toHaveCount(0);
  // Where the time limit cut a solver (Plan.time_cuts) is a warning beside the description, once, as text.
  const cut = view.locator('.jp-memviz-readout-warning');
  await expect(cut).toHaveCount(1);
  await expect(cut).toHaveAttribute('data-readout', 'time limit');
  await expect(cut).toHaveText(
    'time limit: stopped by the time limit in rotor: DP, <img src=x onerror=alert(1)>: may differ between runs'
  );
  expect(await view.locator('img').count()).toBe(0);
  // budget_index is -1 (the plan as made): the slider sits on the frontier point covering its budget.
  await expect(label).toHaveText('32.00 MiB (86% of eager)');
  await expect(view.locator('.jp-memviz-budget-min')).toHaveText('min 29.00 MiB');
  await expect(view.locator('.jp-memviz-budget-max')).toHaveText('eager 40.00 MiB');
  await expect(slider).toHaveAttribute('aria-valuetext', '32.00 MiB (86% of eager)');
  // The x-axis title and the legend do not overlap.
  const box = async (selector: string) => (await view.locator(selector).first().boundingBox())!;
  const [xtitle, legend] = [await box('.g-xtitle'), await box('.legend')];
  const apart =
    xtitle.x + xtitle.width <= legend.x ||
    legend.x + legend.width <= xtitle.x ||
    xtitle.y + xtitle.height <= legend.y ||
    legend.y + legend.height <= xtitle.y;
  expect(apart).toBe(true);
  // No empty row between the solver and the export field: the idle progress sits beside the solver.
  const [solver, exportField] = [await box('.jp-memviz-strategy-select'), await box('.jp-memviz-export')];
  expect(exportField.y - (solver.y + solver.height)).toBeLessThan(16);
  await view.screenshot({ path: test.info().outputPath('planner.png') });

  // Where every control sits: nothing may move when the plan changes.
  const controls = [
    '.jp-memviz-budget-slider',
    '.jp-memviz-budget-input',
    '.jp-memviz-budget-presets',
    '.jp-memviz-strategy-select',
    '.jp-memviz-export'
  ];
  const places = async () => Promise.all(controls.map(c => box(c)));
  await slider.scrollIntoViewIfNeeded();
  const before = await places();

  // Drag the slider from its right end to its left end (frontier index 0): the kernel answers with the
  // eager plan.
  const track = await box('.jp-memviz-budget-slider');
  const y = track.y + track.height / 2;
  await page.mouse.move(track.x + track.width - 4, y);
  await page.mouse.down();
  await page.mouse.move(track.x + 2, y, { steps: 8 });
  await page.mouse.up();
  await expect(status).toHaveText('kernel: budget_index=0 strategy=checkmate');
  await expect(label).toHaveText('40.00 MiB (108% of eager)');
  await expect(peak).toHaveText('37.00 MiB (+0.0% vs eager 37.00 MiB)');
  // the plan drawn is the frontier's eager one, not the selected checkmate: the readout says so
  await expect(strategy).toHaveText("none (the frontier's plan; checkmate selected)");
  await expect(cut).toHaveCount(0); // the eager plan: nothing was cut
  await expect(view).not.toHaveClass(/jp-mod-pending/);
  expect(await view.locator('.scatterlayer .trace path.js-fill').count()).toBeGreaterThanOrEqual(6);
  expect(await places()).toEqual(before);

  // The keyboard moves the slider (arrows, Home/End), and JupyterLab's cell navigation does not also act.
  await slider.focus();
  await page.keyboard.press('ArrowUp');
  await expect(status).toHaveText('kernel: budget_index=1 strategy=checkmate');
  await page.keyboard.press('Home');
  await expect(status).toHaveText('kernel: budget_index=0 strategy=checkmate');
  expect(await slider.evaluate(node => node === document.activeElement)).toBe(true);
  expect(await places()).toEqual(before);

  // A typed budget in the unit shown, or a device's capacity, is sent as bytes.
  await expect(view.locator('.jp-memviz-budget-unit')).toHaveValue('MiB');
  await view.locator('.jp-memviz-budget-input').fill('30.5');
  await view.locator('.jp-memviz-budget-input').press('Enter');
  await expect(status).toHaveText(`kernel: budget_bytes=${Math.round(30.5 * 2 ** 20)}`);
  await view.locator('.jp-memviz-budget-presets').selectOption({ label: 'small GPU: 24.00 MiB' });
  await expect(status).toHaveText(`kernel: budget_bytes=${24 * 2 ** 20}`);
  await expect(view.locator('.jp-memviz-budget-input')).toHaveValue('24');

  // A long solve shows its progress against the time limit and can be cancelled.
  const progress = view.locator('.jp-memviz-progress');
  await expect(progress).toBeHidden();
  await view.locator('.jp-memviz-strategy-select').selectOption('checkmate-lp');
  await expect(view.locator('.jp-memviz-refining')).toHaveText(
    "showing the frontier's checkmate plan; solving with checkmate-lp…"
  );
  await expect(progress).toBeVisible();
  await expect(progress).toHaveAttribute('max', '30');
  await expect.poll(() => progress.evaluate(node => (node as HTMLProgressElement).value)).toBeGreaterThan(0);
  await view.locator('.jp-memviz-cancel').click();
  await expect(status).toHaveText('cancelled: showing the checkmate plan');
  await expect(view.locator('.jp-memviz-refining')).toBeEmpty();
  await expect(progress).toBeHidden();
  expect(await places()).toEqual(before);

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
  test.setTimeout(300000); // the cell runs twice (same plan for the same inputs), then ten timed moves
  await openAndRunAll(page, tmpPath, 'planner_demo.ipynb');

  const view = page.locator('.jp-memviz-planner');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  const peak = view.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value');
  const status = view.locator('.jp-memviz-status');
  const label = view.locator('.jp-memviz-budget-label');
  const readout = (name: string) =>
    view.locator(`.jp-memviz-readout[data-readout="${name}"] .jp-memviz-readout-value`);
  await expect(peak).toHaveText(/vs eager/);
  // the status line is for errors and notes: the plan is described once, by the readouts
  await expect(status).toHaveText('');
  await expect(label).toHaveText(/^\d+\.\d\d (KiB|MiB) \(\d+% of eager\)$/);
  await expect(view.locator('.jp-memviz-budget-min')).toHaveText(/^min \d+\.\d\d (KiB|MiB)$/);
  // The same inputs give the same plan: the cell run again draws the same strategy, peak and
  // recomputations (re-running a cell once gave 35 recomputes, then 15: issue 18 item 4).  Not the
  // overhead: it comes from op times measured by this run's profile (+10.9% then +53.5% on a busy
  // machine, the same plan).
  const described = async (): Promise<string[]> =>
    Promise.all(['strategy', 'peak', 'recomputes'].map(name => readout(name).innerText()));
  const first = await described();
  const shown = (await view.elementHandle())!;
  // (galata's runCell looks for the current tab by role and also finds the plan view's tabs)
  await page.evaluate(() =>
    (
      window as unknown as { jupyterapp: { commands: { execute(id: string): Promise<unknown> } } }
    ).jupyterapp.commands.execute('notebook:run-all-cells')
  );
  await shown.waitForElementState('hidden', { timeout: 60000 }); // the first view goes with its output
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  await expect(peak).toHaveText(/vs eager/, { timeout: 120000 });
  expect(await described()).toEqual(first);
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
      const gd = root.querySelector('.jp-memviz-tabpanel[data-tab="Memory"] .js-plotly-plot') as PlotDiv;
      const refining = (): boolean => !!root.querySelector('.jp-memviz-refining:not(:empty)');
      const frame = (): Promise<void> => new Promise(r => requestAnimationFrame(() => r()));
      let plotted = 0;
      gd.on('plotly_afterplot', () => plotted++);
      // when the kernel's answer reaches the view (it clears the pending mark before drawing)
      let answered = -1;
      const observer = new MutationObserver(() => {
        if (answered < 0 && !root.classList.contains('jp-mod-pending')) {
          answered = performance.now() - t0;
        }
      });
      observer.observe(root, { attributes: true, attributeFilter: ['class'] });
      const t0 = performance.now();
      slider.value = String(index);
      slider.dispatchEvent(new Event('input', { bubbles: true }));
      while ((root.classList.contains('jp-mod-pending') || plotted === 0) && performance.now() - t0 < 60000) {
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
  const before = { peak: await peak.textContent() };

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
  await expect(label).toHaveText(/\(100% of eager\)$/, { timeout: 60000 });
  // The frontier's own plan is shown at once; the selected strategy's (with its packing) follows.
  await expect(view.locator('.jp-memviz-refining')).toBeEmpty({ timeout: 60000 });
  await expect(peak).not.toHaveText(before.peak ?? '');
  // the largest budget: no recomputation, the peak at eager's (a reordered plan may sit a hair below)
  await expect(peak).toHaveText(/\([+-]0\.0% vs eager/);
  // the kernel's Plan.time_overhead: no recomputation, but the exported module's own per-step cost
  // (measured by the profile) still counts, so it is the kernel's number, not a ratio of op times; an
  // eager plan ("none") is the eager step: 0, the exported module's prediction named as that
  // with the spread the profile measured, the prediction at its step pairs' quartiles (issue 18)
  const spread = " \\([+-]\\d+\\.\\d% to [+-]\\d+\\.\\d% at the measured steps' quartiles\\)";
  await expect(readout('overhead')).toHaveText(
    new RegExp(`^([+-]\\d+\\.\\d%${spread}|0 \\(eager\\)( · exported module [+-]\\d+\\.\\d%${spread})?)$`)
  );
  // the real plan's solver status; a CPU plan has no caching-allocator layer (the CPU allocator caches
  // no segments) and is judged on its live peak
  await expect(readout('solver')).toHaveText(/(optimal|feasible|heuristic)/);
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

  // A typed budget between the slider's ends: the kernel solves exactly it, and the plan fits it.
  const mib = async (selector: string) =>
    Number(/([\d.]+) MiB/.exec((await view.locator(selector).textContent()) ?? '')![1]);
  const typed = ((await mib('.jp-memviz-budget-min')) + (await mib('.jp-memviz-budget-max'))) / 2;
  await view.locator('.jp-memviz-budget-unit').selectOption('MiB');
  await view.locator('.jp-memviz-budget-input').fill(typed.toFixed(2));
  await view.locator('.jp-memviz-budget-input').press('Enter');
  await expect(readout('budget')).toHaveText(`${typed.toFixed(2)} MiB`, { timeout: 60000 });
  await expect(view.locator('.jp-memviz-refining')).toBeEmpty({ timeout: 60000 });
  await expect(readout('fits')).toHaveText(/^yes: live peak/);
  await expect(readout('strategy')).toHaveText(/\(chosen by auto\)$/);
  await expect(status).toHaveText('');

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

// planner_nofrontier.ipynb: memviz.Planner on a 12-layer chain planned at 60% of eager with
// frontier=False.  With no frontier the slider sat at its left end, unlabelled, while its label said
// "60% of eager" (issue 18 at 100 layers): it now sits at the budget between 0 B and eager, both ends
// labelled, and says the range is not known.
test('a plan without a frontier: the slider sits at its budget between 0 B and eager', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000);
  await openAndRunAll(page, tmpPath, 'planner_nofrontier.ipynb');
  const planner = page.locator('.jp-memviz-planner').first();
  await expect(planner.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  await expect(planner.locator('.jp-memviz-budget-label')).toHaveText(/\(60% of eager\) · no frontier$/);
  await expect(planner.locator('.jp-memviz-budget-min')).toHaveText('0 B');
  await expect(planner.locator('.jp-memviz-budget-max')).toHaveText(/^eager \d+\.\d\d MiB$/);
  const slider = planner.locator('.jp-memviz-budget-slider');
  await expect(slider).toBeDisabled();
  await expect(slider).toHaveAttribute('title', /smallest feasible budget is not known/);
  const position = Number(await slider.inputValue()) / Number(await slider.getAttribute('max'));
  expect(position).toBeCloseTo(0.6, 2);
  await planner
    .locator('.jp-memviz-budget')
    .screenshot({ path: test.info().outputPath('planner-no-frontier.png') });
});
