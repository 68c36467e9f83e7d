/**
 * The offline report (memviz/views/report.py): the plan shell of views.ts (Memory with the step inspector,
 * time axis and readouts, Packing, the wasm-Graphviz Graph, chunk regions shaded when the plan has
 * them) drawn into a plain page, as the MIME renderer of mime.ts draws it into JupyterLab, without
 * JupyterLab or lumino.  labextension/build-report.mjs bundles this module, plotly.js and Graphviz
 * into one script (memviz/static/report.js) with the styles below inlined, so the report opens from
 * disk with no network.  Colors follow the browser's prefers-color-scheme (style/report.css defines
 * the --jp-* variables the views read through ui.ts `themeColors` and theme.ts).
 */
import './graph'; // registers the CD-graph tab
import { chunkRegions } from './regions_data';
import { parsePlan } from './transforms';
import { PlanTabs } from './views';

/** style/index.css + style/report.css, inlined by the bundler (esbuild `define`). */
declare const MEMVIZ_REPORT_CSS: string;

const DARK = '(prefers-color-scheme: dark)';

function injectStyles(): void {
  if (document.getElementById('jp-memviz-report-style')) {
    return;
  }
  const style = document.createElement('style');
  style.id = 'jp-memviz-report-style';
  style.textContent = MEMVIZ_REPORT_CSS;
  document.head.append(style);
}

/**
 * Name the color scheme on <body> as JupyterLab names its theme: the views redraw their plotly
 * charts when `data-jp-theme-name` changes (ui.ts `observeTheme`), so switching the system between
 * light and dark recolors an open report.
 */
function followColorScheme(): void {
  const query = window.matchMedia(DARK);
  const apply = (): void => {
    document.body.dataset.jpThemeLight = String(!query.matches);
    document.body.dataset.jpThemeName = query.matches ? 'memviz report dark' : 'memviz report light';
  };
  apply();
  query.addEventListener('change', apply);
}

/** Draw plan document `data` into `target`; resolves once the Memory tab has drawn. */
export async function renderReport(target: HTMLElement, data: unknown): Promise<PlanTabs> {
  injectStyles();
  document.body.classList.add('jp-memviz-report');
  followColorScheme();
  const doc = parsePlan(data);
  const tabs = new PlanTabs();
  target.classList.add('jp-memviz-plan');
  target.replaceChildren(tabs.node);
  tabs.setRegions(chunkRegions(doc));
  window.addEventListener('resize', () => tabs.resize());
  await tabs.update(doc);
  return tabs;
}

/**
 * Draw the plan document held as JSON by element `sourceId` (a `<script type="application/json">`)
 * into element `targetId`; an unreadable document is shown as an error in the page, never thrown
 * away silently.
 */
export async function renderReportFrom(targetId: string, sourceId: string): Promise<void> {
  const target = document.getElementById(targetId);
  const source = document.getElementById(sourceId);
  if (!target || !source) {
    throw new Error(`memviz report: no element #${targetId} or #${sourceId}`);
  }
  try {
    await renderReport(target, JSON.parse(source.textContent ?? ''));
  } catch (err) {
    const error = document.createElement('pre');
    error.className = 'jp-memviz-error';
    error.textContent = `memviz: cannot render this plan: ${(err as Error).message}`;
    target.replaceChildren(error);
  }
}
