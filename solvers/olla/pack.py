"""Tensor address packing (OLLA Sec. 3.3 and 4.2; the static allocation problem of MiniMalloc).

A buffer is ``(start, end, size)``: it is alive during the half-open step range ``[start, end)``
(alive at ``start``, no longer alive at ``end``; MiniMalloc's ``lower``/``upper``) and needs
``size`` contiguous bytes.  A packing gives every buffer an integer offset so that two buffers whose
lifetimes intersect never share an address; its peak is ``max(offset + size)``.  No packing beats the
*max-live lower bound* (the largest total size alive at one step), and fragmentation is
``(peak - lower_bound) / peak`` (a fraction; OLLA Sec. 5.4 measures the same ratio in %).

Method: greedy best fit gives an incumbent: first in start order (an online allocator's sweep over
a free list, O(n log n) searches, always run to the end so that no time limit leaves a worse
placement), then in MiniMalloc's TAW preorder (Sec. 5: the buffers alive at the busiest steps first),
TFLite's GreedyBySize order, lifetime and area: O(n^2) passes the time limit may cut (a cut pass is
dropped);
when it does not meet the target (the capacity, else the lower bound), MiniMalloc's canonical search
(`solvers.olla.canonical`) looks for a fit, and CP-SAT solves the exact model (NoOverlap2D over
fixed time intervals and variable address intervals), warm-started from the best offsets, in the
time left.  Two exact reductions shrink the model: buffers alive over the whole horizon go to the
bottom (removing such a buffer's address range from any packing and stacking it below keeps the
packing valid with the same peak), and the rest splits at steps no buffer crosses into independent
segments.  Offsets are integer solver values, never floats (OLLA's tool truncated floats and
produced overlapping plans); `validate_packing` checks every result independently.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from solvers.deadline import (
    Deadline,
    limit_cp_sat,
    note_cp_sat_cut,
    note_cut,
    recording_cuts,
    timed_out,
)
from solvers.ir import Graph
from solvers.olla.canonical import canonical_fit, clear_cache, range_max
from solvers.schedule import Step
from solvers.simulate import simulate

Buffer = tuple[int, int, int]  # (start, end, size): alive during [start, end)
GreedyOrder = Literal["taw", "size", "lifetime", "area"]
#: the first gets most of the time (`_greedy_segments`): MiniMalloc's TAW preorder, whose best fit met the
#: max-live bound on a 4.9k-buffer training schedule where greedy by size stayed 2.2% above it
GREEDY_ORDERS: tuple[GreedyOrder, ...] = ("taw", "size", "lifetime", "area")


class PackingError(ValueError):
    """The buffers do not fit the capacity (or the input is malformed)."""


@dataclass(frozen=True)
class Packing:
    """Offsets for `buffers` (same order) and how good they are.

    `status`: "optimal" when the peak meets the max-live lower bound or CP-SAT proved it minimal;
    "feasible" otherwise (`gap` = (peak - bound) / peak).  With a capacity, the search stops at the
    first placement that fits (the decision problem MiniMalloc solves).  `labels` name the buffers
    (data node ids for `pack_schedule`).
    """

    buffers: tuple[Buffer, ...]
    offsets: tuple[int, ...]
    peak_bytes: int
    lower_bound: int
    status: Literal["optimal", "feasible"]
    gap: float
    seconds: float
    greedy_peak: int
    capacity: int | None = None
    labels: tuple[int, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fragmentation(self) -> float:
        """(peak - max-live lower bound) / peak, a fraction in [0, 1)."""
        return (self.peak_bytes - self.lower_bound) / self.peak_bytes if self.peak_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's "packing" member (ARCHITECTURE.md)."""
        labels = self.labels if self.labels is not None else tuple(range(len(self.buffers)))
        return {
            "buffers": [
                {"data": label, "start": s, "end": e, "offset": o, "size": z}
                for label, (s, e, z), o in zip(labels, self.buffers, self.offsets, strict=True)
            ],
            "peak_bytes": self.peak_bytes,
            "lower_bound": self.lower_bound,
            "fragmentation": self.fragmentation,
            "status": self.status,
            "gap": self.gap,
            "seconds": self.seconds,
            "greedy_peak_bytes": self.greedy_peak,
            "greedy_orders": list(self.extra.get("greedy_orders", [])),
            "time_cuts": list(self.extra.get("time_cuts", [])),
        }


