"""What Inductor adds to a compiled plan's peak, memviz's realize threshold or Inductor's default (issue 22).

Run: ``python benchmarks/check_compiled_peak.py [--model resnet] [--fraction 0.5] [--realize-reads 0]`` (CPU,
one thread; an Inductor compile: minutes).  bench_compile's ``--model`` (default ResNet), planned on
V100-roofline op times (the same plan on every machine and load) at ``--fraction`` of [rotor minimum, eager
peak] (1: the eager schedule); the plan exported, compiled with ``torch.compile(..., backend="inductor")`` and
one step measured by the CPU allocator (`memviz.profiling.tracker.allocator_peak`), less what the uncompiled
export's step counts beyond the live-storage tracker (convolution workspaces: memory no plan models).  It
prints that against the plan's peak.  ``--realize-reads`` sets
`memviz.runtime.compiled.REALIZE_READS_THRESHOLD`; ``--realize-reads 4`` is Inductor's default (a pointwise
value read by several kernels recomputed inside each), as before exec27.  ``--verify`` then runs
``memviz.export(plan, verify=True, backend="inductor")`` and prints what it returns or why it refuses.
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from bench_compile import MODELS  # noqa: E402
from bench_remat import _step  # noqa: E402

import memviz  # noqa: E402
import memviz.runtime.compiled  # noqa: E402
from memviz.plans.planning import minimum_budget  # noqa: E402
from memviz.profiling.tracker import allocator_peak, measure_peak, tensors_of  # noqa: E402
from memviz.runtime.export import BudgetExceededError  # noqa: E402
from memviz.runtime.verify import VerifyWarning  # noqa: E402

MiB = 2**20


def fixed_plan(fraction: float, model_name: str = "resnet") -> tuple[torch.nn.Module, tuple, Any]:
    """bench_compile's `model_name` (`bench_compile.MODELS`), its inputs, and its plan at `fraction` of
    [rotor minimum, eager peak] (1.0 or more: the eager schedule, ``strategy="none"``) on V100-roofline
    op times: the same plan on every machine and load."""
    torch.manual_seed(0)
    model, args = MODELS[model_name]()
    prof = memviz.profile(model, args, mode="train", repeats=1, warmup=0, measure=False)
    prof = prof.with_costs("fake:v100")
    if fraction >= 1:
        return model, args, memviz.plan(prof, strategy="none", frontier=False, packing=False)
    low = minimum_budget(prof.graph, "rotor", time_limit=600)
    return model, args, memviz.plan(prof, low + int(fraction * (prof.baseline.peak_bytes - low)),
                                    time_limit=600, frontier=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet", choices=sorted(MODELS))
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--realize-reads", type=int, default=memviz.runtime.compiled.REALIZE_READS_THRESHOLD)
    ap.add_argument("--verify", action="store_true",
                    help='then memviz.export(plan, verify=True, backend="inductor"): its module or refusal')
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    memviz.runtime.compiled.REALIZE_READS_THRESHOLD = a.realize_reads
    model, args, plan = fixed_plan(a.fraction, a.model)
    uncompiled = memviz.export(plan, model=copy.deepcopy(model))
    _step(uncompiled, args, 0)
    uncompiled.zero_grad(set_to_none=True)
    seen, _ = allocator_peak(lambda: _step(uncompiled, args, 0), tensors_of(uncompiled, args))
    uncompiled.zero_grad(set_to_none=True)
    tracked, _ = measure_peak(lambda: _step(uncompiled, args, 0), tensors_of(uncompiled, args))
    exported = memviz.export(plan, model=copy.deepcopy(model))
    compiled = torch.compile(exported, backend="inductor")
    for _ in range(2):  # the first step compiles
        _step(compiled, args, 0)
        exported.zero_grad(set_to_none=True)
    peak, _ = allocator_peak(lambda: _step(compiled, args, 0), tensors_of(exported, args))
    segments = len(next(iter(exported._compiled.values()))[1].graphs)
    print(f"{a.model} at {a.fraction:.0%}, {plan.strategy}, {plan.timeline.recomputes} recomputations, "
          f"realize {a.realize_reads}: {segments} segments; plan {plan.peak_bytes / MiB:.3f} MiB, compiled "
          f"{peak / MiB:.3f} MiB less {(seen - tracked) / MiB:.3f} unmodelled: "
          f"{(peak - seen + tracked - plan.peak_bytes) / MiB:+.3f} MiB over the plan "
          f"({peak - seen + tracked - plan.peak_bytes:+,} B; budget {plan.budget_bytes:,} B)")
    if a.verify:
        print(verified(plan, model))
    return 0


def verified(plan: Any, model: torch.nn.Module) -> str:
    """What ``memviz.export(plan, verify=True, backend="inductor")`` does with `plan`: the module it returns
    (its plan and measured peak; re-plans warn) or its refusal."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", VerifyWarning)
            module = memviz.export(plan, model=copy.deepcopy(model), verify=True, backend="inductor")
    except BudgetExceededError as exc:
        return f"verify refused: {exc}"
    notes = [str(w.message) for w in caught if issubclass(w.category, VerifyWarning)]
    return (f"verify returned a plan of {module.plan.peak_bytes:,} B measured "
            f"{module.verified_peak_bytes:,} B (budget {plan.budget_bytes:,} B)"
            + "".join(f"\n  {n}" for n in notes))


if __name__ == "__main__":
    raise SystemExit(main())
