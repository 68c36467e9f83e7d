/**
 * The offline report (memviz/views/report.py) opened from disk in system Chromium with every network request
 * refused: the bundled views (standalone.ts) must draw the memory curve, the inspector, the packing and
 * the Graphviz CD-graph from the one HTML file alone.  No JupyterLab here: plain Playwright.
 */
import { expect, test } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';

const ROOT = path.resolve(__dirname, '..', '..');
// The repository's packages (memviz, solvers, examples) whether or not it is installed.
const PYTHON_ENV = { ...process.env, PYTHONPATH: ROOT };
const HOSTILE = '<img src=x onerror=alert(1)>';

// The chain of ui-tests/notebooks/graph.ipynb (one op and its output carry a hostile name), planned by
// rotor at its smallest feasible budget, with packing, written by the CLI's own write_report.
const WRITE_REPORT = `
import sys
import memviz
from memviz.views.report import write_report
from solvers import GraphBuilder, Phase
from solvers.result import InfeasibleBudget

HOSTILE = ${JSON.stringify(HOSTILE)}
b = GraphBuilder("chain " + HOSTILE)
x = b.data("x", 2**20, "input")
prev, acts = x, []
for i in range(6):
    w = b.data(f"w{i}", 2**16, "parameter")
    a = b.data(HOSTILE if i == 2 else f"a{i}", 2**20, "saved")
    b.compute(HOSTILE if i == 2 else f"f{i}", [prev, w], [a], time=1.0, module=HOSTILE)
    acts.append(a)
    prev = a
loss = b.data("loss", 4, "output")
b.compute("loss", [prev], [loss], time=0.1)
g, outs = loss, [loss]
for i in reversed(range(6)):
    inp = acts[i - 1] if i else x
    gi = b.data(f"g{i}", 2**20, "gradient")
    gw = b.data(f"w{i}.grad", 2**16, "parameter_gradient")
    b.compute(f"b{i}", [g, acts[i], inp], [gi], time=1.0, phase=Phase.BACKWARD)
    b.compute(f"bw{i}", [gi, inp], [gw], time=1.0, phase=Phase.BACKWARD)
    outs.append(gw)
    g = gi
b.outputs = outs
graph = b.build()
try:
    memviz.plan(graph, 0.05, strategy="rotor", frontier=False, packing=False)
except InfeasibleBudget as exc:
    budget = exc.minimum_bytes
import torch  # noqa: F401 (the header names the torch the report was made with, when loaded)
write_report(memviz.plan(graph, budget, strategy="rotor", frontier=False), sys.argv[1], overwrite=True,
             command="memviz report chain.json " + HOSTILE)
`;

