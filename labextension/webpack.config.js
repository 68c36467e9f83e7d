// plotly.js-dist-min ships minified: re-minifying its 4.7 MB bundle costs minutes on 2 cores.
module.exports = {
  optimization: { minimize: false }
};
