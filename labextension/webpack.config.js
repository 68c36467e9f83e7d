const { readFileSync } = require('fs');
const { join } = require('path');
const { DefinePlugin } = require('webpack');

// plotly.js-dist-min ships minified: re-minifying its 4.7 MB bundle costs minutes on 2 cores.
// The Graph view's layout worker is one script built by build-worker.mjs, inlined as a string here.
module.exports = {
  optimization: { minimize: false },
  plugins: [
    new DefinePlugin({
      MEMVIZ_GRAPH_WORKER: readFileSync(join(__dirname, 'lib', 'graph-worker.json'), 'utf8')
    })
  ]
};
