import { IJupyterLabPageFixture, expect, galata, test } from '@jupyterlab/galata';
import * as path from 'path';

const NOTEBOOK = 'plan.ipynb';

// Opening a notebook on a fresh JupyterLab 4.6 server races with the kernel dialog and the news toast
// (TOOLCHAIN.md pitfall 5): start the kernel automatically and never fetch news.
test.use({
  mockSettings: {
    ...galata.DEFAULT_SETTINGS,
    '@jupyterlab/notebook-extension:tracker': {
      ...galata.DEFAULT_SETTINGS['@jupyterlab/notebook-extension:tracker'],
      autoStartDefaultKernel: true
    },
    '@jupyterlab/apputils-extension:notification': {
      ...galata.DEFAULT_SETTINGS['@jupyterlab/apputils-extension:notification'],
      fetchNews: 'false'
    }
  }
});

/** Open the notebook, wait for its kernel, reload (the first websocket may fail), then run all cells. */
async function openAndRunAll(page: IJupyterLabPageFixture, notebookPath: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await page.notebook.openByPath(notebookPath);
      await page.notebook.activate(NOTEBOOK);
      await expect(page.locator('#jp-main-statusbar').getByText('Idle')).toBeVisible({ timeout: 60000 });
      await page.reload();
      await page.notebook.activate(NOTEBOOK);
      await expect(page.locator('#jp-main-statusbar').getByText('Idle')).toBeVisible({ timeout: 60000 });
      await page.notebook.run();
      return;
    } catch (err) {
      if (attempt >= 1) {
        throw err;
      }
      await page.reload();
    }
  }
}

test('a plan document renders as a memory-over-time chart', async ({ page, tmpPath }) => {
  await page.contents.uploadFile(
    path.resolve(__dirname, '..', 'notebooks', NOTEBOOK),
    `${tmpPath}/${NOTEBOOK}`
  );
  await openAndRunAll(page, `${tmpPath}/${NOTEBOOK}`);

  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });

  // The stacked areas (7 non-zero categories) plus the baseline and budget lines are drawn as SVG paths.
  const lines = view.locator('.scatterlayer .trace path.js-line');
  await expect(lines.first()).toBeVisible();
  expect(await lines.count()).toBeGreaterThanOrEqual(9);
  const d = await lines.first().getAttribute('d');
  expect(d && d.length).toBeGreaterThan(20);
  expect(await view.locator('.scatterlayer .trace path.js-fill').count()).toBeGreaterThanOrEqual(7);

  await expect(view.locator('.jp-memviz-readout[data-readout="peak"] .jp-memviz-readout-value')).toHaveText(
    '29.00 MiB (-21.6% vs eager 37.00 MiB)'
  );
  await expect(
    view.locator('.jp-memviz-readout[data-readout="strategy"] .jp-memviz-readout-value')
  ).toHaveText('checkmate');

  // Hovering the peak marker names the step and its op; the hostile op name stays text.
  await view.locator('.scatterlayer .trace:last-child .points path').first().hover();
  const hover = page.locator('.hoverlayer .hovertext');
  await expect(hover.first()).toContainText('peak 29.00 MiB');
  await expect(hover.first()).toContainText('step');
  expect(await page.locator('.jp-memviz-plan img').count()).toBe(0);
  expect(await view.locator('.gtitle').textContent()).toContain('<img src=x onerror=alert(1)>');

  await view.screenshot({ path: test.info().outputPath('plan-chart.png') });
});
