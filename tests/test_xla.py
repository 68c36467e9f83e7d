"""The legacy torch-xla device, measured per graph (`memviz.hardware.xla`).

torch-xla 2.9 (its last release) cannot be installed beside torch 2.13, so the profile path runs here
against a fake runtime with torch-xla's API (``torch_xla.sync``, ``xm.wait_device_ops``,
``xm.get_memory_info``, ``torch_xla.debug.metrics``): its "device" is the CPU, every sync executes one
graph of a fixed time and the first sync of each new graph compiles it.  The measurement function itself
also runs on a real torch-xla runtime when one is importable (`test_a_real_xla_runtime`)."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import memviz
from memviz.hardware import neuron, xla
from memviz.hardware.devices import DeviceUnavailable, resolve_device
from memviz.profiling.profile import ProfileWarning

EXECUTE_NS = 2_000_000  # each executed graph takes 2 ms
COMPILE_NS = 500_000_000
FIXTURES = Path(__file__).parent / "fixtures" / "neuron"


class FakeRuntime:
    """torch-xla's Python surface over the CPU: metrics recorded per sync, allocator statistics."""

    def __init__(self, hw: str = "NEURON", memory: dict[str, int] | None = None,
                 new_graphs: int = 1) -> None:
        self.hw, self.memory = hw, memory
        self.new_graphs = new_graphs  # how many syncs compile (a new graph) before the cache hits
        self.metrics: dict[str, list[float]] = {}
        self.syncs = self.waits = 0
        self.seed = 7

    def _record(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(value)

    def sync(self, wait: bool = False) -> None:
        if self.syncs < self.new_graphs:
            self._record("CompileTime", COMPILE_NS)
        self._record("ExecuteTime", EXECUTE_NS)
        self.syncs += 1

    def metric_data(self, name: str) -> Any:
        values = self.metrics.get(name)
        return None if values is None else (len(values), float(sum(values)), ())

    def get_memory_info(self, device: Any) -> dict[str, int]:
        if self.memory is None:
            raise RuntimeError("Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats is not supported")
        return dict(self.memory)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        torch_xla, xm, met = (ModuleType(n) for n in ("torch_xla", "torch_xla.core.xla_model",
                                                      "torch_xla.debug.metrics"))
        torch_xla.device = lambda index=None: torch.device("cpu")
        torch_xla.sync = self.sync
        xm.xla_device_hw = lambda device: self.hw
        xm.get_memory_info = self.get_memory_info
        xm.wait_device_ops = lambda devices=(): setattr(self, "waits", self.waits + 1)
        xm.get_rng_state = lambda device=None: self.seed
        xm.set_rng_state = lambda seed, device=None: setattr(self, "seed", seed)
        met.metric_data = lambda name: self.metric_data(name)  # looked up per call: a test may swap it
        for name, module in (("torch_xla", torch_xla), ("torch_xla.core.xla_model", xm),
                             ("torch_xla.debug.metrics", met)):
            monkeypatch.setitem(sys.modules, name, module)
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: object() if name == "torch_xla" else real(name, *a))


def _mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(128, 16))
    return model, (torch.randn(8, 32),)


def test_without_torch_xla_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch_xla" else real(name, *a))
    model, args = _mlp()
    with pytest.raises(DeviceUnavailable, match="needs torch-xla.*device='neuron'.*fake:trn1"):
        resolve_device("xla", model, args)


def test_the_step_time_is_measured_per_graph_and_shared_by_the_roofline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = FakeRuntime(memory={"bytes_used": 10 << 20, "bytes_limit": 16 << 30, "peak_bytes_used": 123456})
    runtime.install(monkeypatch)
    model, args = _mlp()
    with pytest.warns(ProfileWarning, match="measured peak 123456 bytes .* differs from the predicted"):
        prof = memviz.profile(model, args, device="xla", repeats=3, warmup=1)

    assert prof.device.per_graph and not prof.device.estimated and prof.device.timing == "per-graph"
    assert prof.device.name == "cpu (NEURON, measured per graph)"
    assert prof.device.capacity_bytes == 16 << 30 and prof.device.target.name == "trn2"
    # one warm-up run that compiles, three timed runs that hit the cache
    assert runtime.syncs == 4 and runtime.waits == 4
    times = {c.id: c.time for c in prof.graph.computes}
    assert math.isclose(sum(times.values()), EXECUTE_NS / 1e9, rel_tol=1e-9)  # compile time not counted
    # the split is the roofline's: proportional to the operators' estimated times on a Trainium2
    estimate = {c.id: c.time for c in memviz.profile(model, args, device="fake:trn2").graph.computes}
    scale = sum(estimate.values()) / sum(times.values())
    assert all(math.isclose(times[c] * scale, estimate[c], rel_tol=1e-9) for c in times)
    assert prof.measured_peak_bytes == 123456
    assert runtime.seed == 7  # the device's random seed is left as it was
    doc = memviz.plan(prof, None).to_dict()
    assert doc["device"]["timing"] == "per-graph"
    memviz.plans.planfile.validate_document(doc)


