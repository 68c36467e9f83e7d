"""The schedule PyTorch's own selective activation checkpointing (SAC) really runs, and a per-block
option menu solved against a budget.

`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` around a region (one module call) does
not keep what autograd saves inside it: each saved tensor becomes a placeholder, and the first
placeholder unpacked in the backward recomputes the region's forward (from its inputs, which the
checkpoint keeps) up to the last op that saved something (early stop).  A selective policy marks ops
MUST_SAVE: their outputs are cached from the forward until that recomputation, which pops the cached
value instead of running them again (from there it lives as a recomputed value; the last saving op's
is never popped: autograd packs that op's inputs, which ends the re-run, before it dispatches).
`sac_schedule` writes exactly that as a CD-graph schedule so `solvers.simulate` predicts what
`memviz.apply` runs.

The menu follows Rockmate (Sec. 4): every block gets a few options (here: not checkpointed, recompute
only its elementwise sub-modules, save every op a policy can name and recompute the elementwise rest,
save the matmul-class ops, recompute everything), and the cheapest combination that fits is searched over the
blocks; memory does not add up across blocks, so every candidate is simulated.  Time is the simulated
op times plus what checkpointing itself costs (`Overheads`, measured by the caller): a selective
region's policy runs in Python on every op it dispatches, which can make "save the matmuls" slower
than recomputing everything, and the menu then prefers the cheaper option at the same memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from solvers.deadline import timed_out
from solvers.ir import Graph, Phase
from solvers.result import InfeasibleBudget, SolveResult, SolverStats
from solvers.schedule import Schedule, Step, compute, free
from solvers.simulate import Timeline, simulate


@dataclass(frozen=True)
class EagerHolds:
    """What eager PyTorch holds beyond the graph's own reads (measured by memviz on the capture).

    `local`: data id -> compute id after which Python locals and module arguments drop it (forward
    ones), or the autograd engine does as a node's incoming gradient (backward ones).
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
    #: data ids the call gets as arguments beyond what its ops read (a decoder layer's ``position_ids``,
    #: which no op of the layer reads): the checkpoint keeps every argument of the call all the same
    held: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Overheads:
    """Seconds checkpointing costs beyond the simulated times of the ops it runs, so that candidates
    compare as they run (calibrated on the device by the caller, `calibrate`).

    `rerun`: per operator a region's recomputation dispatches: everything a recomputation costs beyond
    its ops' measured times (the module's Python run again, autograd recording the ops again,
    checkpointing's pack and unpack hooks on what they save, its frame and RNG state).  `policy`: per
    operator a selective region dispatches, per pass: its forward runs every operator through the
    caching dispatch mode and the policy, its recomputation every re-run one through the cached mode,
    kept ones included (they return the cached value); a region that keeps nothing runs plain
    checkpointing, without them.  `dispatched`: compute id -> how many operators it stands for as the
    dispatcher sees them (views and detaches folded into the next op; 1 where absent).  `scale`: what a
    recomputed op costs per second of its measured time, as the block ran in step (the block's eager run
    over its ops' summed times): ops are timed alone at another moment than the steps, and on a loaded
    CPU a GPT-2's summed op times moved 44 to 80 ms between two profiles while its measured step stayed
    at 66-67 ms, so an op-time sum priced a recomputation up to 1.8x off (exec23)."""

    rerun: float = 0.0
    policy: float = 0.0
    dispatched: Mapping[int, int] = field(default_factory=dict)
    scale: float = 1.0
    #: per checkpointed call that recomputes: the checkpoint frame itself (its RNG state saved and restored,
    #: its hooks), which a block's small elementwise pieces ("pointwise") pay once each
    region: float = 0.0

    def passes(self, graph: Graph, region: Region, holds: EagerHolds) -> tuple[int, int, float]:
        """(operators `region`'s forward dispatches, operators its recomputation dispatches, seconds of
        the ops it recomputes): the recomputation runs up to the last op that saved something (early
        stop; nothing when none did) and skips the kept ops' kernels, not their dispatch."""
        runs = _runs(graph, (region,), holds)
        forward = sum(self.dispatched.get(c, 1) for c in region.nodes)
        if not runs:
            return forward, 0, 0.0
        run = runs[0]
        rerun = sum(self.dispatched.get(c, 1) for c in region.nodes if c <= run.last)
        return forward, rerun, sum(graph.computes[c].time for c in run.rec)

    def region_seconds(self, graph: Graph, region: Region, holds: EagerHolds) -> float:
        """What checkpointing `region` costs per step beyond its recomputed ops' measured times (their
        re-pricing by `scale` included, so below 0 where the ops ran faster in step than timed alone)."""
        forward, rerun, ops = self.passes(graph, region, holds)
        return ((self.scale - 1.0) * ops + self.rerun * rerun + (self.region if rerun else 0.0)
                + (self.policy * (forward + rerun) if region.save else 0.0))

    def seconds(self, graph: Graph, regions: Sequence[Region], holds: EagerHolds) -> float:
        """What checkpointing `regions` costs per step beyond the schedule's op times."""
        if not (self.rerun or self.policy or self.region or self.scale != 1.0):
            return 0.0
        return sum(self.region_seconds(graph, r, holds) for r in regions)


