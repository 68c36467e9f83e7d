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
    parser.addoption(
        "--noisy-timings", type=int, default=None, metavar="SEED",
        help="multiply every op time and fixed cost a profile measures by a pseudo-random factor in [0.5, 2] "
             "per op, drawn from SEED, as a loaded machine measures them (finds the tests that assert "
             "something of one particular plan that measured times decide)")


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


def noisy_factor(seed: int, *key: object) -> float:
    """A factor in [0.5, 2] (log-uniform) that `seed` and `key` fix, the same in every run and process
    (no salted `hash`): what a loaded machine may multiply one measured time by."""
    import hashlib
    import random

    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return 2.0 ** random.Random(digest).uniform(-1.0, 1.0)


@pytest.fixture(autouse=True)
def _noisy_timings(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--noisy-timings SEED`: every time a plan or a test reads from this process's clocks comes back
    multiplied per key by `noisy_factor`, as a loaded machine measures it: `memviz.profile`'s op times,
    optimizer updates, the step times its fixed costs come from (`profile.fixed_costs_of`, so what is
    derived from them stays consistent), checkpointing costs, a hooks (fallback) profile's module times,
    an in-process recorded parallel step's op times, the compiled calibration's time ratio per option
    (`plans.compiled.compiled_step`), and chunking's speed-model probes and op times
    (`chunking._best_times`, `chunking.measure_times`).  Estimated (``fake:``) costs stay exact, as they
    do on a loaded machine; gloo ranks in subprocesses are not reached."""
    seed = request.config.getoption("--noisy-timings")
    if seed is None:
        return
    import dataclasses

    from memviz.parallel import distributed as D
    from memviz.plans import chunking as K
    from memviz.plans import compiled as C
    from memviz.profiling import profile as P
    from solvers import Graph, simulate

    def noisy_graph(graph: Graph) -> Graph:  # identical ops share one measurement, so one factor
        return P._with_costs(graph, {c.id: c.time * noisy_factor(seed, "op", c.op, c.time)
                                     for c in graph.computes}, {})

    def noisy_fixed(graph, cap, *timings):
        return fixed(graph, cap, *([t * noisy_factor(seed, "fixed", i) for t in ts]
                                   for i, ts in enumerate(timings)))

    def noisy_costs(costs: dict, what: str) -> dict:
        return {k: v * noisy_factor(seed, what, k) if isinstance(v, float) else v for k, v in costs.items()}

    def noisy_hooks_profile(*a, **k):  # its baseline was simulated on the exact times: again
        prof = hooks(*a, **k)
        graph = noisy_graph(prof.graph)
        baseline = simulate(graph, prof.baseline_schedule).check()
        return dataclasses.replace(prof, graph=graph, baseline=baseline)

    def noisy_recorded(rec, *a, **k):  # a step recorded for a `fake:` target has estimated times
        graph, schedule = recorded(rec, *a, **k)
        return (graph if rec.target is not None else noisy_graph(graph)), schedule

    def noisy_compiled_step(prof, graph, regions, *a, **k):
        peak, ratio = compiled_step(prof, graph, regions, *a, **k)
        option = tuple((r.name, len(r.nodes), len(r.save)) for r in regions)
        return peak, None if ratio is None else ratio * noisy_factor(seed, "compiled", option)

    def noisy_op_times(g):
        return dataclasses.replace(g, nodes=tuple(dataclasses.replace(
            n, time=n.time * noisy_factor(seed, "chunk op", n.name, n.op)) for n in g.nodes))

    measure, fixed, checkpoint = P._measure_costs, P.fixed_costs_of, P._checkpoint_costs
    update, hooks, recorded = P._time_update, P._hooks_profile, D.recorded_graph
    compiled_step, best_times, op_times = C.compiled_step, K._best_times, K.measure_times
    monkeypatch.setattr(P, "_measure_costs", lambda *a, **k: noisy_graph(measure(*a, **k)))
    monkeypatch.setattr(P, "fixed_costs_of", noisy_fixed)
    monkeypatch.setattr(P, "_checkpoint_costs",
                        lambda *a, **k: noisy_costs(checkpoint(*a, **k), "checkpoint"))
    monkeypatch.setattr(P, "_time_update", lambda cls, p, *a, **k: update(cls, p, *a, **k) * noisy_factor(
        seed, "update", cls.__name__, p.name))
    monkeypatch.setattr(P, "_hooks_profile", noisy_hooks_profile)
    monkeypatch.setattr(D, "recorded_graph", noisy_recorded)
    monkeypatch.setattr(C, "compiled_step", noisy_compiled_step)
    # the speed model's probes, by position (`chunking.calibrate` caches what it builds from them per device)
    monkeypatch.setattr(K, "_best_times", lambda fns, *a, **k: [
        t * noisy_factor(seed, "probe", i) for i, t in enumerate(best_times(fns, *a, **k))])
    monkeypatch.setattr(K, "measure_times", lambda *a, **k: noisy_op_times(op_times(*a, **k)))
