/**
 * The layout worker's script (labextension/build-worker.mjs), inlined by the bundler.  A module of its
 * own so that webpack puts the ~1 MB of Graphviz in a chunk loaded only when a graph is first shown.
 */
declare const MEMVIZ_GRAPH_WORKER: string;

export const workerSource: string = MEMVIZ_GRAPH_WORKER;
