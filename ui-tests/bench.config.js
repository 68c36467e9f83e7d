/**
 * The UI-latency benchmark (benchmarks/bench_ui.py): the Galata configuration of the tests, running the
 * bench/*.bench.ts specs only (`make test-ui` never runs them: timings are not tests).
 */
const config = require('./playwright.config');

module.exports = { ...config, testDir: './bench', testMatch: '**/*.bench.ts', timeout: 600000 };