def calibrate(graph: Graph, full: Region, selective: Region, holds: EagerHolds, dispatched: Mapping[int, int],
              *, eager_s: float, full_s: float, selective_s: float, pieces: Sequence[Region] = (),
              pieces_s: float | None = None) -> Overheads:
    """`Overheads` from one block timed on the device (its forward and backward alone): `eager_s` as it
    is, `full_s` checkpointed keeping nothing (`full`), `selective_s` checkpointed with the policy keeping
    `selective.save`, and `pieces_s` with each of `pieces` (its elementwise sub-modules) checkpointed alone.
    `scale`: `eager_s` over the summed times of the block's ops (its forward and backward computes, by
    module path), so the recomputed ops are priced as the block runs them, not as they were timed alone;
    `rerun` (per operator re-run) and `region` (per checkpoint call) from `full` and `pieces`: what each
    costs beyond eager and beyond its recomputed ops so priced (without pieces, all of `full`'s is per
    operator); `policy`: what `selective` costs beyond that, per operator and pass.  Negative leftovers
    (timing noise) count as none."""
    block = sum(c.time for c in graph.computes
                if c.module == full.name or c.module.startswith(full.name + "."))
    scale = eager_s / block if eager_s > 0 and block > 0 else 1.0
    base = Overheads(dispatched=dispatched)
    _, full_rerun, full_ops = base.passes(graph, full, holds)
    full_left = max(0.0, full_s - eager_s - scale * full_ops)
    rerun = full_left / full_rerun if full_rerun else 0.0
    region = 0.0
    passes = [base.passes(graph, p, holds) for p in pieces]
    calls = sum(1 for _, r, _ in passes if r)
    piece_rerun = sum(r for _, r, _ in passes)
    if pieces_s is not None and calls and full_rerun:
        # full_left = rerun * full_rerun + region; pieces_left = rerun * piece_rerun + region * calls
        pieces_left = max(0.0, pieces_s - eager_s - scale * sum(t for _, _, t in passes))
        share = piece_rerun / full_rerun
        if calls > share:
            region = max(0.0, min(full_left, (pieces_left - full_left * share) / (calls - share)))
            rerun = (full_left - region) / full_rerun
    forward, sel_rerun, sel_ops = base.passes(graph, selective, holds)
    policy = 0.0
    if selective.save and forward + sel_rerun:
        left = selective_s - eager_s - scale * sel_ops - rerun * sel_rerun - region
        policy = max(0.0, left) / (forward + sel_rerun)
    return Overheads(rerun, policy, dispatched, scale, region)


