// The offline report's script (memviz/views/report.py inlines it): src/standalone.ts with plotly.js,
// Graphviz (its wasm is embedded in @hpcc-js/wasm-graphviz) and the styles in ONE file.  An IIFE
// without code splitting, so every dynamic import() of the views is inlined and the report fetches
// nothing; `memvizReport.renderReportFrom(...)` is its entry point.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { build } from 'esbuild';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const css = ['index.css', 'report.css']
  .map(name => readFileSync(join(root, 'labextension', 'style', name), 'utf8'))
  .join('\n');

await build({
  entryPoints: [join(root, 'labextension', 'src', 'standalone.ts')],
  outfile: join(root, 'memviz', 'static', 'report.js'),
  bundle: true,
  splitting: false,
  format: 'iife',
  globalName: 'memvizReport',
  platform: 'browser',
  target: 'es2020',
  // plotly and Graphviz ship minified; minifying our views too keeps the report a few MB.
  minify: true,
  // ASCII output: the file is inlined in HTML whatever encoding a viewer assumes.
  charset: 'ascii',
  define: {
    MEMVIZ_REPORT_CSS: JSON.stringify(css),
    // the Graph view's layout worker (build-worker.mjs), already a JSON string
    MEMVIZ_GRAPH_WORKER: readFileSync(join(root, 'labextension', 'lib', 'graph-worker.json'), 'utf8')
  },
  logLevel: 'warning'
});
