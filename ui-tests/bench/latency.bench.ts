/**
 * The Planner's UI latency in Chromium (benchmarks/bench_ui.py runs this and reports p50/p95): for each
 * interaction, from the browser event the view handles until the plan it asked for is drawn (the kernel
 * answered, the readouts are no longer pending, plotly re-plotted, one frame painted).  Timed in the page
 * with performance.now(); written as JSON to $MEMVIZ_UI_BENCH_OUT.  Never asserted: timings live in the
 * benchmark, the Galata tests assert behaviour.
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';

import { SETTINGS, openAndRunAll } from '../tests/helpers';

test.use({ mockSettings: SETTINGS });

const ROUNDS = Number(process.env.MEMVIZ_UI_BENCH_ROUNDS ?? '2');

test('planner interaction latency', async ({ page, tmpPath }) => {
  test.setTimeout(600000);
  await openAndRunAll(page, tmpPath, 'planner_demo.ipynb');
  const view = page.locator('.jp-memviz-planner');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  await expect(view.locator('.jp-memviz-refining')).toBeEmpty({ timeout: 120000 });
  const slider = view.locator('.jp-memviz-budget-slider');
  const last = Number(await slider.getAttribute('max'));

  // Arm a probe: the clock starts at the next input/keydown the view sees, stops once that plan is drawn.
  const arm = (): Promise<void> =>
    page.evaluate(() => {
      type PlotDiv = HTMLElement & { on(event: string, fn: () => void): void };
      const root = document.querySelector('.jp-memviz-planner') as HTMLElement;
      const gd = root.querySelector('.jp-memviz-tabpanel[data-tab="Memory"] .js-plotly-plot') as PlotDiv;
      const w = window as unknown as { __memvizProbe: Promise<number> };
      w.__memvizProbe = new Promise(resolve => {
        let t0 = -1;
        let plotted = false;
        const start = (): void => {
          if (t0 < 0) {
            t0 = performance.now();
          }
        };
        root.addEventListener('input', start, { capture: true });
        root.addEventListener('keydown', start, { capture: true });
        gd.on('plotly_afterplot', () => {
          plotted = plotted || t0 >= 0;
        });
        const poll = (): void => {
          if (t0 >= 0 && plotted && !root.classList.contains('jp-mod-pending')) {
            requestAnimationFrame(() => {
              root.removeEventListener('input', start, { capture: true });
              root.removeEventListener('keydown', start, { capture: true });
              resolve(performance.now() - t0);
            });
          } else if (t0 >= 0 && performance.now() - t0 > 60000) {
            resolve(-1); // not drawn within a minute: reported as a failure, not a time
          } else {
            requestAnimationFrame(poll);
          }
        };
        poll();
      });
    });
  const measured = (): Promise<number> =>
    page.evaluate(() => (window as unknown as { __memvizProbe: Promise<number> }).__memvizProbe);
  const moveSlider = (index: number): Promise<void> =>
    slider.evaluate((node, index) => {
      const input = node as HTMLInputElement;
      input.value = String(index);
      input.dispatchEvent(new Event('input', { bubbles: true }));
    }, index);

  const samples: Record<string, number[]> = {
    'slider move, first visit': [],
    'slider move, revisit': [],
    'keyboard step (arrow key)': [],
    'typed budget (Enter)': []
  };
  const settle = async (): Promise<void> => {
    await expect(view.locator('.jp-memviz-refining')).toBeEmpty({ timeout: 120000 });
  };
  const visited = new Set<number>([Number(await slider.inputValue())]);
  for (let round = 0; round < ROUNDS; round++) {
    const third = Math.floor(last / 3);
    // four first visits (in the first pass), then two revisits
    for (const index of [0, third, 2 * third, last, third, 0]) {
      if (String(index) === (await slider.inputValue())) {
        continue; // no change, no plan
      }
      await arm();
      await moveSlider(index);
      samples[visited.has(index) ? 'slider move, revisit' : 'slider move, first visit'].push(
        await measured()
      );
      visited.add(index);
      await settle();
    }
    await slider.focus();
    const atEnd = Number(await slider.inputValue()) === last;
    for (const key of atEnd ? ['ArrowLeft', 'ArrowRight'] : ['ArrowRight', 'ArrowLeft']) {
      await arm();
      await page.keyboard.press(key);
      samples['keyboard step (arrow key)'].push(await measured());
      await settle();
    }
    const text = (await view.locator('.jp-memviz-budget-max').textContent()) ?? '';
    const eager = Number(/([\d.]+) MiB/.exec(text)?.[1] ?? '0');
    await view.locator('.jp-memviz-budget-unit').selectOption('MiB');
    await view.locator('.jp-memviz-budget-input').fill((eager * (0.8 + 0.05 * round)).toFixed(2));
    await arm();
    await view.locator('.jp-memviz-budget-input').press('Enter');
    samples['typed budget (Enter)'].push(await measured());
    await settle();
  }
  const out = process.env.MEMVIZ_UI_BENCH_OUT;
  if (out) {
    fs.writeFileSync(out, JSON.stringify({ samples, frontier_points: last + 1 }, null, 1));
  }
  console.log(JSON.stringify(samples));
});
