"""The sac cost model with and without re-pricing recomputed ops at the rate the calibrated block ran in
step (`solvers.sac.Overheads.scale`, exec23), from ONE profile against ONE measurement per plan, so the
two predictions differ only by the model, not by the profile's or the measurement's noise.

Run: ``python benchmarks/check_sac_scale.py [--models gpt2,llama] [--pairs 15] [--options f/n/n/n,...]``
(the models and plans of ``check_sac_overheads.py``; CPU, one intra-op thread, this process's CPU time).
Per model it prints the profile's op times, eager's fixed cost and the block's three timings, and per
plan: the prediction of the model before (op times as timed alone, re-run and policy costs calibrated
against them, negative leftovers clamped to 0), the prediction now (``Plan.time_overhead``), and the
measured step-time ratio over eager twice (median of interleaved pairs each), whose spread is the noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import check_sac_overheads as check  # noqa: E402
import torch  # noqa: E402

import memviz  # noqa: E402
import memviz.plans.sac  # noqa: E402
from memviz.hardware import accelerator  # noqa: E402
from memviz.plans.sac import MATCHABLE, candidate_blocks, dispatched_counts, eager_holds, op_name  # noqa: E402
from solvers.sac import Overheads, Region  # noqa: E402


def unscaled(prof: Any) -> Any:
    """`prof` with the checkpointing costs as calibrated before exec23: scale 1, from the same block times."""
    graph = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    meta = graph.meta
    path, ids, mm, *_ = candidate_blocks(prof.model, graph, prof.captured)[0]
    keep = mm or frozenset([i for i in ids if op_name(graph.computes[i].op) in MATCHABLE][:1])
    full, selective = Region(path, ids), Region(path, ids, keep)
    holds = eager_holds(prof.captured, graph)
    base = Overheads(dispatched=dispatched_counts(prof.captured, graph))
    eager, full_s, sel_s = (meta[f"sac_block_{k}_s"] for k in ("eager", "full", "selective"))
    _, full_rerun, full_ops = base.passes(graph, full, holds)
    forward, sel_rerun, sel_ops = base.passes(graph, selective, holds)
    rerun = max(0.0, full_s - eager - full_ops) / full_rerun
    policy = max(0.0, sel_s - eager - sel_ops - rerun * sel_rerun) / (forward + sel_rerun)
    old = {**{k: v for k, v in meta.items() if k != "sac_scale"}, "sac_rerun_s": rerun,
           "sac_policy_s": policy}
    eager_graph = None if prof.baseline_graph is None else dataclasses.replace(prof.baseline_graph, meta=old)
    kept = {k: v for k, v in prof.graph.meta.items() if k != "sac_scale"}
    return dataclasses.replace(prof, graph=dataclasses.replace(prof.graph, meta={**kept, **old}),
                               baseline_graph=eager_graph)


def run(name: str, pairs: int, options: list[str]) -> None:
    model, args, kwargs, loss_fn, _ = check.case(name)
    prof = memviz.profile(model, args, kwargs, mode="train")
    graph = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    meta, old = graph.meta, unscaled(prof)
    block = {k: meta[f"sac_block_{k}_s"] * 1e3 for k in ("eager", "full", "selective")}
    print(f"\n{name} (load {os.getloadavg()[0]:.1f}): ops {prof.baseline.total_time * 1e3:.2f} ms + eager "
          f"fixed {meta.get('eager_fixed_s', 0.0) * 1e3:.2f} ms; {meta['sac_block']} alone: eager "
          f"{block['eager']:.2f} / full {block['full']:.2f} / selective {block['selective']:.2f} ms, scale "
          f"{meta['sac_scale']:.3f}\n")
    assert memviz.plans.sac.overheads(old, old.graph).scale == 1.0
    print("| options | predicted before | predicted now | measured | measured again |\n|---|---|---|---|---|")
    for chosen in options:
        now, before = check.planned(prof, chosen), check.planned(old, chosen)
        assert now.schedule == before.schedule
        applied = memviz.apply(now, model)
        first, again = (check.ratio(applied, model, args, kwargs, loss_fn, pairs) for _ in range(2))
        print(f"| {chosen} | {before.time_overhead:.3f} | {now.time_overhead:.3f} | {first:.3f} | "
              f"{again:.3f} |", flush=True)
    print(f"\n(load {os.getloadavg()[0]:.1f} at the end)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--options", default="f/n/n/n,m/n/n/n,f/f/n/n,f/f/f/f,m/m/m/m")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    accelerator.cpu_clock = time.process_time
    for name in a.models.split(","):
        run(name, a.pairs, a.options.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
