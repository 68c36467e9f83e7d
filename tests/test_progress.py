"""Long solves show progress (issue 23 item 5): memviz.plan's solve and its budget frontier each drive a
progress bar that appears only after 2 s, so fast plans print nothing."""

from __future__ import annotations

from typing import Any

import pytest

import memviz
import memviz.plans.planning as planning
from tests.graphs import training_chain


class Recorder:
    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.count, self.closed = total, desc, 0, False
        BARS.append(self)

    def update(self, n: int = 1) -> None:
        self.count += n

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


BARS: list[Recorder] = []


def test_plan_and_frontier_report_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    BARS.clear()
    monkeypatch.setattr(planning, "progress", Recorder)
    graph = training_chain(8)
    memviz.plan(graph, 0.9, strategy="rotor", frontier=True)
    solve, frontier = BARS
    assert (solve.desc, solve.total, solve.count, solve.closed) == ("memviz: planning (rotor)", 1, 1, True)
    assert frontier.total == planning.FRONTIER_POINTS == frontier.count and frontier.closed


def test_the_bar_waits_two_seconds_before_showing() -> None:
    bar = planning.progress(3, "x")
    assert bar.delay == 2.0 and not bar.leave
    bar.close()
