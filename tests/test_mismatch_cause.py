"""An export that differs from eager because the graph took a branch on a tensor's value as the profile's
example took it is refused with that reason (`verify._cause`), not as a memviz fault.  (A branch on a
random draw, LayerDrop's, is refused before any step: `tests/test_layerdrop.py`.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memviz
from memviz.profiling.profile import ProfileWarning
from memviz.runtime.verify import MismatchError


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if x.sum() > 0:  # decided by the input's values, at every call
            h = self.b(h)
        return h.sum()


def test_an_export_specialised_on_another_value_is_refused_naming_it():
    model, x = Branchy(), torch.rand(4, 8) + 0.5
    with pytest.warns(ProfileWarning, match="branches on tensor values"):
        prof = memviz.profile(model, (x,), measure=False)
    assert not prof.captured.drawn  # no random draw: read as eager reads it
    plan = memviz.plan(prof.with_costs("fake:v100"), None, strategy="none", frontier=False)
    # the verifying step runs on zeros of the input's shape: eager skips `b` there
    with pytest.raises(MismatchError, match="branches and sizes on tensor values the profile's example took"):
        memviz.export(plan, verify=True)
