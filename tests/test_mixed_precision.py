"""Mixed precision beyond a step profiled under autocast (test_export / test_apply ``-k autocast``): a plan
file that keeps its autocast regions, float16 with a GradScaler, pure low-precision models and chunked
inference under autocast."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memviz


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 32))


def test_a_plan_saved_under_autocast_verifies_in_its_regions_when_loaded(tmp_path: Path) -> None:
    """A plan file kept no autocast regions: exported outside autocast, the model was captured again in
    float32, which is not the plan's graph (its bfloat16 casts): `StalePlanError`, and the verifying step
    would have run eager in float32.  Now ``graph.meta.autocast`` (memviz.plan/3) carries them: the capture
    and the verifying step enter them, and the loaded plan verifies as profiled."""
    model, x = _mlp(), torch.randn(64, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prof = memviz.profile(model, (x,), optimizer=torch.optim.AdamW, repeats=1, warmup=0)
    path = memviz.plan(prof, None, frontier=False).save(tmp_path / "plan.json")
    loaded = memviz.load_plan(path)
    module = memviz.export(loaded, model=model, verify=True, inputs=((x,), {}))
    assert module.verified_equal.equal and module.verified_peak_bytes <= loaded.peak_bytes
    assert loaded.graph.meta["autocast"] == [["cpu", "bfloat16"]]


def _recipe(model: nn.Module, x: torch.Tensor, loss_fn: Any, init_scale: float,
            steps: int = 3) -> list[torch.Tensor]:
    """The float16 recipe with a GradScaler (``torch.amp``) for `steps` AdamW steps; the parameters after."""
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(model(x))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def test_float16_with_a_grad_scaler_profiles_plans_exports_and_verifies() -> None:
    """The float16 recipe: ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``.  A loss_fn
    that scaled was run on fake tensors and left a FakeTensor as the user's scale; now it is refused and
    ``scaler=`` is the way: its scalars join the plan, verify runs the recipe on a copy (a scale of 2**40
    overflows: infinite gradients on both sides are equal, and the update is skipped), and the exported
    module trains as eager through steps the scaler skips and steps it takes."""
    model, x = _mlp(), torch.randn(64, 32)
    target = torch.randn(64, 32)

    def mse(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out, target)

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(ValueError, match="pass the unscaled loss as loss_fn and the scaler as scaler="):
            memviz.profile(model, (x,), loss_fn=lambda out: scaler.scale(mse(out)), repeats=1, warmup=0)
        assert scaler._scale is None  # untouched
        prof = memviz.profile(model, (x,), loss_fn=mse, optimizer=torch.optim.AdamW, repeats=1, warmup=0,
                              scaler=scaler)
    assert any(d.name.startswith("GradScaler") and d.bytes == 20 for d in prof.graph.datas)
    module = memviz.export(memviz.plan(prof, None, frontier=False), verify=True, inputs=((x,), {}))
    assert module.verified_equal.equal and module.verified_peak_bytes <= module.plan.peak_bytes
    assert scaler._scale is None  # verify scaled by a copy
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for init_scale in (2.0**40, 2.0**16):  # every step skipped at first, then taken
        model.load_state_dict(state)
        eager = _recipe(model, x, mse, init_scale)
        model.load_state_dict(state)
        for a, b in zip(eager, _recipe(module, x, mse, init_scale), strict=True):
            assert torch.equal(a, b)


def test_infinities_equal_on_both_sides_compare_equal() -> None:
    """A float16 step's overflow (which a GradScaler skips) gives infinite gradients on both sides: they were
    a difference of NaN, counted as infinitely different (a MismatchError); now equal values, infinite
    ones included, are no difference, and the distance is taken against the largest finite magnitude."""
    from memviz.runtime.equivalence import _compared

    inf = float("inf")
    assert _compared({"g": torch.tensor([inf, 2.0])}, {"g": torch.tensor([inf, 2.0])}).equal
    assert not _compared({"g": torch.tensor([inf, 2.0])}, {"g": torch.tensor([-inf, 2.0])}).equal
    assert _compared({"g": torch.tensor([inf, 2.0])}, {"g": torch.tensor([inf, 2.0001])}).worst > 0


def test_a_chunk_plan_profiled_under_autocast_runs_in_its_precision_wherever_it_is_called() -> None:
    """Autochunk's op graph holds no casts (autocast casts as the ops run).  A GPT-2 profiled in bfloat16
    was captured for chunking in the planning caller's precision (float32 here: 80% of the profile's peak
    refused), and a chunked module run outside autocast ran in float32, 46% over its planned activations,
    its logits float32; inside, autocast's cast cache held 15% over them.  Now the capture, the selection
    and the chunked module enter the profile's regions (cache off): inside or outside autocast it is
    eager's bfloat16 step, within the 5% chunk estimates are held to."""
    from memviz.profiling.tracker import StorageTracker, tensors_of
    from tests.real_models import REAL

    case = REAL["gpt2_sdpa"]()
    model = case.model.eval()
    ids = case.long[0][0][:, :256]

    def measured(fn: Any) -> tuple[int, torch.Tensor]:
        with torch.no_grad():
            tracker = StorageTracker(tensors_of(fn, (ids,)))
            with tracker:
                out = fn(ids)
        return tracker.peak_bytes - tracker.start_bytes, out.logits

    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, eager = measured(model)
        prof = memviz.profile(model, (ids,), mode="inference", repeats=1, warmup=0)
    # 85% of the chunk baseline: that baseline is the measured run's now (294,912 B of activations; it
    # counted 360,448 when autocast's operands were not cast, and 80% of it asked for 41% of the
    # activations where 80% now asks 32%, under the 34% the search reaches)
    plan = memviz.plan(prof, 0.85, strategy="autochunk", frontier=False)
    assert plan.chunks
    chunked = memviz.export(plan)
    activations = plan.peak_bytes - plan.baseline_graph.persistent_bytes()
    for inside in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=inside):
            peak, logits = measured(chunked)
        assert logits.dtype == torch.bfloat16 and torch.equal(logits, eager)
        assert peak <= 1.05 * activations, (inside, peak, activations)
    assert plan.graph.meta["autocast"] == [["cpu", "bfloat16"]]  # what a plan file keeps


