"""A model that checkpoints its own activations (transformers' ``gradient_checkpointing_enable``, a user's
``torch.utils.checkpoint`` call): memviz profiles and plans it without that checkpointing, says so, measures
the step as it runs today beside it, and `memviz.apply` turns the library's switch off in the model it
returns (`memviz.profiling.own_checkpointing`).

Found on a Llama with transformers' checkpointing on: the profile measured the eager step 29% under its
prediction, its sac costs were timed on layers that checkpointed themselves (other plans than the same
model's without it), and the applied plan ran its regions inside the model's own: 33% under the plan's
peak, each layer recomputed twice."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import memviz
from memviz.profiling.profile import ProfileWarning, measure_eager_peak, profile
from memviz.runtime.apply import ApplyWarning
from solvers.result import InfeasibleBudget


class _Checkpointing(nn.Module):
    """Activations dominate: wide elementwise blocks, each checkpointed by the model itself when `mode` says
    how."""

    def __init__(self, mode: str | None) -> None:
        super().__init__()
        self.mode = mode
        self.inp, self.out = nn.Linear(32, 256), nn.Linear(256, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Dropout(0.1), nn.Tanh())
                                    for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            reentrant = self.mode == "reentrant"
            h = block(h) if self.mode is None else checkpoint(block, h, use_reentrant=reentrant)
        return self.out(h)


def _model(mode: str | None) -> nn.Module:
    torch.manual_seed(0)
    return _Checkpointing(mode).train()


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_a_model_checkpointing_itself_is_profiled_without_it_and_measured_as_it_runs(mode: str) -> None:
    x = torch.randn(512, 32)
    plain = profile(_model(None), (x,), repeats=1, warmup=0)
    model = _model(mode)
    with pytest.warns(ProfileWarning, match=r"itself \(torch.utils.checkpoint in blocks.0, blocks.1"):
        prof = profile(model, (x,), repeats=1, warmup=0)
    assert prof.own_checkpointing == ["blocks.0", "blocks.1", "blocks.2"] and plain.own_checkpointing == []
    # the step memviz measured is the one it predicts and plans: the model without its checkpointing
    assert prof.measured_peak_bytes == plain.measured_peak_bytes
    assert prof.baseline.peak_bytes == plain.baseline.peak_bytes
    # and the step as it runs today, with it, beside it
    assert prof.as_run_peak_bytes == measure_eager_peak(model, (x,)) < prof.measured_peak_bytes
    assert plain.as_run_peak_bytes is None


def _llama(checkpointing: bool) -> tuple[nn.Module, torch.Tensor]:
    from tests.real_models import transformers  # after torchvision's schema shim

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      attention_dropout=0.1, use_cache=False)
    model = transformers.LlamaForCausalLM(config).train()
    if checkpointing:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated name users still call
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, torch.randint(0, 128, (2, 64))


def _loss(out: object) -> torch.Tensor:
    return out.loss


def test_apply_turns_transformers_checkpointing_off_and_runs_the_plan_alone() -> None:
    model, ids = _llama(True)
    kwargs = {"labels": ids}
    with pytest.warns(ProfileWarning, match=r"in model.layers.0, model.layers.1\);"):
        prof = memviz.profile(model, (ids,), kwargs, loss_fn=_loss, optimizer=torch.optim.AdamW,
                              repeats=1, warmup=0)
    assert prof.own_checkpointing == ["model.layers.0", "model.layers.1"]  # not the copies memviz times
    plain, _ = _llama(False)
    assert prof.measured_peak_bytes == measure_eager_peak(plain, (ids,), kwargs, loss_fn=_loss)
    try:
        plan = memviz.plan(prof, 0.5, strategy="sac")
    except InfeasibleBudget as refused:
        plan = memviz.plan(prof, refused.minimum_bytes, strategy="sac")
    assert plan.solver_stats.extra["sac"]["regions"], "a plan that recomputes"
    with pytest.warns(ApplyWarning, match="checkpointed its own activations"):
        applied = memviz.apply(plan, model, verify=True, inputs=((ids,), kwargs), loss_fn=_loss)
    assert applied.verified_equal.equal
    # the plan's regions alone: nested in the model's own they measured far under the plan (each layer's
    # activations dropped twice), and recomputed every layer twice
    assert abs(applied.verified_peak_bytes - applied.plan.peak_bytes) <= 0.02 * applied.plan.peak_bytes
    assert not any(getattr(m, "gradient_checkpointing", False) for m in applied.modules())
    assert model.model.layers[0].gradient_checkpointing  # the user's model keeps its own


def _applied(model: nn.Module, args: tuple, kwargs: dict, loss: object, fraction: float) -> nn.Module:
    prof = memviz.profile(model, args, kwargs, loss_fn=loss, repeats=1, warmup=0)
    try:
        plan = memviz.plan(prof, fraction, strategy="sac")
    except InfeasibleBudget as refused:
        plan = memviz.plan(prof, refused.minimum_bytes, strategy="sac")
    regions = [r["module"] for r in plan.solver_stats.extra["sac"]["regions"]]
    print("regions", regions, "plan", plan.peak_bytes, "eager", prof.baseline.peak_bytes)
    assert regions, "a plan that recomputes"
    return memviz.apply(plan, model)


@pytest.mark.parametrize("library", ["transformers", "timm"])
def test_checkpointing_turned_on_after_apply_is_turned_off_before_the_next_step(library: str) -> None:
    """HF Trainer turns transformers' checkpointing on at train start when its arguments ask for it
    (``activation_checkpointing_enable()``, what ``gradient_checkpointing=True`` runs), after the user
    applied memviz's plan; timm's ``set_grad_checkpointing()`` likewise.  The applied model keeps the plan:
    the switch is turned off again before the step, with an ApplyWarning, and the step measures as the plan
    alone did.  Before, the Llama's step measured 6.0% under it and ran 52 module calls instead of 42 (the
    layer the plan leaves alone checkpointed too, the plan's region inside the library's), the ViT's 87
    instead of 69."""
    if library == "transformers":
        model, ids = _llama(False)
        args, kwargs, loss = (ids,), {"labels": ids}, _loss
        applied = _applied(model, args, kwargs, loss, 0.75)

        def enable() -> None:
            applied.activation_checkpointing_enable()
    else:
        from tests.real_models import timm_vit

        case = timm_vit()
        args, kwargs, loss = case.args, case.kwargs, case.losses["ce"]
        applied = _applied(case.model, args, kwargs, loss, 0.75)

        def enable() -> None:
            applied.set_grad_checkpointing()
    alone = _measured(applied, args, kwargs, loss)
    enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ApplyWarning)
        after = _measured(applied, args, kwargs, loss)
    print(library, "plan alone (peak, module calls)", alone, "after the library's switch", after)
    assert after == alone
    assert [w for w in caught if "turned on after memviz.apply" in str(w.message)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ApplyWarning)  # said once: the switch stays off
        assert _measured(applied, args, kwargs, loss) == alone
    twin = copy.deepcopy(applied)  # a copy's hook clears the copy's switches
    applied = twin  # what enable() turns on
    enable()
    with pytest.warns(ApplyWarning, match="turned on after memviz.apply"):
        assert _measured(twin, args, kwargs, loss) == alone


def _measured(model: nn.Module, args: tuple, kwargs: dict, loss: object) -> tuple[int, int]:
    """A step's measured peak and its module calls (recomputations included)."""
    calls = [0]
    count = lambda *_: calls.__setitem__(0, calls[0] + 1)  # noqa: E731
    handle = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        peak = measure_eager_peak(model, args, kwargs, loss_fn=loss)
    finally:
        handle.remove()
    return peak, calls[0]
