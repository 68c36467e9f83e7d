import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import { inspectStep } from '../src/inspect_data';
import { PlanDoc } from '../src/transforms';
import { HOSTILE, samplePlan } from './sample';

const MiB = 2 ** 20;
const SAMPLE: PlanDoc = samplePlan();

describe('inspectStep', () => {
  it('finds exactly the bytes solvers.simulate counts at every planned step', () => {
    SAMPLE.planned.timeline.step_bytes.forEach((bytes, step) => {
      const inspection = inspectStep(SAMPLE, step, 1000);
      assert.equal(inspection.totalBytes, bytes, `step ${step}`);
      assert.equal(inspection.largest.length, inspection.count);
    });
  });

  it('lists the largest tensors first with kind, producer op and module, as plain text', () => {
    // step 1 runs relu (module named with markup) with a 2 MiB workspace; a1 is live, a2 is being written
    const step = inspectStep(SAMPLE, 1, 3);
    assert.equal(step.action, 'compute relu (aten.relu)');
    assert.equal(step.count, 5); // w, x, a1, a2 and the workspace
    assert.deepEqual(step.largest, [
      { name: 'a1', kind: 'saved', bytes: 8 * MiB, producer: 'aten.mm', module: 'net.fc1' },
      { name: 'a2', kind: 'saved', bytes: 8 * MiB, producer: 'aten.relu', module: HOSTILE },
      { name: 'w', kind: 'parameter', bytes: 4 * MiB, producer: '', module: '' }
    ]);
    const workspace = inspectStep(SAMPLE, 1).largest.find(r => r.kind === 'workspace');
    assert.deepEqual(workspace, {
      name: 'workspace of relu',
      kind: 'workspace',
      bytes: 2 * MiB,
      producer: 'aten.relu',
      module: HOSTILE
    });
  });

  it('drops a freed tensor at its free step and brings a recomputed one back', () => {
    const names = (step: number): string[] => inspectStep(SAMPLE, step, 100).largest.map(r => r.name);
    assert.equal(inspectStep(SAMPLE, 2).action, 'free a1');
    assert.ok(!names(2).includes('a1'));
    assert.ok(names(10).includes('a1')); // step 10 recomputes linear
    assert.throws(() => inspectStep(SAMPLE, 16), /outside the planned schedule \(0\.\.15\)/);
    assert.throws(() => inspectStep(SAMPLE, -1), RangeError);
  });
});
