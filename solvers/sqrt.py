"""Chen et al. 2016, "Training deep nets with sublinear memory cost": split the block chain into
~sqrt(n) segments, keep only each segment's input during the forward, and recompute one segment at a
time (storing everything inside it) during the backward.

The segment plan is written as block-level operations of the Rotor model (`solvers.rotor`), so it is
costed with exactly the same memory model and slot size: Rotor's optimum can never be worse.
"""

from __future__ import annotations

import math
import time as _time

from solvers.chain import Chain, store_all
from solvers.deadline import Deadline
from solvers.ir import Graph
from solvers.result import SolveResult
from solvers.rotor import (
    ChainModel,
    ChainPlan,
    Op,
    chain_of,
    chain_schedule,
    checked_result,
    evaluate,
    infeasible,
    no_recompute_result,
    quantized_model,
    tail_requirement,
)
from solvers.simulate import simulate


def segments(n: int, count: int) -> list[tuple[int, int]]:
    """`count` contiguous, nearly equal segments of blocks 0..n-1 as (first, last) pairs."""
    count = max(1, min(n, count))
    bounds = [round(i * n / count) for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]


def segment_ops(segs: list[tuple[int, int]]) -> list[Op]:
    """Forward: every segment but the last runs keeping only its output; the last stores everything.
    Backward: the last segment first; each earlier one is recomputed with everything stored."""
    def run(i: int) -> list[Op]:
        first, last = segs[i]
        store: list[Op] = [("F", k, 0) for k in range(first, last + 1)]
        store += [("B", k, 0) for k in range(last, first - 1, -1)]
        if i == len(segs) - 1:
            return store
        sweep: list[Op] = [("F0", first, False)] + [("F0", k, True) for k in range(first + 1, last + 1)]
        return sweep + run(i + 1) + [("free", last)] + store

    return run(0)


def candidates(n: int) -> list[int]:
    """sqrt(n) first, then the other segment counts, closest to sqrt(n) first."""
    root = max(1, round(math.sqrt(n)))
    return sorted(range(1, n + 1), key=lambda c: (abs(c - root), c))


def plan_for(chain: Chain, model: ChainModel, count: int) -> ChainPlan:
    ops = segment_ops(segments(len(chain.blocks), count))
    peak, t = evaluate(model, ops)
    return ChainPlan(tuple(ops), chain.resident_bytes() + peak * model.unit, t)


def solve(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0,
          deadline: Deadline | None = None) -> SolveResult:
    """No recomputation when that fits; else sqrt(n) segments when they fit; otherwise the cheapest
    equal segmenting that fits.  No search: `time_limit` and `deadline` are accepted for the common
    solver signature (one chain decomposition and n plan evaluations, far below any limit)."""
    started = _time.monotonic()
    quick = no_recompute_result(graph, budget_bytes, "sqrt", started)
    if quick is not None:
        return quick
    chain = chain_of(graph)
    if not chain.training:
        raise infeasible(graph, budget_bytes, None, "sqrt")
    menus = [[store_all(chain, b)] for b in chain.blocks]
    model = quantized_model(chain, menus)
    tail = tail_requirement(chain)
    order = candidates(len(chain.blocks))
    plans = {c: plan_for(chain, model, c) for c in order}

    def peak(c: int) -> int:
        """The simulated peak (the block-level model only bounds it from above, with the tail's)."""
        bound = max(plans[c].model_peak_bytes, tail)
        if bound <= budget_bytes:
            return bound
        return simulate(graph, chain_schedule(chain, menus, plans[c].ops)).peak_bytes

    peaks = {c: peak(c) for c in order}
    fits = [c for c in order if peaks[c] <= budget_bytes]
    if not fits:
        raise infeasible(graph, budget_bytes, min(peaks.values()), "sqrt")
    count = order[0] if order[0] in fits else min(fits, key=lambda c: (plans[c].time, c))
    return checked_result(chain, menus, plans[count], budget_bytes, "sqrt", started,
                          {"segments": count, "slot_bytes": model.unit, "model_time": plans[count].time})
