"""Budget parsing: every memviz entry point accepts the same budget spellings."""

from __future__ import annotations

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


def parse_budget(budget: int | float | str, reference_bytes: int) -> int:
    """Total device bytes from an int (bytes), a float in (0, 1] (fraction of `reference_bytes`, the
    baseline peak), "1.5GiB" / "800MB" / "123456", or "50%"."""
    if isinstance(budget, bool):
        raise TypeError(
            "budget must be bytes (int), a fraction in (0, 1], or a string like '1.5GiB' or '50%'"
        )
    if isinstance(budget, int):
        value = budget
    elif isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ValueError(
                f"a float budget is a fraction of the baseline peak and must be in (0, 1], got {budget}; "
                "give bytes as an int or a string like '1.5GiB'"
            )
        value = int(budget * reference_bytes)
    elif isinstance(budget, str):
        m = _PATTERN.match(budget)
        if not m:
            raise ValueError(f"cannot read budget {budget!r}: use bytes, '1.5GiB', '800MB' or '50%'")
        number, unit = float(m.group(1)), m.group(2).lower()
        if unit == "%":
            if not 0 < number <= 100:
                raise ValueError(f"a percentage budget must be in (0, 100], got {budget!r}")
            value = int(number / 100 * reference_bytes)
        elif unit in _UNITS:
            value = int(number * _UNITS[unit])
        else:
            raise ValueError(
                f"unknown unit {m.group(2)!r} in budget {budget!r}: use B, KB, MB, GB, KiB, MiB, GiB or %"
            )
    else:
        raise TypeError(f"budget must be int, float or str, not {type(budget).__name__}")
    if value <= 0:
        raise ValueError(f"budget must be positive, got {budget!r}")
    return value


def format_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.2f} {units[i]}"
