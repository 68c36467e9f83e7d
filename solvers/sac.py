"""The schedule PyTorch's own selective activation checkpointing (SAC) really runs, and a per-block
option menu solved against a budget.

`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` around a region (one module call) does
not keep what autograd saves inside it: each saved tensor becomes a placeholder, and the first
placeholder unpacked in the backward recomputes the region's forward (from its inputs, which the
checkpoint keeps) up to the last op that saved something (early stop).  A selective policy marks ops
MUST_SAVE: their outputs are cached from the forward until that recomputation, which returns the
cached value instead of running them again.  `sac_schedule` writes exactly that as a CD-graph schedule
so `solvers.simulate` predicts what `memviz.apply` runs.

The menu follows Rockmate (Sec. 4): every block gets a few options (here: not checkpointed, save the
matmul-class ops, recompute everything), and the cheapest combination that fits is searched over the
blocks; memory does not add up across blocks, so every candidate is simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from solvers.deadline import timed_out
from solvers.ir import Graph, Phase
from solvers.result import InfeasibleBudget, SolveResult, SolverStats
from solvers.schedule import Schedule, Step, compute, free
from solvers.simulate import Timeline, simulate


@dataclass(frozen=True)
class EagerHolds:
    """What eager PyTorch holds beyond the graph's own reads (measured by memviz on the capture).

    `local`: data id -> forward compute id after which Python locals and module arguments drop it.
    `saved_by`: data id -> forward compute ids whose autograd node saves it for backward.
    `release`: saving forward compute id -> last backward compute id of its autograd node (the engine
    frees the node's saved variables there).  `unpack`: saving forward compute id -> first backward
    compute id of its autograd node (its saved tensors are unpacked just before)."""

    local: Mapping[int, int]
    saved_by: Mapping[int, tuple[int, ...]]
    release: Mapping[int, int]
    unpack: Mapping[int, int]


@dataclass(frozen=True)
class Region:
    """One checkpointed module call: its forward compute ids (contiguous, capture order) and the ones
    the selective policy marks MUST_SAVE."""

    name: str
    nodes: tuple[int, ...]
    save: frozenset[int] = frozenset()


@dataclass(frozen=True)
class _Run:
    """A region as the checkpoint runs it: `rec` recomputed before backward compute `trigger`; the
    checkpoint frame (and with it the region's inputs) lives until backward compute `death`."""

    region: Region
    last: int
    rec: tuple[int, ...]
    trigger: int
    death: int
    inputs: frozenset[int]


def _runs(graph: Graph, regions: Sequence[Region], holds: EagerHolds) -> list[_Run]:
    runs = []
    for r in regions:
        savers = [c for c in r.nodes if c in holds.release]
        if not savers:
            continue  # nothing saved: the checkpoint frame dies at once, nothing is recomputed
        members = set(r.nodes)
        last = max(savers)
        inputs = {d for c in r.nodes for d in graph.computes[c].inputs
                  if graph.datas[d].producer is not None and graph.datas[d].producer not in members}
        runs.append(_Run(r, last, tuple(c for c in r.nodes if c <= last and c not in r.save),
                         min(holds.unpack[c] for c in savers), max(holds.release[c] for c in savers),
                         frozenset(inputs)))
    return runs


def sac_schedule(graph: Graph, regions: Sequence[Region], holds: EagerHolds) -> Schedule:
    """The schedule non-reentrant checkpointing with a selective policy runs over `graph` (capture order,
    every tensor freed where eager PyTorch releases it, given `holds`), with each region in `regions`
    checkpointed.  With no regions it is PyTorch's eager order."""
    runs = _runs(graph, regions, holds)
    run_of = {c: run for run in runs for c in run.region.nodes}
    rec_run = {d: run for run in runs for c in run.rec for d in graph.computes[c].outputs}
    # the order: capture order, each region's recomputation just before its first unpacking backward op
    items: list[tuple[int, _Run | None]] = []
    for c in range(len(graph.computes)):
        items.extend((rc, run) for run in runs if run.trigger == c for rc in run.rec)
        items.append((c, None))
    at_run = {c: i for i, (c, run) in enumerate(items) if run is None}
    at_rec = {(id(run), c): i for i, (c, run) in enumerate(items) if run is not None}
    frees: dict[int, list[int]] = {}
    keep = set(graph.outputs)
    for d in graph.datas:
        if d.producer is None or d.id in keep:
            continue
        p = d.producer
        run = rec_run.get(d.id)
        fwd = _forward_release(graph, d.id, p, run, run_of, holds)
        if run is not None and fwd < run.trigger:
            frees.setdefault(at_run[fwd], []).append(d.id)
            frees.setdefault(_recompute_release(graph, d.id, p, run, holds, at_run, at_rec), []).append(d.id)
            continue
        # kept from the forward (outside regions, MUST_SAVE, or still alive when the region recomputes)
        rel = max([fwd, *graph.consumers(d.id)])
        for s in holds.saved_by.get(d.id, ()):
            rel = max(rel, holds.release.get(s, -1))
        frees.setdefault(at_run[rel], []).append(d.id)
    steps: list[Step] = []
    for i, (c, _) in enumerate(items):
        steps.append(compute(c))
        steps.extend(free(d) for d in sorted(frees.get(i, ())))
    return tuple(steps)


def _forward_release(graph: Graph, d: int, p: int, run: _Run | None, run_of: Mapping[int, _Run],
                     holds: EagerHolds) -> int:
    """Compute id after which the forward instance of data `d` (produced by `p`) is released."""
    rel = max(p, holds.local.get(d, -1))
    for r in graph.consumers(d):
        if run is None or graph.computes[r].phase is not Phase.BACKWARD or r < run.trigger:
            rel = max(rel, r)
    for s in holds.saved_by.get(d, ()):
        owner = run_of.get(s)
        if owner is None:
            rel = max(rel, holds.release.get(s, -1))  # eager autograd keeps it in the saving node
    for other in run_of.values():
        if d in other.inputs:
            rel = max(rel, other.death)  # the checkpoint keeps its region's inputs for recomputation
    own = run_of.get(p)
    if own is not None and p in own.region.save:
        # the policy's cache holds it until the recomputation consumes it (never, after early stop)
        rel = max(rel, own.trigger if p <= own.last else own.death)
    return rel


def _recompute_release(graph: Graph, d: int, p: int, run: _Run, holds: EagerHolds,
                       at_run: Mapping[int, int], at_rec: Mapping[tuple[int, int], int]) -> int:
    """Position (in the schedule's items) after which the recomputed instance of `d` is released."""
    key = id(run)
    rel = at_rec[(key, p)]
    for r in graph.consumers(d):
        if (key, r) in at_rec:
            rel = max(rel, at_rec[(key, r)])
        elif graph.computes[r].phase is Phase.BACKWARD and r >= run.trigger:
            rel = max(rel, at_run[r])
    local = holds.local.get(d)
    if local is not None:  # a Python local of the re-run forward: mapped onto the recomputation
        ran = [c for c in run.rec if c <= local]
        rel = max(rel, at_rec[(key, ran[-1] if ran else run.rec[0])])
    for s in holds.saved_by.get(d, ()):
        if s in run.region.nodes and s in holds.release:
            rel = max(rel, at_run[holds.release[s]])  # re-saved, held until its node's backward ends
    return rel


#: option name -> which of a region's nodes are MUST_SAVE, given the region's matmul-class nodes
OPTIONS: dict[str, Callable[[frozenset[int]], frozenset[int]]] = {
    "matmuls": lambda matmuls: matmuls,
    "full": lambda matmuls: frozenset(),
}


@dataclass(frozen=True)
class Choice:
    """A solved menu: per candidate block its option ("none" = not checkpointed).  `graph`: the graph
    `schedule` runs on when the candidate's step was recorded as a graph of its own (a per-rank plan,
    `memviz.parallel.distributed`); None: the graph the menu was solved on."""

    options: tuple[str, ...]
    regions: tuple[Region, ...]
    schedule: Schedule
    timeline: Timeline
    graph: Graph | None = None


def _choose(graph: Graph, blocks: Sequence[tuple[str, tuple[int, ...], frozenset[int]]],
            options: tuple[str, ...], holds: EagerHolds) -> Choice:
    regions = tuple(Region(name, nodes, OPTIONS[o](mm)) for (name, nodes, mm), o in zip(blocks, options,
                                                                                       strict=True)
                    if o != "none")
    schedule = sac_schedule(graph, regions, holds)
    return Choice(options, regions, schedule, simulate(graph, schedule).check())


def solve_menu(graph: Graph, budget: int, blocks: Sequence[tuple[str, tuple[int, ...], frozenset[int]]],
               holds: EagerHolds, *, time_limit: float = 60.0) -> tuple[SolveResult, Choice]:
    """`solve_by_options` with every candidate's schedule from `sac_schedule` over `graph`."""
    return solve_by_options(len(blocks), budget, lambda opts: _choose(graph, blocks, opts, holds),
                            time_limit=time_limit)


def solve_by_options(n_blocks: int, budget: int, choose: Callable[[tuple[str, ...]], Choice], *,
                     time_limit: float = 60.0) -> tuple[SolveResult, Choice]:
    """Per-block options (none -> matmuls -> full) chosen greedily: while over budget, strengthen the
    block whose next option cuts the simulated peak most per second of recomputation; then relax every
    block that can go back a step and still fit (the time it saves first).  `choose` turns one option per
    block into a `Choice` whose timeline `solvers.simulate` checked, so the result is what runs.  Raises
    `InfeasibleBudget` with the smallest peak found (all blocks fully recomputed is not always the lowest,
    so not proven)."""
    start = time.perf_counter()
    ladder = ("none", "matmuls", "full")
    best = choose(("none",) * n_blocks)
    lowest = best
    while best.timeline.peak_bytes > budget and not timed_out(start + time_limit, "sac: strengthening",
                                                              time.perf_counter()):
        moves = []
        for i, o in enumerate(best.options):
            if o == ladder[-1]:
                continue
            opts = (*best.options[:i], ladder[ladder.index(o) + 1], *best.options[i + 1:])
            cand = choose(opts)
            cut = best.timeline.peak_bytes - cand.timeline.peak_bytes
            cost = cand.timeline.total_time - best.timeline.total_time
            moves.append((cut / max(cost, 1e-12) if cut > 0 else cut, cut, cand))
        if not moves:
            break
        _, _, best = max(moves, key=lambda m: (m[1] > 0, m[0], m[1]))
        lowest = min(lowest, best, key=lambda ch: ch.timeline.peak_bytes)
    if best.timeline.peak_bytes > budget:
        raise InfeasibleBudget(budget, lowest.timeline.peak_bytes, "sac", proven=False)
    improved = True
    while improved and not timed_out(start + time_limit, "sac: relaxing", time.perf_counter()):
        improved = False
        for i, o in enumerate(best.options):
            if o == "none":
                continue
            opts = (*best.options[:i], ladder[ladder.index(o) - 1], *best.options[i + 1:])
            cand = choose(opts)
            if cand.timeline.peak_bytes <= budget and cand.timeline.total_time <= best.timeline.total_time:
                best, improved = cand, True
    stats = SolverStats("sac", "heuristic", time.perf_counter() - start, objective=best.timeline.total_time)
    return SolveResult(best.schedule, stats), best
