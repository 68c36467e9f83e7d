import { expect, test } from '@jupyterlab/galata';

import { SETTINGS, openAndRunAll } from './helpers';

test.use({ mockSettings: SETTINGS });

// chunks.ipynb: a memviz.ChunkEditor on a 2-layer GPT (seq 256) chunked to 40% of its activation peak,
// and a memviz.WhatIf on a 24-layer GPT on an A100 40 GB.  Every estimate comes from the kernel.
test('chunk editor re-estimates edits and explains illegal ones; what-if follows the TP degree', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(420000); // capture + chunk search in the kernel on a loaded 2-core machine
  await openAndRunAll(page, tmpPath, 'chunks.ipynb');

  const editor = page.locator('.jp-memviz-chunk-editor');
  await expect(editor.locator('.js-plotly-plot')).toBeVisible({ timeout: 120000 });
  await expect(editor.locator('.jp-memviz-chunk-region')).toHaveCount(2);
  const estimate = editor.locator('.jp-memviz-chunk-estimate .jp-memviz-readout').first();
  await expect(estimate).toContainText(/^chunked peak .* vs budget .*% of it\)/);
  const before = await estimate.textContent();
  // the budget is drawn (issue 18: it was not): a line named by its bytes, the chunked peak marked
  await expect(editor.locator('.legendtext', { hasText: /^budget \d/ })).toHaveCount(1);
  await expect(editor.locator('.legendtext', { hasText: /^chunked peak \d/ })).toHaveCount(1);
  await expect(editor.locator('.jp-memviz-chunk-caption')).toHaveText('2 regions');
  // four legend keys wrap to two rows in this narrow output: below the x-axis title, never over it
  const xtitle = (await editor.locator('.g-xtitle').boundingBox())!;
  const legend = (await editor.locator('.infolayer .legend').boundingBox())!;
  expect(legend.y).toBeGreaterThanOrEqual(xtitle.y + xtitle.height);
  // the regions are shaded on the curve
  expect(await editor.locator('.shapelayer path').count()).toBeGreaterThanOrEqual(2);
  await editor.screenshot({ path: test.info().outputPath('chunks-editor.png') });

  // fewer chunks: more memory, the kernel answers with a new estimate
  const first = editor.locator('.jp-memviz-chunk-region[data-region="0"]');
  await first.locator('.jp-memviz-chunk-chunks').fill('2');
  await first.locator('.jp-memviz-chunk-chunks').press('Tab');
  await expect(estimate).not.toHaveText(before ?? '', { timeout: 30000 });
  await expect(editor.locator('.jp-memviz-chunk-error')).toHaveText('');
  await expect(first.locator('.jp-memviz-chunk-chunks')).toHaveValue('2');
  await editor.screenshot({ path: test.info().outputPath('chunks-edited.png') });

  // drag the start edge back to the first LayerNorm (op index 5): the flow breaks at a view
  const x0 = await first.locator('.jp-memviz-chunk-x0').inputValue();
  await first.locator('.jp-memviz-chunk-x0').fill('5');
  await first.locator('.jp-memviz-chunk-x0').press('Tab');
  await expect(editor.locator('.jp-memviz-chunk-error')).toContainText('breaks at view', { timeout: 30000 });
  // the rejected value does not stay in its input: it shows the plan the kernel kept
  await expect(first.locator('.jp-memviz-chunk-x0')).toHaveValue(x0);
  await editor.screenshot({ path: test.info().outputPath('chunks-illegal.png') });

  // chunks=0 is refused with the reason, never read as 1; the input goes back to the kept 2
  const error = editor.locator('.jp-memviz-chunk-error');
  const afterTwo = await estimate.textContent();
  await first.locator('.jp-memviz-chunk-chunks').fill('0');
  await first.locator('.jp-memviz-chunk-chunks').press('Tab');
  await expect(error).toContainText('chunks=0', { timeout: 30000 });
  await expect(error).toContainText('at least 2');
  await expect(first.locator('.jp-memviz-chunk-chunks')).toHaveValue('2');
  await expect(estimate).toHaveText(afterTwo ?? '');

  // regions are removed and added: Add puts one at the chunked peak, the kernel picks its dims
  await editor.locator('.jp-memviz-chunk-region[data-region="1"] .jp-memviz-chunk-remove').click();
  await expect(editor.locator('.jp-memviz-chunk-region')).toHaveCount(1, { timeout: 30000 });
  await expect(error).toHaveText('');
  await editor.locator('.jp-memviz-chunk-add').click();
  await expect(editor.locator('.jp-memviz-chunk-region')).toHaveCount(2, { timeout: 30000 });
  await expect(error).toHaveText('');
  await expect(
    editor.locator('.jp-memviz-chunk-region[data-region="1"] .jp-memviz-chunk-chunks')
  ).toHaveValue('2');
  await editor.screenshot({ path: test.info().outputPath('chunks-added.png') });

  const whatif = page.locator('.jp-memviz-whatif');
  await expect(whatif.locator('.js-plotly-plot')).toBeVisible({ timeout: 60000 });
  const verdict = whatif.locator('.jp-memviz-whatif-verdict');
  await expect(verdict).toContainText('does not fit');
  const tops = async (): Promise<string> =>
    (await whatif.locator('.barlayer path').evaluateAll(ps => ps.map(p => p.getAttribute('d')))).join('|');
  const barsBefore = await tops();
  await whatif.screenshot({ path: test.info().outputPath('whatif.png') });
  await whatif.locator('.jp-memviz-whatif-tp').selectOption('4');
  await expect(verdict).toContainText('fits:');
  expect(await tops()).not.toEqual(barsBefore);
  await whatif.screenshot({ path: test.info().outputPath('whatif-tp4.png') });

  // The bars follow every TP change, quick successive ones included; a degree the kernel rejects (16
  // heads over 32 ranks) shows its error and dims the last valid bars instead of passing them off as current.
  const whatifError = whatif.locator('.jp-memviz-whatif-error');
  const tp = whatif.locator('.jp-memviz-whatif-tp');
  await tp.selectOption('8');
  await tp.selectOption('2');
  await expect(verdict).toContainText('fits: 6.06 GiB free per device');
  await expect(whatif.locator('.barlayer path')).toHaveCount(4);
  await tp.selectOption('32');
  await expect(whatifError).toHaveText('heads (16) must be divisible by the tensor-parallel degree tp (32)');
  await expect(verdict).toBeHidden();
  await expect(whatif.locator('.jp-memviz-whatif-plot')).toHaveClass(/jp-mod-stale/);
  await expect(whatif.locator('.barlayer path')).toHaveCount(4);
  await whatif.screenshot({ path: test.info().outputPath('whatif-tp32-rejected.png') });
  await tp.selectOption('1');
  await expect(verdict).toContainText('does not fit');
  await expect(whatifError).toHaveText('');
  await expect(whatif.locator('.jp-memviz-whatif-plot')).not.toHaveClass(/jp-mod-stale/);
  await expect(whatif.locator('.barlayer path')).toHaveCount(4);
  // back at TP 1: the bars of the start (their heights: the width follows the panel's layout)
  const heights = (d: string): string[] => d.match(/V[\d.]+/g) ?? [];
  await expect.poll(async () => heights(await tops())).toEqual(heights(barsBefore));
});

