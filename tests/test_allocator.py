"""The caching-allocator model on hand-made sequences whose outcome follows from PyTorch's rules."""

from __future__ import annotations

import pytest

from solvers import GraphBuilder, compute, eager_schedule, free, simulate
from solvers.allocator import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    round_size,
    segment_size,
    simulate_caching_allocator,
)

KiB, MiB = 1024, 2**20


def test_rounding_and_segment_sizes() -> None:
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(round_size(1000)) == SMALL_BUFFER
    assert segment_size(MiB) == SMALL_BUFFER  # 1 MiB is still small
    assert segment_size(MiB + 512) == LARGE_BUFFER  # large but under 10 MiB: a 20 MiB segment
    assert segment_size(11 * MiB) == 12 * MiB  # 10 MiB and more: rounded up to 2 MiB


def test_small_blocks_share_a_segment_and_best_fit_reuses_the_tightest_hole() -> None:
    a = CachingAllocator()
    x, y = a.malloc(1000), a.malloc(3000)
    assert (a.placement(x)[2], a.placement(y)[2]) == (0, 1024)
    assert a.reserved == SMALL_BUFFER and a.allocated == 1024 + 3072
    a.free(x)  # a 1 KiB hole at 0 before y; the segment's tail is much larger
    z = a.malloc(512)
    assert a.placement(z)[2] == 0  # best fit picks the 1 KiB hole, split into 512 + 512
    assert z.size == 512 and a.reserved == SMALL_BUFFER


def test_coalescing_merges_neighbours() -> None:
    a = CachingAllocator()
    x, y, _ = a.malloc(KiB), a.malloc(KiB), a.malloc(KiB)
    a.free(x)
    a.free(y)
    w = a.malloc(2 * KiB)  # fits only in the merged 2 KiB block at 0 (best fit over the large tail)
    assert a.placement(w)[2] == 0 and w.size == 2 * KiB


def test_large_blocks_split_only_above_1mib() -> None:
    a = CachingAllocator()
    x = a.malloc(11 * MiB)  # own 12 MiB segment; 1 MiB left is not > 1 MiB: not split
    assert x.size == 12 * MiB and a.reserved == 12 * MiB and a.allocated == 12 * MiB
    y = a.malloc(5 * MiB)  # 20 MiB segment, split: 15 MiB stays cached
    assert y.size == 5 * MiB and a.reserved == 32 * MiB
    z = a.malloc(12 * MiB)  # best fit: the 15 MiB remainder, no new segment
    assert a.reserved == 32 * MiB and a.placement(z)[:2] == (1, 5 * MiB)


def graph_of(sizes: dict[str, int]):
    b = GraphBuilder("seq")
    ids = {}
    for name, nbytes in sizes.items():
        ids[name] = b.data(name, nbytes)
        b.compute(f"make_{name}", [], [ids[name]])
    return b.build(), ids


def test_fragmentation_from_a_freed_hole_too_small_for_the_next_tensor() -> None:
    g, t = graph_of({"A": 8 * MiB, "B": 8 * MiB, "C": 9 * MiB})
    sched = [compute(0), compute(1), free(t["A"]), compute(2), free(t["B"]), free(t["C"])]
    r = simulate_caching_allocator(g, sched)
    # A and B split one 20 MiB segment (4 MiB left); A's 8 MiB hole cannot hold C: a second segment
    assert r.segments == (LARGE_BUFFER, LARGE_BUFFER)
    assert r.reserved == (20 * MiB, 20 * MiB, 20 * MiB, 40 * MiB, 40 * MiB, 40 * MiB)
    assert r.allocated == (8 * MiB, 16 * MiB, 8 * MiB, 17 * MiB, 9 * MiB, 0)
    assert r.peak_reserved == 40 * MiB and r.peak_allocated == 17 * MiB
    assert r.fragmentation == pytest.approx((40 - 17) / 40)
    placed = {b.data: (b.start, b.end, b.address, b.size) for b in r.blocks}
    assert placed[t["A"]] == (0, 2, 0, 8 * MiB)
    assert placed[t["B"]] == (1, 4, 8 * MiB, 8 * MiB)
    assert placed[t["C"]] == (3, 5, 20 * MiB, 9 * MiB)


def test_workspace_is_allocated_and_released_within_its_step() -> None:
    b = GraphBuilder("ws")
    x = b.data("x", 4 * KiB, "input")
    y = b.data("y", 4 * KiB)
    b.compute("op", [x], [y], temp_bytes=100 * KiB)
    b.outputs = [y]
    g = b.build()
    r = simulate_caching_allocator(g, eager_schedule(g))
    assert r.allocated == (4 * KiB + 4 * KiB + 100 * KiB,)
    assert r.requested == (4 * KiB + 4 * KiB + 100 * KiB,)
    assert r.peak_reserved == SMALL_BUFFER
    assert [blk.compute for blk in r.blocks if blk.data is None] == [0]
    d = r.to_dict()
    assert {blk["data"] for blk in d["blocks"]} == {x, y}
    assert d["reserved_bytes"] == SMALL_BUFFER


def test_allocated_tracks_the_simulator_up_to_rounding() -> None:
    """Requested bytes per step are exactly the simulator's resident bytes."""
    b = GraphBuilder("chain")
    prev = b.data("x", 3000, "input")
    for i in range(6):
        out = b.data(f"t{i}", 1000 * (i + 1) + 7)
        b.compute(f"op{i}", [prev], [out], temp_bytes=512 * i)
        prev = out
    b.outputs = [prev]
    g = b.build()
    sched = eager_schedule(g)
    tl = simulate(g, sched)
    r = simulate_caching_allocator(g, sched)
    assert list(r.requested) == list(tl.step_bytes)
    assert all(a >= q for a, q in zip(r.allocated, r.requested, strict=True))
    assert r.peak_requested == tl.peak_bytes
