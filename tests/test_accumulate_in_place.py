"""Issue 21 item 1: a parameter used twice (tied embeddings) gets its two gradient contributions summed
in place, as autograd's input buffer does, in the plan (`capture.accumulate_in_place`,
`ComputeNode.mutates`) and in the exported module (``add_``).  The joint graph's out-of-place ``add``
held both contributions and the sum at once: one gradient above eager at the backward's end, the floor
of every plan on GPT2-large."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memviz
from examples import models
from memviz.plans.planning import minimum_budget
from memviz.profiling.capture import default_loss, summed_as_eager
from memviz.profiling.profile import profile
from memviz.profiling.tracker import measure_peak, tensors_of
from solvers import DataKind
from solvers.result import InfeasibleBudget

VOCAB, D = 1024, 32
WTE = VOCAB * D * 4  # one gradient of the tied embedding (fp32)


@pytest.fixture(scope="module")
def tied():
    """A GPT whose tied embedding's gradient outweighs its activations (GPT2-large's case), profiled on
    the CPU; no optimizer in the graph (AdamW's update would be the peak: the user's optimizer runs
    after the backward, which is what the plan decides)."""
    model, args = models.gpt(batch=2, seq=16, d=D, heads=4, layers=2, vocab=VOCAB, dropout=0.0)
    return model, args, profile(model, args, repeats=1, warmup=0, measure=False)


def test_the_tied_gradient_sum_writes_its_first_contribution(tied):
    _, _, prof = tied
    g, cap = prof.graph, prof.captured
    (add,) = [c for c in g.computes if c.mutates]
    (first,) = add.mutates
    token = g.datas[add.outputs[0]]
    assert cap.grad_data["wte.weight"] == token.id and token.bytes == 0  # the sum: its FX value, no storage
    assert g.datas[first].kind is DataKind.PARAMETER_GRADIENT and g.datas[first].bytes == WTE
    assert first in g.outputs and g.consumers(first) == (add.id,)
    # produced first: lm_head's contribution, at the start of the backward
    other = next(d for d in add.inputs if d != first)
    assert g.datas[first].producer < g.datas[other].producer


@pytest.mark.parametrize("strategy", ["rotor", "rockmate"])
def test_the_minimum_drops_by_one_gradient(tied, strategy):
    _, _, prof = tied
    before, after = (minimum_budget(x, strategy, 600.0) for x in (summed_as_eager(prof.graph), prof.graph))
    assert 0.9 * WTE <= before - after <= WTE, (before, after)


Steps = tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]


def _adamw_steps(module: nn.Module, args: tuple, n: int) -> Steps:
    """Losses and parameter gradients of `n` AdamW training steps."""
    opt = torch.optim.AdamW(module.parameters())
    losses, grads = [], []
    for _ in range(n):
        loss = default_loss(module(*args))
        loss.backward()
        losses.append(loss.detach())
        # keyed without the exported module's ``_orig_mod.`` prefix
        grads.append({k.removeprefix("_orig_mod."): p.grad.clone() for k, p in module.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads


def test_the_plan_at_the_minimum_exports_exact_and_measures_its_peak(tied):
    model, args, prof = tied
    try:
        plan = memviz.plan(prof, prof.graph.persistent_bytes() + 1, strategy="rockmate", time_limit=600,
                           frontier=False, packing=False)
    except InfeasibleBudget as err:
        plan = memviz.plan(prof, err.minimum_bytes, strategy="rockmate", time_limit=600, frontier=False,
                           packing=False)
    # below what any plan of the out-of-place graph reaches
    assert plan.peak_bytes <= minimum_budget(summed_as_eager(prof.graph), "rockmate", 600.0) - 0.9 * WTE
    reference = copy.deepcopy(model)
    exported = memviz.export(plan, model=copy.deepcopy(model))
    assert "= torch.ops.aten.add_.Tensor" in exported.program.source  # the sum runs in place
    (want_losses, want_grads), (losses, grads) = (_adamw_steps(m, args, 3) for m in (reference, exported))
    for step in range(3):
        assert torch.equal(losses[step], want_losses[step])
        for name, g in want_grads[step].items():
            assert torch.equal(grads[step][name], g), (step, name)
    # forward, loss and backward of a step (the gradients are created by it, as the plan assumes)
    module = memviz.export(plan, model=copy.deepcopy(model))
    for _ in range(2):
        module.zero_grad(set_to_none=True)
        peak, _ = measure_peak(lambda: default_loss(module(*args)).backward(), tensors_of(module, args))
    assert peak <= plan.budget_bytes, (peak, plan.budget_bytes)
    assert abs(peak - plan.peak_bytes) <= 0.01 * plan.peak_bytes, (peak, plan.peak_bytes)


def test_the_update_reads_the_summed_storage_after_the_sum(tied):
    """The optimizer's update of the tied weight reads the sum's token (it runs after the sum) and the
    storage the sum wrote: OLLA's freed-after-update view (`free_updated_gradients`) then frees that
    gradient after its update, not after the sum, which would drop what the update reads."""
    from memviz.hardware.devices import named_device
    from memviz.profiling.profile import add_optimizer
    from solvers.olla import free_updated_gradients

    _, _, prof = tied
    g = add_optimizer(prof.graph, prof.captured.grad_data, torch.optim.SGD, named_device("fake:v100"))
    (add,) = [c for c in g.computes if c.mutates]
    (update,) = [c for c in g.computes if add.outputs[0] in c.inputs]
    assert add.mutates[0] in update.inputs
    assert add.mutates[0] not in free_updated_gradients(g).outputs


def test_the_baseline_is_eager_and_a_saved_plan_loads(tied, tmp_path):
    """Eager sums into lm_head's transposed contribution and copies the sum into the parameter's layout
    (one gradient more at the backward's end): the profile's baseline, the eager schedule simulated on
    `summed_as_eager`, is what eager measures; the same order on the plan's graph is what the exported
    module measures, one gradient less.  A plan file carries the baseline's graph and loads."""
    model, args, prof = tied
    assert prof.baseline_graph is not None
    model.zero_grad(set_to_none=True)
    eager, _ = measure_peak(lambda: default_loss(model(*args)).backward(), tensors_of(model, args))
    assert eager == prof.baseline.peak_bytes
    plan = memviz.plan(prof, None, strategy="none", frontier=False, packing=False)
    assert 0.9 * WTE <= plan.baseline.peak_bytes - plan.peak_bytes <= WTE
    loaded = memviz.load_plan(plan.save(tmp_path / "plan.json"))
    assert loaded.baseline.peak_bytes == plan.baseline.peak_bytes and loaded.peak_bytes == plan.peak_bytes


def test_a_sac_plan_holds_what_checkpointing_holds(tied):
    """`memviz.apply` runs eager autograd, which ends the backward one gradient higher than the in-place
    sum: a "sac" plan is made on the baseline's graph, so the applied model measures its plan (before,
    a plan of the in-place graph measured 21% over it and over its budget)."""
    model, args, prof = tied
    plan = memviz.plan(prof, prof.baseline.peak_bytes, strategy="sac")
    applied = memviz.apply(plan, copy.deepcopy(model))
    for _ in range(2):
        applied.zero_grad(set_to_none=True)
        peak, _ = measure_peak(lambda: default_loss(applied(*args)).backward(), tensors_of(applied, args))
    assert peak <= plan.budget_bytes, (peak, plan.budget_bytes)
    assert abs(peak - plan.peak_bytes) <= 0.01 * plan.peak_bytes, (peak, plan.peak_bytes)
