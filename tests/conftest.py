"""Shared fixtures: the example models at test sizes, in float32 and float64."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `examples` is a plain directory at the repo root
    sys.path.insert(0, str(ROOT))

from examples.models import EXAMPLES  # noqa: E402

EXAMPLE_NAMES = sorted(EXAMPLES)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@pytest.fixture(params=EXAMPLE_NAMES)
def example_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(DTYPES))
def example_dtype(request: pytest.FixtureRequest) -> torch.dtype:
    return DTYPES[request.param]


@pytest.fixture
def example(example_name: str, example_dtype: torch.dtype) -> tuple[str, torch.nn.Module, tuple]:
    """(name, model, args) for every example model at test size, in float32 and float64."""
    model, args = EXAMPLES[example_name](dtype=example_dtype)
    return example_name, model, args


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test-py` runs two workers) each worker computes on one intra-op thread, and
    so do the subprocesses its tests start (OMP_NUM_THREADS is inherited): two workers of two threads each
    would oversubscribe a 2-core machine and stall each other's OpenMP barriers (tests/test_apply.py under
    `-n 2` at load 15: 51 CPU s with one thread, 99 CPU s with torch's default).  MEMVIZ_TEST_THREADS_KEPT=1
    keeps torch's default, to measure that again."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("MEMVIZ_TEST_THREADS_KEPT"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slower-machine", type=float, default=1.0, metavar="N",
        help="run every test as if on a machine N times slower: time.monotonic and time.perf_counter run N "
             "times faster inside each test, so every wall-clock time limit is cut N-fold (finds the tests "
             "whose outcome depends on the machine's load; measured times are scaled too)")


@pytest.fixture(autouse=True)
def _slower_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--slower-machine N`: a busy CI machine on a quiet one.  Solvers read these clocks for their
    limits (`solvers.deadline`); HiGHS and CP-SAT keep their own wall clocks for what they are handed."""
    factor = request.config.getoption("--slower-machine")
    if factor == 1.0:
        return
    import time

    real = time.monotonic, time.perf_counter
    base = [f() for f in real]
    monkeypatch.setattr(time, "monotonic", lambda: base[0] + factor * (real[0]() - base[0]))
    monkeypatch.setattr(time, "perf_counter", lambda: base[1] + factor * (real[1]() - base[1]))
