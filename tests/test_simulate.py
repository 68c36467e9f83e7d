"""Property tests for the simulator: the single source of truth for memory and validity."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers import DataKind, GraphBuilder, GraphError, Phase, compute, eager_schedule, free, simulate
from solvers.ir import ComputeNode, DataNode, Graph, frozen_instances
from solvers.schedule import Step, run_turn_once, steps_from_json, turn_issue


def random_dag(seed: int, n: int) -> Graph:
    """A random CD-graph: a few parameters, then n ops each reading 1-3 earlier tensors and writing
    1-2 new ones; the last op's outputs are required."""
    rng = random.Random(seed)
    b = GraphBuilder(f"dag{seed}")
    tensors = [b.data(f"p{i}", rng.randint(1, 64), DataKind.PARAMETER) for i in range(rng.randint(1, 3))]
    tensors.append(b.data("x", rng.randint(1, 64), DataKind.INPUT))
    for i in range(n):
        ins = rng.sample(tensors, k=min(len(tensors), rng.randint(1, 3)))
        outs = [b.data(f"t{i}_{j}", rng.randint(0, 256)) for j in range(rng.randint(1, 2))]
        b.compute(f"op{i}", ins, outs, time=rng.uniform(0.1, 2.0), temp_bytes=rng.choice([0, 0, 8, 32]))
        tensors.extend(outs)
    b.outputs = list(b._computes[-1]["outputs"])
    return b.build()


def random_topological_order(graph: Graph, seed: int) -> list[int]:
    rng = random.Random(seed)
    indeg = {c.id: len(graph.predecessors(c.id)) for c in graph.computes}
    ready = [c for c, k in indeg.items() if k == 0]
    order = []
    while ready:
        c = ready.pop(rng.randrange(len(ready)))
        order.append(c)
        for s in graph.successors(c):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return order


def recount_peak(graph: Graph, schedule: tuple[Step, ...]) -> int:
    """An independent recount: rebuild the live set from scratch at every step."""
    alive = {d.id for d in graph.datas if d.producer is None}
    peak = sum(graph.datas[d].bytes for d in alive)
    for s in schedule:
        if s.op == "compute":
            c = graph.computes[s.node]
            alive |= set(c.outputs)
            peak = max(peak, sum(graph.datas[d].bytes for d in alive) + c.temp_bytes)
        else:
            alive.discard(s.node)
            peak = max(peak, sum(graph.datas[d].bytes for d in alive))
    return peak


dag_params = st.tuples(st.integers(0, 10_000), st.integers(1, 25))


@settings(max_examples=60, deadline=None)
@given(dag_params, st.integers(0, 1000))
def test_every_topological_eager_schedule_is_valid(params, order_seed):
    graph = random_dag(*params)
    order = random_topological_order(graph, order_seed)
    tl = simulate(graph, eager_schedule(graph, order))
    assert tl.valid, tl.issues
    assert tl.computes == len(graph.computes) and tl.recomputes == 0
    assert tl.total_time == pytest.approx(sum(c.time for c in graph.computes))


@settings(max_examples=60, deadline=None)
@given(dag_params, st.integers(0, 1000))
def test_peak_equals_independent_recount(params, order_seed):
    graph = random_dag(*params)
    sched = eager_schedule(graph, random_topological_order(graph, order_seed))
    tl = simulate(graph, sched)
    assert tl.peak_bytes == recount_peak(graph, sched)
    for i, total in enumerate(tl.step_bytes):
        assert total == sum(tl.by_category[k][i] for k in tl.by_category)


@settings(max_examples=60, deadline=None)
@given(dag_params, st.data())
def test_dropping_a_needed_tensor_is_caught(params, data):
    graph = random_dag(*params)
    sched = list(eager_schedule(graph))
    # free some produced tensor right after it is computed, while a later step still reads it
    candidates = [
        (i, d)
        for i, s in enumerate(sched)
        if s.op == "compute"
        for d in graph.computes[s.node].outputs
        if graph.consumers(d) or d in graph.outputs
    ]
    if not candidates:
        return
    i, d = data.draw(st.sampled_from(candidates))
    sched = [s for s in sched if s != free(d)]
    sched.insert(i + 1, free(d))
    tl = simulate(graph, sched)
    assert not tl.valid
    assert any(graph.datas[d].name in issue.message for issue in tl.issues)


