"""Gradient accumulation: the measured peak of a micro-batch loop against its plan, with and without
``memviz.profile(..., grads="accumulate")``.

Run: ``python benchmarks/check_accumulation.py [--models gpt2,llama,tv_resnet] [--micro 4]``; prints
one table (a few minutes on a quiet 2-core machine; not a registered benchmark).

GPT-2, Llama and a torchvision ResNet (`cases`: the zoo's random-init configs, dropout on, a user
cross-entropy, AdamW, on 8 x 128 tokens / 32 images of 64 px) are each profiled
twice, as before (``grads="none"``: every ``.grad`` is None when the step starts, ``zero_grad()``'s
default) and with ``grads="accumulate"`` (every ``.grad`` alive from the step's start, backward adding into
it: micro-batch accumulation, or ``zero_grad(set_to_none=False)``).  Each profile is planned at 75 % of
its eager peak with ``strategy="sac"`` and applied (``memviz.apply``, no verify: the loop below is the
check), and with ``strategy="auto"``, applied (converted to checkpointing, `memviz.plans.sac.to_sac`,
whose own peak is the plan compared) and exported (``memviz.export``: with ``grads="accumulate"`` its step
adds each new gradient into ``.grad`` where the plan does, `memviz.runtime.export.add_into_grad`).
Then the user's loop runs on it: one round to create AdamW's state, then a measured round of `--micro`
micro-batches (forward, ``loss / k``, backward) and one ``opt.step(); opt.zero_grad()``, its peak taken
by the CPU live-storage tracker the verify step uses
(`memviz.profiling.tracker.measure_peak`, parameters, optimizer state and inputs counted from the start;
the labels a loss closes over counted from the start and taken off, as `memviz.runtime.verify.loss_only`).
Columns: each plan's predicted peak and the loop's measured peak (MiB), and the excess over the plan; the
sac plan's ``apply(verify=True)`` step and the auto plan's ``export(verify=True)`` step (measured / plan,
and its comparison with eager's step).
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

DEFAULT = ("gpt2", "llama", "tv_resnet")
FRACTION = 0.75


def cases() -> dict[str, Any]:
    """The zoo's GPT-2, Llama and torchvision ResNet configs (`tests/real_models.py`) on larger inputs than
    the zoo's: at its 2 x 16 tokens the parameters, gradients and AdamW state dwarf the activations and
    every plan is the eager order."""
    import transformers

    from tests.real_models import VOCAB, _causal_lm, _image_classifier

    def resnet() -> Any:
        import torch
        from torchvision.models.resnet import BasicBlock, ResNet

        torch.manual_seed(0)
        return _image_classifier(ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10), 64, 10, "torchvision",
                                 own=False, batch=32)

    return {
        "gpt2": lambda: _causal_lm(transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=4096, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.1,
            embd_pdrop=0.1, attn_pdrop=0.1), "sdpa", seq=128, batch=8),
        "llama": lambda: _causal_lm(transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            attention_dropout=0.1), seq=128, batch=8),
        "tv_resnet": resnet,
    }


def accumulation_peak(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], loss_fn: Any,
                      micro: int) -> int:
    """Peak bytes of one accumulation round of `model` (`micro` micro-batches, then AdamW's step and
    ``zero_grad()``), after a first round that creates the optimizer's state."""
    import torch

    from memviz.profiling.tracker import measure_peak, tensors_of
    from memviz.runtime.verify import loss_only

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])

    def round_() -> None:
        for _ in range(micro):
            loss = loss_fn(model(*args, **kwargs)) / micro
            loss.backward()
            del loss
        opt.step()
        opt.zero_grad()

    round_()
    # the labels the loss closes over are counted from the start and taken off, as the verify step does
    # (`memviz.runtime.verify.loss_only`: the plan holds the labels the model gets, not the loss's copy)
    held = tensors_of(model, opt, (args, kwargs))
    loss_held, outside = loss_only(loss_fn, held, torch.device("cpu"))
    return measure_peak(round_, held + loss_held)[0] - outside


