"""How much one unchanged plan's measured step-time ratio moves between repeated measurements, with the
measurement bench_export used before exec24 and with the one it uses now (issue 22 item 2).

Run: ``python benchmarks/check_export_noise.py [--model mlp] [--size default|bench] [--repeats 30]
[--profiles N [--fraction F]]``
(CPU, one intra-op thread, this process's CPU time).  One profile, one ``strategy="none"`` plan (no
recomputation: what it should measure is fixed), one exported module and one eager copy; then
`--repeats` measurements of the exported/eager ratio with each method, interleaved so both see the same
load:

* before: 15 back-to-back pairs, always (exported, eager), cyclic garbage collection on, no warm-up
  beyond the gradient check's step;
* now: `bench_export.measure_vs` (`accelerator.alternating_pairs`: the order swapped every pair,
  collection paused, 2 warm-up pairs, `bench_export.PAIRS` pairs).

It prints the plan's prediction, the load, and per method the mean, standard deviation and range of the
repeated measurements.  ``--size bench`` runs the model at bench_export's timed size (`bench_export.SIZES`,
a 15-40 ms step); ``default`` at examples/models.py's defaults (a 0.25-0.5 ms step).

``--profiles N`` asks the other question, whether the plan's *prediction* misses the measurement by more
than both move (exec26): N times a fresh profile (its op times and fixed costs measured again), a plan at
``--fraction`` of [rotor minimum, eager peak] (``strategy="auto"``; none given: ``strategy="none"``),
and the exported plan measured as bench_export measures it; it prints each and the spread of predicted,
measured and their difference.  A difference whose mean is near 0 against its spread is noise, not
something the cost model leaves out.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import bench_export  # noqa: E402
import torch  # noqa: E402
from bench_remat import gradient_error  # noqa: E402

import memviz  # noqa: E402
from examples.models import EXAMPLES  # noqa: E402

#: the pairs per measurement bench_export took before exec24
BEFORE_PAIRS = 15


def before(candidate: torch.nn.Module, reference: torch.nn.Module, args: tuple) -> float:
    """bench_export's measured ratio before exec24: (exported, eager) pairs, collection on."""
    gradient_error(reference, candidate, args)
    ratios = []
    for _ in range(BEFORE_PAIRS):
        (_, c), (_, r) = bench_export._clocked(candidate, args), bench_export._clocked(reference, args)
        ratios.append(c / r)
    return statistics.median(ratios)


def now(candidate: torch.nn.Module, reference: torch.nn.Module, args: tuple) -> float:
    return bench_export.measure_vs(candidate, reference, args, bench_export.PAIRS)["measured_overhead"]


def summary(values: list[float]) -> str:
    return (f"mean {statistics.mean(values):.3f} sd {statistics.pstdev(values):.3f} "
            f"range {min(values):.3f}-{max(values):.3f}")


def profiles(model: torch.nn.Module, args: tuple, n: int, fraction: float | None) -> dict[str, list[float]]:
    """`n` times: profile, plan, export, measure (`--profiles`); the predicted and measured overheads."""
    from memviz.plans.planning import minimum_budget

    out: dict[str, list[float]] = {"predicted": [], "measured": [], "difference": []}
    for i in range(n):
        prof = memviz.profile(model, args, mode="train", repeats=bench_export.PROFILE_REPEATS)
        if fraction is None:
            plan = memviz.plan(prof, strategy="none", frontier=False, packing=False)
        else:
            low = minimum_budget(prof.graph, "rotor")
            plan = memviz.plan(prof, low + int(fraction * (prof.baseline.peak_bytes - low)), strategy="auto",
                               time_limit=10.0, frontier=False)
        measured = now(memviz.export(plan, model=copy.deepcopy(model)), copy.deepcopy(model), args)
        pair = (plan.time_overhead, measured, plan.time_overhead - measured)
        for key, value in zip(out, pair, strict=True):
            out[key].append(value)
        print(f"  profile {i}: {plan.strategy}, {plan.timeline.recomputes} recomputations, predicted "
              f"{plan.time_overhead:.3f}, measured {measured:.3f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp", choices=sorted(EXAMPLES))
    ap.add_argument("--size", default="default", choices=("default", "bench"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--profiles", type=int, default=0, help="profile, plan and measure this many times")
    ap.add_argument("--fraction", type=float, default=None, help="with --profiles: the plan's budget")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, args = EXAMPLES[a.model](**(bench_export.SIZES[a.model] if a.size == "bench" else {}))
    if a.profiles:
        load = [os.getloadavg()[0]]
        runs = profiles(model, args, a.profiles, a.fraction)
        load.append(os.getloadavg()[0])
        print(f"{a.model} ({a.size} size), {a.profiles} profiles, load {min(load):.1f}-{max(load):.1f}")
        for name, values in runs.items():
            print(f"  {name}: {summary(values)}")
        return 0
    prof = memviz.profile(model, args, mode="train", repeats=bench_export.PROFILE_REPEATS)
    plan = memviz.plan(prof, strategy="none", frontier=False, packing=False)
    exported, eager = memviz.export(plan, model=copy.deepcopy(model)), copy.deepcopy(model)
    load = [os.getloadavg()[0]]
    runs: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(a.repeats):
        runs["before"].append(before(exported, eager, args))
        runs["now"].append(now(exported, eager, args))
    load.append(os.getloadavg()[0])
    print(f"{a.model} ({a.size} size), strategy none: predicted {plan.time_overhead:.3f}; "
          f"{a.repeats} measurements each, load {min(load):.1f}-{max(load):.1f}")
    for name, values in runs.items():
        print(f"  {name}: {summary(values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
