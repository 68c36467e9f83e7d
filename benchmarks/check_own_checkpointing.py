"""Models that checkpoint their own activations, through profile, a sac plan and `memviz.apply`.

Run: ``python benchmarks/check_own_checkpointing.py [--models llama,timm_vit,densenet]``; prints one table
(a few minutes on a quiet 2-core machine; not a registered benchmark).

Each model is built with its library's own activation checkpointing on (transformers'
``gradient_checkpointing_enable``, timm's ``set_grad_checkpointing``, torchvision DenseNet's
``memory_efficient=True``), dropout on, a real loss and AdamW.  memviz profiles it without that
checkpointing (`memviz.profiling.own_checkpointing`) and measures the step as it runs today beside it
(`Profile.as_run_peak_bytes`); a sac plan at 50% of the eager peak (or at the smallest budget the refusal
names) is applied with ``verify=True``: the applied model runs the plan's regions alone (the library's
switch turned off), measured against the plan, its gradients against eager's.  Columns: where the model
checkpoints, the measured peak of one step (no optimizer) as it runs today and without its checkpointing,
then the plan's peak, the verified measured peak and whether the step equals eager's.  Last, the library's
switch is turned on again in the applied model, as a training stack does after ``memviz.apply`` (HF
Trainer calls ``activation_checkpointing_enable()`` at train start; timm's ``set_grad_checkpointing()``;
DenseNet's layers' ``memory_efficient = True`` set by hand): one step of the applied model (no optimizer)
measured before and after, and whether memviz said it turned the switch off again.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))


def llama() -> tuple[Any, tuple[Any, ...], dict[str, Any], Any]:
    import torch

    from tests.real_models import transformers  # after torchvision's schema shim

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172,
                                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      attention_dropout=0.1, use_cache=False)
    model = transformers.LlamaForCausalLM(config).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated name users still call
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 256, (4, 128))
    return model, (ids,), {"labels": ids}, lambda out: out.loss


def timm_vit() -> tuple[Any, tuple[Any, ...], dict[str, Any], Any]:
    import timm
    import torch

    import tests.real_models  # noqa: F401 - torchvision's op schemas before timm imports it

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, patch_size=8, depth=4,
                              num_classes=10, drop_rate=0.1).train()
    model.set_grad_checkpointing(True)
    y = torch.randint(0, 10, (32,))
    return model, (torch.randn(32, 3, 64, 64),), {}, lambda out: torch.nn.functional.cross_entropy(out, y)


def densenet() -> tuple[Any, tuple[Any, ...], dict[str, Any], Any]:
    import torch

    from tests.real_models import torchvision

    model = torchvision.models.densenet121(num_classes=10, memory_efficient=True, drop_rate=0.1).train()
    y = torch.randint(0, 10, (2,))
    return model, (torch.randn(2, 3, 64, 64),), {}, lambda out: torch.nn.functional.cross_entropy(out, y)


MODELS = {"llama": llama, "timm_vit": timm_vit, "densenet": densenet}


def switch_on(name: str, model: Any) -> None:
    """The library's checkpointing turned on again, as a training stack does after `memviz.apply`."""
    if name == "llama":
        model.activation_checkpointing_enable()  # what HF Trainer runs at train start
    elif name == "timm_vit":
        model.set_grad_checkpointing(True)
    else:
        for module in model.modules():
            if hasattr(module, "memory_efficient"):
                module.memory_efficient = True


def check(name: str) -> list[str]:
    """One table row."""
    import torch

    import memviz
    from solvers.result import InfeasibleBudget

    torch.manual_seed(0)
    model, args, kwargs, loss = MODELS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = memviz.profile(model, args, kwargs, loss_fn=loss, optimizer=torch.optim.AdamW, repeats=1,
                              warmup=0)
    own = prof.own_checkpointing
    cells = [name, f"{own[0]}{f' and {len(own) - 1} more' if len(own) > 1 else ''}" if own else "none",
             f"{(prof.as_run_peak_bytes or 0) / 2**20:.2f}", f"{prof.measured_peak_bytes / 2**20:.2f}"]
    try:
        try:
            plan = memviz.plan(prof, 0.5, strategy="sac")
        except InfeasibleBudget as refused:
            plan = memviz.plan(prof, refused.minimum_bytes, strategy="sac")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            applied = memviz.apply(plan, model, verify=True, inputs=(args, kwargs), loss_fn=loss)
    except Exception as exc:  # noqa: BLE001 - a row per model, whatever fails
        return [*cells, f"{type(exc).__name__}: {str(exc)[:120]}", "", "", "", ""]
    from memviz.profiling.profile import measure_eager_peak
    from memviz.runtime.apply import ApplyWarning

    alone = measure_eager_peak(applied, args, kwargs, loss_fn=loss)
    switch_on(name, applied)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = measure_eager_peak(applied, args, kwargs, loss_fn=loss)
    said = any(issubclass(w.category, ApplyWarning) and "turned on after" in str(w.message) for w in caught)
    return [*cells, f"{applied.plan.peak_bytes / 2**20:.3f}", f"{applied.verified_peak_bytes / 2**20:.3f}",
            str(applied.verified_equal.equal), f"{alone / 2**20:.3f} / {again / 2**20:.3f}",
            "turned off again" if said else "not said"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args(argv)
    print("| model | checkpoints itself in | as run MiB | without it MiB | sac plan MiB "
          "| applied, measured MiB | equal to eager | applied step MiB, switch on again: before / after "
          "| memviz |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        print("| " + " | ".join(check(name)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
