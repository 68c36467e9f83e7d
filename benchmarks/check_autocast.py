"""Plans of a training step run inside ``torch.autocast`` (mixed precision), on real models.

Run: ``python benchmarks/check_autocast.py [--models gpt2_sdpa,llama,...] [--dtype bfloat16]``; prints one
table (a few minutes on a quiet 2-core machine; not a registered benchmark).

Each model of the real-model zoo (`tests/real_models.py`: dropout on, its rotating loss, AdamW) is profiled
inside ``torch.autocast("cpu", dtype)``, planned at 75 % of its eager peak (``auto``, exported, and
``sac``, applied; at the smallest budget a planner names when 75 % is refused), and both are built with
``verify=True`` *outside* any autocast region: memviz runs the step in the regions it was profiled in
(forward, loss and backward inside, the update outside: `memviz.hardware.accelerator.autocast_as`), so
the measured peak is checked against the plan and the gradients against eager's step under autocast,
whatever the caller's own autocast state.  Columns: the profile's eager peak (the update included), then
each plan's peak and its verified measured peak (a verified module never measures over its budget: the
build raises instead) and how its step compared with eager's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

DEFAULT = ("gpt2_sdpa", "llama", "bert", "tv_resnet")


def check(name: str, dtype: Any) -> list[str]:
    """One table row: profile under autocast, an exported and an applied plan, each verified."""
    import torch

    import memviz
    from solvers.result import InfeasibleBudget
    from tests.real_models import REAL, rotating_loss

    case = REAL[name]()
    loss = case.losses[rotating_loss(case, list(REAL).index(name))]
    if hasattr(getattr(case.model, "config", None), "use_cache"):
        case.model.config.use_cache = False  # as transformers' gradient checkpointing sets it
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=dtype):
        prof = memviz.profile(case.model, case.args, case.kwargs, loss_fn=loss,
                              optimizer=torch.optim.AdamW, repeats=1, warmup=0)
    cells = [name, f"{prof.baseline.peak_bytes / 2**20:.3f}"]

    def verified(strategy: str, build: Any) -> str:
        try:
            try:
                plan = memviz.plan(prof, 0.75, strategy=strategy)
            except InfeasibleBudget as refused:
                plan = memviz.plan(prof, refused.minimum_bytes, strategy=strategy)
            module = build(plan, verify=True, inputs=(case.args, case.kwargs), loss_fn=loss)
        except Exception as exc:  # noqa: BLE001 - a row per model, whatever fails
            return f"{type(exc).__name__}: {str(exc)[:120]}"
        same = module.verified_equal
        return (f"{module.plan.peak_bytes / 2**20:.3f} / {module.verified_peak_bytes / 2**20:.3f}, "
                + ("gradients equal to eager's" if same.equal else same.describe()))

    cells.append(verified("auto", memviz.export))
    cells.append(verified("sac", lambda plan, **kw: memviz.apply(plan, case.model, **kw)))
    cells.append(f"{time.perf_counter() - start:.0f}")
    return cells


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    a = ap.parse_args()
    print("| model | eager peak MiB | auto, exported: plan / measured MiB "
          "| sac, applied: plan / measured MiB | s |\n|---|---|---|---|---|")
    for name in a.models.split(","):
        print("| " + " | ".join(check(name, getattr(torch, a.dtype))) + " |", flush=True)


if __name__ == "__main__":
    main()
