"""memviz.apply's step time with and without the sac menu counting checkpointing's own costs (issue 19
item 4), on CUDA when there is one, else on CPU: one self-contained device check, not a registered
benchmark (``benchmarks/bench_apply.py`` is the side-by-side with PyTorch's tools).

Run: ``python benchmarks/check_sac_overheads.py [--models gpt2,llama] [--pairs 8]``.  Per model (CUDA: the
Hugging Face GPT-2 and Llama of ``bench_cuda``, 6 x 512, seq 512, batch 4; CPU: the tiny ones of
``bench_apply``, one intra-op thread), profiled once, at 50% of [sac minimum, eager peak] and at the
minimum:

- "costed": ``memviz.plan(strategy="sac")`` as it is (`memviz.plans.sac.overheads`: the costs the profile
  measured on one block run alone, `memviz.plans.sac.checkpoint_costs`: per operator a recomputation
  re-runs, and the selective policy's dispatch modes per operator and pass);
- "uncosted": the same menu with those costs set to zero (the planner before this change);
- per-block full checkpointing (what users write by hand) as the peer.

Printed per row: the blocks' options, the plan's peak and predicted step time over eager
(``Plan.time_overhead``), the measured peak (CUDA: max allocated during the step less the copy's
parameters, as bench_cuda) and the measured step time over eager (median of interleaved pairs).
``--options n/f/m,...`` adds rows for those per-block options (n none, p pointwise, k matchable,
m matmuls, f full), planned without a budget: the accounting on chosen plans (the menu at 50% picked
m/m/m/m/m/n for GPT-2 on an H100, measured 2.87x against 1.02 predicted).  On the CPU the profile and
the steps are timed on this process's CPU time, which other processes' load does not inflate.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import statistics
import sys
import time
import unittest.mock
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import memviz  # noqa: E402
import memviz.plans.sac as sac  # noqa: E402
import solvers.sac  # noqa: E402
from memviz.hardware import accelerator  # noqa: E402
from solvers.result import InfeasibleBudget, SolveResult, SolverStats  # noqa: E402
from solvers.sac import Overheads  # noqa: E402

MiB = 2**20
CUDA = torch.cuda.is_available()


def case(name: str) -> tuple[torch.nn.Module, tuple, dict, Callable[[Any], torch.Tensor], list[str]]:
    """(model, args, kwargs, loss_fn, block paths) on this machine's device."""
    if CUDA:
        import bench_cuda

        model, args, kwargs, loss_fn = bench_cuda.MODELS[name]()
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        prefix = "transformer.h" if name == "gpt2" else "model.layers"
        return model, args, kwargs, loss_fn, [f"{prefix}.{i}" for i in range(model.config.num_hidden_layers)]
    import bench_apply

    model, args, blocks = bench_apply.MODELS[name](False)
    return model, args, {}, lambda out: out, blocks


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


#: option -> its letter in ``--options``
LETTERS = {"none": "n", "pointwise": "p", "matchable": "k", "matmuls": "m", "full": "f"}


def planned(prof: Any, options: str) -> Any:
    """A sac plan with the given per-block options ("n/m/f"), whatever its memory: the menu replaced by
    that one candidate (its schedule, simulation and costs as the menu would have them)."""
    names = {v: k for k, v in LETTERS.items()}
    chosen = tuple(names[o] for o in options.split("/"))

    def one(graph: Any, budget: int, blocks: Any, holds: Any, *, time_limit: float,
            overheads: Overheads, savings: Any = None) -> Any:
        choice = solvers.sac.choose(graph, blocks, chosen, holds, overheads)
        stats = SolverStats("sac", "heuristic", 0.0, objective=choice.step_s)
        return SolveResult(choice.schedule, stats), choice

    with unittest.mock.patch.object(sac, "solve_menu", one):
        return memviz.plan(prof, None, strategy="sac")


def step(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss_fn(model(*args, **kwargs)).backward()


def seconds(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable) -> float:
    _sync()
    t0 = time.perf_counter() if CUDA else time.process_time()
    step(model, args, kwargs, loss_fn)
    _sync()
    return (time.perf_counter() if CUDA else time.process_time()) - t0


def ratio(candidate: torch.nn.Module, eager: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable,
          pairs: int) -> float:
    """Median candidate/eager step-time ratio over interleaved pairs, after a warm-up step of each."""
    for m in (candidate, eager):
        step(m, args, kwargs, loss_fn)
    return statistics.median(seconds(candidate, args, kwargs, loss_fn) / seconds(eager, args, kwargs, loss_fn)
                             for _ in range(pairs))


def peak(candidate: torch.nn.Module, eager: torch.nn.Module, args: tuple, kwargs: dict,
         loss_fn: Callable) -> int | None:
    """Peak allocated bytes of one step less the copy's parameters (the original's stay, without their
    gradients), CUDA only."""
    if not CUDA:
        return None
    eager.zero_grad(set_to_none=True)
    step(candidate, args, kwargs, loss_fn)
    candidate.zero_grad(set_to_none=True)
    gc.collect()  # earlier candidates' reference cycles: every allocated byte on the device counts
    _sync()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step(candidate, args, kwargs, loss_fn)
    _sync()
    copied = sum(p.numel() * p.element_size() for p in candidate.parameters())
    return torch.cuda.max_memory_allocated() - copied


def blocks_checkpointed(model: torch.nn.Module, blocks: list[str]) -> torch.nn.Module:
    target = copy.deepcopy(model)
    for path in blocks:
        module = target.get_submodule(path)
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)
    return target


