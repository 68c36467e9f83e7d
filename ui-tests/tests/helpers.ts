import { IJupyterLabPageFixture, expect, galata } from '@jupyterlab/galata';
import * as path from 'path';

// Opening a notebook on a fresh JupyterLab 4.6 server races with the kernel dialog and the news toast
// (TOOLCHAIN.md pitfall 5): start the kernel automatically and never fetch news.
export const SETTINGS = {
  ...galata.DEFAULT_SETTINGS,
  '@jupyterlab/notebook-extension:tracker': {
    ...galata.DEFAULT_SETTINGS['@jupyterlab/notebook-extension:tracker'],
    autoStartDefaultKernel: true
  },
  '@jupyterlab/apputils-extension:notification': {
    ...galata.DEFAULT_SETTINGS['@jupyterlab/apputils-extension:notification'],
    fetchNews: 'false'
  }
};

async function reloadRestored(page: IJupyterLabPageFixture): Promise<void> {
  // The restored layout shows the notebook, not the launcher galata's reload waits for by default.
  // (galata's reload takes waitForIsReady; its fixture type only declares playwright's options.)
  await page.reload({ waitForIsReady: false } as Parameters<IJupyterLabPageFixture['reload']>[0]);
  await page.locator('#jupyterlab-splash').waitFor({ state: 'detached' });
}

/**
 * Upload `notebooks/<name>` (or `<folder>/<name>` relative to the repository root), open it, wait for
 * its kernel, reload (the first websocket may fail), then run all cells; one retry.
 */
export async function openAndRunAll(
  page: IJupyterLabPageFixture,
  tmpPath: string,
  name: string,
  folder = 'ui-tests/notebooks'
): Promise<void> {
  const target = `${tmpPath}/${name}`;
  await page.contents.uploadFile(path.resolve(__dirname, '..', '..', folder, name), target);
  const idle = page.locator('#jp-main-statusbar').getByText('Idle');
  for (let attempt = 0; ; attempt++) {
    try {
      await page.notebook.openByPath(target);
      await page.notebook.activate(name);
      await expect(idle).toBeVisible({ timeout: 60000 });
      await reloadRestored(page);
      await page.notebook.activate(name);
      await expect(idle).toBeVisible({ timeout: 60000 });
      await page.notebook.run();
      return;
    } catch (err) {
      if (attempt >= 1) {
        throw err;
      }
      await reloadRestored(page);
    }
  }
}