@settings(max_examples=40, deadline=None)
@given(dag_params, st.data())
def test_recomputation_is_accepted_and_costed(params, data):
    graph = random_dag(*params)
    sched = list(eager_schedule(graph))
    # free a consumed tensor after its first reader, then recompute its producer before the next reader
    options = []
    for d in graph.datas:
        readers = graph.consumers(d.id)
        if d.producer is not None and len(readers) >= 2 and d.id not in graph.outputs:
            options.append(d.id)
    if not options:
        return
    d = data.draw(st.sampled_from(options))
    producer = graph.datas[d].producer
    first_reader = min(graph.consumers(d))
    pos = sched.index(compute(first_reader))
    inputs_alive_later = all(graph.datas[x].producer is None for x in graph.computes[producer].inputs)
    sched.insert(pos + 1, free(d))
    second = sorted(graph.consumers(d))[1]
    sched.insert(sched.index(compute(second)), compute(producer))
    tl = simulate(graph, sched)
    if inputs_alive_later:
        assert tl.valid, tl.issues
        assert tl.recomputes == 1
        assert tl.total_time == pytest.approx(
            sum(c.time for c in graph.computes) + graph.computes[producer].time
        )
        assert tl.peak_bytes == recount_peak(graph, tuple(sched))


def test_issue_messages_name_step_and_tensor():
    b = GraphBuilder()
    x = b.data("x", 4, "input")
    h = b.data("h", 8)
    y = b.data("y", 8, "output")
    b.compute("lin", [x], [h], time=1.0)
    b.compute("relu", [h], [y], time=1.0)
    b.outputs = [y]
    g = b.build()
    tl = simulate(g, [compute(0), free(h), compute(1)])
    assert [str(i) for i in tl.issues] == [
        "step 2: compute 'relu' reads 'h', which is not alive (freed at step 1)"
    ]
    tl = simulate(g, [compute(1)])
    assert "never computed" in str(tl.issues[0])
    assert any("never run: lin" in str(i) for i in tl.issues)
    tl = simulate(g, [compute(0), compute(1), free(y)])
    assert [str(i) for i in tl.issues] == ["at the end: required output 'y' is not alive"]
    tl = simulate(g, [compute(0), compute(1), free(h), free(h)])
    assert str(tl.issues[0]) == "step 3: free of 'h', which is not alive"


def test_memory_model_counts_outputs_and_workspace_while_running():
    b = GraphBuilder()
    p = b.data("w", 100, "parameter")
    a = b.data("a", 10)
    o = b.data("o", 1, "output")
    b.compute("f", [p], [a], time=1.0, temp_bytes=50)
    b.compute("g", [a, p], [o], time=2.0, phase=Phase.BACKWARD)
    b.outputs = [o]
    g = b.build()
    tl = simulate(g, eager_schedule(g))
    assert tl.initial_bytes == 100
    assert tl.step_bytes == (160, 111, 101)
    assert tl.by_category["workspace"] == (50, 0, 0)
    assert tl.peak_bytes == 160 and tl.peak_step == 0
    assert tl.live_bytes == (110, 111, 101)


def test_graph_rejects_malformed_input():
    b = GraphBuilder()
    x = b.data("x", 4, "input")
    y = b.data("y", 1)
    b.compute("f", [x], [y])
    with pytest.raises(GraphError, match="already has a producer"):
        b.compute("g", [x], [y])
    with pytest.raises(GraphError, match="unknown data id 5"):
        Graph((ComputeNode(0, "h", "h", Phase.FORWARD, (5,), ()),), (), ())
    with pytest.raises(GraphError, match="cycle"):
        Graph(
            (
                ComputeNode(0, "a", "a", Phase.FORWARD, (1,), (0,)),
                ComputeNode(1, "b", "b", Phase.FORWARD, (0,), (1,)),
            ),
            (DataNode(0, "d0", 1, DataKind.ACTIVATION, 0), DataNode(1, "d1", 1, DataKind.ACTIVATION, 1)),
            (),
        )


def test_graph_round_trips_through_dict():
    g = random_dag(7, 12)
    assert Graph.from_dict(g.to_dict()) == g


