"""Measurement on an accelerator through PyTorch's device-generic API (``torch.accelerator``).

CUDA and the eager TorchNeuron device (``torch_neuronx`` registers ``neuron`` as PyTorch's PrivateUse1
backend, so ``torch.accelerator`` reaches its caching allocator) expose the same calls: synchronize,
``memory_allocated``, ``max_memory_allocated`` after ``reset_peak_memory_stats``, ``get_memory_info``
and timing events.  Both allocators are asynchronous, so every read synchronizes first (the Neuron
memory-profiling guide asks for ``torch.neuron.synchronize()`` before any memory statistic).

The CPU has no such allocator statistics: its peaks come from `memviz.profiling.tracker.StorageTracker`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch


def is_accelerator(device: torch.device | str) -> bool:
    """Whether `device` is measured through ``torch.accelerator``: anything but the CPU, meta and XLA
    (torch-xla runs whole graphs and has its own runtime statistics: `memviz.hardware.xla`)."""
    return torch.device(device).type not in ("cpu", "meta", "xla")


def index(device: torch.device | str) -> int:
    """The device's index (its current index when the device names none)."""
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.accelerator.current_device_index()


def synchronize(device: torch.device | str) -> None:
    """Wait for every kernel queued on `device` (a no-op on the CPU)."""
    if is_accelerator(device):
        torch.accelerator.synchronize(index(device))


def peak_allocated(fn: Callable[[], Any], device: torch.device | str) -> tuple[int, int, Any]:
    """Run `fn()` on an accelerator: (allocated bytes before, peak allocated bytes during it, result)."""
    i = index(device)
    torch.accelerator.synchronize(i)
    before = torch.accelerator.memory_allocated(i)
    torch.accelerator.reset_peak_memory_stats(i)
    out = fn()
    torch.accelerator.synchronize(i)
    return int(before), int(torch.accelerator.max_memory_allocated(i)), out


def workspace_bytes(fn: Callable[[], Any], device: torch.device | str) -> int:
    """Transient bytes of `fn()`: the allocator's peak during it beyond what was allocated before and
    what it returns (a kernel's scratch space, freed when it ends)."""
    before, peak, out = peak_allocated(fn, device)
    kept = torch.accelerator.memory_allocated(index(device)) - before
    del out
    return max(0, peak - before - kept)


def runtime_bytes(fn: Callable[[], Any], device: torch.device | str) -> tuple[int, Any]:
    """(bytes the device runtime keeps after `fn()` for itself, `fn()`'s result): cuBLAS allocates a
    workspace through PyTorch's caching allocator for each (handle, stream) a matmul runs on -- one for
    the calling thread, one for autograd's backward thread, 32 MiB each on Hopper (measured on an H100)
    -- and keeps it for the process's life, so every step holds it.  Measured as what clearing those
    workspaces frees after `fn()` ran with none allocated; 0 on devices without cuBLAS."""
    if torch.device(device).type != "cuda":
        return 0, fn()
    clear = torch._C._cuda_clearCublasWorkspaces  # the only handle PyTorch gives on these buffers
    torch.accelerator.synchronize(index(device))
    clear()
    out = fn()
    torch.accelerator.synchronize(index(device))
    held = torch.accelerator.memory_allocated(index(device))
    clear()
    freed = held - torch.accelerator.memory_allocated(index(device))
    return max(0, int(freed)), out


#: the clock `timed` reads on the CPU when a caller sets one (a benchmark may pin ``time.process_time``);
#: None: `host_clock` picks it
cpu_clock: Callable[[], float] | None = None


def host_clock() -> Callable[[], float]:
    """The clock CPU timings read: `cpu_clock` when set; else this process's CPU time when torch runs one
    intra-op thread, else the wall clock.  With one thread a CPU step (forward, loss, and autograd's
    backward, which the engine runs in the calling thread for CPU tensors) is this process's work in
    this thread, so its CPU time is the step's cost and other processes' load on a shared machine does
    not inflate it (a wall-clock eager step under load made the profile's ``eager_fixed_s`` absorb the
    descheduling).  With several intra-op threads the process's CPU time sums the workers' time (and
    OpenMP's spin-waits), not what the user waits for: the wall clock."""
    if cpu_clock is not None:
        return cpu_clock
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


