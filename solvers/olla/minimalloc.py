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

COLUMNS = ("id", "lower", "upper", "size")


def read_csv(path: str | Path) -> tuple[list[str], list[Buffer]]:
    """(ids, buffers) from a MiniMalloc CSV; a clear error names the bad line.

    Tolerated: a UTF-8 byte-order mark, spaces and any letter case in the header and around values,
    columns in any order and extra named columns (MiniMalloc's output adds ``offset``), blank lines,
    and no header at all when the first row is data (then the columns are ``id,lower,upper,size``).
    """
    ids: list[str] = []
    buffers: list[Buffer] = []
    first_line: dict[str, int] = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        columns: dict[str, int] | None = None
        width = len(COLUMNS)  # fields per row: the header's count
        for row in reader:
            cells = [c.strip() for c in row]
            if not any(cells):
                continue  # blank line
            where = f"{path}:{reader.line_num}"
            if columns is None:
                columns = _columns(cells, where)
                if columns is not None:
                    width = len(cells)
                    continue  # a header
                columns = {name: i for i, name in enumerate(COLUMNS)}
            ident, buffer = _row(cells, columns, width, where)
            if ident in first_line:
                raise PackingError(f"{where}: duplicate id {ident!r} (first on line {first_line[ident]})")
            first_line[ident] = reader.line_num
            ids.append(ident)
            buffers.append(buffer)
    return ids, buffers


def _columns(cells: Sequence[str], where: str) -> dict[str, int] | None:
    """The column positions a header row names; None when the row is data (a headerless file)."""
    names = [c.lower() for c in cells]
    if len(cells) == len(COLUMNS) and all(_is_int(c) for c in cells[1:]):
        return None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise PackingError(
            f"{where}: header {','.join(cells)!r} lacks column(s) {', '.join(missing)}; "
            "need id,lower,upper,size"
        )
    return {name: names.index(name) for name in COLUMNS}


def _row(cells: Sequence[str], columns: dict[str, int], width: int, where: str) -> tuple[str, Buffer]:
    """(id, (lower, upper, size)) of one data row of `width` fields, or an error naming its line."""
    if len(cells) != width:
        raise PackingError(f"{where}: {len(cells)} field(s), expected {width}")
    lower, upper, size = (cells[columns[c]] for c in COLUMNS[1:])
    if not all(_is_int(v) for v in (lower, upper, size)):
        raise PackingError(
            f"{where}: lower, upper and size must be integers, got {lower!r}, {upper!r}, {size!r}"
        )
    buffer = (int(lower), int(upper), int(size))
    if not 0 <= buffer[0] < buffer[1] or buffer[2] < 0:
        raise PackingError(f"{where}: need 0 <= lower < upper and size >= 0, got {buffer}")
    return cells[columns["id"]], buffer


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


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
