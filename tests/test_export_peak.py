"""The exported step's measured peak honours its plan: one regression test per way the two disagreed.

`solvers.simulate` is the plan's timeline; `memviz.tracker.measure_peak` what the exported module and
the user's optimizer really hold.  Each test is a small model reproducing one cause."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memviz
from memviz.profile import profile
from memviz.tracker import measure_peak, tensors_of
from solvers import Phase
from solvers.result import InfeasibleBudget

PLAN_TOLERANCE = 0.01


def _plan_at_minimum(prof, strategy: str):
    """memviz.plan at the smallest budget `strategy` reports feasible."""
    try:
        return memviz.plan(prof, prof.graph.persistent_bytes() + 1, strategy=strategy, time_limit=10,
                           frontier=False, packing=False)
    except InfeasibleBudget as err:
        assert err.minimum_bytes is not None
        return memviz.plan(prof, err.minimum_bytes, strategy=strategy, time_limit=10, frontier=False,
                           packing=False)


def _steady_peak(module: nn.Module, x: torch.Tensor, target: torch.Tensor) -> int:
    """Measured peak of the second AdamW step (the first creates the state the plan holds from the
    start): forward, loss, backward and the optimizer's update."""
    opt = torch.optim.AdamW(module.parameters())

    def step() -> None:
        nn.functional.mse_loss(module(x), target).backward()
        opt.step()

    peak = 0
    for _ in range(2):
        peak, _ = measure_peak(step, tensors_of(module, opt, x, target))
        opt.zero_grad()
    return peak


@pytest.mark.parametrize("strategy", ["checkmate", "rockmate", "rotor"])
def test_the_optimizer_update_is_planned(strategy):
    """Wide layers, small activations: the step peaks in AdamW's update (its temporaries beside the
    parameters, gradients and state).  Checkmate used to schedule only the computes that produce
    something, dropping the optimizer's (they update in place), so its plan ended with the backward
    and the user's optimizer measured 46% over it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU(), nn.Linear(384, 16))
    x, target = torch.randn(4, 16), torch.randn(4, 16)
    prof = profile(model, (x,), loss_fn=lambda out: nn.functional.mse_loss(out, target),
                   optimizer=torch.optim.AdamW, repeats=1, warmup=0, measure=False)
    plan = _plan_at_minimum(prof, strategy)
    updates = {c.id for c in plan.graph.computes if c.phase is Phase.OPTIMIZER}
    assert updates and updates <= {s.node for s in plan.schedule if s.op == "compute"}
    peak = _steady_peak(memviz.export(plan), x, target)
    assert peak <= plan.budget_bytes, (peak, plan.budget_bytes)
    assert abs(peak - plan.peak_bytes) <= PLAN_TOLERANCE * plan.peak_bytes, (peak, plan.peak_bytes)
