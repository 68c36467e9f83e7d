import { strict as assert } from 'node:assert';
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';

import {
  CATEGORIES,
  FrontierEntry,
  PlanDoc,
  STRATEGIES,
  categoryOrder,
  chooseUnit,
  computeStep,
  escapeHtml,
  exportOutcome,
  fitVerdict,
  formatBytes,
  FRAGMENTATION,
  fragmentationSeries,
  backwardStart,
  hoverBoxLeft,
  peakLabelPosition,
  categoryShares,
  baselineStepsByOp,
  budgetLabel,
  recomputeSteps,
  frontierEnds,
  sliderWithoutFrontier,
  BYTE_SLIDER_STEPS,
  strategyReadout,
  hasStepTimes,
  isErrorStatus,
  mergePlanParts,
  nearestFrontierIndex,
  parsePlan,
  planFigure,
  overheadReadout,
  overheadSpread,
  planReadouts,
  timeCuts,
  planTitle,
  solverSummary,
  stepEdges,
  stepHover,
  timeUnit
} from '../src/transforms';
import { MODULE_NAME, MODULE_VERSION } from '../src/version';
import { HOSTILE, python, ROOT, samplePlan } from './sample';

const MiB = 2 ** 20;
const COLORS = { planned: '#333', baseline: '#666', budget: '#f00', peak: '#000' };

const SAMPLE: PlanDoc = samplePlan();

function clone(): Record<string, unknown> {
  return JSON.parse(JSON.stringify(SAMPLE));
}

describe('escapeHtml', () => {
  it('neutralises markup', () => {
    assert.equal(escapeHtml(HOSTILE), '&lt;img src=x onerror=alert(1)&gt;');
    assert.equal(escapeHtml(`a&b "c" 'd'`), 'a&amp;b &quot;c&quot; &#39;d&#39;');
    assert.equal(escapeHtml(42), '42');
  });
});

describe('units', () => {
  it('picks the largest binary unit', () => {
    assert.deepEqual(chooseUnit(512), { name: 'B', scale: 1 });
    assert.deepEqual(chooseUnit(3 * 1024), { name: 'KiB', scale: 1024 });
    assert.deepEqual(chooseUnit(5 * MiB), { name: 'MiB', scale: MiB });
    assert.deepEqual(chooseUnit(2 ** 31), { name: 'GiB', scale: 2 ** 30 });
    assert.equal(formatBytes(1.5 * MiB), '1.50 MiB');
    assert.equal(formatBytes(12), '12 B');
  });
});

describe('parsePlan', () => {
  it('accepts a solvers-built document', () => {
    assert.equal(SAMPLE.schema, 'memviz.plan/1');
    // version 2 adds the graph's module classes; a version 1 document is one without them
    assert.equal(parsePlan({ ...clone(), schema: 'memviz.plan/2' }).schema, 'memviz.plan/2');
    // version 3 adds the autocast regions the step was profiled in, which the views do not draw
    const v3 = clone();
    v3.schema = 'memviz.plan/3';
    (v3.graph as { meta?: unknown }).meta = { autocast: [['cpu', 'bfloat16']] };
    assert.equal(parsePlan(v3).schema, 'memviz.plan/3');
  });

  it('rejects malformed documents with a reason', () => {
    assert.throws(() => parsePlan(null), /expected a JSON object/);
    assert.throws(() => parsePlan([]), /expected a JSON object/);
    assert.throws(() => parsePlan({ ...clone(), schema: 'memviz.plan/4' }), /not supported/);
    assert.throws(() => parsePlan({ ...clone(), graph: {} }), /"graph"/);
    const truncated = clone();
    (truncated.planned as { schedule: unknown[] }).schedule.pop();
    assert.throws(() => parsePlan(truncated), /schedule steps but/);
    const badSeries = clone();
    (
      badSeries.baseline as { timeline: { by_category: Record<string, unknown> } }
    ).timeline.by_category.activations = ['x'];
    assert.throws(() => parsePlan(badSeries), /by_category.activations/);
    assert.throws(() => parsePlan({ ...clone(), budget_bytes: '1GiB' }), /budget_bytes/);
  });
});

