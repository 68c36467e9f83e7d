"""`memviz.plan` for tests whose subject is a plan's contract, not the solver's speed.

The zoo and real-model tests plan with a few seconds' limit.  On a loaded 2-core machine a search can
run out of that time before it finds a schedule (CI saw rockmate on gru_lm refuse with "the time limit
ran out in the rotor plan search"): `OutOfTime`, an honest refusal that says to raise the limit.  These
tests then do what the refusal says, once, with `PATIENCE` times the limit; a proof that nothing fits
(`InfeasibleBudget`) is passed on at once.  Time limits themselves are tested in test_time_limits.py."""

from __future__ import annotations

from typing import Any

import memviz
from solvers.result import OutOfTime

#: how much longer the one retry may take
PATIENCE = 12


def patient_plan(prof: Any, budget: int | float, *, time_limit: float, **options: Any) -> Any:
    try:
        return memviz.plan(prof, budget, time_limit=time_limit, **options)
    except OutOfTime:
        return memviz.plan(prof, budget, time_limit=PATIENCE * time_limit, **options)
