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

    def __init__(self, budget: int, minimum_bytes: int | None, solver: str, proven: bool = False,
                 eager_peak: int | None = None) -> None:
        self.budget = budget
        self.minimum_bytes = minimum_bytes
        self.solver = solver
        self.proven = proven
        self.eager_peak = eager_peak

        def size(n: int) -> str:
            # in every unit a budget may have been typed in: bytes, MiB, GiB and % of the eager peak
            share = f", {100 * n / eager_peak:.1f}% of the eager peak" if eager_peak else ""
            unit = next((u for u in ("GiB", "MiB", "KiB") if n >= 2 ** (10 * "KMG".index(u[0]) + 10)), "")
            scaled = f"{n / 2 ** (10 * 'KMG'.index(unit[0]) + 10):.2f} {unit}" if unit else f"{n} B"
            gib = "" if unit == "GiB" else f", {n / 2**30:.4g} GiB"
            return f"{n} bytes ({scaled}{gib}{share})"

        hint = (
            f"; the smallest feasible budget {'is' if proven else 'found is'} {size(minimum_bytes)}: "
            "raise the budget to at least that"
            if minimum_bytes is not None
            else ""
        )
        super().__init__(f"{solver}: no schedule fits in {size(budget)}{hint}")

    def with_eager_peak(self, eager_peak: int) -> InfeasibleBudget:
        """The same refusal, stated also as a share of the eager peak (the unit of a "50%" budget)."""
        return InfeasibleBudget(self.budget, self.minimum_bytes, self.solver, self.proven, eager_peak)


class BelowHeldMemory(InfeasibleBudget):
    """The budget is under what every schedule holds from its first step to its last (`Graph.held_bytes`:
    parameters, buffers, optimizer state, the runtime's scratch, gradients held from the start), and the
    solvers ran out of time before naming their minimum: the refusal says that no time limit would help.
    No feasible budget is known (`minimum_bytes` None)."""

    def __init__(self, budget: int, held_bytes: int, solver: str) -> None:
        super().__init__(budget, None, solver, proven=True)
        self.held_bytes = held_bytes
        self.args = (f"{solver}: no schedule fits in {budget} bytes: every schedule holds {held_bytes} bytes "
                     f"({held_bytes / 2**20:.2f} MiB) all step long (parameters, buffers, optimizer state, "
                     "the device runtime's scratch and gradients accumulated into), whatever it recomputes; "
                     "raise the budget above "
                     "that, or shrink what is held (a lighter optimizer, sharding the parameters)",)

    def with_eager_peak(self, eager_peak: int) -> InfeasibleBudget:
        return self


class OutOfTime(InfeasibleBudget):
    """The time limit ran out before any schedule within the budget was found: a refusal, not a proof
    that none fits (`minimum_bytes` is None, or the smallest peak found so far).  `step` names what was
    cut short, so the message can say what to give more time."""

    def __init__(self, step: str, budget: int = 0, solver: str = "",
                 minimum_bytes: int | None = None) -> None:
        super().__init__(budget, minimum_bytes, solver or step, proven=False)
        self.step = step
        found = "" if minimum_bytes is None else f" (the smallest peak found so far is {minimum_bytes} bytes)"
        self.args = (f"{self.solver}: the time limit ran out in the {step} before a schedule within {budget} "
                     f"bytes was found{found}; this is not a proof that none fits: raise time_limit",)

    def within(self, budget: int, solver: str) -> OutOfTime:
        """The same refusal, for the budget and solver of the call it escaped from."""
        return OutOfTime(self.step, budget, solver, self.minimum_bytes)

    def with_eager_peak(self, eager_peak: int) -> InfeasibleBudget:
        return self
