"""Rockmate (Zhao et al. 2023, /work/shared/papers/rockmate.txt): the block chain of `solvers.chain`,
a menu of block-level schedules per class of identical blocks (Sec. 3.3), and the rk-Rotor dynamic
program over the menus (Sec. 3.4, Appendix C), expanded to a full schedule and simulated.

Block menus, searched once per class of identical blocks (Sec. 3.2) and translated position by
position to every member block, where each option is measured again:
- rk-Checkmate (`solvers.block_milp`, Sec. 3.3 and Appendix B): the Checkmate MILP restricted to the
  block, solved over grids of (kept bytes, block peak) budget pairs spanning the known options,
  `MILP_LEVELS` x `MILP_LEVELS` from coarse to fine; its options may recompute forward nodes several
  times inside the backward.  Each MILP is node-limited and warm-started from the fastest known
  option meeting its pair; per grid the classes share what is left of `MILP_WORK` (counted: each pair
  solve's simplex iterations and a fixed cost) in proportion to their model sizes, smallest first so
  that work left unused goes to the larger ones.  The search stops at the finest grid or when the
  work is spent, whichever comes first: a loaded machine gets the same menus (issue 18 item 4).
  `MILP_SECONDS` (at most half the time limit) is only a safety cap.
- kept-subset options: the backward regenerates the dropped data by recomputing, right before the
  first backward node that needs them, the forward nodes that produce them.  For blocks with at most
  `EXACT_SUBSETS` saved data every subset is measured; larger blocks get nested greedy families of up
  to `GREEDY_STEPS` sets each (drop the largest data first, and drop the data cheapest to recompute
  per byte first).  Per (kept bytes, peak) pair of a `GRID` x `GRID` grid the fastest is picked.
The menu is the union, Pareto-pruned on (time, kept bytes, forward peak, backward peak), so at
equal budget it is never worse than the kept-subset menu alone.  Rotor's store-everything option is
always first, and rotor's own DP over it runs beside rk-Rotor (the DP's proposals are re-costed in
bytes, see `solvers.rotor.ChainSolver`), so at equal budget rockmate is never worse than rotor.
Class menus are cached for the last `CACHED_GRAPHS` graphs (per MILP time), so the plans of one
graph at several budgets come from one menu.  Not implemented: recomputation inside a block's
forward (rk-Rotor's case 2 recomputes whole forwards), and what `solvers.block_milp` leaves out of
its model.  Because the MILPs are
time-limited, the options they find (and so the plans) can differ between a fast and a loaded machine.
"""

from __future__ import annotations

import itertools
import time as _time

import numpy as np

from solvers import block_milp
from solvers.chain import Block, BlockOption, Chain, block_option, sequence_option, store_all
from solvers.deadline import Deadline, note_cut, timed_out
from solvers.ir import Graph
from solvers.memo import RecentMemo
from solvers.result import OutOfTime, SolveResult
from solvers.rotor import (
    ChainSolver,
    chain_of,
    checked_result,
    infeasible,
    no_recompute_result,
    store_all_solver,
)

EXACT_SUBSETS = 10
GREEDY_STEPS = 32
GRID = 20


def _candidates(chain: Chain, block: Block) -> list[int]:
    return [d for d in block.saved if d != block.output]


def _kept_sets(chain: Chain, block: Block) -> list[frozenset[int]]:
    cand = _candidates(chain, block)
    if len(cand) <= EXACT_SUBSETS:
        return [frozenset(c) for r in range(len(cand) + 1) for c in itertools.combinations(cand, r)]
    g = chain.graph
    size = {d: g.datas[d].bytes for d in cand}
    redo = {d: max(g.computes[g.datas[d].producer].time, 1e-12) for d in cand}
    orders = [sorted(cand, key=lambda d: -size[d]), sorted(cand, key=lambda d: -size[d] / redo[d])]
    sets = {frozenset(cand)}
    steps = sorted({max(1, round(len(cand) * i / GREEDY_STEPS)) for i in range(1, GREEDY_STEPS + 1)})
    for order in orders:
        for j in steps:  # drop the first j of the order
            sets.add(frozenset(order[j:]))
    return sorted(sets, key=lambda s: (len(s), sorted(s)))