def _check_buffers(buffers: Sequence[Sequence[int]]) -> tuple[Buffer, ...]:
    out = []
    for i, b in enumerate(buffers):
        if len(b) != 3:
            raise PackingError(f"buffer {i} is {b!r}: expected (start, end, size)")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in b):
            raise PackingError(f"buffer {i} is {b!r}: start, end and size must be integers")
        s, e, z = b
        if not 0 <= s < e or z < 0:
            raise PackingError(
                f"buffer {i} is {b!r}: need 0 <= start < end (lifetime [start, end)) and size >= 0"
            )
        out.append((s, e, z))
    return tuple(out)


def max_live(buffers: Sequence[Buffer]) -> int:
    """The largest total size alive at one step: no packing has a smaller peak."""
    events: dict[int, int] = {}
    for s, e, z in buffers:
        events[s] = events.get(s, 0) + z
        events[e] = events.get(e, 0) - z
    live = best = 0
    for t in sorted(events):
        live += events[t]
        best = max(best, live)
    return best


def validate_packing(
    buffers: Sequence[Sequence[int]], offsets: Sequence[int], capacity: int | None = None
) -> list[str]:
    """Every problem with `offsets` for `buffers` (empty when valid): non-integer or negative offsets,
    beyond `capacity`, or two buffers alive at the same step whose address ranges intersect.
    Independent of the packer: a sweep over time keeping the live buffers sorted by offset, where a
    new buffer can only collide with its neighbours in address order (O(n log n), so checking 10k
    buffers stays well inside a time limit); only when that finds a collision, a full pairwise sweep
    lists every one."""
    problems: list[str] = []
    if len(buffers) != len(offsets):
        return [f"{len(buffers)} buffers but {len(offsets)} offsets"]
    for i, ((_, _, z), o) in enumerate(zip(buffers, offsets, strict=True)):
        if not isinstance(o, int) or isinstance(o, bool) or o < 0:
            problems.append(f"buffer {i}: offset {o!r} is not a non-negative integer")
        elif capacity is not None and o + z > capacity:
            problems.append(f"buffer {i}: [{o}, {o + z}) exceeds capacity {capacity}")
    if problems or _disjoint(buffers, offsets):
        return problems
    import numpy as np

    # sweep in start order: buffer i overlaps in time every earlier-starting j that ends after i starts;
    # one vectorised test per buffer (a Python loop over the live set took seconds on 10k buffers)
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    start, end, size = (np.array([buffers[i][c] for i in order], dtype=np.int64) for c in range(3))
    offs = np.array([offsets[i] for i in order], dtype=np.int64)
    for k, i in enumerate(order):
        if not size[k]:
            continue
        hit = (
            (end[:k] > start[k])
            & (size[:k] > 0)
            & (offs[:k] < offs[k] + size[k])
            & (offs[k] < offs[:k] + size[:k])
        )
        for j in (order[h] for h in np.flatnonzero(hit)):
            problems.append(
                f"buffers {j} {tuple(buffers[j])} at {offsets[j]} and {i} {tuple(buffers[i])} at "
                f"{offsets[i]} are alive together and overlap in memory"
            )
    return problems


def _sweep_fit(buffers: Sequence[Buffer], ids: Sequence[int]) -> tuple[list[int], int]:
    """Best fit in start order, an online allocator's placement: (offsets of `ids`, in that order, and
    the peak).  Sweeping by start, the placed buffers a new one overlaps in time are exactly those still
    alive, so the free ranges below the top of the live ones (the holes the ended ones left, merged
    with their free neighbours) are all the gaps best fit chooses from: each buffer goes to the low
    end of the smallest hole that holds it (the lowest on ties), else on top.  A heap of ends and the
    holes sorted by address (to merge) and by (size, address) (to choose): O(n log n) searches, where
    best fit over every placed buffer (`_greedy`) is O(n^2).  Always complete and fast, it is the
    placement `pack` keeps when the time limit cuts its best-fit passes (issue pack27: stacking the
    buffers a cut pass had not placed put a 92-layer GPT's packing at 6x its max-live bound)."""
    import heapq

    offsets = [0] * len(ids)
    holes = _Holes()
    ends: list[tuple[int, int, int]] = []  # (end, offset, size) of the live buffers
    top = peak = 0  # the top of the live buffers, and the highest it has been
    for k in sorted(range(len(ids)), key=lambda k: (buffers[ids[k]][0], k)):
        s, e, z = buffers[ids[k]]
        if z == 0:
            continue
        while ends and ends[0][0] <= s:
            _, low, size = heapq.heappop(ends)
            top = holes.free(low, low + size, top)
        at = bisect.bisect_left(holes.by_size, (z, -1))
        if at < len(holes.by_size):
            size, off = holes.by_size[at]
            holes.remove(off, off + size)
            if size > z:
                holes.add(off + z, off + size)
        else:
            off, top = top, top + z
        heapq.heappush(ends, (e, off, z))
        offsets[k] = off
        peak = max(peak, top)
    return offsets, peak