def test_graph_from_dict_fills_optional_keys_some_nodes_lack():
    """The one-pass column read needs every key on every node; a node without an optional key sends the
    graph to a read per key, with the dataclass defaults, and one without a required key is a KeyError."""
    g = random_dag(7, 12)
    doc = g.to_dict()
    for key in ("module", "source", "block", "flops"):
        del doc["computes"][3][key]
    for key in ("producer", "shape", "dtype", "aliases"):
        del doc["datas"][0][key]  # a source: its producer is None, the default
    assert Graph.from_dict(doc) == g
    del doc["computes"][2]["time"]
    with pytest.raises(KeyError):
        Graph.from_dict(doc)


def test_frozen_instances_refuses_columns_of_different_lengths():
    assert frozen_instances(Step, ["compute", "free"], [1, 2]) == (compute(1), free(2))
    assert frozen_instances(Step, [], []) == ()
    for ops, nodes in ((["compute"], [1, 2]), ([], [1])):
        with pytest.raises(ValueError):
            frozen_instances(Step, ops, nodes)


def test_steps_from_json_rejects_garbage():
    assert steps_from_json([["compute", 1], ["free", 2]]) == (compute(1), free(2))
    for bad in ([["run", 1]], [["compute", "1"]], [["free", True]], [[1]]):
        with pytest.raises(ValueError):
            steps_from_json(bad)


def test_a_compute_without_outputs_must_run():
    """An optimizer update writes its parameter and state in place: it produces no data node, yet a
    schedule that skips it plans a step whose update memory nobody counted (checkmate did)."""
    b = GraphBuilder()
    w = b.data("w", 100, "parameter")
    x = b.data("x", 4, "input")
    gw = b.data("w.grad", 100, "parameter_gradient")
    b.compute("grad", [w, x], [gw], time=1.0, phase=Phase.BACKWARD)
    b.compute("AdamW.step[w]", [w, gw], [], time=1.0, temp_bytes=300, phase=Phase.OPTIMIZER)
    b.outputs = [gw]
    g = b.build()
    assert g.required_computes == {0, 1}
    skipped = simulate(g, [compute(0)])
    assert any("never run: AdamW.step[w]" in str(i) for i in skipped.issues)
    tl = simulate(g, eager_schedule(g))
    assert tl.valid and tl.peak_bytes == 100 + 4 + 100 + 300


# --- the fast paths of issue 17 item 4 (a 100k-step plan file loads in linear time) -------------------------
def recount_timeline(graph: Graph, schedule: list[Step]) -> dict:
    """An independent replay: at every step, each category of the live set summed from scratch."""
    from solvers.simulate import CATEGORIES, category

    alive = {d.id for d in graph.datas if d.producer is None}
    rows, bad_steps = [], []
    for i, s in enumerate(schedule):
        temp = 0
        if s.op == "compute" and 0 <= s.node < len(graph.computes):
            c = graph.computes[s.node]
            if not set(c.inputs) <= alive:
                bad_steps.append(i)
            alive |= set(c.outputs)
            temp = c.temp_bytes
        elif s.op == "free" and 0 <= s.node < len(graph.datas) and s.node in alive:
            alive.discard(s.node)
        else:
            bad_steps.append(i)
        row = dict.fromkeys(CATEGORIES, 0)
        for d in alive:
            row[category(graph.datas[d].kind)] += graph.datas[d].bytes
        row["workspace"] = temp
        rows.append(row)
    step_bytes = [sum(r.values()) for r in rows]
    live_bytes = [total - r["workspace"] for total, r in zip(step_bytes, rows, strict=True)]
    return {"by_category": {k: tuple(r[k] for r in rows) for k in CATEGORIES},
            "step_bytes": tuple(step_bytes), "live_bytes": tuple(live_bytes), "bad_steps": bad_steps}