@dataclass(frozen=True)
class CompiledSavings:
    """What a compiler's partitioner frees beyond the SAC schedule's peak, and what the compiled step
    costs, so the menu compares the peaks and the step times the compiled step has (measured by the
    caller: ``memviz.plans.compiled``).

    Compiled, the checkpointed regions keep and recompute what the plan says, but outside them (and
    between the saved values) AOTAutograd's min-cut still recomputes cheap ops on its own: torch.compile
    at its default ``activation_memory_budget`` freed 3.6 of a Llama's 18.7 MiB with no plan at all.
    The partitioner frees what it recomputes between the forward and the backward: a block's share is
    freed only while its forward values are held for its backward, so the compiled peak is taken step by
    step over the SAC schedule (`peak`): the simulated bytes less, per block held at that step
    (`held_blocks`), its option's share.  Summing every block's share against the schedule's peak
    (issue 19) mispredicted mixed plans: on bench_apply's GPT-2 the peak is reached in the last block's
    backward, which a fully recomputed block brings back whole, so checkpointing that block changed
    neither peak yet was predicted 1.08 MiB lower.
    `outside`: bytes freed with every block fully recomputed (nothing of a block is left to free: the
    loss, the head, the region inputs).  `per_block`: option -> bytes each held block on it frees
    beyond that.

    Times, the same way (Rockmate, Sec. 4: an option's cost is its measured recomputation, per block):
    `base_ratio` is the compiled step with no block checkpointed over the eager step, `per_block_ratio`
    option -> what each block on it adds to that, in eager steps (`eager_s` seconds), both from one
    compiled step per option with every block on it.  The compiled recomputation is not the eager one:
    the partitioner fuses and reorders it, and a region it cannot cut through (a per-op policy's saved
    values) recomputes more than the schedule's op times say (sac25: "matchable" predicted 1.07-1.12 at
    the in-step eager rate, measured 1.16-1.26).  None: not measured, the caller's `Overheads` price it."""

    outside: int = 0
    #: fractional: a uniform choice then predicts exactly the peak it was measured at
    per_block: Mapping[str, float] = field(default_factory=dict)
    base_ratio: float | None = None
    per_block_ratio: Mapping[str, float] = field(default_factory=dict)
    eager_s: float = 0.0

    def peak(self, step_bytes: Sequence[int], held: np.ndarray, options: Sequence[str]) -> int:
        """The compiled peak of a choice whose SAC schedule simulates to `step_bytes` per step, `held`
        (steps x blocks, `held_blocks`) saying which blocks' forward values are held at each step."""
        shares = np.array([self.per_block.get(o, 0.0) for o in options], dtype=np.float64)
        freed = held @ shares if held.size else np.zeros(len(step_bytes))
        return round(float(np.max(np.asarray(step_bytes, dtype=np.float64) - freed))) - self.outside

    def step_ratio(self, options: Sequence[str]) -> float | None:
        """The compiled step time of a choice over the eager step's (None: times not measured)."""
        if self.base_ratio is None:
            return None
        return self.base_ratio + sum(self.per_block_ratio.get(o, 0.0) for o in options)

    @classmethod
    def from_uniform(cls, simulated: Mapping[str, tuple[Sequence[int], Sequence[int]]],
                     measured: Mapping[str, int], n_blocks: int, ratios: Mapping[str, float] | None = None,
                     eager_s: float = 0.0) -> CompiledSavings:
        """Savings from one compiled step per option with every block on it: `simulated` by option, its
        SAC schedule's (bytes, number of blocks held) per step, `measured` its compiled peak ("full" must
        be there: it sets `outside`), and (optionally) `ratios`: its step time over the eager step's
        ("none" must be there: it sets `base_ratio`).  Each option's share is the one `peak` predicts its
        measured peak back with."""
        outside = max(simulated["full"][0]) - measured["full"]
        per_block = {o: 0.0 if o == "full" else _share(*simulated[o], measured[o] + outside)
                     for o in simulated if o in measured}
        if not ratios or "none" not in ratios:
            return cls(outside, per_block)
        base = ratios["none"]
        n = max(n_blocks, 1)
        return cls(outside, per_block, base, {o: (r - base) / n for o, r in ratios.items()}, eager_s)


def _share(step_bytes: Sequence[int], held: Sequence[int], target: int) -> float:
    """The share s with max over steps of (bytes - s * blocks held) = `target`, by bisection (the max is
    a convex, non-increasing, piecewise-linear function of s); where no s reaches it (the steps with no
    block held already hold more), the least s that gets closest."""
    a = np.asarray(step_bytes, dtype=np.float64)
    b = np.asarray(held, dtype=np.float64)
    if not b.any():
        return 0.0
    target = max(target, float(a[b == 0].max(initial=-np.inf)))
    lo, hi = -float(a.max()) - abs(target), float(a.max()) + abs(target)
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.max(a - mid * b) > target:
            lo = mid
        else:
            hi = mid
    return hi