class _Holes:
    """Disjoint free ranges [low, high) below the live buffers' top, sorted by address and by
    (size, address): `_sweep_fit`'s free list."""

    def __init__(self) -> None:
        self.by_address: list[tuple[int, int]] = []
        self.by_size: list[tuple[int, int]] = []

    def add(self, low: int, high: int) -> None:
        bisect.insort(self.by_address, (low, high))
        bisect.insort(self.by_size, (high - low, low))

    def remove(self, low: int, high: int) -> None:
        del self.by_address[bisect.bisect_left(self.by_address, (low, high))]
        del self.by_size[bisect.bisect_left(self.by_size, (high - low, low))]

    def free(self, low: int, high: int, top: int) -> int:
        """Return [low, high) to the free list, merged with the holes it touches; the new top (lower
        when the range was the topmost live one: then it is no hole)."""
        at = bisect.bisect_left(self.by_address, (low, high))
        if at < len(self.by_address) and self.by_address[at][0] == high:  # the hole just above
            above = self.by_address[at]
            self.remove(*above)
            high = above[1]
        if at > 0 and self.by_address[at - 1][1] == low:  # the hole just below
            below = self.by_address[at - 1]
            self.remove(*below)
            low = below[0]
        if high == top:
            return low
        self.add(low, high)
        return top


def _disjoint(buffers: Sequence[Sequence[int]], offsets: Sequence[int]) -> bool:
    """No two buffers alive at one step share an address: sweep the start and end events (ends first
    at equal steps: lifetimes are half-open), keeping the live buffers' (offset, top) sorted; the
    live ones are pairwise disjoint, so a new one collides with one of them exactly when it collides
    with its predecessor or successor by offset."""
    events = sorted(
        (t, kind, i)
        for i, (s, e, z) in enumerate(buffers)
        if z > 0
        for t, kind in ((s, 1), (e, 0))
    )
    live: list[tuple[int, int]] = []  # (offset, top), sorted
    for _, kind, i in events:
        entry = (offsets[i], offsets[i] + buffers[i][2])
        if kind == 0:
            del live[bisect.bisect_left(live, entry)]
            continue
        k = bisect.bisect_left(live, entry)
        if (k > 0 and live[k - 1][1] > entry[0]) or (k < len(live) and live[k][0] < entry[1]):
            return False
        live.insert(k, entry)
    return True


def greedy_pack(buffers: Sequence[Buffer], order: GreedyOrder = "size") -> tuple[list[int], int]:
    """Best-fit placement in a fixed order (TFLite GreedyBySize for ``"size"``; ``"taw"``: MiniMalloc's
    preorder, the buffers alive at the busiest steps first, `_busiest`): each buffer goes into the
    smallest gap between already placed, lifetime-overlapping buffers that holds it, else on top of
    them.  Returns (offsets, peak)."""
    placed = _greedy(buffers, order, None)
    assert placed is not None  # no deadline: always completes
    return placed


