"""The benchmark runner end to end at --quick sizes, into a temporary directory (never the committed
benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_runner_quick_writes_results(tmp_path):
    _run("--only", "olla", "--out", str(tmp_path))
    _run("--only", "autochunk", "--keep", "--out", str(tmp_path))  # olla's saved section is kept
    text = (tmp_path / "RESULTS.md").read_text()
    assert "FAILED" not in text
    assert text.index("## Headline") < text.index("## Address packing and reordering")
    assert "| OLLA reordering" in text  # the headline row read from olla's result
    assert "_olla: not re-run; kept from results/olla.json" in text and "## Activation chunking" in text
    assert "Load average (1/5/15 min) before" in text
    assert "| A | 154 |" in text  # MiniMalloc instance A was read and packed
    for name in ("olla", "autochunk"):
        assert json.loads((tmp_path / "results" / f"{name}.json").read_text())["wall_s"] > 0


def test_runner_lists_every_bench_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run

    on_disk = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert sorted(run.BENCHMARKS) == on_disk and "remat" in on_disk
    assert sum(run.BUDGET_S.get(n, 300.0) for n in on_disk) <= 30 * 60  # the full run's 30-minute target
