/**
 * The JupyterLab plugin: registers the memviz widgets with ipywidgets: the planner (PlannerModel /
 * PlannerView), the chunk-region editor (ChunkEditorModel / View) and the what-if panel (WhatIfModel / View).
 * The MIME renderer for plan documents is the separate mimeExtension in mime.ts.
 */
import { IJupyterWidgetRegistry } from '@jupyter-widgets/base';
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';

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

export default plugin;