def _greedy(
    buffers: Sequence[Buffer], order: GreedyOrder, deadline: float | None
) -> tuple[list[int], int] | None:
    """`greedy_pack` that gives up (None) once `deadline` (``perf_counter`` seconds) has passed.

    Placed buffers are kept in numpy arrays sorted by offset, so the buffers a new one clashes with
    come out already in address order and the best-fit gap is a vectorised scan: O(n) numpy work per
    buffer instead of a Python loop and sort over every placed buffer (10k buffers took 16 s per order
    that way; OLLA Sec. 4.2 needs an incumbent fast, whatever the size)."""
    import numpy as np

    busiest = _busiest(buffers) if order == "taw" else []
    keys = {
        "taw": lambda i: (-busiest[i], -(buffers[i][1] - buffers[i][0]) * buffers[i][2],
                          -(buffers[i][1] - buffers[i][0]), i),
        "size": lambda i: (-buffers[i][2], buffers[i][0], i),
        "lifetime": lambda i: (-(buffers[i][1] - buffers[i][0]), -buffers[i][2], i),
        "area": lambda i: (-(buffers[i][1] - buffers[i][0]) * buffers[i][2], i),
    }
    offsets = [0] * len(buffers)
    # rows: start, end, offset, top (offset + size) of the placed buffers, columns sorted by offset
    table = np.zeros((4, len(buffers)), dtype=np.int64)
    m = peak = 0
    ranked = sorted(range(len(buffers)), key=keys[order])
    for count, i in enumerate(ranked):
        if deadline is not None and count % 256 == 0 and timed_out(deadline, "olla: greedy packing",
                                                                     time.perf_counter()):
            return None
        s, e, z = buffers[i]
        if z == 0:
            continue
        rows = table[:, :m]
        clash = (rows[0] < e) & (rows[1] > s)
        off = 0
        if clash.any():
            lo, hi = rows[2][clash], rows[3][clash]
            tops = np.maximum.accumulate(hi)
            below = np.concatenate(([0], tops[:-1]))  # highest top under each clashing buffer
            gaps = lo - below
            fits = np.flatnonzero(gaps >= z)
            # smallest gap that holds the buffer (lowest such on ties), else on top of everything
            off = int(below[fits[np.argmin(gaps[fits])]]) if fits.size else int(tops[-1])
        k = int(np.searchsorted(rows[2], off, side="right"))
        table[:, k + 1 : m + 1] = table[:, k:m].copy()
        table[:, k] = (s, e, off, off + z)
        m += 1
        offsets[i] = off
        peak = max(peak, off + z)
    return offsets, peak


def _busiest(buffers: Sequence[Buffer]) -> list[int]:
    """Per buffer, the largest total size alive at one step of its lifetime (MiniMalloc's T, Sec. 5:
    the buffers that make the max-live bound go first, so best fit packs them tight).  The total is
    largest at some buffer's start, so only starts are summed; a sparse-table range max per buffer."""
    import numpy as np

    if not buffers:
        return []
    start, end, size = (np.array(c, dtype=np.int64) for c in zip(*buffers, strict=True))
    points = np.unique(start)
    lo, hi = np.searchsorted(points, start), np.searchsorted(points, end)  # alive at points[lo:hi]
    change = np.zeros(points.size + 1, dtype=np.int64)
    np.add.at(change, lo, size)
    np.add.at(change, hi, -size)
    return range_max(np.cumsum(change)[:-1], lo, hi).tolist()


def _segments(buffers: Sequence[Buffer], ids: Sequence[int]) -> list[list[int]]:
    """Split `ids` where no buffer's lifetime crosses a step boundary: segments pack independently."""
    groups: list[list[int]] = []
    reach = -1
    for i in sorted(ids, key=lambda i: buffers[i][0]):
        s, e, _ = buffers[i]
        if s >= reach:
            groups.append([])
        groups[-1].append(i)
        reach = max(reach, e)
    return groups


