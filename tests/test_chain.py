"""Chain decomposition at 1-separators (Rockmate Sec. 3.1, Appendix A.4-A.5)."""

from __future__ import annotations

from gpt_chain import gpt_graph
from graphs import chain_of_blocks, training_chain, transformer_blocks

from solvers import DataKind, GraphBuilder, Phase, eager_schedule, simulate
from solvers.chain import decompose, schedule_with_frees, store_all


def _partition_ok(g, ch):
    fwd = sorted(c for b in ch.blocks for c in b.forward)
    bwd = sorted(c for b in ch.blocks for c in b.backward)
    assert fwd == [c.id for c in g.computes if c.phase == Phase.FORWARD]
    assert bwd == [c.id for c in g.computes if c.phase == Phase.BACKWARD]
    for k, b in enumerate(ch.blocks):
        own = {d for c in b.forward for d in g.computes[c].outputs}
        for c in b.forward:  # a block's forward reads only its own data, its input cut and residents
            for d in g.computes[c].inputs:
                assert d in own or d == b.input or d in ch.resident
        for c in b.backward:  # ... and its backward only its own forward data and its input cut
            for d in g.computes[c].inputs:
                p = g.datas[d].producer
                if p is not None and g.computes[p].phase == Phase.FORWARD and d not in ch.resident:
                    assert d in own or d == b.input, (k, g.computes[c].name, g.datas[d].name)


def test_plain_chain_is_cut_at_every_activation():
    g = training_chain(5)
    ch = decompose(g)
    assert len(ch.blocks) == 5
    assert [g.datas[b.output].name for b in ch.blocks[:-1]] == ["a0", "a1", "a2", "a3"]
    _partition_ok(g, ch)


def test_residual_blocks_are_not_cut_inside_a_skip():
    g = chain_of_blocks(4)
    ch = decompose(g)
    _partition_ok(g, ch)
    cuts = {g.datas[b.output].name for b in ch.blocks if b.output is not None}
    # inside block k>0 the skip from h{k-1} to res{k} means no a{k}_j can be a cut
    assert not any(n.startswith(("a1_", "a2_", "a3_")) for n in cuts)
    assert {"h0", "h1", "h2"} <= cuts


def test_transformer_partition_and_identical_layers():
    g = gpt_graph(4, seq=32, hidden=64)
    ch = decompose(g)
    _partition_ok(g, ch)
    classes = [b.klass for b in ch.blocks]
    assert len(set(classes)) == 6  # embedding, attention, MLP, last attention/MLP, head
    mids = classes[1:-3]
    assert mids == mids[:2] * (len(mids) // 2)
    _partition_ok(transformer_blocks(2), decompose(transformer_blocks(2)))


def test_inference_graph_has_no_backward():
    b = GraphBuilder("inf")
    x = b.data("x", 8, DataKind.INPUT)
    prev = x
    for i in range(4):
        y = b.data(f"y{i}", 16)
        b.compute(f"f{i}", [prev], [y])
        prev = y
    b.outputs = [prev]
    g = b.build()
    ch = decompose(g)
    assert len(ch.blocks) == 4 and not ch.training


def test_liveness_frees_never_worse_than_eager():
    for g in (training_chain(4), chain_of_blocks(3), gpt_graph(2, seq=16, hidden=32)):
        order = list(range(len(g.computes)))
        mine = simulate(g, schedule_with_frees(g, order)).check()
        eager = simulate(g, eager_schedule(g)).check()
        assert mine.peak_bytes <= eager.peak_bytes


def test_store_all_measures_saved_data():
    g = training_chain(3, sizes=[10, 20, 30])
    ch = decompose(g)
    opt = store_all(ch, ch.blocks[1])
    assert opt.keep == 20  # a1 is both the saved data and the output cut
    assert opt.fwd_peak == 20


def test_non_topological_ids_are_refused():
    import pytest

    from solvers import GraphError

    b = GraphBuilder("bad")
    x = b.data("x", 4, DataKind.INPUT)
    y, z = b.data("y", 4), b.data("z", 4)
    b.compute("second", [y], [z])
    b.compute("first", [x], [y])
    b.outputs = [z]
    with pytest.raises(GraphError, match="topological"):
        decompose(b.build())


def test_graph_hashes_its_nodes_once(monkeypatch):
    """A graph's hash, the key of every per-graph solver cache (`solvers.memo`), is computed once: hashing
    it again hashes none of its nodes (a 4k-op plan hashed its graph ~160 times); it still agrees with
    equality (metadata is not compared) and survives pickling into another process's hash seed."""
    import dataclasses
    import pickle

    from solvers.ir import ComputeNode

    g = dataclasses.replace(gpt_graph(2), name="fresh")
    calls = []
    node_hash = ComputeNode.__hash__
    monkeypatch.setattr(ComputeNode, "__hash__", lambda self: calls.append(self.id) or node_hash(self))
    first = hash(g)
    assert len(calls) == len(g.computes)
    assert hash(g) == first and len(calls) == len(g.computes)
    same = dataclasses.replace(g, meta={"other": 1})
    assert same == g and hash(same) == first
    assert hash(dataclasses.replace(g, name="other")) != first
    assert "_hash" not in pickle.loads(pickle.dumps(g)).__dict__  # recomputed where it is unpickled