// chunks_many.ipynb: a 12-layer GPT with one chunk region per layer (12 region labels over the curve)
test('chunk editor: 12 region labels are all visible and none overlaps another', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000);
  await openAndRunAll(page, tmpPath, 'chunks_many.ipynb');
  const editor = page.locator('.jp-memviz-chunk-editor');
  await expect(editor.locator('.js-plotly-plot')).toBeVisible({ timeout: 180000 });
  await expect(editor.locator('.jp-memviz-chunk-region')).toHaveCount(12);
  const labels = editor.locator('.js-plotly-plot .annotation-text');
  await expect(labels).toHaveCount(12);
  const boxes = await Promise.all((await labels.all()).map(async label => (await label.boundingBox())!));
  const plot = (await editor.locator('.js-plotly-plot').boundingBox())!;
  boxes.forEach((a, i) => {
    // inside the plot's box: not cut off at its top or sides
    expect(a.y).toBeGreaterThanOrEqual(plot.y - 1);
    expect(a.x).toBeGreaterThanOrEqual(plot.x - 1);
    expect(a.x + a.width).toBeLessThanOrEqual(plot.x + plot.width + 1);
    boxes.slice(i + 1).forEach((b, j) => {
      const apart =
        a.x + a.width <= b.x || b.x + b.width <= a.x || a.y + a.height <= b.y || b.y + b.height <= a.y;
      expect(apart, `labels ${i + 1} and ${i + j + 2} overlap`).toBe(true);
    });
  });
  // the chart comes first; the regions follow in a box of bounded height that scrolls (115 regions
  // made a 9,000 px list that hid the chart below it)
  const list = editor.locator('.jp-memviz-chunk-regions');
  expect((await list.boundingBox())!.y).toBeGreaterThan(plot.y + plot.height - 1);
  expect(await list.evaluate(el => el.scrollHeight > el.clientHeight)).toBe(true);
  await editor.locator('.js-plotly-plot').scrollIntoViewIfNeeded();
  await editor.locator('.js-plotly-plot').screenshot({ path: test.info().outputPath('chunks-many.png') });

  // Issue 18 at 12 layers: only eight regions showed, nothing said the list scrolls (an overlay
  // scrollbar is hidden): the caption says which regions are in view, and follows the scroll
  const caption = editor.locator('.jp-memviz-chunk-caption');
  await expect(caption).toHaveText(/^12 regions: 1\u2013\d+ in view, scroll down for more$/);
  await list.evaluate(el => el.scrollTo(0, el.scrollHeight));
  await expect(caption).toHaveText(/^12 regions: \d+\u201312 in view, scroll up for the first ones$/);
  await list.evaluate(el => el.scrollTo(0, 0));

  // Every region is two lines, rows of one height however narrow the output and long the op names (at
  // 115 regions wrapped rows came out uneven): its fields side by side on the first line, the edges'
  // op names on the second across the row's width (squeezed between the fields at 848 px they were cut
  // to "matmu…", issue 18); a name that does not fit even there ends in an ellipsis and its tooltip is
  // the full name.  An output narrower than the fields scrolls the list sideways to the Remove buttons.
  const rows = editor.locator('.jp-memviz-chunk-region');
  const twoLines = async (): Promise<void> => {
    const shape = await rows.evaluateAll(rs =>
      rs.map(r => {
        const box = r.getBoundingClientRect();
        const line = (selector: string) => {
          const items = Array.from(r.querySelectorAll(selector)).map(c => c.getBoundingClientRect());
          const mids = items.map(b => b.top + b.height / 2);
          return {
            spread: Math.max(...mids) - Math.min(...mids),
            // side by side, in order, none over another
            overlap: Math.max(...items.slice(1).map((b, i) => items[i].right - b.left)),
            top: Math.min(...items.map(b => b.top)),
            bottom: Math.max(...items.map(b => b.bottom))
          };
        };
        return {
          h: box.height,
          fields: line(
            '.jp-memviz-chunk-title, .jp-memviz-chunk-field, .jp-memviz-chunk-est, .jp-memviz-chunk-remove'
          ),
          names: line('.jp-memviz-chunk-node')
        };
      })
    );
    expect(new Set(shape.map(s => Math.round(s.h))).size).toBe(1);
    for (const s of shape) {
      for (const l of [s.fields, s.names]) {
        expect(l.spread).toBeLessThan(3);
        expect(l.overlap).toBeLessThanOrEqual(0.5);
      }
      expect(s.names.top).toBeGreaterThanOrEqual(s.fields.bottom - 0.5);
    }
  };
  await twoLines();
  // at the output's width every name is whole (matmul_10 (matmul) ...), none cut
  const whole = await editor
    .locator('.jp-memviz-chunk-node')
    .evaluateAll(ns => ns.every(n => n.scrollWidth <= n.clientWidth));
  expect(whole).toBe(true);
  await list.screenshot({ path: test.info().outputPath('chunks-many-list.png') });
  await editor.evaluate(el => {
    (el as HTMLElement).style.width = '360px';
  });
  await twoLines();
  // every name's tooltip is its full text, and one too long for its half of the line ends in an ellipsis
  const names = editor.locator('.jp-memviz-chunk-node');
  const titled = await names.evaluateAll(ns => ns.map(n => [n.textContent, n.getAttribute('title')]));
  expect(titled.length).toBe(24);
  for (const [text, title] of titled) {
    expect(title).toBe(text);
  }
  expect(await names.first().evaluate(n => getComputedStyle(n).textOverflow)).toBe('ellipsis');
  const remove = rows.last().locator('.jp-memviz-chunk-remove');
  await remove.scrollIntoViewIfNeeded();
  await expect(remove).toBeInViewport();
  await list.screenshot({ path: test.info().outputPath('chunks-many-narrow.png') });
});
