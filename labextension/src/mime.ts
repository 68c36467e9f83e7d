/**
 * MIME renderer for `application/vnd.memviz.plan+json`: a notebook output (or a saved notebook, without
 * a kernel) holding a memviz plan document renders as the memory-over-time chart.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import './graph'; // registers the CD-graph tab
import { snapshotFactory, SNAPSHOT_RANK } from './snapshot';
import { PlanTabs } from './views';
import { parsePlan } from './transforms';

export const MIME_TYPE = 'application/vnd.memviz.plan+json';

export class PlanRenderer extends Widget implements IRenderMime.IRenderer {
  private readonly _mimeType: string;
  private readonly _tabs = new PlanTabs();

  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('jp-memviz-plan');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    let doc;
    try {
      doc = parsePlan(model.data[this._mimeType]);
    } catch (err) {
      const error = document.createElement('pre');
      error.className = 'jp-memviz-error';
      error.textContent = `memviz: cannot render this plan: ${(err as Error).message}`;
      this.node.replaceChildren(error);
      return;
    }
    if (!this._tabs.node.isConnected) {
      this.node.replaceChildren(this._tabs.node);
    }
    await this._tabs.update(doc);
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._tabs.resize();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._tabs.resize();
  }

  dispose(): void {
    if (!this.isDisposed) {
      this._tabs.dispose();
    }
    super.dispose();
  }
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  createRenderer: options => new PlanRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'jupyterlab-memviz:plan-renderer',
  description: 'Renders memviz plan documents as memory-over-time charts.',
  rendererFactory,
  rank: 0,
  dataType: 'json'
};

/** The Planner's output outside a notebook (no widget renderer there): its plan, static. */
const snapshot: IRenderMime.IExtension = {
  id: 'jupyterlab-memviz:planner-snapshot-renderer',
  description: 'Renders a memviz Planner output as its last plan where its widget cannot be shown.',
  rendererFactory: snapshotFactory(() => null),
  rank: SNAPSHOT_RANK,
  dataType: 'json'
};

export default [extension, snapshot];
