import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { FIT_MIN_SCALE, View, fitReadable, fitView, focusView, zoomAt } from '../src/graph_data';
import {
  LEGEND,
  RUN_MIN,
  WRAP_COLUMNS,
  WRAP_MAX,
  blockRuns,
  COMPACT_SPACING,
  buildTree,
  closedRows,
  collapse,
  defaultExpansion,
  dotString,
  moduleLabel,
  openCost,
  openTwins,
  parseNodeId,
  representative,
  revealCompute,
  runLabel,
  runOpenCost,
  search,
  toDot,
  tooltipFor,
  visibleCount,
  withTwins
} from '../src/graph_tree';
import { PlanDoc } from '../src/transforms';
import { HOSTILE, samplePlan } from './sample';

/**
 * Two layers (`layers.0`, `layers.1`, each `attn` + `mlp`) forward and backward, plus a root-level
 * loss; a parameter read by both layers' attention; op 2 recomputed by the plan.
 */
function layered(layers = 2): PlanDoc {
  const computes: PlanDoc['graph']['computes'] = [];
  const datas: PlanDoc['graph']['datas'] = [];
  const data = (name: string, kind: string, producer: number | null): number => {
    datas.push({ id: datas.length, name, bytes: 1024, kind, producer, consumers: [] });
    return datas.length - 1;
  };
  const op = (name: string, module: string, phase: string, inputs: number[], kind = 'saved'): number => {
    const id = computes.length;
    const out = data(`${name}.out`, kind, id);
    computes.push({ id, name, op: `aten.${name}`, phase, module, inputs, outputs: [out] });
    for (const i of inputs) {
      datas[i].consumers!.push(id);
    }
    return out;
  };
  const x = data('x', 'input', null);
  const w = data('shared.weight', 'parameter', null);
  let h = x;
  const acts: number[] = [];
  for (let i = 0; i < layers; i++) {
    h = op(`attn${i}`, `layers.${i}.attn`, 'forward', [h, w]);
    acts.push(h);
    h = op(`mlp${i}`, `layers.${i}.mlp`, 'forward', [h]);
    acts.push(h);
  }
  let g = op('loss', '', 'forward', [h], 'output');
  for (const [k, i] of [...acts.keys()].reverse().entries()) {
    g = op(`grad${k}`, `layers.${i >> 1}.${i % 2 ? 'mlp' : 'attn'}`, 'backward', [g, acts[i]], 'gradient');
  }
  const schedule: [string, number][] = computes.map(c => ['compute', c.id]);
  schedule.splice(7, 0, ['compute', 2]); // op 2 (attn1) runs again before grad2
  return {
    schema: 'memviz.plan/1',
    strategy: 'test',
    budget_bytes: null,
    graph: { computes, datas },
    planned: {
      schedule,
      timeline: { step_bytes: [], by_category: {}, peak_bytes: 0, peak_step: 0, total_time: 0 }
    }
  };
}