def _menu(options: list[BlockOption], grid: int) -> list[int]:
    """Indices of the options chosen over a grid of (kept bytes, peak) budget pairs: per pair the
    fastest (then least kept, least peak, first) that meets it; store-all (index 0) first."""
    keeps = np.array([o.keep for o in options])
    peaks = np.array([block_milp.peak(o) for o in options])
    times = np.array([o.fwd_time + o.bwd_time for o in options])
    order = np.lexsort((np.arange(len(options)), peaks, keeps, times))  # last key sorts first

    def levels(vals: np.ndarray) -> list[int]:
        vals = np.unique(vals)
        if len(vals) <= grid:
            return vals.tolist()
        lo, hi = int(vals[0]), int(vals[-1])
        return sorted({lo + (hi - lo) * i // (grid - 1) for i in range(grid)} | {hi})

    chosen = [0]
    for kb in levels(keeps):
        for pb in levels(peaks):
            fit = (keeps[order] <= kb) & (peaks[order] <= pb)
            if fit.any():
                best = int(order[np.argmax(fit)])
                if best not in chosen:
                    chosen.append(best)
    return chosen


#: the block MILPs' safety cap in seconds for one `solve` (at most half of its time limit); their
#: work is `MILP_WORK`, counted, so that a slow machine gets the same menus (issue 18 item 4)
MILP_SECONDS = 30.0
#: the block MILPs' work for one graph's menus, over all classes, in `block_milp.PairSearch.work` units
#: (simplex iterations + `block_milp.SOLVE_BASE_WORK` per solve; about 1 ms each on the 2-core CI
#: machine): about the 64 pair solves that 3 s allowed on bench_remat's 12-layer GPT when time was the
#: limit (57 units per solve there; 800 per solve on tests' gpt_graph(2, seq=32, hidden=64))
MILP_WORK = 4000
#: kept-byte and peak levels of the rk-Checkmate budget-pair grids, coarse to fine (each one nests
#: the previous: levels 2^k + 1); the paper uses 20 x 20
MILP_LEVELS = (5, 9, 17)

Positions = tuple[tuple[int, ...], tuple[int, ...]]  # an option's sequences as positions in its block

#: class menus of the last few graphs planned, per MILP work (`MILP_WORK`, 0 without MILPs): one
#: graph planned at several budgets gets one menu (menus the time cap cut are not kept)
CACHED_GRAPHS = 4
Menus = tuple[dict[int, list[Positions]], dict[str, float]]  # options per block class, statistics
_MENUS: RecentMemo[tuple[Graph, int], Menus] = RecentMemo(CACHED_GRAPHS)


def _cost(o: BlockOption) -> tuple[float, int, int, int]:
    return (o.fwd_time + o.bwd_time, o.keep, o.fwd_peak, o.bwd_peak)


def pareto(options: list[BlockOption]) -> list[BlockOption]:
    """The first option (store-all) and every other one that no option dominates on (time, kept bytes,
    forward peak, backward peak): the DP is monotone in each, so dropping a dominated option loses
    nothing.  Of identical cost vectors the first is kept."""
    costs = np.array([_cost(o) for o in options], dtype=float)
    kept = [options[0]]
    for i in range(1, len(options)):
        le = (costs <= costs[i]).all(axis=1)
        lt = (costs < costs[i]).any(axis=1)
        le[i] = False
        if not (le & (lt | (np.arange(len(options)) < i))).any():
            kept.append(options[i])
    return kept


def _positions(block: Block, o: BlockOption) -> Positions:
    index = {c: i for i, c in enumerate((*block.forward, *block.backward))}
    return tuple(index[c] for c in o.forward), tuple(index[c] for c in o.backward)


def _enumerated(chain: Chain, b: Block, grid: int, deadline: Deadline | None
                ) -> tuple[list[BlockOption], list[BlockOption], bool]:
    """(every measured kept-subset option, store-all first; the ones picked over the grid; whether
    `deadline` cut the list).  Past `deadline` no more are measured (keeping every candidate is)."""
    everything = frozenset(_candidates(chain, b))
    opts = [store_all(chain, b)]
    cut = False
    for k in _kept_sets(chain, b):
        cut = cut or (deadline is not None and deadline.expired("rockmate: block options not enumerated"))
        if k == everything or not cut:
            opts.append(block_option(chain, b, k))
    return opts, [opts[i] for i in _menu(opts, grid)], cut


def class_menus(chain: Chain, *, grid: int = GRID, deadline: Deadline | None = None,
                milp_seconds: float = 0.0, until: Deadline | None = None, milp_work: int | None = None
                ) -> tuple[dict[int, list[Positions]], dict[str, float]]:
    """Per class: the menu of its first block as positions (store-all first), and statistics.  Past
    `deadline` the classes left get only the kept-subset options of keeping everything.  The MILPs
    (none when `milp_seconds` is 0) do `milp_work` (default `MILP_WORK`) in all, shared by model size; as a
    safety cap they stop after `milp_seconds` or at `until` (the solve's own deadline)."""
    firsts: dict[int, Block] = {}
    for b in chain.blocks:
        firsts.setdefault(b.klass, b)
    enumerated = {k: _enumerated(chain, b, grid, deadline) for k, b in firsts.items()}
    menus = {k: picked for k, (_, picked, _) in enumerated.items()}
    stats = {"milp_options": 0, "milp_seconds": 0.0, "milp_classes": 0, "milp_solves": 0,
             "enumeration_cut": any(cut for _, _, cut in enumerated.values())}
    if milp_seconds > 0 and not (until is not None and until.expired("rockmate: block MILPs skipped")):
        started = _time.perf_counter()
        end = started + milp_seconds if until is None else min(started + milp_seconds,
                                                                started + until.left())
        models = {}
        for k, b in firsts.items():
            if timed_out(end, "rockmate: block MILPs not built", _time.perf_counter()):
                break
            models[k] = block_milp.build(chain, b)
        searches = {k: block_milp.PairSearch(chain, bm, enumerated[k][0])
                    for k, bm in models.items() if bm is not None and bm.model.num_vars}
        left = MILP_WORK if milp_work is None else milp_work
        for levels in MILP_LEVELS:  # coarse grids for every class first, then finer ones
            pending = sorted(searches, key=lambda k: (searches[k].bm.model.num_vars, k))
            total = sum(searches[k].bm.model.num_vars for k in pending)
            for k in pending:  # smallest models first: solves a class leaves unused go to larger ones
                weight = searches[k].bm.model.num_vars
                share, total = left * weight // total, total - weight
                before = searches[k].work
                searches[k].run(levels, end, max_work=share)
                left -= searches[k].work - before
        for k, search in searches.items():
            menus[k] = pareto([*menus[k], *search.found])
            stats["milp_options"] += sum(any(o is f for f in search.found) for o in menus[k])
        stats["milp_classes"] = sum(bool(s.solves) for s in searches.values())
        stats["milp_solves"] = sum(s.solves for s in searches.values())
        stats["milp_work"] = sum(s.work for s in searches.values())
        stats["milp_seconds"] = round(_time.perf_counter() - started, 3)
        # a search the time cap cut short found less than its counted work would: kept (so the plans
        # of one process agree), but every plan made with these menus says so (`solve`)
        stats["milp_cut"] = any(s.cut for s in searches.values()) or len(models) < len(firsts)
    return {k: [_positions(firsts[k], o) for o in menu] for k, menu in menus.items()}, stats


def _measure(chain: Chain, b: Block, menu: list[Positions],
             deadline: Deadline | None = None) -> list[BlockOption]:
    """The menu's options measured on block `b`; past `deadline` only its first, store-all (rotor's)."""
    nodes = (*b.forward, *b.backward)
    if deadline is not None and deadline.expired("rockmate: block menus not measured"):
        menu = menu[:1]
    opts = [sequence_option(chain, b, [nodes[i] for i in f], [nodes[i] for i in bw]) for f, bw in menu]
    if opts[0].kept != store_all(chain, b).kept:  # index 0: rotor's store-all, on every block
        raise AssertionError(f"block {b.index}: the menu lost the store-all option")
    return opts


def milp_time(time_limit: float) -> float:
    """The block MILPs' safety cap for a solve limited to `time_limit` seconds: `MILP_SECONDS`, at most
    half the limit."""
    return min(MILP_SECONDS, time_limit / 2)


def solve(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0,
          milp_seconds: float | None = None, deadline: Deadline | None = None) -> SolveResult:
    """Rockmate: block menus + rk-Rotor; InfeasibleBudget carries the smallest budget it reaches.
    `milp_seconds`: the block MILPs' safety cap (default `MILP_SECONDS`, at most half of `time_limit`;
    0 leaves the menus to the kept-subset options); their work is `MILP_WORK`.  Returns
    by `time_limit` seconds (or `deadline`, the earlier): Rotor's DP runs first (`OutOfTime` when even
    it does not finish), then the block menus, cut to what was measured past half of the time left;
    when the DP over the menus does not finish, Rotor's plan is the answer."""
    started = _time.monotonic()
    deadline = Deadline.of(time_limit, deadline)
    quick = no_recompute_result(graph, budget_bytes, "rockmate", started)
    if quick is not None:
        return quick
    chain = chain_of(graph)
    if not chain.training:
        raise infeasible(graph, budget_bytes, None, "rockmate")
    try:
        # Rotor's DP first (shared with rotor): under a short limit its plan is the best one found in time
        rotor_dp = store_all_solver(graph, deadline)[1]
    except OutOfTime as exc:
        raise exc.within(budget_bytes, "rockmate") from None
    if milp_seconds is None:
        milp_seconds = milp_time(min(time_limit, deadline.left()))
    key = (graph, MILP_WORK if milp_seconds > 0 else 0)
    cached = _MENUS.get(key)
    if cached is None:
        # past half the time left, remaining classes get only rotor's two options (the DP is fast)
        by_class, stats = class_menus(chain, deadline=deadline.part(0.5), milp_seconds=milp_seconds,
                                      until=deadline)
        if not stats["enumeration_cut"]:
            _MENUS.put(key, (by_class, stats))
    else:
        _MENUS.put(key, cached)  # used again: the most recent
        by_class, stats = cached
        if stats.get("milp_cut"):
            note_cut("rockmate: block MILPs (menus kept from an earlier solve)")
    stats = {**stats, "menus_cached": cached is not None}
    menus = [_measure(chain, b, by_class[b.klass], deadline) for b in chain.blocks]
    # The DP rounds sizes to slots and its proposals are re-costed in bytes (`ChainSolver`), so the
    # larger menu's proposals need not include rotor's plan that fits: rotor's DP over the store-all
    # options (index 0, the same in both) runs too and the faster plan is kept, so that at equal budget
    # rockmate is never worse than rotor.  Both DPs are kept for the next call (rotor's shared with it).
    complete = not stats["enumeration_cut"] and all(
        len(m) == len(by_class[b.klass]) for m, b in zip(menus, chain.blocks, strict=True))
    try:
        solvers = [rotor_dp]
        try:
            solvers.insert(0, _menus_solver(chain, key if complete else None, menus, deadline))
        except OutOfTime:
            stats["menus_dp_cut"] = True  # the best plan found in time is rotor's
            note_cut("rockmate: DP over the block menus")
        plans = [p for p in (s.plan(budget_bytes, deadline) for s in solvers) if p is not None]
    except OutOfTime as exc:
        raise exc.within(budget_bytes, "rockmate") from None
    if not plans:
        raise infeasible(graph, budget_bytes, min(s.min_budget(deadline) for s in solvers), "rockmate")
    plan = min(plans, key=lambda p: p.time)
    return checked_result(chain, menus, plan, budget_bytes, "rockmate", started,
                          {"slot_bytes": solvers[0].unit, "model_time": plan.time,
                           "classes": len(by_class), "options": sum(len(m) for m in menus), **stats})


#: the DPs over the menus of `_MENUS` (same keys): a graph planned at several budgets solves each once
_DPS: RecentMemo[tuple[Graph, int], ChainSolver] = RecentMemo(CACHED_GRAPHS)


def _menus_solver(chain: Chain, key: tuple[Graph, int] | None, menus: list[list[BlockOption]],
                  deadline: Deadline) -> ChainSolver:
    """The DP over `menus`, kept under `key` unless it is None (menus cut short by the deadline)."""
    found = None if key is None else _DPS.get(key)
    if found is None:
        found = ChainSolver(chain, menus, deadline=deadline)
    if key is not None:
        _DPS.put(key, found)
    return found
