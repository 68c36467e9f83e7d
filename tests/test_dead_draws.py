"""A dropout whose output nothing reads still draws its mask in eager mode, so the captured graph keeps it
(HF CANINE's sequence classifier computes its final character encoder, dropout included, and reads only
the pooled deep encoder): without it, every later mask came from another offset of the generator."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import memviz
from memviz.profiling.capture import capture


class UnreadDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.a(x))
        self.drop(self.b(h))  # computed and dropped out, never read
        return self.drop(h).sum(-1)


def _example() -> tuple[UnreadDropout, torch.Tensor]:
    torch.manual_seed(0)
    return UnreadDropout().train(), torch.randn(4, 8)


def test_an_unread_dropout_draws_in_the_graph_as_in_eager():
    model, x = _example()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the draw-count warning
        _, cap = capture(model, (x,), loss_fn=lambda out: out.sum())
    assert cap.torch_draws is None


def test_the_exported_step_draws_eagers_masks():
    model, x = _example()
    prof = memviz.profile(model, (x,), loss_fn=lambda out: out.sum(), measure=False).with_costs("fake:v100")
    exported = memviz.export(memviz.plan(prof, None, strategy="none", frontier=False), verify=True)
    assert exported.verified_equal.equal
