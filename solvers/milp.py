"""A small MILP layer: one sparse row model, solved by HiGHS (highspy) or by PuLP's bundled CBC.

Why not PuLP for HiGHS too: PuLP 3.3's HiGHS API neither passes a MIP start nor exposes the dual
bound, and it reports "Optimal" when the time limit stops it with a solution (TOOLCHAIN.md).  Here
HiGHS is driven directly: the incumbent goes in with `setSolution`, the bound and the status come
from `getInfo()` / `getModelStatus()`.  CBC (the fallback when highspy is missing) goes through
`pulp.PULP_CBC_CMD`, whose `sol_status` tells a proven optimum from a solution cut short by the limit.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from solvers.deadline import note_cut

Backend = Literal["highs", "cbc"]
MilpStatus = Literal["optimal", "feasible", "infeasible", "no_solution"]


@dataclass
class Model:
    """Minimise `cost . x` subject to `lo <= A x <= hi` and bounds; rows are stored sparse."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)
    row_start: list[int] = field(default_factory=lambda: [0])
    row_index: list[int] = field(default_factory=list)
    row_value: list[float] = field(default_factory=list)

    @property
    def num_vars(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)

    def var(self, lb: float = 0.0, ub: float = 1.0, cost: float = 0.0, integer: bool = True) -> int:
        self.lower.append(lb)
        self.upper.append(ub)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, terms: Iterable[tuple[int, float]], lo: float = -math.inf, hi: float = math.inf) -> None:
        merged: dict[int, float] = {}
        for j, a in terms:
            merged[j] = merged.get(j, 0.0) + a
        for j, a in merged.items():
            if a != 0.0:
                self.row_index.append(j)
                self.row_value.append(a)
        self.row_start.append(len(self.row_index))
        self.row_lo.append(lo)
        self.row_hi.append(hi)

    def violation(self, x: Sequence[float]) -> float:
        """Largest bound or row violation of `x` (used to check a MIP start before handing it over)."""
        worst = 0.0
        for j, v in enumerate(x):
            worst = max(worst, self.lower[j] - v, v - self.upper[j])
        for r in range(self.num_rows):
            s = sum(self.row_value[k] * x[self.row_index[k]]
                    for k in range(self.row_start[r], self.row_start[r + 1]))
            worst = max(worst, self.row_lo[r] - s, s - self.row_hi[r])
        return worst


@dataclass(frozen=True)
class MilpSolution:
    status: MilpStatus
    x: tuple[float, ...] | None
    objective: float | None
    bound: float | None
    backend: Backend
    seconds: float
    cut: bool = False  # the time limit, not the search or the node limit, stopped the solver
    iterations: int = 0  # simplex iterations, counted work (HiGHS; 0 from CBC, which does not say)

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        if self.status == "optimal":
            return 0.0
        return max(0.0, self.objective - self.bound) / max(abs(self.objective), 1e-12)


def default_backend() -> Backend:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return "cbc"
    return "highs"


def solve(
    model: Model, *, time_limit: float, backend: Backend | None = None, relax: bool = False,
    start: Sequence[float] | None = None, nodes: int | None = None, checks: int | None = None,
    where: str = "milp",
) -> MilpSolution:
    """Solve `model` (its LP relaxation when `relax`) from MIP start `start`, exploring at most `nodes`
    branch-and-bound nodes and stopping at HiGHS's `checks`-th interrupt check (None: no limit), or
    after `time_limit` seconds.  Nodes and checks are counted work, so the answer is the same on a slow
    machine (HiGHS checks at fixed points of its search, the root node's cut rounds included, which the
    node limit does not bound; CBC gets the node limit only); the time limit is the safety cap, and
    when it is what stopped the solver, `solvers.deadline.note_cut(where)` records it."""
    backend = backend or default_backend()
    t0 = time.perf_counter()
    if backend == "highs":
        status, x, obj, bound, cut, iterations = _solve_highs(model, max(time_limit, 0.01), relax, start,
                                                              nodes, checks)
    else:
        status, x, obj, bound, cut = _solve_cbc(model, max(time_limit, 0.01), relax, start, nodes)
        iterations = 0
    if cut:
        note_cut(where)
    return MilpSolution(status, x, obj, bound, backend, time.perf_counter() - t0, cut, iterations)