def held_blocks(graph: Graph, blocks: Sequence[Block], schedule: Schedule) -> np.ndarray:
    """(steps x blocks) 1.0 where a block's forward values are held for its backward: some value its
    forward produced is alive during the step (for a free: after it, as `simulate` counts) and its
    backward has not started (no backward op has read one of them, none of its nodes ran again).  The
    partitioner frees what it recomputes only there: from a block's backward on, eager and compiled
    steps alike bring its values back (issue 19: shares taken off every alive block missed a mixed
    plan's measured peak by 1.1 MiB on bench_apply's GPT-2; held blocks only, by 0.15 MiB at most)."""
    owner = {d: i for i, block in enumerate(blocks) for c in block.nodes for d in graph.computes[c].outputs}
    of_block = {c: i for i, block in enumerate(blocks) for c in block.nodes}
    alive = np.zeros(len(blocks), dtype=np.int64)
    started = np.zeros(len(blocks), dtype=bool)
    resident: set[int] = set()
    ran: set[int] = set()
    out = np.zeros((len(schedule), len(blocks)))
    for t, step in enumerate(schedule):
        if step.op == "compute":
            node = graph.computes[step.node]
            if step.node in of_block:
                started[of_block[step.node]] |= step.node in ran  # recomputed: its backward began
                ran.add(step.node)
            if node.phase != Phase.FORWARD:
                for d in node.inputs:
                    if d in owner:
                        started[owner[d]] = True
            for d in node.outputs:
                if d in owner and d not in resident:
                    resident.add(d)
                    alive[owner[d]] += 1
        elif step.node in resident:
            resident.discard(step.node)
            alive[owner[step.node]] -= 1
        out[t] = (alive > 0) & ~started
    return out


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
        inputs = {d for d in (*r.held, *(d for c in r.nodes for d in graph.computes[c].inputs))
                  if graph.datas[d].producer is not None and graph.datas[d].producer not in members}
        # autograd packs what an op saves of its inputs before it dispatches the op, and of its outputs after:
        # the last saver runs again only when it saves one of its own outputs (a LayerNorm's statistics),
        # not a Linear's addmm, which saves its inputs (a float32 attention layer ending in its output
        # projection was planned 2,048 B over its measured recomputation)
        runs_last = any(last in holds.saved_by.get(d, ()) for d in graph.computes[last].outputs)
        runs.append(_Run(r, last, tuple(c for c in r.nodes if (c < last or (c == last and runs_last))
                                        and c not in r.save),
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
            again = _recompute_release(graph, d.id, at_rec[(id(run), p)], run, holds, at_run, at_rec)
            frees.setdefault(again, []).append(d.id)
            continue
        # kept from the forward (outside regions, MUST_SAVE, or still alive when the region recomputes)
        rel = max([fwd, *graph.consumers(d.id)])
        for s in holds.saved_by.get(d.id, ()):
            rel = max(rel, holds.release.get(s, -1))
        at = at_run[rel]
        own = run_of.get(p)
        if own is not None and p in own.region.save and p < own.last:
            # the recomputation pops the cached value when it reaches p; from there it lives as a
            # recomputed value does (no longer than its re-run readers, unless autograd saves it again)
            at = max(at, _recompute_release(graph, d.id, _popped_at(own, p, at_run, at_rec), own, holds,
                                            at_run, at_rec))
        frees.setdefault(at, []).append(d.id)
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
    if own is not None and p in own.region.save and p >= own.last:
        # the policy's cache holds it until the checkpoint frame dies: early stop never reaches it (autograd
        # packs the last saver's inputs, which ends the recomputation, before it dispatches the op)
        rel = max(rel, own.death)
    return rel


def _popped_at(run: _Run, p: int, at_run: Mapping[int, int], at_rec: Mapping[tuple[int, int], int]) -> int:
    """Position (in the schedule's items) at which `run`'s recomputation reaches kept op `p` and pops its
    output from the policy's cache: after the last recomputed op before it (else just before the
    recomputation starts)."""
    before = [c for c in run.rec if c < p]
    if before:
        return at_rec[(id(run), before[-1])]
    first = at_rec[(id(run), run.rec[0])] if run.rec else at_run[run.trigger]
    return first - 1


def _recompute_release(graph: Graph, d: int, start: int, run: _Run, holds: EagerHolds,
                       at_run: Mapping[int, int], at_rec: Mapping[tuple[int, int], int]) -> int:
    """Position (in the schedule's items) after which the instance of `d` the recomputation holds from
    position `start` on (recomputed there, or popped from the policy's cache) is released."""
    key = id(run)
    rel = start
    for r in graph.consumers(d):
        if (key, r) in at_rec:
            rel = max(rel, at_rec[(key, r)])
        elif graph.computes[r].phase is Phase.BACKWARD and r >= run.trigger:
            rel = max(rel, at_run[r])
    local = holds.local.get(d)
    if local is not None:  # a Python local of the re-run forward: mapped onto the recomputation
        ran = [c for c in run.rec if c <= local]
        rel = max(rel, at_rec[(key, ran[-1])] if ran else start)
    for s in holds.saved_by.get(d, ()):
        if s in run.region.nodes and s in holds.release:
            rel = max(rel, at_run[holds.release[s]])  # re-saved, held until its node's backward ends
    return rel


class Block(NamedTuple):
    """A candidate block: a module call the menu may checkpoint."""

    name: str
    #: its forward compute ids (contiguous, capture order)
    nodes: tuple[int, ...]
    #: its matmul-class nodes ("matmuls" keeps them)
    matmuls: frozenset[int]
    #: every node a selective policy can match ("matchable" keeps them, recomputing the elementwise rest)
    matchable: frozenset[int] = frozenset()
    #: its elementwise sub-modules (no matmul-class op, two or more ops, one contiguous call each) as
    #: (module path, forward compute ids): "pointwise" checkpoints each of them alone, without a policy
    pieces: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: data ids its call gets as arguments that none of its ops reads (`Region.held`)
    held: frozenset[int] = frozenset()


#: option name -> which of a region's nodes are MUST_SAVE, given its block
OPTIONS: dict[str, Callable[[Block], frozenset[int]]] = {
    "matchable": lambda block: block.matchable,
    "matmuls": lambda block: block.matmuls,
    "full": lambda block: frozenset(),
}
#: the options by memory, weakest (keeps most) first.  "pointwise" is torch.compile's min-cut at its
#: default budget as PyTorch checkpointing runs it: only cheap elementwise chains (an activation function,
#: a norm's float32 arithmetic) are recomputed, from their inputs, which stay, by plain checkpointing
#: (no per-op policy: "matchable", the same as a policy, runs Python on every op the block dispatches)
LADDER = ("none", "pointwise", "matchable", "matmuls", "full")


def block_regions(block: Block, option: str) -> tuple[Region, ...]:
    """The regions `option` checkpoints in `block`."""
    if option == "none":
        return ()
    if option == "pointwise":
        return tuple(Region(path, ids) for path, ids in block.pieces)
    return (Region(block.name, block.nodes, OPTIONS[option](block), block.held),)


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
    #: seconds checkpointing costs beyond the timeline's op times (`Overheads.seconds`)
    overhead_s: float = 0.0
    #: the peak the compiled step has (`CompiledSavings.peak`); None: the timeline's, as eager runs it
    compiled_peak: int | None = None

    @property
    def peak_bytes(self) -> int:
        """The peak the menu compares against the budget."""
        return self.timeline.peak_bytes if self.compiled_peak is None else self.compiled_peak

    @property
    def step_s(self) -> float:
        """The predicted step time the menu compares: op times plus checkpointing's own costs."""
        return self.timeline.total_time + self.overhead_s


def choose(graph: Graph, blocks: Sequence[Block], options: tuple[str, ...], holds: EagerHolds,
           overheads: Overheads, savings: CompiledSavings | None = None) -> Choice:
    """One option per block as a `Choice`: its SAC schedule, checked by `solvers.simulate`, and (with
    `savings`) the peak the compiled step has, and its time when `savings` measured one."""
    regions = tuple(r for b, o in zip(blocks, options, strict=True) for r in block_regions(b, o))
    schedule = sac_schedule(graph, regions, holds)
    timeline = simulate(graph, schedule).check()
    ratio = None if savings is None else savings.step_ratio(options)
    # compiled and timed: the step the measured prices predict, whatever the schedule's op times say
    overhead_s = (overheads.seconds(graph, regions, holds) if ratio is None
                  else ratio * savings.eager_s - timeline.total_time)
    compiled_peak = (None if savings is None
                     else savings.peak(timeline.step_bytes, held_blocks(graph, blocks, schedule), options))
    return Choice(options, regions, schedule, timeline, overhead_s=overhead_s, compiled_peak=compiled_peak)


def solve_menu(graph: Graph, budget: int, blocks: Sequence[Block], holds: EagerHolds, *,
               time_limit: float = 60.0, overheads: Overheads = Overheads(),
               savings: CompiledSavings | None = None) -> tuple[SolveResult, Choice]:
    """`solve_by_options` over `LADDER` with every candidate's schedule from `sac_schedule` over `graph`,
    its time the schedule's op times plus `overheads`, its peak (and its time, where measured) the compiled
    step's with `savings`."""
    return solve_by_options(len(blocks), budget,
                            lambda opts: choose(graph, blocks, opts, holds, overheads, savings),
                            time_limit=time_limit, ladder=LADDER, floor=graph.held_bytes())


def solve_by_options(n_blocks: int, budget: int, choose: Callable[[tuple[str, ...]], Choice], *,
                     time_limit: float = 60.0,
                     ladder: tuple[str, ...] = ("none", "matmuls", "full"),
                     floor: int = 0) -> tuple[SolveResult, Choice]:
    """Per-block options (`ladder`: weakest first, by memory) chosen greedily: while over budget, move the
    block to whichever stronger option cuts the simulated peak most per second of step time (`Choice.step_s`:
    recomputation and checkpointing's own costs, so "full" straight from "none" when the per-op policy
    makes the selective options the slower ones); then move any block to any other option when that still
    fits and is faster (a weaker one also at equal time: a stronger one can be faster, having no policy).
    `choose` turns one option per block into a `Choice` whose timeline `solvers.simulate` checked, so the
    result is what runs.  A search the time limit cuts before it fits takes the strongest option everywhere
    when that fits (then relaxed as time allows).  Raises `InfeasibleBudget` with the smallest
    peak found (all blocks fully recomputed is not always the lowest, so not proven).  `floor`: bytes
    every choice holds all step (`Graph.held_bytes`); a budget under it is refused at once, naming the
    lower of no recomputation and the strongest option everywhere, where the search would strengthen
    block by block to its time limit (every move, none fitting: GhostNet's 30 s)."""
    start = time.perf_counter()
    best = choose(("none",) * n_blocks)
    lowest = best
    if budget < floor:
        lowest = min(best, choose((ladder[-1],) * n_blocks), key=lambda ch: ch.peak_bytes)
        raise InfeasibleBudget(budget, lowest.peak_bytes, "sac", proven=False)
    while best.peak_bytes > budget and not timed_out(start + time_limit, "sac: strengthening",
                                                              time.perf_counter()):
        moves = []
        for i, o in enumerate(best.options):
            for stronger in ladder[ladder.index(o) + 1:]:
                cand = choose((*best.options[:i], stronger, *best.options[i + 1:]))
                cut = best.peak_bytes - cand.peak_bytes
                cost = cand.step_s - best.step_s
                moves.append((cut / max(cost, 1e-12) if cut > 0 else cut, cut, cand))
        if not moves:
            break
        _, _, best = max(moves, key=lambda m: (m[1] > 0, m[0], m[1]))
        lowest = min(lowest, best, key=lambda ch: ch.peak_bytes)
    if best.peak_bytes > budget:
        # cut by the time limit (a block-by-block search over DenseNet's 58 blocks simulates 232 candidates a
        # move): the strongest option everywhere, one simulation, is a plan whenever it fits, whatever the
        # machine's load, so a budget a refusal named is not refused again for being reached later
        strongest = choose((ladder[-1],) * n_blocks)
        if strongest.peak_bytes > budget:
            raise InfeasibleBudget(budget, min(lowest, strongest, key=lambda ch: ch.peak_bytes).peak_bytes,
                                   "sac", proven=False)
        best = strongest
    improved = True
    while improved and not timed_out(start + time_limit, "sac: relaxing", time.perf_counter()):
        improved = False
        for i, o in enumerate(best.options):
            for other in ladder:
                if other == o:
                    continue
                weaker = ladder.index(other) < ladder.index(o)
                cand = choose((*best.options[:i], other, *best.options[i + 1:]))
                faster = cand.step_s <= best.step_s if weaker else cand.step_s < best.step_s
                if cand.peak_bytes <= budget and faster:
                    best, improved, o = cand, True, other
    stats = SolverStats("sac", "heuristic", time.perf_counter() - start, objective=best.step_s)
    return SolveResult(best.schedule, stats), best
