"""Plans of a training step run inside ``torch.autocast`` (mixed precision), on real models.

Run: ``python benchmarks/check_autocast.py [--models gpt2_sdpa,llama,...] [--dtype bfloat16]
[--scaler | --pure | --chunk]``; prints one table (a few minutes on a quiet 2-core machine; not a
registered benchmark).

Each model of the real-model zoo (`tests/real_models.py`: dropout on, its rotating loss, AdamW) is profiled
inside ``torch.autocast("cpu", dtype)``, planned at 75 % of its eager peak (``auto``, exported, and
``sac``, applied; at the smallest budget a planner names when 75 % is refused), and both are built with
``verify=True`` *outside* any autocast region: memviz runs the step in the regions it was profiled in
(forward, loss and backward inside, the update outside: `memviz.hardware.accelerator.autocast_as`), so
the measured peak is checked against the plan and the gradients against eager's step under autocast,
whatever the caller's own autocast state.  Columns: the profile's eager peak (the update included), then
each plan's peak and its verified measured peak (a verified module never measures over its budget: the
build raises instead) and how its step compared with eager's.

``--scaler`` (with ``--dtype float16``): the float16 recipe, profiled with
``scaler=torch.amp.GradScaler("cpu")`` (`memviz.hardware.amp`): verify runs ``scale(loss).backward(); step;
update`` on a copy of it.  ``--pure``: the model and its floating inputs cast to `dtype`
(``model.to(dtype)``), AdamW on low-precision parameters, no
autocast.  ``--chunk``: long-sequence inference of the decoders (`tests.real_models.LANGUAGE_MODELS`, 512
tokens) profiled under autocast, an autochunk plan at 80 % of eager's peak exported and run *outside*
autocast: its measured activation peak against the plan's, its logits against eager's under autocast, and
``export(verify=True)``'s plan and measured peak.
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


def check(name: str, dtype: Any, how: str = "autocast") -> list[str]:
    """One table row: profile under autocast (`how` "scaler": with a GradScaler; "pure": the model cast to
    `dtype`, no autocast), an exported and an applied plan, each verified."""
    import contextlib

    import torch
    import torch.utils._pytree as pytree

    import memviz
    from solvers.result import InfeasibleBudget
    from tests.real_models import REAL, rotating_loss

    case = REAL[name]()
    loss = case.losses[rotating_loss(case, list(REAL).index(name))]
    if hasattr(getattr(case.model, "config", None), "use_cache"):
        case.model.config.use_cache = False  # as transformers' gradient checkpointing sets it
    if how == "pure":
        case.model.to(dtype)
        case.args, case.kwargs = pytree.tree_map(
            lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            (case.args, case.kwargs))
    scaler = torch.amp.GradScaler("cpu") if how == "scaler" else None
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=dtype) if how != "pure" else contextlib.nullcontext():
        prof = memviz.profile(case.model, case.args, case.kwargs, loss_fn=loss,
                              optimizer=torch.optim.AdamW, repeats=1, warmup=0, scaler=scaler)
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


def check_chunk(name: str, dtype: Any, tokens: int = 512) -> list[str]:
    """One ``--chunk`` row: inference profiled under autocast, autochunk at 80 %, run outside autocast."""
    import torch

    import memviz
    from memviz.profiling.tracker import StorageTracker, tensors_of
    from solvers.result import InfeasibleBudget
    from tests.real_models import REAL

    case = REAL[name]()
    model = case.model.eval()
    model.config.use_cache = False
    # its own storage: a slice of the zoo's longer input holds the whole (verify counts the storage, the
    # plan the input's bytes: Llama's plan at its minimum budget measured 4,096 B over, refused)
    ids = case.long[0][0][:, :tokens].clone()

    def measured(fn: Any) -> tuple[int, Any]:
        with torch.no_grad():
            tracker = StorageTracker(tensors_of(fn, (ids,)))
            with tracker:
                out = fn(ids)
        return tracker.peak_bytes - tracker.start_bytes, out.logits

    start = time.perf_counter()
    with torch.autocast("cpu", dtype=dtype):
        _, eager = measured(model)
        prof = memviz.profile(model, (ids,), mode="inference", repeats=1, warmup=0)
    try:
        try:
            plan = memviz.plan(prof, 0.8, strategy="autochunk", frontier=False)
        except InfeasibleBudget as refused:  # at the smallest budget the refusal names, said in the row
            if refused.minimum_bytes is None:
                raise
            plan = memviz.plan(prof, refused.minimum_bytes, strategy="autochunk", frontier=False)
        peak, logits = measured(memviz.export(plan))
        module = memviz.export(plan, verify=True, inputs=((ids,), {}))
    except Exception as exc:  # noqa: BLE001 - a row per model, whatever fails
        return [name, f"{type(exc).__name__}: {str(exc)[:160]}", "", "",
                f"{time.perf_counter() - start:.0f}"]
    activations = plan.peak_bytes - plan.baseline_graph.persistent_bytes()
    same = "equal" if torch.equal(logits, eager) else f"{float((logits - eager).abs().max()):.1e} off"
    return [name, f"{len(plan.chunks)} regions, {activations:,} / {peak:,} B "
            f"({peak / activations - 1:+.1%}), {logits.dtype}, {same}",
            f"{module.plan.peak_bytes:,} / {module.verified_peak_bytes:,} B, "
            f"{module.verified_equal.describe()}",
            f"{plan.budget_bytes:,} ({plan.budget_bytes / plan.baseline.peak_bytes:.0%})",
            f"{time.perf_counter() - start:.0f}"]


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help=f"default {','.join(DEFAULT)}; with --chunk the decoders")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--scaler", action="store_true", help="float16 with a GradScaler (pass --dtype float16)")
    how.add_argument("--pure", action="store_true", help="the model cast to --dtype, no autocast")
    how.add_argument("--chunk", action="store_true", help="autochunk inference under autocast")
    a = ap.parse_args()
    if a.scaler and a.dtype != "float16":
        ap.error("--scaler is the float16 recipe: pass --dtype float16")
    dtype = getattr(torch, a.dtype)
    if a.chunk:
        from tests.real_models import LANGUAGE_MODELS

        print("| model | run outside autocast: regions, planned / measured activations, logits vs eager "
              "| export(verify=True): plan / measured | budget | s |\n|---|---|---|---|---|")
        for name in (a.models or ",".join(LANGUAGE_MODELS)).split(","):
            print("| " + " | ".join(check_chunk(name, dtype)) + " |", flush=True)
        return
    print("| model | eager peak MiB | auto, exported: plan / measured MiB "
          "| sac, applied: plan / measured MiB | s |\n|---|---|---|---|---|")
    for name in (a.models or ",".join(DEFAULT)).split(","):
        how_ = "scaler" if a.scaler else "pure" if a.pure else "autocast"
        print("| " + " | ".join(check(name, dtype, how_)) + " |", flush=True)


if __name__ == "__main__":
    main()