@settings(max_examples=80, deadline=None)
@given(dag_params, st.data())
def test_timeline_equals_a_replay_from_scratch_even_for_bad_schedules(params, data):
    """simulate keeps per-step changes and sums them; every series equals a replay that recounts the live
    set at each step, for eager schedules with random extra, dropped or bogus steps."""
    graph = random_dag(*params)
    sched = list(eager_schedule(graph))
    bogus = st.builds(Step, st.sampled_from(["compute", "free", "run"]),
                      st.integers(-2, len(graph.datas) + 2))
    for _ in range(data.draw(st.integers(0, 4))):
        if sched and data.draw(st.booleans()):
            del sched[data.draw(st.integers(0, len(sched) - 1))]
        else:
            sched.insert(data.draw(st.integers(0, len(sched))), data.draw(bogus))
    tl = simulate(graph, sched)
    ref = recount_timeline(graph, sched)
    assert tl.by_category == ref["by_category"]
    assert tl.step_bytes == ref["step_bytes"] and tl.live_bytes == ref["live_bytes"]
    assert sorted({i.step for i in tl.issues if i.step >= 0}) == ref["bad_steps"]
    initial = sum(d.bytes for d in graph.datas if d.producer is None)
    assert tl.peak_bytes == max([initial, *ref["step_bytes"]])
    first_peak = ref["step_bytes"].index(max(ref["step_bytes"])) if sched else -1
    assert tl.peak_step == (first_peak if sched and ref["step_bytes"][first_peak] >= initial else -1)


def _corrupt(doc: dict, data) -> None:
    """One random corruption of a graph dict that its checks must catch (or, rarely, that is harmless)."""
    computes, datas = doc["computes"], doc["datas"]
    what = data.draw(st.sampled_from(["id", "data id", "bytes", "producer", "ref", "output", "twice",
                                      "cycle"]))
    c = data.draw(st.integers(0, len(computes) - 1))
    d = data.draw(st.integers(0, len(datas) - 1))
    if what == "id":
        computes[c]["id"] = data.draw(st.integers(-1, len(computes)))
    elif what == "data id":
        datas[d]["id"] = data.draw(st.integers(-1, len(datas)))
    elif what == "bytes":
        datas[d]["bytes"] = -1
    elif what == "producer":
        datas[d]["producer"] = data.draw(st.none() | st.integers(0, len(computes) - 1))
    elif what == "ref":
        key = data.draw(st.sampled_from(["inputs", "outputs"]))
        computes[c][key] = [*computes[c][key], data.draw(st.integers(-2, len(datas) + 1))]
    elif what == "output":
        doc["outputs"] = [*doc["outputs"], data.draw(st.integers(-1, len(datas)))]
    elif what == "twice":
        computes[c]["outputs"] = computes[c]["outputs"] * 2
    else:  # read the output of itself or of a later node
        later = data.draw(st.integers(c, len(computes) - 1))
        computes[c]["inputs"] = [*computes[c]["inputs"], *computes[later]["outputs"]]


@settings(max_examples=150, deadline=None)
@given(dag_params, st.data())
def test_graph_column_checks_agree_with_the_node_by_node_checks(params, data):
    """The graph's C-loop checks (`_plainly_well_formed`, the capture-order acyclicity test) never accept
    what the node-by-node checks refuse: a corrupted graph gives the same error either way."""
    import json

    doc = json.loads(json.dumps(random_dag(*params).to_dict()))
    _corrupt(doc, data)

    def outcome(fast: bool):
        real_plain, real_acyclic = Graph._plainly_well_formed, Graph._check_acyclic
        if not fast:
            Graph._plainly_well_formed = lambda self: False
            Graph._check_acyclic = Graph._check_acyclic_kahn
        try:
            return Graph.from_dict(doc)
        except Exception as exc:  # noqa: BLE001 -- the exact error is what is compared
            return (type(exc), str(exc))
        finally:
            Graph._plainly_well_formed, Graph._check_acyclic = real_plain, real_acyclic

    assert outcome(True) == outcome(False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(["compute", "free", "run", 1]), st.one_of(st.integers(-1, 9), st.booleans(),
                                                                         st.just(1.0), st.just("1"))),
    st.lists(st.sampled_from(["compute", "free", 0, 3]), max_size=3),
    st.just({0: "compute", 1: 1}), st.just("ab"),
), max_size=6))
def test_steps_from_json_fast_path_agrees_with_the_step_by_step_check(items):
    items = [list(i) if isinstance(i, tuple) else i for i in items]

    def step_by_step():
        steps = []
        for item in items:
            op, node = item
            if op not in ("compute", "free") or not isinstance(node, int) or isinstance(node, bool):
                raise ValueError(f"bad schedule step {item!r}: expected ['compute'|'free', int]")
            steps.append(Step(op, node))
        return tuple(steps)

    def outcome(f):
        try:
            return f()
        except Exception as exc:  # noqa: BLE001 -- the exact error is what is compared
            return (type(exc), str(exc))

    assert outcome(lambda: steps_from_json(items)) == outcome(step_by_step)


