"""The accelerator path (CUDA, TorchNeuron) without hardware: `torch.accelerator` replaced by a fake
caching allocator, and a fake ``torch_neuronx`` package for device resolution.  What runs on a real
device is the same code; these tests pin the arithmetic and the dispatch."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from memviz.hardware import accelerator
from memviz.hardware.devices import (
    DeviceInfo,
    DeviceUnavailable,
    available_memory,
    estimated_on,
    resolve_device,
)
from memviz.profiling.tracker import measure_peak


class FakeAllocator:
    """Allocated / peak / reserved counters of one device, as torch.accelerator reports them."""

    def __init__(self) -> None:
        self.allocated, self.peak, self.reserved, self.syncs = 100, 100, 1000, 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        acc = torch.accelerator
        monkeypatch.setattr(acc, "current_device_index", lambda: 0)
        monkeypatch.setattr(acc, "synchronize", lambda i=None: setattr(self, "syncs", self.syncs + 1))
        monkeypatch.setattr(acc, "memory_allocated", lambda i=None: self.allocated)
        monkeypatch.setattr(acc, "max_memory_allocated", lambda i=None: self.peak)
        monkeypatch.setattr(acc, "memory_reserved", lambda i=None: self.reserved)
        reset = lambda i=None: setattr(self, "peak", self.allocated)  # noqa: E731
        monkeypatch.setattr(acc, "reset_peak_memory_stats", reset)
        monkeypatch.setattr(acc, "get_memory_info", lambda i=None: (5000, 8000))


def test_workspace_is_the_peak_beyond_what_stays_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAllocator()
    fake.install(monkeypatch)

    def kernel() -> str:
        fake.alloc(300)  # scratch space
        fake.alloc(-300)
        fake.alloc(50)  # the output, still held when the kernel returns
        return "out"

    assert accelerator.workspace_bytes(kernel, "cuda") == 250  # peak 400 - before 100 - kept 50
    fake.allocated = 100
    assert accelerator.workspace_bytes(lambda: fake.alloc(50) or "out", "cuda") == 0
    assert fake.syncs >= 4  # every read waits for the queued kernels


def test_measure_peak_reads_the_allocator_on_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAllocator()
    fake.install(monkeypatch)
    fake.peak = 10**9  # an earlier peak must not count: reset before the step

    def step() -> int:
        fake.alloc(700)
        fake.alloc(-700)
        return 7

    assert measure_peak(step, device="cuda:0") == (800, 7)


def test_available_memory_counts_reserved_but_unused_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAllocator()
    fake.install(monkeypatch)
    info = SimpleNamespace(estimated=False, torch_device=torch.device("cuda", 0))
    assert available_memory(info) == 5000 + 1000 - 100


def test_rng_devices_are_those_of_the_tensors() -> None:
    assert accelerator.devices_of([torch.ones(1), torch.empty(2, device="meta"), None, 3]) == []
    assert accelerator.as_list("cpu") == []
    with accelerator.fork_rng([]):
        torch.rand(3)  # the CPU stream moves inside only
    before = torch.get_rng_state()
    with accelerator.fork_rng([]):
        torch.rand(3)
    assert torch.equal(before, torch.get_rng_state())
    state = accelerator.get_rng_state([])
    a = torch.rand(4)
    accelerator.set_rng_state([], state)
    assert torch.equal(a, torch.rand(4))


def test_neuron_device_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = torch.nn.Linear(2, 2), (torch.ones(1, 2),)
    with pytest.raises(DeviceUnavailable, match="needs torch-xla"):
        resolve_device("xla", model, args)
    # torch_neuronx importable but no Neuron device visible: a clear error, not a CPU profile.
    monkeypatch.setitem(sys.modules, "torch_neuronx", SimpleNamespace(__spec__=object()))
    found = lambda name, *a: object() if name == "torch_neuronx" else None  # noqa: E731
    monkeypatch.setattr("importlib.util.find_spec", found)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a: None)
    with pytest.raises(DeviceUnavailable, match="sees no neuron device"):
        resolve_device("neuron", model, args)


def test_a_neuron_profile_too_big_is_estimated_for_trainium2() -> None:
    info = DeviceInfo("neuron:0", False, 96 << 30, SimpleNamespace(type="neuron"))  # no such device here
    estimate = estimated_on(info)
    assert estimate.estimated and estimate.target.name == "trn2" and estimate.capacity_bytes == 96 << 30


@pytest.fixture
def threads() -> object:
    """Restores torch's intra-op thread count and any clock a test pinned."""
    before, clock = torch.get_num_threads(), accelerator.cpu_clock
    yield
    torch.set_num_threads(before)
    accelerator.cpu_clock = clock


