"""Fit buffers into a fixed capacity by canonical search (Moffitt, "MiniMalloc: A Lightweight Memory
Allocator for Hardware-Accelerated Machine Learning", ASPLOS 2023, Sec. 4: the search and its
pruning rules).

The decision problem: give every buffer ``(start, end, size)`` (alive during ``[start, end)``) an
integer offset so that buffers alive together never share an address and every ``offset + size`` is
at most `capacity`.  What this module takes from the paper (its own code, not a port; in brackets,
the switch that names each rule in MiniMalloc's solver, src/solver.h):

- *Sections*: the set of buffers alive just before each distinct end time.  Two buffers overlap in
  time exactly when they share a section, and every step's live set is contained in one, so
  sections are the only places where sizes need to be summed.
- *Canonical solutions* [canonical_only]: buffers are placed one at a time, each at its lowest
  offset above the placed buffers it overlaps, in non-decreasing offset order (ties in a fixed
  preorder).  Every feasible instance has such a solution, so enumerating only these keeps the
  search complete.
- *Inference* [section_inference, unallocated_floor, monotonic_floor]: in every section the
  unplaced buffers stack above the section's floor (the top of its last placed buffer, raised to
  the lowest offset any unplaced member can still take, and never below the current offset, since
  offsets only grow).  A partial placement whose floor plus unplaced total exceeds the capacity in
  any section is cut at once.
- *Dominance* [check_dominance, hatless_pruning]: no buffer is placed at or above the lowest top an
  unplaced buffer could reach (that buffer would fit into the gap below, a solution the search
  meets elsewhere); and when a placed buffer has no unplaced buffer overlapping it ("hatless"), a
  failure below it means every alternative at this node fails too.
- *Decomposition* [dynamic_decomposition]: once no unplaced buffer crosses the boundary between two
  sections, the two sides are independent and are solved one after the other; a failure of either
  fails both.
- *Preorders with restarts* [preordering_heuristics]: the static orders TAW, TWA and WAT
  (descending by T = the largest unplaced total of a buffer's sections, A = area, W = lifetime
  width) are tried in turn with a node limit that doubles each round.

The search is exact: "infeasible" is a proof, a placement is returned only after an independent
overlap and capacity check (`solvers.olla.pack.validate_packing`), and the `Deadline` is checked at
every node.  Python with numpy: the state (lowest offsets, section floors and totals) lives in arrays
changed in place and restored from undo logs, and each placement is a handful of vector operations
over the buffers it overlaps and the sections they cover.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from solvers.deadline import Deadline

#: preorders tried in turn (MiniMalloc's defaults in the order TAW, TWA, WAT: fewest nodes on A-D)
PREORDERS: tuple[str, ...] = ("TAW", "TWA", "WAT")

Outcome = Literal["fits", "infeasible", "out-of-time", "out-of-work"]

#: above this many (buffer, section) pairs the section member lists are not built (~8 bytes each) and
#: the floors of sections rise only under the placed buffer (no unplaced-floor inference); above this
#: many overlapping pairs the overlap lists are not kept (found by a vector test at each placement)
MAX_SECTION_ENTRIES = 4_000_000

#: seconds of search in the calling process before a portfolio of processes takes over
SOLO_SECONDS = 0.25

_BIG = np.iinfo(np.int64).max // 4  # the lowest offset of a placed buffer: never a candidate


@dataclass(frozen=True)
class CanonicalResult:
    """`offsets` (same order as the buffers) when `outcome` is "fits"; "infeasible" is proved by the
    exhausted search; "out-of-time" and "out-of-work" prove nothing.  `nodes`: search nodes visited in
    all rounds (of a portfolio, those of the processes that reported)."""

    outcome: Outcome
    offsets: tuple[int, ...] | None
    nodes: int


class _Abort(Exception):
    """The node limit of this round ran out."""


class _OutOfTime(Exception):
    pass


class _Instance:
    """The sections of the buffers (the sweep of MiniMalloc's solver), computed once."""

    def __init__(self, buffers: Sequence[tuple[int, int, int]]) -> None:
        start = np.array([s for s, _, _ in buffers], dtype=np.int64)
        end = np.array([e for _, e, _ in buffers], dtype=np.int64)
        self.size = np.array([z for _, _, z in buffers], dtype=np.int64)
        ends = np.unique(end)
        # buffer b is alive in the sections k with start < ends[k] <= end: a contiguous range [lo, hi)
        self.lo = np.searchsorted(ends, start, side="right")
        self.hi = np.searchsorted(ends, end, side="left") + 1
        self.sections = len(ends)
        spans = self.hi - self.lo
        self.members: np.ndarray | None = None  # None: too large to list (no unplaced-floor inference)
        self.reach = list(zip(self.lo.tolist(), self.hi.tolist(), strict=True))
        # overlaps[b]: the buffers alive together with b, b included (they share a section); kept
        # while small, else found by a vector test at each placement
        self.overlaps: list[np.ndarray] | None = None
        if int(spans.sum()) <= MAX_SECTION_ENTRIES:
            # members of each section, concatenated in section order (section k:
            # members[first[k]:first[k + 1]])
            buffer = np.repeat(np.arange(len(buffers)), spans)
            section = np.arange(buffer.size) - np.repeat(np.cumsum(spans) - spans, spans) + self.lo[buffer]
            self.members = buffer[np.argsort(section, kind="stable")]
            self.first = np.concatenate(([0], np.cumsum(np.bincount(section, minlength=self.sections))))
            # reach[b]: the sections of b and of every buffer alive together with it
            overlaps, kept = [], 0
            for b, (lo, hi) in enumerate(self.reach):
                near = ((self.lo < hi) & (self.hi > lo)).nonzero()[0]
                self.reach[b] = (int(self.lo[near].min()), int(self.hi[near].max()))
                overlaps.append(near)
                kept += near.size
            self.overlaps = overlaps if kept <= MAX_SECTION_ENTRIES else None
        self.width = end - start
        self.area = self.size * self.width


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i]:hi[i]]) for every i (each range non-empty), by a sparse table: the max over
    the two power-of-two windows that cover each range."""
    table = [values]
    while 2 ** len(table) <= values.size:
        half = 2 ** (len(table) - 1)
        table.append(np.maximum(table[-1][:-half], table[-1][half:]))
    level = np.floor(np.log2(hi - lo)).astype(np.int64)
    out = np.empty(lo.size, dtype=values.dtype)
    for k in np.unique(level).tolist():
        at = level == k
        out[at] = np.maximum(table[k][lo[at]], table[k][hi[at] - 2**k])
    return out


class _Search:
    """One round of the depth-first search under one preorder and a node limit."""

    def __init__(self, inst: _Instance, capacity: int, preorder: str, node_limit: int,
                 deadline: Deadline) -> None:
        self.inst = inst
        self.capacity = capacity
        self.preorder = preorder
        self.nodes_left = node_limit
        self.deadline = deadline
        n = len(inst.size)
        self.solution = [-1] * n
        # lowest offset each unplaced buffer can take (_BIG once placed; slot n is a sentinel)
        self.min_off = np.zeros(n + 1, dtype=np.int64)
        self.min_off[n] = _BIG
        self.floor = np.zeros(inst.sections, dtype=np.int64)
        self.total = np.zeros(inst.sections + 1, dtype=np.int64)
        np.add.at(self.total, inst.lo, inst.size)
        np.add.at(self.total, inst.hi, -inst.size)
        self.total = np.cumsum(self.total)[:-1]
        # cuts[k]: unplaced buffers alive in both section k and k + 1
        cuts = np.zeros(inst.sections + 1, dtype=np.int64)
        np.add.at(cuts, inst.lo, 1)
        np.add.at(cuts, inst.hi - 1, -1)
        self.cuts = np.cumsum(cuts)[: max(inst.sections - 1, 0)]

    def solve(self) -> list[int] | None:
        everyone = np.arange(len(self.inst.size))
        for members, s0, s1 in self._split(everyone, 0, self.inst.sections, np.flatnonzero(self.cuts == 0)):
            if not self._subsolve(members, s0, s1):
                return None
        return self.solution

    def _split(self, members: np.ndarray, s0: int, s1: int,
               cutpoints: np.ndarray) -> list[tuple[np.ndarray, int, int]]:
        """`members` (unplaced) split at the section boundaries after `cutpoints` (ascending)."""
        bounds = [s0, *(cutpoints + 1).tolist(), s1]
        lo, hi = self.inst.lo[members], self.inst.hi[members]
        parts = []
        for a, z in zip(bounds, bounds[1:], strict=False):
            group = members[(lo < z) & (hi > a)]
            if group.size:
                parts.append((group, a, z))
        return parts

    def _subsolve(self, members: np.ndarray, s0: int, s1: int) -> bool:
        """A fresh canonical search of one independent part, preordered by its current totals."""
        inst = self.inst
        keys = {
            "T": _range_max(self.total, inst.lo[members], inst.hi[members]),
            "A": inst.area[members],
            "W": inst.width[members],
        }
        # lexsort: last key first; ties by buffer index
        order = members[np.lexsort((members, *(-keys[c] for c in reversed(self.preorder))))]
        rank = np.empty(len(inst.size) + 1, dtype=np.int64)
        rank[order] = np.arange(order.size)
        return self._search(order, rank, s0, s1, 0, -1)

    def _search(self, order: np.ndarray, rank: np.ndarray, s0: int, s1: int, last_off: int,
                last_rank: int) -> bool:
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise _Abort
        if self.deadline.expired("olla: canonical packing search"):
            raise _OutOfTime
        offs = self.min_off[order]
        live = offs < _BIG
        todo, offs = order[live], offs[live]
        if not todo.size:
            return True
        # dominance: nothing goes at or above the lowest top an unplaced buffer can reach (it would
        # fit in the gap below); inference: all later offsets are >= off, so every section of the
        # part must hold its unplaced total above off
        ceiling = min(int((offs + self.inst.size[todo]).min()),
                      self.capacity - int(self.total[s0:s1].max()) + 1)
        # canonical: (offset, preorder rank) never goes down; one key orders both (ranks < n)
        n = self.min_off.size
        key = offs * n + rank[todo]
        ok = (offs < ceiling) & (key >= last_off * n + last_rank)
        todo, offs, key = todo[ok], offs[ok], key[ok]
        by = np.argsort(key)  # by offset, ties in preorder
        # in chunks: a node rarely tries more than a few children, and a part can have thousands
        for first in range(0, by.size, 32):
            chunk = by[first : first + 32]
            for b, off in zip(todo[chunk].tolist(), offs[chunk].tolist(), strict=True):
                found, hatless = self._place(b, off, order, rank, s0, s1)
                if found:
                    return True
                if hatless:
                    return False  # nothing unplaced overlaps b, so no alternative here can fare better
        return False

    def _place(self, b: int, off: int, order: np.ndarray, rank: np.ndarray, s0: int,
               s1: int) -> tuple[bool, bool]:
        """Place `b` at `off`, search on, undo: (a placement of the part was found, b is hatless:
        no unplaced buffer overlaps it)."""
        inst, min_off, floor, total = self.inst, self.min_off, self.floor, self.total
        z = int(inst.size[b])
        top = off + z
        lo, hi = int(inst.lo[b]), int(inst.hi[b])
        min_off[b] = _BIG
        self.solution[b] = off
        # the unplaced buffers alive together with b (they share a section); those below b's top rise
        near = (inst.overlaps[b] if inst.overlaps is not None
                else ((inst.lo < hi) & (inst.hi > lo)).nonzero()[0])
        was = min_off[near]
        below = was < top
        raised, old = near[below], was[below]
        min_off[raised] = top
        # the sections whose floor can move: those of b and of every buffer overlapping it, within this
        # part (beyond it lie parts solved on their own, whose offsets start again from 0)
        a0, a1 = max(inst.reach[b][0], s0), min(inst.reach[b][1], s1)
        saved = floor[a0:a1].copy()
        floor[lo:hi] = top
        total[lo:hi] -= z
        # a section's floor is at least the lowest offset any of its unplaced buffers can take
        new = floor[a0:a1]
        if inst.members is not None:
            first = inst.first
            lowest = np.minimum.reduceat(min_off[inst.members[first[a0]:first[a1]]],
                                         first[a0:a1] - first[a0])
            new = np.maximum(new, np.where(lowest < _BIG, lowest, 0))
            floor[a0:a1] = new
        # inference: each section's unplaced buffers stack above its floor (and above off)
        found = int((np.maximum(new, off) + total[a0:a1]).max()) <= self.capacity and self._descend(
            b, off, order, rank, s0, s1)
        floor[a0:a1] = saved
        total[lo:hi] += z
        min_off[raised] = old
        min_off[b] = off
        return found, bool((was == _BIG).all())  # b's own entry was _BIG too

    def _descend(self, b: int, off: int, order: np.ndarray, rank: np.ndarray, s0: int, s1: int) -> bool:
        """Go on in the same part, or in each independent part once `b` was the last buffer joining
        two sections (decomposition)."""
        lo, hi = int(self.inst.lo[b]), int(self.inst.hi[b])
        cuts = self.cuts[lo : hi - 1]
        cuts -= 1
        try:
            cutpoints = (cuts == 0).nonzero()[0]
            if not cutpoints.size:
                return self._search(order, rank, s0, s1, off, int(rank[b]))
            left = order[self.min_off[order] < _BIG]
            for members, a, z in self._split(left, s0, s1, cutpoints + lo):
                if not self._subsolve(members, a, z):
                    return False
            return True
        finally:
            cuts += 1


def _round_robin(inst: _Instance, capacity: int, preorders: Sequence[str],
                 deadline: Deadline, max_nodes: int | None = None) -> tuple[Outcome, list[int] | None, int]:
    """The preorders in turn, each with a node limit that doubles every round (as MiniMalloc does; a
    single preorder gets no limit), `max_nodes` in all (None: no limit; "out-of-work" past it):
    (outcome, offsets of the instance's buffers or None, nodes)."""
    total = sys.maxsize // 4 if max_nodes is None else max_nodes
    limit = len(inst.size) if len(preorders) > 1 else total
    nodes = 0
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10 * len(inst.size) + 1000))  # three frames per placed buffer
    try:
        while True:
            limit *= 2
            for name in preorders:
                if nodes >= total:
                    return "out-of-work", None, nodes
                allowed = min(limit, total - nodes)
                search = _Search(inst, capacity, name, allowed, deadline)
                try:
                    found = search.solve()
                except _Abort:
                    nodes += allowed
                    continue
                except _OutOfTime:
                    return "out-of-time", None, nodes + allowed - search.nodes_left
                nodes += allowed - search.nodes_left
                return ("infeasible" if found is None else "fits"), found, nodes
    finally:
        sys.setrecursionlimit(old)


