"""Issue 19 item 4: what checkpointing itself costs, counted by the sac menu and cheap in `memviz.apply`.

A selective region runs PyTorch's caching dispatch modes and memviz's policy in Python on every operator
it dispatches; measured on CPU (tiny GPT-2), saving the matmuls that way was slower than recomputing
them.  The menu compares candidates by op times plus `solvers.sac.Overheads`, so at equal memory it
prefers the option that runs faster, and a sac plan's `time_overhead` includes those costs."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from memviz.plans.sac import candidate_blocks, dispatched_counts, eager_holds, policy, time_ratio
from solvers import simulate
from solvers.sac import OPTIONS, Overheads, Region, sac_schedule, solve_menu
from tests.test_apply import _example, sac_plan


def _menu(name: str) -> tuple[Any, Any, list, Any]:
    _, _, prof = _example(name)
    graph = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    return prof, graph, candidate_blocks(prof.model, graph), eager_holds(prof.captured)


def _regions(blocks: list, options: tuple[str, ...]) -> tuple[Region, ...]:
    return tuple(Region(n, ids, OPTIONS[o](mm)) for (n, ids, mm), o in zip(blocks, options, strict=True)
                 if o != "none")


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


def test_overheads_count_saved_tensors_and_policy_passes() -> None:
    """A full-recompute region pays per saved tensor and per call, never the policy; a selective one
    pays the policy on every dispatched operator of its forward and again on those it re-runs."""
    _, graph, blocks, holds = _menu("gpt")
    name, ids, mm = blocks[0]
    saved = sum(1 for savers in holds.saved_by.values() for c in savers if c in set(ids))
    assert saved > 0
    full, selective = Region(name, ids), Region(name, ids, mm)
    assert Overheads(region=1.0, saved=0.5).seconds(graph, (full,), holds) == 1.0 + 0.5 * saved
    assert Overheads(policy=1.0).seconds(graph, (full,), holds) == 0.0
    last = max(c for c in ids if c in holds.release)
    dispatched = {c: 2 for c in ids}
    passes = 2 * len(ids) + 2 * sum(1 for c in ids if c <= last)
    assert Overheads(policy=1.0, dispatched=dispatched).seconds(graph, (selective,), holds) == passes
    assert Overheads(rerun=1.0, dispatched=dispatched).seconds(graph, (full,), holds) == \
        2 * sum(1 for c in ids if c <= last)


def test_dispatched_counts_fold_views_into_ops() -> None:
    """Every forward op of a block stands for itself and the views before it: the block dispatches
    more operators than it has graph nodes (what the policy's modes run on)."""
    prof, graph, blocks, _ = _menu("gpt")
    counts = dispatched_counts(prof.captured, graph)
    _, ids, _ = blocks[0]
    assert all(counts.get(c, 1) >= 1 for c in ids)
    assert sum(counts.get(c, 1) for c in ids) > len(ids)


def test_sac_plan_time_overhead_counts_checkpointing_costs() -> None:
    """A sac plan that checkpoints something predicts its step time with checkpointing's costs on top
    of the recomputed op times, measured on this device (`memviz.plans.sac.measured_overheads`)."""
    prof, graph, _, _ = _menu("gpt")
    plan = sac_plan(prof, 0.85)
    sac = plan.solver_stats.extra["sac"]
    assert sac["regions"] and sac["overhead_s"] > 0
    assert set(sac["costs"]) == {"region_s", "saved_s", "policy_s", "rerun_s"}
    fixed = max(0.0, float(graph.meta.get("eager_fixed_s", 0.0)))  # under load it can measure below 0
    expected = (plan.timeline.total_time + sac["overhead_s"] + fixed) / (plan.baseline.total_time + fixed)
    assert plan.time_overhead == time_ratio(plan) == expected
    assert plan.time_overhead > (plan.timeline.total_time + fixed) / (plan.baseline.total_time + fixed)


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
    for bad in ("1e9", float("nan"), float("inf"), -1.0, True, None):
        sac["overhead_s"] = bad
        assert time_ratio(plan) == clean