def test_a_one_thread_cpu_step_is_timed_on_this_process_cpu_time(threads: object) -> None:
    """With one intra-op thread the CPU step is this thread's work: time spent off the CPU (a sleep here,
    other processes' turns on a loaded machine) is not the step's cost, so the profile's op times and
    fixed costs leave it out (issue 22 item 2 / exec23).  The wall clock would read at least the sleep."""
    import time

    accelerator.cpu_clock = None
    torch.set_num_threads(1)
    assert accelerator.host_clock() is time.process_time
    seconds, out = accelerator.timed(lambda: time.sleep(0.05) or "out", "cpu")
    assert out == "out" and seconds < 0.025


def test_a_multithreaded_cpu_step_is_timed_on_the_wall_clock(threads: object) -> None:
    """Several intra-op threads: process CPU time would sum the workers', so the wall clock stays; a
    clock the caller pins wins either way."""
    import time

    accelerator.cpu_clock = None
    torch.set_num_threads(2)
    assert accelerator.host_clock() is time.perf_counter
    assert accelerator.timed(lambda: time.sleep(0.02), "cpu")[0] >= 0.02
    accelerator.cpu_clock = time.process_time
    assert accelerator.host_clock() is time.process_time


def test_cpu_timings_take_off_what_the_clock_reads_for_itself(threads: object) -> None:
    """A clock that advances 5 units on every read (the process clock's system call: 0.6 us per reading on
    the project's VM) times nothing as 0 and a 10-unit call as 10, not 15."""
    now = [0.0]

    def clock() -> float:
        now[0] += 5.0
        return now[0]

    def work() -> str:
        now[0] += 10.0
        return "out"

    accelerator.cpu_clock = clock
    assert accelerator.timed(lambda: None, "cpu")[0] == 0.0
    assert accelerator.timed(work, "cpu") == (10.0, "out")


def test_alternating_pairs_swap_the_order_every_pair_with_collection_paused() -> None:
    """Step pairs are timed in alternating order (a b, b a, a b, ...): the order alone moved the
    example MLP's median ratio from 1.44 to 1.87 on the same 900 steps (exec24), and the profile paired
    one way while bench_export paired the other.  No cyclic collection runs inside (pending garbage is
    collected before), and collection is on again after, off if it was off."""
    import gc

    calls: list[tuple[str, bool]] = []

    def run(name: str) -> str:
        calls.append((name, gc.isenabled()))
        return name

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    assert gc.isenabled()
    Cycle()  # garbage only a collection frees
    a, b = accelerator.alternating_pairs(lambda: run("a"), lambda: run("b"), lambda n: n < 4)
    assert (a, b) == (["a"] * 4, ["b"] * 4)
    assert [c for c, _ in calls] == list("abbaabba")
    assert not any(enabled for _, enabled in calls) and gc.isenabled()
    assert not any(isinstance(o, Cycle) for o in gc.get_objects())
    gc.disable()
    try:
        accelerator.alternating_pairs(lambda: run("a"), lambda: run("b"), lambda n: n < 1)
        assert not gc.isenabled()
    finally:
        gc.enable()
