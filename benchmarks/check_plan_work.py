"""The default `memviz.plan`'s work, not its wait: CPU seconds per stage with every wall-clock cap scaled.

Run: ``python benchmarks/check_plan_work.py [--scale 8] [--layers 14,56]`` (tests/gpt_chain.py graphs at 80%
of the eager peak, as ``bench_scaling.py``; 14 layers: 1,017 ops, 56: 4,041, 139: 10,017).

On a shared machine a plan's wall seconds are mostly the wait for a core, and the solvers' safety caps are
wall-clock caps: under load they cut work a quiet machine would do (block MILPs, the packing search), so
neither the wall nor the CPU seconds of a loaded run say what a quiet machine spends.  Here every cap the
default plan meets is multiplied by ``--scale`` (the plan's limit, the packing's and the frontier's, and
Rockmate's block-MILP caps ``rockmate.MILP_SECONDS`` and ``block_milp.SOLVE_SECONDS``), so at a load that
slows the process by less than that factor it does a quiet machine's work; its CPU seconds (this process
and reaped children) are about a quiet machine's wall seconds (one thread).  Printed per graph: CPU seconds
of the solve (``_solve_first``), the packing and the frontier (its minimum included), the plan (peak, step
time, overhead, packed peak), and where a cap still cut something.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

from gpt_chain import gpt_graph  # noqa: E402

import memviz  # noqa: E402
import memviz.hardware.devices  # noqa: E402, F401  (the packing's import of torch: the process's, not a stage's)
from memviz.plans import planning  # noqa: E402
from solvers import block_milp, eager_schedule, rockmate, simulate  # noqa: E402


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(name: str, spent: dict[str, float], scale: float, limit_kw: str | None = None) -> None:
    """Wrap `planning.<name>` to add its CPU seconds to `spent[name]`, its `limit_kw` scaled."""
    inner: Callable[..., Any] = getattr(planning, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if limit_kw is not None and limit_kw in kwargs:
            kwargs[limit_kw] *= scale
        start = cpu_seconds()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + cpu_seconds() - start

    setattr(planning, name, wrapper)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=8.0, help="factor on every wall-clock cap (default 8)")
    ap.add_argument("--layers", default="14,56", help="GPT layers, comma-separated (default 14,56)")
    a = ap.parse_args()
    rockmate.MILP_SECONDS *= a.scale
    block_milp.SOLVE_SECONDS *= a.scale
    spent: dict[str, float] = {}
    timed("_solve_first", spent, a.scale)
    timed("packing_of", spent, a.scale, "time_limit")
    timed("solve_frontier", spent, a.scale, "time_limit")
    for layers in map(int, a.layers.split(",")):
        spent.clear()
        graph = gpt_graph(layers)
        budget = int(0.8 * simulate(graph, eager_schedule(graph)).peak_bytes)
        wall, cpu = time.perf_counter(), cpu_seconds()
        p = memviz.plan(graph, budget, time_limit=60.0 * a.scale)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        packed = None if p.packing is None else p.packing["peak_bytes"]
        load = os.getloadavg()[0]
        print(f"{len(graph.computes)} ops: {cpu:.2f} CPU s ({wall:.1f} s wall, load {load:.1f}); "
              + ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
              + f"; peak {p.peak_bytes}, step {p.timeline.total_time:.6g} s, x{p.time_overhead:.4f}, "
              f"packed {packed}, {len(p.frontier)} frontier points, cuts {p.time_cuts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
