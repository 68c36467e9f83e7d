"""Pack a MiniMalloc CSV instance (Moffitt, ASPLOS 2023; github.com/google/minimalloc).

    python -m solvers.olla.minimalloc IN.csv [--capacity N] [--out OUT.csv] [--time-limit S]

Input columns ``id,lower,upper,size``: buffer ``id`` occupies ``[offset, offset + size)`` during
``[lower, upper)``.  Output adds ``offset`` (MiniMalloc's output format).  Without ``--capacity`` the
peak is minimised; with it, the first placement that fits is returned (exit status 1 if none).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from solvers.olla.pack import Buffer, Packing, PackingError, pack, validate_packing


def read_csv(path: str | Path) -> tuple[list[str], list[Buffer]]:
    """(ids, buffers) from a MiniMalloc CSV; a clear error names the bad line."""
    ids: list[str] = []
    buffers: list[Buffer] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"id", "lower", "upper", "size"} - set(reader.fieldnames or ())
        if missing:
            raise PackingError(
                f"{path}: missing column(s) {', '.join(sorted(missing))}; need id,lower,upper,size"
            )
        for line, row in enumerate(reader, start=2):
            try:
                buffers.append((int(row["lower"]), int(row["upper"]), int(row["size"])))
            except (TypeError, ValueError):
                raise PackingError(f"{path}:{line}: lower, upper and size must be integers: {row}") from None
            ids.append(row["id"])
    return ids, buffers


def write_csv(path: str | Path, ids: Sequence[str], packing: Packing) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "lower", "upper", "size", "offset"])
        for name, (s, e, z), o in zip(ids, packing.buffers, packing.offsets, strict=True):
            w.writerow([name, s, e, z, o])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m solvers.olla.minimalloc", description=__doc__.splitlines()[0]
    )
    ap.add_argument("input", type=Path, help="CSV with columns id,lower,upper,size")
    ap.add_argument("--capacity", type=int, default=None, help="memory size to fit (bytes)")
    ap.add_argument("--out", type=Path, default=None, help="write id,lower,upper,size,offset here")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds (default 10)")
    args = ap.parse_args(argv)
    try:
        ids, buffers = read_csv(args.input)
        start = time.perf_counter()
        packing = pack(buffers, args.capacity, time_limit=args.time_limit)
    except (OSError, PackingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    if validate_packing(packing.buffers, packing.offsets, args.capacity):
        print("error: internal packing check failed", file=sys.stderr)
        return 2
    fits = "yes" if args.capacity is None or packing.peak_bytes <= args.capacity else "no"
    print(
        f"buffers {len(buffers)}  fits {fits}  peak {packing.peak_bytes}  lower bound "
        f"{packing.lower_bound}  status {packing.status}  greedy peak {packing.greedy_peak}  "
        f"time {seconds:.3f} s"
    )
    if args.out is not None:
        write_csv(args.out, ids, packing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