def _loss_chain(loss_reads_a: bool = False) -> tuple[Graph, dict[str, int]]:
    """x -> f -> a -> g -> out -> loss (saves 50 B) -> loss_backward -> dout -> h(dout, a) -> da; with
    `loss_reads_a` the loss reads `a` too (a model output the loss takes whole: HF's past keys and
    values)."""
    b = GraphBuilder("loss chain")
    ids = {"x": b.data("x", 10, DataKind.INPUT)}
    ids["a"], ids["out"] = b.data("a", 100), b.data("out", 40)
    ids["L"], ids["saved"] = b.data("L", 4, DataKind.OUTPUT), b.data("saved", 50)
    ids["dout"], ids["da"] = b.data("dout", 40, DataKind.GRADIENT), b.data("da", 100, DataKind.GRADIENT)
    ids["f"] = b.compute("f", [ids["x"]], [ids["a"]])
    ids["g"] = b.compute("g", [ids["a"]], [ids["out"]])
    reads = [ids["out"], ids["a"]] if loss_reads_a else [ids["out"]]
    ids["loss"] = b.compute("loss", reads, [ids["L"], ids["saved"]], op="loss_fn")
    ids["lb"] = b.compute("loss_backward", [ids["L"], ids["saved"]], [ids["dout"]], op="loss_fn.backward",
                          phase=Phase.BACKWARD)
    ids["h"] = b.compute("h", [ids["dout"], ids["a"]], [ids["da"]], phase=Phase.BACKWARD)
    b.outputs += [ids["L"], ids["da"]]
    return b.build(), ids


def test_the_loss_runs_once_right_before_its_backward():
    """What Rockmate's chain did with the loss (in its last block): computed in the forward sweep, its
    input freed, recomputed with the loss before the loss's backward; and a recomputation Checkmate can
    place in the loss backward's stage.  The export runs the loss once, when its forward has returned:
    `run_turn_once` gives the schedule it runs (the first loss and the compute only it read dropped;
    computes between the loss and its backward moved before the loss)."""
    g, i = _loss_chain()
    c, f = compute, free
    twice = (c(i["f"]), c(i["g"]), c(i["loss"]), f(i["out"]), f(i["saved"]), c(i["g"]), c(i["loss"]),
             f(i["out"]), c(i["lb"]), f(i["saved"]), c(i["h"]), f(i["dout"]), f(i["a"]))
    assert simulate(g, twice).valid and turn_issue(twice, i["loss"], i["lb"])
    once = run_turn_once(g, twice, i["loss"], i["lb"])
    assert once == (c(i["f"]), c(i["g"]), c(i["loss"]), f(i["out"]), c(i["lb"]), f(i["saved"]), c(i["h"]),
                    f(i["dout"]), f(i["a"]))
    assert turn_issue(once, i["loss"], i["lb"]) is None and simulate(g, once).valid
    # a compute between the loss and its backward runs before the loss, beside the loss's input (`out`)
    between = (c(i["f"]), c(i["g"]), f(i["a"]), c(i["loss"]), f(i["out"]), c(i["f"]), c(i["lb"]),
               f(i["saved"]), c(i["h"]), f(i["dout"]), f(i["a"]))
    moved = run_turn_once(g, between, i["loss"], i["lb"])
    assert moved == (c(i["f"]), c(i["g"]), f(i["a"]), c(i["f"]), c(i["loss"]), f(i["out"]), c(i["lb"]),
                     f(i["saved"]), c(i["h"]), f(i["dout"]), f(i["a"]))
    assert simulate(g, moved).valid
    assert run_turn_once(g, once, i["loss"], i["lb"]) is once