@contextlib.contextmanager
def timing_threads(device: torch.device | str) -> Iterator[None]:
    """Inside, CPU operators run on one intra-op thread (restored after), so `host_clock` reads this
    process's CPU time: what the profile times on the CPU is timed there as ``torch.utils.benchmark.Timer``
    times by default (``num_threads=1``).  With several threads on a busy machine every parallel region
    waits at OpenMP's barrier for a descheduled thread, and the scheduler, not the step, sets the reading:
    the demo GPT's training step read 0.9-7.8 s of wall time on 2 threads at load 14, against 17-25 ms of
    CPU time on one (issue 18 item 4; its Planner showed +10.9% and +53.5% for one plan).  Accelerators
    are timed by device events: nothing changes."""
    threads = torch.get_num_threads()
    if is_accelerator(device) or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.cache
def empty_window(clock: Callable[[], float]) -> float:
    """Seconds `clock` reads between two back-to-back calls (median of 101), which `timed` takes off each
    reading: the process clock is a system call, 0.61 us inside the window on this project's VM against
    0.07 us for the wall clock, as long as a small op's whole run (1.6 us for a 64 x 64 add)."""
    readings = []
    for _ in range(101):
        t0 = clock()
        readings.append(clock() - t0)
    return statistics.median(readings)


def timed(fn: Callable[[], Any], device: torch.device | str) -> tuple[float, Any]:
    """Seconds `fn()` takes on `device` and its result: device events around the launch on an
    accelerator (the kernels run asynchronously), `host_clock` on the CPU."""
    if not is_accelerator(device):
        clock = host_clock()
        floor = empty_window(clock)
        t0 = clock()
        out = fn()
        return max(0.0, clock() - t0 - floor), out
    dev = torch.device(torch.device(device).type, index(device))
    start, end = torch.Event(dev, enable_timing=True), torch.Event(dev, enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3, out


T = TypeVar("T")


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside, what was pending collected first: a young collection
    triggered inside a timed step would be charged to whichever step allocated the 700th object (the
    exported step leaves 7 cyclic objects of torch's pytree per call), an old one costs tens of ms."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def alternating_pairs(first: Callable[[], T], second: Callable[[], T],
                      keep_going: Callable[[int], bool]) -> tuple[list[T], list[T]]:
    """The results of `first()` and `second()` (each a timing of one step) called in pairs while
    ``keep_going(pairs so far)``, their order swapped every pair (first second, second first, ...) and
    cyclic garbage collection paused (`collection_paused`).

    Why swapped: on a shared 2-vCPU VM the median ratio of back-to-back pairs of the same 900 sub-ms steps
    (the example MLP, eager and exported) read 1.87 paired as (exported, eager) and 1.44 paired as
    (eager, exported), the following step's CPU time depending on the one before (issue 22, exec24);
    the profile paired one way and the benchmark the other.  Alternating the order gives both the same
    share of either position."""
    a: list[T] = []
    b: list[T] = []
    with collection_paused():
        while keep_going(len(a)):
            if len(a) % 2 == 0:
                a.append(first())
                b.append(second())
            else:
                b.append(second())
                a.append(first())
    return a, b


def memory_info(device: torch.device | str) -> tuple[int, int]:
    """(free, total) device bytes as the driver / runtime reports them."""
    free, total = torch.accelerator.get_memory_info(index(device))
    return int(free), int(total)


def available_bytes(device: torch.device | str) -> int:
    """Bytes a step could still allocate: the device's free memory plus what the caching allocator
    holds reserved but unused (it reuses those blocks first)."""
    i = index(device)
    free, _ = memory_info(device)
    return int(free + torch.accelerator.memory_reserved(i) - torch.accelerator.memory_allocated(i))


def as_list(device: torch.device | str) -> list[torch.device]:
    """`device` as the accelerator list `fork_rng` and the RNG state functions take (empty for the CPU)."""
    dev = torch.device(device)
    return [torch.device(dev.type, index(dev))] if is_accelerator(dev) else []


def devices_of(tensors: Iterable[Any]) -> list[torch.device]:
    """The distinct accelerator devices `tensors` live on, in first-seen order."""
    found: dict[torch.device, None] = {}
    # each distinct device checked once: the exported module asks this of every parameter each step
    for d in dict.fromkeys(t.device for t in tensors if isinstance(t, torch.Tensor)):
        if is_accelerator(d):
            found.setdefault(torch.device(d.type, index(d)))
    return list(found)


def fork_rng(devices: list[torch.device]) -> contextlib.AbstractContextManager[Any]:
    """``torch.random.fork_rng`` over the CPU generator and those of accelerator `devices`, so a
    measuring run or a replay leaves the user's random streams where they were."""
    if not devices:
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[index(d) for d in devices], device_type=devices[0].type)


