/** The widget module name and version the Python side names in `_view_module(_version)`. */
export const MODULE_NAME = 'jupyterlab-memviz';
// Kept equal to package.json's version by a unit test.
export const MODULE_VERSION = '0.1.0';
