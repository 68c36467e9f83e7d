"""Plans in tests bounded by counted work alone (issue 18: `make test` passes on a loaded machine).

Solvers stop on counted work (MILP nodes and interrupt checks, CP-SAT's deterministic time, pair-solve
work, loop counts: `solvers/deadline.py`); every time limit is a safety cap, and where a cap stops work
the answer depends on the machine's speed.  A test that asserts on a plan (its existence, a minimum
budget, a peak) plans under `counted_work()`: the time limit it passes and the solvers' fixed per-call
caps are raised to `CAP_S`, which only a hung solver reaches, and the block fails if any cap still cut
work, naming where, so a clock-dependent answer is never what a test checks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memviz.plans import planning
from solvers import block_milp, chain, rockmate
from solvers.deadline import recording_cuts

#: seconds: the time limit tests plan with, far beyond the counted work of any test's model (BART's
#: Rockmate minimum, 24 CPU s, outran 600 s with the clock 5x fast and the cores shared 7 ways)
CAP_S = 1800.0
#: the fixed safety caps (module, name) some solvers apply per call regardless of the time limit
_FIXED_CAPS = ((block_milp, "SOLVE_SECONDS"), (chain, "LP_SECONDS"), (rockmate, "MILP_SECONDS"),
               (planning, "PACKING_SECONDS"), (planning, "FRONTIER_SECONDS"))


@contextlib.contextmanager
def counted_work() -> Iterator[list[str]]:
    """Within the block the fixed caps are `CAP_S`; on leaving it, asserts that no time cap cut any
    solver's work (yields the list of cuts, which stays empty)."""
    saved = [(module, name, getattr(module, name)) for module, name in _FIXED_CAPS]
    for module, name, _ in saved:
        setattr(module, name, CAP_S)
    try:
        with recording_cuts() as cuts:
            yield cuts
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    assert not cuts, f"a safety cap cut counted work, so the answer depends on the clock: {cuts}"