def _solve_highs(model: Model, time_limit: float, relax: bool, start: Sequence[float] | None,
                 nodes: int | None, checks: int | None):
    import highspy

    t0 = time.perf_counter()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("random_seed", 0)
    if nodes is not None and not relax:
        h.setOptionValue("mip_max_nodes", max(int(nodes), 1))
    if checks is not None and not relax:
        seen = [0]

        def stop_at_checks(event: highspy.highs.HighsCallbackEvent) -> None:
            seen[0] += 1
            if seen[0] >= checks:
                event.interrupt()

        h.cbMipInterrupt.subscribe(stop_at_checks)
    # Brute-force comparisons need true optima, not HiGHS's default 1e-4 relative gap.
    h.setOptionValue("mip_rel_gap", 1e-7)
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    n = model.num_vars
    inf = highspy.kHighsInf
    h.addVars(n, np.array(model.lower, dtype=np.float64), np.array(model.upper, dtype=np.float64))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(model.cost, dtype=np.float64))
    if model.num_rows:
        lo = np.array([-inf if v == -math.inf else v for v in model.row_lo], dtype=np.float64)
        hi = np.array([inf if v == math.inf else v for v in model.row_hi], dtype=np.float64)
        starts = np.array(model.row_start[:-1], dtype=np.int32)
        index = np.array(model.row_index, dtype=np.int32)
        values = np.array(model.row_value, dtype=np.float64)
        h.addRows(model.num_rows, lo, hi, len(index), starts, index, values)
    ints = np.array([j for j in range(n) if model.integer[j]], dtype=np.int32)
    if not relax and len(ints):
        h.changeColsIntegrality(len(ints), ints, np.ones(len(ints), dtype=np.uint8))
        if start is not None:
            h.setSolution(n, np.arange(n, dtype=np.int32), np.array(start, dtype=np.float64))
    # loading a large model takes a while: the limit covers it, not only the search
    h.setOptionValue("time_limit", max(time_limit - (time.perf_counter() - t0), 0.01))
    h.run()
    ms = h.getModelStatus()
    cut = ms == highspy.HighsModelStatus.kTimeLimit
    info = h.getInfo()
    its = max(int(info.simplex_iteration_count), 0)
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if ms == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None, None, None, cut, its
    if not has_x:
        bound = info.mip_dual_bound if not relax and math.isfinite(info.mip_dual_bound) else None
        return "no_solution", None, None, bound, cut, its
    x = tuple(h.getSolution().col_value)
    obj = info.objective_function_value
    if ms == highspy.HighsModelStatus.kOptimal:
        return "optimal", x, obj, obj if relax else info.mip_dual_bound, cut, its
    bound = info.mip_dual_bound if not relax and math.isfinite(info.mip_dual_bound) else None
    return "feasible", x, obj, bound, cut, its


def _solve_cbc(model: Model, time_limit: float, relax: bool, start: Sequence[float] | None,
               nodes: int | None):
    import pulp

    prob = pulp.LpProblem("milp", pulp.LpMinimize)
    def bound(v: float) -> float | None:
        return None if math.isinf(v) else v

    xs = [
        prob.add_variable(f"x{j}", bound(model.lower[j]), bound(model.upper[j]),
                          cat=pulp.LpInteger if model.integer[j] and not relax else pulp.LpContinuous)
        for j in range(model.num_vars)
    ]
    prob += pulp.lpSum(c * xs[j] for j, c in enumerate(model.cost) if c)
    for r in range(model.num_rows):
        ks = range(model.row_start[r], model.row_start[r + 1])
        expr = pulp.lpSum(model.row_value[k] * xs[model.row_index[k]] for k in ks)
        lo, hi = model.row_lo[r], model.row_hi[r]
        if lo == hi:
            prob += expr == lo
        else:
            if lo != -math.inf:
                prob += expr >= lo
            if hi != math.inf:
                prob += expr <= hi
    if start is not None:
        for v, s in zip(xs, start, strict=True):
            v.setInitialValue(s)
    with warnings.catch_warnings():
        # pulp 3.3 flags its bundled CBC as deprecated for 4.0, which needs Python >= 3.12 (TOOLCHAIN.md)
        warnings.simplefilter("ignore", DeprecationWarning)
        options = [] if nodes is None or relax else [f"maxNodes {max(int(nodes), 1)}"]
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, warmStart=start is not None and not relax,
                                   gapRel=1e-7, threads=1, options=options)
    t0 = time.perf_counter()
    prob.solve(solver)
    # PuLP does not say which limit stopped CBC: a run that lasted the whole time limit was the clock's
    cut = time.perf_counter() - t0 >= 0.95 * time_limit
    if prob.sol_status == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        return "infeasible", None, None, None, cut
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return "no_solution", None, None, None, cut
    x = tuple(float(v.varValue or 0.0) for v in xs)
    obj = float(sum(c * x[j] for j, c in enumerate(model.cost)))
    if prob.sol_status == pulp.LpSolutionOptimal:
        return "optimal", x, obj, obj, cut
    # CBC through PuLP reports no dual bound: the gap stays unknown rather than invented.
    return "feasible", x, obj, None, cut
