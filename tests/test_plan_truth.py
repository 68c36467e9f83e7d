"""A plan's measured peak is its prediction, whichever schedule the solvers pick (DESIGN.md "Correctness
means": within 1% of the plan, never over the budget).

Solvers rank schedules by measured, noisy op times, so a loaded machine gets other schedules than a quiet
one: `test_real_models[mistral-checkmate-0.25]` once measured 459,152 B against its plan's 450,700 and its
budget 457,001, under load only.  Here the load is replaced by seeded random factors on the op times
(2**U(-1, 1), 0.5x to 2x per op) and Rockmate's block MILPs are off (`MILP_SECONDS = 0`: its menus are
the kept-subset options, a DP with no time limit in play), so the same schedule comes back on any machine.
Rockmate's plan at 81% of Mistral's eager peak computes the loss twice (with the last block of its chain:
in the forward sweep and again before the backward); the export runs the user's loss once, after its
forward returns, so it ran the recomputations between the two with the model's outputs still held (that
flake, reproduced: measured 459,152 B against the plan's 450,700 and the budget 457,001).  memviz.plan now
plans the schedule the export runs (`solvers.schedule.run_turn_once`).
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

import memviz
from memviz.profiling.capture import summed_as_eager
from memviz.profiling.profile import Profile
from memviz.profiling.tracker import measure_peak, tensors_of
from solvers import simulate
from tests.test_real_models import PLAN_TOLERANCE, _step, profiled
from tests.test_zoo import _fresh

#: (model, strategy, budget as a fraction of the eager peak, seed of the op-time factors): before the fix
#: each exported step measured 8,452 B over its plan: Mistral 459,152 B (plan 450,700, budget 457,332),
#: Llama 457,088 B (plan 448,636, +1.9%)
CASES = [("mistral", "rockmate", 0.81, 1), ("llama", "rockmate", 0.81, 2)]


def perturbed(prof: Profile, seed: int) -> Profile:
    """`prof` with every op's time scaled by a seeded factor in [0.5, 2]: what a loaded machine measures."""
    rng = random.Random(seed)
    computes = tuple(dataclasses.replace(c, time=c.time * 2 ** rng.uniform(-1, 1))
                     for c in prof.graph.computes)
    graph = dataclasses.replace(prof.graph, computes=computes)
    # the baseline timed on the same op times, as the profile's (`Profile.with_costs`)
    return dataclasses.replace(prof, graph=graph,
                               baseline=simulate(summed_as_eager(graph), prof.baseline_schedule).check())


@pytest.mark.parametrize(("name", "strategy", "fraction", "seed"), CASES,
                         ids=[f"{n}-{s}-{f}-seed{k}" for n, s, f, k in CASES])
def test_plans_from_perturbed_op_times_measure_their_prediction(name: str, strategy: str, fraction: float,
                                                                  seed: int, monkeypatch) -> None:
    import solvers.rockmate

    monkeypatch.setattr(solvers.rockmate, "MILP_SECONDS", 0.0)
    case, loss, prof = profiled(name)
    loss_fn = case.losses[loss]
    budget = int(fraction * prof.baseline.peak_bytes)
    plan = memviz.plan(perturbed(prof, seed), budget, strategy=strategy, time_limit=600.0, frontier=False,
                       packing=False)
    saved = {k: v.clone() for k, v in case.model.state_dict().items()}
    try:
        exported = memviz.export(plan)
        opt = torch.optim.AdamW(exported.parameters())
        for i in range(2):  # the second step holds AdamW's state, as the plan does
            inputs = _fresh((case.args, case.kwargs))
            peak, _ = measure_peak(functools.partial(_step, exported, loss_fn, opt, inputs, i),
                                   tensors_of(exported, opt, inputs))
            opt.zero_grad()
        assert peak <= budget, f"measured {peak}, over the budget {budget} (plan {plan.peak_bytes})"
        assert abs(peak - plan.peak_bytes) <= PLAN_TOLERANCE * plan.peak_bytes, (peak, plan.peak_bytes)
    finally:
        case.model.load_state_dict(saved)
        for p in case.model.parameters():
            p.grad = None
