"""`memviz.export(plan, verify=True)` (issue 16 items 4, 5, 7): one measured step before the module is
returned, nothing the user sees changed, a step over the budget re-planned or refused, and the CLI and
the Planner verifying by default."""

from __future__ import annotations

import functools
import json
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memviz
from memviz.cli import main
from memviz.profiling.profile import Profile, profile
from memviz.runtime.export import BudgetExceededError
from memviz.runtime.verify import MismatchError, VerifyWarning
from memviz.views.widget import Planner

F64 = torch.float64


def net() -> tuple[nn.Module, torch.Tensor]:
    """A small chain with BatchNorm statistics and dropout (state and RNG a verifying step touches)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, 64)]
    for _ in range(4):
        layers += [nn.BatchNorm1d(64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 64)]
    model = nn.Sequential(*layers, nn.Linear(64, 4)).double()
    return model, torch.randn(64, 32, dtype=F64)


@functools.cache
def profiled(optimizer: bool) -> tuple[nn.Module, torch.Tensor, Profile]:
    model, x = net()
    return model, x, profile(model, (x,), optimizer=torch.optim.AdamW if optimizer else None, repeats=1,
                             warmup=0)


def half_way(prof: Profile, strategy: str = "rotor") -> Any:
    """A plan at the middle of [the strategy's minimum, the eager peak]."""
    from memviz.plans.planning import minimum_budget

    low = minimum_budget(prof.graph, strategy)
    return memviz.plan(prof, (low + prof.baseline.peak_bytes) // 2, strategy=strategy, frontier=False)


def user_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[Any], torch.Tensor]:
    return ({k: v.clone() for k, v in model.state_dict().items()}, [p.grad for p in model.parameters()],
            torch.get_rng_state())


def test_verified_plan_passes_and_leaves_the_user_state_alone() -> None:
    model, _, prof = profiled(True)
    plan = half_way(prof)
    for p in model.parameters():  # gradients the user already has: kept as the very same tensors
        p.grad = torch.full_like(p, 7.0)
    before = user_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VerifyWarning)
        module = memviz.export(plan, verify=True)
    state, grads, rng = user_state(model)
    assert all(torch.equal(before[0][k], state[k]) for k in state), "parameters or buffers changed"
    assert all(a is b for a, b in zip(before[1], grads, strict=True)), "gradients replaced"
    assert torch.equal(before[2], rng), "the RNG stream advanced"
    assert module.plan is plan
    # the same step on the model and on the module, same random state (dropout on): equal
    assert module.verified_equal.equal is True and module.verified_equal.worst <= 1e-4
    # the optimizer step is part of what was measured: the plan's peak, within 1%, under the budget
    assert module.verified_peak_bytes <= plan.budget_bytes
    assert abs(module.verified_peak_bytes - plan.peak_bytes) <= 0.01 * plan.peak_bytes, (
        module.verified_peak_bytes, plan.peak_bytes)
    for p in model.parameters():
        p.grad = None


def test_verify_measures_what_a_training_step_holds() -> None:
    """The figure is the one an AdamW training step of the exported module measures (state exists)."""
    from memviz.profiling.tracker import measure_peak, tensors_of

    model, x, prof = profiled(True)
    plan = half_way(prof, "rockmate")
    module = memviz.export(plan, verify=True)
    twin = memviz.export(plan)
    opt = torch.optim.AdamW(twin.parameters())
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def step() -> None:
        twin(x).sum().backward()
        opt.step()
        opt.zero_grad()

    step()  # AdamW creates its state in the first step
    peak, _ = measure_peak(lambda: twin(x).sum().backward() or opt.step(), tensors_of(twin, opt, x))
    model.load_state_dict(saved)
    for p in model.parameters():
        p.grad = None
    assert peak == module.verified_peak_bytes


