// The Graph view's layout worker (src/graph_worker.ts) with Graphviz and its embedded wasm as ONE
// classic-worker script, written as a JSON string both bundlers inline (`define` MEMVIZ_GRAPH_WORKER in
// webpack.config.js and build-report.mjs): the page starts it from a Blob URL, so neither JupyterLab's
// module federation nor a report opened from file:// has to serve a worker file.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { build } from 'esbuild';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const out = await build({
  entryPoints: [join(root, 'labextension', 'src', 'graph_worker.ts')],
  bundle: true,
  write: false,
  format: 'iife',
  platform: 'browser',
  target: 'es2020',
  minify: true,
  charset: 'ascii',
  logLevel: 'warning'
});
const target = join(root, 'labextension', 'lib', 'graph-worker.json');
mkdirSync(dirname(target), { recursive: true });
writeFileSync(target, JSON.stringify(out.outputFiles[0].text));
