"""Exhaustive rematerialization search on small CD-graphs: the reference optimum for solver tests.

States are sets of alive produced tensors (sources are always alive and never freed, as in every remat
solver here).  A move computes a node whose inputs are alive (if the resident set, its new outputs and
its workspace fit the budget) or frees an alive tensor that is not a required output (the caller
holds those); Dijkstra on total compute time finds the
cheapest schedule that leaves every graph output alive, recomputation allowed.  Reaching the outputs
implies every required node ran (each was needed to produce them).

`frontier=True` restricts the search to Checkmate's schedule class (Checkmate Sec. 4.3: first
computations in capture order, each stage recomputing earlier nodes in ascending order, each at most
once, before its new node), which is what the exact MILP optimises over; without it, any order.
Exponential: meant for graphs of about 8 compute nodes and 16 produced tensors.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from solvers import Graph, Schedule, compute, free


@dataclass(frozen=True)
class Optimum:
    time: float
    peak_bytes: int
    schedule: Schedule


def _setup(graph: Graph):
    order = sorted(graph.required_computes)
    produced = [d.id for d in graph.datas if d.producer is not None and d.producer in graph.required_computes]
    if len(produced) > 24:
        raise ValueError(f"brute force is for small graphs: {len(produced)} produced tensors")
    bit = {d: 1 << i for i, d in enumerate(produced)}
    size = [graph.datas[d].bytes for d in produced]
    need = [0] * len(graph.computes)
    outs = [0] * len(graph.computes)
    for c in order:
        for d in graph.computes[c].inputs:
            need[c] |= bit.get(d, 0)
        for d in graph.computes[c].outputs:
            outs[c] |= bit[d]
    target = 0
    for d in graph.outputs:
        target |= bit.get(d, 0)
    return order, produced, bit, size, need, outs, target


def _bytes(mask: int, size: list[int]) -> int:
    total = 0
    i = 0
    while mask:
        if mask & 1:
            total += size[i]
        mask >>= 1
        i += 1
    return total


def _moves(graph: Graph, state: tuple, order: list[int], need: list[int], outs: list[int], frontier: bool):
    """(compute node, next frontier position, next stage position) for every allowed compute."""
    mask = state[0]
    if not frontier:
        for c in order:
            if need[c] & mask == need[c]:
                yield c, state
        return
    _, t, k = state
    n = len(order)
    if t >= n:
        return
    for j in range(k + 1, t + 1):
        c = order[j]
        if need[c] & mask == need[c]:
            yield c, (mask, t + 1, -1) if j == t else (mask, t, j)


def _search(graph: Graph, budget: int | None, frontier: bool, minimax: bool) -> Optimum | None:
    order, produced, bit, size, need, outs, target = _setup(graph)
    base = graph.persistent_bytes()
    temp = [c.temp_bytes for c in graph.computes]
    time = [c.time for c in graph.computes]
    start = (0, 0, -1) if frontier else (0,)
    if budget is not None and base > budget:
        return None
    n = len(order)
    mem_cache: dict[int, int] = {}

    def mem(mask: int) -> int:
        v = mem_cache.get(mask)
        if v is None:
            v = mem_cache[mask] = _bytes(mask, size)
        return v

    # key: (time, peak) for the optimum, (peak, time) for the minimum budget
    best: dict[tuple, tuple[float, int]] = {start: (0.0, base)}
    parent: dict[tuple, tuple[tuple, object]] = {}
    tie = itertools.count()
    heap = [((0.0, base) if not minimax else (base, 0.0), next(tie), start)]
    while heap:
        key, _, state = heapq.heappop(heap)
        cost, peak = key if not minimax else (key[1], key[0])
        if best.get(state) != (cost, peak):
            continue
        mask = state[0]
        if mask & target == target and (not frontier or state[1] >= n):
            steps = []
            s = state
            while s in parent:
                s, step = parent[s]
                steps.append(step)
            return Optimum(cost, peak, tuple(reversed(steps)))
        succ = []
        for c, nxt in _moves(graph, state, order, need, outs, frontier):
            during = base + mem(mask | outs[c]) + temp[c]
            if budget is not None and during > budget:
                continue
            succ.append(((mask | outs[c], *nxt[1:]), cost + time[c], max(peak, during), compute(c)))
        rest = mask & ~target  # required outputs are never freed once produced
        while rest:
            low = rest & -rest
            d = produced[low.bit_length() - 1]
            succ.append(((mask & ~low, *state[1:]), cost, peak, free(d)))
            rest &= rest - 1
        for ns, nc, np_, step in succ:
            old = best.get(ns)
            new_key = (nc, np_) if not minimax else (np_, nc)
            if old is not None:
                old_key = old if not minimax else (old[1], old[0])
                if old_key <= new_key:
                    continue
            best[ns] = (nc, np_)
            parent[ns] = (state, step)
            heapq.heappush(heap, (new_key, next(tie), ns))
    return None


def optimum(graph: Graph, budget: int, *, frontier: bool = False) -> Optimum | None:
    """Minimum total compute time of any valid schedule whose peak fits `budget` (None: none fits)."""
    return _search(graph, budget, frontier, minimax=False)


def min_budget(graph: Graph, *, frontier: bool = False) -> int:
    """The smallest budget any valid schedule fits in (minimax path over the same state space)."""
    found = _search(graph, None, frontier, minimax=True)
    assert found is not None, "every graph has some valid schedule"
    return found.peak_bytes
