/**
 * The JupyterLab plugin: registers the memviz widgets with ipywidgets: the planner (PlannerModel /
 * PlannerView), the chunk-region editor (ChunkEditorModel / View) and the what-if panel (WhatIfModel / View).
 * The MIME renderer for plan documents is the separate mimeExtension in mime.ts; the Planner's
 * output without a kernel is snapshot.ts.
 */
import { IJupyterWidgetRegistry } from '@jupyter-widgets/base';
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';

import { snapshotFactory, SNAPSHOT_RANK, WIDGET_VIEW_MIME } from './snapshot';

import { MODULE_NAME, MODULE_VERSION } from './version';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-memviz:planner-widget',
  description: 'The memviz planner widget: memory chart, budget slider and strategy selector.',
  requires: [IJupyterWidgetRegistry],
  autoStart: true,
  activate: (_app: JupyterFrontEnd, registry: IJupyterWidgetRegistry): void => {
    registry.registerWidget({
      name: MODULE_NAME,
      version: MODULE_VERSION,
      // Loaded on first use, with the plotly chunk behind it.
      exports: async () => ({
        ...(await import('./widget')),
        ...(await import('./chunkeditor')),
        ...(await import('./whatif'))
      })
    });
  }
};

/**
 * In every notebook, the Planner's output renders its live widget through the notebook's own widget
 * renderer, and its last plan when the widget model is gone (snapshot.ts).
 */
const snapshot: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-memviz:planner-snapshot',
  description: 'A saved memviz Planner shows its last plan when it has no kernel.',
  requires: [INotebookTracker],
  autoStart: true,
  activate: (_app: JupyterFrontEnd, notebooks: INotebookTracker): void => {
    notebooks.widgetAdded.connect((_, panel) => {
      const rendermime = panel.content.rendermime;
      const widgetRenderer = () =>
        rendermime.mimeTypes.includes(WIDGET_VIEW_MIME) ? rendermime.createRenderer(WIDGET_VIEW_MIME) : null;
      rendermime.addFactory(snapshotFactory(widgetRenderer), SNAPSHOT_RANK);
    });
  }
};

export default [plugin, snapshot];