def test_a_pure_bfloat16_model_plans_exports_applies_and_verifies() -> None:
    """``model.to(torch.bfloat16)`` with AdamW, no autocast: an exported and an applied plan measure their
    plan and equal eager's step (this worked before; the check guards it)."""
    model = _mlp().to(torch.bfloat16)
    x = torch.randn(256, 32, dtype=torch.bfloat16)
    prof = memviz.profile(model, (x,), optimizer=torch.optim.AdamW, repeats=1, warmup=0)
    assert {d.dtype for d in prof.graph.datas if d.kind.value == "parameter"} == {"bfloat16"}
    exported = memviz.export(memviz.plan(prof, 0.8, frontier=False), verify=True, inputs=((x,), {}))
    applied = memviz.apply(memviz.plan(prof, None, strategy="sac", frontier=False), model, verify=True,
                           inputs=((x,), {}))
    for module in (exported, applied):
        assert module.verified_equal.equal and module.verified_peak_bytes <= module.plan.peak_bytes


def test_a_loss_closing_over_a_variable_not_yet_assigned_is_searched_for_a_scaler() -> None:
    """The search for a GradScaler in what `loss_fn` holds read every closure cell, and an empty one (a
    variable its enclosing function assigns after defining it) raised ValueError from `memviz.profile`;
    empty cells are skipped, and a scaler assigned later is still found."""
    from memviz.hardware.amp import refuse_scaling_loss

    def make(with_scaler: bool) -> Any:
        def loss_fn(out: torch.Tensor) -> torch.Tensor:
            return scaler.scale(out.sum())

        if with_scaler:
            scaler = torch.amp.GradScaler("cpu")
        return loss_fn

    refuse_scaling_loss(make(False))  # `scaler` never assigned: an empty cell
    with pytest.raises(ValueError, match="loss_fn holds a torch.amp.GradScaler"):
        refuse_scaling_loss(make(True))


# ~20 s each at load 8 (a capture, a narrow search, three measured runs); Mistral's sliding-window mask as a
# second case
@pytest.mark.parametrize("name", ["llama", pytest.param("mistral", marks=pytest.mark.slow)])
def test_the_chunk_estimate_under_autocast_is_the_measured_run(name: str) -> None:
    """Autochunk's op graph holds no casts, and under ``torch.autocast`` its meta replay (autocast skips
    meta tensors) kept float32 operands where bfloat16 ran: Llama's rotary embedding hands attention float32
    queries and keys beside a bfloat16 value, a mix for which the kernel choice found only the math
    path, so the graph counted its L x S scores (Llama at 512 tokens: 5,165,728 B against 594,592 in
    float32, every chunk plan at 80% refused; Mistral's chunked estimate 2.8x its measured run).  Now the
    operands are cast as autocast casts them (its copies counted as the op's workspace): the unchunked
    and the chunked estimates are the measured runs', never under, and the chunked logits eager's."""
    from memviz.hardware import accelerator
    from memviz.plans import chunking as ch
    from memviz.profiling.tracker import StorageTracker, tensors_of
    from solvers import autochunk as ac
    from tests.real_models import REAL

    case = REAL[name]()
    model = case.model.eval()
    model.config.use_cache = False
    ids = case.long[0][0][:, :256]
    bf16 = (("cpu", torch.bfloat16),)

    def measured(fn: Any) -> tuple[int, torch.Tensor]:
        with torch.no_grad(), accelerator.autocast_as(bf16, cache=False):
            tracker = StorageTracker(tensors_of(fn, (ids,)))
            with tracker:
                out = fn(ids)
        return tracker.peak_bytes - tracker.start_bytes, out

    _, eager = measured(model)
    with accelerator.autocast_as(bf16, cache=False):  # as `memviz.plan` checks it and the module runs
        plan = ch.plan_chunks(model, (ids,), budget=0.9, speed=ac.SpeedModel(), beam=2, window=12)
    base, _ = measured(plan.gm)
    assert base <= plan.baseline_peak_bytes <= 1.03 * base, (plan.baseline_peak_bytes, base)
    assert plan.regions and plan.met
    peak, out = measured(plan.module())
    assert peak <= plan.peak_bytes <= 1.03 * peak, (plan.peak_bytes, peak)
    assert out.logits.dtype == torch.bfloat16 and torch.equal(out.logits, eager.logits)


