/**
 * The plotly color code every memviz chart shares: the theme colors (read from JupyterLab's CSS
 * variables by ui.ts `themeColors`) and the layout and axis members built from them.  Pure, so the
 * figure transforms that use it run under node's test runner.
 */

/** Theme colors of the memviz charts. */
export interface ThemeColors {
  font: string;
  muted: string;
  grid: string;
  family: string;
  /** budget and capacity lines */
  error: string;
  peak: string;
  /** shaded regions (chunked ranges) */
  region: string;
  /** the marked step */
  marker: string;
}

/** Layout members every memviz chart shares: transparent background, themed font. */
export function themedLayout(colors: ThemeColors): Record<string, unknown> {
  return {
    paper_bgcolor: 'rgba(0,0,0,0)',
    plot_bgcolor: 'rgba(0,0,0,0)',
    font: { color: colors.font, family: colors.family }
  };
}

/** Axis members every memviz chart shares: themed ticks, grid and zero line. */
export function themedAxis(colors: ThemeColors): Record<string, unknown> {
  return { color: colors.font, gridcolor: colors.grid, zerolinecolor: colors.grid };
}
