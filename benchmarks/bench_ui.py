"""The Planner's UI latency and the Graph view's open time in Chromium: p50 / p95 per interaction
(issue 18 items 10 and 2).

Run: ``python benchmarks/bench_ui.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/ui.json``.  Needs what ``make test-ui`` needs: the built extension installed in this
environment, ``ui-tests/node_modules`` (``make install-test``) and the system Chromium (``make chromium``).

``ui-tests/bench/latency.bench.ts`` (Galata, run with ``ui-tests/bench.config.js``; ``make test-ui`` never
runs it) opens ``memviz.Planner`` on ``memviz demo``'s model in JupyterLab and times, in the page, from the
event the view handles (the slider's ``input``, an arrow key, Enter in the typed budget) until the plan
it asked for is drawn: the kernel answered, the readouts are no longer pending, plotly re-plotted and one
frame was painted.  The first plan of a typed budget is the frontier's (drawn at once; the exact solve
follows in the background and is not timed here).  ``ui-tests/bench/graph.bench.ts`` times the Graph tab's
first open (the notebook run again before each round,
so each view starts its own worker) on two transformer-shaped plans of about 600 and 5.4k ops.
The Galata tests assert behaviour only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the target per interaction, milliseconds from the event to the plan drawn (recorded here, issue 18
#: item 10: a 100 ms median asserted in a Galata test failed `make test` on a loaded machine)
TARGET_MS = {"p50": 150.0, "p95": 400.0}
#: the Graph view, from the tab's click to the drawing on screen, first open (issue 18 item 2: "a 600-op
#: graph opens in 2 s or less"; the 5.4k-op graph opens collapsed by module under the same target)
GRAPH_TARGET_MS = {"p50": 2000.0, "p95": 2000.0}
#: passes over the interactions (each pass: 6 slider moves, 2 arrow keys, 1 typed budget)
ROUNDS = {"quick": 1, "full": 3}
PORT = os.environ.get("MEMVIZ_UI_BENCH_PORT", "18898")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the sorted samples."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(samples: dict[str, list[float]], target: dict[str, float] = TARGET_MS) -> list[dict]:
    """p50 / p95 per interaction and whether `target` is met; a sample of -1 is a plan never drawn."""
    rows = []
    for name, values in samples.items():
        drawn = [v for v in values if v >= 0]
        p50, p95 = percentile(drawn, 50), percentile(drawn, 95)
        rows.append({"interaction": name, "n": len(values), "not_drawn": len(values) - len(drawn),
                     "p50_ms": p50, "p95_ms": p95,
                     "meets_target": bool(drawn) and len(drawn) == len(values)
                     and p50 <= target["p50"] and p95 <= target["p95"]})
    return rows


def missing() -> str | None:
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        return f"no Chromium at {chromium} (`make chromium`)"
    if not (ROOT / "ui-tests" / "node_modules").exists():
        return "ui-tests/node_modules is missing (`make install-test`)"
    if _jlpm() is None:
        return "jlpm is not on PATH (it comes with jupyterlab)"
    return None


def _jlpm() -> str | None:
    beside = Path(sys.executable).parent / "jlpm"
    return str(beside) if beside.exists() else shutil.which("jlpm")


def run(quick: bool) -> dict:
    result: dict = {"target_ms": TARGET_MS, "graph_target_ms": GRAPH_TARGET_MS}
    reason = missing()
    if reason:
        result.update(not_run=reason, rows=[])
        result["markdown"] = markdown(result)
        return result
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "latency.json"
        graph_out = Path(tmp) / "graph.json"
        env = {**os.environ, "MEMVIZ_UI_BENCH_OUT": str(out), "MEMVIZ_UI_GRAPH_BENCH_OUT": str(graph_out),
               "MEMVIZ_UI_PORT": PORT,
               "MEMVIZ_UI_BENCH_ROUNDS": str(ROUNDS["quick" if quick else "full"]),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        start = time.perf_counter()
        done = subprocess.run([_jlpm(), "playwright", "test", "--config", "bench.config.js"],
                              cwd=ROOT / "ui-tests", env=env, capture_output=True, text=True)
        result["wall_s"] = time.perf_counter() - start
        if done.returncode != 0 or not out.exists() or not graph_out.exists():
            result.update(not_run=f"the Galata run failed (exit {done.returncode}): {done.stdout[-2000:]}",
                          rows=[])
            result["markdown"] = markdown(result)
            return result
        measured = json.loads(out.read_text())
        graph = json.loads(graph_out.read_text())
    result.update(samples=measured["samples"], frontier_points=measured["frontier_points"],
                  rows=summarize(measured["samples"]), rounds=ROUNDS["quick" if quick else "full"],
                  graph_samples=graph["samples"], graph_rows=summarize(graph["samples"], GRAPH_TARGET_MS))
    result["markdown"] = markdown(result)
    return result


def markdown(result: dict) -> str:
    target = result["target_ms"]
    out = ["## Planner UI latency (Chromium)", "",
           "From the event the view handles to the plan it asked for drawn (kernel answer, readouts no "
           "longer pending, plotly re-plotted, one frame painted), timed in the page; `memviz.Planner` on "
           f"`memviz demo`'s model. Target per interaction: p50 <= {target['p50']:.0f} ms and p95 <= "
           f"{target['p95']:.0f} ms, every plan drawn.", ""]
    if result.get("not_run"):
        return "\n".join([*out, f"Not run: {result['not_run']}", ""])
    out += [f"{result['rounds']} pass(es), {result['frontier_points']} frontier points; the Galata run took "
            f"{result['wall_s']:.0f} s.", ""]
    out += _table(result["rows"])
    graph = result["graph_target_ms"]
    out += ["", "### Graph view open (Chromium)", "",
            "From the click on the Graph tab to the drawing on screen (layout in the worker done, SVG "
            "inserted, one frame painted), each sample a view's first open (its own worker started), on "
            "`ui-tests/notebooks/graph_scale.ipynb`'s transformer-shaped plans. Target: p50 <= "
            f"{graph['p50']:.0f} ms and p95 <= {graph['p95']:.0f} ms.", ""]
    out += _table(result["graph_rows"])
    return "\n".join([*out, ""])


def _table(rows: list[dict]) -> list[str]:
    out = ["| interaction | n | p50 ms | p95 ms | not drawn | target met |", "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['interaction']} | {r['n']} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | "
                   f"{r['not_drawn']} | {'yes' if r['meets_target'] else 'NO'} |")
    return out


if __name__ == "__main__":
    from run import bench_main

    sys.exit(bench_main(run, "ui", __doc__, quick_help="one pass over the interactions"))
