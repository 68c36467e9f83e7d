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

from memviz import accelerator


class StorageTracker(TorchDispatchMode):
    """Live bytes of tensor storages, and their peak, over the operators run inside the context."""

    def __init__(self, preexisting: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._alive: dict[int, int] = {}  # storage key -> bytes
        for t in preexisting:
            self.add(t)
        self.start_bytes = self.live_bytes

    def add(self, t: torch.Tensor) -> None:
        """Count `t`'s storage until it is freed (no-op when already counted)."""
        if t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor):
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._alive:
            return
        nbytes = int(storage.nbytes())
        self._alive[key] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        # storages keep their Python object alive with the C++ storage (PyObject preservation), so the
        # finalizer runs exactly when the memory is released
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        nbytes = self._alive.pop(key, 0)
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
        return out


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


def eager_train_step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                     loss_fn: Callable[[Any], torch.Tensor]) -> Callable[[], Any]:
    """A closure running forward, loss and backward of `model` eagerly (what the baseline predicts)."""

    def step() -> Any:
        out = model(*args, **(kwargs or {}))
        loss = loss_fn(out)
        loss.backward()
        return out, loss

    return step