def _greedy_segments(
    buffers: Sequence[Buffer], ids: Sequence[int], segments: Sequence[Sequence[int]], deadline: float,
    slacks: Sequence[int] | None = None,
) -> tuple[list[tuple[list[int], int]], list[str]]:
    """Per segment, the best greedy placement (offsets in segment order, peak), and the greedy orders
    that placed every buffer ("start", then those of `GREEDY_ORDERS` that finished).

    Segments share no step, so one pass over all of `ids` places each segment exactly as a pass over
    that segment alone would: each order runs once, not once per segment.  Best fit in start order
    (`_sweep_fit`, O(n log n)) always runs to the end, whatever the time: every packing starts from a
    complete best-fit placement.  The O(n^2) passes in `GREEDY_ORDERS` follow: the first may use 80%
    of the time left (the rest is for the search and the final `validate_packing`), the others only
    while `deadline`, less the first one's time (left to the search), has not passed; one the time
    limit cuts is dropped (its placement is incomplete).  They stop once every segment is within its
    `slacks` bytes (default 0) of its max-live bound: nothing beats a placement at the bound."""
    sub = [buffers[i] for i in ids]
    bounds = [max_live([buffers[i] for i in seg]) for seg in segments]
    slack = slacks or [0] * len(segments)
    pos = {i: k for k, i in enumerate(ids)}

    def per_segment(offsets: list[int]) -> list[tuple[list[int], int]]:
        found = []
        for seg in segments:
            offs = [offsets[pos[i]] for i in seg]
            found.append((offs, max(o + buffers[i][2] for o, i in zip(offs, seg, strict=True))))
        return found

    def close(placed: list[tuple[list[int], int]]) -> bool:
        return all(peak - bound <= z for (_, peak), bound, z in zip(placed, bounds, slack, strict=True))

    best = per_segment(_sweep_fit(sub, range(len(sub)))[0])
    done = ["start"]
    first = 0.0
    for n, order in enumerate(GREEDY_ORDERS):
        if close(best):
            break
        started = time.perf_counter()
        placed = _greedy(sub, order, started + 0.8 * (deadline - started) if n == 0 else deadline - first)
        if placed is None:
            break
        first = first or time.perf_counter() - started
        done.append(order)
        best = [min(a, b, key=lambda r: r[1]) for a, b in zip(best, per_segment(placed[0]), strict=True)]
    return best, done


def _canonical(
    sub: Sequence[Buffer], capacity: int, seconds: float, processes: int, nodes: int | None = None,
) -> tuple[list[int] | None, bool]:
    """`canonical_fit` of one segment in `nodes` (default `CANONICAL_NODES`) search nodes within `seconds`
    (a portfolio of up to `processes` processes): (offsets or None, proved infeasible)."""
    found = canonical_fit(sub, capacity, Deadline.after(seconds), processes=processes,
                          max_nodes=CANONICAL_NODES if nodes is None else nodes)
    return (list(found.offsets) if found.offsets is not None else None), found.outcome == "infeasible"


#: CP-SAT's NoOverlap2D found nothing better than greedy within 10 s above ~1700 buffers in one segment
CP_SAT_MAX_BUFFERS = 800
#: the work of one search, the same on any machine (issue 18 item 4; the time limit is a safety cap):
#: canonical search nodes per target, and CP-SAT's deterministic time per segment
CANONICAL_NODES = 20_000
#: canonical search nodes of a segment searched with a gap tolerance (`pack`'s `gap`: segments of over
#: `CP_SAT_MAX_BUFFERS` buffers), at its max-live bound only, where a fit proves the packing optimal: on
#: default plans of 4k- and 10k-op GPTs (5.7k-14k buffers) the full search, bound and easier targets,
#: never beat greedy before its 10 s cap (32 CPU s at 4k with the caps scaled up)
TOLERANT_NODES = 1_000
CP_SAT_WORK = 2.0
#: canonical search nodes for the whole instance when a capacity is given (the decision problem
#: MiniMalloc solves): its challenging set needs up to 54k in one process (E: three preorders' searches
#: in turn), and up to 18k per preorder raced in three processes (a third of this each)
FIT_NODES = 160_000