describe('mergePlanParts', () => {
  // how the planner widget sends a plan: the members its plans share once, the rest per plan
  const shared = ['model', 'device', 'graph', 'baseline', 'frontier'];
  const whole = clone();
  const base = Object.fromEntries(shared.map(k => [k, whole[k]]));
  const part = Object.fromEntries(Object.entries(whole).filter(([k]) => !shared.includes(k)));

  it('gives back the whole document from the shared base and the per-plan part', () => {
    assert.ok(!('graph' in part) && 'planned' in part);
    assert.deepEqual(parsePlan(mergePlanParts(base, part)), SAMPLE);
    assert.throws(() => parsePlan(part), /"graph"/); // the part alone is no plan
  });

  it("lets the part's members win (a plan with a graph of its own)", () => {
    const graph = { computes: [], datas: [] };
    const merged = mergePlanParts(base, { ...part, graph }) as PlanDoc;
    assert.deepEqual(merged.graph, graph);
    assert.deepEqual(merged.baseline, SAMPLE.baseline);
  });

  it('takes a document without a base as it is, and refuses a part that is no object', () => {
    assert.deepEqual(mergePlanParts(null, whole), whole);
    assert.deepEqual(mergePlanParts('', whole), whole);
    assert.throws(() => mergePlanParts(base, null), /expected a JSON object/);
    assert.throws(() => mergePlanParts(base, [1]), /expected a JSON object/);
  });
});

describe('categories', () => {
  it('match solvers.CATEGORIES', () => {
    const fromPython = JSON.parse(
      python(['-c', 'import json, solvers; print(json.dumps(solvers.CATEGORIES))'])
    );
    assert.deepEqual([...CATEGORIES], fromPython);
  });

  it('keep the stacking order and append unknown categories', () => {
    assert.deepEqual(categoryOrder({ workspace: [], future: [], parameters: [] }), [
      'parameters',
      'workspace',
      'future'
    ]);
  });
});

describe('stepHover', () => {
  it('names op, module and source of a compute step, escaped', () => {
    const relu = stepHover(SAMPLE, ['compute', 1], 1, true);
    assert.equal(
      relu,
      'step 1: <b>relu</b> (aten.relu)<br>module: &lt;img src=x onerror=alert(1)&gt;<br>source: model.py:11'
    );
    // the planned chart's compact hover leaves the source line to the click's inspection
    assert.ok(!stepHover(SAMPLE, ['compute', 1], 1).includes('source'));
    const hostile = stepHover(SAMPLE, ['compute', 6], 12);
    assert.ok(hostile.startsWith('step 12: <b>&lt;img src=x onerror=alert(1)&gt;</b> (aten.mul)'));
  });

  it('describes frees with the tensor and its size', () => {
    assert.equal(stepHover(SAMPLE, ['free', 2], 2), 'step 2: free <b>a1</b> (saved, 8.00 MiB)');
  });
});

