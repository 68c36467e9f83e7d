"""solvers.autochunk without torch: dimension rules, chunk flows, memory estimate, selection."""

from __future__ import annotations

import json

import pytest

from solvers import autochunk as ac


def _attention_graph(T: int = 64, H: int = 2, D: int = 8) -> ac.OpGraph:
    """x -> linear(qkv) -> split -> q,k,v views -> q@kT -> softmax -> @v -> out (explicit attention)."""
    C = H * D
    n = ac.OpNode
    nodes = [
        n("x", "input", shapes=((1, T, C),)),
        n("w", "input", shapes=((3 * C, C),)),
        n("qkv", "linear", ("x", "w"), ("%x", "%w"), shapes=((1, T, 3 * C),)),
        n("split", "split", ("qkv",), ("%qkv", C, 2), shapes=((1, T, C),) * 3, alias="qkv", multi=True),
        n("q0", "getitem", ("split",), ("%split", 0), shapes=((1, T, C),), alias="split"),
        n("k0", "getitem", ("split",), ("%split", 1), shapes=((1, T, C),), alias="split"),
        n("v0", "getitem", ("split",), ("%split", 2), shapes=((1, T, C),), alias="split"),
        n("q1", "view", ("q0",), ("%q0", (1, T, H, D)), shapes=((1, T, H, D),), alias="q0"),
        n("q", "transpose", ("q1",), ("%q1", 1, 2), shapes=((1, H, T, D),), alias="q1"),
        n("k1", "view", ("k0",), ("%k0", (1, T, H, D)), shapes=((1, T, H, D),), alias="k0"),
        n("k", "permute", ("k1",), ("%k1", (0, 2, 3, 1)), shapes=((1, H, D, T),), alias="k1"),
        n("v1", "view", ("v0",), ("%v0", (1, T, H, D)), shapes=((1, T, H, D),), alias="v0"),
        n("v", "transpose", ("v1",), ("%v1", 1, 2), shapes=((1, H, T, D),), alias="v1"),
        n("s", "matmul", ("q", "k"), ("%q", "%k"), shapes=((1, H, T, T),)),
        n("p", "softmax", ("s",), ("%s", -1), shapes=((1, H, T, T),)),
        n("o", "matmul", ("p", "v"), ("%p", "%v"), shapes=((1, H, T, D),)),
        n("y", "add", ("o",), ("%o", 1.0), shapes=((1, H, T, D),)),
    ]
    return ac.OpGraph(tuple(nodes), ("y",))


def test_reshape_rule_keeps_whole_dims_and_breaks_on_merges():
    assert ac.reshape_dim((2, 16, 64), (2, 16, 4, 16), 1) == 1
    assert ac.reshape_dim((2, 16, 4, 16), (2, 16, 64), 1) == 1
    assert ac.reshape_dim((2, 16, 64), (32, 64), 0) is None  # batch and sequence merged
    assert ac.reshape_dim((1, 512), (512,), 0) == 1  # squeeze


def test_query_flow_through_fused_qkv_is_legal_and_hoists_keys():
    g = _attention_graph()
    f = ac.flow_region(g, "q0", "o", {"o": 2})
    assert f.dims["s"] == 2 and f.dims["p"] == 2 and f.dims["o"] == 2
    # k and v are read whole: hoisted, never chunked; the tuple of the split is never narrowed
    assert {"k", "v", "k1", "v1"} <= set(f.hoisted)
    assert "split" not in f.narrow and f.extent == 64


def test_flow_over_the_softmax_dim_is_rejected_naming_softmax():
    g = _attention_graph()
    with pytest.raises(ac.IllegalRegion) as e:
        ac.flow_region(g, "s", "p", {"p": 3})
    assert e.value.op == "softmax" and "softmax" in str(e.value)


def test_split_tuple_is_hoisted_when_its_items_disagree():
    g = _attention_graph()
    f = ac.flow_region(g, "qkv", "o", {"o": 2})
    # the qkv linear is needed whole by k and v: the whole prefix is hoisted, q is narrowed instead
    assert "qkv" in f.hoisted and "split" in f.hoisted and "q0" in f.hoisted
    assert set(f.dims) == {"q1", "q", "s", "p", "o"}


