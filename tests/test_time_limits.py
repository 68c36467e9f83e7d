"""Issue 21: time limits are promises.  Every solver, and the default `memviz.plan` path, returns
within its limit on a ~2k-op graph, with a checked plan or an honest refusal (`InfeasibleBudget`, or
`OutOfTime` when the time ran out first); nested solvers share one deadline.

The promise is limit + 0.5 s; these tests allow limit + `TOLERANCE_S` because the machines running
them are shared (2 cores, often a load average of 8): a step that cannot be interrupted (one
simulation, one DP row, a model build) takes several times longer there.  A call's time is the
smaller of its wall-clock and its CPU seconds (this process's and the solver subprocesses' it reaped,
CBC's): a solver that overruns its limit spends both (every solver here computes on one thread), while
a process the loaded machine descheduled spends only the first (CI saw checkmate take 5.3 s of wall
clock for a 3 s limit).  The exact overrun against the 0.5 s target is recorded by
benchmarks/bench_scaling.py (and bench_olla.py for reordering).
Limits of 1 s run in the normal suite; 3 s and 10 s are slow.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable

import pytest
from gpt_chain import gpt_graph

from solvers import Graph, eager_schedule, simulate
from solvers.deadline import Deadline
from solvers.result import InfeasibleBudget, OutOfTime, SolveResult

#: seconds past the limit a call may take on a loaded shared machine (the target is 0.5 s: see above)
TOLERANCE_S = 2.0
#: 28 GPT layers: 2025 compute nodes, forward and backward
LAYERS = 28


def _olla(graph: Graph, budget: int, *, time_limit: float, deadline: Deadline | None = None) -> SolveResult:
    from solvers.olla import executor_tail, reorder

    return reorder(graph, time_limit=time_limit, deadline=deadline, last=executor_tail(graph))


def _solver(name: str) -> Callable[..., SolveResult]:
    from solvers import checkmate, rockmate, rotor

    return {"checkmate": checkmate.solve, "checkmate-lp": checkmate.solve_lp, "rockmate": rockmate.solve,
            "rotor": rotor.solve, "olla": _olla}[name]


SOLVERS = ("checkmate", "checkmate-lp", "rockmate", "rotor", "olla")


@pytest.fixture(scope="module")
def big() -> tuple[Graph, int]:
    g = gpt_graph(LAYERS)
    assert 1900 <= len(g.computes) <= 2100
    return g, int(0.8 * simulate(g, eager_schedule(g)).peak_bytes)


def fresh(graph: Graph, tag: str) -> Graph:
    """An equal graph under another name: solvers keep per-graph caches (DP tables, block menus, best
    orders), and each timed call must start cold, as a user's first call does."""
    return dataclasses.replace(graph, name=f"{graph.name}-{tag}")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(call: Callable[[], object]) -> tuple[object, float]:
    """The call's answer and its seconds: the smaller of wall clock and CPU time (see the module doc)."""
    start, cpu = time.monotonic(), _cpu_seconds()
    try:
        answer = call()
    except InfeasibleBudget as exc:  # OutOfTime included: a refusal is an answer
        answer = exc
    return answer, min(time.monotonic() - start, _cpu_seconds() - cpu)


def check_answer(graph: Graph, budget: int, answer: object, name: str) -> None:
    """A plan the simulator accepts (within the budget, for the rematerialising solvers), or a refusal
    that names the solver and, when it names a smallest budget, one above the budget asked for."""
    if isinstance(answer, InfeasibleBudget):
        assert answer.solver == name
        assert answer.minimum_bytes is None or answer.minimum_bytes > budget
        return
    assert isinstance(answer, SolveResult)
    timeline = simulate(graph, answer.schedule).check()
    if name != "olla":  # reordering never recomputes: its peak is what it is, not a budget answer
        assert timeline.peak_bytes <= budget


def run_solver(big: tuple[Graph, int], name: str, limit: float) -> None:
    graph, budget = big
    g = fresh(graph, f"{name}-{limit}")
    answer, seconds = timed(lambda: _solver(name)(g, budget, time_limit=limit))
    assert seconds <= limit + TOLERANCE_S, f"{name} took {seconds:.2f} s for a {limit} s limit"
    check_answer(g, budget, answer, name)


