/**
 * Where the chunk regions of an autochunk plan run in its planned schedule, as x ranges of the memory
 * chart.  The plan's `chunks` name a region by its op graph nodes (memviz/plans/chunking.py `ChunkPlan.chunks`);
 * the planned CD-graph (solvers.autochunk `chunked_run`) runs a region as its hoisted ops (whole), one
 * `<output>.buffer` per chunked output, then every body op once per chunk as `<op>[lo:hi]`, then frees
 * what died in it.  A region spans the steps from the first of those computes up to the next compute
 * outside it (the frees included), as `chunked_run` records its spans.  Pure, so it runs under node's
 * tests.
 */
import { PlanDoc } from './transforms';

/** One chunk region as the plan document stores it (the fields this module reads). */
export interface ChunkDoc {
  start: string;
  end: string;
  chunks: number;
  /** body op -> the dim it is chunked along */
  dims: Record<string, number>;
  /** chunked output -> its dim (each gets a `.buffer` compute) */
  outputs: Record<string, number>;
  hoisted?: string[];
}

/** A shaded range of the memory chart: planned steps [x0, x1) (chart.ts `Region`). */
export interface StepRegion {
  x0: number;
  x1: number;
  label: string;
}

/** `op[lo:hi]`, the name of one chunk of a body op: the op's name, or null for any other name. */
export function chunkedOpName(name: string): string | null {
  const match = /^(.*)\[\d+:\d+\]$/s.exec(name);
  return match ? match[1] : null;
}

/** Whether compute `name` of the chunked graph belongs to region `chunk`. */
function inRegion(chunk: ChunkDoc, name: string): boolean {
  const op = chunkedOpName(name);
  if (op !== null && Object.prototype.hasOwnProperty.call(chunk.dims, op)) {
    return true;
  }
  if (name.endsWith('.buffer') && Object.prototype.hasOwnProperty.call(chunk.outputs, name.slice(0, -7))) {
    return true;
  }
  return (chunk.hoisted ?? []).includes(name);
}

/** The plan's chunk regions (none for other strategies), each as the planned steps it spans; a region
 * none of whose computes is in the schedule is left out rather than drawn at a guessed place. */
export function chunkRegions(doc: PlanDoc & { chunks?: ChunkDoc[] }): StepRegion[] {
  const computes = doc.graph.computes;
  const schedule = doc.planned.schedule;
  const regions: StepRegion[] = [];
  (doc.chunks ?? []).forEach((chunk, index) => {
    const steps = schedule.flatMap(([kind, id], step) =>
      kind === 'compute' && computes[id] !== undefined && inRegion(chunk, computes[id].name) ? [step] : []
    );
    if (steps.length === 0) {
      return;
    }
    const last = steps[steps.length - 1];
    const next = schedule.findIndex(([kind], step) => step > last && kind === 'compute');
    regions.push({
      x0: steps[0],
      x1: next < 0 ? schedule.length : next,
      label: `region ${index + 1}: ${chunk.chunks} chunks`
    });
  });
  return regions;
}