def test_a_recomputed_input_of_the_loss_stays_alive_from_the_loss_on():
    """Rockmate on GPT-NeoX at sequence 256 (task deep35): the loss reads every layer's keys and values
    (the output's ``past_key_values``), so the chain's last block is the whole model; its schedule freed
    them after the loss and recomputed them before the loss's backward, and `run_turn_once` refused it
    ('auto' fell back to Rotor, which plans no lower than 0.98 of the eager peak).  The executor keeps
    the loss's input alive instead of recomputing it (the recomputation and the free before it go)."""
    g, i = _loss_chain(loss_reads_a=True)
    c, f = compute, free
    rebuilt = (c(i["f"]), c(i["g"]), c(i["loss"]), f(i["out"]), f(i["a"]), c(i["f"]), c(i["lb"]),
               f(i["saved"]), c(i["h"]), f(i["dout"]), f(i["a"]))
    assert simulate(g, rebuilt).valid and turn_issue(rebuilt, i["loss"], i["lb"])
    once = run_turn_once(g, rebuilt, i["loss"], i["lb"])
    assert once == (c(i["f"]), c(i["g"]), c(i["loss"]), f(i["out"]), c(i["lb"]), f(i["saved"]), c(i["h"]),
                    f(i["dout"]), f(i["a"]))
    assert turn_issue(once, i["loss"], i["lb"]) is None and simulate(g, once).valid


def _tied_sum() -> Graph:
    """Two gradient contributions summed in place into the first (`ComputeNode.mutates`): the first is
    the parameter gradient, the sum's own output a 0-byte token (what `capture.accumulate_in_place`
    builds for a tied weight)."""
    b = GraphBuilder("tied")
    w = b.data("w", 16, DataKind.PARAMETER)
    g1, g2 = b.data("g1", 16, DataKind.PARAMETER_GRADIENT), b.data("g2", 16, DataKind.GRADIENT)
    token = b.data("sum", 0, DataKind.PARAMETER_GRADIENT)
    b.compute("head_grad", [w], [g1], phase=Phase.BACKWARD)
    b.compute("emb_grad", [w], [g2], phase=Phase.BACKWARD)
    b.compute("sum", [g1, g2], [token], phase=Phase.BACKWARD, mutates=(g1,))
    b.outputs = [g1, token]
    return b.build()


def test_an_in_place_sum_allocates_nothing_and_runs_once():
    g = _tied_sum()
    good = (compute(0), compute(1), compute(2), free(2))
    tl = simulate(g, good).check()
    assert tl.peak_bytes == 16 * 3  # w, g1, g2: the sum writes g1's storage
    twice = simulate(g, (compute(0), compute(1), compute(2), compute(2), free(2)))
    assert [i.step for i in twice.issues] == [3] and "applied twice" in twice.issues[0].message
    # head_grad again after the sum: its fresh value would lose the sum
    lost = simulate(g, (compute(0), compute(1), compute(2), free(2), free(1), compute(0)))
    assert [i.step for i in lost.issues] == [5] and "wrote it in place" in lost.issues[0].message


def test_in_place_writes_survive_serialisation_and_must_be_inputs():
    g = _tied_sum()
    again = Graph.from_dict(g.to_dict())
    assert again.computes[2].mutates == (1,) and again == g
    assert "mutates" not in g.to_dict()["computes"][0]  # absent where empty: plan files stay as they were
    bad = g.to_dict()
    bad["computes"][1]["mutates"] = [1]  # emb_grad does not read g1
    with pytest.raises(GraphError, match="writes data id 1 in place but does not read it"):
        Graph.from_dict(bad)



def _relu_in_place(mark: str = "in_place_of") -> Graph:
    """x = conv(w); y = relu_(x) (written in place of x, `DataNode.in_place_of`; with `mark` "reuses",
    one that may take over x's storage, `DataNode.reuses`: eager ran ``relu_(x)``, the exported step runs
    it in place where x dies right after); loss = head(y), and relu's backward reads y."""
    b = GraphBuilder("relu_")
    w = b.data("w", 16, DataKind.PARAMETER)
    x = b.data("x", 64)
    y = b.data("y", 64, **{mark: x})
    loss, gy, gx = b.data("loss", 4), b.data("gy", 64, DataKind.GRADIENT), b.data("gx", 64, DataKind.GRADIENT)
    b.compute("conv", [w], [x])
    b.compute("relu", [x], [y])
    b.compute("head", [y], [loss])
    b.compute("head_bwd", [loss], [gy], phase=Phase.BACKWARD)
    b.compute("relu_bwd", [gy, y], [gx], phase=Phase.BACKWARD)
    b.outputs = [gx]
    return b.build()


