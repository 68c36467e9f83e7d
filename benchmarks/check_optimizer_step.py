"""Device check (not a registered benchmark): the optimizer step predicted as the user's optimizer runs it.

A stack of square Linear layers on a small batch, so the training step's peak is in the optimizer's
update; for each optimizer (AdamW by default -- foreach on CUDA, the for-loop on the CPU --, AdamW with
foreach / fused / the for-loop asked for, SGD with momentum) it prints the update kind memviz models
(`memviz.profiling.profile.update_kind`), the predicted eager peak (the profile's baseline, whose peak
step is the update) and the measured peak of the second real step (the first creates the state).

    python benchmarks/check_optimizer_step.py            # CUDA when available, else the CPU

On CUDA the prediction includes the cuBLAS workspaces the profile measured (a `runtime` node); the
measurement counts every allocated byte on the device.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memviz  # noqa: E402
from memviz.profiling.profile import update_kind  # noqa: E402
from memviz.profiling.tracker import measure_peak, tensors_of  # noqa: E402
from solvers import Phase  # noqa: E402


def _model(device: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    width = 2048 if device == "cuda" else 512
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(8)]).to(device)
    return model, (torch.randn(4, width, device=device),)


def measured_step(model: nn.Module, args: tuple[torch.Tensor, ...], opt: torch.optim.Optimizer,
                  device: str = "cpu") -> int:
    """Peak bytes of the second real training step (the first creates the optimizer's state, which the
    plan holds from the start)."""
    def step() -> None:
        model(*args).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    peak = 0
    for _ in range(2):
        peak, _ = measure_peak(step, tensors_of(model, opt, args), device)
    return peak


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    configs = {
        "AdamW (default)": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
        "AdamW foreach=True": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
        "AdamW fused=True": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
        "AdamW foreach=False": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False),
        "SGD momentum (default)": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                                                            weight_decay=0.1),
    }
    print(f"device {device}, torch {torch.__version__}")
    print(f"{'optimizer':<24} {'kind':<9} {'predicted':>12} {'measured':>12} {'diff':>10}  peak step")
    for name, make in configs.items():
        model, args = _model(device)
        opt = make(model.parameters())
        prof = memviz.profile(model, args, optimizer=opt, repeats=1, warmup=0)
        kind = update_kind(opt, prof.device)
        step = prof.baseline_schedule[prof.baseline.peak_step]
        where = prof.graph.computes[step.node].phase.value if step.op == "compute" else "free"
        measured = measured_step(model, args, opt, device)
        predicted = prof.baseline.peak_bytes
        print(f"{name:<24} {kind:<9} {predicted:>12,} {measured:>12,} {predicted - measured:>+10,}  {where}"
              + ("" if where == Phase.OPTIMIZER.value else " (not the update)"))
        del model, opt, prof
        gc.collect()  # the profile's reference cycles hold the model: on CUDA every allocated byte counts
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
