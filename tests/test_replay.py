"""Replays that cannot be faithful say so (issue 17 item 9).

The exported module runs the captured graph, not the model's Python code: hooks are not called and the
module-level data forward read is a constant of the graph.  Export warns (`ReplayWarning`) naming each
forward hook and global, refuses backward hooks (their gradient changes would be lost); names FX cannot
write into its generated code are refused at capture."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import memviz
from memviz.profiling.capture import CaptureError, capture
from memviz.runtime.replay import ReplayWarning, UnfaithfulReplay, data_globals, hooks

SCALE = 2.0  # module-level data Scaled.forward reads: the trace takes its value as a constant


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) * SCALE


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


CALLS: list[str] = []


def counting_hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    CALLS.append("forward")
    return output + 1  # a tensor effect the trace keeps, beside a side effect it cannot


def _plan(model: nn.Module, mode: str = "train") -> memviz.Plan:
    prof = memviz.profile(model, (torch.randn(4, 8),), mode=mode, repeats=1, warmup=0, measure=False)
    return memviz.plan(prof, None, strategy="none")


def _replay_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, ReplayWarning)]


def test_export_names_a_forward_hook_and_apply_runs_it() -> None:
    model = Plain()
    model.a.register_forward_hook(counting_hook)
    plan = _plan(model)
    exported, messages = _replay_warnings(lambda: memviz.export(plan))
    assert len(messages) == 1, messages
    assert f"forward hook {__name__}.counting_hook on a" in messages[0]
    assert "memviz.apply(plan, model)" in messages[0]
    # what the warning says: the replay computes the hook's tensors but never calls it ...
    x = torch.randn(4, 8)
    CALLS.clear()
    torch.testing.assert_close(exported(x), model(x))
    assert CALLS == ["forward"], "only the eager call ran the hook"
    # ... and apply, the faithful route, runs it
    CALLS.clear()
    memviz.apply(plan, model)(x).sum().backward()
    assert CALLS, "memviz.apply runs the user's hooked modules"


@pytest.mark.parametrize("register, kind, backward", [
    (lambda m, f: m.b.register_forward_pre_hook(lambda mod, inp: f()), "forward pre-hook", False),
    (lambda m, f: m.b.register_forward_hook(lambda mod, inp, out: f()), "forward hook", False),
    (lambda m, f: m.b.register_full_backward_hook(lambda mod, gin, gout: f()), "backward hook", True),
    (lambda m, f: m.b.register_full_backward_pre_hook(lambda mod, gout: f()), "backward pre-hook", True),
    (lambda m, f: nn.modules.module.register_module_forward_hook(lambda mod, inp, out: f()),
     "global forward hook", False),
    (lambda m, f: nn.modules.module.register_module_forward_pre_hook(lambda mod, inp: f()),
     "global forward pre-hook", False),
    (lambda m, f: nn.modules.module.register_module_full_backward_hook(lambda mod, gin, gout: f()),
     "global backward hook", True),
])
def test_every_kind_of_hook_is_named(register, kind: str, backward: bool) -> None:
    model = Plain()
    assert hooks(model, backward=False) == hooks(model, backward=True) == []
    handle = register(model, lambda: None)
    try:
        found, other = hooks(model, backward=backward), hooks(model, backward=not backward)
    finally:
        handle.remove()
    where = "" if kind.startswith("global") else " on b"
    assert len(found) == 1 and other == [], (found, other)
    assert found[0].startswith(f"{kind} ") and found[0].endswith(f"<lambda>{where}"), found


def scale_gradient(module: nn.Module, grad_input: tuple, grad_output: tuple) -> tuple:
    return tuple(None if g is None else g * 10 for g in grad_input)


def test_export_refuses_a_backward_hook_whose_gradients_it_would_drop() -> None:
    """The joint trace does not record a full backward hook: the replay's gradients would miss its change
    (measured before the refusal: the first layer's gradients differed from eager's, silently)."""
    model = Plain()
    handle = model.b.register_full_backward_hook(scale_gradient)
    plan = _plan(model)
    with pytest.raises(UnfaithfulReplay, match=rf"backward hook {__name__}.scale_gradient on b\. Remove"):
        memviz.export(plan)
    handle.remove()  # what the message says to do
    memviz.export(plan)


def test_inference_export_keeps_backward_hooks_that_never_run() -> None:
    model = Plain()
    model.b.register_full_backward_hook(scale_gradient)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayWarning)
        memviz.export(_plan(model, mode="inference"))


def test_export_names_a_global_forward_reads() -> None:
    global SCALE
    model = Scaled()
    plan = _plan(model)
    exported, messages = _replay_warnings(lambda: memviz.export(plan))
    assert len(messages) == 1, messages
    assert f"SCALE (float, read by Scaled.forward in {__name__})" in messages[0]
    assert "memviz.apply(plan, model)" in messages[0]
    # the difference it warns about: the graph keeps the traced value
    x = torch.randn(4, 8)
    try:
        SCALE = 3.0
        assert not torch.allclose(exported(x), model(x))
    finally:
        SCALE = 2.0


def test_globals_that_are_code_are_not_named() -> None:
    # Scaled.forward also reads `torch` (a module): only data is baked into the graph
    assert data_globals(Scaled()) == [f"SCALE (float, read by Scaled.forward in {__name__})"]
    assert data_globals(Plain()) == []


def test_plain_model_exports_without_a_replay_warning() -> None:
    plan = _plan(Plain())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayWarning)
        memviz.export(plan)


@pytest.mark.parametrize("name", ['a"b', "a'b", "a\\b", "a\rb", "a\nb", "a\x00b"])
def test_names_the_trace_cannot_write_are_refused(name: str) -> None:
    """A double quote, \\r or \\n was a raw SyntaxError from FX codegen (a backslash a wrong attribute)."""
    model = nn.Sequential()
    model.add_module(name, nn.Linear(4, 4))
    with pytest.raises(CaptureError, match="rename it") as err:
        capture(model, (torch.randn(2, 4),))
    assert f"submodule name {name!r}" in str(err.value)
    with pytest.raises(CaptureError, match="rename it"):
        memviz.profile(model, (torch.randn(2, 4),), fallback=False, measure=False)


def test_parameter_name_the_trace_cannot_write_is_refused() -> None:
    model = Plain()
    model.b.register_parameter('w"', nn.Parameter(torch.ones(8)))
    with pytest.raises(CaptureError, match=r"parameter name 'b\.w\"'.*rename it"):
        capture(model, (torch.randn(4, 8),))


@pytest.mark.slow  # ~18 s on a loaded core: the sac plan's search
def test_apply_keeps_what_a_backward_hook_does_to_gradients() -> None:
    """The route the refusal points to: apply checkpoints the user's own block, hook included."""
    from examples.models import gpt

    model, args = gpt(batch=2, seq=16, layers=2, dropout=0.0)
    model.blocks[0].register_full_backward_hook(scale_gradient)
    model(*args).sum().backward()
    eager = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    prof = memviz.profile(model, args, repeats=1, warmup=0, measure=False)
    plan = memviz.plan(prof, "95%", strategy="sac")
    assert [r["module"] for r in plan.solver_stats.extra["sac"]["regions"]] == ["blocks.0"]
    with pytest.raises(UnfaithfulReplay):
        memviz.export(plan)
    applied = memviz.apply(plan, model)
    applied(*args).sum().backward()
    for name, p in applied.named_parameters():
        torch.testing.assert_close(p.grad, eager[name], msg=name)
