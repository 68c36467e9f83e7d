/**
 * Pure transforms behind the memory chart's step inspector: which tensors are resident while a planned
 * step runs.  Rows hold plain text (the view sets it with textContent); nothing here is HTML.
 */
import { PlanDoc } from './transforms';

/** One tensor resident during a step: a data node, or the workspace of the running compute. */
export interface LiveTensor {
  name: string;
  kind: string;
  bytes: number;
  /** op of the compute node that produced it ('' for parameters, inputs, ...) */
  producer: string;
  /** module path of that compute node */
  module: string;
}

/** What the inspector shows for one planned step. */
export interface StepInspection {
  step: number;
  /** the step itself, e.g. "compute relu (aten.relu)" or "free a1" */
  action: string;
  /** the running op's source line, '' when the capture recorded none (or the step is a free) */
  source: string;
  /** resident bytes during the step, summed over every live tensor (equals timeline.step_bytes) */
  totalBytes: number;
  /** how many tensors are resident, the workspace included */
  count: number;
  /** the `limit` largest, largest first */
  largest: LiveTensor[];
  /** every resident byte by the module that produced it (`moduleGroup`), largest first */
  byModule: ModuleShare[];
}

/** Resident bytes of one module (its producing ops), or of the tensors no op produced. */
export interface ModuleShare {
  module: string;
  bytes: number;
  count: number;
}

/** How many levels of a module path the breakdown keeps ("blocks.3.attn.qkv" -> "blocks.3"). */
export const MODULE_DEPTH = 2;

/**
 * The group a resident tensor counts for in the per-module breakdown: its producer's module path cut to
 * `depth` levels, or what it is when no module produced it (parameters, inputs, optimizer state).
 */
export function moduleGroup(row: LiveTensor, depth = MODULE_DEPTH): string {
  if (row.module) {
    return row.module.split('.').slice(0, depth).join('.');
  }
  return row.producer ? '(top level)' : `(${row.kind.replace(/_/g, ' ')})`;
}

/** Sum rows by `moduleGroup`, largest first (ties by name, so redraws do not reorder). */
export function moduleBreakdown(rows: readonly LiveTensor[], depth = MODULE_DEPTH): ModuleShare[] {
  const groups = new Map<string, ModuleShare>();
  for (const row of rows) {
    const key = moduleGroup(row, depth);
    const share = groups.get(key) ?? { module: key, bytes: 0, count: 0 };
    share.bytes += row.bytes;
    share.count += 1;
    groups.set(key, share);
  }
  return [...groups.values()].sort((a, b) => b.bytes - a.bytes || a.module.localeCompare(b.module));
}

/**
 * The tensors resident while planned step `step` runs, replaying the planned schedule the way
 * solvers.simulate counts memory: tensors without a producer are live from the start, a compute adds
 * its outputs that are not live yet plus its workspace, a free removes its tensor.  Throws a RangeError
 * for a step outside the schedule.
 */
export function inspectStep(doc: PlanDoc, step: number, limit = 10): StepInspection {
  const schedule = doc.planned.schedule;
  if (!Number.isInteger(step) || step < 0 || step >= schedule.length) {
    throw new RangeError(`step ${step} is outside the planned schedule (0..${schedule.length - 1})`);
  }
  const { computes, datas } = doc.graph;
  const live = new Set<number>(
    datas.filter(d => d.producer === null || d.producer === undefined).map(d => d.id)
  );
  for (let i = 0; i < step; i++) {
    const [kind, id] = schedule[i];
    if (kind === 'compute') {
      computes[id]?.outputs?.forEach(d => live.add(d));
    } else if (kind === 'free') {
      live.delete(id);
    }
  }
  const [kind, id] = schedule[step];
  const rows: LiveTensor[] = [];
  let action = `${kind} #${id}`;
  let source = '';
  if (kind === 'compute') {
    const c = computes[id];
    c?.outputs?.forEach(d => live.add(d));
    action = c ? `compute ${c.name} (${c.op})` : action;
    source = c?.source ?? '';
    if (c && (c.temp_bytes ?? 0) > 0) {
      rows.push({
        name: `workspace of ${c.name}`,
        kind: 'workspace',
        bytes: c.temp_bytes!,
        producer: c.op,
        module: c.module ?? ''
      });
    }
  } else if (kind === 'free') {
    live.delete(id);
    action = datas[id] ? `free ${datas[id].name}` : action;
  }
  for (const d of live) {
    const data = datas[d];
    if (!data) {
      continue;
    }
    const producer =
      data.producer === null || data.producer === undefined ? undefined : computes[data.producer];
    rows.push({
      name: data.name,
      kind: data.kind,
      bytes: data.bytes,
      producer: producer?.op ?? '',
      module: producer?.module ?? ''
    });
  }
  // Largest first; ties by name so the table does not reorder between redraws.
  rows.sort((a, b) => b.bytes - a.bytes || a.name.localeCompare(b.name));
  return {
    step,
    action,
    source,
    totalBytes: rows.reduce((sum, r) => sum + r.bytes, 0),
    count: rows.length,
    largest: rows.slice(0, limit),
    byModule: moduleBreakdown(rows)
  };
}
