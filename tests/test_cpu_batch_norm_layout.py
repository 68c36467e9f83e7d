"""Batch norm over a transposed activation (PatchTST's ``BatchNorm1d`` on ``hidden.transpose(1, 2)``): the
CPU kernel returns a contiguous result where torch's fake kernel keeps the input's strides, and the
captured graph must be laid out as the kernel runs (`capture.cpu_batch_norm_layouts_in_trace`)."""

from __future__ import annotations

import torch
from torch import nn

import memviz


class TransposedNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.norm = nn.BatchNorm1d(16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.a(x).transpose(1, 2)).transpose(1, 2)
        return self.b(h)  # linear's flattening view of the transposed-back result


def test_a_transposed_batch_norm_exports_as_eager_runs_it():
    torch.manual_seed(0)
    model, x = TransposedNorm().train(), torch.randn(6, 8, 16)
    prof = memviz.profile(model, (x,), loss_fn=lambda out: out.pow(2).mean(), measure=False)
    plan = memviz.plan(prof.with_costs("fake:v100"), None, strategy="none", frontier=False)
    exported = memviz.export(plan, verify=True)
    assert exported.verified_equal.equal
    assert exported.verified_peak_bytes == plan.peak_bytes
