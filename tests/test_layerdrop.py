"""LayerDrop (Fan et al., ICLR 2020; HF wav2vec2 / HuBERT / WavLM's default ``layerdrop=0.1``): a layer is
skipped when its ``torch.rand([])`` falls under the probability, so which layers run changes at every step.
The capture takes every draw at its top (`memviz.profiling.capture.draws_at_their_top`): the graph and its
plans are the step in which no layer is skipped, and `memviz.apply`, running the model's own LayerDrop,
measures at or under its plan in every step whatever the draws; `memviz.export` (one fixed graph) refuses.
"""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import numpy
import pytest
import torch
from torch import nn

import memviz
from memviz.profiling.tracker import measure_peak, tensors_of
from tests.test_apply import sac_plan
from tests.test_real_models import _step
from tests.test_zoo import _assert_same, _assert_tree_same, _fresh


class LayerDropNet(nn.Module):
    """Four residual MLP blocks; in training each is skipped when its draw falls under `layerdrop`, as HF's
    encoders do (``dropout_probability = torch.rand([])``)."""

    def __init__(self, width: int = 32, depth: int = 4, layerdrop: float = 0.5) -> None:
        super().__init__()
        self.layerdrop = layerdrop
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            dropout_probability = torch.rand([])
            if self.training and dropout_probability < self.layerdrop:
                continue
            x = x + layer(x)
        return x


def _square(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def _layers_run(model: nn.Module, layers: nn.ModuleList, args: tuple[Any, ...], kwargs: dict[str, Any],
                seed: int) -> list[int]:
    """Which of `layers` one training forward of `model` runs from `seed` (the test's premise)."""
    ran: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda *_, i=i: ran.append(i)) for i, m in enumerate(layers)]
    try:
        torch.manual_seed(seed)
        numpy.random.seed(seed)
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return ran


def _trains_within_plan(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], loss_fn: Any,
                        plan: Any, seeds: list[int]) -> list[int]:
    """`memviz.apply(plan, model, verify=True)` against an eager copy over one AdamW step per seed (each
    seed's own LayerDrop draws): outputs and every gradient equal, each step's measured peak (forward,
    loss, backward, AdamW step) at or under the plan the applied model runs.  Returns the peaks."""
    original = copy.deepcopy(model)
    applied = memviz.apply(plan, model, verify=True, inputs=(args, kwargs))
    ran = applied.plan
    assert applied.verified_peak_bytes <= ran.peak_bytes, (applied.verified_peak_bytes, ran.peak_bytes)
    opt_a = torch.optim.AdamW(original.parameters())
    opt_b = torch.optim.AdamW(applied.parameters())
    peaks = []
    for seed in seeds:
        in_a, in_b = _fresh((args, kwargs)), _fresh((args, kwargs))
        out_a = _step(original, loss_fn, opt_a, in_a, seed)
        peak, out_b = measure_peak(functools.partial(_step, applied, loss_fn, opt_b, in_b, seed),
                                   tensors_of(applied, opt_b, in_b))
        peaks.append(peak)
        assert peak <= ran.peak_bytes, (f"seed {seed}'s step measured over its plan", peaks, ran.peak_bytes)
        _assert_tree_same(out_a, out_b, f"output, seed {seed}")
        for (name, pa), pb in zip(original.named_parameters(), applied.parameters(), strict=True):
            _assert_same(pa.grad, pb.grad, f"grad of {name}, seed {seed}")
        for opt in (opt_a, opt_b):
            opt.zero_grad()
    return peaks


def test_a_uniform_draw_read_into_python_is_read_at_its_top() -> None:
    """Only reads off a one-element uniform draw change (``p < layerdrop`` is False), through scalar
    arithmetic; the draw's tensor keeps its value and the generator moves as it does."""
    from memviz.profiling.capture import draws_at_their_top

    torch.manual_seed(0)
    with draws_at_their_top() as drawn:
        p = torch.rand([])
        skip = bool(p < 0.9999)
        scaled = float(p * 2)
        other = bool(torch.tensor(0.5) < 0.9)
    torch.manual_seed(0)
    assert torch.equal(p, torch.rand([]))
    assert not skip and scaled == pytest.approx(2.0) and other
    assert len(drawn) == 2


def test_layerdrop_plan_holds_in_every_step_and_export_refuses(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = LayerDropNet().train()
    args = (torch.randn(8, 16, 32),)
    seeds = [6, 1, 0, 6]
    # the premise: the example's draw (seed 0) skips three layers, later steps' (seed 6) run them all
    assert _layers_run(model, model.layers, args, {}, 0) == [1]
    assert [len(_layers_run(model, model.layers, args, {}, s)) for s in seeds] == [4, 2, 1, 4]
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = memviz.profile(model, args, loss_fn=_square, optimizer=torch.optim.AdamW, repeats=1, warmup=0)
    plan = sac_plan(prof, 0.8)
    peaks = _trains_within_plan(model, args, {}, _square, plan, seeds)
    # the step that runs every layer with every layer's AdamW state (the last) is the one planned
    assert peaks[-1] >= 0.98 * plan.peak_bytes, (peaks, plan.peak_bytes)
    assert len(prof.captured.drawn) == 1 and "dropout_probability < self.layerdrop" in prof.captured.drawn[0]
    assert any("no layer is skipped" in str(w.message) for w in caught)
    # every layer is in the graph, and the eager step measured is that one, not the example's own
    assert sum(c.op.endswith("addmm.default") for c in prof.graph.computes if c.phase.value == "forward") == 8
    torch.manual_seed(0)
    own, _ = measure_peak(lambda: _square(model(*args)).backward(), tensors_of(model, args))
    model.zero_grad(set_to_none=True)
    assert prof.measured_peak_bytes > own, (prof.measured_peak_bytes, own)
    with pytest.raises(ValueError, match=r"memviz\.apply"):
        memviz.export(plan)
    plan.save(tmp_path / "plan.json")  # a loaded plan, which holds no profile, too
    with pytest.raises(ValueError, match=r"memviz\.apply"):
        memviz.export(memviz.load_plan(tmp_path / "plan.json"), model=model)


@pytest.mark.slow  # 37 s of CPU at load 3: a profile, the calibration, a verifying step and two steps
def test_hf_wav2vec2_ctc_with_default_layerdrop_holds_its_plan() -> None:
    transformers = pytest.importorskip("transformers")
    import tests.real_models  # noqa: F401  (torchvision's op schemas before transformers imports it)

    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(
        vocab_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, mask_time_prob=0.3, mask_time_length=2, ctc_loss_reduction="mean",
        pad_token_id=0)
    assert cfg.layerdrop == 0.1  # the default
    model = transformers.Wav2Vec2ForCTC(cfg).train()
    g = torch.Generator().manual_seed(0)
    args, kwargs = (torch.randn(2, 400, generator=g),), {"labels": torch.randint(1, 16, (2, 4), generator=g)}
    layers = model.wav2vec2.encoder.layers
    assert _layers_run(model, layers, args, kwargs, 2) == [0, 1]
    assert _layers_run(model, layers, args, kwargs, 0) == [0, 1, 2, 3]
    torch.manual_seed(2)
    numpy.random.seed(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SpecAugment's NumPy masks, the label check: warned as always
        prof = memviz.profile(model, args, kwargs, loss_fn=lambda out: out.loss, optimizer=torch.optim.AdamW,
                              repeats=1, warmup=0, fallback=False)
    plan = sac_plan(prof, 0.8)
    _trains_within_plan(model, args, kwargs, lambda out: out.loss, plan, [0, 2])
    assert len(prof.captured.drawn) == 1