test('the offline report draws every view from disk with the network blocked', async ({ page }) => {
  const report = test.info().outputPath('report.html');
  execFileSync(process.env.PYTHON ?? 'python3', ['-c', WRITE_REPORT, report], { cwd: ROOT, env: PYTHON_ENV });

  // Anything but the file itself (and data:/blob: URLs made in the page) is refused and recorded.
  const fetched: string[] = [];
  await page.route('**/*', route => {
    const url = route.request().url();
    if (/^(file|data|blob):/.test(url)) {
      return route.continue();
    }
    fetched.push(url);
    return route.abort();
  });
  const errors: string[] = [];
  page.on('pageerror', err => errors.push(err.message));
  page.on('console', msg => {
    if (msg.type() === 'error') {
      errors.push(msg.text());
    }
  });
  await page.setViewportSize({ width: 1200, height: 900 });
  await page.goto(pathToFileURL(report).href);

  // Memory: the stacked curve, the readouts and the hostile title as text.
  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  const fills = view.locator('.scatterlayer .trace path.js-fill');
  await expect(fills.first()).toBeVisible();
  expect(((await fills.first().getAttribute('d')) ?? '').split(/[HV]/).length).toBeGreaterThan(20);
  await expect(
    view.locator('.jp-memviz-readout[data-readout="strategy"] .jp-memviz-readout-value')
  ).toHaveText('rotor');
  expect(await view.locator('.gtitle').textContent()).toContain(HOSTILE);
  await expect(page).toHaveTitle(`memviz report: chain ${HOSTILE}`);
  await page.screenshot({ path: test.info().outputPath('report-memory.png') });

  // The header says what the report describes and how it was made (issue 18 item 9), all as text.
  const header = page.locator('header.memviz-report-header');
  const row = (key: string) =>
    header.locator('tr', { has: page.locator('th', { hasText: new RegExp(`^${key}$`) }) }).locator('td');
  await expect(row('command')).toHaveText(`memviz report chain.json ${HOSTILE}`);
  await expect(row('date')).toHaveText(/^\d{4}-\d\d-\d\d \d\d:\d\d UTC$/);
  await expect(row('model')).toContainText(`chain ${HOSTILE} (`);
  await expect(row('budget')).toHaveText(/^\d+\.\d\d (KiB|MiB)$/);
  await expect(row('device')).toHaveText('unspecified (estimated)');
  await expect(row('memviz')).toHaveText(/^\d+\.\d+/);
  await expect(row('torch')).toHaveText(/^\d+\.\d+/);
  // ... and offers the timeline as CSV: one row per planned and per eager step, totals in bytes
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    header.locator('a[download]', { hasText: 'timeline as CSV' }).click()
  ]);
  expect(download.suggestedFilename()).toBe('memviz-timeline.csv');
  const csv = fs
    .readFileSync((await download.path())!, 'utf-8')
    .trim()
    .split(/\r?\n/);
  expect(csv[0]).toMatch(/^run,step,op,.*,total_bytes$/);
  const runs = csv.slice(1).map(line => line.split(',')[0]);
  expect(runs.filter(r => r === 'planned').length).toBeGreaterThan(26); // 26 computes and the frees
  expect(runs.filter(r => r === 'baseline').length).toBeGreaterThan(26);
  expect(csv.slice(1).every(line => /,\d+$/.test(line))).toBe(true);

  // Clicking the peak's step lists the tensors resident there, hostile names as text.
  const peak = await view.locator('.scatterlayer .trace:last-child .points path').first().boundingBox();
  expect(peak).not.toBeNull();
  await page.mouse.click(peak!.x + peak!.width / 2, peak!.y + peak!.height / 2);
  const inspector = view.locator('.jp-memviz-inspect');
  await expect(inspector.locator('.jp-memviz-inspect-caption')).toContainText(/^step \d+: compute /);
  expect(await inspector.locator('.jp-memviz-inspect-row').count()).toBeGreaterThan(3);
  // the marked step, beside the line where the backward pass starts
  await expect(view.locator('.shapelayer path')).toHaveCount(2);
  await page.mouse.move(0, 0);
  await page.screenshot({ path: test.info().outputPath('report-inspector.png'), fullPage: true });

  // The x axis switches to estimated time.
  await view.locator('.jp-memviz-xaxis[data-axis="time"]').click();
  await expect(view.locator('.g-xtitle')).toContainText('estimated time (s');
  await view.locator('.jp-memviz-xaxis[data-axis="step"]').click();

  // Packing: the planned packing, drawn as an image under plotly's axes; no caching-allocator panel, as
  // a bare graph's device is unspecified (the allocator is simulated for CUDA devices only: packing.spec.ts)
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Packing' }).click();
  const packing = view.locator('.jp-memviz-packing');
  await expect(packing.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  await expect(packing.locator('.annotation-text').first()).toContainText('planned packing');
  await expect(packing.locator('.annotation-text')).toHaveCount(1);
  await expect(packing.locator('image').first()).toHaveAttribute('href', /^data:image\/png;base64,/);
  await page.screenshot({ path: test.info().outputPath('report-packing.png') });

  // Graph: Graphviz (wasm, inlined, run in a worker from a Blob URL) lays out the CD-graph; 19 ops + 20
  // drawn tensors (parameters are named in tooltips), 4 recomputed.
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
  const svg = view.locator('.jp-memviz-graph svg');
  await expect(svg).toBeVisible({ timeout: 60000 });
  await expect(svg.locator('g.node')).toHaveCount(19 + 20);
  expect(await svg.locator('g.node.recomputed').count()).toBe(4);
  await page.screenshot({ path: test.info().outputPath('report-graph.png') });

  // Dark color scheme: the chart recolors from the report's --jp-* variables.
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Memory' }).click();
  const tick = view.locator('.xtick text').first();
  const lightFill = await tick.evaluate(el => getComputedStyle(el).fill);
  await page.emulateMedia({ colorScheme: 'dark' });
  await expect.poll(() => tick.evaluate(el => getComputedStyle(el).fill)).not.toBe(lightFill);
  await page.screenshot({ path: test.info().outputPath('report-dark.png') });

  expect(await page.locator('img').count()).toBe(0);
  expect(fetched).toEqual([]);
  expect(errors).toEqual([]);
});

