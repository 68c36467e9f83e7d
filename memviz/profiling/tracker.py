"""Measure the memory a PyTorch run really holds: live tensor storages on CPU, allocator stats on CUDA.

CPU has no allocator statistics, so `StorageTracker` is a ``TorchDispatchMode`` that sees every
operator's outputs, records each new storage once with a weak-reference finalizer and keeps a running
sum of the bytes still alive and its maximum.  Tensors that exist before the run (parameters,
buffers, inputs, optimizer state) are registered up front, so the figure counts the same categories
as `solvers.simulate` (every data node alive, parameters and inputs included) and the two are
directly comparable.  Views and in-place results share their base's storage and are counted once,
exactly like the CD-graph's merged data nodes.  Workspace inside a kernel (BLAS buffers) is invisible
here, as it is in the graph (``temp_bytes`` 0 on CPU).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from memviz.hardware import accelerator


class StorageTracker(TorchDispatchMode):
    """Live bytes of tensor storages, and their peak, over the operators run inside the context."""

    def __init__(self, preexisting: Iterable[torch.Tensor] = (), *, fake: bool = False) -> None:
        """`fake`: count fake tensors (their meta storages live and die like real ones) instead of real
        ones, to measure what a function would hold without running it
        (`memviz.profiling.capture.loss_memory`)."""
        super().__init__()
        self.fake = fake
        self.live_bytes = 0
        self.peak_bytes = 0
        self._alive: dict[int, int] = {}  # storage key -> bytes
        self._serial: dict[int, int] = {}  # storage key -> how many storages were counted before it
        self._count = 0
        for t in preexisting:
            self.add(t)
        self.start_bytes = self.live_bytes

    def add(self, t: torch.Tensor) -> None:
        """Count `t`'s storage until it is freed (no-op when already counted)."""
        fake = isinstance(t, torch._subclasses.FakeTensor)
        if fake != self.fake or (t.device.type == "meta" and not fake):
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._alive:
            return
        nbytes = int(storage.nbytes())
        self._alive[key] = nbytes
        self._serial[key] = self._count
        self._count += 1
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        # storages keep their Python object alive with the C++ storage (PyObject preservation), so the
        # finalizer runs exactly when the memory is released
        weakref.finalize(storage, self._release, key)

    def mark(self) -> int:
        """A point in the run, for `counted_since`."""
        return self._count

    def counted_since(self, t: torch.Tensor, mark: int) -> bool:
        """Whether `t`'s storage is alive and was first counted after `mark`.  A storage key
        (``_cdata``, its address) is reused once the storage is freed: the order tells them apart."""
        key = t.untyped_storage()._cdata
        return key in self._alive and self._serial[key] >= mark

    def reset_peak(self) -> None:
        """Start a new peak from the bytes alive now."""
        self.peak_bytes = self.live_bytes

    def _release(self, key: int) -> None:
        nbytes = self._alive.pop(key, 0)
        self._serial.pop(key, None)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
        return out


class AllocatorMeter:
    """`StorageTracker`'s interface over an accelerator's caching allocator (``memory_allocated``,
    ``max_memory_allocated``): everything on the device counts, so nothing needs registering."""

    def __init__(self, preexisting: Iterable[torch.Tensor], device: torch.device | str) -> None:
        self.device = device
        self._known = {t.untyped_storage().data_ptr(): 0 for t in preexisting}
        self._count = 1
        self.start_bytes = self.live_bytes = self.peak_bytes = self._allocated()
        torch.accelerator.reset_peak_memory_stats(accelerator.index(device))

    def _allocated(self) -> int:
        accelerator.synchronize(self.device)
        return int(torch.accelerator.memory_allocated(accelerator.index(self.device)))

    def __enter__(self) -> AllocatorMeter:
        return self

    def current_peak(self) -> int:
        """The peak so far, inside a run (`peak_bytes` is read when it ends)."""
        index = accelerator.index(self.device)
        return max(self.peak_bytes, int(torch.accelerator.max_memory_allocated(index)))

    def __exit__(self, *exc: object) -> None:
        self.live_bytes = self._allocated()
        self.peak_bytes = max(self.peak_bytes, int(torch.accelerator.max_memory_allocated(
            accelerator.index(self.device))))

    def add(self, t: torch.Tensor) -> None:
        self._known.setdefault(t.untyped_storage().data_ptr(), self._count)
        self._count += 1
        self.live_bytes = self._allocated()

    def mark(self) -> int:
        return self._count

    def counted_since(self, t: torch.Tensor, mark: int) -> bool:
        """A storage not among the ones registered before `mark` (pointers of freed storages may be
        reused: only ones still alive are registered here, the tensors passed in)."""
        return self._known.get(t.untyped_storage().data_ptr(), mark) >= mark

    def reset_peak(self) -> None:
        torch.accelerator.reset_peak_memory_stats(accelerator.index(self.device))
        self.peak_bytes = self.live_bytes = self._allocated()