def _cp_sat(
    buffers: Sequence[Buffer],
    hint: Sequence[int],
    lower: int,
    upper: int,
    fit_only: bool,
    seconds: float,
) -> tuple[list[int] | None, int]:
    """Exact packing of one segment with peak <= `upper`: (offsets or None, proven bound on the peak).
    `fit_only` stops at the first placement instead of minimising."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    peak = m.NewIntVar(lower, upper, "peak")
    xs, times, spaces = [], [], []
    for i, (s, e, z) in enumerate(buffers):
        x = m.NewIntVar(0, max(0, upper - z), f"x{i}")
        m.Add(x + z <= peak)
        m.AddHint(x, hint[i])
        xs.append(x)
        times.append(m.NewFixedSizeIntervalVar(s, e - s, f"t{i}"))
        spaces.append(m.NewFixedSizeIntervalVar(x, z, f"a{i}"))
    m.AddNoOverlap2D(times, spaces)
    if not fit_only:
        m.Minimize(peak)
    solver = cp_model.CpSolver()
    limit_cp_sat(solver, seconds, CP_SAT_WORK)
    status = solver.Solve(m)
    note_cp_sat_cut(solver, status in (cp_model.OPTIMAL, cp_model.INFEASIBLE), "olla: packing CP-SAT")
    if status == cp_model.INFEASIBLE:
        return None, upper + 1
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, lower
    offsets = [int(solver.Value(x)) for x in xs]
    found = max(o + z for o, (_, _, z) in zip(offsets, buffers, strict=True))
    if fit_only:
        return offsets, lower
    if status == cp_model.OPTIMAL:
        return offsets, found
    return offsets, max(lower, int(solver.BestObjectiveBound()))


def _solve_segment(
    sub: Sequence[Buffer],
    offsets: list[int],
    peak: int,
    lower: int,
    room: int | None,
    seconds: float,
    processes: int,
    slack: int = 0,
) -> tuple[list[int], int, int, str]:
    """Improve the greedy placement of one segment: (offsets, peak, proven lower bound, how).

    With a capacity: the canonical search for a fit (`solvers.olla.canonical`), then CP-SAT.
    Without: the canonical search at the max-live bound (a fit proves zero fragmentation), and when
    that runs out of time, at targets halfway between the bound and the best peak so far; CP-SAT then
    minimises from the best placement (segments up to `CP_SAT_MAX_BUFFERS`).  Without a capacity the
    search stops once the peak is within `slack` bytes of the proven bound; a segment with a slack (a
    large one, `pack`'s `gap`) is searched at its bound only, in `TOLERANT_NODES` nodes."""
    started = time.perf_counter()
    deadline = started + seconds
    how = "greedy"

    def peak_of(offs: list[int]) -> int:
        return max(o + z for o, (_, _, z) in zip(offs, sub, strict=True))

    if room is not None:
        found, infeasible = _canonical(sub, room, 0.85 * seconds, processes)
        if found is not None:
            return found, peak_of(found), lower, "canonical"
        if infeasible:
            return offsets, peak, room + 1, "canonical-infeasible"
    else:
        target, targets = lower, 0
        while (lower <= target < peak and peak - lower > slack and not (slack and targets)
               and not timed_out(deadline - 0.05, "olla: packing search", time.perf_counter())):
            left = deadline - time.perf_counter()
            found, infeasible = _canonical(sub, target, 0.5 * left, processes,
                                           TOLERANT_NODES if slack else CANONICAL_NODES)
            targets += 1
            if found is not None:  # fits: aim lower
                offsets, peak, how = found, peak_of(found), "canonical"
                target = (lower + peak) // 2
            elif infeasible:  # proved: the bound rises
                lower = target + 1
                target = (lower + peak) // 2
            else:  # out of work (or time) at this target: aim at an easier one
                target = (target + peak + 1) // 2
        if peak - lower <= slack:
            return offsets, peak, lower, how
    left = deadline - time.perf_counter()
    if len(sub) > CP_SAT_MAX_BUFFERS or timed_out(deadline - 0.1, "olla: packing CP-SAT skipped",
                                                  time.perf_counter()):
        return offsets, peak, lower, how
    upper = peak if room is None else room
    solved, bound = _cp_sat(sub, offsets, lower, upper, room is not None, left)
    if solved is None:
        return offsets, peak, max(lower, bound), how
    return solved, peak_of(solved), max(lower, bound), "cp-sat"


def pack(
    buffers: Sequence[Sequence[int]],
    capacity: int | None = None,
    *,
    time_limit: float = 10.0,
    processes: int = 3,
    gap: float = 0.0,
) -> Packing:
    """Place `buffers` (``(start, end, size)``, alive during ``[start, end)``) at integer offsets.

    Without `capacity`: minimise the peak within `time_limit` seconds.  With `capacity`: find a
    placement with peak <= capacity (stopping at the first one) or raise `PackingError` saying the
    smallest peak found and the lower bound.  Never returns a packing `validate_packing` rejects.
    Each search is bounded by counted work (`FIT_NODES`, `CANONICAL_NODES`, `CP_SAT_WORK`; CP-SAT runs
    one worker), `time_limit` is the safety cap.  `processes`: forked processes sharing the canonical
    search's preorders (at most one per preorder; for a given count the answer is the same on any
    machine, `solvers.olla.canonical._portfolio`).  `gap`: without a capacity, a segment of over
    `CP_SAT_MAX_BUFFERS` buffers whose peak is within this fraction of the whole max-live bound of its
    own bound is not searched further (a relative gap tolerance, as a MILP solver's); smaller segments,
    whose search is cheap, and `gap` 0 search until the bound is met, proven, or the work or time is
    spent.
    """
    try:
        with recording_cuts() as cuts:
            packing = _pack(buffers, capacity, time_limit, processes, gap)
        # where the time limit stopped work: the packing view says so (the answer may improve with time)
        return dataclasses.replace(packing, extra={**packing.extra, "time_cuts": list(cuts)})
    finally:
        clear_cache()  # the canonical search's sections of these buffers: not needed past this call


def _pack(buffers: Sequence[Sequence[int]], capacity: int | None, time_limit: float,
          processes: int, gap: float) -> Packing:
    started = time.perf_counter()
    deadline = started + time_limit
    bufs = _check_buffers(buffers)
    if capacity is not None and (not isinstance(capacity, int) or capacity < 0):
        raise PackingError(f"capacity must be a non-negative integer number of bytes, not {capacity!r}")
    if not time_limit > 0:
        raise PackingError(f"time_limit must be a positive number of seconds, not {time_limit!r}")
    lower = max_live(bufs)
    if capacity is not None and lower > capacity:
        raise PackingError(
            f"cannot fit in {capacity} bytes: {lower} bytes are alive at once (max-live lower bound)"
        )

    nonzero = [i for i, b in enumerate(bufs) if b[2] > 0]
    t0 = min((bufs[i][0] for i in nonzero), default=0)
    t1 = max((bufs[i][1] for i in nonzero), default=0)
    spanning = [i for i in nonzero if bufs[i][0] <= t0 and bufs[i][1] >= t1]
    offsets = [0] * len(bufs)
    base = 0
    for i in spanning:
        offsets[i] = base
        base += bufs[i][2]
    in_base = set(spanning)
    rest = [i for i in nonzero if i not in in_base]
    segments = _segments(bufs, rest)
    # the tolerance in bytes per segment: the packing's peak is the base plus the largest segment's
    slacks = [int(gap * lower) if capacity is None and len(seg) > CP_SAT_MAX_BUFFERS else 0
              for seg in segments]
    seg_greedy, greedy_orders = _greedy_segments(bufs, rest, segments, deadline, slacks)
    greedy_peak = base + max((p for _, p in seg_greedy), default=0)
    whole = None
    if capacity is not None and greedy_peak > capacity:
        # the canonical search on the whole instance first: it finds the independent parts itself
        # (decomposition), and whole it fitted instances of MiniMalloc's set that the segments above,
        # searched one by one under reordered preorders, did not within 30 s (E of the set)
        whole = canonical_fit(
            bufs, capacity, Deadline.after(0.85 * (deadline - time.perf_counter())), processes=processes,
            max_nodes=FIT_NODES,
        )
    if whole is not None and whole.outcome == "infeasible":
        raise PackingError(
            f"no placement fits {capacity} bytes (proved impossible by exhaustive canonical search): "
            f"max-live lower bound {lower} bytes; raise the capacity"
        )
    if whole is not None and whole.offsets is not None:
        offsets = list(whole.offsets)
        segment_bound = 0
        statuses = ["canonical"]
    else:
        room = None if capacity is None else capacity - base
        subs = [[bufs[i] for i in seg] for seg in segments]
        lowers = [max_live(sub) for sub in subs]
        placed = [list(offs) for offs, _ in seg_greedy]
        peaks = [p for _, p in seg_greedy]
        how: dict[int, str] = {}
        # Search when greedy leaves a gap to the bound; with a capacity, only when greedy does not fit.
        # The time left is shared by the segments still to search.  With a capacity, a segment that
        # found no fit in its share gets a second go with whatever the others left (one that does not fit
        # fails the whole packing, so no time should go unused).
        for again in (False, True):
            todo = [k for k in range(len(segments))
                    if (peaks[k] - lowers[k] > slacks[k] if room is None else peaks[k] > room)
                    and (not again or how.get(k) == "greedy")]
            if again and room is None:
                break
            for n, k in enumerate(todo):
                share = (deadline - time.perf_counter()) / (len(todo) - n)
                if share > 0.05:
                    placed[k], peaks[k], lowers[k], how[k] = _solve_segment(
                        subs[k], placed[k], peaks[k], lowers[k], room, share, processes, slacks[k]
                    )
                else:
                    note_cut("olla: packing segments not searched")
                    how.setdefault(k, "out-of-time")  # the greedy placement stays, with its gap
        for seg, seg_offsets in zip(segments, placed, strict=True):
            for i, o in zip(seg, seg_offsets, strict=True):
                offsets[i] = base + o
        # proven bound on the largest segment's peak
        segment_bound = max((min(lw, p) for lw, p in zip(lowers, peaks, strict=True)), default=0)
        statuses = [how[k] for k in sorted(how)]
    peak = max((o + b[2] for o, b in zip(offsets, bufs, strict=True)), default=0)
    problems = validate_packing(bufs, offsets)
    if problems:  # a bug, never a user error: refuse to return an overlapping plan
        raise AssertionError("packing produced overlapping buffers: " + "; ".join(problems[:3]))
    if capacity is not None and peak > capacity:
        why = (
            "proved impossible by exhaustive canonical search"
            if "canonical-infeasible" in statuses
            else f"none found within {time_limit:.1f} s"
        )
        raise PackingError(
            f"no placement fits {capacity} bytes ({why}): best peak found {peak} bytes, max-live lower "
            f"bound {lower} bytes; raise the capacity{'' if 'proved' in why else ' or the time limit'}"
        )
    bound = min(peak, max(lower, base + segment_bound))
    return Packing(
        buffers=bufs,
        offsets=tuple(offsets),
        peak_bytes=peak,
        lower_bound=lower,
        status="optimal" if peak == bound else "feasible",
        gap=(peak - bound) / peak if peak else 0.0,
        seconds=time.perf_counter() - started,
        greedy_peak=greedy_peak,
        capacity=capacity,
        # how each searched segment ended: canonical, canonical-infeasible, cp-sat, greedy (searched,
        # nothing better found) or out-of-time (no time left to search: greedy kept)
        extra={"bound": bound, "spanning_buffers": len(spanning), "segments": statuses,
               # canonical search nodes of the whole-instance fit (capacity given; 0 when greedy fitted):
               # the search's work, the same on any machine
               "fit_nodes": whole.nodes if whole is not None else 0,
               # the greedy orders that placed every buffer: the time limit cut the others
               "greedy_orders": greedy_orders},
    )


def schedule_buffers(graph: Graph, schedule: Sequence[Step]) -> tuple[list[Buffer], list[int]]:
    """(buffers, data ids) of every materialisation of a data node under `schedule`, in step indices:
    a source is alive from step 0, a computed tensor from its compute step; it ends at the step that
    frees it (exclusive) or after the last step.  A recomputed tensor gets a new buffer each time."""
    steps = tuple(schedule)
    horizon = max(len(steps), 1)
    born: dict[int, int] = {d.id: 0 for d in graph.datas if d.producer is None}
    buffers: list[Buffer] = []
    labels: list[int] = []

    def close(d: int, end: int) -> None:
        start = born.pop(d)
        if graph.datas[d].bytes > 0:
            buffers.append((start, max(end, start + 1), graph.datas[d].bytes))
            labels.append(d)

    for i, step in enumerate(steps):
        if step.op == "compute":
            for d in graph.computes[step.node].outputs:
                born.setdefault(d, i)
        else:
            close(step.node, i)
    for d in sorted(born):
        close(d, horizon)
    return buffers, labels


def pack_schedule(graph: Graph, schedule: Sequence[Step], *, time_limit: float = 10.0,
                  deadline: Deadline | None = None, gap: float = 0.0) -> Packing:
    """Address packing of the data nodes of a (valid) schedule: what every memviz plan carries.

    Workspace is not a data node and is not placed here (it lives for one step; the timeline counts
    it).  The packing's lower bound is the largest total of data bytes alive at one step.  Returns by
    `time_limit` seconds or `deadline`, the earlier (the greedy placement when no time is left).
    `gap`: the relative gap to the max-live bound at which the search stops (`pack`).
    """
    end = Deadline.of(time_limit, deadline)
    simulate(graph, schedule).check()
    buffers, labels = schedule_buffers(graph, schedule)
    # the limit covers the whole call: what checking the schedule took comes off the packer's share.
    # The search stays in this process: callers (a notebook kernel, the Planner's worker thread) may
    # run threads, which forking does not mix with safely.
    left = max(end.left(), 0.01)
    packing = pack(buffers, time_limit=left, processes=1, gap=gap)
    return dataclasses.replace(packing, labels=tuple(labels))