def _worker(inst: _Instance, capacity: int, preorders: Sequence[str], at: float, queue: Any) -> None:
    queue.put(_round_robin(inst, capacity, preorders, Deadline(at)))


def _portfolio(inst: _Instance, capacity: int, preorders: Sequence[str], deadline: Deadline,
               processes: int) -> tuple[Outcome, list[int] | None, int]:
    """`_round_robin` over disjoint groups of the preorders in `processes` forked processes; the first
    fit or proof wins and the others are stopped.  Each preorder's search is complete, so any
    process's "infeasible" is a proof."""
    import multiprocessing
    import queue as queues

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(inst, capacity, preorders[k::processes], deadline.at, results),
                         daemon=True) for k in range(processes)]
    for proc in procs:
        proc.start()
    nodes = 0
    try:
        for _ in procs:
            try:
                outcome, found, visited = results.get(timeout=deadline.left() + 1.0)
            except queues.Empty:
                break  # a worker died or overran: what is known is that nothing was found in time
            nodes += visited
            if outcome != "out-of-time":
                return outcome, found, nodes
        return "out-of-time", None, nodes
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()


def canonical_fit(buffers: Sequence[tuple[int, int, int]], capacity: int, deadline: Deadline,
                  *, preorders: Sequence[str] = PREORDERS, processes: int = 1,
                  max_nodes: int | None = None) -> CanonicalResult:
    """Offsets with every ``offset + size <= capacity`` and no two time-overlapping buffers sharing an
    address, by MiniMalloc's canonical search; or a proof that none exists; or out of time; or, in
    one process, out of work (`max_nodes` search nodes: a bound that is the same on any machine).

    With `processes` > 1 (and where processes can be forked), an instance not settled within
    `SOLO_SECONDS` in this process goes to that many processes racing each other over the preorders
    (a portfolio: one preorder often needs 10x fewer nodes than another, and which one differs by
    instance; the first seconds in-process spare easy instances the cost of forking).  Zero-size
    buffers get offset 0.  Offsets are checked by `validate_packing` before they are returned (a
    failed check is a bug and raises)."""
    import multiprocessing

    from solvers.olla.pack import validate_packing

    nonzero = [i for i, (_, _, z) in enumerate(buffers) if z > 0]
    sub = [tuple(buffers[i]) for i in nonzero]
    if any(z > capacity for _, _, z in sub):
        return CanonicalResult("infeasible", None, 0)
    if not sub:
        return CanonicalResult("fits", tuple(0 for _ in buffers), 0)
    if capacity >= _BIG // (len(sub) + 1):  # the search's (offset, rank) keys must fit in int64
        raise ValueError(f"capacity {capacity} is too large for {len(sub)} buffers")
    inst = _Instance(sub)  # type: ignore[arg-type]
    if int(_Search(inst, capacity, preorders[0], 1, deadline).total.max()) > capacity:
        return CanonicalResult("infeasible", None, 0)
    processes = min(processes, len(preorders))
    if processes > 1 and "fork" in multiprocessing.get_all_start_methods():
        solo = Deadline(min(deadline.at, Deadline.after(SOLO_SECONDS).at))
        outcome, found, nodes = _round_robin(inst, capacity, preorders, solo)
        if outcome == "out-of-time":
            outcome, found, more = _portfolio(inst, capacity, preorders, deadline, processes)
            nodes += more
    else:
        outcome, found, nodes = _round_robin(inst, capacity, preorders, deadline, max_nodes)
    if found is None:
        return CanonicalResult(outcome, None, nodes)
    offsets = [0] * len(buffers)
    for i, o in zip(nonzero, found, strict=True):
        offsets[i] = o
    problems = validate_packing([tuple(b) for b in buffers], offsets, capacity)
    if problems:
        raise AssertionError("canonical search placed overlapping buffers: " + problems[0])
    return CanonicalResult("fits", tuple(offsets), nodes)
