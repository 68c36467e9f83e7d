"""Gradient accumulation (``memviz.profile(grads="accumulate")``): a loop that keeps every ``.grad`` from the
step's start (micro-batches after the first, or ``zero_grad(set_to_none=False)``) holds the gradients
through the forward, and backward adds into them; a plan that assumes ``.grad`` None there measures over
itself in such a loop."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memviz
from solvers import DataKind
from solvers.result import InfeasibleBudget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from check_accumulation import accumulation_peak  # noqa: E402  (the benchmark measures it the same way)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.relu(self.fc1(x))))


class TinyLM(nn.Module):
    """Embedding tied to the head (its gradient summed from two contributions), dropout, three blocks, and
    a layer the forward never calls (no gradient: its .grad stays None in every micro-batch)."""

    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(3)])
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.spare = nn.Linear(width, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.emb(ids)))


def _case() -> tuple[nn.Module, tuple[torch.Tensor, ...], Any]:
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    labels = torch.randint(0, 64, (4, 16))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, 64), labels.reshape(-1))

    return TinyLM().train(), (ids,), loss


def _profile(grads: str, optimizer: Any = torch.optim.AdamW) -> Any:
    model, args, loss = _case()
    return memviz.profile(model, args, loss_fn=loss, optimizer=optimizer, repeats=1, warmup=0,
                          grads=grads), args, loss


def _grad_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("spare"))


def _sac(prof: Any) -> Any:
    try:
        return memviz.plan(prof, 0.8, strategy="sac")
    except InfeasibleBudget as refused:
        return memviz.plan(prof, refused.minimum_bytes, strategy="sac")


def test_gradients_are_held_from_the_start_and_eager_peak_is_predicted() -> None:
    """Every gradient is a data node alive from the start (the tied weight's once, the spare layer's none),
    counted by `Graph.held_bytes`; the eager peak predicted is the one measured with .grad present."""
    acc, _, _ = _profile("accumulate")
    default, _, _ = _profile("none")
    grads = _grad_bytes(acc.model)
    held = [d for d in acc.graph.datas if d.producer is None and d.kind is DataKind.PARAMETER_GRADIENT]
    assert sum(d.bytes for d in held) == grads
    assert acc.graph.held_bytes() - default.graph.held_bytes() == grads
    assert acc.graph.meta["grads"] == "accumulate" and "grads" not in default.graph.meta
    assert acc.baseline.peak_bytes > default.baseline.peak_bytes
    step, _, _ = _profile("accumulate", optimizer=None)  # the measured eager step runs no optimizer
    assert abs(step.baseline.peak_bytes - step.measured_peak_bytes) <= 0.02 * step.measured_peak_bytes, (
        step.baseline.peak_bytes, step.measured_peak_bytes)


def test_sac_plan_holds_in_an_accumulation_loop() -> None:
    """The applied sac plan of an accumulating profile measures at or under its plan over 4 micro-batches
    and AdamW's step; the default profile's plan measured over itself in the same loop (the trust bug)."""
    for grads, within in (("none", False), ("accumulate", True)):
        prof, args, loss = _profile(grads)
        plan = _sac(prof)
        peak = accumulation_peak(memviz.apply(plan, prof.model), args, {}, loss, 4)
        assert (peak <= plan.peak_bytes) is within, (grads, peak, plan.peak_bytes)


def test_apply_verify_runs_the_accumulating_step(tmp_path: Path) -> None:
    """apply(verify=True) measures the step with .grad held (the measured peak counts them) and compares
    accumulated gradients with eager's; the plan file carries the setting, and a loaded plan verifies
    the same."""
    prof, args, loss = _profile("accumulate")
    plan = _sac(prof)
    applied = memviz.apply(plan, prof.model, verify=True, inputs=(args, {}), loss_fn=loss)
    assert applied.verified_equal.equal is True
    grads = _grad_bytes(prof.model)
    assert plan.peak_bytes - grads < applied.verified_peak_bytes <= plan.peak_bytes
    plan.save(tmp_path / "plan.json")
    loaded = memviz.load_plan(tmp_path / "plan.json")
    assert loaded.graph.meta["grads"] == "accumulate"
    again = memviz.apply(loaded, prof.model, verify=True, inputs=(args, {}), loss_fn=loss)
    assert again.verified_peak_bytes == applied.verified_peak_bytes


def test_export_refuses_and_arguments_are_checked() -> None:
    prof, _, _ = _profile("accumulate")
    with pytest.raises(ValueError, match="accumulates into .grad"):
        memviz.export(memviz.plan(prof, None, strategy="none"))
    model, args, loss = _case()
    with pytest.raises(ValueError, match="grads must be one of"):
        memviz.profile(model, args, grads="zero")
    with pytest.raises(ValueError, match="only makes sense with mode='train'"):
        memviz.profile(model, args, mode="inference", grads="accumulate")
