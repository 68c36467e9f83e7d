"""The benchmark runner end to end at --quick sizes, into a temporary directory (never the committed
benchmarks/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_runner_quick_writes_results(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--only", "olla",
                           "autochunk", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "RESULTS.md").read_text()
    assert "FAILED" not in text
    assert "## Address packing and reordering" in text and "## Activation chunking" in text
    assert "| A | 154 |" in text  # MiniMalloc instance A was read and packed
    assert all((tmp_path / "results" / f"{name}.json").exists() for name in ("olla", "autochunk"))