def get_rng_state(devices: list[torch.device]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The CPU generator state and those of accelerator `devices` (to replay a random op on recompute:
    a dropout on the GPU draws from the GPU's generator)."""
    return torch.get_rng_state(), [torch.get_device_module(d.type).get_rng_state(index(d)) for d in devices]


def set_rng_state(devices: list[torch.device], state: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    cpu, states = state
    torch.set_rng_state(cpu)
    for d, s in zip(devices, states, strict=True):
        torch.get_device_module(d.type).set_rng_state(s, index(d))


#: device types whose ``torch.autocast`` state `autocast_off` clears (those torch.autocast accepts)
AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "hpu", "mps")


def autocast_regions() -> tuple[tuple[str, torch.dtype], ...]:
    """(device type, dtype) of each ``torch.autocast`` region the caller runs inside."""
    return tuple((t, torch.get_autocast_dtype(t)) for t in AUTOCAST_DEVICE_TYPES
                 if torch.amp.is_autocast_available(t) and torch.is_autocast_enabled(t))


def autocast_json(regions: tuple[tuple[str, torch.dtype], ...]) -> list[list[str]]:
    """`regions` as a plan file holds them (``graph.meta.autocast``): [device type, dtype name] pairs."""
    return [[device_type, str(dtype).removeprefix("torch.")] for device_type, dtype in regions]


def autocast_from_json(pairs: Any) -> tuple[tuple[str, torch.dtype], ...] | None:
    """The regions of a plan file's ``graph.meta.autocast`` (`autocast_json`); None where the file has none
    (written before ``memviz.plan/3``, which did not record them).  The schema allows only autocast's
    device types and floating dtypes, so ``getattr(torch, name)`` names a dtype."""
    if pairs is None:
        return None
    return tuple((str(device_type), getattr(torch, str(name))) for device_type, name in pairs)


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Every ``torch.autocast`` region the caller is in, switched off for the block: a captured graph
    already holds the casts autocast made when it was traced, and run again under autocast its ops would
    be cast a second time (a matmul the model keeps in float32 under ``autocast(enabled=False)``, GPT-2's
    attention scores, run in bfloat16)."""
    with contextlib.ExitStack() as stack:
        for device_type, _ in autocast_regions():
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


@contextlib.contextmanager
def autocast_as(regions: tuple[tuple[str, torch.dtype], ...] | None, *, cache: bool = True) -> Iterator[None]:
    """The block inside fresh ``torch.autocast`` `regions` (`autocast_regions` of a profiled step) and
    outside the caller's own, so a step runs as it was profiled wherever it is called from: each in a
    region of its own, whose cache of down-cast parameters goes when it exits (a cache outliving an
    optimizer's update would serve stale casts).  None: the caller's state, as it is.  `cache`:
    autocast's cache of down-cast leaves (``cache_enabled``), off for a chunked inference step
    (`chunking.ChunkedModule`)."""
    if regions is None:
        yield
        return
    # inside the caller's region ours are nested, and its cache (autocast clears it only when the outermost
    # region exits) would serve casts made before this step: cleared before and after it
    torch.clear_autocast_cache()
    try:
        with autocast_off(), contextlib.ExitStack() as stack:
            for device_type, dtype in regions:
                stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=cache))
            yield
    finally:
        torch.clear_autocast_cache()