def row(label: str, candidate: torch.nn.Module, eager: torch.nn.Module, args: tuple, kwargs: dict,
        loss_fn: Callable, pairs: int, plan: Any = None) -> None:
    measured = ratio(candidate, eager, args, kwargs, loss_fn, pairs)
    got = peak(candidate, eager, args, kwargs, loss_fn)
    chosen = {} if plan is None else plan.solver_stats.extra["sac"]["options"]
    opts = "/".join(LETTERS[o] for o in chosen.values())
    planned = "" if plan is None else f"{plan.peak_bytes / MiB:9.2f}"
    predicted = "" if plan is None else f"{plan.time_overhead:6.3f}"
    print(f"| {label} | {opts} | {planned} | {'' if got is None else f'{got / MiB:9.2f}'} | {predicted} | "
          f"{measured:6.3f} |", flush=True)


def run(name: str, pairs: int, options: list[str], budgets: bool = True) -> None:
    model, args, kwargs, loss_fn, blocks = case(name)
    eager = model
    prof = memviz.profile(model, args, kwargs, loss_fn=loss_fn if CUDA else None, mode="train",
                          device="cuda" if CUDA else None)
    try:
        memviz.plan(prof, 1, strategy="sac")
        raise AssertionError("a 1-byte sac plan was accepted")
    except InfeasibleBudget as exc:
        low = exc.minimum_bytes
    meta = (prof.graph if prof.baseline_graph is None else prof.baseline_graph).meta
    block = {k: meta.get(f"sac_block_{k}_s", 0.0) * 1e3 for k in ("eager", "full", "selective")}
    print(f"\n{name} on {prof.device.name}: eager plan peak {prof.baseline.peak_bytes / MiB:.2f} MiB, sac "
          f"minimum {low / MiB:.2f} MiB; eager step {prof.baseline.total_time * 1e3:.2f} ms of ops + "
          f"{meta.get('eager_fixed_s', 0.0) * 1e3:.2f} ms fixed; costs measured on {meta.get('sac_block')} "
          f"alone (eager {block['eager']:.3f} / full {block['full']:.3f} / selective "
          f"{block['selective']:.3f} ms): re-run {meta.get('sac_rerun_s', 0.0) * 1e6:.2f} us per op, policy "
          f"{meta.get('sac_policy_s', 0.0) * 1e6:.2f} us per op and pass\n")
    print("| plan | options | plan MiB | measured MiB | predicted | measured |\n|---|---|---|---|---|---|")
    row("per-block checkpoint", blocks_checkpointed(model, blocks), eager, args, kwargs, loss_fn, pairs)
    for chosen in options:
        plan = planned(prof, chosen)
        row(f"options {chosen}", memviz.apply(plan, model), eager, args, kwargs, loss_fn, pairs, plan)
    for fraction in (0.5, 0.0) if budgets else ():
        budget = low + int(fraction * (prof.baseline.peak_bytes - low))
        for label, patch in (("costed", None), ("uncosted", Overheads())):
            uncosted = unittest.mock.patch.object(sac, "overheads", lambda *a, patch=patch: patch)
            with uncosted if patch is not None else contextlib.nullcontext():
                try:
                    plan = memviz.plan(prof, budget, strategy="sac")
                except InfeasibleBudget as exc:
                    print(f"| {label} @{fraction:.0%} | refused: {exc} |")
                    continue
            row(f"{label} @{fraction:.0%}", memviz.apply(plan, model), eager, args, kwargs, loss_fn, pairs,
                plan)
    del prof
    if CUDA:
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--options", default="", help="comma-separated per-block options to run too, e.g. "
                    "m/m/m/m/m/n,f/f/f/f/f/n (n none, m matmuls, f full); one list for every model")
    ap.add_argument("--no-budgets", action="store_true", help="only the per-block rows and --options")
    a = ap.parse_args(argv)
    if not CUDA:
        torch.set_num_threads(1)
        accelerator.cpu_clock = time.process_time
    for name in a.models.split(","):
        run(name, a.pairs, [o for o in a.options.split(",") if o], not a.no_budgets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