def memory_meter(preexisting: Iterable[torch.Tensor], *, fake: bool,
                 device: torch.device | str = "cpu") -> StorageTracker | AllocatorMeter:
    """What measures a short run's memory: a `StorageTracker` over fake tensors or on CPU, the
    allocator's statistics on an accelerator.  Both count `preexisting` from the start."""
    if not fake and accelerator.is_accelerator(device):
        return AllocatorMeter(preexisting, device)
    return StorageTracker(preexisting, fake=fake)


def tensors_of(*objs: Any) -> list[torch.Tensor]:
    """Every tensor reachable in modules (parameters, buffers, .grad), optimizers (state) and pytrees."""
    found: list[torch.Tensor] = []
    for obj in objs:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                found.append(p)
                if p.grad is not None:
                    found.append(p.grad)
            found.extend(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                found.extend(v for v in state.values() if isinstance(v, torch.Tensor))
        else:
            found.extend(x for x in pytree.tree_leaves(obj) if isinstance(x, torch.Tensor))
    return found


def measure_peak(fn: Callable[[], Any], preexisting: Iterable[torch.Tensor] = (),
                 device: torch.device | str = "cpu") -> tuple[int, Any]:
    """Run `fn()` and return (peak bytes held during it, its result).

    CPU: `StorageTracker` with `preexisting` counted from the start.  An accelerator (CUDA, Neuron):
    the caching allocator's ``max_memory_allocated`` after a reset (it already counts everything
    allocated on the device)."""
    if accelerator.is_accelerator(device):
        _, peak, result = accelerator.peak_allocated(fn, device)
        return peak, result
    tracker = StorageTracker(preexisting)
    with tracker:
        result = fn()
    return tracker.peak_bytes, result


def allocator_peak(fn: Callable[[], Any], preexisting: Iterable[torch.Tensor] = ()) -> tuple[int, Any]:
    """(peak bytes, result) of `fn()` on CPU from torch.profiler's memory events, which see what the CPU
    allocator hands out inside compiled code: torch.compile runs eagerly while a dispatch mode such as
    `StorageTracker` is active (and, measured with aot_eager on a GPT-2, keeps running that model eagerly
    on later calls: never track a compiled model you measure afterwards), and inductor's generated
    wrapper allocates without dispatching.  The
    peak is the allocator's high-water mark above its level when `fn` started, plus the storages of
    `preexisting` (counted once, as `StorageTracker` counts them)."""
    import json
    import tempfile
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    start = StorageTracker(preexisting).live_bytes
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    if not events:
        return start, result
    events.sort(key=lambda e: e["ts"])
    level = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return start + max(0, max(e["args"]["Total Allocated"] for e in events) - level), result


def eager_train_step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                     loss_fn: Callable[[Any], torch.Tensor]) -> Callable[[], Any]:
    """A closure running forward, loss and backward of `model` eagerly (what the baseline predicts)."""

    def step() -> Any:
        loss = loss_fn(model(*args, **(kwargs or {})))  # the outputs go once the loss has read them
        loss.backward()
        return loss

    return step


def grad_alias(x: Any) -> Any:
    """A tensor that requires grad as a new leaf on the same storage: its ``.grad`` is its own, not the
    user's (a measured or compared step leaves the user's inputs' gradients alone)."""
    if isinstance(x, torch.Tensor) and x.requires_grad:
        return x.detach().requires_grad_(True)
    return x