def test_unknown_op_ends_regions_without_crashing():
    g = _attention_graph()
    nodes = list(g.nodes)
    i = next(k for k, n in enumerate(nodes) if n.name == "p")
    nodes[i] = ac.OpNode("p", "weird_custom_op", ("s",), ("%s",), shapes=((1, 2, 64, 64),))
    g2 = ac.OpGraph(tuple(nodes), g.outputs)
    with pytest.raises(ac.IllegalRegion) as e:
        ac.flow_region(g2, "s", "o", {"o": 2})
    assert e.value.op == "weird_custom_op"
    for f in ac.candidates_around(g2, "s", (), window=20):
        assert "p" not in f.dims  # the unknown op can be hoisted only if nothing chunked feeds it
    est = ac.estimate_memory(g2)
    assert est.peak_bytes > 0


def test_memory_estimate_follows_eq2():
    g = _attention_graph(T=64, H=2, D=8)
    base = ac.estimate_memory(g)
    TT = 2 * 64 * 64 * 4
    qkv = 64 * 48 * 4
    # while p is computed: qkv (keys, values), s and p (both 2x64x64 floats)
    assert dict(base.curve)["p"] == qkv + 2 * TT
    f = ac.flow_region(g, "s", "o", {"o": 2})
    for n in (2, 8, 64):
        est = ac.estimate_memory(g, (ac.ChunkRegion(f, n),))
        out = 2 * 64 * 8 * 4
        assert dict(est.curve)["p"] == qkv + out + 2 * TT // n  # Eq. 2: inputs, outputs, A / n
    assert ac.estimate_memory(g, (ac.ChunkRegion(f, 8),)).peak_bytes < base.peak_bytes


def test_more_chunks_cost_more_time():
    g = _attention_graph(T=256)
    f = ac.flow_region(g, "s", "o", {"o": 2})
    m = ac.SpeedModel()
    costs = [ac.region_slowdown(g, ac.ChunkRegion(f, n), m) for n in (2, 8, 32, 256)]
    assert costs == sorted(costs) and costs[-1] > costs[0]


