/**
 * Pure data transforms of the transformer what-if panel.  Every byte count comes from the kernel
 * (memviz/whatif.py over solvers.analytic); nothing here computes memory, it only lays out the bars.
 */
import { ThemeColors, themedAxis, themedLayout } from './theme';
import { escapeHtml } from './transforms';

export interface WhatIfResult {
  bars: { label: string; bytes: number }[];
  total: number;
  capacity: number | null;
  fits: boolean | null;
  verdict: string;
  device: string;
}

export function parseWhatIf(data: unknown): WhatIfResult {
  const d = data as Partial<WhatIfResult>;
  if (!d || !Array.isArray(d.bars) || typeof d.total !== 'number' || typeof d.verdict !== 'string') {
    throw new Error('not a memviz what-if result: bars, total and verdict missing');
  }
  return d as WhatIfResult;
}

const GIB = 2 ** 30;

/** One stacked bar per device (label "per device") against the capacity line of the preset. */
export function whatIfFigure(
  r: WhatIfResult,
  colors: ThemeColors
): { data: unknown[]; layout: Record<string, unknown> } {
  const device = escapeHtml(r.device);
  const data = r.bars.map(b => ({
    type: 'bar',
    name: escapeHtml(b.label),
    x: [device],
    y: [b.bytes / GIB],
    hovertemplate: `${escapeHtml(b.label)}: %{y:.2f} GiB<extra></extra>`
  }));
  const shapes =
    r.capacity === null
      ? []
      : [
          {
            type: 'line',
            xref: 'paper',
            x0: 0,
            x1: 1,
            y0: r.capacity / GIB,
            y1: r.capacity / GIB,
            line: { color: colors.error, width: 2, dash: 'dash' }
          }
        ];
  const top = Math.max(r.total, r.capacity ?? 0) / GIB;
  return {
    data,
    layout: {
      barmode: 'stack',
      shapes,
      annotations:
        r.capacity === null
          ? []
          : [
              {
                xref: 'paper',
                x: 1,
                xanchor: 'right',
                y: r.capacity / GIB,
                yanchor: 'bottom',
                showarrow: false,
                text: `capacity ${(r.capacity / GIB).toFixed(1)} GiB`,
                font: { color: colors.error }
              }
            ],
      ...themedLayout(colors),
      yaxis: { ...themedAxis(colors), title: { text: 'GiB per device' }, range: [0, top * 1.1] },
      xaxis: themedAxis(colors),
      margin: { t: 20, r: 10, b: 30, l: 60 }
    }
  };
}
