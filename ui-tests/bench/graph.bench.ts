/**
 * The Graph view's open latency in Chromium (benchmarks/bench_ui.py runs this; issue 18 item 2: "a
 * 600-op graph opens in 2 s or less"): from the click on the Graph tab until the drawing is on screen
 * (layout done in the worker, SVG inserted, one frame painted), on ui-tests/notebooks/graph_scale.ipynb's
 * two plans (about 600 and 5.4k ops).  Each round runs the notebook again, so every sample is a view's
 * first open: its worker started, Graphviz's wasm compiled, the default (collapsed-by-module) view laid
 * out (only the page's very first open also fetches the worker's script chunk).
 * Written as JSON to $MEMVIZ_UI_GRAPH_BENCH_OUT.  Never asserted: timings live in the benchmark.
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';

import { SETTINGS, openAndRunAll } from '../tests/helpers';

test.use({ mockSettings: SETTINGS });

const ROUNDS = Number(process.env.MEMVIZ_UI_BENCH_ROUNDS ?? '2');

test('graph open latency', async ({ page, tmpPath }) => {
  test.setTimeout(600000);
  await openAndRunAll(page, tmpPath, 'graph_scale.ipynb');
  const plans = page.locator('.jp-memviz-plan');
  await expect(plans).toHaveCount(2, { timeout: 120000 });
  const ops: number[] = [];
  for (const text of await page.locator('.jp-OutputArea-output pre').allTextContents()) {
    const m = /^(\d+) ops/.exec(text.trim());
    if (m) {
      ops.push(Number(m[1]));
    }
  }
  const samples: Record<string, number[]> = {};
  for (let round = 0; round < ROUNDS; round++) {
    if (round > 0) {
      // fresh views (each with its own layout worker): run the notebook again, through the command
      // (galata's notebook helpers trip over the plan views' own role="tab" buttons)
      await page.evaluate(async () => {
        document.querySelectorAll('.jp-memviz-plan').forEach(el => el.setAttribute('data-bench-old', ''));
        const app = (
          window as unknown as { jupyterapp: { commands: { execute(id: string): Promise<unknown> } } }
        ).jupyterapp;
        await app.commands.execute('notebook:run-all-cells');
      });
      await expect(page.locator('.jp-memviz-plan:not([data-bench-old])')).toHaveCount(2, { timeout: 120000 });
    }
    for (const index of [0, 1]) {
      const view = page.locator('.jp-memviz-plan:not([data-bench-old])').nth(index);
      await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
      const ms = await view.evaluate(
        root =>
          new Promise<number>(resolve => {
            const button = Array.from(root.querySelectorAll('.jp-memviz-tabbar button')).find(
              b => b.textContent === 'Graph'
            ) as HTMLButtonElement;
            const t0 = performance.now();
            button.click();
            const poll = (): void => {
              const graph = root.querySelector('.jp-memviz-graph') as HTMLElement | null;
              if (graph && graph.querySelector('svg') && graph.dataset.layout !== 'running') {
                requestAnimationFrame(() => resolve(performance.now() - t0));
              } else if (performance.now() - t0 > 120000) {
                resolve(-1);
              } else {
                requestAnimationFrame(poll);
              }
            };
            poll();
          })
      );
      const nodes = await view.locator('.jp-memviz-graph svg g.node').count();
      const key = `graph open, ${ops[index] ?? '?'} ops (${nodes} nodes drawn)`;
      (samples[key] ??= []).push(ms);
    }
  }
  const out = process.env.MEMVIZ_UI_GRAPH_BENCH_OUT;
  if (out) {
    fs.writeFileSync(out, JSON.stringify({ samples }, null, 1));
  }
  console.log(JSON.stringify(samples));
});
