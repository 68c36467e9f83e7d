"""The compiled predicates of `memviz.plans.schema_fast` agree with jsonschema on plan documents whose arrays
are long enough to take the fast path (issue 17 item 4: validation in linear time)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memviz
from memviz.plans.planfile import PlanFileError, check_values, parse_document, plan_schema
from memviz.plans.schema_fast import MIN_ITEMS, stripped
from solvers import DataKind, GraphBuilder, Phase


def _chain_doc(n: int = 32, packing: bool = True) -> dict:
    b = GraphBuilder("chain")
    acts = [b.data("x", 64, DataKind.INPUT)]
    weights = []
    for i in range(n):
        weights.append(b.data(f"w{i}", 16, DataKind.PARAMETER))
        acts.append(b.data(f"a{i}", 64))
        b.compute(f"f{i}", [acts[-2], weights[-1]], [acts[-1]], phase=Phase.FORWARD, time=1.0)
    grad = b.data("loss", 4, DataKind.OUTPUT)
    b.compute("loss", [acts[-1]], [grad], phase=Phase.FORWARD)
    outputs = [grad]
    for i in reversed(range(n)):
        g_in, g_w = b.data(f"da{i}", 64, DataKind.GRADIENT), b.data(f"dw{i}", 16, DataKind.PARAMETER_GRADIENT)
        b.compute(f"b{i}", [grad, acts[i], weights[i]], [g_in, g_w], phase=Phase.BACKWARD, time=2.0)
        outputs.append(g_w)
        grad = g_in
    b.outputs = outputs
    plan = memviz.plan(b.build(), frontier=False, packing=packing)
    return json.loads(json.dumps(plan.to_dict()))


@pytest.fixture(scope="module")
def doc() -> dict:
    return _chain_doc()


def _long_arrays(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _long_arrays(v, (*path, k))
    elif isinstance(obj, list) and len(obj) >= MIN_ITEMS:
        yield path, obj


def _verdict(document) -> tuple | None:
    """What loading says of `document` before the graph: the value check's error (it names the JSON path),
    else jsonschema's first error and its path, else None."""
    try:
        check_values(document)
    except PlanFileError as exc:
        return ("values", str(exc))
    validator = jsonschema.Draft202012Validator(plan_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    return None if error is None else ("schema", tuple(error.absolute_path), error.validator)


def test_valid_document_has_its_long_arrays_emptied(doc):
    arrays = dict(_long_arrays(doc))
    assert {("graph", "computes"), ("graph", "datas"), ("planned", "schedule"), ("packing", "buffers"),
            ("planned", "timeline", "by_category", "activations")} <= set(arrays)
    light = stripped(doc, plan_schema())
    assert not dict(_long_arrays(light))  # every long array was checked by a predicate
    assert _verdict(light) is None and _verdict(doc) is None
    assert len(doc["graph"]["computes"]) > MIN_ITEMS  # the document itself is left as it was


#: values the value check refuses (beyond 64 bits, not finite, NUL, lone surrogate) or that are edge cases
#: of the column checks (1e300: a valid float their conservative bound refuses; -0.0; a whole float)
_EDGES = [10**400, -(10**400), 1 << 63, (1 << 63) - 1, -(1 << 63), 1 << 64, float("inf"), float("-inf"),
          float("nan"), 1e300, -0.0, 0.0, "a\x00b", "\ud800", "\udc00x", "é", "\u2028", "", [[]], [{}]]
json_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 2.5, -1.0, 1 << 40]),
    st.text(max_size=3), st.sampled_from(["compute", "free", "forward", "activation"]),
    st.lists(st.integers(-1, 3), max_size=3), st.sampled_from(_EDGES),
    st.lists(st.sampled_from(_EDGES), max_size=2),
    st.dictionaries(st.sampled_from(["id", "x", "a\x00", "\ud800"]), st.integers(0, 2)),
)


