/**
 * DOM helpers shared by every memviz view: element creation, the lazily loaded plotly bundle, the
 * theme colors read from JupyterLab's CSS variables (theme.ts builds the plotly layout from them), a
 * theme-switch observer, the widget models' module defaults and the export row of the planner and the
 * chunk editor.  Text from plans only reaches the DOM here through textContent.
 */
import { ThemeColors } from './theme';
import { exportOutcome } from './transforms';
import { MODULE_NAME, MODULE_VERSION } from './version';

export type PlotlyModule = typeof import('plotly.js-dist-min').default;

// Loaded on first use: the plotly chunk is ~4.7 MB and most notebooks never show a plan.
let plotlyPromise: Promise<PlotlyModule> | null = null;
export function loadPlotly(): Promise<PlotlyModule> {
  plotlyPromise ??= import('plotly.js-dist-min').then(m => m.default);
  return plotlyPromise;
}

/** The plotly bundle if some view already asked for it (resizing an undrawn chart must not load it). */
export function loadedPlotly(): Promise<PlotlyModule> | null {
  return plotlyPromise;
}

export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  el.className = className;
  if (text !== undefined) {
    el.textContent = text;
  }
  return el;
}

/** Theme colors read from JupyterLab's CSS variables (plotly cannot resolve var(...) itself). */
export function themeColors(node: HTMLElement): ThemeColors {
  const style = getComputedStyle(node);
  const read = (name: string, fallback: string): string => style.getPropertyValue(name).trim() || fallback;
  return {
    font: read('--jp-ui-font-color1', '#333333'),
    muted: read('--jp-ui-font-color2', '#666666'),
    grid: read('--jp-border-color2', '#dddddd'),
    family: read('--jp-ui-font-family', 'sans-serif'),
    error: read('--jp-error-color1', '#d32f2f'),
    peak: read('--jp-ui-font-color0', '#000000'),
    region: read('--jp-brand-color1', '#1976d2'),
    marker: read('--jp-warn-color1', '#f57c00')
  };
}

/** Call `redraw` whenever the user switches JupyterLab's theme; returns the function that stops it. */
export function observeTheme(redraw: () => void): () => void {
  const observer = new MutationObserver(redraw);
  observer.observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-name'] });
  return () => observer.disconnect();
}

/** The `_model_*` / `_view_*` defaults of a memviz widget model (Python side: memviz.views.widget). */
export function widgetDefaults(modelName: string, viewName: string): Record<string, string> {
  return {
    _model_name: modelName,
    _model_module: MODULE_NAME,
    _model_module_version: MODULE_VERSION,
    _view_name: viewName,
    _view_module: MODULE_NAME,
    _view_module_version: MODULE_VERSION
  };
}

/** The export traits the planner and the chunk editor share, with their defaults. */
export const EXPORT_DEFAULTS = {
  export_path: '',
  export_overwrite: false,
  export_request: 0,
  export_result: ''
};

/** Mark `node` as an error (red, announced to screen readers) or as plain information. */
export function showAsError(node: HTMLElement, error: boolean): void {
  node.classList.toggle('jp-mod-error', error);
  if (error) {
    node.setAttribute('role', 'alert');
  } else {
    node.removeAttribute('role');
  }
}

/** What an Exporter needs from its widget view: read a trait, write traits to the kernel. */
export interface TraitAccess {
  get(name: string): unknown;
  send(values: Record<string, unknown>): void;
}

/**
 * The export row: a path, Export, and Overwrite, which shows only after the kernel reported existing
 * files (overwriting is always an explicit second click), plus the kernel's answer below it.
 */
export class Exporter {
  readonly row: HTMLDivElement = element('div', 'jp-memviz-exporter');
  readonly result: HTMLDivElement = element('div', 'jp-memviz-export-result');
  private readonly _path = element('input', 'jp-memviz-export-path');
  private readonly _export = element('button', 'jp-memviz-export jp-mod-styled', 'Export');
  private readonly _overwrite = element(
    'button',
    'jp-memviz-overwrite jp-mod-styled jp-mod-warn',
    'Overwrite'
  );

  constructor(private readonly _traits: TraitAccess) {
    this._path.type = 'text';
    this._path.spellcheck = false;
    this._path.addEventListener('change', () => this._traits.send({ export_path: this._path.value }));
    this._export.addEventListener('click', () => this._request(false));
    this._overwrite.hidden = true;
    this._overwrite.addEventListener('click', () => this._request(true));
    this.row.append(this._path, this._export, this._overwrite);
  }

  /** Show the model's export_path. */
  pathChanged(): void {
    this._path.value = String(this._traits.get('export_path') ?? '');
  }

  /** Show the kernel's JSON answer {"ok", "paths" | "exists", "message"}: a failure as an error. */
  resultChanged(): void {
    const outcome = exportOutcome(String(this._traits.get('export_result') ?? ''));
    this.result.textContent = outcome.message;
    showAsError(this.result, outcome.error);
    this._overwrite.hidden = outcome.exists.length === 0;
  }

  private _request(overwrite: boolean): void {
    this._overwrite.hidden = true;
    this.result.textContent = 'exporting…';
    showAsError(this.result, false);
    this._traits.send({
      export_path: this._path.value,
      export_overwrite: overwrite,
      export_request: Number(this._traits.get('export_request') ?? 0) + 1
    });
  }
}
