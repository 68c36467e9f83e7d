"""Rockmate (Zhao et al. 2023, /work/shared/papers/rockmate.txt): the block chain of `solvers.chain`,
a menu of block-level schedules per class of identical blocks (Sec. 3.3), and the rk-Rotor dynamic
program over the menus (Sec. 3.4, Appendix C), expanded to a full schedule and simulated.

Block options.  An option keeps a subset K of the data the block's backward reads (its output cut is
always kept); the backward regenerates the dropped data by recomputing the forward nodes that produce
them, right before the first backward node that needs them, and every tensor is freed at its last
use.  For blocks with at most `EXACT_SUBSETS` such data every subset is measured (exact enumeration
over kept sets); larger blocks get nested greedy families of up to `GREEDY_STEPS` sets each (drop
the largest data first, and drop the data cheapest to recompute per byte first).  Options are then
picked over a grid of (kept bytes, block peak) budget pairs as in Sec. 3.3: per pair, the fastest.
Options are searched once per class and measured on every member block.  Rotor's store-everything
option is always on the menu, so at equal budget rockmate is never worse than rotor.
Not implemented: the per-block MILP (rk-Checkmate) and
recomputation inside a block's forward.
"""

from __future__ import annotations

import itertools
import time as _time

from solvers.chain import Block, BlockOption, Chain, block_option, decompose, local_data, store_all
from solvers.ir import Graph
from solvers.result import SolveResult
from solvers.rotor import ChainSolver, checked_result, infeasible, no_recompute_result

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


def _peak(o: BlockOption) -> int:
    return max(o.fwd_peak, o.keep + o.bwd_peak)


def _menu(options: list[BlockOption], grid: int) -> list[int]:
    """Indices of the options chosen over a grid of (kept bytes, peak) budget pairs; store-all
    (index 0) first."""
    keeps = sorted({o.keep for o in options})
    peaks = sorted({_peak(o) for o in options})

    def levels(vals: list[int]) -> list[int]:
        if len(vals) <= grid:
            return vals
        lo, hi = vals[0], vals[-1]
        return sorted({lo + (hi - lo) * i // (grid - 1) for i in range(grid)} | {hi})

    chosen = [0]
    for kb in levels(keeps):
        for pb in levels(peaks):
            fit = [i for i, o in enumerate(options) if o.keep <= kb and _peak(o) <= pb]
            if fit:
                best = min(fit, key=lambda i: (options[i].fwd_time + options[i].bwd_time,
                                               options[i].keep, _peak(options[i]), i))
                if best not in chosen:
                    chosen.append(best)
    return chosen


def menus_for(chain: Chain, *, grid: int = GRID, deadline: float | None = None) -> list[list[BlockOption]]:
    """Option menus for every block, searched once per class of identical blocks."""
    g = chain.graph
    by_class: dict[int, tuple[Block, list[list[int]]]] = {}
    for b in chain.blocks:
        if b.klass in by_class:
            continue
        local = {d: i for i, d in enumerate(local_data(b, g))}
        kept_sets = _kept_sets(chain, b)
        if deadline is not None and _time.monotonic() > deadline:
            kept_sets = [frozenset(_candidates(chain, b))]
        opts = [block_option(chain, b, b.saved)]
        opts += [block_option(chain, b, k) for k in kept_sets]
        picked = _menu(opts, grid)
        by_class[b.klass] = (b, [sorted(local[d] for d in opts[i].kept) for i in picked])
    menus = []
    for b in chain.blocks:
        _, kept_local = by_class[b.klass]
        mine = local_data(b, g)
        menus.append([block_option(chain, b, [mine[i] for i in k]) for k in kept_local])
    for b, menu in zip(chain.blocks, menus, strict=True):  # index 0: rotor's store-all, on every block
        if menu[0].kept != store_all(chain, b).kept:
            raise AssertionError(f"block {b.index}: the menu lost the store-all option")
    return menus


def solve(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0) -> SolveResult:
    """Rockmate: block menus + rk-Rotor; InfeasibleBudget carries the smallest budget it reaches."""
    started = _time.monotonic()
    quick = no_recompute_result(graph, budget_bytes, "rockmate", started)
    if quick is not None:
        return quick
    chain = decompose(graph)
    if not chain.training:
        raise infeasible(graph, budget_bytes, None, "rockmate")
    # past half the time limit, remaining classes get only rotor's two options (the DP is fast)
    menus = menus_for(chain, deadline=started + time_limit / 2)
    solver = ChainSolver(chain, menus)
    plan = solver.plan(budget_bytes)
    if plan is None:
        raise infeasible(graph, budget_bytes, solver.min_budget(), "rockmate")
    return checked_result(chain, menus, plan, budget_bytes, "rockmate", started,
                          {"slot_bytes": solver.unit, "model_time": plan.time,
                           "classes": len({b.klass for b in chain.blocks}),
                           "options": sum(len(m) for m in menus)})