def _leaf_paths(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaf_paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaf_paths(v, (*path, i))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stripped_document_gets_the_same_verdict(doc, data):
    """Any value inside a long array (or an item of one) replaced by arbitrary JSON, a key added to or
    removed from an item, or an item appended: the value check and jsonschema say the same of the
    stripped copy as of the whole document (the same first error, at the same path)."""
    arrays = [p for p, _ in _long_arrays(doc)]
    base = data.draw(st.sampled_from(arrays))
    node = doc
    for key in base:
        node = node[key]
    index = data.draw(st.integers(0, len(node) - 1))
    paths = [(*base, index, *p) for p in _leaf_paths(node[index])]
    path = data.draw(st.sampled_from(paths))
    mutated = json.loads(json.dumps(doc))
    target = mutated
    for key in path[:-1]:
        target = target[key]
    how = data.draw(st.sampled_from(["set", "set", "add key", "delete", "append"]))
    if how == "append":
        target = mutated
        for key in base:
            target = target[key]
        target.append(data.draw(json_values))
    elif how == "add key" and isinstance(target[path[-1]], dict):
        key = data.draw(st.sampled_from(["x", "module", "a\x00", "\ud800"]))
        target[path[-1]][key] = data.draw(json_values)
    elif how == "delete" and len(path) > len(base) + 1:
        del target[path[-1]]
    else:
        target[path[-1]] = data.draw(json_values)
    assert _verdict(stripped(mutated, plan_schema())) == _verdict(mutated)
    try:  # and loading it (graph, schedules, simulation: their fast paths too) is a plan or a clean error
        memviz.Plan.from_dict(mutated)
    except PlanFileError:
        pass


@pytest.mark.parametrize(("where", "value"), [
    ("planned/timeline/step_bytes/70", 10**400), ("graph/datas/70/name", "a\x00"),
    ("graph/computes/40/time", float("inf")), ("graph/computes/40/op", "\ud800"),
    ("planned/schedule/70/1", 1 << 64), ("graph/datas/70/aliases", ["\udfff"]),
])
def test_bad_value_in_a_long_array_keeps_it_for_the_value_check(doc, where, value):
    """A value the schema accepts but no writer can take back (an integer beyond 64 bits is an integer)
    keeps its array in the stripped copy, so the value check still finds it and names its path."""
    mutated = json.loads(json.dumps(doc))
    *parents, last = [int(k) if k.isdigit() else k for k in where.split("/")]
    target = mutated
    for key in parents:
        target = target[key]
    target[last] = value
    with pytest.raises(PlanFileError, match=f"at {where}"):
        check_values(stripped(mutated, plan_schema()))


def test_bad_item_deep_in_a_long_array_is_named(doc):
    mutated = json.loads(json.dumps(doc))
    mutated["graph"]["datas"][70]["bytes"] = -1
    with pytest.raises(PlanFileError, match="graph/datas/70/bytes"):
        parse_document(json.dumps(mutated))


def _values(obj) -> int:
    if isinstance(obj, dict):
        return 1 + sum(_values(v) for v in obj.values())
    if isinstance(obj, list):
        return 1 + sum(_values(v) for v in obj)
    return 1


def test_jsonschema_sees_a_document_of_constant_size():
    """What is left to jsonschema does not grow with the plan: its work is constant, the predicates linear."""
    small, large = _chain_doc(64, packing=False), _chain_doc(320, packing=False)
    assert _values(large) > 4 * _values(small)
    assert _values(stripped(large, plan_schema())) == _values(stripped(small, plan_schema()))


def _rebuilt(graph: dict, kept: dict):
    """The graph built from the columns the schema check kept, and from the items themselves (the
    error, where building fails)."""
    from solvers import Graph

    def outcome(build):
        try:
            return build()
        except Exception as exc:  # noqa: BLE001 -- the exact error is what is compared
            return (type(exc), str(exc))

    return (outcome(lambda: Graph.from_dict(graph, columns=kept)), outcome(lambda: Graph.from_dict(graph)))


def test_kept_columns_build_what_the_items_build(doc):
    """`stripped(..., columns=)` keeps each long array's columns as the check read them; the graph and the
    schedules built from them equal those built from the items, an optional key left out of every item
    takes its default, and an array whose items have different keys keeps nothing (read item by item)."""
    from solvers.schedule import steps_from_columns, steps_from_json

    columns: dict = {}
    stripped(doc, plan_schema(), columns=columns)
    assert {("graph", "computes"), ("graph", "datas"), ("baseline", "schedule"),
            ("planned", "schedule")} <= set(columns)
    assert columns[("graph", "datas")]["name"] == tuple(d["name"] for d in doc["graph"]["datas"])
    for run in ("baseline", "planned"):
        kept = columns[(run, "schedule")]
        assert steps_from_columns(kept[0], kept[1]) == steps_from_json(doc[run]["schedule"])
    kept = {k: columns[("graph", k)] for k in ("computes", "datas")}
    built, read = _rebuilt(doc["graph"], kept)
    assert built == read and len(read.computes) > MIN_ITEMS

    mutated = json.loads(json.dumps(doc))
    for c in mutated["graph"]["computes"]:
        c["block"], c["flops"] = 3, 2.0
        del c["source"]  # left out of every item: the default
    mutated["graph"]["computes"][5]["module"] = "changed"
    del mutated["graph"]["datas"][7]["dtype"]  # left out of one item only
    columns = {}
    stripped(mutated, plan_schema(), columns=columns)
    assert "source" not in columns[("graph", "computes")] and ("graph", "datas") not in columns
    built, read = _rebuilt(mutated["graph"], {"computes": columns[("graph", "computes")]})
    assert built == read and read.computes[5].module == "changed" and read.computes[9].block == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kept_columns_agree_with_the_items_under_mutation(doc, data):
    """A value of a graph item replaced, a key added or removed: where the check keeps columns, the graph
    built from them is the graph (or the error) built from the items."""
    mutated = json.loads(json.dumps(doc))
    which = data.draw(st.sampled_from(["computes", "datas"]))
    items = mutated["graph"][which]
    item = items[data.draw(st.integers(0, len(items) - 1))]
    key = data.draw(st.sampled_from(sorted(item) + ["extra"]))
    how = data.draw(st.sampled_from(["set", "delete", "delete everywhere"]))
    if how == "set" or key == "extra":
        item[key] = data.draw(json_values)
    elif how == "delete":
        del item[key]
    else:
        for other in items:
            other.pop(key, None)
    columns: dict = {}
    stripped(mutated, plan_schema(), columns=columns)
    kept = {k: columns[("graph", k)] for k in ("computes", "datas") if ("graph", k) in columns}
    built, read = _rebuilt(mutated["graph"], kept)
    assert built == read