test('an autochunk report shades its chunk regions on the memory chart', async ({ page }) => {
  // labextension/test/chunk_plan.py: the GPT example chunked in inference.
  const report = test.info().outputPath('chunked.html');
  const planned = execFileSync(process.env.PYTHON ?? 'python3', ['labextension/test/chunk_plan.py'], {
    cwd: ROOT,
    env: PYTHON_ENV,
    maxBuffer: 1 << 28
  });
  execFileSync(
    process.env.PYTHON ?? 'python3',
    [
      '-c',
      'import json, sys\nfrom memviz.views.report import write_report\n' +
        'write_report(json.load(sys.stdin)["doc"], sys.argv[1], overwrite=True)',
      report
    ],
    { cwd: ROOT, env: PYTHON_ENV, input: planned }
  );
  await page.route('**/*', route =>
    /^(file|data|blob):/.test(route.request().url()) ? route.continue() : route.abort()
  );
  await page.setViewportSize({ width: 1200, height: 700 });
  await page.goto(pathToFileURL(report).href);

  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  const chunks = (JSON.parse(planned.toString()) as { doc: { chunks: { chunks: number }[] } }).doc.chunks;
  expect(chunks.length).toBeGreaterThan(0);
  await expect(view.locator('.annotation-text')).toHaveText(
    chunks.map((c, i) => `region ${i + 1}: ${c.chunks} chunks`)
  );
  await expect(view.locator('.shapelayer path')).toHaveCount(chunks.length);
  await page.screenshot({ path: test.info().outputPath('report-chunks.png') });
});

