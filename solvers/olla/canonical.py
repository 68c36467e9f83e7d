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
- *Preorders* [preordering_heuristics]: the static orders TAW, TWA and WAT (descending by T = the
  largest unplaced total of a buffer's sections, A = area, W = lifetime width).  Which one needs the
  fewest nodes differs by instance, often by 10-100x (on the challenging set A-K: TWA 4,920 nodes on A
  where WAT needs 94,944; TAW 16,669 on B where the others pass 280,000).  MiniMalloc tries them in
  turn with a node limit that doubles each round, restarting each search from scratch; here the three
  searches are suspended and resumed instead (generators), taking turns of `SLICE_NODES` nodes, so no
  node is visited twice and a fit costs about three times the best preorder's nodes (B: 81k nodes by
  restarts, 50k resumed; E: 127k and 55k).  The turns are counted in nodes, so the search is the same
  on any machine and under any load.  With several processes (`canonical_fit(processes=...)`) the
  preorders race, one group each, and the answer is still fixed: that of the group needing the fewest
  nodes (`_portfolio`), which costs about that group's nodes in wall time (E: 18k).

The search is exact: "infeasible" is a proof, a placement is returned only after an independent
overlap and capacity check (`solvers.olla.pack.validate_packing`), and the `Deadline` is checked at
every node.  Python with numpy: the state (lowest offsets, section floors and totals) lives in arrays
changed in place and restored from undo logs, and each placement is a handful of vector operations
over the buffers it overlaps and the sections they cover.  Most placements fail the inference (about
two of the three per node on the challenging set), so it is computed on copies before any floor or
total is written; numpy's per-call overhead, not the arithmetic, is most of the cost of a node (about
40-75 us of CPU on A-K).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from solvers.deadline import Deadline, note_cut

#: preorders tried in turn (MiniMalloc's defaults in the order TAW, TWA, WAT: fewest nodes on A-D)
PREORDERS: tuple[str, ...] = ("TAW", "TWA", "WAT")

Outcome = Literal["fits", "infeasible", "out-of-time", "out-of-work"]

#: above this many (buffer, section) pairs the section member lists are not built (~8 bytes each) and
#: the floors of sections rise only under the placed buffer (no unplaced-floor inference); above this
#: many overlapping pairs the overlap lists are not kept (found by a vector test at each placement)
MAX_SECTION_ENTRIES = 4_000_000

#: search nodes in the calling process before a portfolio of processes takes over (about 0.2 s)
SOLO_NODES = 3 * 1024

#: nodes a preorder's search runs before the next preorder's search takes its turn: large enough that
#: resuming a suspended search (one step per frame of its depth) costs nothing next to the turn
SLICE_NODES = 1024

_BIG = np.iinfo(np.int64).max // 4  # the lowest offset of a placed buffer: never a candidate
# the ufuncs' reductions called directly: ndarray.max / .min go through a Python wrapper, a
# microsecond each, several times per node
_max, _min = np.maximum.reduce, np.minimum.reduce


@dataclass(frozen=True)
class CanonicalResult:
    """`offsets` (same order as the buffers) when `outcome` is "fits"; "infeasible" is proved by the
    exhausted search; "out-of-time" and "out-of-work" prove nothing.  `nodes`: search nodes visited in
    all rounds (of a portfolio, those of the processes that reported)."""

    outcome: Outcome
    offsets: tuple[int, ...] | None
    nodes: int


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
        # Python ints, read per placement (a numpy scalar costs more than the lookup)
        self.los, self.his = self.lo.tolist(), self.hi.tolist()
        self.spans = list(zip(self.los, self.his, strict=True))
        self.sizes = self.size.tolist()
        spans = self.hi - self.lo
        self.members: np.ndarray | None = None  # None: too large to list (no unplaced-floor inference)
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
            self.firsts = self.first.tolist()
            overlaps, kept = [], 0
            for lo, hi in zip(self.lo.tolist(), self.hi.tolist(), strict=True):
                near = ((self.lo < hi) & (self.hi > lo)).nonzero()[0]
                overlaps.append(near)
                kept += near.size
            self.overlaps = overlaps if kept <= MAX_SECTION_ENTRIES else None
        self.width = end - start
        self.area = self.size * self.width


@functools.lru_cache(maxsize=1)
def _instance(buffers: tuple[tuple[int, int, int], ...]) -> _Instance:
    """The sections of `buffers`, kept for the next call (until `clear_cache`): `pack` asks about the
    same buffers at several capacities in turn, and building the overlap lists is quadratic (0.3-0.7 s
    at 4k buffers, outside any search's deadline).  The search only reads it."""
    return _Instance(buffers)


