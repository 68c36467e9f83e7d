import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import { inspectStep, moduleBreakdown, moduleGroup } from '../src/inspect_data';
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
    // the compact hover leaves the source line to the inspection
    assert.equal(step.source, 'model.py:11');
    assert.equal(inspectStep(SAMPLE, 2).source, '');
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

describe('moduleBreakdown', () => {
  it('sums every resident byte of a step by the module that produced it', () => {
    SAMPLE.planned.timeline.step_bytes.forEach((bytes, step) => {
      const modules = inspectStep(SAMPLE, step).byModule;
      assert.equal(
        modules.reduce((sum, m) => sum + m.bytes, 0),
        bytes,
        `step ${step}`
      );
    });
    // step 1 (relu): a1 from net.fc1; a2 and relu's workspace from the hostile module; w and x unproduced
    assert.deepEqual(inspectStep(SAMPLE, 1).byModule, [
      { module: HOSTILE, bytes: 10 * MiB, count: 2 },
      { module: 'net.fc1', bytes: 8 * MiB, count: 1 },
      { module: '(parameter)', bytes: 4 * MiB, count: 1 },
      { module: '(input)', bytes: 1 * MiB, count: 1 }
    ]);
  });

  it('cuts module paths to two levels and names what no module produced', () => {
    const row = { name: 't', kind: 'activation', bytes: 1, producer: 'aten.mm', module: 'blocks.3.attn.qkv' };
    assert.equal(moduleGroup(row), 'blocks.3');
    assert.equal(moduleGroup({ ...row, module: '' }), '(top level)');
    assert.equal(
      moduleGroup({ ...row, module: '', producer: '', kind: 'optimizer_state' }),
      '(optimizer state)'
    );
    assert.deepEqual(
      moduleBreakdown([
        row,
        { ...row, module: 'blocks.3.mlp', bytes: 2 },
        { ...row, module: 'head', bytes: 5 }
      ]),
      [
        { module: 'head', bytes: 5, count: 1 },
        { module: 'blocks.3', bytes: 3, count: 2 }
      ]
    );
  });
});