def _hiding_loss(cache: list[torch.Tensor], hidden_bytes: int) -> Any:
    """A loss that keeps a tensor in a Python-side cache: memory the captured graph cannot show."""

    def loss(out: torch.Tensor) -> torch.Tensor:
        cache.append(torch.zeros(hidden_bytes // 8, dtype=F64))
        return out.sum()

    return loss


def test_memory_hidden_from_the_profile_is_replanned_with_its_excess_as_margin() -> None:
    from memviz.plans.planning import minimum_budget

    model, x, prof = profiled(False)
    low = minimum_budget(prof.graph, "rotor")
    plan = memviz.plan(prof, (low + prof.baseline.peak_bytes) // 2, strategy="rotor", frontier=False)
    # over the budget whichever schedule the measured op times made rotor pick, with room to re-plan
    assert plan.peak_bytes - low >= 64, (plan.peak_bytes, low)
    hidden = plan.budget_bytes - plan.peak_bytes + (plan.peak_bytes - low) // 3
    cache: list[torch.Tensor] = []
    with pytest.warns(VerifyWarning, match="re-planned") as caught:
        module = memviz.export(plan, verify=True, loss_fn=_hiding_loss(cache, hidden))
    assert cache, "the verifying step ran the given loss"
    assert module.verified_peak_bytes <= plan.budget_bytes
    assert module.plan.peak_bytes <= plan.budget_bytes - hidden  # the margin is the hidden memory
    assert module.plan.budget_bytes == plan.budget_bytes and module.plan.strategy == "rotor"
    assert "over the budget" in str(caught[0].message)


def test_memory_over_any_plan_raises_with_the_numbers() -> None:
    model, x, prof = profiled(False)
    plan = half_way(prof)
    cache: list[torch.Tensor] = []
    with pytest.raises(BudgetExceededError, match="raise the budget|Raise the budget") as info:
        memviz.export(plan, verify=True, loss_fn=_hiding_loss(cache, 2 * prof.baseline.peak_bytes))
    err = info.value
    assert isinstance(err, ValueError)
    assert err.measured_bytes > err.budget_bytes == plan.budget_bytes and err.planned_bytes == plan.peak_bytes


def test_loaded_plan_needs_its_model(tmp_path: Path) -> None:
    model, x, prof = profiled(False)
    plan = half_way(prof)
    loaded = memviz.load_plan(plan.save(tmp_path / "p.json"))
    with pytest.raises(ValueError, match="pass model="):
        memviz.export(loaded, verify=True)
    module = memviz.export(loaded, model=model, inputs=((x,), {}), verify=True)
    # the same step as the in-memory plan's (a loaded plan's graph is the same graph)
    assert module.verified_peak_bytes == memviz.export(plan, verify=True).verified_peak_bytes
    assert module.verified_peak_bytes <= plan.budget_bytes


FACTORY = '''
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64),
                          nn.Tanh(), nn.Linear(64, 4))
    return model, (torch.randn(1024, 16),)
'''


@pytest.mark.parametrize("verify", [True, False])
def test_cli_export_verifies_unless_told_not_to(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                verify: bool) -> None:
    (tmp_path / "m.py").write_text(FACTORY)
    out = tmp_path / "opt.py"
    argv = ["plan", f"{tmp_path / 'm.py'}:make", "--budget", "92%", "--strategy", "rotor", "--export",
            str(out), "--time-limit", "5", *([] if verify else ["--no-verify"])]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert out.is_file()
    assert ("verified: one step measured" in err) is verify, err
    assert ("exporting and verifying" in err) is verify, err


def test_planner_export_verifies(tmp_path: Path) -> None:
    model, x, prof = profiled(False)
    # a cap, not the work (rotor's program is counted): at 5 s a 20x slower clock cut it short (OutOfTime)
    w = Planner(prof, budget=0.8, strategy="rotor", time_limit=600)
    try:
        assert w.verify, "the Planner verifies by default"
        result = w.export(tmp_path / "opt.py")
        assert result["ok"], result
        assert 0 < result["verified_peak_bytes"] <= w.plan.budget_bytes
        doc = json.loads((tmp_path / "opt.plan.json").read_text())
        assert doc["planned"]["timeline"]["peak_bytes"] <= doc["budget_bytes"]
    finally:
        w.close()


class Tagger(nn.Module):
    """Takes its labels as a keyword, as Hugging Face models do, and ignores them: the loss reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.lin(x)


def test_labels_the_loss_closes_over_are_not_the_steps_memory() -> None:
    """The verifying step rebuilds the inputs; the labels the loss closes over stay the user's, which in
    the user's step are the model's own labels: a view of them (``labels.reshape(-1)``) is no allocation
    of the step, and a plan at exactly the eager peak passes (it measured the labels' 256 B over it)."""
    torch.manual_seed(0)
    model, x = Tagger(), torch.randn(32, 8)
    labels = torch.randint(0, 5, (2, 16))

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, labels.reshape(-1))

    prof = profile(model, (x,), {"labels": labels}, loss_fn=loss_fn, repeats=1, warmup=0)
    plan = memviz.plan(prof, prof.baseline.peak_bytes, strategy="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error", VerifyWarning)
        module = memviz.export(plan, verify=True)
    measured = module.verified_peak_bytes
    assert 0 <= plan.peak_bytes - measured <= 8, (plan.peak_bytes, measured)


class LastToken(nn.Module):
    """Gathers each row's last non-padding token, as mBART's ``shift_tokens_right`` does: all-padding
    rows (zeros) gather at index -1."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        last = ids.gather(1, (ids.ne(0).sum(1) - 1).unsqueeze(-1))
        return self.emb(torch.cat([last, ids[:, :-1]], 1))


def test_a_model_that_fails_on_zero_inputs_is_told_to_pass_inputs() -> None:
    """Without ``inputs=`` the verifying step runs on zeros of the planned shapes: a model whose values
    matter fails there with a `VerifyError` saying so and what to pass, not a bare index error."""
    from memviz.runtime.verify import VerifyError

    ids = torch.randint(1, 10, (2, 6))
    prof = profile(LastToken(), (ids,), repeats=1, warmup=0)
    plan = memviz.plan(prof, None)
    with pytest.raises(VerifyError, match=r"zeros of the planned input shapes.*pass inputs=\(args, kwargs\)"):
        memviz.export(plan, verify=True)
    assert memviz.export(plan, verify=True, inputs=(ids,)).verified_peak_bytes > 0


class HostRandom(nn.Module):
    """Scales by a draw from Python's generator, which the capture makes a constant (`host_random`)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)) * (1.0 + random.random()))


def test_a_module_that_computes_something_else_is_not_returned() -> None:
    """verify also runs the step on the model itself from the same random state and compares loss and
    gradients: an export whose graph froze a Python-random draw into a constant computes another loss,
    and is refused with the largest difference, where a faithful one is returned marked equal."""
    torch.manual_seed(0)
    model, x = HostRandom(), torch.randn(8, 16)
    with pytest.warns(memviz.profiling.profile.ProfileWarning, match="random"):
        prof = profile(model, (x,), repeats=1, warmup=0)
    plan = memviz.plan(prof, None, frontier=False)
    random.seed(1)  # another draw than the one the trace froze
    with pytest.raises(MismatchError, match="DIFFERENT from the model's own step"):
        memviz.export(plan, verify=True)
    faithful = memviz.plan(profiled(False)[2], None, frontier=False)
    assert memviz.export(faithful, verify=True).verified_equal.equal is True