def test_a_value_written_in_place_shares_its_input_storage_while_either_lives():
    g = _relu_in_place()
    # x freed right after relu: y holds the storage, counted once
    tl = simulate(g, (compute(0), compute(1), free(1), compute(2), compute(3), free(3), compute(4),
                      free(2), free(4))).check()
    assert tl.peak_bytes == 16 + 64 + 64 + 64  # w, y (x's storage), gy, gx: never x and y apart
    assert tl.step_bytes[1] == 16 + 64  # relu allocates nothing
    # the storage goes with the last of the two: x kept past y's free still holds it
    late = simulate(g, (compute(0), compute(1), compute(2), compute(3), compute(4),
                        free(2), free(4), free(1)))
    assert late.valid and late.live_bytes[-2] == 16 + 4 + 64 + 64 and late.live_bytes[-1] == 16 + 4 + 64
    # y recomputed after both went: its input is recomputed first, and the pair is one storage again
    again = simulate(g, (compute(0), compute(1), free(1), compute(2), free(2), compute(3), compute(0),
                         compute(1), free(1), compute(4))).check()
    assert again.step_bytes[7] == 16 + 4 + 64 + 64 and again.recomputes == 2


def test_reading_a_value_after_it_was_overwritten_in_place_is_an_issue():
    b = GraphBuilder("overwritten")
    x = b.data("x", 8, DataKind.INPUT)
    a = b.data("a", 8)
    y = b.data("y", 8, in_place_of=a)
    z = b.data("z", 8)
    b.compute("copy", [x], [a])
    b.compute("relu", [a], [y])
    b.compute("reads_a", [a, y], [z])
    b.outputs = [z]
    tl = simulate(b.build(), (compute(0), compute(1), compute(2)))
    assert [i.step for i in tl.issues] == [2] and "overwrote its storage in place" in tl.issues[0].message
    # `a` freed after the write (y holds the storage) and recomputed: a fresh storage, read as it is
    ok = simulate(b.build(), (compute(0), compute(1), free(1), compute(0), compute(2)))
    assert ok.valid and ok.peak_bytes == 8 * 4


def test_in_place_of_survives_serialisation_and_must_be_read_by_the_producer():
    g = _relu_in_place()
    again = Graph.from_dict(g.to_dict())
    assert again.datas[2].in_place_of == 1 and again == g
    assert "in_place_of" not in g.to_dict()["datas"][1]  # absent where unset: older plan files load
    bad = g.to_dict()
    bad["datas"][3]["in_place_of"] = 1  # the loss is not written over x: head does not read x
    with pytest.raises(GraphError, match="written in place of data id 1"):
        Graph.from_dict(bad)


def test_a_value_that_may_reuse_its_input_does_so_only_where_the_input_is_freed_right_after():
    from solvers.simulate import reused_in_place

    g = _relu_in_place("reuses")
    right_after = (compute(0), compute(1), free(1), compute(2), compute(3), free(3), compute(4), free(2),
                   free(4))
    tl = simulate(g, right_after).check()
    assert reused_in_place(g, right_after) == {1: {2: 1}}
    assert tl.step_bytes[1] == 16 + 64  # relu runs in x's storage: nothing allocated
    assert tl.peak_bytes == 16 + 64 + 64 + 64
    # x freed one compute later: relu gets a storage of its own and x keeps its values (no issue)
    later = (compute(0), compute(1), compute(2), free(1), compute(3), free(3), compute(4), free(2), free(4))
    tl_later = simulate(g, later).check()
    assert reused_in_place(g, later) == {}
    assert tl_later.step_bytes[1] == 16 + 64 + 64 and tl_later.step_bytes[2] == 16 + 64 + 64 + 4
    # kept to read again (x recomputes y in the backward): no reuse, and reading x is no issue
    kept = (compute(0), compute(1), compute(2), free(2), compute(3), compute(1), free(1), compute(4))
    tl_kept = simulate(g, kept).check()
    assert reused_in_place(g, kept) == {5: {2: 1}} and tl_kept.step_bytes[5] == 16 + 4 + 64 + 64
    again = Graph.from_dict(g.to_dict())
    assert again.datas[2].reuses == 1 and again == g and "reuses" not in g.to_dict()["datas"][1]
    bad = g.to_dict()
    bad["datas"][3]["reuses"] = 1  # head does not read x
    with pytest.raises(GraphError, match="written in place of data id 1"):
        Graph.from_dict(bad)
