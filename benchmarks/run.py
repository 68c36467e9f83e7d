"""Run every benchmark and regenerate benchmarks/RESULTS.md plus benchmarks/results/*.json.

Run: ``python benchmarks/run.py [--quick] [--only NAME ...] [--out DIR]``.  Every ``bench_<name>.py``
beside this file is a benchmark.  Each runs as its own process (``bench_<name>.py --out
DIR/results/<name>.json``, plus ``--quick``) under a wall-time budget, so one benchmark's memory and
threads never colour another's and a hung solver cannot eat the whole run; its section is the
result's ``"markdown"`` or, for older modules, ``markdown(result)``.  RESULTS.md is rewritten after
every benchmark, so an interrupted run still leaves the finished sections.
Timings on these shared 2-core machines are noisy: the load average before and after is recorded and
the sections quote medians and ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: name -> (extra arguments for a full run, extra arguments for --quick); default ([], ["--quick"])
ARGS: dict[str, tuple[list[str], list[str]]] = {
    "olla": (["--pack-time-limit", "30"], ["--quick"]),
    "autochunk": (["--seqs", "2048", "4096", "8192", "--reps", "5"], ["--quick"]),
}
#: benchmarks that run only where CUDA is: elsewhere a full run leaves them out (``--keep`` shows their
#: saved results)
NEEDS_CUDA = frozenset({"cuda", "cuda_compile"})
#: wall-time target of a full run, seconds (45 minutes: the apply, scaling, planfile, fsdp and scale
#: benches came on top of a run that filled 30; 50 since olla packs all eleven MiniMalloc instances,
#: papers proves the reordering bounds and the UI-latency bench came; plus 37 for compile, whose Inductor
#: compiles are slow; 8 more for cuda on a GPU machine; 16 more for papers, whose GPT2-large and per-model
#: OLLA rows took it from 240 s to 722 s at load 9 and 900 s at load 15-18, past its budget, so no full
#: run had its rows; 3 more for scaling, 88 s at load 4 but past its 220 s at load 13-15; 2 more for
#: fsdp's 4-rank FSDP2 x TP rows; 2 more for scale's max micro-batch, confirmed on real profiles; 10 more
#: for export, timed at 15-40 ms steps: 570 s at load 11-16; 5 more for apply's compiled rows; 5 more for
#: pipeline's gloo stages: 137 s of wall at load 15-22, past 240 s at load 27; 30 more for apply's
#: compiled-baseline plans: llama's took 24 min of wall at load 15-22; 1 more for pipeline's PP x FSDP2
#: rows, 4 more gloo ranks: 361 s of wall at load 11-16; 8 more for apply: its one run with memviz at
#: every peer's peak took 2397 s of wall at load 5-13, 3 s short of its budget; 3 more for real's
#: alternating pairs and 3-repeat profiles: 521 s of wall at load 5-10; 15 more for real's 2 rounds of 61
#: pairs: 38 min of wall under nice 10 at load 7.5-11, 13 min of CPU; 7 more for cuda_compile on a GPU
#: machine)
TARGET_S = 203 * 60
#: wall-time budget of each bench, seconds, about 1.2x its last recorded wall time under load (fsdp: 1.6x
#: its 155 CPU seconds, as its last run, 903 s of wall at load 13-16, was mostly waiting for a core; scale:
#: 1.6x its 327 CPU seconds, 1784 s of wall at load 12-16, whose search needs 268 of them at any load;
#: apply: 1.2x its 2397 s of wall at load 5-13 with the compiled rows, the compiled-baseline plans of
#: three models and memviz at every peer's peak);
#: the sum stays within TARGET_S
BUDGET_S: dict[str, float] = {"remat": 330, "capture": 80, "olla": 130, "autochunk": 170, "papers": 1200,
                             "export": 690, "user": 40, "real": 1600, "apply": 2900, "planfile": 130,
                             "scaling": 400, "fsdp": 250, "scale": 530, "ui": 180, "compile": 2200,
                             "cuda": 500, "cuda_compile": 400, "pipeline": 430}
QUICK_BUDGET_S = 300.0
#: every bench_*.py here; remat first: the longest, and the one the headline leads with
BENCHMARKS = sorted((p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py")),
                    key=lambda n: (n != "remat", n))


def auto_minimum(prof: Any) -> int:
    """The smallest budget `memviz.plan`'s auto strategy reaches on a profile (it is asked for one byte
    over the persistent bytes and names its minimum when refusing)."""
    import memviz
    from solvers.result import InfeasibleBudget

    low = prof.graph.persistent_bytes() + 1
    try:
        memviz.plan(prof, low, strategy="auto", time_limit=10.0, frontier=False, packing=False)
    except InfeasibleBudget as exc:
        return exc.minimum_bytes
    return low


def bench_main(run: Callable[[bool], dict], name: str, doc: str, argv: list[str] | None = None,
               quick_help: str = "small sizes") -> int:
    """The command line every bench_*.py shares: `[--quick] [--out FILE]`, JSON written, markdown printed."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", type=Path, default=HERE / "results" / f"{name}.json")
    a = ap.parse_args(argv)
    result = run(a.quick)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["markdown"])
    return 0