def test_warm_up_lasts_while_runs_compile_and_the_wall_clock_stands_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = FakeRuntime(new_graphs=3)  # BatchNorm-like: the second and third steps are new graphs
    runtime.install(monkeypatch)
    m = xla.measure_step(lambda: torch.ones(2), torch.device("cpu"), repeats=2, warmup=1)
    assert runtime.syncs == 3 + 2 and not m.recompiled
    assert m.compile_seconds == 3 * COMPILE_NS / 1e9 and m.seconds == EXECUTE_NS / 1e9
    assert m.timer == "ExecuteTime" and m.samples == (EXECUTE_NS / 1e9,) * 2
    # a runtime without the ExecuteTime metric: the wall clock of sync + wait
    monkeypatch.setattr(runtime, "metric_data", lambda name: None)
    m = xla.measure_step(lambda: torch.ones(2), torch.device("cpu"), repeats=3, warmup=1)
    assert m.timer == "wall clock" and len(m.samples) == 3 and 0 <= m.seconds < 1


def test_a_graph_that_compiles_on_every_run_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = FakeRuntime(new_graphs=10**6, memory={"bytes_used": 0, "bytes_limit": 1 << 30,
                                                    "peak_bytes_used": 1})
    runtime.install(monkeypatch)
    m = xla.measure_step(lambda: torch.ones(2), torch.device("cpu"), repeats=2, warmup=1)
    assert m.recompiled and runtime.syncs == xla.MAX_WARMUP + 2
    model, args = _mlp()
    with pytest.warns(ProfileWarning, match="compiled again during the timed runs"):
        memviz.profile(model, args, device="xla")


def test_a_peak_comes_from_neuron_sysfs_or_is_reported_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = _mlp()
    FakeRuntime(hw="NEURON", memory=None).install(monkeypatch)  # no allocator statistics
    real = neuron.read_sysfs
    monkeypatch.setattr(neuron, "read_sysfs", lambda root=None: real(FIXTURES / "sysfs"))
    with pytest.warns(ProfileWarning, match="largest NeuronCore device-memory peak"):
        prof = memviz.profile(model, args, device="xla:0", mode="inference")
    assert prof.measured_peak_bytes == 1653604352 and prof.device.capacity_bytes is None

    FakeRuntime(hw="CPU", memory=None).install(monkeypatch)  # XLA:CPU: nothing to read
    with pytest.warns(ProfileWarning, match="reports no allocator statistics.*measured_peak_bytes is None"):
        prof = memviz.profile(model, args, device="xla")
    assert prof.measured_peak_bytes is None and prof.device.target.name == "cpu"
    assert all(c.time > 0 for c in prof.graph.computes if c.flops)


def test_a_peak_within_tolerance_is_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = _mlp()
    predicted = memviz.profile(model, args, device="fake:trn2").peak_bytes
    FakeRuntime(memory={"bytes_used": 0, "bytes_limit": 1 << 30, "peak_bytes_used": predicted}).install(
        monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        prof = memviz.profile(model, args, device="xla")
    assert prof.measured_peak_bytes == predicted


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs a torch-xla runtime")
def test_a_real_xla_runtime() -> None:
    """On a real runtime (e.g. ``PJRT_DEVICE=CPU`` with torch-xla installed): the first run compiles,
    the timed ones hit the cache and are timed by the runtime's ExecuteTime metric."""
    info = xla.resolve("xla")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    model = model.to(info.torch_device)
    x = torch.randn(16, 64, device=info.torch_device)
    m = xla.measure_step(lambda: model(x).sum(), info.torch_device, repeats=3)
    assert m.timer == "ExecuteTime" and not m.recompiled and m.compile_seconds > 0
    assert len(m.samples) == 3 and m.seconds > 0
