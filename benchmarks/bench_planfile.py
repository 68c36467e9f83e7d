"""Plan-file load time against plan size (issue 17 item 4: loading must be linear, 100k steps < 2 s).

Run: ``python benchmarks/bench_planfile.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/planfile.json``.

Each size is a training chain (forward ops with a weight each, a loss, the backward mirror) planned in
eager order with `memviz.plan(graph)`, saved with `Plan.save`, and loaded with `memviz.load_plan` (JSON
parse, value check, schema validation, graph rebuild and re-simulation of both runs), best of
`REPEATS` loads.  The schedule has about four steps per forward op (two computes, two frees), so a
chain of n ops is a plan of about 4n steps; seconds per 1000 steps at each size show whether the
cost is linear.  The target is a column (pass/fail per size), never an assertion: the machine is
shared, and its load average at the run is recorded beside the times.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import memviz  # noqa: E402
from solvers import DataKind, Graph, GraphBuilder, Phase  # noqa: E402

SIZES = (10_000, 30_000, 100_000)
QUICK_SIZES = (2_000, 6_000, 20_000)
REPEATS = 3
#: issue 17 item 4: 100k steps load in under 2 s, linear cost: 0.02 CPU s per 1000 steps at any size
TARGET_S_PER_1000_STEPS = 2.0 / 100


def chain_graph(n: int) -> Graph:
    """n forward ops (activation + weight in, activation out), a loss, n backward ops."""
    b = GraphBuilder(f"chain{n}")
    acts = [b.data("x", 4096, DataKind.INPUT)]
    weights = []
    for i in range(n):
        weights.append(b.data(f"w{i}", 1024, DataKind.PARAMETER))
        acts.append(b.data(f"a{i}", 4096))
        b.compute(f"f{i}", [acts[-2], weights[-1]], [acts[-1]], op="aten.mm", phase=Phase.FORWARD, time=1e-5)
    grad = b.data("loss", 4, DataKind.OUTPUT)
    b.compute("loss", [acts[-1]], [grad], op="loss", phase=Phase.FORWARD, time=1e-6)
    outputs = [grad]
    for i in reversed(range(n)):
        g_in = b.data(f"da{i}", 4096, DataKind.GRADIENT)
        g_w = b.data(f"dw{i}", 1024, DataKind.PARAMETER_GRADIENT)
        b.compute(f"b{i}", [grad, acts[i], weights[i]], [g_in, g_w], op="aten.mm", phase=Phase.BACKWARD,
                  time=2e-5)
        outputs.append(g_w)
        grad = g_in
    b.outputs = outputs
    return b.build()


def save_plan(steps: int, folder: Path) -> Path:
    """The eager plan of a chain of about `steps` / 4 ops, saved.  Its "cdgraph" entry (optional in the
    schema) is left empty: writing a 25k-op graph's collapsed DOT takes minutes (the chain decomposition
    behind it is quadratic in the forward ops), and the loader reads that entry as one string."""
    graph = chain_graph(max(1, steps // 4))
    empty = {"dot": "", "collapsed_dot": None, "nodes": 0}
    with mock.patch("memviz.plans.planning.cdgraph_dict", return_value=empty):
        plan = memviz.plan(graph, frontier=False, packing=False)
        return plan.save(folder / f"plan{steps}.json")


def load_seconds(steps: int, folder: Path) -> dict:
    path = save_plan(steps, folder)
    wall, cpu = float("inf"), float("inf")
    loaded = None
    for _ in range(REPEATS):
        loaded = None  # the last load's plan is freed before the clocks start, not timed with this load
        t, c = time.perf_counter(), time.process_time()
        loaded = memviz.load_plan(path)
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    total = len(loaded.schedule) + len(loaded.baseline_schedule)
    return {"target_steps": steps, "steps": len(loaded.schedule), "schedule_steps_both_runs": total,
            "compute_nodes": len(loaded.graph.computes), "file_mb": round(path.stat().st_size / 1e6, 2),
            "load_s": round(wall, 3), "load_cpu_s": round(cpu, 3),
            "s_per_1000_steps": round(1000 * wall / len(loaded.schedule), 5),
            "cpu_s_per_1000_steps": round(1000 * cpu / len(loaded.schedule), 5),
            "meets_target": 1000 * cpu / len(loaded.schedule) < TARGET_S_PER_1000_STEPS}


def markdown(result: dict) -> str:
    rows = result["rows"]
    first = rows[0]["cpu_s_per_1000_steps"]
    out = ["## Plan file load time (issue 17 item 4)", "",
           "`memviz.load_plan` of an eager-order training-chain plan (JSON parse, value check, schema "
           f"validation, graph rebuild, re-simulation of both runs), best of {REPEATS}, after one load that "
           "pays the imports. Wall and CPU seconds of this process (the CPU time is what the shared "
           "machine's load inflates least). Target: 100k steps in under 2 s, linear cost (the per-step "
           f"columns stay flat): under {TARGET_S_PER_1000_STEPS:.3f} CPU s per 1000 steps at every size. "
           f"Load average of the machine at the run: {result['load_average']}.", "",
           "| steps | compute nodes | file MB | load s (wall) | load s (CPU) | CPU s per 1000 steps "
           "| vs smallest | target |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['steps']} | {r['compute_nodes']} | {r['file_mb']} | {r['load_s']:.3f} | "
                   f"{r['load_cpu_s']:.3f} | {r['cpu_s_per_1000_steps']:.4f} | "
                   f"{r['cpu_s_per_1000_steps'] / first:.2f} | {'pass' if r['meets_target'] else 'FAIL'} |")
    return "\n".join(out + [""])


def run(quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        memviz.load_plan(save_plan(100, Path(tmp)))  # the imports (jsonschema: seconds) are paid here
        rows = [load_seconds(s, Path(tmp)) for s in (QUICK_SIZES if quick else SIZES)]
    big = rows[-1]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    result = {"rows": rows, "load_average": None if load is None else [round(x, 1) for x in load],
              "headline": [{
        "metric": f"plan file load, {big['steps']} steps ({big['file_mb']} MB), CPU s (per-step ratio to "
                  f"{rows[0]['steps']} steps)",
        "ours": f"{big['load_cpu_s']:.2f} s ({big['load_s']:.2f} s wall)",
        "baseline": f"target < 2 s per 100k steps, linear: {'pass' if big['meets_target'] else 'FAIL'}",
        "ratio": f"{big['cpu_s_per_1000_steps'] / rows[0]['cpu_s_per_1000_steps']:.2f}"}]}
    result["markdown"] = markdown(result)
    return result


if __name__ == "__main__":
    from run import bench_main

    raise SystemExit(bench_main(run, "planfile", __doc__))