@pytest.mark.parametrize("name", SOLVERS)
def test_solver_returns_within_a_1s_limit_on_2k_ops(big: tuple[Graph, int], name: str) -> None:
    run_solver(big, name, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("limit", [3.0, 10.0])
@pytest.mark.parametrize("name", SOLVERS)
def test_solver_returns_within_longer_limits_on_2k_ops(big: tuple[Graph, int], name: str,
                                                       limit: float) -> None:
    run_solver(big, name, limit)


def _plan(graph: Graph, budget: int, limit: float) -> object:
    import memviz

    return memviz.plan(graph, budget, time_limit=limit)  # the default: auto, with frontier and packing


def check_plan(graph: Graph, budget: int, answer: object) -> None:
    if isinstance(answer, InfeasibleBudget):
        assert answer.minimum_bytes is None or answer.minimum_bytes > budget
        return
    assert simulate(graph, answer.schedule).check().peak_bytes == answer.peak_bytes <= budget
    for point in answer.frontier_points:
        assert simulate(graph, point.result.schedule).check().peak_bytes <= point.budget_bytes


def test_default_plan_returns_within_a_1s_limit_on_2k_ops(big: tuple[Graph, int]) -> None:
    graph, budget = big
    g = fresh(graph, "plan-1")
    answer, seconds = timed(lambda: _plan(g, budget, 1.0))
    assert seconds <= 1.0 + TOLERANCE_S, f"memviz.plan took {seconds:.2f} s for a 1 s limit"
    check_plan(g, budget, answer)


@pytest.mark.slow
@pytest.mark.parametrize("limit", [3.0, 10.0])
def test_default_plan_returns_within_longer_limits_on_2k_ops(big: tuple[Graph, int], limit: float) -> None:
    graph, budget = big
    g = fresh(graph, f"plan-{limit}")
    answer, seconds = timed(lambda: _plan(g, budget, limit))
    assert seconds <= limit + TOLERANCE_S, f"memviz.plan took {seconds:.2f} s for a {limit} s limit"
    check_plan(g, budget, answer)


def test_a_callers_deadline_binds_a_longer_time_limit(big: tuple[Graph, int]) -> None:
    """Nested solvers share the caller's deadline: a 60 s `time_limit` under a 1 s deadline is 1 s."""
    from solvers import checkmate

    graph, budget = big
    g = fresh(graph, "nested")
    answer, seconds = timed(lambda: checkmate.solve(g, budget, time_limit=60.0, deadline=Deadline.after(1.0)))
    assert seconds <= 1.0 + TOLERANCE_S, f"checkmate took {seconds:.2f} s under a 1 s deadline"
    check_answer(g, budget, answer, "checkmate")


@pytest.mark.parametrize("name", ["rotor", "rockmate"])
def test_a_passed_deadline_is_an_honest_refusal(name: str) -> None:
    """With no time for the DP the chain solvers refuse with `OutOfTime` (not a claim that nothing
    fits), and the refusal names no minimum; with time, the same budget gets a checked plan, which a
    later call past its deadline still returns (the chain's remembered lowest-peak plan fits)."""
    g = gpt_graph({"rotor": 2, "rockmate": 3}[name])  # one graph each: neither remembers a plan of it
    budget = int(0.9 * simulate(g, eager_schedule(g)).peak_bytes)  # fits only with recomputation
    with pytest.raises(OutOfTime, match="not a proof that none fits") as refusal:
        _solver(name)(g, budget, time_limit=60.0, deadline=Deadline.after(0.0))
    assert refusal.value.minimum_bytes is None and refusal.value.solver == name
    result = _solver(name)(g, budget, time_limit=60.0)
    assert simulate(g, result.schedule).check().peak_bytes <= budget
    late = _solver(name)(g, budget, time_limit=60.0, deadline=Deadline.after(0.0))
    assert simulate(g, late.schedule).check().peak_bytes <= budget


def test_deadline_takes_the_earlier_and_shares_what_is_left() -> None:
    outer = Deadline.after(5.0)
    assert Deadline.of(60.0, outer) == outer
    assert Deadline.of(1.0, outer).at < outer.at
    part = outer.part(0.5)
    assert part.at < outer.at and not part.passed()
    assert Deadline.after(0.0).passed() and Deadline.after(0.0).left() == 0.0
    assert Deadline.after(0.0).seconds(margin=1.0) > 0  # a solver is never handed a zero or negative limit
    assert Deadline.after(100.0).seconds(margin=1.0) <= 99.0