def clear_cache() -> None:
    """Drop the kept sections (tens of MB at 10k buffers): `pack` calls this when it returns."""
    _instance.cache_clear()


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
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


#: a part of a resumable search: yields (nothing) when its turn is over; returns whether it placed its part
_Run = Generator[None, None, bool]


@dataclass(frozen=True)
class _Part:
    """An independent part being searched: its buffers in preorder (`order`, and as Python ints in
    `buffers`), their sizes in that order, and its sections ``[s0, s1)``."""

    order: np.ndarray
    buffers: list[int]
    size: np.ndarray
    s0: int
    s1: int


class _Search:
    """The depth-first search under one preorder, suspended (it yields) each time its visited `nodes`
    reach `pause_at`, and resumed by whoever drives it (`_interleave`)."""

    def __init__(self, inst: _Instance, capacity: int, preorder: str, deadline: Deadline) -> None:
        self.inst = inst
        self.capacity = capacity
        self.preorder = preorder
        self.nodes = 0
        self.pause_at = 0
        self.deadline = deadline
        n = len(inst.size)
        self.solution = [-1] * n
        # lowest offset each unplaced buffer can take (_BIG once placed; slot n is a sentinel)
        self.min_off = np.zeros(n + 1, dtype=np.int64)
        self.min_off[n] = _BIG
        # a canonical key is offset * stride + position in the part's preorder (positions < stride)
        self.stride = n + 1
        self.positions = np.arange(n + 1, dtype=np.int64)
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

    def solve(self) -> Generator[None, None, list[int] | None]:
        """The search (a generator: see `_interleave`): the offsets, or None when none fits."""
        everyone = np.arange(len(self.inst.size))
        for members, s0, s1 in self._split(everyone, 0, self.inst.sections, np.flatnonzero(self.cuts == 0)):
            if not (yield from self._subsolve(members, s0, s1)):
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

    def _subsolve(self, members: np.ndarray, s0: int, s1: int) -> _Run:
        """A fresh canonical search of one independent part, preordered by its current totals."""
        inst = self.inst
        keys = {
            "T": range_max(self.total, inst.lo[members], inst.hi[members]),
            "A": inst.area[members],
            "W": inst.width[members],
        }
        # lexsort: last key first; ties by buffer index
        order = members[np.lexsort((members, *(-keys[c] for c in reversed(self.preorder))))]
        part = _Part(order, order.tolist(), inst.size[order], s0, s1)
        return (yield from self._search(part, 0))

    def _search(self, part: _Part, last_key: int) -> _Run:
        """One node: try the part's unplaced buffers whose (offset, preorder position) key is at least
        `last_key` (canonical order), each at its lowest offset, lowest key first."""
        self.nodes += 1
        if self.nodes > self.pause_at:
            yield  # this search's turn is over; the driver resumes it here
        if self.deadline.expired("olla: canonical packing search"):
            raise _OutOfTime
        offs = self.min_off[part.order]  # placed buffers: _BIG
        lowest_top = int(_min(offs + part.size))
        if lowest_top >= _BIG:
            return True  # every buffer of the part is placed
        # dominance: nothing goes at or above the lowest top an unplaced buffer can reach (it would
        # fit in the gap below); inference: all later offsets are >= off, so every section of the
        # part must hold its unplaced total above off
        ceiling = min(lowest_top, self.capacity - int(_max(self.total[part.s0:part.s1])) + 1)
        # canonical: the key offset * n + position in the preorder never goes down (positions < n);
        # buffers at or above the ceiling (placed ones too) get a key past every candidate's
        n = self.stride
        keys = np.minimum(offs, ceiling)
        keys *= n
        keys += self.positions[: keys.size]
        keys = keys[(keys >= last_key) & (keys < ceiling * n)]
        keys.sort()  # by offset, ties in preorder
        # in chunks: a node rarely tries more than a few children, and a part can have thousands
        for first in range(0, keys.size, 32):
            for key in keys[first : first + 32].tolist():
                off, at = divmod(key, n)
                found, hatless = yield from self._place(part.buffers[at], off, key, part)
                if found:
                    return True
                if hatless:
                    return False  # nothing unplaced overlaps b, so no alternative here can fare better
        return False

    def _place(self, b: int, off: int, key: int, part: _Part) -> Generator[None, None, tuple[bool, bool]]:
        """Place `b` at `off` (its canonical `key`), search on, undo: (a placement of the part was
        found, b is hatless: no unplaced buffer overlaps it)."""
        inst, min_off, floor, total = self.inst, self.min_off, self.floor, self.total
        z = inst.sizes[b]
        top = off + z
        lo, hi = inst.spans[b]
        min_off[b] = _BIG
        self.solution[b] = off
        # the unplaced buffers alive together with b (they share a section); those below b's top rise
        near = (inst.overlaps[b] if inst.overlaps is not None
                else ((inst.lo < hi) & (inst.hi > lo)).nonzero()[0])
        was = min_off[near]
        below = was < top
        raised = near[below]
        # the sections whose floor can move: those of b and of the buffers it raised (the lowest offset
        # of their other members is unchanged).  Elsewhere neither floor nor total moved, so the
        # inference below held there at the parent node and still holds.  Unplaced buffers lie
        # within the part, so these sections do too.
        a0, a1 = lo, hi
        if raised.size:
            old = was[below]
            min_off[raised] = top
            up = raised.tolist()
            a0 = min(a0, min(map(inst.los.__getitem__, up)))
            a1 = max(a1, max(map(inst.his.__getitem__, up)))
        # the floors after the placement, checked before any is written (most placements fail here)
        new = floor[a0:a1].copy()
        new[lo - a0 : hi - a0] = top
        if inst.members is not None:
            # a section's floor is at least the lowest offset any of its unplaced buffers can take;
            # sections with none (_BIG) count the capacity, which their zero total keeps feasible
            f0 = inst.firsts[a0]
            lowest = np.minimum.reduceat(min_off[inst.members[f0:inst.firsts[a1]]], inst.first[a0:a1] - f0)
            np.minimum(lowest, self.capacity, out=lowest)
            np.maximum(new, lowest, out=new)
        # inference: each section's unplaced buffers stack above its floor.  Above off too, but the
        # ceiling of `_search` already keeps off + total <= capacity in every section of the part.
        stack = new + total[a0:a1]
        stack[lo - a0 : hi - a0] -= z
        found = False
        if int(_max(stack)) <= self.capacity:
            saved = floor[a0:a1].copy()
            floor[a0:a1] = new
            total[lo:hi] -= z
            found = yield from self._descend(b, off, key, part)
            floor[a0:a1] = saved
            total[lo:hi] += z
        if raised.size:
            min_off[raised] = old
        min_off[b] = off
        return found, not found and int(_min(was)) == _BIG  # b's own entry was _BIG too

    def _descend(self, b: int, off: int, key: int, part: _Part) -> _Run:
        """Go on in the same part, or in each independent part once `b` was the last buffer joining
        two sections (decomposition)."""
        lo, hi = self.inst.spans[b]
        cuts = self.cuts[lo : hi - 1]
        cuts -= 1
        try:
            cutpoints = (cuts == 0).nonzero()[0]
            if not cutpoints.size:
                return (yield from self._search(part, key))
            left = part.order[self.min_off[part.order] < _BIG]
            for members, a, z in self._split(left, part.s0, part.s1, cutpoints + lo):
                if not (yield from self._subsolve(members, a, z)):
                    return False
            return True
        finally:
            cuts += 1


