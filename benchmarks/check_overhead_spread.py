"""How much the Planner's overhead readout moves when the same model is profiled again (issue 18 item 4:
re-running the demo Planner cell gave the same plan at +10.9% and then at +53.5%).

Run: ``python benchmarks/check_overhead_spread.py [--rounds 5] [--threads 0] [--budget 60%]``
(CPU; ``--threads 0`` keeps torch's default intra-op threads, as a notebook kernel has them).

Each round profiles the demo model (`memviz.demo.demo_model`, what the Planner cell runs) twice, once
timing each operator the way the profile did before issue 18's fix and once as it does now, interleaved
so both see the same load, and plans each at the cell's budget as the Planner does
(``strategy="auto"``, ``time_limit=10``):

* before: `MedianTimer`, the profile's timer until then (median of the timed runs; the warm-up run stood
  for the operator when it overran the 50 ms budget), on torch's intra-op threads (wall clock when more
  than one);
* now: `memviz.profiling.profile._Timer` (the fastest timed run) on one intra-op thread, this process's
  CPU time (`memviz.hardware.accelerator.timing_threads`).

It prints per method the time overhead the Planner shows (``Plan.time_overhead``), the plan
(strategy, recomputations, peak), the summed op times and the load, and the range of the overheads over
the rounds.  Nothing is asserted: it measures the machine it runs on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import memviz  # noqa: E402
from memviz.demo import demo_model  # noqa: E402
from memviz.hardware import accelerator  # noqa: E402
from memviz.profiling import profile as P  # noqa: E402


class MedianTimer(P._Timer):
    """The profile's operator timer before issue 18 item 4's fix, kept here to measure against."""

    def __call__(self, fn: Callable[[], Any], repeats: int, warmup: int) -> tuple[float, Any]:
        samples: list[float] = []
        spent = 0.0
        out = None
        seconds = 0.0
        for i in range(max(0, warmup) + max(1, repeats)):
            out = None
            seconds, out = self._once(fn)
            spent += seconds
            if i >= warmup:
                samples.append(seconds)
            settled = len(samples) >= 2 and max(samples) <= (1 + self.spread) * min(samples)
            if spent >= self.budget_s or settled:
                break
        return statistics.median(samples or [seconds]), out


@contextlib.contextmanager
def all_threads(device: Any) -> Iterator[None]:
    """`accelerator.timing_threads` before issue 18 item 4: the profile timed on torch's threads."""
    yield


def one_round(timer: type, threads: Callable[[Any], Any], budget: str) -> dict[str, Any]:
    """Profile the demo model with `timer` timing its operators on `threads`, and plan it as the Planner
    cell does."""
    now = P._Timer, accelerator.timing_threads
    P._Timer, accelerator.timing_threads = timer, threads
    try:
        model, args = demo_model()
        prof = memviz.profile(model, args, mode="train")
    finally:
        P._Timer, accelerator.timing_threads = now
    plan = memviz.plan(prof, budget, strategy="auto", time_limit=10)
    return {"overhead": plan.time_overhead, "strategy": plan.strategy, "recomputes": plan.timeline.recomputes,
            "peak": plan.timeline.peak_bytes, "ops_ms": 1e3 * prof.baseline.total_time,
            "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--budget", default="60%")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    methods = {"before": (MedianTimer, all_threads), "now": (P._Timer, accelerator.timing_threads)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    print(f"demo model, budget {a.budget}, {torch.get_num_threads()} intra-op threads, {a.rounds} rounds")
    for i in range(a.rounds):
        for name, (timer, threads) in methods.items():
            r = one_round(timer, threads, a.budget)
            runs[name].append(r)
            print(f"  round {i + 1} {name:6s}: overhead {100 * (r['overhead'] - 1):+6.1f}%  {r['strategy']} "
                  f"{r['recomputes']} recomputations, peak {r['peak'] / 2**20:.2f} MiB, "
                  f"ops {r['ops_ms']:.1f} ms, load {r['load']:.1f}", flush=True)
    for name, rs in runs.items():
        pct = [100 * (r["overhead"] - 1) for r in rs]
        plans = {(r["strategy"], r["recomputes"], r["peak"]) for r in rs}
        ops = [r["ops_ms"] for r in rs]
        spread = max(pct) - min(pct)
        print(f"{name}: overhead {min(pct):+.1f}% to {max(pct):+.1f}% (spread {spread:.1f} points, "
              f"sd {statistics.pstdev(pct):.1f}); {len(plans)} distinct plans; "
              f"summed op times {min(ops):.1f}-{max(ops):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
