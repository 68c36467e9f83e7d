"""What every planning algorithm returns: a schedule plus honest statistics about how it was found."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from solvers.schedule import Schedule

Status = Literal["optimal", "feasible", "heuristic"]


@dataclass(frozen=True)
class SolverStats:
    """`status`: "optimal" (proved), "feasible" (a time limit stopped the search; `gap` says how far
    from the bound), "heuristic" (no optimality claim).  `gap` is relative: (best - bound) / best."""

    solver: str
    status: Status
    seconds: float
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    backend: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SolveResult:
    schedule: Schedule
    stats: SolverStats


class InfeasibleBudget(ValueError):
    """No schedule fits the budget.  `minimum_bytes` is the smallest feasible budget the solver knows
    (a proven minimum when `proven`, otherwise the best upper bound it found)."""

    def __init__(self, budget: int, minimum_bytes: int | None, solver: str, proven: bool = False) -> None:
        self.budget = budget
        self.minimum_bytes = minimum_bytes
        self.solver = solver
        self.proven = proven
        hint = (
            f"; the smallest feasible budget {'is' if proven else 'found is'} {minimum_bytes} bytes "
            f"({minimum_bytes / 2**20:.1f} MiB): raise the budget to at least that"
            if minimum_bytes is not None
            else ""
        )
        super().__init__(f"{solver}: no schedule fits in {budget} bytes ({budget / 2**20:.1f} MiB){hint}")