def _interleave(inst: _Instance, capacity: int, preorders: Sequence[str], deadline: Deadline,
                max_nodes: int | None = None, progress: Any = None,
                slot: int = 0) -> tuple[Outcome, list[int] | None, int]:
    """One search per preorder, taking turns of `SLICE_NODES` nodes (each resumed where its last turn
    ended) until one fits or proves the instance infeasible (each search is complete, so either
    settles it), `max_nodes` in all (None: no limit; "out-of-work" past it): (outcome, offsets of the
    instance's buffers or None, nodes).  `progress[slot]` (a shared array, in a portfolio) is set to
    the nodes visited after every turn."""
    total = sys.maxsize // 4 if max_nodes is None else max_nodes
    searches = [_Search(inst, capacity, name, deadline) for name in preorders]
    runs = [search.solve() for search in searches]
    nodes = 0
    old = sys.getrecursionlimit()
    # four frames per placed buffer (search, place, descend and the generator machinery between them)
    sys.setrecursionlimit(max(old, 20 * len(inst.size) + 1000))
    try:
        while True:
            for search, run in zip(searches, runs, strict=True):
                if nodes >= total:
                    return "out-of-work", None, nodes
                before = search.nodes
                search.pause_at = before + min(SLICE_NODES, total - nodes)
                try:
                    next(run)
                except StopIteration as done:
                    nodes += search.nodes - before
                    return ("infeasible" if done.value is None else "fits"), done.value, nodes
                except _OutOfTime:
                    return "out-of-time", None, nodes + search.nodes - before
                nodes += search.nodes - before
                if progress is not None:
                    progress[slot] = nodes
    finally:
        for run in runs:
            run.close()
        sys.setrecursionlimit(old)


def _worker(inst: _Instance, capacity: int, preorders: Sequence[str], at: float, max_nodes: int | None,
            progress: Any, slot: int, queue: Any) -> None:
    queue.put((slot, *_interleave(inst, capacity, preorders, Deadline(at), max_nodes, progress, slot)))