/** The node ids a DOT text declares (`"c1" [id="c1", ...]`), clusters excluded. */
function declaredNodes(dot: string): string[] {
  return [...dot.matchAll(/^\s*"([cdm]\d+)" \[id=/gm)].map(m => m[1]);
}

test('svg ids map back to ops, tensors and modules', () => {
  assert.deepEqual(parseNodeId('c12'), { kind: 'compute', id: 12 });
  assert.deepEqual(parseNodeId('d0'), { kind: 'data', id: 0 });
  assert.deepEqual(parseNodeId('m3'), { kind: 'module', id: 3 });
  for (const bad of ['node1', 'c', 'c1x', 'edge3', '', null, undefined, 'c-1', 'b3', 'cluster_m3']) {
    assert.equal(parseNodeId(bad), null, String(bad));
  }
});

test('the module tree holds each phase by module path, with op and recompute counts', () => {
  const doc = layered();
  const tree = buildTree(doc);
  const paths = tree.modules.map(m => `${m.phase}:${m.path}`);
  for (const p of ['forward:', 'forward:layers', 'forward:layers.1.mlp', 'backward:layers.0.attn']) {
    assert.ok(paths.includes(p), p);
  }
  assert.deepEqual(
    tree.roots.map(r => tree.modules[r].phase),
    ['forward', 'backward']
  );
  const fwd = tree.modules[tree.roots[0]];
  assert.equal(fwd.total, 5);
  assert.deepEqual(fwd.computes, [4]); // the loss sits outside any module
  const layers = tree.modules[paths.indexOf('forward:layers')];
  assert.equal(layers.total, 4);
  assert.equal(layers.recomputed, 1);
  assert.equal(tree.runs[2], 2);
});

test('collapsed modules stand for their ops; the drawing counts what the DOT declares', () => {
  const doc = layered();
  const tree = buildTree(doc);
  const none = new Set<number>();
  assert.deepEqual(representative(tree, none, 3), { kind: 'module', id: tree.roots[0] });
  const all = new Set(tree.modules.map(m => m.id));
  for (const expanded of [none, all, defaultExpansion(doc, tree, 6), defaultExpansion(doc, tree, 12)]) {
    const dot = toDot(doc, tree, expanded);
    assert.equal(visibleCount(doc, tree, expanded), declaredNodes(dot).length);
  }
  // fully open: 9 ops, their 9 tensors and the input; the parameter is never a node
  assert.equal(visibleCount(doc, tree, all), 19);
  assert.ok(!toDot(doc, tree, all).includes('shared.weight'));
  // opening stops at the limit; a small graph opens fully
  for (const limit of [1, 4, 6, 10]) {
    assert.ok(
      visibleCount(doc, tree, defaultExpansion(doc, tree, limit)) <= Math.max(limit, tree.roots.length)
    );
  }
  assert.equal(visibleCount(doc, tree, defaultExpansion(doc, tree, 1000)), 19);
  // closing a module closes what is under it
  const closed = collapse(tree, all, tree.roots[0]);
  assert.ok(tree.modules.filter(m => m.phase === 'forward').every(m => !closed.has(m.id)));
  assert.ok(closed.has(tree.roots[1]));
});

test('the backward is laid out as a ladder beside the forward: its own edges reversed', () => {
  const doc = layered();
  const tree = buildTree(doc);
  const dot = toDot(doc, tree, new Set(tree.modules.map(m => m.id)));
  // grad0 (op 5) writes d7, read by grad1 (op 6): drawn as "c6" -> "d7" with the arrow at the reader
  assert.match(dot, /"c6" -> "d7" \[dir=back\];/);
  assert.match(dot, /"d7" -> "c5" \[dir=back\];/);
  // forward edges keep their direction; a saved activation read by the backward is dashed
  assert.match(dot, /"c0" -> "d2";/);
  assert.match(dot, /"d4" -> "c6" \[style=dashed/);
});

test('hostile names are escaped in the DOT and ids are only c/d/m numbers', () => {
  const doc = layered();
  doc.graph.computes[0].name = `${HOSTILE}"];evil\\N`;
  doc.graph.computes[0].module = `layers.0.<b>"x"`;
  doc.graph.datas[2].name = `a\nb & "c"`;
  const tree = buildTree(doc);
  const dot = toDot(doc, tree, new Set(tree.modules.map(m => m.id)));
  assert.ok(!dot.includes('<img'));
  assert.ok(dot.includes('&lt;img src=x onerror=alert(1)&gt;\\"];evil\\\\N'));
  assert.ok(dot.includes('a\\nb &amp; \\"c\\"'));
  for (const m of dot.matchAll(/id="([^"]*)"/g)) {
    assert.match(m[1], /^[cdm]\d+$/);
  }
  assert.equal(dotString('\\'), '\\\\');
  // tooltips are the real names, unescaped text (the view sets them with textContent)
  assert.ok(tooltipFor(doc, tree, { kind: 'compute', id: 0 }).startsWith(`${HOSTILE}"];evil\\N: aten.attn0`));
  assert.match(tooltipFor(doc, tree, { kind: 'compute', id: 0 }), /reads: x, shared\.weight/);
  assert.match(
    tooltipFor(doc, tree, { kind: 'module', id: tree.roots[1] }),
    /^backward \(ops outside any module\)\n4 ops/
  );
});

test('blocks are named by their class, escaped in the DOT, as text in tooltips', () => {
  const doc = layered(4);
  const classes: Record<string, string> = { '': 'app.Net', layers: 'torch.nn.modules.container.ModuleList' };
  for (let i = 0; i < 4; i++) {
    classes[`layers.${i}`] = 'transformers.models.gpt2.modeling_gpt2.GPT2Block';
    classes[`layers.${i}.attn`] = HOSTILE;
    classes[`layers.${i}.mlp`] = 'make.<locals>.MLP';
  }
  doc.schema = 'memviz.plan/2';
  doc.graph.meta = { module_classes: classes };
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const open = new Set([tree.roots[0], tree.roots[1], path('forward:layers'), path('backward:layers')]);
  const [run] = blockRuns(doc, tree, open, new Set());
  assert.equal(runLabel(tree, run), '4 x GPT2Block  layers.0..3\n2 ops each, 1 recomputed');
  assert.match(
    tooltipFor(doc, tree, { kind: 'run', id: run.members[0] }, [run]),
    /^layers\.0 \.\. layers\.3 \[forward\]\nclass: transformers\.models\.gpt2\.modeling_gpt2\.GPT2Block\n4 alike/
  );
  assert.equal(moduleLabel(tree, path('forward:layers.2')), 'GPT2Block layers.2');
  assert.equal(moduleLabel(tree, path('forward:layers.2.mlp')), 'MLP mlp');
  assert.equal(moduleLabel(tree, tree.roots[0]), 'forward');
  // a class from user code reaches the DOM: entities in the DOT, the raw text in tooltips (textContent)
  const all = new Set(tree.modules.map(m => m.id));
  all.delete(path('forward:layers.1.attn'));
  const dot = toDot(doc, tree, all, new Set(['layers.0']));
  assert.ok(!dot.includes('<img'));
  assert.ok(dot.includes('label="&lt;img src=x onerror=alert(1)&gt; attn\\n1 op,'));
  assert.ok(dot.includes('label="&lt;img src=x onerror=alert(1)&gt; layers.0.attn"'));
  assert.equal(
    tooltipFor(doc, tree, { kind: 'module', id: path('forward:layers.1.attn') }),
    `layers.1.attn [forward]\nclass: ${HOSTILE}\n1 op, 1 recomputed`
  );
  assert.ok(
    tooltipFor(doc, tree, { kind: 'compute', id: 0 }).includes(`\nmodule: layers.0.attn (${HOSTILE})\n`)
  );
  // a version 1 plan (no classes) keeps the container's name; members of unlike classes too
  delete doc.graph.meta;
  const plain = buildTree(doc);
  assert.equal(
    runLabel(plain, blockRuns(doc, plain, open, new Set())[0]).split('\n')[0],
    '4 x layers [0..3]'
  );
  doc.graph.meta = { module_classes: { ...classes, 'layers.3': 'other.Block' } };
  const mixed = buildTree(doc);
  assert.equal(
    runLabel(mixed, blockRuns(doc, mixed, open, new Set())[0]).split('\n')[0],
    '4 x layers [0..3]'
  );
});

test('search finds ops by name, op or module and tensors at their producer or first reader', () => {
  const doc = layered();
  const tree = buildTree(doc);
  // the op itself, then its output tensor, shown at the op
  assert.deepEqual(
    search(doc, 'MLP1').map(h => [h.compute, h.data]),
    [
      [3, null],
      [3, 5]
    ]
  );
  assert.deepEqual(
    search(doc, 'layers.1.mlp').map(h => h.compute),
    [3, 5]
  );
  const param = search(doc, 'shared.weight');
  assert.deepEqual(param, [{ compute: 0, data: 1, text: 'shared.weight' }]);
  assert.deepEqual(search(doc, '  '), []);
  assert.deepEqual(search(doc, 'nothing'), []);
  // revealing an op opens exactly the modules above it
  const opened = revealCompute(tree, new Set(), 3);
  assert.deepEqual(representative(tree, opened, 3), { kind: 'compute', id: 3 });
  assert.equal(representative(tree, opened, 0).kind, 'module');
});

test('legend rows have distinct fates and hex colors', () => {
  const fates = LEGEND.map(r => r.fate);
  assert.equal(new Set(fates).size, fates.length);
  for (const f of ['module', 'kept', 'recomputed', 'freed_early', 'gradient']) {
    assert.ok(fates.includes(f as (typeof fates)[number]), f);
  }
  assert.ok(LEGEND.every(r => /^#[0-9a-f]{6}$/.test(r.color)));
});

test('a real plan document: every drawn id is unique and the count matches the DOT', () => {
  const doc = samplePlan();
  const tree = buildTree(doc);
  for (const expanded of [new Set<number>(), defaultExpansion(doc, tree, 150)]) {
    const ids = declaredNodes(toDot(doc, tree, expanded));
    assert.equal(new Set(ids).size, ids.length);
    assert.equal(visibleCount(doc, tree, expanded), ids.length);
  }
});

test('zoom keeps the pointer fixed and clamps the scale', () => {
  const v = zoomAt({ x: 10, y: 20, k: 1 }, 100, 50, 2);
  assert.equal(v.k, 2);
  assert.equal((100 - 10) / 1, (100 - v.x) / v.k);
  assert.equal((50 - 20) / 1, (50 - v.y) / v.k);
  assert.equal(zoomAt({ x: 0, y: 0, k: 1 }, 0, 0, 1e6).k, 20);
  assert.equal(zoomAt({ x: 0, y: 0, k: 1 }, 0, 0, 1e-6).k, 0.01);
});

test('fit shrinks a large drawing into the box, centered, and never magnifies a small one', () => {
  const big = fitView({ w: 4407, h: 12940 }, { w: 800, h: 600 });
  assert.ok(big.k < 1);
  assert.ok(12940 * big.k <= 600 - 16 + 1e-9);
  assert.ok(Math.abs(big.x - (800 - 4407 * big.k) / 2) < 1e-9);
  assert.deepEqual(fitView({ w: 100, h: 50 }, { w: 800, h: 600 }), { x: 350, y: 275, k: 1 });
  assert.deepEqual(fitView({ w: 0, h: 0 }, { w: 800, h: 600 }), { x: 0, y: 0, k: 1 });
});

test('a drawing lands on what was opened: whole when readable, else readable and centered on it', () => {
  const box = { w: 848, h: 600 };
  // a small drawing: all of it, centered, never magnified
  const small = { w: 400, h: 500 };
  assert.deepEqual(focusView({ x: 0, y: 0, ...small }, small, box), fitView(small, box));
  // the 12-layer drawing (2676 x 3848 px) opens on its forward and backward frames side by side
  // (0..1900): both are too wide together for a readable scale, so the view is at the label floor,
  // centered on them, at their top.  It opened at its top-left corner before, the backward cut off.
  const drawing = { w: 2676, h: 3848 };
  const phases = { x: 10, y: 10, w: 1890, h: 3830 };
  const open = focusView(phases, drawing, box);
  assert.equal(open.k, FIT_MIN_SCALE);
  assert.ok(FIT_MIN_SCALE * 10 * (4 / 3) >= 8 - 1e-9); // Graphviz's 10 pt labels at >= 8 CSS px
  assert.ok(Math.abs(open.x + (phases.x + phases.w / 2) * open.k - box.w / 2) < 1e-9);
  assert.ok(Math.abs(open.y + phases.y * open.k - 8) < 1e-9);
  // a module opened with its twin in the other phase: two 110-layer frames, 30,000 px tall; shown at
  // the floor from their top with both frames across, not fitted whole at a 2% scale (issue 18)
  const tall = { w: 700, h: 31000 };
  const twins = { x: 100, y: 200, w: 420, h: 30000 };
  const opened = focusView(twins, tall, box);
  assert.equal(opened.k, FIT_MIN_SCALE);
  assert.ok(Math.abs(opened.y - (8 - 200 * FIT_MIN_SCALE)) < 1e-9);
  assert.ok(opened.x + twins.x * opened.k >= 0 && opened.x + (twins.x + twins.w) * opened.k <= box.w);
  // the 92-layer overview (567 x 1018 px, narrower than the box at 1:1): whole it would be at 0.57,
  // under the floor; it opened at 1:1 (its full width), showing 58% of its height, now at the floor
  // from its top, 97% of it (issue 18)
  const deep = { w: 567, h: 1018 };
  const overview = focusView({ x: 0, y: 0, ...deep }, deep, box);
  assert.equal(overview.k, FIT_MIN_SCALE);
  assert.equal(overview.y, 8);
  assert.ok((box.h - 8) / (deep.h * overview.k) > 0.95);
  // wider than the box at 1:1 and too tall: the floor too, the most of it that stays readable
  const wide = focusView({ x: 0, y: 0, w: 1200, h: 9000 }, { w: 1200, h: 9000 }, box);
  assert.equal(wide.k, FIT_MIN_SCALE);
  // a run unrolled at 92 layers: the view lands on both phases' frames from their top, slid down just
  // enough to show the clicked run's first block whole (it lay below the fold: the click seemed to do
  // nothing); a block already in view does not move the view
  const unrolled = { w: 760, h: 9000 };
  const phaseFrames = { x: 10, y: 10, w: 740, h: 8980 };
  const block0 = { x: 60, y: 1300, w: 180, h: 40 };
  const top = focusView(phaseFrames, unrolled, box);
  const slid = focusView(phaseFrames, unrolled, box, block0);
  assert.equal(slid.k, top.k);
  assert.equal(slid.x, top.x);
  assert.ok(top.y + (block0.y + block0.h) * top.k > box.h, 'below the fold from the top');
  assert.ok(Math.abs(slid.y + (block0.y + block0.h) * slid.k - (box.h - 8)) < 1e-9, 'its bottom in view');
  const near = { ...block0, y: 300 };
  assert.deepEqual(focusView(phaseFrames, unrolled, box, near), top);
  // a search hit near the drawing's left edge: centered where it can be, with no blank band beside it
  const hit = focusView({ x: 5, y: 2000, w: 80, h: 30 }, drawing, box);
  assert.equal(hit.k, 1);
  assert.equal(hit.x, 8);
  assert.ok(Math.abs(hit.y + 2015 - 300) < 1e-9);
  assert.deepEqual(focusView({ x: 0, y: 0, w: 0, h: 0 }, drawing, box), { x: 0, y: 0, k: 1 });
});

test('an opened module too wide with its twin for the box lands whole itself, the twin cut', () => {
  // the 12-layer GPT's block 3 opened beside its backward twin (drawing px at 1:1): 1372 px together,
  // 823 px at the label floor; in an 848 px output both land whole, in a 782 px one (JupyterLab's
  // sidebar at 316 px) centering cut both frames 22 px
  const drawing = { w: 1933, h: 1269 };
  const twins = { x: 380, y: 587, w: 1372, h: 645 };
  const forward = { x: 380, y: 587, w: 156, h: 645 };
  const backward = { x: 1325, y: 587, w: 427, h: 636 };
  const inView = (v: View, r: { x: number; w: number }, w: number) =>
    v.x + r.x * v.k >= 8 - 1e-9 && v.x + (r.x + r.w) * v.k <= w - 8 + 1e-9;
  const wide = { w: 848, h: 600 };
  const both = focusView(twins, drawing, wide, forward);
  const before = focusView(twins, drawing, wide); // it fits: centered as before
  assert.equal(both.k, before.k);
  assert.ok(Math.abs(both.x - before.x) < 1e-9 && both.y === before.y);
  assert.ok(inView(both, forward, wide.w) && inView(both, backward, wide.w));
  const narrow = { w: 782, h: 600 };
  const centered = focusView(twins, drawing, narrow);
  assert.equal(centered.k, FIT_MIN_SCALE);
  assert.ok(!inView(centered, forward, narrow.w) && !inView(centered, backward, narrow.w));
  for (const [opened, twin] of [
    [forward, backward],
    [backward, forward]
  ]) {
    const v = focusView(twins, drawing, narrow, opened);
    assert.equal(v.k, FIT_MIN_SCALE); // never below the floor
    assert.ok(inView(v, opened, narrow.w), 'the opened frame whole');
    assert.ok(!inView(v, twin, narrow.w), 'its twin cut where both cannot fit');
    assert.equal(v.y, centered.y);
  }
});

test('Fit never shrinks labels below the floor: whole, else the floor, kept centered', () => {
  const box = { w: 800, h: 600 };
  // small enough to show whole at a legible scale: plain fitView
  assert.deepEqual(fitReadable({ w: 1000, h: 700 }, box, { x: 0, y: 0, k: 1 }), {
    view: fitView({ w: 1000, h: 700 }, box),
    kind: 'whole'
  });
  // the 12-layer drawing (2007 x 2886 pt drawn as CSS px): whole it would be at 0.2, below the floor
  assert.ok(fitView({ w: 2676, h: 3848 }, box).k < FIT_MIN_SCALE);
  const open = focusView({ x: 0, y: 0, w: 2676, h: 3848 }, { w: 2676, h: 3848 }, box);
  const fit = fitReadable({ w: 2676, h: 3848 }, box, open);
  assert.equal(fit.kind, 'readable');
  assert.equal(fit.view.k, FIT_MIN_SCALE);
  assert.ok(FIT_MIN_SCALE * 10 * (4 / 3) >= 8 - 1e-9); // 10 pt labels at >= 8 CSS px
  // no empty band: the drawing covers the box on both axes
  assert.ok(fit.view.x <= 8 && fit.view.x + 2676 * fit.view.k >= 800 - 8);
  assert.ok(fit.view.y <= 8 && fit.view.y + 3848 * fit.view.k >= 600 - 8);
  // a narrow tall drawing: the floor (not its "full width" at 1:1, which showed less of it), centered
  // on what the user looked at
  const tall = { w: 700, h: 9000 };
  const at = { x: 0, y: -3000, k: 1 }; // looking at drawing y = 3300 in the box's center
  const narrow = fitReadable(tall, box, at);
  assert.equal(narrow.kind, 'readable');
  assert.equal(narrow.view.k, FIT_MIN_SCALE);
  assert.ok(Math.abs(narrow.view.x - (800 - 700 * FIT_MIN_SCALE) / 2) < 1e-9);
  assert.ok(Math.abs((300 - narrow.view.y) / narrow.view.k - 3300) < 1e-6);
  const wider = fitReadable({ w: 1200, h: 9000 }, box, at);
  assert.equal(wider.view.k, FIT_MIN_SCALE);
  assert.ok(Math.abs((300 - wider.view.y) / wider.view.k - 3300) < 1e-6);
  // near the top edge the view is clamped: no blank above the drawing
  assert.equal(fitReadable(tall, box, { x: 0, y: 500, k: 1 }).view.y, 8);
});

test('an op without a module is drawn inside the module around it, and its tooltip says so', () => {
  const doc = layered();
  // a gradient sum with no module between layers.1.mlp's and layers.0.mlp's backward: in `layers`
  doc.graph.computes[6].module = '';
  const tree = buildTree(doc);
  assert.equal(tree.placedIn[6], 'layers');
  assert.equal(tree.modules[tree.moduleOf[6]].path, 'layers');
  assert.match(
    tooltipFor(doc, tree, { kind: 'compute', id: 6 }),
    /module: none \(drawn in layers, where it runs\)/
  );
  // the loss ends the forward: nothing after it in its phase, so it stays at the root
  assert.equal(tree.placedIn[4], null);
  assert.equal(tree.modules[tree.moduleOf[4]].path, '');
});

test('alike sibling modules open together or not at all; a large sibling keeps no small one closed', () => {
  const doc = layered();
  const tree = buildTree(doc);
  for (let limit = 1; limit < 40; limit++) {
    const open = defaultExpansion(doc, tree, limit);
    for (const m of tree.modules) {
      if (m.parent !== null && open.has(m.parent)) {
        const siblings = tree.modules[m.parent].children.filter(s => tree.modules[s].total === m.total);
        const opened = siblings.filter(s => open.has(s)).length;
        assert.ok(opened === 0 || opened === siblings.length, `limit ${limit}: ${m.phase}:${m.path}`);
      }
    }
  }
});

test("a module's backward twin opens with its forward one or stays closed with it", () => {
  const doc = layered();
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const [forward, backward] = [path('forward:layers'), path('backward:layers')];
  const opened: boolean[] = [];
  for (let limit = 1; limit < 40; limit++) {
    const open = defaultExpansion(doc, tree, limit);
    if (!tree.roots.every(r => open.has(r))) {
      continue; // a closed phase is one box: nothing of it to compare
    }
    assert.equal(open.has(forward), open.has(backward), `limit ${limit}`);
    assert.ok(visibleCount(doc, tree, open) <= Math.max(limit, tree.roots.length), `limit ${limit}`);
    opened.push(open.has(forward));
  }
  assert.ok(opened.includes(true) && opened.includes(false));
});

test("a click opens a module's drawn twins in the other phases", () => {
  const doc = layered();
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const roots = new Set(tree.roots);
  assert.deepEqual(withTwins(tree, roots, path('forward:layers')), [
    path('forward:layers'),
    path('backward:layers')
  ]);
  // a twin already open, or not drawn (its parent closed), is left as it is
  const open = new Set([...roots, path('forward:layers'), path('backward:layers')]);
  assert.deepEqual(withTwins(tree, open, path('forward:layers.0')), [
    path('forward:layers.0'),
    path('backward:layers.0')
  ]);
  assert.deepEqual(withTwins(tree, new Set([tree.roots[0]]), path('forward:layers')), [
    path('forward:layers')
  ]);
});

test("a click on an open module's frame closes its open twins too, as a click opened them", () => {
  const doc = layered();
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const [fwd, bwd] = [path('forward:layers.0'), path('backward:layers.0')];
  const open = new Set([...tree.roots, path('forward:layers'), path('backward:layers'), fwd, bwd]);
  assert.deepEqual(openTwins(tree, open, fwd), [fwd, bwd]);
  assert.deepEqual(openTwins(tree, open, bwd), [bwd, fwd]);
  // a closed twin is left alone; closing both leaves no frame of block 0 in the DOT
  assert.deepEqual(openTwins(tree, new Set([...open].filter(m => m !== bwd)), fwd), [fwd]);
  const closed = openTwins(tree, open, fwd).reduce((e, m) => collapse(tree, e, m), open as Set<number>);
  assert.ok(!closed.has(fwd) && !closed.has(bwd) && closed.has(path('backward:layers')));
  const dot = toDot(doc, tree, closed);
  assert.ok(!dot.includes(`cluster_m${fwd}"`) && !dot.includes(`cluster_m${bwd}"`));
  assert.ok(dot.includes(`"m${bwd}" [id="m${bwd}"`));
});

test('at 92 layers the blocks open as one counted node per phase: a run costs what it draws', () => {
  const doc = layered(92);
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const [fwd, bwd] = [path('forward:layers'), path('backward:layers')];
  // counted member by member, opening both phases' "layers" is 182 nodes, above the glance (150):
  // they stayed one closed box each and the overview, without its runs, opened cut at 1:1 (issue 18)
  assert.ok(openCost(doc, tree, fwd) + openCost(doc, tree, bwd) > 150);
  // drawn, each is one "92 x" node in place of its box
  assert.equal(runOpenCost(doc, tree, fwd), 0);
  assert.equal(runOpenCost(doc, tree, bwd), 0);
  const open = defaultExpansion(doc, tree, 150);
  assert.ok(open.has(fwd) && open.has(bwd));
  assert.ok(!open.has(path('forward:layers.0')));
  const runs = blockRuns(doc, tree, open, new Set());
  assert.deepEqual(
    runs.map(r => r.members.length),
    [92, 92]
  );
  const dot = toDot(doc, tree, open);
  assert.ok(declaredNodes(dot).length + (dot.match(/"r\d+" \[id=/g) ?? []).length <= 150);
  // the compact overview spacing of a drawing with runs
  assert.ok(dot.includes(`ranksep=${COMPACT_SPACING.ranksep}`));
});

test('closed siblings stack in forward order in every phase; phase-crossing edges do not rank', () => {
  const doc = layered();
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const open = new Set([tree.roots[0], tree.roots[1], path('forward:layers'), path('backward:layers')]);
  const dot = toDot(doc, tree, open);
  for (const phase of ['forward', 'backward']) {
    const [a, b] = [path(`${phase}:layers.0`), path(`${phase}:layers.1`)];
    assert.match(dot, new RegExp(`"m${a}" -> "m${b}" \\[style=invis, weight=10\\];`), phase);
  }
  // a saved activation read by the backward: dashed, constraint=false, classed by both ends
  assert.match(
    dot,
    /-> "m\d+" \[style=dashed, color="#9e9e9e", constraint=false, class="cross from-m\d+ to-m\d+"\];/
  );
  assert.ok(!/\[dir=back\][^\n]*constraint=false/.test(dot));
});

test('a large module beside small ones: the small ones still open', () => {
  const doc = layered();
  // a third top-level module of 30 ops in the forward ("mixer"), after the layers
  const { computes, datas } = doc.graph;
  let prev = computes[3].outputs![0];
  for (let i = 0; i < 30; i++) {
    const id = computes.length;
    datas.push({
      id: datas.length,
      name: `mix${i}.out`,
      bytes: 1024,
      kind: 'saved',
      producer: id,
      consumers: []
    });
    computes.push({
      id,
      name: `mix${i}`,
      op: 'aten.mix',
      phase: 'forward',
      module: 'mixer',
      inputs: [prev],
      outputs: [datas.length - 1]
    });
    prev = datas.length - 1;
  }
  const tree = buildTree(doc);
  const open = defaultExpansion(doc, tree, 20);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  assert.ok(open.has(path('forward:layers')));
  assert.ok(!open.has(path('forward:mixer')));
});

test('more than 6 alike closed blocks wrap into rows, each ranked with its twin row, forward first', () => {
  const doc = layered(12);
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const open = new Set([tree.roots[0], tree.roots[1], path('forward:layers'), path('backward:layers')]);
  const block = (phase: string, i: number): string => `"m${path(`${phase}:layers.${i}`)}"`;
  const rows = closedRows(doc, tree, open).filter(row => row.length > 1);
  // 12 blocks per phase: two rows of 6 each (a 12-layer GPT's ladder was 1760 px tall, issue 18)
  assert.deepEqual(
    rows.map(row => row.map(m => tree.modules[m].path)),
    ['forward', 'forward', 'backward', 'backward'].map((_, r) =>
      [0, 1, 2, 3, 4, 5].map(i => `layers.${i + 6 * (r % 2)}`)
    )
  );
  // drawn one by one once their run is unrolled (a click on "12 x layers")
  const dot = toDot(doc, tree, open, new Set(['layers.0']));
  for (const r of [0, 1]) {
    const members = [0, 1, 2, 3, 4, 5].map(i => i + 6 * r);
    const names = [...members.map(i => block('forward', i)), ...members.map(i => block('backward', i))];
    assert.ok(dot.includes(`{ rank=same; ${names.join('; ')}; }`), `row ${r}`);
    // each row read left to right; rows stacked
    assert.ok(
      dot.includes(`${block('backward', members[0])} -> ${block('backward', members[1])} [style=invis];`)
    );
  }
  assert.ok(dot.includes(`${block('forward', 0)} -> ${block('forward', 6)} [style=invis, weight=10];`));
  // 6 or fewer stay one column (the two-block sample below), and so do more than 24 (110 layers' rows
  // were too wide for both phases in a narrow output; a column pans down)
  assert.equal(WRAP_COLUMNS, 6);
  assert.equal(WRAP_MAX, 24);
  const long = layered(25);
  const longTree = buildTree(long);
  const longPath = (p: string): number => longTree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const longOpen = new Set([...longTree.roots, longPath('forward:layers'), longPath('backward:layers')]);
  assert.ok(closedRows(long, longTree, longOpen).every(row => row.length === 1));
  // nor do blocks whose parent runs ops of its own in some phase (a captured GPT's backward residual
  // sums between its blocks): in every phase, so each block stays beside its twin
  const sums = layered(12);
  const sumsTree = buildTree(sums);
  const bwd = sumsTree.modules.findIndex(m => `${m.phase}:${m.path}` === 'backward:layers');
  sumsTree.modules[bwd].computes.push(sums.graph.computes.length - 1);
  assert.ok(closedRows(sums, sumsTree, open).every(row => row.length === 1));
  const small = layered();
  const smallTree = buildTree(small);
  const all = new Set(smallTree.modules.filter(m => m.children.length > 0).map(m => m.id));
  assert.ok(closedRows(small, smallTree, all).every(row => row.length === 1));
});

test("a closed module's twin ranks beside it; leaf modules stay closed while the hierarchy is", () => {
  const doc = layered();
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const open = new Set([tree.roots[0], tree.roots[1], path('forward:layers'), path('backward:layers')]);
  const dot = toDot(doc, tree, open);
  // ranks across clusters need newrank; block i's backward on block i's forward rank (a ladder)
  assert.match(dot, /newrank=true/);
  for (const i of [0, 1]) {
    const [f, b] = [path(`forward:layers.${i}`), path(`backward:layers.${i}`)];
    assert.ok(dot.includes(`{ rank=same; "m${f}"; "m${b}"; }`), `layers.${i}`);
  }
  // and the phases left to right, always (at 5.4k ops dot sometimes swapped the columns): an invisible
  // point whose edges to a node of each phase keep their order
  assert.match(dot, /"phase-order" \[shape=point, style=invis, width=0, height=0, ordering=out\];/);
  const anchors = [...dot.matchAll(/^ {2}"phase-order" -> "([cdm]\d+)" \[style=invis\];$/gm)].map(m => m[1]);
  assert.equal(anchors.length, 2);
  const phaseOf = (id: string): string => {
    const ref = parseNodeId(id)!;
    return ref.kind === 'compute'
      ? (doc.graph.computes[ref.id].phase ?? 'forward')
      : tree.modules[ref.id].phase;
  };
  assert.deepEqual(anchors.map(phaseOf), ['forward', 'backward']);
  // a one-op leaf module at the top ("head") beside the layers: while the layers' blocks stay closed
  // (a limit their ops pass), the leaf stays a box too; its ops and tensors side by side made a 12-layer
  // GPT's first drawing wider than a notebook
  const { computes, datas } = doc.graph;
  const id = computes.length;
  datas.push({ id: datas.length, name: 'head.out', bytes: 1024, kind: 'saved', producer: id, consumers: [] });
  computes.push({
    id,
    name: 'head',
    op: 'aten.mm',
    phase: 'forward',
    module: 'head',
    inputs: [computes[3].outputs![0]],
    outputs: [datas.length - 1]
  });
  const withHead = buildTree(doc);
  const head = withHead.modules.findIndex(m => m.phase === 'forward' && m.path === 'head');
  const layers = withHead.modules.findIndex(m => m.phase === 'forward' && m.path === 'layers');
  const block = withHead.modules.findIndex(m => m.phase === 'forward' && m.path === 'layers.0');
  const limit =
    visibleCount(
      doc,
      withHead,
      new Set([...withHead.roots, ...withHead.modules.filter(m => m.path === 'layers').map(m => m.id)])
    ) + 2;
  const first = defaultExpansion(doc, withHead, limit);
  assert.ok(first.has(layers) && !first.has(block));
  assert.ok(!first.has(head));
  // a toy opens fully
  assert.ok(defaultExpansion(doc, withHead, 1000).has(head));
});

test('repeated blocks open as one counted node per phase, ranked with its twin; a click unrolls both', () => {
  const doc = layered(12);
  // autograd's residual sums between the backward's blocks, placed in `layers` (placedModules)
  const g = doc.graph;
  for (let i = 0; i < g.computes.length; i++) {
    const c = g.computes[i];
    if (c.phase === 'backward' && c.module === 'layers.5.attn') {
      const out = g.datas.length;
      g.datas.push({
        id: out,
        name: 'sum_5',
        bytes: 64,
        kind: 'gradient',
        producer: g.computes.length,
        consumers: []
      });
      g.computes.splice(i + 1, 0, {
        id: -1,
        name: 'sum_5',
        op: 'aten.add',
        phase: 'backward',
        inputs: c.outputs,
        outputs: [out]
      });
      break;
    }
  }
  // ids are positions: renumber after the insertion
  const old = g.computes.map(c => c.id);
  g.computes.forEach((c, i) => (c.id = i));
  const renumber = new Map(old.map((id, i) => [id, i] as const));
  renumber.set(
    -1,
    g.computes.findIndex(c => c.name === 'sum_5')
  );
  g.datas.forEach(d => {
    if (d.producer !== null && d.producer !== undefined) {
      d.producer = d.name === 'sum_5' ? renumber.get(-1)! : renumber.get(d.producer)!;
    }
    d.consumers = (d.consumers ?? []).map(c => renumber.get(c)!);
  });
  doc.planned.schedule = g.computes.map(c => ['compute', c.id]) as PlanDoc['planned']['schedule'];
  const tree = buildTree(doc);
  const path = (p: string): number => tree.modules.findIndex(m => `${m.phase}:${m.path}` === p);
  const open = defaultExpansion(doc, tree, 150);
  // the blocks stay closed (150 nodes would hold them), their parent opens
  assert.ok(open.has(path('forward:layers')) && open.has(path('backward:layers')));
  assert.ok(!open.has(path('forward:layers.0')));
  const runs = blockRuns(doc, tree, open, new Set());
  assert.equal(runs.length, 2);
  assert.ok(RUN_MIN <= 12);
  const [fwd, bwd] = [path('forward:layers.0'), path('backward:layers.0')];
  assert.deepEqual(
    runs.map(r => r.members.length),
    [12, 12]
  );
  // the backward's sum between two blocks is drawn inside its run, not between its rows
  const sum = g.computes.findIndex(c => c.name === 'sum_5');
  assert.deepEqual(runs.find(r => r.members[0] === bwd)!.absorbed, [sum]);
  const dot = toDot(doc, tree, open);
  assert.match(
    dot,
    new RegExp(
      `"r${fwd}" \\[id="r${fwd}", class="module run".*label="12 x layers \\[0\\.\\.11\\]\\\\n2 ops each`
    )
  );
  assert.ok(dot.includes(`{ rank=same; "r${fwd}"; "r${bwd}"; }`));
  assert.ok(
    !/"m\d+" \[id=/.test(
      dot
        .split('\n')
        .filter(l => l.includes('layers.'))
        .join('\n')
    )
  );
  assert.ok(!dot.includes(`"c${sum}"`) && !dot.includes('sum_5'));
  assert.deepEqual(parseNodeId(`r${fwd}`), { kind: 'run', id: fwd });
  assert.match(
    tooltipFor(doc, tree, { kind: 'run', id: bwd }, runs),
    /^layers\.0 \.\. layers\.11 \[backward\]\n12 alike blocks of 2 ops each, 1 op between them/
  );
  // unrolled (by the first path, so both phases): 12 closed blocks per phase, no run node
  const unrolled = toDot(doc, tree, open, new Set([runs[0].key]));
  assert.ok(!/"r\d+"/.test(unrolled));
  assert.ok(unrolled.includes(`"m${fwd}" [id="m${fwd}"`) && unrolled.includes(`"m${bwd}" [id="m${bwd}"`));
  // the overview with its runs is spaced tighter (a captured 12-layer GPT's opened under the label
  // floor, issue 18); unrolled, dot's default spacing
  const spacing = (d: string): string[] => [
    /ranksep=([\d.]+)/.exec(d)![1],
    /node \[[^\]]*?margin="([^"]*)"/.exec(d)?.[1] ?? ''
  ];
  assert.deepEqual(spacing(dot), [String(COMPACT_SPACING.ranksep), COMPACT_SPACING.margin]);
  assert.deepEqual(spacing(unrolled), ['0.2', '']);
  // a member opened (a search hit in block 5) splits the run: 0..4 and 6..11 stay runs
  const hit = new Set([...open, path('forward:layers.5')]);
  assert.deepEqual(
    blockRuns(doc, tree, hit, new Set())
      .filter(r => tree.modules[r.members[0]].phase === 'forward')
      .map(r => r.members.map(m => tree.modules[m].path.split('.')[1]).join(',')),
    ['0,1,2,3,4', '6,7,8,9,10,11']
  );
  // two blocks are no run: the toy opens fully, as before
  const small = layered();
  const smallTree = buildTree(small);
  const all = defaultExpansion(small, smallTree, 1000);
  assert.deepEqual(blockRuns(small, smallTree, all, new Set()), []);
});