def check(name: str, grads: str, micro: int) -> list[str]:
    """One table row: `name` profiled with `grads`, a sac plan applied and an auto plan exported, each
    measured in the accumulation loop."""
    import torch

    import memviz
    from memviz.plans.sac import to_sac
    from solvers.result import InfeasibleBudget

    case = cases()[name]()
    loss = case.losses["ce"]
    if hasattr(getattr(case.model, "config", None), "use_cache"):
        case.model.config.use_cache = False  # as transformers' gradient checkpointing sets it
    start = time.perf_counter()
    kw = {} if grads == "none" else {"grads": grads}
    prof = memviz.profile(case.model, case.args, case.kwargs, loss_fn=loss, optimizer=torch.optim.AdamW,
                          repeats=1, warmup=0, **kw)
    cells = [name, grads, f"{prof.baseline.peak_bytes / 2**20:.3f}"]

    def planned(strategy: str) -> Any:
        try:
            return memviz.plan(prof, FRACTION, strategy=strategy)
        except InfeasibleBudget as refused:
            return memviz.plan(prof, refused.minimum_bytes, strategy=strategy)

    def measured(strategy: str, build: Any) -> str:
        try:
            plan, module = build(planned(strategy))
            peak = accumulation_peak(module, case.args, case.kwargs, loss, micro)
        except Exception as exc:  # noqa: BLE001 - a row per model, whatever fails
            return f"{type(exc).__name__}: {str(exc)[:60]}"
        over = peak - plan.peak_bytes
        return (f"{plan.peak_bytes / 2**20:.3f} / {peak / 2**20:.3f} "
                f"({'+' if over > 0 else ''}{over / 2**10:.1f} KiB, {over / plan.peak_bytes:+.1%})")

    def applied(plan: Any) -> tuple[Any, Any]:
        run = plan if plan.strategy == "sac" else to_sac(plan)  # what apply runs, with its own peak
        return run, memviz.apply(run, case.model)

    cells.append(measured("sac", applied))
    try:  # the verify step: the accumulating step for an accumulating plan, compared with eager's
        module = memviz.apply(planned("sac"), case.model, verify=True, inputs=(case.args, case.kwargs),
                              loss_fn=loss)
        cells.append(f"{module.verified_peak_bytes / 2**20:.3f} / {module.plan.peak_bytes / 2**20:.3f}, "
                     + ("gradients equal to eager's" if module.verified_equal.equal
                        else module.verified_equal.describe()))
    except Exception as exc:  # noqa: BLE001 - a row per model, whatever fails
        cells.append(f"{type(exc).__name__}: {str(exc)[:60]}")
    cells.append(measured("auto", applied))
    cells.append(measured("auto", lambda plan: (plan, memviz.export(plan))))
    try:  # the exported plan's own verify step, as the sac plan's above
        module = memviz.export(planned("auto"), verify=True, inputs=(case.args, case.kwargs), loss_fn=loss)
        cells.append(f"{module.verified_peak_bytes / 2**20:.3f} / {module.plan.peak_bytes / 2**20:.3f}, "
                     + ("gradients equal to eager's" if module.verified_equal.equal
                        else module.verified_equal.describe()))
    except Exception as exc:  # noqa: BLE001 - a row per model, whatever fails
        cells.append(f"{type(exc).__name__}: {str(exc)[:60]}")
    cells.append(f"{time.perf_counter() - start:.0f}")
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--grads", default="none,accumulate", help="profile settings to compare")
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per optimizer step")
    a = ap.parse_args()
    print(f"| model | grads | eager peak MiB | sac, applied: plan / {a.micro} micro-batches MiB (over) "
          "| sac, apply(verify=True): measured / plan MiB | auto, applied (as sac) | auto, exported "
          "| auto, export(verify=True): measured / plan MiB | s |\n|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        for grads in a.grads.split(","):
            print("| " + " | ".join(check(name, grads, a.micro)) + " |", flush=True)


if __name__ == "__main__":
    main()
