"""Estimated time of a collective (all-gather, reduce-scatter, all-reduce ...) on a named target: the
alpha-beta model (Hockney, "The communication challenge for MPP", Parallel Computing 1994) with the
ring / tree algorithm factors of Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005, Sec. 4, in NCCL's bus-bandwidth convention
(NVIDIA nccl-tests, doc/PERFORMANCE.md).  For a group of ``n`` ranks and ``S`` bytes (the full,
unsharded tensor: an all-gather's output, a reduce-scatter's input, an all-reduce's tensor):

===================  =====================  ==========================  ================================
collective           ring steps             bytes each rank sends       time
===================  =====================  ==========================  ================================
all-gather           n - 1                  S (n - 1) / n               base + (n-1) a + S (n-1)/n / B
reduce-scatter       n - 1                  S (n - 1) / n               base + (n-1) a + S (n-1)/n / B
all-reduce (ring)    2 (n - 1)              2 S (n - 1) / n             base + 2(n-1) a + 2S (n-1)/n / B
all-reduce (tree)    2 ceil(log2 n)         2 S                         base + 2 ceil(log2 n) a + 2S / B
all-to-all           n - 1                  S (n - 1) / n               base + (n-1) a + S (n-1)/n / B
broadcast            n - 1 (pipelined)      S                           base + (n-1) a + S / B
===================  =====================  ==========================  ================================

An all-reduce takes the faster of ring and tree (NCCL's tuner picks between them the same way; its
double binary tree reaches the ring's bandwidth only asymptotically, so the tree here is the
pessimistic ``2S / B``).  ``a`` (alpha) is the latency of one ring step and ``B`` (1 / beta) the
per-rank, one-direction bandwidth of the slowest link the group crosses: a group whose ranks sit on
more than one node (``ranks_per_node`` consecutive global ranks per node, the launch order of torchrun
and of a DeviceMesh whose innermost dimension is tensor parallelism) runs its ring over the network.
A group of one rank takes no time.

Constants per target (one rank = one GPU / accelerator chip; GB = 1e9 bytes):

============  ===============  =================  ===============  ============  ==========================
target        intra-node B     inter-node B       ranks per node   alpha intra   alpha inter (base 8.4 us)
============  ===============  =================  ===============  ============  ==========================
h100, h200    450 GB/s [1]     50 GB/s [2]        8 [2]            3.4 us [6]    14 us [6]
a100 (both)   300 GB/s [3]     25 GB/s [4]        8 [4]            3.4 us [6]    14 us [6]
v100          150 GB/s [5]     6.25 GB/s [5]      8 [5]            3.4 us [6]    14 us [6]
trn1          96 GB/s [7]*     6.25 GB/s [7]      16 [7]           3.4 us*       14 us*
trn2          320 GB/s [8]*    25 GB/s [8]        16 [8]           3.4 us*       14 us*
inf2          48 GB/s [9]*     12 chips, none     12 [9]           3.4 us*       (one node)
cpu           1.25 GB/s*       1.25 GB/s*         1                30 us*        30 us*
============  ===============  =================  ===============  ============  ==========================

[1] NVIDIA H100 / H200 data sheets: NVLink 4, 900 GB/s per GPU (both directions), so 450 GB/s each way.
[2] NVIDIA DGX H100 user guide: 8 GPUs, 8 ConnectX-7 400 Gb/s InfiniBand ports (one 50 GB/s port per GPU).
[3] NVIDIA A100 data sheet: NVLink 3, 600 GB/s per GPU (both directions).
[4] NVIDIA DGX A100 user guide: 8 GPUs, 8 ConnectX-6 200 Gb/s HDR ports (25 GB/s per GPU).
[5] NVIDIA V100 data sheet: NVLink 2, 300 GB/s per GPU (both directions); DGX-1: 8 GPUs, 4 EDR 100 Gb/s
    ports (6.25 GB/s per GPU).
[6] NCCL src/graph/tuning.cc: ring / Simple protocol, ``baseLat`` 8.4 us, ``hwLat`` per step 3.4 us over
    NVLink and 14 us over the network.
[7] AWS Neuron docs, Trn1/Trn1n architecture: 16 Trainium chips per trn1.32xlarge, 800 Gb/s EFA per
    instance (6.25 GB/s per chip); NKI architecture guide: 4 NeuronLink-v2 links per Trainium chip.
[8] AWS Neuron docs, Trainium2 architecture: 16 chips per trn2.48xlarge, 3.2 Tb/s EFA per instance
    (25 GB/s per chip), 4 NeuronLink-v3 links per chip.
[9] AWS Neuron docs, Inf2 architecture: up to 12 Inferentia2 chips per inf2.48xlarge, 2 NeuronLink-v2
    links per chip.
``*`` assumed, not published: AWS gives NeuronLink link counts, not a per-chip bandwidth (the figures
above assume 24 GB/s per NeuronLink-v2 link and 80 GB/s per v3 link, one direction), and no collective
latencies for Neuron; memviz uses NCCL's.  ``cpu`` is gloo over 10 Gb/s Ethernet between single-socket
hosts, a rough placeholder.  Every estimate built on these is labelled estimated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solvers import Graph
from solvers.schedule import Schedule

__all__ = ["COLLECTIVES", "INTERCONNECTS", "Interconnect", "Link", "collective_kind", "collective_seconds",
           "collective_time", "link_of", "overlapped_time"]

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class Link:
    """One kind of link a ring runs over: per-rank one-direction bandwidth (B/s), latency of one step (s)."""

    bandwidth: float
    step_latency: float


@dataclass(frozen=True)
class Interconnect:
    """How a target's ranks talk: inside a node (`intra`), between nodes (`inter`), `ranks_per_node`
    consecutive global ranks per node, and a fixed launch latency per collective (`base_latency`, s)."""

    intra: Link
    inter: Link
    ranks_per_node: int
    base_latency: float = 8.4 * US


_NVLINK_STEP, _NET_STEP = 3.4 * US, 14.0 * US
_HOPPER = Interconnect(Link(450 * GB, _NVLINK_STEP), Link(50 * GB, _NET_STEP), 8)
_AMPERE = Interconnect(Link(300 * GB, _NVLINK_STEP), Link(25 * GB, _NET_STEP), 8)

#: per named target of `memviz.hardware.devices.TARGETS` (module docstring: values and sources)
INTERCONNECTS: dict[str, Interconnect] = {
    "h100": _HOPPER,
    "h200": _HOPPER,
    "a100-40gb": _AMPERE,
    "a100-80gb": _AMPERE,
    "a100": _AMPERE,
    "v100-16gb": Interconnect(Link(150 * GB, _NVLINK_STEP), Link(6.25 * GB, _NET_STEP), 8),
    "v100": Interconnect(Link(150 * GB, _NVLINK_STEP), Link(6.25 * GB, _NET_STEP), 8),
    "trn1": Interconnect(Link(96 * GB, _NVLINK_STEP), Link(6.25 * GB, _NET_STEP), 16),
    "trn2": Interconnect(Link(320 * GB, _NVLINK_STEP), Link(25 * GB, _NET_STEP), 16),
    "inf2": Interconnect(Link(48 * GB, _NVLINK_STEP), Link(48 * GB, _NVLINK_STEP), 12),
    "cpu": Interconnect(Link(1.25 * GB, 30 * US), Link(1.25 * GB, 30 * US), 1, base_latency=30 * US),
}

#: operator names (c10d's process-group ops, DTensor's functional collectives) -> collective
COLLECTIVES: dict[str, str] = {
    **dict.fromkeys(("allgather_", "_allgather_base_", "allgather_coalesced_",
                     "allgather_into_tensor_coalesced_", "all_gather_into_tensor",
                     "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out"), "all_gather"),
    **dict.fromkeys(("reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_",
                     "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"), "reduce_scatter"),
    **dict.fromkeys(("allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_",
                     "all_reduce_coalesced", "all_reduce_coalesced_"), "all_reduce"),
    **dict.fromkeys(("alltoall_", "alltoall_base_", "all_to_all_single"), "all_to_all"),
    **dict.fromkeys(("broadcast_", "broadcast"), "broadcast"),
}
#: the namespaces of the operators above
_NAMESPACES = ("c10d", "_c10d_functional")


def collective_kind(op: str) -> str | None:
    """The collective an operator runs (``"all_gather"`` ...), from its name as a recorded CD-graph stores
    it (``str(func)``: ``c10d._allgather_base_.default``, ``_c10d_functional.all_reduce.default``); None
    for any other operator (a wait, a barrier, a computation)."""
    namespace, _, name = op.partition(".")
    if namespace not in _NAMESPACES:
        return None
    return COLLECTIVES.get(name.split(".")[0])


def link_of(interconnect: Interconnect, ranks: list[int]) -> Link:
    """The link a group's ring is bound by: the network when its global `ranks` span more than one node."""
    nodes = {r // interconnect.ranks_per_node for r in ranks}
    return interconnect.inter if len(nodes) > 1 else interconnect.intra


def collective_seconds(kind: str, nbytes: int, group_size: int, link: Link, base_latency: float) -> float:
    """Alpha-beta time of collective `kind` over `group_size` ranks on `link`, `nbytes` the full tensor
    (module docstring: the table of steps and factors)."""
    n = group_size
    if n <= 1:
        return 0.0
    part = (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        steps, sent = n - 1, nbytes * part
    elif kind == "broadcast":
        steps, sent = n - 1, float(nbytes)
    elif kind == "all_reduce":
        ring = 2 * (n - 1) * link.step_latency + 2 * nbytes * part / link.bandwidth
        tree = 2 * math.ceil(math.log2(n)) * link.step_latency + 2 * nbytes / link.bandwidth
        return base_latency + min(ring, tree)
    else:
        raise ValueError(f"unknown collective {kind!r}; known: {sorted(set(COLLECTIVES.values()))}")
    return base_latency + steps * link.step_latency + sent / link.bandwidth


def overlapped_time(step_seconds: float, collective_seconds: float) -> float:
    """The step time if every collective ran beside compute instead of in order: the longer of the two
    streams.  A predicted step time sums each operator and collective in the order the step ran them, as if
    none overlapped (an upper bound); FSDP2 prefetches its all-gathers and reduce-scatters during the
    backward, while tensor parallelism's all-reduces sit between the operators that need them, so a real
    step lies between the two."""
    return max(step_seconds - collective_seconds, collective_seconds)


def collective_time(graph: Graph, schedule: Schedule) -> float:
    """Seconds the collectives of `schedule` take (each run counted, a recomputation's re-gather too): the
    part of the step's predicted time that is communication (estimated, or measured on a real group)."""
    return sum(graph.computes[s.node].time for s in schedule
               if s.op == "compute" and collective_kind(graph.computes[s.node].op))
