"""Measurement on the legacy torch-xla device, one graph per step.

torch-xla (the Neuron SDK's ``torch-neuronx`` before TorchNeuron's eager mode; TPUs and XLA:GPU work the
same way) records operators lazily into a graph that is compiled and run whole at ``torch_xla.sync()``
(``xm.mark_step()`` in older releases).  No kernel runs per operator, so there is no per-operator time or
allocation to observe: the step is measured per graph instead.

- Time: the runtime's own ``ExecuteTime`` metric (``torch_xla.debug.metrics``: nanoseconds per executed
  graph, summed over the graphs one step runs), median over the timed runs.  At least one warm-up run
  comes first: it compiles the graph (its ``CompileTime`` is reported apart, never counted as run time).
  Without the metric, the wall clock of sync + ``wait_device_ops``.
- Memory: the runtime allocator's peak (``xm.get_memory_info``: ``peak_bytes_used``) where the PJRT
  plugin implements allocator statistics; on Neuron hardware otherwise the NeuronCores' device-memory
  peak counters (`memviz.hardware.neuron.read_sysfs`).  Both count since the runtime started, so a step
  profiled first in a fresh process is what they measure.  Elsewhere (XLA:CPU) the peak is not measurable and
  the measurement says why.
- Per-operator times: the measured graph time shared out in proportion to each operator's roofline
  estimate (FLOPs and bytes moved, `memviz.hardware.devices`).  The total is measured, the split is estimated;
  the profile says so (``DeviceInfo.per_graph``, plan documents' ``device.timing == "per-graph"``).

The XLA compiler orders and fuses the whole graph itself, so its peak is its own buffer assignment, not
PyTorch's eager order: a difference to the predicted eager peak is reported, not corrected.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from memviz.hardware import neuron
from memviz.hardware.devices import TARGETS, DeviceInfo, DeviceUnavailable

#: The roofline target whose op-time ratios share out a measured graph time, per XLA hardware kind
#: (``xm.xla_device_hw``); other kinds (TPU, custom PJRT plugins) use the H100's as a stated stand-in.
SHARE_TARGETS = {"NEURON": "trn2", "CUDA": "a100-80gb", "GPU": "a100-80gb", "CPU": "cpu"}
#: Warm-up runs at most, while runs still compile a new graph.
MAX_WARMUP = 6


@dataclass(frozen=True)
class GraphMeasurement:
    """One training or inference step run on an XLA device, measured as the graphs it executes."""

    seconds: float  # median execution time of one step
    samples: tuple[float, ...]  # every timed step, seconds
    compile_seconds: float  # compilation during the warm-up runs
    recompiled: bool  # a timed run compiled again: the step's graph changes from run to run
    timer: str  # "ExecuteTime" (the runtime's metric) or "wall clock"
    peak_bytes: int | None
    memory_source: str  # where peak_bytes comes from, or why it is None


def _modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    return (importlib.import_module("torch_xla"), importlib.import_module("torch_xla.core.xla_model"),
            importlib.import_module("torch_xla.debug.metrics"))


def _hardware(xm: ModuleType, dev: torch.device) -> str:
    """The XLA device's hardware kind: "NEURON", "TPU", "CUDA", "CPU"..."""
    return str(xm.xla_device_hw(dev)).upper()


def resolve(device: str | torch.device) -> DeviceInfo:
    """The XLA device named by `device` (``"xla"`` or ``"xla:N"``), or a `DeviceUnavailable` saying
    what to do when torch-xla is not installed."""
    if importlib.util.find_spec("torch_xla") is None:
        raise DeviceUnavailable(
            "device 'xla' needs torch-xla (the Neuron SDK's torch-neuronx installs it), which is not "
            "installed here; on Trainium prefer device='neuron' (TorchNeuron eager, measured per "
            "operator), or estimate with device='fake:trn1' / 'fake:trn2' / 'fake:inf2'")
    torch_xla, xm, _ = _modules()
    index = torch.device(device).index
    dev = torch.device(torch_xla.device(index) if hasattr(torch_xla, "device") else xm.xla_device(index))
    hw = _hardware(xm, dev)
    limit = _memory_info(xm, dev).get("bytes_limit")
    target = TARGETS[SHARE_TARGETS.get(hw, "h100")]
    return DeviceInfo(f"{dev} ({hw}, measured per graph)", False, None if limit is None else int(limit),
                      dev, target, per_graph=True)


def _memory_info(xm: ModuleType, dev: torch.device) -> dict[str, Any]:
    """``xm.get_memory_info`` as a dict, empty where the PJRT plugin has no allocator statistics (it
    raises UNIMPLEMENTED there, e.g. on XLA:CPU)."""
    try:
        info = xm.get_memory_info(dev)
    except (RuntimeError, NotImplementedError):
        return {}
    return dict(info) if isinstance(info, dict) else {}


