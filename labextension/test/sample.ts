/**
 * What the tests share: the repository root, a hostile name, and the solvers-built sample document
 * (GraphBuilder + eager_schedule + simulate in sample_plan.py, OLLA packing and the caching-allocator
 * simulation included), so every view's data transform is tested on a real plan, not a hand-made one.
 */
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';

import { parsePlan, PlanDoc } from '../src/transforms';

// Compiled to labextension/lib/test-cjs/test/: the repository root is four levels up.
export const ROOT = path.resolve(__dirname, '..', '..', '..', '..');
export const HOSTILE = '<img src=x onerror=alert(1)>';

/** Run the project's Python with `args` from the repository root; its standard output. */
export function python(args: string[]): string {
  return execFileSync(process.env.PYTHON ?? 'python3', args, {
    cwd: ROOT,
    env: { ...process.env, PYTHONPATH: ROOT },
    encoding: 'utf8'
  });
}

/** The sample plan document, parsed: a fresh object per call, so a test may mutate its copy. */
export function samplePlan(): PlanDoc {
  return parsePlan(JSON.parse(python([path.join('labextension', 'test', 'sample_plan.py')])));
}
