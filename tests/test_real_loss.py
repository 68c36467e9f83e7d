"""The user's loss in the memory model: what it saves for backward and its transient peaks are measured
(`memviz.profiling.capture.loss_memory`), so the eager baseline and every plan include them.

The model is an LM whose cross-entropy over a 4096-token vocabulary (and a regression head's MSE) is a
large part of the step, as in LM training."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memviz
from memviz.profiling.tracker import measure_peak, tensors_of

V, D, B, S, L = 4096, 32, 2, 64, 8


class TinyLM(nn.Module):
    """Embedding, `L` wide MLP blocks with dropout, an LM head (or a regression head of `V` outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.up = nn.ModuleList(nn.Linear(D, 16 * D) for _ in range(L))
        self.down = nn.ModuleList(nn.Linear(16 * D, D) for _ in range(L))
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for up, down in zip(self.up, self.down, strict=True):
            a = up(h)
            h = h + down(self.drop(F.gelu(a) * torch.sigmoid(a)))
        return self.head(h)


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, S), generator=g)
    labels = ids.clone()
    labels[:, : S // 4] = -100  # a masked prompt
    target = torch.randn(B, S, V, generator=g)
    return ids, labels, target


IDS, LABELS, TARGET = _data()
LOSSES: dict[str, Callable[[Any], torch.Tensor]] = {
    "ce": lambda out: F.cross_entropy(out.reshape(-1, V), LABELS.reshape(-1), ignore_index=-100),
    # next-token targets: the shifted logits are a copy, freed inside the loss (its forward transient)
    "ce_smooth": lambda out: F.cross_entropy(out[:, :-1].reshape(-1, V), LABELS[:, 1:].reshape(-1),
                                             ignore_index=-100, label_smoothing=0.1),
    "mse": lambda out: F.mse_loss(out, TARGET),
}
# what memviz offers instead of F.cross_entropy: the same numbers without the logits-sized log-probabilities
PLANNED_LOSSES = {**LOSSES, "chunked_smooth": lambda out: memviz.losses.chunked_cross_entropy(
    out[:, :-1], LABELS[:, 1:], ignore_index=-100, label_smoothing=0.1, chunks=8)}
ALL_LOSSES = {**PLANNED_LOSSES, "chunked": lambda out: memviz.losses.chunked_cross_entropy(
    out, LABELS, ignore_index=-100, chunks=8)}


def _model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM().train()


@functools.cache
def _profile(loss: str) -> Any:
    """One profile per loss for the whole module (profiling is most of these tests' time)."""
    return memviz.profile(_model(), (IDS,), mode="train", loss_fn=ALL_LOSSES[loss], repeats=1, warmup=0)


@pytest.mark.parametrize("loss", list(LOSSES))
def test_loss_memory_in_graph(loss: str) -> None:
    """The loss's saved tensors are a data node alive from the loss to its backward; what the loss holds
    is read from the device's kernels."""
    prof = _profile(loss)
    graph, cap = prof.graph, prof.captured
    fwd, bwd = graph.computes[cap.loss_compute], graph.computes[cap.loss_backward_compute]
    saved = graph.datas[fwd.outputs[1]]
    assert saved.name == "loss_saved" and saved.id in bwd.inputs
    logits = B * S * V * 4
    if loss == "mse":
        # MSE saves the outputs and the user's target, both alive anyway; CPU mse_loss returns its mean
        # as a view of a buffer of the outputs' size, which the loss tensor holds to the end of the step
        assert saved.bytes == 0 and graph.datas[fwd.outputs[0]].bytes == logits
        return
    # cross-entropy keeps its log-probabilities: one logits-sized tensor, plus a few small ones (the
    # labels, counted once the loss views them, as the measured eager step counts them)
    expected = logits * (S - 1) // S if loss == "ce_smooth" else logits
    assert expected <= saved.bytes <= expected + 4096, saved.bytes
    # its backward builds the gradient of the log-probabilities before the logits'
    assert bwd.temp_bytes >= 0.9 * expected, bwd.temp_bytes


@pytest.mark.parametrize("loss", list(PLANNED_LOSSES))
def test_loss_dominated_plan_matches_measured(loss: str) -> None:
    """Predicted eager peak == measured; a plan at 50% of it measures what it says, under budget, with
    the eager gradients."""
    loss_fn = PLANNED_LOSSES[loss]
    prof = _profile(loss)
    assert prof.measured_peak_bytes is not None
    assert abs(prof.baseline.peak_bytes - prof.measured_peak_bytes) <= 0.02 * prof.measured_peak_bytes
    plan = memviz.plan(prof, 0.5, strategy="rockmate")
    original, exported = _model(), memviz.export(plan, model=_model())

    def step(model: nn.Module) -> torch.Tensor:
        torch.manual_seed(1)
        loss_value = loss_fn(model(IDS))
        loss_value.backward()
        return loss_value

    expected = step(original)
    peak, got = measure_peak(lambda: step(exported), tensors_of(exported, IDS))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for (name, pa), pb in zip(original.named_parameters(), exported.parameters(), strict=True):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-6, atol=1e-7, msg=name)
    assert plan.budget_bytes is not None and peak <= plan.budget_bytes, (peak, plan.budget_bytes)
    assert abs(peak - plan.peak_bytes) <= 0.01 * plan.peak_bytes, (peak, plan.peak_bytes)


