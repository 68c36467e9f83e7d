"""From the user's seat: wall time of each stage a notebook user waits for (issue 9 item 4).

Run: ``python benchmarks/bench_user.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/user.json``.

For every example model (examples/models.py, default sizes; a full run adds a 12-layer GPT at d=256,
seq 128, batch 2) the stages of the README's five lines, each timed on its own, in one process (the
imports are paid once, before the first model, and reported separately):
``memviz.profile(model, args, mode="train")``, ``memviz.plan(prof, budget)`` half way from Rotor's
minimum budget to the eager peak (strategy "auto", with the budget frontier the widget draws),
``memviz.export(plan)`` and the exported module's first training step.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

_start = time.perf_counter()
import torch  # noqa: E402

import memviz  # noqa: E402
from examples import models  # noqa: E402
from memviz.plans.planning import minimum_budget  # noqa: E402
from memviz.profiling.capture import default_loss  # noqa: E402

IMPORT_S = time.perf_counter() - _start


def stages(model: torch.nn.Module, args: tuple) -> dict:
    """Seconds of profile, plan (auto, 50 % of the range, frontier), export, the exported first step."""
    out: dict = {}
    t = time.perf_counter()
    prof = memviz.profile(model, args, mode="train")
    out["profile_s"] = time.perf_counter() - t
    t = time.perf_counter()
    low = minimum_budget(prof.graph, "rotor")  # half way to the eager peak: feasible for every example
    plan = memviz.plan(prof, low + (prof.baseline.peak_bytes - low) // 2)
    out["plan_s"] = time.perf_counter() - t
    t = time.perf_counter()
    opt = memviz.export(plan)
    out["export_s"] = time.perf_counter() - t
    t = time.perf_counter()
    default_loss(opt(*args)).backward()
    out["first_step_s"] = time.perf_counter() - t
    out.update(total_s=sum(out.values()), strategy=plan.strategy, compute_nodes=len(prof.graph.computes),
               frontier_points=len(plan.frontier))
    return out


def markdown(result: dict) -> str:
    out = ["## From the user's seat: profile + plan + export wall time", "",
           f"One process; `import torch, memviz` took {result['import_s']:.1f} s once. Plan = "
           "`memviz.plan(prof, budget)`, budget half way from Rotor's minimum to the eager peak (auto "
           "strategy, with the budget frontier); plan time includes the minimum-budget search.", "",
           "| model | ops | profile s | plan s (strategy) | frontier points | export s | first step s | "
           "total s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(f"| {r['model']} | {r['compute_nodes']} | {r['profile_s']:.2f} | {r['plan_s']:.2f} "
                   f"({r['strategy']}) | {r['frontier_points']} | {r['export_s']:.2f} | "
                   f"{r['first_step_s']:.2f} | {r['total_s']:.2f} |")
    return "\n".join(out + [""])


def run(quick: bool = False) -> dict:
    makers = dict(models.EXAMPLES)
    if quick:
        makers = {name: makers[name] for name in ("mlp", "gpt")}
    else:
        makers["gpt-12l"] = lambda: models.gpt(batch=2, seq=128, d=256, heads=4, layers=12, vocab=256)
    rows = []
    for name, make in makers.items():
        model, args = make()[:2]
        rows.append({"model": name, **stages(model, args)})
    slowest = max(rows, key=lambda r: r["total_s"])
    result = {"name": "user", "title": "From the user's seat", "import_s": IMPORT_S, "rows": rows,
              "notes": [],
              "headline": [{"metric": f"profile + plan + export, slowest example ({slowest['model']}, "
                                      f"{slowest['compute_nodes']} ops)",
                            "ours": f"{slowest['total_s']:.1f} s", "baseline": "", "ratio": ""}]}
    result["markdown"] = markdown(result)
    return result


def main(argv: list[str] | None = None) -> int:
    from run import bench_main

    return bench_main(run, "user", __doc__, argv, "mlp and gpt only")


if __name__ == "__main__":
    raise SystemExit(main())
