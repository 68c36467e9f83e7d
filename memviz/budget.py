"""Budget parsing: every memviz entry point accepts the same budget spellings."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*|%)\s*$", re.IGNORECASE)


BUDGET_FORMS = "bytes as an int, '1.5GiB', '800MB', or '50%' of the eager peak"


def budget_spec(budget: int | float | str) -> tuple[str, float]:
    """("bytes", n) or ("fraction", f in (0, 1]): everything about a budget that can be checked before the
    baseline peak is known (the CLI checks a budget before it profiles).  A bare number in a string counts
    bytes, as an int does: "0.5" is half a byte, refused, and a fraction is written "50%" (or, in Python,
    the float 0.5)."""
    if isinstance(budget, bool):
        raise TypeError(
            "budget must be bytes (int), a fraction in (0, 1], or a string like '1.5GiB' or '50%'"
        )
    if isinstance(budget, int):
        kind, value = "bytes", float(budget)
    elif isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ValueError(
                f"a float budget is a fraction of the baseline peak and must be in (0, 1], got {budget}; "
                "give bytes as an int or a string like '1.5GiB'"
            )
        kind, value = "fraction", budget
    elif isinstance(budget, str):
        m = _PATTERN.match(budget)
        if not m:
            raise ValueError(f"cannot read budget {budget!r}: use {BUDGET_FORMS}")
        number, unit = float(m.group(1)), m.group(2).lower()
        if not math.isfinite(number):
            raise ValueError(f"budget {budget!r} is not a finite number: use {BUDGET_FORMS}")
        if unit == "%":
            if not 0 < number <= 100:
                raise ValueError(f"a percentage budget must be in (0, 100], got {budget!r}")
            kind, value = "fraction", number / 100
        elif unit in _UNITS:
            kind, value = "bytes", number * _UNITS[unit]
        else:
            raise ValueError(
                f"unknown unit {m.group(2)!r} in budget {budget!r}: use B, KB, MB, GB, KiB, MiB, GiB or %"
            )
        if kind == "bytes" and 0 < value < 1:
            hint = (f"a number without a unit counts bytes; for a fraction of the eager peak write "
                    f"'{value * 100:g}%'") if unit == "" else "a budget is at least one byte"
            raise ValueError(f"budget {budget!r} is {value:g} bytes: {hint}")
    else:
        raise TypeError(f"budget must be int, float or str, not {type(budget).__name__}")
    if value <= 0:
        raise ValueError(f"budget must be positive, got {budget!r}")
    return kind, value


def parse_budget(budget: int | float | str, reference_bytes: int) -> int:
    """Total device bytes from an int (bytes), a float in (0, 1] (fraction of `reference_bytes`, the
    baseline peak), "1.5GiB" / "800MB" / "123456" (a bare number counts bytes), or "50%"."""
    kind, value = budget_spec(budget)
    total = int(value) if kind == "bytes" else int(value * reference_bytes)
    if total <= 0:
        raise ValueError(f"budget {budget!r} is {total} bytes of a {reference_bytes}-byte eager peak: "
                         "give a larger one")
    return total


def format_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.2f} {units[i]}"
