"""Rockmate: block menus + rk-Rotor; never worse than rotor or sqrt; plans a 12-layer GPT quickly."""

from __future__ import annotations

import random

import pytest
from gpt_chain import gpt_graph
from graphs import chain_of_blocks, random_training_dag, transformer_blocks

from solvers import DataKind, block_milp, chain, eager_schedule, rockmate, rotor, simulate, sqrt
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


def test_gpt12_plans_with_block_classes():
    """A 12-layer GPT's blocks fall into a few classes whose MILPs run (how fast: bench_remat's
    "12-layer GPT" row, target 10 s; never a wall-clock assertion here)."""
    g = gpt_graph(12)
    assert len(g.computes) > 800
    budget = activation_budget(g, 0.5)
    res = rockmate.solve(g, budget)
    assert res.stats.extra["classes"] <= 8
    assert res.stats.extra["milp_classes"] >= 1
    assert not res.stats.extra["menus_cached"]
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


# --- rk-Checkmate block options (solvers.block_milp) -----------------------------------------------
def _small_blocks():
    """(chain, block) pairs whose saved data are few enough to enumerate every kept subset."""
    out = []
    for g in (gpt_graph(2, seq=32, hidden=64), transformer_blocks(2), chain_of_blocks(3)):
        ch = chain.decompose(g)
        seen = set()
        for b in ch.blocks:
            if b.klass not in seen and 2 <= len(b.saved) <= 6:
                seen.add(b.klass)
                out.append(pytest.param(ch, b, id=f"{g.name}-block{b.index}"))
    return out


def _option_schedule_checks(ch, b, option):
    """Expand `option` for block b (store-all elsewhere) into the full schedule: it must simulate valid
    and stay within the chain model's peak for that block-level sequence."""
    menus = [[chain.store_all(ch, x)] for x in ch.blocks]
    menus[b.index] = [menus[b.index][0], option]
    ops = [("F", k, int(k == b.index)) for k in range(len(ch.blocks))]
    ops += [("B", k, o) for _, k, o in reversed(ops)]
    schedule = chain.schedule_with_frees(ch.graph, rotor.expand(ch, menus, ops))
    tl = simulate(ch.graph, schedule).check()
    model = rotor.build_model(ch, menus, [chain.nosave(ch, x) for x in ch.blocks])
    peak, t = rotor.evaluate(model, ops)
    assert tl.peak_bytes <= max(ch.resident_bytes() + peak, rotor.tail_requirement(ch))
    assert tl.total_time == pytest.approx(t + sum(ch.graph.computes[c].time for c in ch.tail))


@pytest.mark.parametrize(("ch", "b"), _small_blocks())
def test_block_milp_no_slower_than_enumerated(ch, b):
    """At every budget pair of the grid, the MILP's proven optimum meets the pair once replayed and is
    no slower than any kept-subset option (every subset enumerated) that meets the pair and lies in
    the model's class (the MILP solved without a warm start, so this checks the model itself)."""
    every = [chain.store_all(ch, b), *(chain.block_option(ch, b, k) for k in rockmate._kept_sets(ch, b))]
    bm = block_milp.build(ch, b)
    in_class = [o for o in every if block_milp.start_values(ch, bm, o) is not None]
    assert len(in_class) * 2 >= len(every)  # the comparison is not vacuous
    solved = 0
    for s, p in block_milp.budget_pairs(bm, every, 5):
        res = block_milp.solve_pair(ch, bm, s, p, time_limit=30.0)
        rival = block_milp._fastest(in_class, s, p)
        if res.status == "infeasible":
            assert rival is None
            continue
        assert res.status == "optimal"
        o = res.option
        assert o.keep <= s and block_milp.peak(o) <= p
        if rival is not None:
            assert o.fwd_time + o.bwd_time <= rival.fwd_time + rival.bwd_time + 1e-15
        _option_schedule_checks(ch, b, o)
        solved += 1
    assert solved


def test_block_milp_recomputes_inside_the_backward():
    """On a GPT attention block the MILP finds an option no kept subset reaches: below every kept-subset
    option's peak at the smallest kept budget (by recomputing data more than once)."""
    g = gpt_graph(2, seq=32, hidden=64)
    ch = chain.decompose(g)
    b = max(ch.blocks, key=lambda x: len(x.saved))
    every = [chain.store_all(ch, b), *(chain.block_option(ch, b, k) for k in rockmate._kept_sets(ch, b))]
    bm = block_milp.build(ch, b)
    low = min(o.keep for o in every)
    best_peak = min(block_milp.peak(o) for o in every if o.keep == low)
    res = block_milp.solve_pair(ch, bm, low, best_peak - 1, time_limit=30.0)
    assert res.option is not None, res.status
    assert block_milp.peak(res.option) < best_peak
    assert len(res.option.backward) - len(set(res.option.backward)) > 0  # some node runs twice
    _option_schedule_checks(ch, b, res.option)


