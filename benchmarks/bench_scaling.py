"""Big graphs and time limits (issue 21 items 3 and 4).

Run: ``python benchmarks/bench_scaling.py [--quick] [--out FILE]`` (about three minutes on a loaded
2-core machine; ``--quick``: 1k and 2k ops, 1 s limits only).  Writes ``benchmarks/results/scaling.json``.

1. Time of the default `memviz.plan` (strategy auto, budget frontier and address packing, default
   60 s limit) against graph size, on synthetic GPT training graphs (tests/gpt_chain.py: ~72 ops per
   layer, forward and backward) of ~1k, 2k, 4k and 10k ops at 80% of the eager peak.  Targets: 4k ops
   within 15 s, 10k ops within 60 s.
2. How long each solver, and the default plan, takes against its time limit (1 and 3 s; at 10 s
   Checkmate and the plan, which nest other solvers) on the 2k-op graph: the promise is limit + 0.5 s
   (tests/test_time_limits.py asserts limit + 2 s, which survives a loaded shared machine).  Each call
   gets a fresh copy of the graph, so no per-graph cache helps it.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

from gpt_chain import gpt_graph  # noqa: E402
from run import bench_main  # noqa: E402

import memviz  # noqa: E402
from solvers import Graph, eager_schedule, simulate  # noqa: E402
from solvers.result import InfeasibleBudget, OutOfTime  # noqa: E402

#: GPT layers for ~1k, 2k, 4k and 10k compute nodes
LAYERS = (14, 28, 56, 139)
BUDGET_FRACTION = 0.8
#: the promise: a solver returns within its time limit plus this many seconds
OVERRUN_TARGET_S = 0.5
#: issue 21's targets for the default plan: ops -> seconds
PLAN_TARGETS_S = {4000: 15.0, 10000: 60.0}


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children: on a shared machine the wall clock also
    counts the time spent waiting for a core (at a load of 16 on 2 cores, 9 wall seconds per CPU second)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _budget(graph: Graph) -> int:
    return int(BUDGET_FRACTION * simulate(graph, eager_schedule(graph)).peak_bytes)


def fresh(graph: Graph, tag: str) -> Graph:
    """An equal graph under another name, so per-graph solver caches start cold."""
    return dataclasses.replace(graph, name=f"{graph.name}-{tag}")


def plan_curve(layers: tuple[int, ...]) -> list[dict]:
    # imported by the plan's packing (the device's allocator), once per process: not the first row's time
    import memviz.hardware.devices  # noqa: F401

    rows = []
    for n in layers:
        graph = gpt_graph(n)
        budget = _budget(graph)
        start, cpu = time.perf_counter(), cpu_seconds()
        p = memviz.plan(graph, budget)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        ops = len(graph.computes)
        target = next((t for size, t in PLAN_TARGETS_S.items() if abs(ops - size) <= 0.1 * size), None)
        rows.append({"layers": n, "ops": ops, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
                     "strategy": p.strategy,
                     "solve_seconds": round(p.solver_stats.seconds, 2), "frontier_points": len(p.frontier),
                     "packing": None if p.packing is None else p.packing["status"],
                     "peak_over_budget": round(p.peak_bytes / budget, 4), "target_s": target,
                     "load_average_1min": round(os.getloadavg()[0], 2)})
        print(f"[scaling] plan {ops} ops: {seconds:.1f} s, {cpu:.1f} CPU s ({p.strategy})", flush=True)
    return rows


def _solvers() -> dict:
    from solvers import checkmate, rockmate, rotor
    from solvers.olla import executor_tail, reorder

    def olla(graph: Graph, budget: int, *, time_limit: float):
        return reorder(graph, time_limit=time_limit, last=executor_tail(graph))

    def plan(graph: Graph, budget: int, *, time_limit: float):
        return memviz.plan(graph, budget, time_limit=time_limit)

    return {"checkmate": checkmate.solve, "checkmate-lp": checkmate.solve_lp, "rockmate": rockmate.solve,
            "rotor": rotor.solve, "olla": olla, "memviz.plan": plan}


#: at the longest limit only the solvers that nest others (Checkmate runs Rockmate and Rotor, the plan
#: a solver, a packing and a frontier): the whole run stays within its budget in benchmarks/run.py
NESTING = ("checkmate", "memviz.plan")


def limit_overruns(layers: int, limits: tuple[float, ...]) -> list[dict]:
    from ortools.sat.python import cp_model  # noqa: F401  (its ~1 s import is not a solver's time)

    graph = gpt_graph(layers)
    budget = _budget(graph)
    rows = []
    for limit in limits:
        for name, solve in _solvers().items():
            if limit == max(limits) > 3.0 and name not in NESTING:
                continue
            g = fresh(graph, f"{name}-{limit}")
            start = time.perf_counter()
            try:
                solve(g, budget, time_limit=limit)
                answer = "plan"
            except OutOfTime:
                answer = "out of time"
            except InfeasibleBudget:
                answer = "infeasible"
            seconds = time.perf_counter() - start
            rows.append({"solver": name, "ops": len(graph.computes), "time_limit": limit,
                         "seconds": round(seconds, 2), "overrun_s": round(seconds - limit, 2),
                         "within_target": seconds <= limit + OVERRUN_TARGET_S, "answer": answer,
                         "load_average_1min": round(os.getloadavg()[0], 2)})
            print(f"[scaling] {name} at {limit} s: {seconds:.2f} s ({answer})", flush=True)
    return rows


def markdown(result: dict) -> str:
    out = ["## Big graphs and time limits (issue 21)", "",
           f"Default `memviz.plan` (auto, frontier and packing, 60 s limit) on synthetic GPT training graphs "
           f"(tests/gpt_chain.py) at {BUDGET_FRACTION:.0%} of the eager peak; load average per row.", "",
           "| ops | plan s | CPU s | target s | solve s | strategy | frontier points | packing | load |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in result["plan_curve"]:
        target = "" if r["target_s"] is None else f"{r['target_s']:.0f}"
        out.append(f"| {r['ops']} | {r['seconds']} | {r.get('cpu_seconds', '')} | {target} | "
                   f"{r['solve_seconds']} | {r['strategy']} | "
                   f"{r['frontier_points']} | {r['packing']} | {r['load_average_1min']} |")
    before = result.get("before")
    if before:
        out += ["", f"Before (main at {before['commit']}, same graphs and budgets, run side by side with the "
                "rows above, at the same load): " + ", ".join(
                    f"{r['ops']} ops {r['seconds']} s, {r['cpu_seconds']} CPU s (load {r['load']})"
                    for r in before["plan_curve"]) + "."]
    out += ["", f"Time limits on the {result['limits'][0]['ops']}-op graph (target: limit + "
            f"{OVERRUN_TARGET_S} s; each call starts with cold caches):", "",
            "| solver | limit s | took s | overrun s | within target | answer | load |",
            "|---|---|---|---|---|---|---|"]
    for r in result["limits"]:
        out.append(f"| {r['solver']} | {r['time_limit']} | {r['seconds']} | {r['overrun_s']} | "
                   f"{'yes' if r['within_target'] else 'no'} | {r['answer']} | {r['load_average_1min']} |")
    return "\n".join(out) + "\n"


#: the default plan on main before this work (1da3dc1, same graphs and budgets), measured by this file's
#: `plan_curve` run on main's memviz and solvers in a second process side by side with the committed
#: rows (`benchmarks/results/scaling.json`), so at the same load: wall and CPU seconds per graph
BEFORE = {"commit": "1da3dc1",
          "plan_curve": [{"ops": 1017, "seconds": 44.41, "cpu_seconds": 4.12, "load": 11.57},
                         {"ops": 2025, "seconds": 53.82, "cpu_seconds": 5.85, "load": 10.67},
                         {"ops": 4041, "seconds": 60.47, "cpu_seconds": 6.94, "load": 10.45},
                         {"ops": 10017, "seconds": 60.78, "cpu_seconds": 5.66, "load": 11.35}]}


def headline(result: dict) -> list[dict]:
    """The RESULTS.md headline rows (benchmarks/run.py): issue 21 items 4 (plan time at 4k and 10k ops)
    and 3 (the worst overrun of any solver's time limit), each against its target."""
    out = [{"metric": f"issue 21 item 4: default memviz.plan at {r['ops']} ops (synthetic GPT, "
                      f"{BUDGET_FRACTION:.0%} of eager peak)",
            "ours": f"{r['seconds']:.1f} s ({r.get('cpu_seconds', 0):.1f} CPU s, "
                    f"load {r['load_average_1min']})",
            "baseline": f"target <= {r['target_s']:.0f} s", "ratio": f"{r['seconds'] / r['target_s']:.2f}"}
           for r in result["plan_curve"] if r["target_s"] is not None]
    rows = result["limits"]
    worst = max(rows, key=lambda r: r["overrun_s"])
    limits = "/".join(f"{x:g}" for x in sorted({r["time_limit"] for r in rows}))
    out.append({"metric": f"issue 21 item 3: time limits {limits} s, {len({r['solver'] for r in rows})} "
                          f"solvers, {rows[0]['ops']}-op graph: worst overrun",
                "ours": f"{worst['overrun_s']:+.2f} s ({worst['solver']} at {worst['time_limit']:g} s); "
                        f"{sum(r['within_target'] for r in rows)} of {len(rows)} within",
                "baseline": f"target <= +{OVERRUN_TARGET_S} s", "ratio": ""})
    return out


def run(quick: bool) -> dict:
    layers = LAYERS[:2] if quick else LAYERS
    result = {"name": "scaling", "title": "Big graphs and time limits",
              "plan_curve": plan_curve(layers),
              "limits": limit_overruns(LAYERS[1], (1.0,) if quick else (1.0, 3.0, 10.0)),
              "before": BEFORE if BEFORE["plan_curve"] else None}
    result["markdown"] = markdown(result)
    result["headline"] = headline(result)
    return result


if __name__ == "__main__":
    raise SystemExit(bench_main(run, "scaling", __doc__, quick_help="1k and 2k ops, 1 s limits only"))
