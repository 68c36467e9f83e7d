/**
 * Galata's base configuration, run in Debian's system Chromium (never a downloaded browser).
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const port = process.env.MEMVIZ_UI_PORT || '18888';

module.exports = {
  ...baseConfig,
  workers: 1,
  timeout: 180000,
  reporter: [['list']],
  webServer: {
    command: 'jlpm start',
    url: `http://127.0.0.1:${port}/lab`,
    timeout: 120000,
    reuseExistingServer: false
  },
  use: {
    ...baseConfig.use,
    baseURL: `http://127.0.0.1:${port}`,
    video: 'off',
    trace: 'off',
    launchOptions: {
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-dev-shm-usage'
      ]
    }
  }
};
