"""A forward that writes a NumPy-drawn mask over its activations and branches on a tensor value, as HF's
wav2vec2 / HuBERT / WavLM CTC models do in training (SpecAugment's ``hidden[mask] = masked_spec_embed``
with the mask from ``np.random``, and the label range check): the capture specialises the branch,
checks the graph against eager, and sizes the masked write's backward by the positions the graph's own
mask selects."""

from __future__ import annotations

import numpy
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memviz
from memviz.profiling.capture import capture
from memviz.profiling.profile import ProfileWarning
from memviz.runtime.verify import MismatchError


class SpecAugmented(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.masked_embed = nn.Parameter(torch.randn(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if labels.max() >= 4:
            raise ValueError("labels past the vocabulary")
        h = self.proj(x)
        mask = torch.from_numpy(numpy.random.rand(*h.shape[:2]) < 0.5)
        h[mask] = self.masked_embed
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def _example(seed: int = 0) -> tuple[SpecAugmented, tuple[torch.Tensor, torch.Tensor]]:
    numpy.random.seed(seed)
    torch.manual_seed(0)
    return SpecAugmented(), (torch.randn(2, 16, 8), torch.randint(0, 4, (2, 16)))


def test_a_numpy_mask_is_traced_as_eager_draws_it_and_warned_about():
    model, args = _example()
    with pytest.warns(ProfileWarning, match=r"outside torch \(numpy.random\)"):
        prof = memviz.profile(model, args, loss_fn=lambda out: out, measure=False)
    assert prof.baseline.valid


@pytest.mark.parametrize("seed", [1, 2])
def test_the_masked_writes_backward_selects_the_graphs_own_mask(seed: int):
    model, args = _example(seed)
    _, cap = capture(model, args, loss_fn=lambda out: out)
    assert cap.host_random == ["numpy.random"]
    (mask,) = [getattr(cap.gm, n.target) for n in cap.gm.graph.nodes
               if n.op == "get_attr" and n.meta["val"].dtype == torch.bool]
    (selected,) = [n for n in cap.gm.graph.nodes if n.target is torch.ops.aten.index.Tensor]
    # eager's draw of the mask and the trace's are the same draw: the shape the backward was traced with is
    # the number of positions the graph's mask selects at every step
    assert selected.meta["val"].shape[0] == int(mask.sum())


def test_apply_verifies_against_eager_drawing_the_same_host_numbers_and_leaves_them():
    model, args = _example(1)
    with pytest.warns(ProfileWarning, match="numpy.random"):
        prof = memviz.profile(model, args, loss_fn=lambda out: out, measure=False)
    plan = memviz.plan(prof.with_costs("fake:v100"), None, strategy="sac", frontier=False)
    before = numpy.random.get_state(legacy=False)
    applied = memviz.apply(plan, model, verify=True, inputs=(args, {}))
    # the user's step and the applied one each drew their NumPy mask from the same state
    assert applied.verified_equal.equal
    after = numpy.random.get_state(legacy=False)
    assert all(numpy.array_equal(before["state"][k], after["state"][k]) for k in before["state"])


def test_export_refuses_naming_the_host_draws_not_a_memviz_fault():
    model, args = _example(1)
    with pytest.warns(ProfileWarning, match="numpy.random"):
        prof = memviz.profile(model, args, loss_fn=lambda out: out, measure=False)
    plan = memviz.plan(prof.with_costs("fake:v100"), None, strategy="none", frontier=False)
    with pytest.raises(MismatchError, match=r"outside torch \(numpy.random\).*memviz.apply"):
        memviz.export(plan, verify=True, inputs=(args, {}))
