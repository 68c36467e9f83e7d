"""`memviz.hardware.collectives`: the alpha-beta cost of collectives, and the estimated per-rank profile's
collective nodes carrying it (issue 20 item 1: the TP/SP/FSDP collectives are compute nodes with estimated
time)."""

from __future__ import annotations

import math

import pytest
import torch
from distributed_worker import MODELS, loss_of

import memviz
from memviz.hardware.collectives import (
    INTERCONNECTS,
    Link,
    collective_kind,
    collective_seconds,
    collective_time,
)
from memviz.hardware.devices import TARGETS
from memviz.parallel.distributed import Parallel

H100 = INTERCONNECTS["h100"]


def test_every_named_target_has_an_interconnect() -> None:
    assert set(TARGETS) <= set(INTERCONNECTS)


def test_ring_factors_latency_and_bandwidth() -> None:
    link = Link(bandwidth=100.0, step_latency=1.0)
    # all-gather / reduce-scatter: (n-1) steps, (n-1)/n of the full tensor through each rank
    assert collective_seconds("all_gather", 800, 4, link, 10.0) == pytest.approx(10 + 3 + 800 * 3 / 4 / 100)
    assert collective_seconds("reduce_scatter", 800, 8, link, 0.0) == pytest.approx(7 + 800 * 7 / 8 / 100)
    # all-reduce: ring 2(n-1) steps and 2(n-1)/n, or tree 2 ceil(log2 n) steps and 2 S, the faster
    ring = 2 * 3 + 2 * 800 * 3 / 4 / 100
    tree = 2 * 2 + 2 * 800 / 100
    assert collective_seconds("all_reduce", 800, 4, link, 0.0) == pytest.approx(min(ring, tree))
    many = 2 * math.ceil(math.log2(64)) + 2 * 8 / 100  # tiny message, many ranks: the tree's latency wins
    assert collective_seconds("all_reduce", 8, 64, link, 0.0) == pytest.approx(many)
    assert collective_seconds("all_gather", 10**9, 1, link, 5.0) == 0.0  # one rank: nothing to send


def test_operator_names() -> None:
    assert collective_kind("c10d._allgather_base_.default") == "all_gather"
    assert collective_kind("_c10d_functional.reduce_scatter_tensor.default") == "reduce_scatter"
    assert collective_kind("_c10d_functional.all_reduce.default") == "all_reduce"
    assert collective_kind("_c10d_functional.wait_tensor.default") is None
    assert collective_kind("aten.all_gather.default") is None  # not a c10d namespace
    assert collective_kind("aten.mm.default") is None


def _profile(parallel: Parallel, **gpt: int) -> memviz.Profile:
    model, args = MODELS["gpt"](**gpt)
    return memviz.profile(model, args, optimizer=torch.optim.AdamW, loss_fn=loss_of, parallel=parallel,
                          device="fake:h100")


def _collectives(prof: memviz.Profile) -> list[tuple[str, str, int, float]]:
    """(kind, op, full bytes, seconds) per collective node; full bytes: its largest input or output."""
    g = prof.graph
    out = []
    for c in g.computes:
        kind = collective_kind(c.op)
        if kind is not None:
            full = max(g.datas[d].bytes for d in (*c.inputs, *c.outputs))
            out.append((kind, c.op, full, c.time))
    return out


def _expected(kind: str, full: int, n: int, inter: bool = False) -> float:
    return collective_seconds(kind, full, n, H100.inter if inter else H100.intra, H100.base_latency)


@pytest.fixture(scope="module")
def fsdp_tp_profiles() -> dict[tuple[int, int], memviz.Profile]:
    return {(w, tp): _profile(Parallel(w, tp=tp, sp=tp > 1)) for w, tp in ((2, 1), (4, 1), (16, 2))}


def test_estimated_collectives_take_the_formulas_time(fsdp_tp_profiles) -> None:
    """Every FSDP2 all-gather / reduce-scatter (c10d, over the dp ranks) and every TP/SP collective
    (_c10d_functional, over the tp ranks) of a fake-mode rank has the alpha-beta time of its bytes and
    group: within a node over NVLink; FSDP over 8 ranks of stride 2 in 16 spans two nodes (InfiniBand)."""
    for (world, tp), prof in fsdp_tp_profiles.items():
        nodes = _collectives(prof)
        kinds = {k for k, *_ in nodes}
        assert {"all_gather", "reduce_scatter"} <= kinds
        assert collective_time(prof.graph, prof.baseline_schedule) > 0
        for kind, op, full, seconds in nodes:
            fsdp = op.startswith("c10d.")
            n = world // tp if fsdp else tp
            assert seconds > 0
            assert seconds == pytest.approx(_expected(kind, full, n, inter=fsdp and world // tp * tp > 8)), op


def test_collective_time_scales_with_world_size_and_bytes(fsdp_tp_profiles) -> None:
    """The same model's FSDP2 all-gathers on 4 ranks against 2: more ring steps and (n-1)/n of the bytes
    (3/4 against 1/2); a model with twice the width all-gathers more bytes in more time."""
    two = [x for x in _collectives(fsdp_tp_profiles[(2, 1)]) if x[0] == "all_gather"]
    four = [x for x in _collectives(fsdp_tp_profiles[(4, 1)]) if x[0] == "all_gather"]
    assert len(two) == len(four)
    for (_, _, s2, t2), (_, _, s4, t4) in zip(two, four, strict=True):
        link, base = H100.intra, H100.base_latency
        assert t2 == pytest.approx(base + link.step_latency + s2 / 2 / link.bandwidth)
        assert t4 == pytest.approx(base + 3 * link.step_latency + s4 * 3 / 4 / link.bandwidth)
        assert t4 > t2
    wide = [x for x in _collectives(_profile(Parallel(4), d=64)) if x[0] == "all_gather"]
    assert len(wide) == len(four)
    for (_, _, s, t), (_, _, sw, tw) in zip(four, wide, strict=True):
        assert sw > s
        assert tw - t == pytest.approx((sw - s) * 3 / 4 / H100.intra.bandwidth)


def test_per_rank_plan_reports_its_collective_time(fsdp_tp_profiles) -> None:
    prof = fsdp_tp_profiles[(4, 1)]
    plan = memviz.plan(prof, int(prof.baseline.peak_bytes * 0.95), strategy="sac")
    assert plan.collective_seconds == pytest.approx(collective_time(plan.graph, plan.schedule))
    assert 0 < plan.collective_seconds <= plan.timeline.total_time
    assert "collectives" in plan.summary() and "not overlapped" in plan.summary()
    # overlapped with compute: the longer stream, below the in-order step and at least the collectives
    compute = plan.timeline.total_time - plan.collective_seconds
    assert plan.overlapped_seconds == pytest.approx(max(compute, plan.collective_seconds))
    assert plan.collective_seconds <= plan.overlapped_seconds < plan.timeline.total_time


def test_a_real_groups_collective_is_timed_to_its_end() -> None:
    """On a real gloo / NCCL group a c10d operator returns at launch and its caller waits for the work
    object later, outside any dispatch mode: the recorder waits for it inside the operator's timing."""
    import torch.distributed as dist

    from memviz.parallel.distributed import _wait

    class Work(dist.distributed_c10d.Work):
        waited = False

        def wait(self, timeout=None) -> bool:
            Work.waited = True
            return True

    work = Work()  # held: the boxed object's Python override needs its Python instance alive
    _wait((torch.zeros(2), work.boxed()))
    assert Work.waited