test('hostile names in a report someone sent run no script in Chromium (issue 17 item 2)', async ({
  page
}) => {
  // The report the first test writes, then edited as an attacker would: the Graph view writes DOT from
  // the plan's op, module and tensor names, so each name tries to close its DOT string and add nodes or
  // attributes: javascript: URLs (URL, href, an HTML-like label's IMG), quote-breaking ids and classes
  // aimed at on* attributes, a style url(), backslash escapes.  The views must draw Graphviz's SVG with
  // none of that live, and none of the injected nodes may exist.
  const report = test.info().outputPath('hostile-dot.html');
  execFileSync(process.env.PYTHON ?? 'python3', ['-c', WRITE_REPORT, report], { cwd: ROOT, env: PYTHON_ENV });
  const fs = await import('node:fs');
  const html = fs.readFileSync(report, 'utf-8');
  const open = '<script type="application/json" id="memviz-plan">';
  const start = html.indexOf(open) + open.length;
  const end = html.indexOf('</script>', start);
  const doc = JSON.parse(html.slice(start, end));
  const attack =
    'URL="javascript:window.__pwned=1" href="javascript:window.__pwned=2" target="_self" ' +
    'tooltip="javascript:window.__pwned=3" id="x\\" onclick=\\"window.__pwned=4" ' +
    'class="y\\" onmouseover=\\"window.__pwned=5" style="background:url(javascript:window.__pwned=6)"';
  const breakouts = [
    `x"]; evil1 [${attack} label="click me"]; "`,
    `x\\"]; evil2 [label=<<TABLE><TR><TD HREF="javascript:window.__pwned=7"><IMG SRC="javascript:window.__pwned=8"/></TD></TR></TABLE>>]; "`,
    `} digraph evil3 { evil3 [${attack}]; } subgraph "cluster_x { "`
  ];
  doc.graph.computes.forEach((c: { name: string; module: string }, i: number) => {
    c.name = breakouts[i % 3] + c.name;
    c.module = `m.${breakouts[(i + 1) % 3]}`;
  });
  doc.graph.datas.forEach((d: { name: string }, i: number) => {
    d.name = breakouts[(i + 2) % 3];
  });
  const edited = JSON.stringify(doc).replace(/</g, '\\u003c');
  fs.writeFileSync(report, html.slice(0, start) + edited + html.slice(end));

  const dialogs: string[] = [];
  page.on('dialog', async d => {
    dialogs.push(d.message());
    await d.dismiss();
  });
  await page.route('**/*', route =>
    /^(file|data|blob):/.test(route.request().url()) ? route.continue() : route.abort()
  );
  await page.setViewportSize({ width: 1200, height: 900 });
  await page.goto(pathToFileURL(report).href);
  const view = page.locator('.jp-memviz-plan');
  await expect(view.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  await view.locator('.jp-memviz-tabbar button', { hasText: 'Graph' }).click();
  const svg = view.locator('.jp-memviz-graph svg');
  await expect(svg).toBeVisible({ timeout: 60000 });
  // every name stayed text: no injected node exists, every op and drawn tensor is there (the hostile
  // module names group the ops into modules, all opened: the graph is small)
  await expect(svg.locator('g.node')).toHaveCount(19 + 20);
  expect(await svg.locator('g.node#evil1, g.node#evil2, g.node#evil3').count()).toBe(0);
  await expect(svg.locator('g.node#c0 text').first()).toContainText('evil1 [URL="javascript:');
  const live = await svg.evaluate(root => {
    const found: string[] = [];
    for (const el of [root, ...Array.from(root.querySelectorAll('*'))]) {
      for (const attr of Array.from(el.attributes)) {
        const value = attr.value.toLowerCase();
        // a title is inert text (the tooltip says "javascript:..." and runs nothing)
        const text = /title$/i.test(attr.name);
        if (attr.name.toLowerCase().startsWith('on') || (!text && /javascript:|url\s*\(/.test(value))) {
          found.push(`${el.tagName} ${attr.name}=${attr.value}`);
        }
        if (/href$/i.test(attr.name) && !value.startsWith('#')) {
          found.push(`${el.tagName} ${attr.name}=${attr.value}`);
        }
      }
      if (/^(script|foreignobject|image|iframe)$/i.test(el.tagName)) {
        found.push(el.tagName);
      }
    }
    return found;
  });
  expect(live).toEqual([]);
  // a click and a hover on every element of the drawing (many lie outside the view: dispatched, as a
  // synthetic click on a link still follows it) runs nothing and navigates nowhere
  await svg.evaluate(root => {
    for (const el of [root, ...Array.from(root.querySelectorAll('*'))]) {
      for (const type of ['mouseover', 'click']) {
        el.dispatchEvent(new MouseEvent(type, { bubbles: true, cancelable: true, view: window }));
      }
    }
  });
  expect(await page.evaluate(() => (window as unknown as { __pwned?: number }).__pwned)).toBeUndefined();
  expect(dialogs).toEqual([]);
  expect(page.url()).toBe(pathToFileURL(report).href);
});