def available_bytes(device: torch.device) -> int | None:
    """Bytes the runtime could still allocate on `device`, None where it does not say."""
    _, xm, _ = _modules()
    info = _memory_info(xm, device)
    if "bytes_limit" not in info or "bytes_used" not in info:
        return None
    return max(0, int(info["bytes_limit"]) - int(info["bytes_used"]))


@contextlib.contextmanager
def fork_rng(device: torch.device) -> Iterator[None]:
    """Leave the XLA device's random seed as it was (a dropout in the measured step draws from it)."""
    _, xm, _ = _modules()
    state = xm.get_rng_state(device)
    try:
        yield
    finally:
        xm.set_rng_state(state, device)


def _metric(met: ModuleType, name: str) -> tuple[int, float] | None:
    """(samples, accumulated value) of a runtime metric, None when the runtime never recorded it."""
    data = met.metric_data(name)
    return None if data is None else (int(data[0]), float(data[1]))


def _delta(before: tuple[int, float] | None, after: tuple[int, float] | None) -> tuple[int, float]:
    b = before or (0, 0.0)
    a = after or (0, 0.0)
    return a[0] - b[0], a[1] - b[1]


def measure_step(step: Callable[[], Any], device: torch.device, *, repeats: int = 3,
                 warmup: int = 1) -> GraphMeasurement:
    """Run `step()` (which builds the step's lazy graph and returns its results) and execute it: warm-up
    runs that compile, then `repeats` timed runs.  Each run's results are alive at the sync, so the graph
    computes them, and dropped before the next run.

    The warm-up lasts `warmup` runs (at least one), and longer while a run still compiles (up to
    `MAX_WARMUP` runs): the second step of a model with in-place buffer updates (BatchNorm statistics) is
    often another graph than the first, and only the cached graph is worth timing."""
    torch_xla, xm, met = _modules()
    sync = getattr(torch_xla, "sync", None) or xm.mark_step  # mark_step: torch-xla before 2.6

    def run() -> tuple[int, float, float, int, float]:
        """(graphs executed, their ExecuteTime ns, wall seconds of sync + wait, graphs compiled, ns)"""
        execute, compiles = _metric(met, "ExecuteTime"), _metric(met, "CompileTime")
        out = step()
        t0 = time.perf_counter()
        sync()
        xm.wait_device_ops()
        wall = time.perf_counter() - t0
        del out
        runs, nanoseconds = _delta(execute, _metric(met, "ExecuteTime"))
        return runs, nanoseconds, wall, *_delta(compiles, _metric(met, "CompileTime"))

    samples: list[float] = []
    timers: set[str] = set()
    compile_ns, recompiled = 0.0, False
    for i in range(MAX_WARMUP + max(1, repeats)):
        runs, nanoseconds, wall, compiled, compiling_ns = run()
        if i < max(1, warmup) or (compiled and not samples and i < MAX_WARMUP):
            compile_ns += compiling_ns  # a warm-up run: untimed
            continue
        recompiled = recompiled or compiled > 0
        timers.add("ExecuteTime" if runs > 0 else "wall clock")
        samples.append(nanoseconds / 1e9 if runs > 0 else wall)
        if len(samples) == max(1, repeats):
            break
    peak, source = _peak(xm, device)
    return GraphMeasurement(statistics.median(samples), tuple(samples), compile_ns / 1e9, recompiled,
                            " and ".join(sorted(timers)), peak, source)


def _peak(xm: ModuleType, device: torch.device) -> tuple[int | None, str]:
    info = _memory_info(xm, device)
    if "peak_bytes_used" in info:
        return int(info["peak_bytes_used"]), "the runtime allocator's peak (xm.get_memory_info)"
    if _hardware(xm, device) == "NEURON":
        try:
            peak = neuron.read_sysfs().peak_bytes
        except (FileNotFoundError, neuron.NeuronFormatError) as err:
            return None, f"no allocator statistics and no Neuron sysfs counters ({err})"
        if peak is not None:
            return peak, "the largest NeuronCore device-memory peak (sysfs)"
    return None, "this XLA runtime reports no allocator statistics (xm.get_memory_info)"


def share_time(estimates: dict[int, float], seconds: float) -> dict[int, float]:
    """`seconds` (one measured step) shared out over the operators in proportion to their estimated
    times; equal shares when every estimate is zero."""
    total = sum(estimates.values())
    if total <= 0:
        return {c: seconds / len(estimates) for c in estimates} if estimates else {}
    return {c: seconds * t / total for c, t in estimates.items()}

