"""Rockmate: block menus + rk-Rotor; never worse than rotor or sqrt; plans a 12-layer GPT quickly."""

from __future__ import annotations

import random
import time

import pytest
from gpt_chain import gpt_graph
from graphs import chain_of_blocks, random_training_dag, transformer_blocks

from solvers import DataKind, eager_schedule, rockmate, rotor, simulate, sqrt
from solvers.result import InfeasibleBudget


def _min(mod, g):
    with pytest.raises(InfeasibleBudget) as info:
        mod.solve(g, 0)
    return info.value.minimum_bytes


def _cost(mod, g, budget):
    try:
        tl = simulate(g, mod.solve(g, budget).schedule).check()
    except InfeasibleBudget:
        return float("inf")
    assert tl.peak_bytes <= budget
    return tl.total_time


GRAPHS = [transformer_blocks(2), chain_of_blocks(4), gpt_graph(2, seq=32, hidden=64),
          random_training_dag(random.Random(5), 12)]


@pytest.mark.parametrize("g", GRAPHS, ids=lambda g: g.name)
def test_rockmate_le_rotor_le_sqrt(g):
    lo_rk, lo_rt = _min(rockmate, g), _min(rotor, g)
    assert lo_rk <= lo_rt
    assert simulate(g, rockmate.solve(g, lo_rk).schedule).check().peak_bytes <= lo_rk
    top = simulate(g, eager_schedule(g)).peak_bytes
    prev = float("inf")
    for i in range(6):
        budget = lo_rk + (top - lo_rk) * i // 5
        rk, rt, sq = _cost(rockmate, g, budget), _cost(rotor, g, budget), _cost(sqrt, g, budget)
        assert rk <= rt + 1e-12 and rt <= sq + 1e-12, (budget, rk, rt, sq)
        assert rk <= prev + 1e-12
        prev = rk


def activation_budget(g, fraction: float) -> int:
    """Persistent data + parameter gradients + `fraction` of the rest of eager's peak."""
    floor = g.persistent_bytes() + sum(d.bytes for d in g.datas if d.kind == DataKind.PARAMETER_GRADIENT)
    return floor + int(fraction * (simulate(g, eager_schedule(g)).peak_bytes - floor))


def test_gpt12_plans_fast():
    g = gpt_graph(12)
    assert len(g.computes) > 800
    budget = activation_budget(g, 0.5)
    start = time.perf_counter()
    res = rockmate.solve(g, budget)
    elapsed = time.perf_counter() - start
    assert elapsed <= 10.0, elapsed
    assert res.stats.extra["classes"] <= 8
    tl = simulate(g, res.schedule).check()
    assert tl.peak_bytes <= budget


@pytest.mark.parametrize("seed", range(4))
def test_never_below_the_exhaustive_optimum(seed):
    """On graphs small enough for exhaustive search, no chain plan beats the true optimum (a plan
    that did would expose a simulator or expansion bug) and each minimum budget is at least the true
    one."""
    from bruteforce import min_budget, optimum

    g = random_training_dag(random.Random(100 + seed), 3)
    true_min = min_budget(g)
    for mod in (rockmate, rotor, sqrt):
        low = _min(mod, g)
        assert low >= true_min
        for budget in (low, (low + simulate(g, eager_schedule(g)).peak_bytes) // 2):
            best = optimum(g, budget)
            assert best is not None
            assert _cost(mod, g, budget) >= best.time - 1e-9
