/**
 * Screenshots of every plan view (shots/views.shots.ts), to look at; never part of `make test-ui`:
 *   MEMVIZ_SHOTS_NOTEBOOKS=/abs/a.ipynb,/abs/b.ipynb MEMVIZ_SHOTS_OUT=/abs/dir jlpm playwright test -c shots.config.js
 * The notebooks of issue 18's set (12 layers, 5k ops) are in shots/notebooks; run them all with shots/run.sh OUT_DIR.
 */
const config = require('./playwright.config');

module.exports = { ...config, testDir: './shots', testMatch: '**/*.shots.ts', timeout: 1200000 };