def runnable_here() -> list[str]:
    """Every benchmark, less those needing a device this machine lacks (`NEEDS_CUDA`)."""
    import torch

    return [n for n in BENCHMARKS if n not in NEEDS_CUDA or torch.cuda.is_available()]


def machine_info() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    mem = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0) if Path("/proc/meminfo").exists() else 0
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run_one(name: str, out_dir: Path, quick: bool) -> tuple[dict | None, float, str]:
    full, fast = ARGS.get(name, ([], ["--quick"]))
    out = out_dir / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE / f"bench_{name}.py"), "--out", str(out), *(fast if quick else full)]
    budget = QUICK_BUDGET_S if quick else BUDGET_S.get(name, 300.0)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - start, f"did not finish within its {budget:.0f} s budget"
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return None, seconds, proc.stderr[-2000:]
    return json.loads(out.read_text()), seconds, ""


def _r(x: float) -> str:
    return f"{x:.2f}"


def headline(name: str, result: dict) -> list[tuple[str, str, str, str]]:
    """(metric, ours, baseline or target, ratio) rows for the README's table, from one result."""
    if "headline" in result:  # a benchmark that states its own headline
        return [tuple(map(str, (h["metric"], h["ours"], h["baseline"], h["ratio"])))
                for h in result["headline"]]
    rows: list[tuple[str, str, str, str]] = []
    if name == "autochunk" and result.get("max_length"):
        m = result["max_length"]
        rows.append((f"AutoChunk max sequence length at {m['budget_bytes'] / 2**20:.0f} MiB",
                     str(m["max_seq_chunked"]), f"unchunked {m['max_seq_unchunked']} (paper 3.2x-11.7x)",
                     _r(m["ratio"])))
    elif name == "papers":
        for r in result["rows"]:
            if r.get("ratio") is not None:
                rows.append((f"{r['table']}: {r['quantity']}", f"{r['ours']} {r.get('unit', '')}".strip(),
                             f"paper {r['paper']}", _r(r["ratio"])))
    return rows


def section_of(name: str, result: dict) -> str:
    """A result's RESULTS.md section: its "markdown", or its module's ``markdown(result)``."""
    return (result.get("markdown") or importlib.import_module(f"bench_{name}").markdown(result)).rstrip()


REBUILT = " (no benchmark re-run: sections rebuilt from the saved results, each with its own wall time)"


def render(info: dict, quick: bool, loads: tuple, total: float, done: dict, sections: list[str],
           done_here: bool = True) -> str:
    head = [
        "# memviz benchmarks", "",
        f"Generated by `python benchmarks/run.py{' --quick' if quick else ''}` on {info['date']}: "
        f"{info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, Python {info['python']}, "
        f"torch {info['torch']}. Load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in loads[0])}, "
        f"after {'/'.join(f'{x:.2f}' for x in loads[1])}; total wall time {total / 60:.1f} min"
        f"{'' if done_here else REBUILT}. "
        "No GPU on this machine: every figure is CPU-measured or estimated (fake devices). Other jobs "
        "shared the machine, so absolute times are pessimistic; ratios are measured in the same run.", "",
        "## Headline", "", "| metric | ours | baseline / paper / target | ratio |", "|---|---|---|---|",
    ]
    for name, result in done.items():
        head += [f"| {' | '.join(row)} |" for row in headline(name, result)]
    return "\n".join(head + [""] + sections)