def test_pareto_keeps_store_all_first_and_drops_dominated():
    g = gpt_graph(2, seq=32, hidden=64)
    ch = chain.decompose(g)
    b = max(ch.blocks, key=lambda x: len(x.saved))
    every = [chain.store_all(ch, b), *(chain.block_option(ch, b, k) for k in rockmate._kept_sets(ch, b))]
    front = rockmate.pareto(every)
    assert front[0] is every[0] and len(front) < len(every)
    cost = rockmate._cost
    for o in every:  # everything dropped is matched or beaten on every axis by something kept
        assert any(all(a <= c for a, c in zip(cost(f), cost(o), strict=True)) for f in front)
    for f in front[1:]:
        assert not any(all(a <= c for a, c in zip(cost(x), cost(f), strict=True)) and cost(x) != cost(f)
                       for x in every)


@pytest.mark.slow
@pytest.mark.parametrize("g", [gpt_graph(2, seq=32, hidden=64), gpt_graph(3, seq=128, hidden=64, heads=8)],
                         ids=lambda g: g.name)
def test_milp_menus_never_worse(g):
    """Rockmate with the block MILP's options is never slower (simulated) than with the kept-subset
    menus alone at equal budgets, stays within budget, and its minimum budget is no larger."""
    lo_off, lo_on = _min_kw(g, milp_seconds=0), _min_kw(g)
    assert lo_on <= lo_off
    top = simulate(g, eager_schedule(g)).peak_bytes
    for i in range(6):
        budget = lo_on + (top - lo_on) * i // 6
        on, off = _cost_kw(g, budget), _cost_kw(g, budget, milp_seconds=0)
        assert on <= off + 1e-12, (budget, on, off)


@pytest.mark.slow
def test_milp_menus_help_a_captured_gpt():
    """On the example GPT captured in train mode (roofline times of fake:h100, so the test does not
    depend on this machine's timers), each attention block saves 12 tensors: too many to enumerate,
    and the MILP's options beat the greedy kept-subset families, at equal budgets and in the
    minimum budget."""
    import memviz
    from examples.models import gpt

    model, args = gpt(layers=2, seq=64, d=64, heads=4, vocab=128)
    g = memviz.profile(model, args, mode="train", device="fake:h100").graph
    assert max(len(b.saved) for b in chain.decompose(g).blocks) > rockmate.EXACT_SUBSETS
    lo_off, lo_on = _min_kw(g, milp_seconds=0), _min_kw(g, milp_seconds=8)
    assert lo_on < lo_off
    top = simulate(g, eager_schedule(g)).peak_bytes
    better = 0
    for i in range(1, 5):
        budget = lo_off + (top - lo_off) * i // 6
        on, off = _cost_kw(g, budget, milp_seconds=8), _cost_kw(g, budget, milp_seconds=0)
        assert on <= off + 1e-12, (budget, on, off)
        better += on < off * (1 - 1e-3)
    assert better >= 2


def _min_kw(g, **kw):
    with pytest.raises(InfeasibleBudget) as info:
        rockmate.solve(g, 0, **kw)
    return info.value.minimum_bytes


def _cost_kw(g, budget, **kw):
    try:
        tl = simulate(g, rockmate.solve(g, budget, **kw).schedule).check()
    except InfeasibleBudget:
        return float("inf")
    assert tl.peak_bytes <= budget
    return tl.total_time


def test_menus_cached_per_graph_and_milp_work():
    """A graph planned again (another budget, another time cap, the same MILP work) reuses its menus;
    menus without the MILPs are others."""
    g = transformer_blocks(2)
    top = simulate(g, eager_schedule(g)).peak_bytes
    low = _min_kw(g, milp_seconds=30)
    first = rockmate.solve(g, (low + top) // 2, milp_seconds=30).stats.extra
    again = rockmate.solve(g, low, milp_seconds=20).stats.extra
    other = rockmate.solve(g, low, milp_seconds=0).stats.extra
    assert first["menus_cached"] and again["menus_cached"] and not other["menus_cached"]
    assert first["options"] == again["options"]


def test_pair_solves_stop_at_the_work_left():
    """A pair solve given `work` stops at the HiGHS interrupt check that many simplex iterations in
    (counted, not timed), and a pair search gives each solve the work its run has left, so a run ends
    within its share (plus about a check's iterations), never a whole solve past it (on a 1k-op GPT one
    solve took 42k iterations on a share of a few thousand, until its 10 s cap)."""
    g = gpt_graph(2, seq=32, hidden=64)
    ch = chain.decompose(g)
    b = max(ch.blocks, key=lambda x: len(x.saved))
    every = [chain.store_all(ch, b), *(chain.block_option(ch, b, k) for k in rockmate._kept_sets(ch, b))]
    bm = block_milp.build(ch, b)
    in_class = [o for o in every if block_milp.start_values(ch, bm, o) is not None]
    share = 100
    for s, p in block_milp.budget_pairs(bm, every, 5):  # a pair whose solve needs more than the share
        start = block_milp._fastest(in_class, s, p)
        if block_milp.solve_pair(ch, bm, s, p, time_limit=30.0, start=start).iterations > 2 * share:
            break
    else:
        raise AssertionError("no pair needs more work than the share: the bound below would be vacuous")
    capped = block_milp.solve_pair(ch, bm, s, p, time_limit=30.0, start=start, work=share)
    slack = 2 * block_milp.ITERATIONS_PER_CHECK
    assert capped.iterations <= share + slack and not capped.cut  # its incumbent, if any, is kept
    search = block_milp.PairSearch(ch, bm, every)
    search.run(5, float("inf"), max_work=share)
    assert search.solves >= 1 and search.work <= share + block_milp.SOLVE_BASE_WORK + slack
