/**
 * The Planner's output without its widget model (issue 18 item 8).  memviz.Planner displays its widget
 * view together with `application/vnd.memviz.planner+json` ({model_id, plan}: the plan shown).  This
 * renderer, ranked before ipywidgets' own (-10), renders the live widget through the notebook's widget
 * renderer while its model exists, and the last plan, static, when it does not (a saved notebook opened
 * without a kernel, a restarted kernel) instead of "Error displaying widget: model not found".  While the
 * widget is live it keeps the output's plan equal to the plan the view shows, so the saved notebook
 * holds the last plan.  Untrusted outputs never reach the widget renderer: they get the static plan.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Message } from '@lumino/messaging';
import { Panel, Widget } from '@lumino/widgets';

import './graph'; // registers the CD-graph tab
import { parsePlan } from './transforms';
import { PlanTabs } from './views';

export const PLANNER_MIME = 'application/vnd.memviz.planner+json';
export const WIDGET_VIEW_MIME = 'application/vnd.jupyter.widget-view+json';
/** The event the Planner view sends (bubbling) with the plan document it draws. */
export const PLAN_SHOWN_EVENT = 'memviz-planner-plan';
/** Ranked before ipywidgets' renderer (-10), so that this one decides between live and static. */
export const SNAPSHOT_RANK = -20;

/** How long "Loading widget..." may last before the static plan is shown (no kernel may never answer). */
const LOADING_MS = 3000;
/** What ipywidgets' renderer writes when the model is gone (jupyterlab_widgets' WidgetRenderer). */
const MODEL_NOT_FOUND = /^Error displaying widget/;

/** Creates the renderer a notebook uses for widget views (null outside a notebook's output area). */
export type WidgetRendererSource = () => IRenderMime.IRenderer | null;

interface PlannerData {
  model_id?: unknown;
  plan?: unknown;
}

export class PlannerSnapshot extends Panel implements IRenderMime.IRenderer {
  private _live: IRenderMime.IRenderer | null = null;
  private _liveId = '';
  private _static: PlanTabs | null = null;
  private _observer: MutationObserver | null = null;
  private _persist = 0;
  private _wait = 0;
  private _staticNode: HTMLElement | null = null;

  constructor(private readonly _widgetRenderer: WidgetRendererSource) {
    super();
    this.addClass('jp-memviz-planner-snapshot');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = (model.data[PLANNER_MIME] ?? {}) as PlannerData;
    const id = typeof data.model_id === 'string' ? data.model_id : '';
    if (this._live && id === this._liveId) {
      return; // the output's plan was updated by the live view itself (setData): nothing to redraw
    }
    this._clear();
    const live = model.trusted && id && model.data[WIDGET_VIEW_MIME] ? this._widgetRenderer() : null;
    if (!live) {
      await this._showStatic(data.plan);
      return;
    }
    this._live = live;
    this._liveId = id;
    const liveWidget = live as unknown as Widget;
    this.addWidget(liveWidget);
    // ipywidgets reports a missing model by text only, and without a kernel may say "Loading widget..."
    // for ever: the static plan is shown then, and gives way to the widget if it does appear.
    const check = (): void => {
      if (this._live !== live) {
        return;
      }
      if (live.node.firstElementChild) {
        liveWidget.show();
        this._clearStatic();
      } else if (MODEL_NOT_FOUND.test(live.node.textContent ?? '')) {
        this._clearLive();
        void this._showStatic(data.plan);
      }
    };
    this._observer = new MutationObserver(check);
    this._observer.observe(live.node, { childList: true, characterData: true, subtree: true });
    this._wait = window.setTimeout(() => {
      if (this._live === live && !live.node.firstElementChild && !this._static) {
        liveWidget.hide();
        void this._showStatic(data.plan);
      }
    }, LOADING_MS);
    live.node.addEventListener(PLAN_SHOWN_EVENT, event => this._planShown(model, id, event));
    await live.renderModel(model);
    check();
  }

  /** The live view drew a plan: keep it as the output's plan (debounced: a drag draws many). */
  private _planShown(model: IRenderMime.IMimeModel, id: string, event: Event): void {
    const plan = (event as CustomEvent).detail;
    window.clearTimeout(this._persist);
    this._persist = window.setTimeout(() => {
      model.setData({ data: { ...model.data, [PLANNER_MIME]: { model_id: id, plan } } });
    }, 500);
  }

  private async _showStatic(plan: unknown): Promise<void> {
    this._clearStatic();
    const box = document.createElement('div');
    box.className = 'jp-memviz-snapshot';
    const note = document.createElement('div');
    note.className = 'jp-memviz-snapshot-note';
    note.textContent = 'The last plan shown, static: the planner has no kernel. Run the cell to plan again.';
    box.append(note);
    this._staticNode = box;
    this.node.append(box);
    let doc;
    try {
      doc = parsePlan(plan);
    } catch (err) {
      note.className = 'jp-memviz-error';
      note.textContent = `memviz: cannot render the saved plan: ${(err as Error).message}`;
      return;
    }
    this._static = new PlanTabs();
    box.append(this._static.node);
    await this._static.update(doc);
  }

  private _clearStatic(): void {
    this._static?.dispose();
    this._static = null;
    this._staticNode?.remove();
    this._staticNode = null;
  }

  private _clearLive(): void {
    this._observer?.disconnect();
    this._observer = null;
    window.clearTimeout(this._persist);
    window.clearTimeout(this._wait);
    if (this._live) {
      (this._live as unknown as Widget).dispose();
      this._live = null;
      this._liveId = '';
    }
  }

  private _clear(): void {
    this._clearLive();
    this._clearStatic();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._static?.resize();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._static?.resize();
  }

  dispose(): void {
    if (!this.isDisposed) {
      this._clear();
    }
    super.dispose();
  }
}

/** The factory for a rendermime registry: live through `widgetRenderer`, static without it. */
export function snapshotFactory(widgetRenderer: WidgetRendererSource): IRenderMime.IRendererFactory {
  return {
    safe: true, // the static plan is escaped text; the widget is only used for trusted outputs
    mimeTypes: [PLANNER_MIME],
    createRenderer: () => new PlannerSnapshot(widgetRenderer)
  };
}