def hand_written(previous: str, titles: set[str]) -> list[str]:
    """The sections of a RESULTS.md (`previous`) that no benchmark writes (a check script's table added by
    hand, as `check_accumulation.py`'s), as they are: every ``## `` section whose title is not in `titles`
    (those the benchmarks' results render) and not the headline.  A rebuild dropped them."""
    parts = re.split(r"(?m)^(?=## )", previous)[1:]
    return [p.rstrip() + "\n" for p in parts if p.splitlines()[0] not in titles | {"## Headline"}]


def _titles(out: Path, sections: list[str]) -> set[str]:
    """The ``## `` titles this run's sections and every saved result's section have."""
    rendered = list(sections)
    for name in BENCHMARKS:
        saved = out / "results" / f"{name}.json"
        if saved.exists():
            try:
                rendered.append(section_of(name, json.loads(saved.read_text())))
            except Exception:  # noqa: BLE001 - a result its module no longer renders: its title is unknown
                continue
    return {line for s in rendered for line in s.splitlines() if line.startswith("## ")}


def write_results(a: argparse.Namespace, info: dict, load_before: tuple, total: float, done: dict,
                  sections: list[str]) -> None:
    """RESULTS.md from this run's sections, after those kept (``--keep``) from saved results, and before
    the hand-written ones of the file it replaces (`hand_written`)."""
    kept, kept_sections = {}, []
    for name in (n for n in BENCHMARKS if a.keep and n not in a.only):
        saved = a.out / "results" / f"{name}.json"
        if saved.exists():
            kept[name] = json.loads(saved.read_text())
            when, wall = kept[name].get("run_date", "an earlier run"), kept[name].get("wall_s", "?")
            kept_sections.append(section_of(name, kept[name]) + f"\n\n_{name}: not re-run; kept from "
                                 f"results/{name}.json ({when}, {wall} s wall)._\n")
    path = a.out / "RESULTS.md"
    by_hand = hand_written(path.read_text(), _titles(a.out, sections)) if path.exists() else []
    text = render(info, a.quick, (load_before, os.getloadavg()), total, {**kept, **done},
                  kept_sections + sections + by_hand, done_here=bool(a.only))
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, about a minute per benchmark")
    ap.add_argument("--only", nargs="*", choices=BENCHMARKS, default=runnable_here(),
                    help="run only these (none, with --keep: rebuild RESULTS.md from the saved results)")
    ap.add_argument("--out", type=Path, default=HERE, help="directory for RESULTS.md and results/")
    ap.add_argument("--keep", action="store_true",
                    help="also show the saved results/<name>.json of benchmarks not re-run (marked as such)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    a.out.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    load_before = os.getloadavg()
    start = time.perf_counter()
    sections: list[str] = []
    done: dict[str, dict] = {}
    failures = []
    for name in a.only:
        print(f"[bench] {name} ...", flush=True)
        result, seconds, err = run_one(name, a.out, a.quick)
        if result is None:
            failures.append(name)
            sections.append(f"## {name}\n\nFAILED after {seconds:.0f} s:\n\n```\n{err}\n```\n")
            print(f"[bench] {name} FAILED\n{err}", flush=True)
        else:
            result.update(wall_s=round(seconds, 1), run_date=info["date"])
            (a.out / "results" / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
            done[name] = result
            sections.append(section_of(name, result) + f"\n\n_{name}: {seconds:.0f} s wall._\n")
            print(f"[bench] {name} done in {seconds:.0f} s", flush=True)
        write_results(a, info, load_before, time.perf_counter() - start, done, sections)
    write_results(a, info, load_before, time.perf_counter() - start, done, sections)
    print(f"[bench] wrote {a.out / 'RESULTS.md'} in {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
