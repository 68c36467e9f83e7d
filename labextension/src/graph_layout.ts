/**
 * Graphviz layouts in a Web Worker (graph_worker.ts), so the page stays responsive however long dot
 * runs (issue 18 item 2).  One layout at a time per view: a new request, `cancel()` or the time limit
 * terminates the worker mid-layout (wasm cannot be interrupted otherwise) and the next request starts
 * a fresh one.
 */

/** Why a layout gave no SVG. */
export class LayoutError extends Error {
  constructor(
    message: string,
    readonly reason: 'cancelled' | 'timeout' | 'failed'
  ) {
    super(message);
  }
}

let sourceUrl: Promise<string> | null = null;

/** The worker script as a Blob URL, made once per page (its chunk is fetched on first use). */
function workerUrl(): Promise<string> {
  if (!sourceUrl) {
    sourceUrl = import(/* webpackChunkName: "memviz-graphviz" */ './graph_worker_source').then(m =>
      URL.createObjectURL(new Blob([m.workerSource], { type: 'text/javascript' }))
    );
  }
  return sourceUrl;
}

interface Pending {
  id: number;
  resolve(svg: string): void;
  reject(err: LayoutError): void;
  timer: ReturnType<typeof setTimeout>;
}

export class LayoutClient {
  private worker: Worker | null = null;
  private pending: Pending | null = null;
  private nextId = 0;

  /** Lay `dot` out; rejects with a LayoutError after `timeoutMs`, on `cancel()` or a newer request. */
  async layout(dot: string, timeoutMs: number): Promise<string> {
    this.cancel();
    const url = await workerUrl();
    return new Promise<string>((resolve, reject) => {
      this.cancel();
      const id = ++this.nextId;
      const timer = setTimeout(() => {
        this.stop(new LayoutError(`layout took longer than ${Math.round(timeoutMs / 1000)} s`, 'timeout'));
      }, timeoutMs);
      this.pending = { id, resolve, reject, timer };
      try {
        this.worker ??= this.start(url);
        this.worker.postMessage({ id, dot });
      } catch (err) {
        this.stop(new LayoutError(`no layout worker: ${String(err)}`, 'failed'));
      }
    });
  }

  /** Whether a layout is running. */
  get busy(): boolean {
    return this.pending !== null;
  }

  /** Abandon the running layout, if any (its promise rejects with reason "cancelled"). */
  cancel(): void {
    if (this.pending) {
      this.stop(new LayoutError('layout cancelled', 'cancelled'));
    }
  }

  dispose(): void {
    this.cancel();
    this.worker?.terminate();
    this.worker = null;
  }

  private start(url: string): Worker {
    const worker = new Worker(url);
    worker.onmessage = (e: MessageEvent<{ id: number; svg?: string; error?: string }>) => {
      const p = this.pending;
      if (!p || e.data.id !== p.id) {
        return;
      }
      clearTimeout(p.timer);
      this.pending = null;
      if (typeof e.data.svg === 'string') {
        p.resolve(e.data.svg);
      } else {
        p.reject(new LayoutError(`Graphviz failed: ${String(e.data.error)}`, 'failed'));
      }
    };
    worker.onerror = e => {
      this.stop(new LayoutError(`layout worker failed: ${e.message}`, 'failed'));
    };
    return worker;
  }

  /** Reject the pending layout and kill the worker computing it. */
  private stop(err: LayoutError): void {
    const p = this.pending;
    this.pending = null;
    this.worker?.terminate();
    this.worker = null;
    if (p) {
      clearTimeout(p.timer);
      p.reject(err);
    }
  }
}
