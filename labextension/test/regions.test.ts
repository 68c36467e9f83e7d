import { strict as assert } from 'node:assert';
import * as path from 'node:path';
import { describe, it } from 'node:test';

import { chunkedOpName, ChunkDoc, chunkRegions } from '../src/regions_data';
import { parsePlan } from '../src/transforms';
import { HOSTILE, python, samplePlan } from './sample';

describe('chunkRegions', () => {
  it('spans exactly the planned steps solvers.autochunk.chunked_run runs each region in', () => {
    const { doc, spans } = JSON.parse(python([path.join('labextension', 'test', 'chunk_plan.py')])) as {
      doc: unknown;
      spans: [number, number][];
    };
    const plan = parsePlan(doc) as ReturnType<typeof parsePlan> & { chunks: ChunkDoc[] };
    assert.ok(spans.length > 0, 'the example chunks at least one region');
    const regions = chunkRegions(plan);
    assert.deepEqual(
      regions.map(r => [r.x0, r.x1 - 1]),
      spans
    );
    assert.deepEqual(
      regions.map(r => r.label),
      plan.chunks.map((c, i) => `region ${i + 1}: ${c.chunks} chunks`)
    );
  });

  it('finds no region in a plan without chunks', () => {
    assert.deepEqual(chunkRegions(samplePlan()), []);
  });
});

describe('chunkedOpName', () => {
  it('reads the op of one chunk, whatever its name holds', () => {
    assert.equal(chunkedOpName('matmul[0:128]'), 'matmul');
    assert.equal(chunkedOpName(`${HOSTILE}[128:256]`), HOSTILE);
    assert.equal(chunkedOpName('getitem[1]'), null);
    assert.equal(chunkedOpName('matmul.buffer'), null);
  });
});