class _ScaledLoss:
    """A loss object that scales (a training script's class)."""

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(out.float().pow(2).mean())


def _scaled(scale: Any, out: torch.Tensor) -> torch.Tensor:
    return scale(out.float().pow(2).mean())


_SCALER = torch.amp.GradScaler("cpu", init_scale=2.0**40)
_SCALE = _SCALER.scale  # a script's `scale = scaler.scale`, read by a lambda as a global


def _scaling_losses() -> dict[str, Any]:
    scale = _SCALER.scale
    return {
        "global bound method": lambda out: _SCALE(out.float().pow(2).mean()),
        "closure bound method": lambda out: scale(out.float().pow(2).mean()),
        "partial of a bound method": functools.partial(_scaled, _SCALER.scale),
        "partial keyword": functools.partial(_scaled, scale=_SCALER.scale),
        "callable object": _ScaledLoss(_SCALER),
    }


@pytest.mark.parametrize("form", list(_scaling_losses()))
def test_a_loss_reaching_a_grad_scaler_through_a_bound_method_or_partial_is_refused(form: str) -> None:
    """The search for a GradScaler in `loss_fn` missed ``scaler.scale`` held as a bound method (in a
    closure, a global, a ``functools.partial``) and a callable object's attributes: such a loss was run on
    fake tensors, and ``scale`` left a FakeTensor as the user's scale.  Refused now, the scaler untouched;
    losses that reach no scaler still profile."""
    model, x = _mlp(), torch.randn(16, 32)
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(ValueError, match="pass the unscaled loss as loss_fn and the scaler as scaler="):
            memviz.profile(model, (x,), loss_fn=_scaling_losses()[form], repeats=1, warmup=0)
    assert _SCALER._scale is None
    from memviz.hardware.amp import refuse_scaling_loss

    refuse_scaling_loss(functools.partial(nn.functional.mse_loss, target=torch.zeros(16, 32)))
    refuse_scaling_loss(lambda out: out.float().pow(2).mean())


def test_a_plan_file_records_its_grad_scaler_and_verifying_it_without_one_is_refused(tmp_path: Path) -> None:
    """A plan file did not say that its step used a GradScaler: loaded and verified without ``scaler=``, the
    step ran unscaled (20 B under the plan on the CPU: not the recipe the user trains with) and passed.  Now
    ``graph.meta.scaler`` records it, export(verify=True) and apply(verify=True) of the loaded plan without
    ``scaler=`` are refused with what to pass, and with it they verify; a file without the key (older
    ones) loads and verifies as before."""
    import json

    model, x = _mlp(), torch.randn(64, 32)
    target = torch.randn(64, 32)

    def mse(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out, target)

    with torch.autocast("cpu", dtype=torch.float16):
        prof = memviz.profile(model, (x,), loss_fn=mse, optimizer=torch.optim.AdamW, repeats=1, warmup=0,
                              scaler=torch.amp.GradScaler("cpu"))
    paths = {s: memviz.plan(prof, None, strategy=s, frontier=False).save(tmp_path / f"{s}.json")
             for s in ("auto", "sac")}
    inputs = ((x,), {})
    for strategy, path in paths.items():
        loaded = memviz.load_plan(path)
        assert loaded.graph.meta["scaler"] == "cpu"
        run = functools.partial(memviz.export, loaded, model=model) if strategy == "auto" else \
            functools.partial(memviz.apply, loaded, model)
        with pytest.raises(ValueError, match=r"pass scaler= .*torch.amp.GradScaler\('cpu'\)"):
            run(verify=True, inputs=inputs, loss_fn=mse)
        module = run(verify=True, inputs=inputs, loss_fn=mse, scaler=torch.amp.GradScaler("cpu"))
        assert module.verified_equal.equal and module.verified_peak_bytes <= module.plan.peak_bytes
    doc = json.loads(paths["auto"].read_text())
    del doc["graph"]["meta"]["scaler"]  # a file written before the key
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = memviz.export(memviz.load_plan(tmp_path / "old.json"), model=model, verify=True, inputs=inputs,
                        loss_fn=mse)
    print("unscaled", old.verified_peak_bytes, "plan", old.plan.peak_bytes)
    assert old.verified_equal.equal
