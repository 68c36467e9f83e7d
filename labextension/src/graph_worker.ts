/**
 * The Graph view's layout worker: Graphviz (wasm, @hpcc-js/wasm-graphviz) turns DOT into SVG off the
 * page's main thread, so a long layout never freezes the page (issue 18 item 2).  It is bundled on its
 * own by labextension/build-worker.mjs into one classic-worker script that graph_layout.ts starts from
 * a Blob URL (the same in JupyterLab and in the offline report opened from disk).
 *
 * Messages: in `{ id, dot }`, out `{ id, svg, ms }` or `{ id, error }`.
 */
import { Graphviz } from '@hpcc-js/wasm-graphviz';

interface WorkerScope {
  onmessage: ((e: MessageEvent<{ id: number; dot: string }>) => void) | null;
  postMessage(message: unknown): void;
}

const scope = self as unknown as WorkerScope;
const graphviz = Graphviz.load();

scope.onmessage = e => {
  const { id, dot } = e.data;
  graphviz.then(
    g => {
      const start = performance.now();
      try {
        const svg = g.dot(dot);
        scope.postMessage({ id, svg, ms: performance.now() - start });
      } catch (err) {
        scope.postMessage({ id, error: String(err) });
      }
    },
    err => scope.postMessage({ id, error: `Graphviz failed to load: ${String(err)}` })
  );
};