describe('planFigure', () => {
  const fig = planFigure(SAMPLE, COLORS);
  const planned = SAMPLE.planned.timeline;
  const layers = fig.traces.filter(t => t.stackgroup === 'planned');
  const stacked = layers.filter(t => t.name !== FRAGMENTATION);

  it('stacks the non-zero categories in order and sums to the planned curve', () => {
    assert.deepEqual(
      layers.map(t => t.name),
      [
        'parameters',
        'inputs',
        'parameter gradients',
        'gradients',
        'activations',
        'outputs',
        'workspace',
        FRAGMENTATION
      ]
    );
    assert.equal(fig.unit.name, 'MiB');
    const total = fig.traces.find(t => t.name === 'planned total');
    assert.deepEqual(
      total?.y,
      planned.step_bytes.map(b => b / MiB)
    );
    planned.step_bytes.forEach((bytes, i) => {
      const sum = stacked.reduce((acc, t) => acc + (t.y[i] ?? 0), 0);
      assert.ok(Math.abs(sum * MiB - bytes) < 1e-6, `step ${i}: ${sum * MiB} != ${bytes}`);
    });
  });

  it('overlays the baseline, the budget and the peak', () => {
    const baseline = fig.traces.find(t => t.name === 'baseline (eager)');
    assert.ok(baseline);
    // drawn at the planned steps, each at eager's bytes for the same op (baselineStepsByOp)
    const eager = SAMPLE.baseline!.timeline.step_bytes;
    assert.deepEqual(
      baseline.y,
      baselineStepsByOp(SAMPLE)!.map(j => eager[j] / MiB)
    );
    assert.deepEqual(baseline.x, fig.traces.find(t => t.name === 'planned total')!.x);
    const budget = fig.traces.find(t => t.name === 'budget');
    assert.deepEqual(budget?.y, [32, 32]);
    const peak = fig.traces.find(t => t.name === 'peak');
    assert.deepEqual(peak?.x, [planned.peak_step]);
    assert.deepEqual(peak?.y, [planned.peak_bytes / MiB]);
    assert.equal(planned.peak_bytes < SAMPLE.baseline!.timeline.peak_bytes, true);
  });

  it("puts the peak label on the peak's side of the forward/backward line", () => {
    // issue 18: centred on a peak at the boundary, the dash line crossed the label
    assert.equal(peakLabelPosition(5, 5), 'top right');
    assert.equal(peakLabelPosition(7, 5), 'top right');
    assert.equal(peakLabelPosition(4, 5), 'top left');
    assert.equal(peakLabelPosition(4, null), 'top center');
    const peak = fig.traces.find(t => t.name === 'peak')!;
    assert.equal(peak.textposition, peakLabelPosition(planned.peak_step, backwardStart(SAMPLE)));
  });

  it('keeps the hover box inside the plot area, off the legend right of it', () => {
    // room on the right: right of the point
    assert.equal(hoverBoxLeft(100, 200, 600), 106);
    // the box would end past the plot's right edge (over the legend): left of the point
    assert.equal(hoverBoxLeft(500, 200, 600), 294);
    // room on neither side: flush with the plot's right edge, never past it
    assert.equal(hoverBoxLeft(150, 500, 600), 100);
    assert.equal(hoverBoxLeft(150, 700, 600), 0);
    for (const x of [0, 120, 300, 480, 599]) {
      for (const w of [50, 250, 590]) {
        const left = hoverBoxLeft(x, w, 600);
        assert.ok(left >= 0 && left + w <= 600, `point ${x}, width ${w}: [${left}, ${left + w}]`);
      }
    }
  });

  it('never lets markup from the plan reach hover text unescaped', () => {
    for (const t of fig.traces) {
      for (const text of [...(t.hovertext ?? []), ...(t.text ?? []), t.name]) {
        assert.ok(!text.includes('<img'), `unescaped markup in ${t.name}: ${text}`);
      }
    }
    const total = fig.traces.find(t => t.name === 'planned total');
    assert.ok(total);
    assert.equal(total.hovertext!.length, planned.step_bytes.length);
    // three short lines (op, module, planned vs eager at this op): the source line and the layers are
    // in the click's inspection, out of the unified hover that covered half a 12-layer chart
    assert.equal(
      total.hovertext![1],
      'step 1: <b>relu</b> (aten.relu)<br>module: &lt;img src=x onerror=alert(1)&gt;<br>' +
        'planned 23.00 MiB · eager at this op 23.00 MiB (eager step 1)'
    );
    assert.ok(stacked.every(t => t.hoverinfo === 'skip' && t.hovertext === undefined));
    assert.deepEqual(categoryShares(SAMPLE, 1), [
      { category: 'parameters', bytes: 4 * MiB },
      ...categoryShares(SAMPLE, 1).slice(1)
    ]);
    const shares = categoryShares(SAMPLE, 1);
    assert.equal(
      shares.reduce((sum, x) => sum + x.bytes, 0),
      planned.step_bytes[1]
    );
    assert.ok(shares.every(x => x.bytes !== 0));
    assert.equal(planTitle(SAMPLE), 'tiny &lt;img src=x onerror=alert(1)&gt; (train) on cpu');
  });

  it('stacks the allocator fragmentation on top: the stack reaches what the allocator reserves', () => {
    const reserved = SAMPLE.packing!.allocator!.reserved!;
    assert.equal(reserved.length, planned.step_bytes.length);
    reserved.forEach((bytes, i) => {
      const sum = layers.reduce((acc, t) => acc + (t.y[i] ?? 0), 0);
      assert.ok(Math.abs(sum * MiB - bytes) < 1e-6, `step ${i}: ${sum * MiB} != reserved ${bytes}`);
    });
    // the simulated allocator keeps its 20 MiB segments cached: fragmentation is not zero here
    assert.ok(fragmentationSeries(SAMPLE)!.some(v => v > 0));
  });

  it('has no fragmentation layer without a per-step allocator series for this schedule', () => {
    const doc = clone() as unknown as PlanDoc;
    doc.packing!.allocator!.reserved = [1, 2];
    assert.equal(fragmentationSeries(doc), null);
    assert.equal(fragmentationSeries({ ...SAMPLE, packing: null }), null);
    // only an empty slot, out of the legend and the hover, so the trace list keeps its shape
    const slot = planFigure(doc, COLORS).traces.filter(t => t.name === FRAGMENTATION);
    assert.equal(slot.length, 1);
    assert.deepEqual([slot[0].x, slot[0].y, slot[0].showlegend, slot[0].hoverinfo], [[], [], false, 'skip']);
  });

  it('draws the same list of traces for plans with and without packing', () => {
    const shape = (doc: PlanDoc): string[] =>
      planFigure(doc, COLORS).traces.map(t => `${t.name} ${t.stackgroup ?? ''} ${t.mode}`);
    assert.deepEqual(shape({ ...SAMPLE, packing: null }), shape(SAMPLE));
  });

  it('puts steps at their estimated start time on the time axis', () => {
    // every op of the sample takes 1 s: x is the number of computes before the step
    const edges = stepEdges(SAMPLE, SAMPLE.planned.schedule, 'time');
    assert.deepEqual(edges, [0, 1, 2, 2, 3, 4, 5, 5, 6, 6, 6, 7, 8, 8, 8, 9, 9]);
    // the summed per-op times are the simulated total time (recomputation counted again)
    assert.equal(edges[edges.length - 1], SAMPLE.planned.timeline.total_time);
    assert.deepEqual(stepEdges(SAMPLE, SAMPLE.planned.schedule, 'step'), [...Array(17).keys()]);
    const timed = planFigure(SAMPLE, COLORS, 'time');
    assert.deepEqual(timed.traces.find(t => t.name === 'planned total')!.x, edges.slice(0, 16));
    assert.match(timed.xTitle, /estimated time \(s/);
    assert.equal(fig.xTitle, 'schedule step');
    const peak = timed.traces.find(t => t.name === 'peak')!;
    assert.deepEqual(peak.x, [edges[planned.peak_step]]);
    const budget = timed.traces.find(t => t.name === 'budget')!;
    assert.deepEqual(budget.x, [0, 9]);
    assert.ok(hasStepTimes(SAMPLE));
    const untimed = clone() as unknown as PlanDoc;
    untimed.graph.computes.forEach(c => (c.time = 0));
    assert.ok(!hasStepTimes(untimed));
  });

  it('picks a readable time unit', () => {
    assert.deepEqual(timeUnit(2.5), { name: 's', scale: 1 });
    assert.deepEqual(timeUnit(0.004), { name: 'ms', scale: 1e-3 });
    assert.deepEqual(timeUnit(3e-5), { name: 'µs', scale: 1e-6 });
    assert.deepEqual(timeUnit(0), { name: 'ns', scale: 1e-9 });
  });

  it('labels and times a baseline from the graph it carries (autochunk: the unchunked run)', () => {
    const doc = clone() as unknown as PlanDoc;
    const graph = JSON.parse(JSON.stringify(doc.graph)) as PlanDoc['graph'];
    graph.computes.forEach(c => {
      c.name = `unchunked_${c.name}`;
      c.time = 2 * (c.time ?? 0);
    });
    const withGraph = parsePlan({ ...doc, baseline: { ...doc.baseline!, graph } });
    const fig2 = planFigure(withGraph, COLORS, 'time');
    const base = fig2.traces.find(t => t.name === 'baseline (eager)')!;
    const first = doc.baseline!.schedule.findIndex(s => s[0] === 'compute');
    assert.match(base.hovertext![first], /unchunked_/);
    const planned = fig2.traces.find(t => t.name === 'planned total')!;
    assert.ok(!planned.hovertext!.some(h => h.includes('unchunked_')));
    const own = stepEdges({ ...withGraph, graph }, doc.baseline!.schedule, 'time');
    assert.deepEqual(base.x, own.slice(0, base.x.length));
  });

  it('marks each recomputation and the start of the backward pass', () => {
    // the sample frees a1 after relu and recomputes linear (node 0) at planned step 10
    assert.deepEqual(recomputeSteps(SAMPLE.planned.schedule), [10]);
    assert.deepEqual(recomputeSteps(SAMPLE.baseline!.schedule), []);
    const marks = fig.traces.find(t => t.name.startsWith('recomputation'))!;
    assert.equal(marks.name, 'recomputation (1)');
    assert.deepEqual(marks.x, [10]);
    assert.deepEqual(marks.y, [planned.step_bytes[10] / MiB]);
    const total = fig.traces.find(t => t.name === 'planned total')!;
    assert.match(
      total.hovertext![10],
      /^step 10: <b>linear<\/b> \(aten.mm\) · <i>recomputed<\/i><br>module: net.fc1<br>planned /
    );
    assert.ok(!total.hovertext![0].includes('recomputed'));
    // tanh_backward (node 4, the first backward op) runs at planned step 5
    assert.equal(backwardStart(SAMPLE), 5);
    const forwardOnly = clone() as unknown as PlanDoc;
    forwardOnly.graph.computes.forEach(c => (c.phase = 'forward'));
    assert.equal(backwardStart(forwardOnly), null);
  });

  it('aligns the eager baseline with the plan by op, not by step index', () => {
    // eager runs nodes 0..4 at steps 0..4, node 5 at 6, 6 at 9, 7 at 12; a free keeps the op before it
    assert.deepEqual(baselineStepsByOp(SAMPLE), [0, 1, 1, 2, 3, 4, 4, 6, 6, 6, 0, 9, 9, 9, 12, 12]);
    const total = fig.traces.find(t => t.name === 'planned total')!;
    // planned step 11 runs node 6 (the hostile-named mul), which eager runs at step 9, not 11
    const eager = SAMPLE.baseline!.timeline.step_bytes;
    assert.ok(total.hovertext![11].endsWith(`eager at this op ${formatBytes(eager[9])} (eager step 9)`));
    assert.notEqual(eager[9], eager[11]);
    // the dotted line too: under planned step 11 it draws eager's step 9, and under the recomputation
    // of linear (planned step 10) eager's step 0, where eager ran it
    const line = fig.traces.find(t => t.name === 'baseline (eager)')!;
    assert.equal(line.y[11], eager[9] / MiB);
    assert.equal(line.y[10], eager[0] / MiB);
    // aligned, its entry is out of the unified hover (the planned total's carries it)
    assert.equal(line.hoverinfo, 'skip');
  });

  it("aligns by op name a baseline run on a graph of its own (a captured model's eager run)", () => {
    // the eager graph numbers the same ops otherwise (here reversed): matched by name, not by id
    const doc = clone() as unknown as PlanDoc;
    const n = doc.graph.computes.length;
    const own = doc.graph.computes.map(c => ({ ...c, id: n - 1 - c.id })).reverse();
    doc.baseline = {
      ...doc.baseline!,
      graph: { ...doc.graph, computes: own },
      schedule: doc.baseline!.schedule.map(([kind, id]) =>
        kind === 'compute' ? [kind, n - 1 - id] : [kind, id]
      ) as NonNullable<PlanDoc['baseline']>['schedule']
    };
    assert.deepEqual(baselineStepsByOp(doc), baselineStepsByOp(SAMPLE));
    const total = planFigure(doc, COLORS).traces.find(t => t.name === 'planned total')!;
    assert.ok(total.hovertext![11].endsWith('(eager step 9)'));
    // an op the eager graph does not have (an autochunk plan's unchunked model): no alignment
    doc.baseline.graph!.computes[0] = { ...own[0], name: 'unchunked' };
    assert.equal(baselineStepsByOp(doc), null);
  });

  it('draws a plan without baseline or budget', () => {
    const doc = parsePlan({ ...clone(), baseline: null, budget_bytes: null });
    const names = planFigure(doc, COLORS).traces.map(t => t.name);
    assert.ok(!names.includes('budget') && !names.includes('baseline (eager)'));
    assert.ok(names.includes('peak'));
  });
});

describe('planReadouts', () => {
  it('warns once, as text, where the time limit cut a solver; nothing when it cut none', () => {
    assert.equal(planReadouts(SAMPLE).filter(x => x.warning).length, 0);
    const cut = clone() as unknown as PlanDoc;
    const hostile = '<img src=x onerror=alert(1)>';
    cut.solver_stats = { ...cut.solver_stats, extra: { time_cuts: ['rotor: DP', hostile, 'rotor: DP', 7] } };
    const warnings = planReadouts(cut).filter(x => x.warning);
    assert.deepEqual(warnings, [
      {
        label: 'time limit',
        value: `stopped by the time limit in rotor: DP, ${hostile}: may differ between runs`,
        warning: true
      }
    ]);
    // a malformed file (time_cuts not a list) shows no warning rather than failing
    cut.solver_stats = { ...cut.solver_stats, extra: { time_cuts: -1 } };
    assert.deepEqual(timeCuts(cut), []);
  });
  it('reports strategy, peak vs eager, overhead, recomputes and budget', () => {
    const r = Object.fromEntries(planReadouts(SAMPLE).map(x => [x.label, x.value]));
    assert.equal(r.strategy, 'checkmate');
    assert.equal(planReadouts(SAMPLE, 'auto')[0].value, 'checkmate (chosen by auto)');
    assert.equal(r.peak, '29.00 MiB (-21.6% vs eager 37.00 MiB)');
    assert.equal(r.overhead, '+12.5% (spread not measured)');
    // the kernel's Plan.time_overhead (op times and measured fixed costs) when the plan carries it
    const predicted = { ...clone(), time_overhead: 1.291 } as unknown as PlanDoc;
    assert.equal(
      Object.fromEntries(planReadouts(predicted).map(x => [x.label, x.value])).overhead,
      '+29.1% (spread not measured)'
    );
    // with the spread the profile measured (its step pairs' quartiles), never as exact
    const spread = {
      ...clone(),
      time_overhead: 1.291,
      time_overhead_range: [1.2, 1.35]
    } as unknown as PlanDoc;
    assert.equal(
      planReadouts(spread).find(x => x.label === 'overhead')!.value,
      "+29.1% (+20.0% to +35.0% at the measured steps' quartiles)"
    );
    // an untrusted range out of order or not numbers is no range
    for (const bad of [[1.4, 1.2], ['1', 2], [1.2], [NaN, 2]]) {
      const doc = { ...spread, time_overhead_range: bad } as unknown as PlanDoc;
      assert.equal(overheadSpread(doc), null);
    }
    // an eager plan is the eager step: 0, and the exported module's prediction (below eager's on a small
    // CPU model: its executor skips autograd's per-step work) is named as that (a saved one read -15.0%)
    const eager = { ...clone(), strategy: 'none', time_overhead: 0.85 } as unknown as PlanDoc;
    const eagerOverhead = planReadouts(eager).find(x => x.label === 'overhead')!.value;
    assert.equal(eagerOverhead, '0 (eager) · exported module -15.0% (spread not measured)');
    assert.equal(overheadReadout('none', 1), '0 (eager)');
    assert.equal(overheadReadout('none', 1, [0.9, 1.1]), '0 (eager)');
    assert.equal(
      overheadReadout('rotor', 0.85, [0.8, 0.9]),
      "-15.0% (-20.0% to -10.0% at the measured steps' quartiles)"
    );
    assert.equal(r.recomputes, '1');
    assert.equal(r.budget, '32.00 MiB');
    assert.equal(r.solver, 'hand heuristic, no optimality bound in 0.00 s');
    // the sample carries a caching-allocator simulation (42 MiB reserved): without it, the live peak
    const cpu = clone() as unknown as PlanDoc;
    cpu.packing = { ...cpu.packing!, allocator: null };
    const fits = Object.fromEntries(planReadouts(cpu).map(x => [x.label, x.value])).fits;
    assert.equal(fits, 'yes: live peak 29.00 MiB ≤ 32.00 MiB (no caching allocator on this device)');
    const unpacked = { ...cpu, packing: null } as PlanDoc;
    assert.match(fitVerdict(unpacked, 32 * MiB), /\(allocator not simulated for this plan yet\)$/);
  });

  it('judges a plan with a caching allocator on its reserved peak', () => {
    const doc = clone() as unknown as PlanDoc;
    const allocator = {
      reserved_bytes: 36 * MiB,
      allocated_bytes: 30 * MiB,
      requested_bytes: 29 * MiB,
      fragmentation: 0.1,
      segments: [],
      reserved: [],
      allocated: [],
      blocks: []
    };
    doc.packing = { buffers: [], peak_bytes: 29 * MiB, fragmentation: 0, allocator } as never;
    const r = Object.fromEntries(planReadouts(doc).map(x => [x.label, x.value]));
    assert.equal(
      r.fits,
      "NO: reserved by the allocator 36.00 MiB > 32.00 MiB (the export runs PyTorch's allocator, not the packed addresses)"
    );
  });
});

describe('solverSummary', () => {
  it('states status, the proven gap or its absence, and the solve time', () => {
    assert.equal(
      solverSummary({ solver: 'checkmate', status: 'optimal', gap: 0, seconds: 1.234 }),
      'checkmate optimal, gap 0.0% in 1.23 s'
    );
    assert.equal(
      solverSummary({ solver: 'checkmate', status: 'feasible', gap: 0.042 }),
      'checkmate feasible, gap 4.2%'
    );
    assert.equal(
      solverSummary({ solver: 'rotor', status: 'heuristic', gap: null }),
      'rotor heuristic, no optimality bound'
    );
    assert.equal(solverSummary(null), 'no solver statistics');
  });
});

describe('frontier', () => {
  const frontier: FrontierEntry[] = [
    { budget_bytes: 40 * MiB, peak_bytes: 37 * MiB, time_overhead: 1, strategy: 'none' },
    { budget_bytes: 24 * MiB, peak_bytes: 23 * MiB, time_overhead: 1.25, strategy: 'checkmate' },
    { budget_bytes: 32 * MiB, peak_bytes: 29 * MiB, time_overhead: 1.125, strategy: 'checkmate' }
  ];

  it('labels the slider with the budget alone, the plan being described once by the readouts', () => {
    assert.equal(budgetLabel(32 * MiB, 37 * MiB), '32.00 MiB (86% of eager)');
    assert.equal(budgetLabel(32 * MiB, null), '32.00 MiB');
  });

  it('puts the smallest checked plan and the eager peak at the slider ends, in any row order', () => {
    assert.deepEqual(frontierEnds(frontier), { minimum: 23 * MiB, minimumBudget: 24 * MiB, eager: 40 * MiB });
    assert.equal(frontierEnds([]), null);
  });

  it('places a slider without a frontier at the budget between 0 B and the eager peak', () => {
    const at = sliderWithoutFrontier(0.6 * 246 * MiB, 246 * MiB);
    assert.deepEqual(at && [at.value, at.minimumText, at.eagerText], [600, '0 B', 'eager 246.00 MiB']);
    assert.match(at?.note ?? '', /not known/);
    assert.equal(sliderWithoutFrontier(300 * MiB, 246 * MiB)?.value, BYTE_SLIDER_STEPS);
    assert.equal(sliderWithoutFrontier(null, 246 * MiB), null);
    assert.equal(sliderWithoutFrontier(1, null), null);
  });

  it('relates the strategy drawn to the one selected', () => {
    assert.equal(strategyReadout('rotor', 'rotor'), 'rotor');
    assert.equal(strategyReadout('rockmate', 'auto'), 'rockmate (chosen by auto)');
    assert.equal(strategyReadout('rotor', 'olla'), "rotor (the frontier's plan; olla selected)");
    assert.equal(strategyReadout('checkmate', null), 'checkmate');
  });

  it('finds the smallest frontier budget covering the plan budget', () => {
    assert.equal(nearestFrontierIndex(frontier, 30 * MiB), 2);
    assert.equal(nearestFrontierIndex(frontier, 24 * MiB), 1);
    assert.equal(nearestFrontierIndex(frontier, 10 * MiB), 1);
    assert.equal(nearestFrontierIndex(frontier, 50 * MiB), 0);
    assert.equal(nearestFrontierIndex(frontier, null), 0);
    assert.equal(nearestFrontierIndex([], 10), -1);
  });

  it('offers every strategy memviz.plan accepts', () => {
    assert.deepEqual([...STRATEGIES].sort(), [
      'auto',
      'autochunk',
      'checkmate',
      'checkmate-lp',
      'none',
      'olla',
      'rockmate',
      'rotor',
      'sqrt'
    ]);
  });
});

describe('version', () => {
  it('matches package.json', () => {
    const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8'));
    assert.equal(MODULE_VERSION, pkg.version);
    assert.equal(MODULE_NAME, pkg.name);
  });
});

describe('computeStep', () => {
  it('finds the first planned step running a compute node', () => {
    // The sample plan recomputes compute 0 at step 10; the first run is step 0.
    assert.equal(computeStep(SAMPLE, 0), 0);
    assert.equal(computeStep(SAMPLE, 2), 3);
    assert.equal(computeStep(SAMPLE, 99), null);
  });
});

describe('exportOutcome', () => {
  it('shows a failed export as an error, a refusal as a question with the files to overwrite', () => {
    const failed = exportOutcome(
      JSON.stringify({ ok: false, message: 'FileNotFoundError: memviz_export/m.py' })
    );
    assert.deepEqual(failed, { message: 'FileNotFoundError: memviz_export/m.py', error: true, exists: [] });
    const refused = exportOutcome(JSON.stringify({ ok: false, exists: ['a.py'], message: 'a.py exists' }));
    assert.deepEqual(refused, { message: 'a.py exists', error: false, exists: ['a.py'] });
    assert.deepEqual(exportOutcome('not json').error, true);
  });

  it('shows a success as information, with the kernel note', () => {
    const done = exportOutcome(JSON.stringify({ ok: true, paths: ['a.py', 'a.plan.json'] }));
    assert.deepEqual(done, { message: 'exported: a.py, a.plan.json', error: false, exists: [] });
    const noted = exportOutcome(JSON.stringify({ ok: true, paths: ['a.py'], message: 're-planned' }));
    assert.equal(noted.message, 'exported: a.py (re-planned)');
    assert.deepEqual(exportOutcome(''), { message: '', error: false, exists: [] });
  });
});

describe('isErrorStatus', () => {
  it('tells the kernel error status from a plan summary', () => {
    assert.equal(isErrorStatus('error: rotor: infeasible (showing the frontier plan)'), true);
    assert.equal(isErrorStatus('memviz: cannot render this plan: bad'), true);
    assert.equal(isErrorStatus('memviz plan: peak 3 MiB, errors none'), false);
  });
});