def _portfolio(inst: _Instance, capacity: int, preorders: Sequence[str], deadline: Deadline,
               processes: int, max_nodes: int | None) -> tuple[Outcome, list[int] | None, int]:
    """`_interleave` over disjoint groups of the preorders in `processes` forked processes, each with
    its share of `max_nodes`: (outcome, offsets, nodes of the group that settled it).

    Deterministic although the processes race: the answer is that of the group that settles the
    instance in the fewest nodes (ties: the first group), which is known once every other group has
    either finished or gone past that many nodes without settling it (each group's search is the same
    on any machine, and each publishes its node count after every turn).  Each preorder's search is
    complete, so a group's "infeasible" is a proof."""
    import multiprocessing
    import queue as queues

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    progress = ctx.Array("q", processes, lock=False)  # nodes each group has visited so far
    groups = [preorders[k::processes] for k in range(processes)]
    # each group's share of the work
    budgets = [None if max_nodes is None else max_nodes * len(g) // len(preorders) for g in groups]
    procs = [ctx.Process(target=_worker, args=(inst, capacity, group, deadline.at, budget, progress, k,
                                               results), daemon=True)
             for k, (group, budget) in enumerate(zip(groups, budgets, strict=True))]
    for proc in procs:
        proc.start()
    done: dict[int, tuple[Outcome, list[int] | None, int]] = {}
    try:
        while True:
            settled = sorted((nodes, k) for k, (outcome, _, nodes) in done.items()
                             if outcome in ("fits", "infeasible"))
            if settled and all(k in done or progress[k] > settled[0][0] for k in range(processes)):
                return done[settled[0][1]]
            if len(done) == processes:  # none settled it: every group ran out of work
                return "out-of-work", None, max(nodes for _, _, nodes in done.values())
            try:
                k, outcome, found, nodes = results.get(timeout=0.01 if settled else deadline.left() + 1.0)
            except queues.Empty:
                if settled and not deadline.passed():
                    continue  # waiting for the other groups to pass the winner's node count
                k, outcome, found, nodes = -1, "out-of-time", None, 0  # overran, or a worker died
            if outcome == "out-of-time":
                # the clock stopped a group (recorded in the worker, lost with it): the fewest-nodes
                # answer among those that came may not be the one a faster machine would give
                note_cut("olla: canonical packing search")
                return done[settled[0][1]] if settled else ("out-of-time", None, nodes)
            done[k] = (outcome, found, nodes)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()


def canonical_fit(buffers: Sequence[tuple[int, int, int]], capacity: int, deadline: Deadline,
                  *, preorders: Sequence[str] = PREORDERS, processes: int = 1,
                  max_nodes: int | None = None) -> CanonicalResult:
    """Offsets with every ``offset + size <= capacity`` and no two time-overlapping buffers sharing an
    address, by MiniMalloc's canonical search; or a proof that none exists; or out of time; or out of
    work (`max_nodes` search nodes, shared by the processes: a bound that is the same on any machine).

    With `processes` > 1 (and where processes can be forked), an instance not settled within
    `SOLO_NODES` in this process goes to that many processes, each searching its share of the
    preorders with `max_nodes` (a portfolio: one preorder often needs 10x fewer nodes than another,
    and which one differs by instance; the first nodes in-process spare easy instances the cost of
    forking).  For a given `processes` the answer is the same on any machine and under any load
    (`_portfolio`); the `nodes` of a portfolio are those of the group that settled it.  Zero-size
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
    inst = _instance(tuple(sub))  # type: ignore[arg-type]
    if int(_Search(inst, capacity, preorders[0], deadline).total.max()) > capacity:
        return CanonicalResult("infeasible", None, 0)
    processes = min(processes, len(preorders))
    if processes > 1 and "fork" in multiprocessing.get_all_start_methods():
        solo = SOLO_NODES if max_nodes is None else min(SOLO_NODES, max_nodes)
        outcome, found, nodes = _interleave(inst, capacity, preorders, deadline, solo)
        if outcome == "out-of-work" and solo != max_nodes:
            outcome, found, nodes = _portfolio(inst, capacity, preorders, deadline, processes, max_nodes)
    else:
        outcome, found, nodes = _interleave(inst, capacity, preorders, deadline, max_nodes)
    if found is None:
        return CanonicalResult(outcome, None, nodes)
    offsets = [0] * len(buffers)
    for i, o in zip(nonzero, found, strict=True):
        offsets[i] = o
    problems = validate_packing([tuple(b) for b in buffers], offsets, capacity)
    if problems:
        raise AssertionError("canonical search placed overlapping buffers: " + problems[0])
    return CanonicalResult("fits", tuple(offsets), nodes)
