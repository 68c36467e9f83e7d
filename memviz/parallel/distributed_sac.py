"""`memviz.plan(parallel_profile, budget, strategy="sac")`: a per-rank plan that `memviz.apply` runs as
PyTorch's own selective activation checkpointing, under FSDP2 and tensor/sequence parallelism.

A single-device SAC plan (`memviz.plans.sac`) predicts its schedule from the captured joint graph
(`solvers.sac.sac_schedule`).  One rank of a parallel step is recorded, not captured
(`memviz.parallel.distributed`), and what checkpointing does there depends on the wrapping: a checkpointed
block recomputes its forward in the backward after FSDP2 has gathered its parameters again, so the
recomputation reads the backward's unsharded parameters (other storages than the forward's), and the
cut between what the block keeps and what FSDP2 frees moves with it.  So each candidate is measured
the only way that sees all of it: the blocks are checkpointed with `memviz.apply`'s own wrapper (the
code the user will run), the model is sharded as the profile was, one step is recorded on the fake
process group, and `solvers.simulate` checks that recording.  The options are Rockmate's per-block
menu (Sec. 4) reduced to what a per-op policy expresses (`solvers.sac.solve_by_options`: none,
save the matmul-class ops, recompute everything); the plan's graph is the recorded step of the chosen
candidate (its recomputed operators are compute nodes of their own, named ``... (recomputed)``) and its
baseline the profile's graph.

The plan holds module paths of the user's (unwrapped) model, the same under FSDP2 and
``parallelize_module``, which leave the module tree as it is.  Apply it to the model first, then wrap
(``fully_shard`` / ``parallelize_module``): the order the planner records and the tests check.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from memviz.budget import parse_budget
from memviz.parallel.distributed import RECOMPUTED, ParallelError, blocks_of, record_parallel
from memviz.plans.sac import MATMULS
from solvers import Graph, Timeline, simulate
from solvers.sac import Choice, solve_by_options
from solvers.schedule import Schedule

#: a save decision no operator has: the counting run takes the policy path (plain checkpointing calls
#: no policy) and saves nothing, so every countable op of the region is counted
_COUNT_ONLY = [["memviz-count-only", 0]]


def _record(prof: Any, regions: list[dict[str, Any]]) -> tuple[Graph, Schedule]:
    """One recorded step of the profile's rank with `regions` checkpointed: its graph and schedule."""
    from memviz.profiling.capture import default_loss

    args, kwargs = prof.inputs
    target = prof.device.target if prof.device.estimated else None
    graph, schedule, _ = record_parallel(prof.model, args, kwargs, prof.parallel, mode=prof.mode,
                                         loss_fn=prof.loss_fn or default_loss, optimizer=prof.optimizer,
                                         target=target, regions=regions, quick=True)
    return graph, schedule


def op_counts(prof: Any, blocks: list[str]) -> dict[str, dict[str, int]]:
    """Per block, how many of each countable op one call runs as the selective policy sees them (DTensor
    operators under tensor parallelism, plain ones under FSDP2): one recorded step with every block
    checkpointed by a policy that saves nothing and reports its counts."""
    seen: dict[str, dict[str, int]] = {}

    def spec(block: str) -> dict[str, Any]:
        return {"module": block, "save": _COUNT_ONLY, "counts": {},
                "on_counts": lambda counts: seen.__setitem__(block, counts)}

    _record(prof, [spec(b) for b in blocks])
    return seen


def region_spec(block: str, option: str, counts: dict[str, int]) -> dict[str, Any]:
    """`memviz.apply`'s spec for one block: "matmuls" saves every matmul-class op of the call, "full" none."""
    save = [[name, k] for name in sorted(counts) if name in MATMULS for k in range(counts[name])] \
        if option == "matmuls" else []
    return {"module": block, "save": save, "counts": dict(counts)}


def plan_parallel_sac(prof: Any, budget: int | float | str | None, *, time_limit: float = 60.0) -> Any:
    """The per-rank SAC plan of a parallel profile at `budget` (module docstring), every candidate a
    recorded step of this rank checked by `solvers.simulate`."""
    from memviz.plans.planning import Plan, PlanningError, _device_info, _model_info

    if prof.mode != "train":
        raise PlanningError("strategy 'sac' plans activation checkpointing, which only changes training")
    model = prof.model
    blocks = [name for name, _ in blocks_of(model)]
    if prof.parallel is not None and prof.parallel.pp > 1:  # a pipeline stage checkpoints its own blocks
        from memviz.parallel.pipeline import stage_blocks, stage_index

        blocks = stage_blocks(model, prof.parallel.pp, stage_index(prof.parallel))
    if not blocks:
        raise ParallelError(f"{type(model).__name__} has no nn.ModuleList / nn.Sequential of blocks to "
                            "checkpoint")
    budget_bytes = None if budget is None else parse_budget(budget, prof.baseline.peak_bytes)
    start = time.perf_counter()
    counts = op_counts(prof, blocks)
    made: dict[tuple[str, ...], tuple[Choice, list[dict[str, Any]]]] = {}

    def choose(options: tuple[str, ...]) -> Choice:
        if options not in made:
            specs = [region_spec(b, o, counts.get(b, {})) for b, o in zip(blocks, options, strict=True)
                     if o != "none"]
            if not specs:  # nothing checkpointed: the profile's own recording
                choice = Choice(options, (), prof.baseline_schedule, prof.baseline, prof.graph)
            else:
                graph, schedule = _record(prof, specs)
                choice = Choice(options, (), schedule, simulate(graph, schedule).check(), graph)
            made[options] = choice, specs
        return made[options][0]

    result, choice = solve_by_options(len(blocks), prof.baseline.peak_bytes if budget_bytes is None
                                      else budget_bytes, choose, time_limit=time_limit,
                                      floor=prof.graph.held_bytes())
    specs = made[choice.options][1]
    graph = choice.graph
    recomputed = sum(c.name.endswith(RECOMPUTED) for c in graph.computes)
    stats = dataclasses.replace(result.stats, seconds=time.perf_counter() - start, extra={"sac": {
        "expressible": True, "per_rank": True, "recorded_candidates": len(made),
        "recomputed_ops": recomputed,
        "options": dict(zip(blocks, choice.options, strict=True)), "regions": specs}})
    return Plan(graph=graph, schedule=choice.schedule, timeline=choice.timeline,
                baseline_schedule=prof.baseline_schedule, baseline=prof.baseline, strategy="sac",
                budget_bytes=budget_bytes, solver_stats=stats, model=_model_info(prof, graph),
                device=_device_info(prof), profile=prof,
                baseline_graph=None if graph is prof.graph else prof.graph)


def rank_timeline(plan: Any, prof: Any) -> Timeline:
    """What `prof`'s rank holds running the per-rank `plan` (made for another rank of the same setup, or
    loaded from its JSON): that rank's step recorded with the plan's regions checkpointed, checked by
    `solvers.simulate`.  Ranks differ where a dimension does not divide among them."""
    regions = plan.solver_stats.extra.get("sac", {}).get("regions", []) if plan.strategy == "sac" else []
    if plan.strategy not in ("sac", "none"):
        raise ValueError(f"a {plan.strategy!r} plan is not a per-rank checkpointing plan: make one with "
                         "memviz.plan(profile, budget, strategy='sac')")
    if not regions:
        return prof.baseline
    graph, schedule = _record(prof, regions)
    return simulate(graph, schedule).check()