def test_selection_meets_budget_with_fewest_chunks():
    g = _attention_graph(T=256)
    base = ac.estimate_memory(g).peak_bytes
    sel = ac.select_chunks(g, base // 3, ac.SpeedModel())
    assert sel.met and sel.peak_bytes <= base // 3 and sel.regions
    # one chunk fewer would not fit: the count is the smallest that fits (no page faults to save)
    r = sel.regions[0]
    if r.chunks > 2:
        fewer = ac.ChunkRegion(r.flow, r.chunks - 1)
        local = max(
            b
            for x, b in ac.estimate_memory(g, (fewer,)).curve
            if x in ac.region_nodes(g, r.flow.start, r.flow.end)
        )
        assert local > base // 3
    # an impossible budget is reported as not met, never as met
    tiny = ac.select_chunks(g, 1024, ac.SpeedModel())
    assert not tiny.met and tiny.peak_bytes > 1024


def test_selection_stops_at_its_time_limit_with_the_best_found():
    """Out of time, the search returns what it has (no region yet: the unchunked graph, not met)
    instead of running on; with time it meets the same budget."""
    g = _attention_graph(T=256)
    budget = ac.estimate_memory(g).peak_bytes // 3
    out_of_time = ac.select_chunks(g, budget, ac.SpeedModel(), time_limit=0.0)
    assert not out_of_time.met and out_of_time.regions == ()
    assert ac.select_chunks(g, budget, ac.SpeedModel(), time_limit=60.0).met


def test_op_graph_round_trips_through_json():
    g = _attention_graph()
    g2 = ac.OpGraph.from_dict(json.loads(json.dumps(g.to_dict())))
    assert g2 == g
    m = ac.SpeedModel(2e-6, ((1, 1e9), (64, 1e10)), 1e10)
    assert ac.SpeedModel.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_chunked_run_is_the_memory_estimate_step_by_step():
    """The chunked run as a CD-graph: valid for the simulator, its peak the estimate plus the inputs,
    its time the unchunked time plus the estimated region slowdown, one compute per op per chunk."""
    from solvers import simulate

    g = _attention_graph()
    r = ac.ChunkRegion(ac.flow_region(g, "q0", "o", {"o": 2}), 4)
    speed = ac.SpeedModel()
    base = ac.chunked_run(g, (), speed)
    run = ac.chunked_run(g, (r,), speed)
    for regions, cd in (((), base), ((r,), run)):
        tl = simulate(cd.graph, cd.schedule).check()
        assert tl.peak_bytes == ac.estimate_memory(g, regions).peak_bytes + cd.graph.persistent_bytes()
    assert simulate(run.graph, run.schedule).peak_bytes < simulate(base.graph, base.schedule).peak_bytes
    assert sorted(c.name for c in run.graph.computes if c.name.startswith("p[")) == [
        "p[0:16]",
        "p[16:32]",
        "p[32:48]",
        "p[48:64]",
    ]
    assert [c.op for c in run.graph.computes if c.name == "o.buffer"] == ["empty"]
    ((first, last),) = run.spans
    assert run.schedule[first].op == "compute" and first < last < len(run.schedule)
    slow = ac.region_slowdown(g, r, speed)
    t_base = simulate(base.graph, base.schedule).total_time
    assert simulate(run.graph, run.schedule).total_time == pytest.approx(t_base + slow, rel=1e-9)
    assert t_base == pytest.approx(ac.graph_time(g, speed), rel=1e-9)


def test_op_graph_json_keeps_non_finite_literals():
    n = ac.OpNode("m", "masked_fill", ("x", "k"), ("%x", "%k", float("-inf")), shapes=((2, 2),))
    g = ac.OpGraph(
        (ac.OpNode("x", "input", shapes=((2, 2),)), ac.OpNode("k", "input", shapes=((2, 2),)), n), ("m",)
    )
    back = ac.OpGraph.from_dict(json.loads(json.dumps(g.to_dict(), allow_nan=False)))
    assert back == g and back["m"].args[2] == float("-inf")


def test_random_ops_in_regions_are_reported_unless_dropout_is_off():
    def graph(train: bool, op: str = "dropout") -> ac.OpGraph:
        n = ac.OpNode
        nodes = (
            n("x", "input", shapes=((1, 64, 8),)),
            n("a", "relu", ("x",), ("%x",), shapes=((1, 64, 8),)),
            n("d", op, ("a",), ("%a", 0.1, train) if op == "dropout" else ("%a",), shapes=((1, 64, 8),)),
            n("y", "gelu", ("d",), ("%d",), shapes=((1, 64, 8),)),
        )
        return ac.OpGraph(nodes, ("y",))

    for g, expected in ((graph(True), ["d"]), (graph(False), []), (graph(False, "rand_like"), ["d"])):
        region = ac.ChunkRegion(ac.flow_region(g, "a", "y", {"y": 1}), 4)
        assert ac.random_chunked(g, [region]) == expected


def _faulting_graph(fresh: bool = True) -> ac.OpGraph:
    """x -> relu -> exp -> sum over the features: 1 MiB intermediates timed on the device, which
    faulted in fresh pages (as a large buffer the allocator maps afresh does); a 256 KiB op faulted too."""
    n = ac.OpNode
    T, C = 1024, 256
    big = T * C * 4
    quarter = big // 4 if fresh else 0
    nodes = (
        n("x", "input", shapes=((1, T, C),)),
        n("small", "relu", ("x",), ("%x",), shapes=((1, T // 4, C),), time=1e-4, fresh=quarter),
        n("a", "relu", ("x",), ("%x",), shapes=((1, T, C),), time=2e-3, fresh=big if fresh else 0),
        n("b", "exp", ("a",), ("%a",), shapes=((1, T, C),), time=3e-3, fresh=big if fresh else 0),
        n("y", "sum", ("b",), ("%b", (2,)), shapes=((1, T),), time=1e-3),
    )
    return ac.OpGraph(nodes, ("y", "small"))


def test_measured_node_times_scale_with_the_chunk_and_page_faults():
    g = _faulting_graph()
    m = ac.SpeedModel(overhead_s=1e-5, page_s=1e-9)
    a = g["a"]
    assert g.fresh_from == a.nbytes // 4  # the smallest output that faulted
    assert ac.node_time(g, a, m) == a.time  # whole: as measured
    work = a.time - a.fresh * m.page_s - m.overhead_s
    # a half is still as large as a buffer that faulted: it pays its share of the faults
    assert ac.node_time(g, a, m, 0.5, 1) == pytest.approx(m.overhead_s + work / 2 + a.fresh * m.page_s / 2)
    # an eighth is smaller than anything that faulted: reused memory, no faults
    assert ac.node_time(g, a, m, 1 / 8, 1) == pytest.approx(m.overhead_s + work / 8)
    # unless the allocator was measured to map buffers that small afresh (calibration)
    m2 = ac.SpeedModel(overhead_s=1e-5, page_s=1e-9, fresh_from=a.nbytes // 16)
    assert ac.node_time(g, a, m2, 1 / 8, 1) == pytest.approx(m.overhead_s + work / 8 + a.fresh * m.page_s / 8)
    assert ac.SpeedModel.from_dict(json.loads(json.dumps(m2.to_dict()))) == m2
    back = ac.OpGraph.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back == g and back["a"].time == a.time and back["a"].fresh == a.fresh


def test_selection_takes_more_chunks_where_they_avoid_page_faults():
    from solvers import simulate

    budget = 3 * 2**20 // 2  # a and b (2 MiB) cannot both be whole
    for fresh in (True, False):
        g = _faulting_graph(fresh)
        m = ac.SpeedModel(overhead_s=1e-5, page_s=1e-9)
        sel = ac.select_chunks(g, budget, m)
        assert sel.met and len(sel.regions) == 1
        r = sel.regions[0]
        if fresh:
            # 2 chunks fit, but 512 KiB chunks still fault; 8 chunks of 128 KiB do not and run faster
            assert r.chunks == 8 and sel.slowdown < 0
            assert ac.region_slowdown(g, r, m) < ac.region_slowdown(g, ac.with_count(r, 2), m)
        else:  # nothing to save: the fewest chunks that fit
            assert r.chunks == 2 and sel.slowdown > 0
        # the simulated chunked run agrees: its time is the unchunked time plus the estimate
        base, run = ac.chunked_run(g, (), m), ac.chunked_run(g, sel.regions, m)
        t0 = simulate(base.graph, base.schedule).check().total_time
        t1 = simulate(run.graph, run.schedule).check().total_time
        assert t1 == pytest.approx(t0 + ac.region_slowdown(g, r, m), rel=1e-9)


def test_unreachable_budget_chunks_only_as_finely_as_the_graph_peak_needs():
    """An unknown op after the MLP keeps 2 MiB whole: the budget cannot be met, and the MLP region is
    chunked just finely enough to stop being the peak, not as finely as its own peak allows."""
    n = ac.OpNode
    T, C = 1024, 256
    nodes = (
        n("x", "input", shapes=((1, T, C),)),
        n("w1", "input", shapes=((4 * C, C),)),
        n("w2", "input", shapes=((C, 4 * C),)),
        n("a", "linear", ("x", "w1"), ("%x", "%w1"), shapes=((1, T, 4 * C),)),
        n("b", "gelu", ("a",), ("%a",), shapes=((1, T, 4 * C),)),
        n("y", "linear", ("b", "w2"), ("%b", "%w2"), shapes=((1, T, C),)),
        n("u", "weird_custom_op", ("y",), ("%y",), shapes=((1, T, C),)),
    )
    g = ac.OpGraph(nodes, ("u",))
    floor = 2 * T * C * 4  # y and u while u runs
    sel = ac.select_chunks(g, floor // 4, ac.SpeedModel())
    assert not sel.met and sel.peak_bytes == floor and len(sel.regions) == 1
    (r,) = sel.regions
    fewer = ac.with_count(r, r.chunks - 1)
    assert ac.estimate_memory(g, (fewer,)).peak_bytes > floor  # one chunk fewer: the MLP is the peak
    assert r.chunks < 16


def test_a_tuple_read_after_the_region_is_not_a_region_output():
    """GPT-2's qkv split ended a region with its items read after it: the loop had no buffer for a
    tuple (code generation failed); its items each get one when the region ends after them."""
    n = ac.OpNode
    g = ac.OpGraph(
        (
            n("x", "input", shapes=((8, 6),)),
            n("e", "exp", ("x",), ("%x",), shapes=((8, 6),)),
            n("s", "split", ("e",), ("%e", 3, 1), shapes=((8, 3), (8, 3)), multi=True),
            n("a", "getitem", ("s",), ("%s", 0), shapes=((8, 3),), alias="s"),
            n("b", "getitem", ("s",), ("%s", 1), shapes=((8, 3),), alias="s"),
            n("y", "add", ("a", "b"), ("%a", "%b"), shapes=((8, 3),)),
        ),
        ("y",),
    )
    with pytest.raises(ac.IllegalRegion, match="returns several tensors"):
        ac.flow_region(g, "e", "s", {"s": 0})
    flow = ac.flow_region(g, "e", "b", {"a": 0, "b": 0})
    assert flow.dims["s"] == 0 and set(flow.outputs) == {"a", "b"}


def _stacked_attention(blocks: int, T: int = 128) -> ac.OpGraph:
    """`blocks` copies of `_attention_graph`'s ops, each reading the shared input and weight: twin
    attention peaks, one per block."""
    one = _attention_graph(T=T)
    nodes = list(one.nodes[:2])
    for b in range(blocks):
        rename = {n.name: f"{n.name}_{b}" for n in one.nodes[2:]}

        def ref(a: object, rename: dict[str, str] = rename) -> object:
            return f"%{rename.get(a[1:], a[1:])}" if isinstance(a, str) and a.startswith("%") else a

        for n in one.nodes[2:]:
            nodes.append(ac.OpNode(rename[n.name], n.op, tuple(rename.get(v, v) for v in n.inputs),
                                   tuple(ref(a) for a in n.args), shapes=n.shapes,
                                   alias=rename.get(n.alias, n.alias) if n.alias else None, multi=n.multi))
    return ac.OpGraph(tuple(nodes), tuple(f"y_{b}" for b in range(blocks)))


def test_twin_blocks_get_the_region_found_for_one():
    g = _stacked_attention(6)
    base = ac.estimate_memory(g).peak_bytes
    # two rounds cannot chunk six twin peaks one by one; the twins of the first region can
    sel = ac.select_chunks(g, base // 2, ac.SpeedModel(), max_regions=2)
    assert sel.met and sel.peak_bytes <= base // 2
    # every block's scores are chunked (a region may span two independent blocks)
    assert all(any(f"s_{b}" in r.flow.dims for r in sel.regions) for b in range(6))
    for r in sel.regions:  # each copy is a legal flow of its own block
        assert ac.flow_region(g, r.flow.start, r.flow.end, r.flow.outputs).dims == r.flow.dims
    assert ac.estimate_memory(g, sel.regions).peak_bytes == sel.peak_bytes
    # a copy never overlaps a region
    assert ac.with_twins(g, sel.regions) == tuple(sorted(sel.regions, key=lambda r: g.pos(r.flow.start)))


def test_relaxing_drops_every_region_the_target_does_not_need():
    """Regions over four twin blocks against the unchunked peak as the target: none is needed.  Dropping
    the first shifted the second's position, so it counted itself among the others and stayed (a third
    region then was written past the list's end: EVA-02's inference plan raised IndexError)."""
    g = _stacked_attention(4)
    base = ac.estimate_memory(g).peak_bytes
    sel = ac.select_chunks(g, base // 2, ac.SpeedModel())
    assert sel.met and len(sel.regions) >= 2
    assert ac._relax(g, sel.regions, base, ac.SpeedModel(), None) == ()
    # a target only every region meets keeps them all
    assert len(ac._relax(g, sel.regions, sel.peak_bytes, ac.SpeedModel(), None)) == len(sel.regions)
