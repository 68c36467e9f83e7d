"""`memviz.apply`'s recomputation puts back the buffers a region's forward writes, and copies no other:
HF Swin's relative position indices (read-only buffers) were copied at each recomputation, 4 KiB no plan
holds."""

from __future__ import annotations

import torch
from torch import nn

import memviz


class _Block(nn.Module):
    def __init__(self, dim: int = 32, window: int = 16) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(2 * window, dim))
        # read by an index on every call, never written (Swin's ``relative_position_index``)
        self.register_buffer("index", torch.arange(window * window) % (2 * window), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))  # written by every call
        self.fc = nn.Linear(dim, dim)
        self.window = window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        bias = self.table[self.index].view(self.window, self.window, -1).sum(1)
        return x + torch.relu(self.fc(x) + bias)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_recomputation_copies_only_the_buffers_its_forward_writes() -> None:
    torch.manual_seed(0)
    model = _Model().train()
    x = torch.randn(8, 16, 32)
    prof = memviz.profile(model, (x,), optimizer=torch.optim.AdamW, repeats=1, warmup=0)
    full = memviz.plan(prof, prof.baseline.peak_bytes, strategy="sac", frontier=False)
    plan = memviz.plan(prof, min(full.peak_bytes - 1, int(0.9 * prof.baseline.peak_bytes)), strategy="sac",
                       frontier=False)
    assert plan.recomputations > 0
    applied = memviz.apply(plan, model, verify=True, inputs=((x,), {}))
    assert applied.verified_peak_bytes == plan.peak_bytes
    # the written counter is still put back: one step moves it once per block
    before = [int(b.calls) for b in model.blocks]
    applied(x).sum().backward()
    assert [int(b.calls) for b in applied.blocks] == [n + 1 for n in before]
