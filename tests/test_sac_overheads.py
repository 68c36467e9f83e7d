"""Issue 19 item 4: what checkpointing itself costs, counted by the sac menu and cheap in `memviz.apply`.

A selective region runs PyTorch's caching dispatch modes and memviz's policy in Python on every operator
it dispatches; measured on CPU (tiny GPT-2), saving the matmuls that way was slower than recomputing
them.  The menu compares candidates by op times plus `solvers.sac.Overheads`, so at equal memory it
prefers the option that runs faster, and a sac plan's `time_overhead` includes those costs.  The costs
are calibrated at profile time on one of the model's blocks run alone (`memviz.plans.sac.checkpoint_costs`,
`solvers.sac.calibrate`) and kept in the profile, so planning times nothing (issue 18 item 4)"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from memviz.plans.planning import MIN_STEP_SHARE, fixed_costs
from memviz.plans.sac import (
    COSTS_VERSION,
    candidate_blocks,
    dispatched_counts,
    eager_holds,
    overheads,
    policy,
    time_ratio,
)
from solvers import simulate
from solvers.sac import Overheads, Region, block_regions, calibrate, sac_schedule, solve_menu
from tests.test_apply import _example, sac_plan


def _menu(name: str) -> tuple[Any, Any, list, Any]:
    _, _, prof = _example(name)
    graph = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    return prof, graph, candidate_blocks(prof.model, graph, prof.captured), eager_holds(prof.captured, graph)


def _regions(blocks: list, options: tuple[str, ...]) -> tuple[Region, ...]:
    return tuple(r for b, o in zip(blocks, options, strict=True) for r in block_regions(b, o))


def test_policy_cost_moves_the_menu_from_saved_matmuls_to_full_recomputation() -> None:
    """At a budget that both saving every block's matmuls and recomputing every block meet, the menu
    without overheads keeps matmuls somewhere (cheaper in op times); with a per-op policy cost it plans
    no selective region, still within the budget, and reports the costs of the regions it chose."""
    _, graph, blocks, holds = _menu("gpt")
    budget = max(simulate(graph, sac_schedule(graph, _regions(blocks, (o,) * len(blocks)), holds)).check()
                 .peak_bytes for o in ("matmuls", "full"))
    _, free = solve_menu(graph, budget, blocks, holds, time_limit=20.0)
    assert "matmuls" in free.options and free.overhead_s == 0.0
    costly = Overheads(policy=1.0)  # per dispatched op: above what any recomputed matmul costs here
    _, paid = solve_menu(graph, budget, blocks, holds, time_limit=20.0, overheads=costly)
    assert "matmuls" not in paid.options, paid.options
    assert paid.timeline.peak_bytes <= budget
    assert paid.overhead_s == costly.seconds(graph, paid.regions, holds) == 0.0  # no policy runs
    assert paid.step_s < costly.seconds(graph, free.regions, holds) + free.timeline.total_time


def test_overheads_count_reruns_and_policy_passes() -> None:
    """A full-recompute region pays `rerun` on every dispatched operator its recomputation runs (up to
    the last op that saved something) and never the policy; a selective one pays the policy on every
    dispatched operator of its forward and again on every one its recomputation runs, kept ones
    included (they are dispatched, their kernels are not), and `rerun` on the same ones."""
    _, graph, blocks, holds = _menu("gpt")
    name, ids, mm = blocks[0][:3]
    last = max(c for c in ids if c in holds.release)
    assert last < ids[-1] and mm & {c for c in ids if c <= last}  # early stop, and kept ops it re-runs
    dispatched = {c: 2 + c % 3 for c in ids}
    forward = sum(dispatched[c] for c in ids)
    rerun = sum(dispatched[c] for c in ids if c <= last)
    full, selective = Region(name, ids), Region(name, ids, mm)
    assert Overheads(rerun=1.0, dispatched=dispatched).seconds(graph, (full,), holds) == rerun
    assert Overheads(policy=1.0, dispatched=dispatched).seconds(graph, (full,), holds) == 0.0
    assert Overheads(policy=1.0, dispatched=dispatched).seconds(graph, (selective,), holds) == forward + rerun
    assert Overheads(rerun=1.0, dispatched=dispatched).seconds(graph, (selective,), holds) == rerun
    both = Overheads(rerun=0.25, policy=0.5, dispatched=dispatched)
    assert both.seconds(graph, (full, selective), holds) == 0.5 * rerun + 0.5 * (forward + rerun)
    # the ops each recomputation runs: all up to the last saving op for full, the kept ones skipped
    assert both.passes(graph, full, holds) == (forward, rerun, sum(graph.computes[c].time for c in ids
                                                                   if c <= last))
    assert both.passes(graph, selective, holds)[2] == sum(graph.computes[c].time for c in ids
                                                          if c <= last and c not in mm)


def test_calibrate_inverts_the_accounting() -> None:
    """`calibrate` reads the two per-operator costs back from a block's three measured times: what the
    checkpointed runs cost beyond eager, less their recomputed op times, over the operators counted."""
    _, graph, blocks, holds = _menu("gpt")
    name, ids, mm = blocks[0][:3]
    dispatched = {c: 1 + c % 2 for c in ids}
    full, selective = Region(name, ids), Region(name, ids, mm)
    block = sum(c.time for c in graph.computes if c.module == name or c.module.startswith(name + "."))
    for scale in (1.0, 0.5, 1.8):  # the block ran in step as fast as its ops timed alone, 2x, 1/1.8x
        truth = Overheads(rerun=3e-5, policy=2e-5, dispatched=dispatched, scale=scale)
        eager = scale * block
        full_s = eager + truth.passes(graph, full, holds)[2] + truth.region_seconds(graph, full, holds)
        sel_s = (eager + truth.passes(graph, selective, holds)[2]
                 + truth.region_seconds(graph, selective, holds))
        got = calibrate(graph, full, selective, holds, dispatched, eager_s=eager, full_s=full_s,
                        selective_s=sel_s)
        assert got.scale == pytest.approx(scale, rel=1e-9)
        assert got.rerun == pytest.approx(truth.rerun, rel=1e-9)
        assert got.policy == pytest.approx(truth.policy, rel=1e-9)
        # what the region costs beyond eager is what the block measured, at any drift of the op times
        ops = got.passes(graph, full, holds)[2]
        assert ops + got.region_seconds(graph, full, holds) == pytest.approx(full_s - eager, rel=1e-9)
    # timing noise below the op times: no negative cost
    low = calibrate(graph, full, selective, holds, dispatched, eager_s=eager, full_s=eager, selective_s=eager)
    assert (low.rerun, low.policy) == (0.0, 0.0)


def test_calibrate_separates_the_cost_per_checkpoint_call() -> None:
    """With small pieces of the block timed checkpointed alone (its elementwise sub-modules, "pointwise";
    here any two pairs of ops that save something), `calibrate` tells the cost per checkpoint call from
    the cost per re-run operator, so the menu does not price many small regions as a few operators."""
    _, graph, blocks, holds = _menu("gpt")
    name, ids, mm = blocks[0][:3]
    pairs = [Region(f"piece{i}", ids[i:i + 2]) for i in range(0, len(ids) - 1, 2)]
    parts = [r for r in pairs if Overheads().passes(graph, r, holds)[1]][:2]
    assert len(parts) == 2
    dispatched = {c: 1 + c % 2 for c in ids}
    truth = Overheads(rerun=3e-5, policy=2e-5, dispatched=dispatched, scale=1.5, region=4e-4)
    full, selective = Region(name, ids), Region(name, ids, mm)
    eager = 1.5 * sum(c.time for c in graph.computes if c.module == name or c.module.startswith(name + "."))

    def timed(regions: list[Region]) -> float:
        return eager + sum(truth.passes(graph, r, holds)[2] + truth.region_seconds(graph, r, holds)
                           for r in regions)

    got = calibrate(graph, full, selective, holds, dispatched, eager_s=eager, full_s=timed([full]),
                    selective_s=timed([selective]), pieces=parts, pieces_s=timed(parts))
    assert (got.rerun, got.policy, got.scale, got.region) == pytest.approx(
        (truth.rerun, truth.policy, truth.scale, truth.region), rel=1e-9)
    assert got.seconds(graph, parts, holds) == pytest.approx(truth.seconds(graph, parts, holds), rel=1e-9)


def test_dispatched_counts_fold_views_into_ops() -> None:
    """Every forward op of a block stands for itself and the views before it: the block dispatches
    more operators than it has graph nodes (what the policy's modes run on)."""
    prof, graph, blocks, _ = _menu("gpt")
    counts = dispatched_counts(prof.captured, graph)
    ids = blocks[0].nodes
    assert all(counts.get(c, 1) >= 1 for c in ids)
    assert sum(counts.get(c, 1) for c in ids) > len(ids)


def _costed(prof: Any, rerun: float, policy: float, scale: float | None = None) -> Any:
    """`prof` holding the checkpointing costs `rerun`, `policy` and `scale` (as `checkpoint_costs` stores
    them; None: a profile from before the scale was measured)."""
    def meta(graph: Any) -> Any:
        costs = {"sac_costs": COSTS_VERSION, "sac_rerun_s": rerun, "sac_policy_s": policy}
        kept = {k: v for k, v in graph.meta.items() if k != "sac_scale"}
        scaled = {} if scale is None else {"sac_scale": scale}
        return dataclasses.replace(graph, meta={**kept, **costs, **scaled})

    eager = None if prof.baseline_graph is None else meta(prof.baseline_graph)
    return dataclasses.replace(prof, graph=meta(prof.graph), baseline_graph=eager)


def test_sac_plan_time_overhead_counts_checkpointing_costs() -> None:
    """A sac plan that checkpoints something predicts its step time with checkpointing's costs (the ones
    its profile holds) on top of the recomputed op times, over eager's step as measured."""
    prof, graph, _, holds = _menu("gpt")
    prof = _costed(prof, 2e-5, 1e-5)
    plan = sac_plan(prof, 0.85)
    sac = plan.solver_stats.extra["sac"]
    assert sac["regions"] and sac["costs"] == {"rerun_s": 2e-5, "policy_s": 1e-5, "scale": 1.0,
                                                "region_s": 0.0, "measured": True}
    blocks = candidate_blocks(prof.model, graph, prof.captured)
    regions = [Region(r.name, r.nodes, r.save) for r in _regions(blocks, tuple(sac["options"].values()))]
    costed = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    expected_s = overheads(prof, costed).seconds(graph, regions, holds)
    assert sac["overhead_s"] == expected_s > 0
    fixed = float(graph.meta.get("eager_fixed_s", 0.0))
    if plan.baseline.total_time + fixed < MIN_STEP_SHARE * plan.baseline.total_time:
        fixed = 0.0  # a step measured far below its own op times (load): not taken as the step
    expected = (plan.timeline.total_time + sac["overhead_s"] + fixed) / (plan.baseline.total_time + fixed)
    assert plan.time_overhead == time_ratio(plan) == expected
    assert plan.time_overhead > (plan.timeline.total_time + fixed) / (plan.baseline.total_time + fixed)


def test_time_ratio_takes_eager_step_below_its_op_times() -> None:
    """Op times timed alone can add up to more than the measured step (a CPU ResNet's convolutions): the
    ratio is over the step as measured, unless that is under half the op times (spoilt by load)."""
    prof, graph, _, _ = _menu("gpt")
    plan = sac_plan(_costed(prof, 2e-5, 1e-5), 0.85)
    base, total = plan.baseline.total_time, plan.timeline.total_time
    extra = plan.solver_stats.extra["sac"]["overhead_s"]
    for fixed, taken in ((-0.2 * base, -0.2 * base), (-0.8 * base, 0.0), (0.3 * base, 0.3 * base)):
        plan.graph.meta["eager_fixed_s"] = fixed
        assert time_ratio(plan) == pytest.approx((total + extra + taken) / (base + taken), rel=1e-12)


def test_a_sac_plan_is_a_function_of_its_profile(monkeypatch: Any) -> None:
    """Issue 18 item 4 for sac plans: checkpointing's costs are measured with the profile, so planning
    times nothing and the same profile gives the same plan (this process or another: the costs are in
    the profile's graph metadata, saved with every plan), and other costs in the profile decide it."""
    import memviz.hardware.accelerator as accelerator

    prof = _costed(_menu("gpt")[0], 2e-5, 1e-5)

    def no_timing(*_: Any) -> Any:
        raise AssertionError("a sac plan timed something")

    monkeypatch.setattr(accelerator, "timed", no_timing)
    first, second = sac_plan(prof, 0.6), sac_plan(prof, 0.6)
    assert first.schedule == second.schedule
    assert first.solver_stats.extra["sac"] == second.solver_stats.extra["sac"]
    meta = first.to_dict()["graph"]["meta"]
    assert (meta["sac_costs"], meta["sac_rerun_s"], meta["sac_policy_s"]) == (COSTS_VERSION, 2e-5, 1e-5)
    other = sac_plan(_costed(prof, 4e-5, 3e-5), 0.6).solver_stats.extra["sac"]
    assert other["overhead_s"] > first.solver_stats.extra["sac"]["overhead_s"]
    assert other["costs"]["rerun_s"] == 4e-5
    # a profile without them (made before they were measured, or of another version) counts none
    stale = dataclasses.replace(prof, graph=dataclasses.replace(prof.graph, meta={**prof.graph.meta,
                                                                                  "sac_costs": 0}),
                                baseline_graph=None)
    assert overheads(stale, stale.graph) == Overheads()


def test_profile_measures_checkpointing_costs_and_leaves_the_model_as_it_was() -> None:
    """`memviz.profile` times one block alone (eager, checkpointed keeping nothing, keeping its matmuls)
    and stores the per-operator costs; the model's BatchNorm statistics and the RNG stream are untouched,
    and the block's copies are freed when it returns, not left to Python's cycle collector (on a GPU they
    held 49 MiB of GPT-2 block copies and gradients through every step that export's verify measured)."""
    from examples.models import EXAMPLES
    from memviz.plans.sac import checkpoint_costs
    from memviz.profiling.capture import summed_as_eager

    model, args = EXAMPLES["resnet"]()
    _, _, prof = _example("resnet")
    graph = summed_as_eager(prof.graph)
    buffers = [b.clone() for b in model.buffers()]
    torch.manual_seed(7)
    gc.collect()
    gc.disable()
    try:
        costs = checkpoint_costs(graph, prof.captured, model, args, None, torch.device("cpu"), 1, 0)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [o for o in gc.garbage if type(o) in (torch.Tensor, torch.nn.Parameter)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not cyclic, [tuple(t.shape) for t in cyclic]
    drawn = torch.rand(4)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(4))
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    blocks = candidate_blocks(model, graph, prof.captured)
    assert costs["sac_costs"] == COSTS_VERSION and costs["sac_block"] == blocks[0][0]
    assert costs["sac_rerun_s"] >= 0 and costs["sac_policy_s"] >= 0
    assert min(costs[f"sac_block_{k}_s"] for k in ("eager", "full", "selective")) > 0
    stored = {k: v for k, v in prof.graph.meta.items() if k.startswith("sac_")}
    assert set(stored) == set(costs) and stored["sac_costs"] == COSTS_VERSION


def test_policy_counts_only_ops_a_plan_can_keep() -> None:
    """The policy `memviz.apply` runs in every dispatched op: views are recomputed without being
    counted; the n-th countable op of its name is saved when the plan keeps (name, n)."""
    ctx = SelectiveCheckpointContext(is_recompute=False)
    seen: dict[str, int] = {}
    save = {"addmm": frozenset({1})}
    ops = [torch.ops.aten.view.default, torch.ops.aten.addmm.default, torch.ops.aten.t.default,
           torch.ops.aten.addmm.default, torch.ops.aten.addmm.default]
    got = [policy(save, seen, ctx, op) for op in ops]
    keep, drop = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert got == [drop, drop, drop, keep, drop]
    assert seen == {"addmm": 3}


def test_policy_names_each_operator_once(monkeypatch: Any) -> None:
    """The op's name is worked out (from its string) the first time the policy sees the operator; every
    later call, in this region or any other, is a dict lookup."""
    import memviz.plans.sac as sac

    named: list[Any] = []
    real = sac._countable
    monkeypatch.setattr(sac, "_countable", lambda func: named.append(func) or real(func))
    monkeypatch.setattr(sac, "_COUNTABLE", {})
    ctx = SelectiveCheckpointContext(is_recompute=False)
    ops = [torch.ops.aten.view.default, torch.ops.aten.mm.default, torch.ops.aten.view.default]
    for _ in range(3):
        seen: dict[str, int] = {}
        for op in ops:
            policy({"mm": frozenset({0})}, seen, ctx, op)
        assert seen == {"mm": 1}
    assert named == [torch.ops.aten.view.default, torch.ops.aten.mm.default]


def test_time_ratio_ignores_what_a_loaded_plan_should_not_hold() -> None:
    """A plan file is untrusted: an overhead that is no finite non-negative number counts as none."""
    prof, _, _, _ = _menu("gpt")
    plan = sac_plan(prof, 0.85)
    sac = plan.solver_stats.extra["sac"]
    sac["overhead_s"] = 0.0
    clean = time_ratio(plan)
    sac["overhead_s"] = 1e-3
    assert time_ratio(plan) > clean
    for bad in ("1e9", float("nan"), float("inf"), True, None):
        sac["overhead_s"] = bad
        assert time_ratio(plan) == clean
    sac["overhead_s"] = -1.0  # below 0 is a re-pricing of the recomputed ops, never below running none
    assert time_ratio(plan) == pytest.approx(1.0, rel=1e-12)


def test_recomputed_ops_are_priced_at_the_rate_the_block_ran_in_step() -> None:
    """The profile's `sac_scale` (the block's eager run over its ops' summed times) prices every recomputed
    op: at 0.5 a plan's recomputation costs half its op times, so its predicted step is that much
    shorter; a profile without it prices them at their measured times (exec23, issue 22 item 2)."""
    prof, graph, _, holds = _menu("gpt")
    plans = {scale: sac_plan(_costed(prof, 2e-5, 1e-5, scale), 0.01) for scale in (None, 1.0, 0.5)}
    options = tuple(plans[1.0].solver_stats.extra["sac"]["options"].values())
    assert all(tuple(p.solver_stats.extra["sac"]["options"].values()) == options for p in plans.values())
    regions = _regions(candidate_blocks(prof.model, graph, prof.captured), options)
    recomputed = sum(Overheads().passes(graph, r, holds)[2] for r in regions)
    assert recomputed > 0
    extra = {k: p.solver_stats.extra["sac"]["overhead_s"] for k, p in plans.items()}
    assert extra[None] == extra[1.0]
    assert extra[0.5] == pytest.approx(extra[1.0] - 0.5 * recomputed, rel=1e-9)
    eager = plans[1.0].baseline.total_time + fixed_costs(plans[1.0].graph, plans[1.0].baseline.total_time)[
        "eager_fixed_s"]
    assert plans[0.5].time_overhead == pytest.approx(plans[1.0].time_overhead - 0.5 * recomputed / eager,
                                                     rel=1e-9)


def test_a_search_cut_by_its_time_limit_plans_the_strongest_option_when_it_fits() -> None:
    """On a loaded machine the block-by-block search over DenseNet-121's 58 blocks ran out of time before it
    fitted: `memviz.plan` refused 0.5 naming 116059424 B as the smallest feasible budget, and refused that
    budget too (naming 121010208 B), its second search cut earlier.  The strongest option everywhere is
    one simulation: whenever it fits, a cut search returns it, and a refusal names the lower of it and the
    lowest found."""
    from types import SimpleNamespace

    from solvers.result import InfeasibleBudget
    from solvers.sac import solve_by_options

    def choose(options: tuple[str, ...]) -> Any:  # each block: none 10, matmuls 6, full 3 bytes; full slowest
        peak = sum({"none": 10, "matmuls": 6, "full": 3}[o] for o in options)
        return SimpleNamespace(options=options, peak_bytes=peak, schedule=None,
                               step_s=sum({"none": 0.0, "matmuls": 1.0, "full": 2.0}[o] for o in options))

    _, choice = solve_by_options(4, 20, choose, time_limit=0.0)
    assert choice.options == ("full",) * 4 and choice.peak_bytes == 12
    with pytest.raises(InfeasibleBudget) as refused:
        solve_by_options(4, 11, choose, time_limit=0.0)
    assert refused.value.minimum_bytes == 12
    _, found = solve_by_options(4, 20, choose, time_limit=60.0)  # with time: the faster fitting plan
    assert found.peak_bytes <= 20 and found.step_s < choice.step_s