# --- memviz.losses.chunked_cross_entropy ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_cross_entropy_is_cross_entropy(dtype: torch.dtype, smoothing: float, reduction: str) -> None:
    """Bit for bit F.cross_entropy's value and gradient, for whole and shifted (non-contiguous) logits and
    more chunks than rows of a slice."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 300, dtype=dtype, generator=g).requires_grad_()
    t = torch.randint(0, 300, (3, 17), generator=g)
    t[:, :4] = -100
    t[1, 9] = -100
    for xs, ts, chunks in ((x, t, 5), (x[:, :-1], t[:, 1:], 8), (x[0], t[0], 40)):
        ref = F.cross_entropy(xs.reshape(-1, 300), ts.reshape(-1), ignore_index=-100,
                              label_smoothing=smoothing, reduction=reduction)
        got = memviz.losses.chunked_cross_entropy(xs, ts, ignore_index=-100, label_smoothing=smoothing,
                                                  reduction=reduction, chunks=chunks)
        weights = torch.randn(ref.shape, dtype=dtype, generator=g)
        (expected,) = torch.autograd.grad((ref * weights).sum(), x)
        (grad,) = torch.autograd.grad((got.reshape(ref.shape) * weights).sum(), x)
        assert torch.equal(got.reshape(ref.shape), ref)
        assert torch.equal(grad, expected)


def test_chunked_cross_entropy_rejects_bad_arguments() -> None:
    x, t = torch.randn(4, 10), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="reduction"):
        memviz.losses.chunked_cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="agree"):
        memviz.losses.chunked_cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="chunks"):
        memviz.losses.chunked_cross_entropy(x, t, chunks=0)


def test_chunked_cross_entropy_cuts_the_loss_memory() -> None:
    """What the loss keeps for backward drops from the logits' size to a few bytes per row, the measured
    eager peak with it, and the plan is exact on it.  The logits themselves stay (saved for the backward,
    which recomputes each slice from them) where cross-entropy lets them go and keeps its
    log-probabilities: the peak, in the loss's backward, drops by one logits-sized transient less the
    backward's slices (three of the eight at once)."""
    full, small = _profile("ce"), _profile("chunked")
    saved = [p.graph.datas[p.graph.computes[p.captured.loss_compute].outputs[1]].bytes for p in (full, small)]
    logits = B * S * V * 4
    assert saved[0] >= logits and saved[1] <= 8 * B * S, saved
    assert small.measured_peak_bytes is not None and full.measured_peak_bytes is not None
    assert small.measured_peak_bytes <= full.measured_peak_bytes - logits // 2, (small.measured_peak_bytes,
                                                                                  full.measured_peak_bytes)
    assert small.baseline.peak_bytes == small.measured_peak_bytes


# --- the eager baseline of real models --------------------------------------------------------------------
@pytest.mark.parametrize(("name", "loss"), [("bert", "own"), ("bert", "ce"), ("timm_vit", "ce")])
def test_real_model_eager_peak_exact(name: str, loss: str) -> None:
    """BERT's SDPA attention dropout runs on CPU eager as ``at::dropout`` (a float noise tensor saved for
    backward, traced as `cpu_dropout`); with a user loss, the model's own ``labels=`` loss keeps its
    log-probabilities in the output's autograd graph to the end of the step; timm's drop path draws its
    mask into ``x.new_empty(...)``, which carries no gradient (so ``x * mask`` saves the mask only)."""
    from tests.real_models import REAL

    case = REAL[name]()
    prof = memviz.profile(case.model, case.args, case.kwargs, mode="train", loss_fn=case.losses[loss],
                          repeats=1, warmup=0)
    assert prof.measured_peak_bytes is not None
    assert abs(prof.baseline.peak_bytes - prof.measured_peak_bytes) <= 0.001 * prof.measured_peak_bytes, (
        prof.baseline.peak_bytes, prof.measured_peak_bytes)
    if name == "bert":
        attention = [c for c in prof.graph.computes if "cpu_dropout" in c.op
                     and len(prof.graph.datas[c.outputs[1]].shape) == 4]
        assert len(attention) == 2  # one per layer: (batch, heads, seq, seq) noise
