"""Issue 18 item 1: the caching allocator is modelled only on devices that use one (CUDA), and there a plan
fits only if the allocator's reserved peak fits the budget: `memviz.plan` plans against it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from graphs import training_chain

from memviz.hardware.devices import uses_caching_allocator
from memviz.plans.planning import plan
from solvers import eager_schedule, simulate
from solvers.result import InfeasibleBudget

MiB = 2**20


def chain_profile(device: str):
    """A profile on `device`: 11.5 MiB activations take 12 MiB segments (a 0.5 MiB tail is not split)."""
    g = training_chain(12, sizes=[int(11.5 * MiB)] * 12, param_bytes=MiB)
    s = eager_schedule(g)
    return SimpleNamespace(graph=g, baseline_schedule=s, baseline=simulate(g, s).check(), model_name="chain",
                           mode="train", fingerprint="", device=SimpleNamespace(name=device, estimated=True,
                                                                              capacity_bytes=80 * 2**30))


def test_only_cuda_devices_have_a_caching_allocator():
    assert uses_caching_allocator("cuda:0 (NVIDIA H100 80GB HBM3)") and uses_caching_allocator("fake:h100")
    others = ("cpu", "fake:cpu", "fake:trn1", "neuron:0", "unspecified")
    assert not any(uses_caching_allocator(d) for d in others)
    cpu = plan(chain_profile("cpu"), 0.9, frontier=False, time_limit=5)
    assert cpu.packing is not None and "allocator" not in cpu.packing
    assert cpu.reserved_peak_bytes is None and cpu.fits and "reserved" not in cpu.summary()


def test_a_cuda_plan_fits_its_reserved_peak():
    prof = chain_profile("fake:h100")
    eager = prof.baseline.peak_bytes
    # the eager order fits its own peak in live bytes, but the allocator reserves more than that: re-planned
    p = plan(prof, eager, frontier=False, time_limit=5)
    assert p.budget_bytes == eager and p.strategy != "none"
    assert p.peak_bytes < p.reserved_peak_bytes <= eager and p.fits
    assert "reserved by the allocator" in p.summary() and "DOES NOT FIT" not in p.summary()
    tight = plan(prof, 0.8, frontier=False, time_limit=5)
    assert tight.reserved_peak_bytes <= tight.budget_bytes


def test_no_plan_reserving_less_than_the_budget_is_refused():
    # PyTorch's own order cannot be re-planned lower: its 206 MiB reserved against 185.5 MiB is refused
    with pytest.raises(InfeasibleBudget, match="caching allocator reserves 206.00 MiB"):
        plan(chain_profile("fake:h100"), 1.0, frontier=False, strategy="none")
