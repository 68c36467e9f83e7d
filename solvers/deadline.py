"""One absolute deadline shared by a solver and everything it calls (issue 21: time limits are promises).

A time limit given as seconds is a promise to the caller, not a budget per step: when a solver calls
another (Checkmate runs Rockmate and Rotor for its MIP start, `memviz.plan` runs a solver, a frontier
and a packing), each nested call gets the same `Deadline` (or a part of what is left), never a fresh
full limit.  Loops check `passed()`; MILP and CP-SAT calls get `seconds(margin)`: what is left minus a
margin for building the model before and reading the solution after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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

    def part(self, share: float) -> Deadline:
        """A deadline `share` (0..1) of the way from now to this one: for a step that must leave the rest
        of the time to the steps after it."""
        now = time.monotonic()
        return Deadline(now + share * max(self.at - now, 0.0))

    def seconds(self, margin: float = 0.0) -> float:
        """The time limit to hand an external solver: what is left minus `margin` (model building and
        solution extraction after it returns), at least `MIN_SOLVER_SECONDS`."""
        return max(self.left() - margin, MIN_SOLVER_SECONDS)
