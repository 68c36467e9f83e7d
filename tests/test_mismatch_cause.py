"""An export that differs from eager because the graph took a LayerDrop draw as the profile's example drew
it is refused with that reason (`verify._cause`), not as a memviz fault."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memviz
from memviz.profiling.profile import ProfileWarning
from memviz.runtime.verify import MismatchError


class LayerDropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if torch.rand([]) >= 0.5:  # LayerDrop: run `b` or skip it, drawn at every call
            h = self.b(h)
        return h.sum()


def _runs_b(seed: int) -> bool:
    torch.manual_seed(seed)
    return bool(torch.rand([]) >= 0.5)


def test_an_export_specialised_on_another_draw_is_refused_naming_it():
    model, x = LayerDropped(), torch.randn(4, 8)
    torch.manual_seed(0)
    with pytest.warns(ProfileWarning, match="branches on tensor values"):
        prof = memviz.profile(model, (x,), measure=False)
    plan = memviz.plan(prof.with_costs("fake:v100"), None, strategy="none", frontier=False)
    other = next(s for s in range(1, 50) if _runs_b(s) != _runs_b(0))
    torch.manual_seed(other)  # eager's step draws the other decision
    with pytest.raises(MismatchError, match="branches and sizes on tensor values the profile's example took"):
        memviz.export(plan, verify=True)
