"""A simulation of PyTorch's CUDA caching allocator on a schedule: the fragmentation a plan avoids.

Replays the allocations and frees a schedule implies (``c10/cuda/CUDACachingAllocator.cpp``,
native backend, default settings) so every plan can show what PyTorch would reserve without an
address plan (OLLA Sec. 5.4 measures the same fragmentation on real runs: 7.9% / 26.1%).

Modelled:
- request sizes rounded up to a multiple of 512 B (``kMinBlockSize``); 0-byte tensors allocate nothing;
- two pools: small (requests <= 1 MiB) and large;
- a new segment (``cudaMalloc``) when no cached free block fits: 2 MiB for small requests, 20 MiB for
  large requests under 10 MiB, otherwise the request rounded up to 2 MiB (``get_allocation_size``);
- best fit: the smallest cached free block of the pool that holds the request, lowest address on ties;
- splitting: the request takes the front of the block and the rest becomes a free block when it is
  >= 512 B (small pool) or > 1 MiB (large pool); otherwise the whole block is handed out;
- coalescing: a freed block merges with free neighbours of the same segment.

Not modelled: streams and events (one stream), ``empty_cache`` and releasing cached segments on
out-of-memory (memory is unbounded here, so reserved memory never shrinks), the garbage-collection
threshold, ``max_split_size_mb``, ``roundup_power2_divisions``, expandable segments, CUDA graphs
pools, and the addresses the driver really returns (segments are laid out one after another in
creation order for drawing).

Allocation order per step: a compute step allocates its new outputs (in output order), then its
workspace, then frees the workspace; a free step frees the tensor.  Tensors without a producer are
allocated before the first step in id order.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from solvers.ir import Graph
from solvers.schedule import Step

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 << 20  # kSmallSize: largest request served from the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: segment size for the small pool
LARGE_BUFFER = 20 << 20  # kLargeBuffer: segment size for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to this


def round_size(nbytes: int) -> int:
    """``round_size``: the block size a request gets (at least 512 B, a multiple of 512 B)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(rounded: int) -> int:
    """``get_allocation_size``: how much a new segment for this (rounded) request reserves."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


def should_split(rounded: int, block_size: int) -> bool:
    remaining = block_size - rounded
    return remaining >= MIN_BLOCK if rounded <= SMALL_SIZE else remaining > SMALL_SIZE


@dataclass(frozen=True)
class BlockPlacement:
    """One allocation as the allocator served it.  `data` is the data node (None for a compute
    node's workspace, then `compute` names it); alive during steps [start, end)."""

    data: int | None
    compute: int | None
    start: int
    end: int
    segment: int
    segment_offset: int
    address: int  # segment base (segments laid out in creation order) + segment_offset
    size: int  # block size handed out (rounded, possibly the unsplit remainder included)
    requested: int


@dataclass(frozen=True)
class AllocatorResult:
    """Per step (aligned with the schedule): bytes reserved from the device (`reserved`) and held by
    live blocks (`allocated`, block sizes as ``torch.cuda.memory_allocated`` counts them), both at
    their highest during the step; `requested` counts the tensors' own bytes."""

    reserved: tuple[int, ...]
    allocated: tuple[int, ...]
    requested: tuple[int, ...]
    peak_reserved: int
    peak_allocated: int
    peak_requested: int
    segments: tuple[int, ...]  # sizes, in creation order
    blocks: tuple[BlockPlacement, ...] = field(default=())

    @property
    def fragmentation(self) -> float:
        """(peak reserved - peak allocated) / peak reserved, a fraction."""
        if not self.peak_reserved:
            return 0.0
        return (self.peak_reserved - self.peak_allocated) / self.peak_reserved

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's "packing.allocator" member; blocks of data nodes only (the schema names a
        data id per block; workspace blocks still count in reserved and allocated)."""
        return {
            "reserved_bytes": self.peak_reserved,
            "allocated_bytes": self.peak_allocated,
            "requested_bytes": self.peak_requested,
            "fragmentation": self.fragmentation,
            "segments": list(self.segments),
            "reserved": list(self.reserved),
            "allocated": list(self.allocated),
            "blocks": [
                {"data": b.data, "start": b.start, "end": b.end, "offset": b.address, "size": b.size,
                 "segment": b.segment, "segment_offset": b.segment_offset, "requested": b.requested}
                for b in self.blocks
                if b.data is not None
            ],
        }


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


class CachingAllocator:
    """The allocator state machine: `malloc(nbytes)` returns a block, `free(block)` caches it."""

    def __init__(self) -> None:
        self.segments: list[int] = []
        self.bases: list[int] = []
        # free blocks per pool, ordered like PyTorch's BlockComparatorSize: (size, address)
        self._pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._by_key: dict[int, _Block] = {}
        self.reserved = 0
        self.allocated = 0

    def _address(self, b: _Block) -> int:
        return self.bases[b.segment] + b.offset

    def _cache(self, b: _Block) -> None:
        self._by_key[id(b)] = b
        insort(self._pools[b.small], (b.size, self._address(b), id(b)))

    def _uncache(self, b: _Block) -> None:
        pool = self._pools[b.small]
        pool.pop(bisect_left(pool, (b.size, self._address(b), id(b))))
        del self._by_key[id(b)]

    def malloc(self, nbytes: int) -> _Block:
        rounded = round_size(nbytes)
        small = rounded <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect_left(pool, (rounded, -1, -1))
        if i < len(pool):
            block = self._by_key[pool[i][2]]
            self._uncache(block)
        else:  # cudaMalloc a new segment
            size = segment_size(rounded)
            self.bases.append(self.reserved)
            self.segments.append(size)
            self.reserved += size
            block = _Block(len(self.segments) - 1, 0, size, small)
        if should_split(rounded, block.size):
            rest = _Block(block.segment, block.offset + rounded, block.size - rounded, small,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._cache(rest)
        block.free = False
        self.allocated += block.size
        return block

    def free(self, block: _Block) -> None:
        block.free = True
        self.allocated -= block.size
        for other in (block.prev, block.next):  # coalesce with free neighbours in the segment
            if other is not None and other.free:
                self._uncache(other)
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next is not None:
                        block.next.prev = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
        self._cache(block)

    def placement(self, block: _Block) -> tuple[int, int, int]:
        return block.segment, block.offset, self._address(block)


def simulate_caching_allocator(graph: Graph, schedule: Sequence[Step]) -> AllocatorResult:
    """Replay `schedule` through the caching-allocator model (module docstring) and report reserved
    and allocated memory per step, the peaks, fragmentation and where every block went."""
    steps = tuple(schedule)
    alloc = CachingAllocator()
    live: dict[int, tuple[_Block, int, int]] = {}  # data -> (block, start step, requested)
    blocks: list[BlockPlacement] = []
    requested = 0

    def record(data: int | None, compute: int | None, block: _Block, start: int, end: int, req: int) -> None:
        seg, off, addr = alloc.placement(block)
        blocks.append(BlockPlacement(data, compute, start, end, seg, off, addr, block.size, req))

    for d in graph.datas:
        if d.producer is None and d.bytes > 0:
            live[d.id] = (alloc.malloc(d.bytes), 0, d.bytes)
            requested += d.bytes
    reserved_steps, allocated_steps, requested_steps = [], [], []
    peak_alloc = alloc.allocated
    peak_req = requested
    for i, step in enumerate(steps):
        if step.op == "compute":
            comp = graph.computes[step.node]
            for d in comp.outputs:
                nbytes = graph.datas[d].bytes
                if d not in live and nbytes > 0:
                    live[d] = (alloc.malloc(nbytes), i, nbytes)
                    requested += nbytes
            high_alloc, high_req = alloc.allocated, requested
            if comp.temp_bytes > 0:
                work = alloc.malloc(comp.temp_bytes)
                high_alloc, high_req = alloc.allocated, requested + comp.temp_bytes
                record(None, comp.id, work, i, i + 1, comp.temp_bytes)
                alloc.free(work)
        else:
            if step.node in live:
                block, start, nbytes = live.pop(step.node)
                record(step.node, None, block, start, i, nbytes)
                alloc.free(block)
                requested -= nbytes
            high_alloc, high_req = alloc.allocated, requested
        reserved_steps.append(alloc.reserved)
        allocated_steps.append(high_alloc)
        requested_steps.append(high_req)
        peak_alloc = max(peak_alloc, high_alloc)
        peak_req = max(peak_req, high_req)
    for d, (block, start, nbytes) in sorted(live.items()):
        record(d, None, block, start, max(len(steps), start + 1), nbytes)
    return AllocatorResult(
        reserved=tuple(reserved_steps),
        allocated=tuple(allocated_steps),
        requested=tuple(requested_steps),
        peak_reserved=alloc.reserved,
        peak_allocated=peak_alloc,
        peak_requested=peak_req,
        segments=tuple(alloc.segments),
        blocks=tuple(sorted(blocks, key=lambda b: (b.start, b.address))),
    )
