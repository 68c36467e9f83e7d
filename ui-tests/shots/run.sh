#!/usr/bin/env bash
# Screenshots of every view at 12 layers and at 5k ops (issue 18), from this checkout's build:
#   ui-tests/shots/run.sh /abs/out/dir [notebook ...]     (default: every notebook in shots/notebooks)
# Needs `jlpm build` at the repository root first.  The server sees this checkout's extension
# (memviz/labextension, not an older installed one) and imports this checkout's memviz.
# MEMVIZ_UI_PORT picks the server's port.  The notebooks write offline reports into the folder;
# a second pass shoots those.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(dirname "$here")
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=("$here"/shots/notebooks/*.ipynb)
paths=$(printf '%s,' "${notebooks[@]}")
ext=$(mktemp -d)
trap 'rm -rf "$ext"' EXIT
mkdir -p "$ext/labextensions"
ln -s "$root/memviz/labextension" "$ext/labextensions/jupyterlab-memviz"
export JUPYTER_PATH="$ext${JUPYTER_PATH:+:$JUPYTER_PATH}" PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export MEMVIZ_SHOTS_OUT="$out"
cd "$here"
MEMVIZ_SHOTS_NOTEBOOKS="${paths%,}" jlpm playwright test -c shots.config.js || status=$?
reports=$(find "$out" -maxdepth 1 -name '*-report.html' | paste -sd, -)
if [ -n "$reports" ]; then
  MEMVIZ_SHOTS_REPORTS="$reports" jlpm playwright test -c shots.config.js || status=$?
fi
exit "${status:-0}"
