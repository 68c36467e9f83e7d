"""Issue 18 item 1: the caching allocator is modelled only on devices that use one (CUDA), and there a plan
fits only if the allocator's reserved peak fits the budget: `memviz.plan` plans against it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from graphs import training_chain

from memviz.hardware.devices import uses_caching_allocator
from memviz.plans.planning import RESERVED_TRIES, fit_reserved, plan
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


@dataclasses.dataclass
class Solved:
    """What `fit_reserved` reads of a plan: its live peak, its simulated reserved peak and its budget."""

    peak_bytes: int
    reserved_peak_bytes: int
    budget_bytes: int | None = None
    strategy: str = "rockmate"
    frontier: object = None
    frontier_points: object = None


def test_the_reserved_search_steps_past_a_reserve_that_does_not_shrink_with_the_budget():
    # planning budgets from 850 up give one schedule (848 live bytes) whose reserve is 4 bytes over the
    # budget; under 850 the schedules keep 30 bytes cached: stepping down by the 4-byte excess crawled
    # through the one schedule until the tries ran out
    def solve(at: int) -> Solved:
        solves.append(at)
        live = 848 if at >= 850 else at * 98 // 100
        return Solved(live, live + (156 if at >= 850 else 30), at)

    solves: list[int] = []
    chosen = fit_reserved(solve(1000), solve)
    assert chosen.reserved_peak_bytes <= 1000 and chosen.budget_bytes == 1000
    assert len(solves) <= 1 + RESERVED_TRIES
    # the highest planning budget tried that fits is kept (a larger one recomputes less)
    assert chosen.peak_bytes == max(at * 98 // 100 for at in solves if at < 850)


def test_the_reserved_search_goes_down_to_the_smallest_schedule():
    # no schedule under 400 live bytes; only the smallest ones (<= 420) leave the allocator little to cache
    def solve(at: int, small_reserve: int = 10) -> Solved:
        if at < 400:
            raise InfeasibleBudget(at, 400, "rockmate")
        return Solved(at, at + (small_reserve if at <= 420 else 700), at)

    chosen = fit_reserved(Solved(990, 1690, 1000), solve)
    assert chosen.reserved_peak_bytes <= 1000 and chosen.peak_bytes <= 420
    with pytest.raises(InfeasibleBudget, match="6 solves, down to 400 B"):
        fit_reserved(Solved(990, 1690, 1000), lambda at: solve(at, small_reserve=700))


def test_a_sac_plan_fits_its_reserved_peak_too() -> None:
    """`memviz.apply`'s step runs through the caching allocator as an export does: a sac plan on a CUDA
    device carries its reserved peak and is fitted to it (on an H200, sac plans within their budget by
    live bytes ran out of memory with the allocator capped at the budget: bench_cuda's capped steps)."""
    from examples.models import gpt
    from memviz.plans.sac import plan_sac
    from memviz.profiling.profile import profile

    model, args = gpt(batch=4, seq=256, d=128, heads=4, layers=4, vocab=512)
    prof = profile(model, args, device="fake:h100")
    first = plan_sac(prof, 0.75, time_limit=20.0)  # the live-bytes plan alone reserves more
    assert first.reserved_peak_bytes > first.budget_bytes >= first.peak_bytes
    fitted = plan(prof, 0.75, strategy="sac", time_limit=20.0)
    assert fitted.strategy == "sac" and fitted.budget_bytes == first.budget_bytes
    assert fitted.reserved_peak_bytes <= fitted.budget_bytes and fitted.peak_bytes < first.peak_bytes
