"""One absolute deadline shared by a solver and everything it calls (issue 21: time limits are promises).

A time limit given as seconds is a promise to the caller, not a budget per step: when a solver calls
another (Checkmate runs Rockmate and Rotor for its MIP start, `memviz.plan` runs a solver, a frontier
and a packing), each nested call gets the same `Deadline` (or a part of what is left), never a fresh
full limit.  Loops check `passed()`; MILP and CP-SAT calls get `seconds(margin)`: what is left minus a
margin for building the model before and reading the solution after.

The time limit is a safety cap, not how much work a solver does (issue 18 item 4: the same plan for the
same inputs): each solver bounds its search by counted work (MILP nodes, CP-SAT's deterministic time,
pair solves, loop counts), so on a loaded machine it returns the same plan, only later.  When the cap
is what stopped some work the result may differ between runs: every such place calls `note_cut`
(directly, or through `expired` / `timed_out`), and a caller that wants to know wraps the solve in
`recording_cuts()` (`memviz.plan` puts what it recorded in the plan's solver statistics).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: the places a time limit cut work short during the innermost `recording_cuts()` (None: not recording)
_CUTS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("memviz_time_cuts", default=None)


@contextlib.contextmanager
def recording_cuts() -> Iterator[list[str]]:
    """Collect, in order and without repeats, the places where a time limit stopped work during the
    block: an empty list means the result depends on the inputs alone, not on the machine's speed."""
    cuts: list[str] = []
    token = _CUTS.set(cuts)
    try:
        yield cuts
    finally:
        _CUTS.reset(token)
        outer = _CUTS.get()
        if outer is not None:  # a nested recording's cuts are the outer one's too
            outer.extend(c for c in cuts if c not in outer)


def note_cut(where: str) -> None:
    """Record that a time limit stopped the work `where` names (a solver and its step)."""
    cuts = _CUTS.get()
    if cuts is not None and where not in cuts:
        cuts.append(where)


def timed_out(at: float, where: str, now: float | None = None) -> bool:
    """Whether `time.monotonic()` (or `now`, on the caller's clock) is past `at`; recorded as a cut at
    `where` when it is."""
    late = (time.monotonic() if now is None else now) >= at
    if late:
        note_cut(where)
    return late

#: the least time handed to a MILP / CP-SAT call, so a solver asked for 0 s still returns its status
MIN_SOLVER_SECONDS = 0.01


@dataclass(frozen=True)
class Deadline:
    """The moment (`time.monotonic()` seconds) by which a solve must have returned."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + max(seconds, 0.0))

    @classmethod
    def of(cls, time_limit: float, deadline: Deadline | None = None) -> Deadline:
        """The earlier of `time_limit` seconds from now and `deadline` (the caller's, when it has one)."""
        own = cls.after(time_limit)
        return own if deadline is None or own.at < deadline.at else deadline

    def left(self) -> float:
        """Seconds until the deadline (0 once it has passed)."""
        return max(self.at - time.monotonic(), 0.0)

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def expired(self, where: str) -> bool:
        """`passed()`, recorded as a cut at `where` when true: for checks that skip or stop work."""
        late = self.passed()
        if late:
            note_cut(where)
        return late

    def part(self, share: float) -> Deadline:
        """A deadline `share` (0..1) of the way from now to this one: for a step that must leave the rest
        of the time to the steps after it."""
        now = time.monotonic()
        return Deadline(now + share * max(self.at - now, 0.0))

    def seconds(self, margin: float = 0.0) -> float:
        """The time limit to hand an external solver: what is left minus `margin` (model building and
        solution extraction after it returns), at least `MIN_SOLVER_SECONDS`."""
        return max(self.left() - margin, MIN_SOLVER_SECONDS)


def limit_cp_sat(solver: Any, seconds: float, work: float) -> None:
    """Bound an OR-Tools `CpSolver` by `work` units of its deterministic time (the same on any
    machine), with `seconds` of wall-clock time as the safety cap.  One worker: CP-SAT's parallel
    portfolio is not deterministic (and on a shared machine one worker also finished sooner)."""
    solver.parameters.max_time_in_seconds = max(0.05, seconds)
    solver.parameters.max_deterministic_time = work
    solver.parameters.num_workers = 1


def note_cp_sat_cut(solver: Any, proven: bool, where: str) -> None:
    """After `solver.Solve` under `limit_cp_sat`: record a cut at `where` when the search was not
    finished (`proven` false: neither optimal nor infeasible) before its deterministic work was spent,
    so the wall-clock cap stopped it."""
    spent = solver.ResponseProto().deterministic_time
    if not proven and spent < 0.99 * solver.parameters.max_deterministic_time:
        note_cut(where)
