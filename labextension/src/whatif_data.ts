/**
 * Pure data transforms of the transformer what-if panel.  Every byte count, verdict and assumption comes
 * from the kernel (memviz/views/whatif.py over solvers.analytic); nothing here computes memory, it only lays out
 * the bars of the pinned configurations and the current one side by side, and the comparison table.
 */
import { ThemeColors, themedAxis, themedLayout } from './theme';
import { escapeHtml } from './transforms';

/** The settings of one configuration, as the kernel's `pinned` trait holds them. */
export interface WhatIfSettings {
  tp: number;
  sp: boolean;
  recompute: string;
  pp: number;
  micro_batch: number;
  device: string;
}

/** One configuration's estimate (a pinned one from `compare_json`, or the current one from `result_json`). */
export interface WhatIfRow {
  name: string;
  label: string;
  device: string;
  settings?: WhatIfSettings;
  bars?: { label: string; bytes: number }[];
  total?: number;
  capacity?: number | null;
  headroom?: number | null;
  fits?: boolean | null;
  verdict?: string;
  error: string;
}

/** The current configuration's answer: a row that always has bars, plus the estimate's assumptions. */
export interface WhatIfResult extends WhatIfRow {
  bars: { label: string; bytes: number }[];
  total: number;
  capacity: number | null;
  fits: boolean | null;
  verdict: string;
  assumptions: { name: string; value: string }[];
}

export function parseWhatIf(data: unknown): WhatIfResult {
  const d = data as Partial<WhatIfResult>;
  if (!d || !Array.isArray(d.bars) || typeof d.total !== 'number' || typeof d.verdict !== 'string') {
    throw new Error('not a memviz what-if result: bars, total and verdict missing');
  }
  return { name: 'current', label: '', device: '', error: '', assumptions: [], ...d } as WhatIfResult;
}

/** The kernel's rows for the pinned configurations (`compare_json`). */
export function parseComparison(data: unknown): WhatIfRow[] {
  if (!Array.isArray(data)) {
    throw new Error('not a memviz what-if comparison: a list of rows expected');
  }
  return data.map((r: Partial<WhatIfRow>) => {
    if (!r || typeof r.name !== 'string') {
      throw new Error('not a memviz what-if comparison row: name missing');
    }
    return { label: '', device: '', error: '', ...r } as WhatIfRow;
  });
}

const GIB = 2 ** 30;

function gib(bytes: number): string {
  return `${(bytes / GIB).toFixed(2)} GiB`;
}

/** "fits" / "does not fit" / ...: the short verdict drawn above a bar and in the table. */
export function shortVerdict(r: WhatIfRow): string {
  if (r.error) {
    return 'error';
  }
  if (r.fits === null || r.fits === undefined) {
    return 'no capacity';
  }
  return r.fits ? 'fits' : 'does not fit';
}

/**
 * One stacked bar per configuration (pinned ones, then the current one), a stack segment per memory
 * category, each bar with its device's capacity line and its total and verdict above it.  A pinned configuration
 * the kernel rejected has no bar, only its "error" verdict.
 */
export function compareFigure(
  rows: WhatIfRow[],
  colors: ThemeColors
): { data: unknown[]; layout: Record<string, unknown> } {
  // by position: two configurations may carry the same settings (a category axis would stack them)
  const x = rows.map((_, i) => i);
  const categories = rows.find(r => r.bars)?.bars?.map(b => b.label) ?? [];
  const hover = rows.map(r => escapeHtml([r.label, r.device].filter(Boolean).join(' · ')));
  const data = categories.map(category => ({
    type: 'bar',
    name: escapeHtml(category),
    x,
    y: rows.map(r => {
      const bar = r.bars?.find(b => b.label === category);
      return bar ? bar.bytes / GIB : null;
    }),
    customdata: hover,
    hovertemplate: `${escapeHtml(category)}: %{y:.2f} GiB<br>%{customdata}<extra></extra>`
  }));
  const shapes = rows.flatMap((r, i) =>
    typeof r.capacity === 'number'
      ? [
          {
            type: 'line',
            xref: 'x',
            x0: i - 0.45,
            x1: i + 0.45,
            y0: r.capacity / GIB,
            y1: r.capacity / GIB,
            line: { color: colors.error, width: 2, dash: 'dash' }
          }
        ]
      : []
  );
  const top = Math.max(1e-9, ...rows.map(r => Math.max(r.total ?? 0, r.capacity ?? 0))) / GIB;
  const annotations = rows.map((r, i) => ({
    x: i,
    xref: 'x',
    y: Math.max(r.total ?? 0, r.capacity ?? 0) / GIB,
    yanchor: 'bottom',
    showarrow: false,
    // the total too: a model far below its device's capacity draws a bar a pixel tall (a 12-layer
    // GPT-2 of width 64: 0.48 GiB against a V100's 16 GiB)
    text: [typeof r.total === 'number' ? gib(r.total) : '', escapeHtml(shortVerdict(r))]
      .filter(Boolean)
      .join('<br>'),
    font: { color: r.fits === true ? colors.font : colors.error }
  }));
  return {
    data,
    layout: {
      barmode: 'stack',
      shapes,
      annotations,
      ...themedLayout(colors),
      yaxis: { ...themedAxis(colors), title: { text: 'GiB per device' }, range: [0, top * 1.15] },
      xaxis: {
        ...themedAxis(colors),
        tickmode: 'array',
        tickvals: x,
        ticktext: rows.map(tickText)
      },
      margin: { t: 20, r: 10, b: 70, l: 60 }
    }
  };
}

/**
 * A bar's x label: the configuration named by its settings (the kernel's `label`, "tp2 sp pp1 mb4
 * full-recompute", wrapped to fit under a bar), its device, and "current" for the controls' one.  Every
 * piece is escaped: plotly renders tick text as HTML.
 */
export function tickText(r: WhatIfRow): string {
  const lines = wrapWords(r.label || r.name, 16);
  const device = r.name === 'current' ? [r.device, 'current'].filter(Boolean).join(' · ') : r.device;
  if (device) {
    lines.push(device);
  }
  return lines.map(escapeHtml).join('<br>');
}

/** `text` cut at spaces into lines of at most `width` characters (a longer word is a line of its own). */
export function wrapWords(text: string, width: number): string[] {
  const lines: string[] = [];
  for (const word of text.split(' ').filter(Boolean)) {
    const last = lines.length - 1;
    if (last >= 0 && lines[last].length + 1 + word.length <= width) {
      lines[last] += ` ${word}`;
    } else {
      lines.push(word);
    }
  }
  return lines;
}

/** The comparison table's text cells: configuration, settings, device, total, capacity, headroom, verdict. */
export function comparisonCells(r: WhatIfRow): string[] {
  const bytes = (v: number | null | undefined): string => (typeof v === 'number' ? gib(v) : '—');
  return [
    r.name,
    r.label,
    r.device,
    bytes(r.total),
    bytes(r.capacity),
    bytes(r.headroom),
    r.error ? r.error : shortVerdict(r)
  ];
}
