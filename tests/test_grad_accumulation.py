"""Gradient accumulation (``memviz.profile(grads="accumulate")``): a loop that keeps every ``.grad`` from the
step's start (micro-batches after the first, or ``zero_grad(set_to_none=False)``) holds the gradients
through the forward, and backward adds into them; a plan that assumes ``.grad`` None there measures over
itself in such a loop."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memviz
from solvers import DataKind
from solvers.result import InfeasibleBudget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from check_accumulation import accumulation_peak  # noqa: E402  (the benchmark measures it the same way)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.relu(self.fc1(x))))


class TinyLM(nn.Module):
    """Embedding tied to the head (its gradient summed from two contributions), dropout, three blocks, and
    a layer the forward never calls (no gradient: its .grad stays None in every micro-batch)."""

    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(3)])
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.spare = nn.Linear(width, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.emb(ids)))


def _case() -> tuple[nn.Module, tuple[torch.Tensor, ...], Any]:
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 16))
    labels = torch.randint(0, 64, (4, 16))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, 64), labels.reshape(-1))

    return TinyLM().train(), (ids,), loss


def _profile(grads: str, optimizer: Any = torch.optim.AdamW) -> Any:
    model, args, loss = _case()
    return memviz.profile(model, args, loss_fn=loss, optimizer=optimizer, repeats=1, warmup=0,
                          grads=grads), args, loss


def _grad_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if not n.startswith("spare"))


def _sac(prof: Any) -> Any:
    try:
        return memviz.plan(prof, 0.8, strategy="sac")
    except InfeasibleBudget as refused:
        return memviz.plan(prof, refused.minimum_bytes, strategy="sac")


def test_gradients_are_held_from_the_start_and_eager_peak_is_predicted() -> None:
    """Every gradient is a data node alive from the start (the tied weight's once, the spare layer's none),
    counted by `Graph.held_bytes`; the eager peak predicted is the one measured with .grad present."""
    acc, _, _ = _profile("accumulate")
    default, _, _ = _profile("none")
    grads = _grad_bytes(acc.model)
    held = [d for d in acc.graph.datas if d.producer is None and d.kind is DataKind.PARAMETER_GRADIENT]
    assert sum(d.bytes for d in held) == grads
    assert acc.graph.held_bytes() - default.graph.held_bytes() == grads
    assert acc.graph.meta["grads"] == "accumulate" and "grads" not in default.graph.meta
    assert acc.baseline.peak_bytes > default.baseline.peak_bytes
    step, _, _ = _profile("accumulate", optimizer=None)  # the measured eager step runs no optimizer
    assert abs(step.baseline.peak_bytes - step.measured_peak_bytes) <= 0.02 * step.measured_peak_bytes, (
        step.baseline.peak_bytes, step.measured_peak_bytes)


def test_sac_plan_holds_in_an_accumulation_loop() -> None:
    """The applied sac plan of an accumulating profile measures at or under its plan over 4 micro-batches
    and AdamW's step; the default profile's plan measured over itself in the same loop (the trust bug)."""
    for grads, within in (("none", False), ("accumulate", True)):
        prof, args, loss = _profile(grads)
        plan = _sac(prof)
        peak = accumulation_peak(memviz.apply(plan, prof.model), args, {}, loss, 4)
        assert (peak <= plan.peak_bytes) is within, (grads, peak, plan.peak_bytes)


def test_apply_verify_runs_the_accumulating_step(tmp_path: Path) -> None:
    """apply(verify=True) measures the step with .grad held (the measured peak counts them) and compares
    accumulated gradients with eager's; the plan file carries the setting, and a loaded plan verifies
    the same."""
    prof, args, loss = _profile("accumulate")
    plan = _sac(prof)
    applied = memviz.apply(plan, prof.model, verify=True, inputs=(args, {}), loss_fn=loss)
    assert applied.verified_equal.equal is True
    grads = _grad_bytes(prof.model)
    assert plan.peak_bytes - grads < applied.verified_peak_bytes <= plan.peak_bytes
    plan.save(tmp_path / "plan.json")
    loaded = memviz.load_plan(tmp_path / "plan.json")
    assert loaded.graph.meta["grads"] == "accumulate"
    again = memviz.apply(loaded, prof.model, verify=True, inputs=(args, {}), loss_fn=loss)
    assert again.verified_peak_bytes == applied.verified_peak_bytes


# --- memviz.export of an accumulating plan ----------------------------------------------------------------
MICRO = 3  # micro-batches per AdamW step


def _tiny() -> Any:
    """`TinyLM` (a tied embedding, a layer without gradient) as a case: model, args, kwargs, losses."""
    from tests.real_models import RealCase

    model, args, loss = _case()
    return RealCase(model, args, {}, {"ce": loss})


def _gpt2() -> Any:
    """The zoo's tiny GPT-2 (dropout on) on 4 x 64 tokens; at the zoo's 2 x 16 no plan recomputes."""
    import transformers

    from tests.real_models import VOCAB, _causal_lm

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return _causal_lm(config, seq=64, batch=4)


def _resnet() -> Any:
    """Narrow torchvision BasicBlocks (BatchNorm, in-place ReLU, residual sums, a strided block with its
    downsample) on 16 images of 32 px: activations, not weights, fill the step."""
    from tests.real_models import _image_classifier  # first: it makes torchvision importable here

    BasicBlock = importlib.import_module("torchvision.models.resnet").BasicBlock  # noqa: N806

    torch.manual_seed(0)
    down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                        BasicBlock(16, 16), BasicBlock(16, 16), BasicBlock(16, 32, stride=2, downsample=down),
                        BasicBlock(32, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return _image_classifier(net, 32, 10, "torchvision", own=False, batch=16)


def _range_budget(prof: Any, point: float) -> int:
    """`point` of the range [auto's smallest feasible budget, the eager peak]."""
    try:
        memviz.plan(prof, prof.graph.persistent_bytes() + 1, strategy="auto", frontier=False, packing=False)
        low = prof.graph.persistent_bytes() + 1
    except InfeasibleBudget as refused:
        low = refused.minimum_bytes
    return low + int(point * (prof.baseline.peak_bytes - low))


def _round(model: nn.Module, opt: torch.optim.Optimizer, case: Any, loss_fn: Any, seed: int) -> list[Any]:
    """`MICRO` micro-batches (forward, ``loss / MICRO``, backward) into the same .grad, then AdamW's step and
    ``zero_grad()``: what each micro-batch's loss and the accumulated gradients were, in numpy memory (the
    tracker does not count it)."""
    from tests.test_zoo import Untracked

    seen = []
    for k in range(MICRO):
        torch.manual_seed(seed + k)  # each micro-batch its own dropout masks, the same on both sides
        loss = loss_fn(model(*case.args, **case.kwargs)) / MICRO
        seen.append(Untracked.of(loss.detach()))
        loss.backward()
        del loss
    seen.append(Untracked.of([p.grad for p in model.parameters() if p.grad is not None]))
    opt.step()
    opt.zero_grad()
    return seen


@pytest.mark.parametrize("make", [_tiny, pytest.param(_gpt2, marks=pytest.mark.slow),
                                  pytest.param(_resnet, marks=pytest.mark.slow)],
                         ids=["tiny", "gpt2", "tv_resnet"])
def test_exported_plan_holds_and_trains_as_eager(make: Any) -> None:
    """memviz.export of an accumulating plan at 75 % and 50 % of its range, in the user's loop (3
    micro-batches, then AdamW's step, twice): each round measures the plan's peak to the byte (the first
    micro-batch starts with .grad None, the bound case; the others add into it), and its losses,
    accumulated gradients and updated parameters equal eager's.  Before, export refused the plan."""
    import copy

    from memviz.profiling.tracker import measure_peak, tensors_of
    from memviz.runtime.verify import loss_only
    from tests.test_zoo import _assert_same, _assert_tree_same

    case = make()
    loss_fn = case.losses["ce"]
    prof = memviz.profile(case.model, case.args, case.kwargs, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                          repeats=1, warmup=0, grads="accumulate")
    saved = copy.deepcopy(case.model.state_dict())
    for point in (0.75, 0.5):
        plan = memviz.plan(prof, _range_budget(prof, point), strategy="auto", frontier=False, packing=False)
        assert plan.timeline.recomputes > 0, (point, plan.strategy)
        case.model.load_state_dict(saved)
        original = copy.deepcopy(case.model)
        exported = memviz.export(plan)
        opt_a, opt_b = torch.optim.AdamW(original.parameters()), torch.optim.AdamW(exported.parameters())
        for step in range(2):
            eager = _round(original, opt_a, case, loss_fn, 10 * step)
            held = tensors_of(exported, opt_b, (case.args, case.kwargs))
            labels, outside = loss_only(loss_fn, held, torch.device("cpu"))
            run = functools.partial(_round, exported, opt_b, case, loss_fn, 10 * step)
            peak, mine = measure_peak(run, held + labels)
            peak -= outside
            for k, (a, b) in enumerate(zip(eager, mine, strict=True)):  # losses, then the gradients
                _assert_tree_same(a, b, f"{point}: step {step}, {'gradients' if k == MICRO else f'loss {k}'}")
            for (name, a), b in zip(original.named_parameters(), exported.parameters(), strict=True):
                _assert_same(a.detach(), b.detach(), f"{point}: {name} after step {step}")
            if step:  # AdamW's state exists (the plan holds it from the start)
                # within 1 % under the plan: TinyLM's cross-entropy backward holds 384-512 B less than the
                # loss memory the profile measured, with grads='none' too; GPT-2 and ResNet to the byte
                assert plan.peak_bytes * 0.99 <= peak <= plan.peak_bytes, (point, plan.strategy, peak,
                                                                            plan.peak_bytes)
    case.model.load_state_dict(saved)


def test_export_verify_and_a_loaded_plan(tmp_path: Path) -> None:
    """export(verify=True) of an accumulating plan measures the step with .grad held (at the plan's peak)
    and compares accumulated micro-batches with eager's; the source it writes loads and runs the same
    step; a plan file loaded for the model re-captures it with .grad held (else its graph would not match)."""
    from memviz.runtime.export import load_source

    prof, args, loss = _profile("accumulate")
    plan = memviz.plan(prof, _range_budget(prof, 0.5), strategy="auto", frontier=False, packing=False)
    assert plan.timeline.recomputes > 0
    module = memviz.export(plan, path=tmp_path / "opt.py", verify=True, inputs=(args, {}), loss_fn=loss)
    assert module.verified_equal.equal is True
    assert module.verified_peak_bytes == plan.peak_bytes
    assert "into_grad(" in (tmp_path / "opt.py").read_text()
    loaded = memviz.load_plan(tmp_path / "opt.plan.json")
    again = memviz.export(loaded, model=prof.model, verify=True, inputs=(args, {}), loss_fn=loss)
    assert again.verified_peak_bytes == module.verified_peak_bytes and again.verified_equal.equal is True
    from_source = load_source(tmp_path / "opt.py", prof.model)
    assert from_source._generated is not None
    for p in prof.model.parameters():
        p.grad = None
    loss(from_source(*args)).backward()
    first = {n: p.grad.clone() for n, p in prof.model.named_parameters() if p.grad is not None}
    loss(from_source(*args)).backward()  # dropout draws differ, the sum is what matters: it grew
    assert all(not torch.equal(p.grad, first[n]) for n, p in prof.model.named_parameters() if n in first)
    for p in prof.model.parameters():
        p.grad = None


def test_arguments_are_checked_and_compiled_export_refused() -> None:
    """The exported step writes .grad itself, which a compiled segment cannot: torch.compile of it says so."""
    prof, args, loss = _profile("accumulate")
    exported = memviz.export(memviz.plan(prof, None, strategy="none"))
    with pytest.raises(ValueError, match="adds into .grad"):
        loss(torch.compile(exported, backend="aot_eager")(*args)).backward()
    model, args, loss = _case()
    with pytest.raises(ValueError, match="grads must be one of"):
        memviz.profile(model, args, grads="zero")
    with pytest.raises(ValueError, match="only makes sense with mode='train'"):
        memviz.profile(model, args, mode="inference", grads="accumulate")


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head, self.aux = nn.Linear(16, 16), nn.Linear(16, 4), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.body(x))
        return self.head(h), self.aux(h)


def test_a_parameter_the_loss_does_not_reach_keeps_its_grad() -> None:
    """Profiled with a loss over both heads, run with one that reads only the first: eager never runs the
    second head's AccumulateGrad, so its .grad stays None (first micro-batch) or as it was; the exported
    step, which adds a gradient of zeros there, leaves the same (before: zeros, which AdamW would then
    step with weight decay and momentum)."""
    import copy

    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(8, 16)
    prof = memviz.profile(model, (x,), loss_fn=lambda out: out[0].pow(2).mean() + out[1].pow(2).mean(),
                          repeats=1, warmup=0, grads="accumulate")
    exported, original = memviz.export(memviz.plan(prof, None, strategy="none")), copy.deepcopy(model)
    for module in (original, exported):
        for _ in range(2):
            module(x)[0].pow(2).mean().backward()
    assert model.aux.weight.grad is None and original.aux.weight.grad is None
    for (name, a), b in zip(original.named_parameters(), model.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad)), name
    held = torch.full_like(model.aux.weight, 0.5)
    model.aux.weight.grad = held.clone()
    exported(x)[0].pow(2).mean().backward()
    assert torch.equal(model.aux.weight.grad, held)
