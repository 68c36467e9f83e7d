"""Chen's sqrt(n) segments over the block chain."""

from __future__ import annotations

import pytest
from graphs import chain_of_blocks, training_chain

from solvers import rotor, simulate, sqrt
from solvers.result import InfeasibleBudget
from solvers.sqrt import segments


def test_segments_partition_the_chain():
    for n in range(1, 20):
        for c in range(1, n + 1):
            segs = segments(n, c)
            assert segs[0][0] == 0 and segs[-1][1] == n - 1 and len(segs) == c
            assert all(a[1] + 1 == b[0] for a, b in zip(segs, segs[1:], strict=False))


@pytest.mark.parametrize("g", [training_chain(9), chain_of_blocks(5)], ids=lambda g: g.name)
def test_sqrt_fits_and_is_never_better_than_rotor(g):
    with pytest.raises(InfeasibleBudget) as info:
        sqrt.solve(g, 0)
    low = info.value.minimum_bytes
    tl = simulate(g, sqrt.solve(g, low).schedule).check()
    assert tl.peak_bytes <= low
    for budget in (low, low + low // 4, low * 2):
        s = simulate(g, sqrt.solve(g, budget).schedule).check()
        r = simulate(g, rotor.solve(g, budget).schedule).check()
        assert s.peak_bytes <= budget and r.peak_bytes <= budget
        assert r.total_time <= s.total_time + 1e-9
    assert rotor_min(g) <= low


def rotor_min(g):
    with pytest.raises(InfeasibleBudget) as info:
        rotor.solve(g, 0)
    return info.value.minimum_bytes


def test_sqrt_recomputes_with_checkpoints():
    g = training_chain(9, sizes=[64] * 9)
    full = simulate(g, sqrt.solve(g, 10**9).schedule).check()
    assert full.recomputes == 0  # no recomputation when everything fits
    res = sqrt.solve(g, full.peak_bytes - 1)
    assert res.stats.extra["segments"] == 3
    tl = simulate(g, res.schedule).check()
    assert tl.recomputes > 0 and tl.peak_bytes < full.peak_bytes
