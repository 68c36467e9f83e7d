"""Plan JSON: round trip, schema, and hostile/malformed files rejected with a clear error."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memviz
from memviz.budget import parse_budget
from memviz.plans.planfile import PlanFileError, parse_document, read_document
from solvers import GraphBuilder, Phase


def tiny_training_graph():
    b = GraphBuilder("tiny")
    w = b.data("w", 64, "parameter")
    x = b.data("x", 32, "input")
    a1 = b.data("a1", 128, "saved")
    a2 = b.data("a2", 128, "saved")
    loss = b.data("loss", 4, "output")
    g2 = b.data("g2", 128, "gradient")
    g1 = b.data("g1", 128, "gradient")
    gw = b.data("gw", 64, "parameter_gradient")
    b.compute("f1", [x, w], [a1], time=1.0, module="layer1", source="model.py:10")
    b.compute("f2", [a1, w], [a2], time=1.0, module="layer2")
    b.compute("loss", [a2], [loss], time=0.1)
    b.compute("b2", [a2, loss], [g2], time=1.0, phase=Phase.BACKWARD)
    b.compute("b1", [g2, a1], [g1], time=1.0, phase=Phase.BACKWARD)
    b.compute("bw", [g1, x], [gw], time=1.0, phase=Phase.BACKWARD)
    b.outputs = [loss, gw]
    return b.build()


@pytest.fixture()
def doc():
    return memviz.plan(tiny_training_graph(), frontier=False, packing=False).to_dict()


def test_round_trip(tmp_path, doc):
    plan = memviz.plan(tiny_training_graph(), frontier=False, packing=False)
    path = plan.save(tmp_path / "plan.json")
    loaded = memviz.load_plan(path)
    assert loaded.graph == plan.graph
    assert loaded.schedule == plan.schedule
    assert loaded.peak_bytes == plan.peak_bytes
    assert loaded.baseline.peak_bytes == plan.baseline.peak_bytes


def test_module_classes_round_trip(tmp_path):
    """Version 2 carries the graph's module classes (path -> class name) through a plan file."""
    graph = tiny_training_graph()
    classes = {"": "tiny.Net", "layer1": "torch.nn.modules.linear.Linear",
               "layer2": "<img src=x onerror=alert(1)>"}
    graph = dataclasses.replace(graph, meta={**graph.meta, "module_classes": classes})
    doc = memviz.plan(graph, frontier=False, packing=False).to_dict()
    assert doc["schema"] == "memviz.plan/3" and doc["graph"]["meta"]["module_classes"] == classes
    loaded = memviz.load_plan(memviz.plan(graph, frontier=False, packing=False).save(tmp_path / "p.json"))
    assert loaded.graph.meta["module_classes"] == classes


def test_a_version_1_file_still_loads(tmp_path, doc):
    """A plan written before module classes (schema memviz.plan/1, no meta.module_classes) loads as is."""
    assert "module_classes" not in doc["graph"]["meta"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps({**doc, "schema": "memviz.plan/1"}))
    loaded = memviz.load_plan(path)
    assert loaded.peak_bytes == doc["planned"]["timeline"]["peak_bytes"]
    assert "module_classes" not in loaded.graph.meta


def test_a_module_class_must_be_a_string(doc):
    doc["graph"]["meta"]["module_classes"] = {"layer1": 3}
    with pytest.raises(PlanFileError, match="graph/meta/module_classes/layer1"):
        parse_document(json.dumps(doc))


def test_save_never_clobbers(tmp_path):
    plan = memviz.plan(tiny_training_graph(), frontier=False, packing=False)
    target = tmp_path / "plan.json"
    target.write_text("my notes")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        plan.save(target)
    assert target.read_text() == "my notes"
    assert os.listdir(tmp_path) == ["plan.json"]  # no temporary left behind
    plan.save(target, overwrite=True)
    assert memviz.load_plan(target).peak_bytes == plan.peak_bytes


def test_truncated_file_is_rejected(tmp_path, doc):
    text = json.dumps(doc)
    for cut in (0, 1, len(text) // 3, len(text) - 1):
        path = tmp_path / f"cut{cut}.json"
        path.write_text(text[:cut])
        with pytest.raises(PlanFileError, match="not valid JSON|not a memviz"):
            read_document(path)


def test_tampered_timeline_is_rejected(doc):
    doc["planned"]["timeline"]["peak_bytes"] -= 1
    with pytest.raises(PlanFileError, match="does not match a simulation"):
        parse_document(json.dumps(doc))


def test_invalid_schedule_is_rejected(doc):
    doc["planned"]["schedule"] = doc["planned"]["schedule"][1:]
    with pytest.raises(PlanFileError):
        parse_document(json.dumps(doc))


def test_wrong_schema_and_hostile_values(doc):
    with pytest.raises(PlanFileError, match="not a memviz.plan/3"):
        parse_document(json.dumps({**doc, "schema": "memviz.plan/999"}))
    with pytest.raises(PlanFileError, match="not valid JSON"):
        parse_document(json.dumps(doc).replace('"total_time": ', '"total_time": NaN, "x": ', 1))
    bad = json.loads(json.dumps(doc))
    bad["graph"]["datas"][0]["producer"] = 10**9
    with pytest.raises(PlanFileError):
        parse_document(json.dumps(bad))
    with pytest.raises(PlanFileError):
        parse_document("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PlanFileError):
        parse_document(b"\xff\xfe garbage")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_documents_load_or_fail_cleanly(doc, data):
    """Replace any sub-tree with arbitrary JSON: the loader either accepts a document that still
    re-simulates to its recorded numbers, or raises PlanFileError -- never anything else."""
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    mutated = json.loads(json.dumps(doc))
    node = mutated
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(json_values)
    try:
        loaded = parse_document(json.dumps(mutated))
    except PlanFileError:
        return
    plan = memviz.Plan.from_dict(loaded)
    assert plan.timeline.valid and plan.baseline.valid


@given(st.binary(max_size=200))
@settings(max_examples=100, deadline=None)
def test_random_bytes_fail_cleanly(blob):
    with pytest.raises(PlanFileError):
        parse_document(blob)


def test_budget_spellings():
    assert parse_budget(1000, 10) == 1000
    assert parse_budget("1.5GiB", 10) == int(1.5 * 2**30)
    assert parse_budget("800MB", 10) == 800_000_000
    assert parse_budget("50%", 1000) == 500
    assert parse_budget(0.25, 1000) == 250
    for bad in ("lots", "5 parsecs", "0%", "150%", 1.5, 0.0, -3, True):
        with pytest.raises((ValueError, TypeError)):
            parse_budget(bad, 1000)


def _parsed(loads, text):
    """What `loads` makes of `text`: ("ok", repr of the value, the types inside) or ("error", its type)."""
    try:
        value = loads(text)
    except (ValueError, RecursionError) as exc:
        return ("error", "RecursionError" if isinstance(exc, RecursionError) else "ValueError")
    return ("ok", repr(value))


#: JSON texts that are hard for a parser: integers beyond 64 bits, floats out of range or at the edge of
#: double precision, escapes of lone and paired surrogates, NUL, non-standard constants, a BOM, and
#: things json.loads refuses (leading zeros, trailing commas, raw control characters)
_HARD_JSON = ["1" * 400, "-1" + "0" * 30, "18446744073709551616", "-9223372036854775809", "1e999",
              "-1e999", "1e-400", "4.9406564584124654e-324", "2.2250738585072011e-308", "0.1e1",
              "1.7976931348623157e308", "123456789012345678901234567890.5e-10", '"\\ud800"', '"\\udc00x"',
              '"\\ud83d\\ude00"', '"\\u0000"', '"\x00"', "NaN", "Infinity", "-Infinity", "\ufeff[1]", "01",
              "[1,]", '{"a":1,}', '"\n"', "1.", ".5", "+1", '{"a":1,"b":2,"a":3}', "[" * 5000 + "]" * 5000,
              "[] x", " [ 1 , 2 ] ", "\t\r\n1", "\u00a01", "tru", '"\\x"', '"é"', '"\u2028"']


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.sampled_from(_HARD_JSON),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                             max_size=4),
                 max_leaves=12).map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.tuples(st.sampled_from(_HARD_JSON), st.integers(0, 40), st.text(max_size=2)).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]),  # broken texts
), st.booleans())
def test_plan_json_is_parsed_as_json_loads_parses_it(text, as_bytes):
    """memviz parses plan files with msgspec's decoder (twice as fast as json on a 100k-step plan), and
    with json.loads whatever msgspec refuses: the result is json.loads's (NaN and Infinity refused) on
    every text, the value or the kind of error."""
    from memviz.plans.planfile import _loads, _reject_constant

    if as_bytes:
        try:
            text = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: not UTF-8
            text = text.encode("utf-8", "surrogatepass")
    assert _parsed(_loads, text) == _parsed(lambda t: json.loads(t, parse_constant=_reject_constant), text)


def test_a_plan_file_is_parsed_without_json_loads(tmp_path, monkeypatch):
    import memviz.plans.planfile as planfile

    path = memviz.plan(tiny_training_graph(), frontier=False, packing=False).save(tmp_path / "plan.json")

    def refuse(*args, **kwargs):
        raise AssertionError("json.loads: the slower parser")

    monkeypatch.setattr(planfile.json, "loads", refuse)
    assert memviz.load_plan(path).peak_bytes > 0


def test_a_loaded_plan_goes_to_the_oldest_gc_generation(tmp_path):
    """Loading pauses the cyclic GC, then moves what it made to the oldest generation at once (a young
    collection would walk the whole plan); a program's own frozen objects stay frozen."""
    import gc

    path = memviz.plan(tiny_training_graph(), frontier=False, packing=False).save(tmp_path / "plan.json")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    plan = memviz.load_plan(path)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert any(o is plan.graph for o in gc.get_objects(generation=2))
    mine: list = []
    gc.freeze()
    try:
        plan = memviz.load_plan(path)
        assert gc.isenabled() and gc.get_freeze_count() > 0
        assert not any(o is mine for o in gc.get_objects())  # still frozen (the three generations lack it)
    finally:
        gc.unfreeze()


def test_solvers_plan_without_cyclic_collection(monkeypatch):
    """memviz.plan's solve and minimum_budget run the solvers with the cyclic GC paused (`gc_paused`: the
    schedules they build would make each collection rescan the profile's heap), and turn it back on."""
    import gc

    from memviz.plans import planning

    seen: list[bool] = []
    solve = planning.solve_checked

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return solve(*args, **kwargs)

    monkeypatch.setattr(planning, "solve_checked", spy)
    graph = tiny_training_graph()
    low = planning.minimum_budget(graph, "rotor")
    memviz.plan(graph, max(low, graph.persistent_bytes() + 1), strategy="rotor", frontier=False,
                packing=False)
    assert len(seen) >= 2 and not any(seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_version_2_file_loads_without_autocast_regions(tmp_path, doc):
    """Version 3 added ``graph.meta.autocast``; a version 2 file has none, and loads as one whose
    verifying step runs in the caller's autocast state (None), as before."""
    from memviz.hardware.accelerator import autocast_from_json

    path = tmp_path / "v2.json"
    path.write_text(json.dumps({**doc, "schema": "memviz.plan/2"}))
    loaded = memviz.load_plan(path)
    assert autocast_from_json(loaded.graph.meta.get("autocast")) is None


def test_an_autocast_region_must_name_a_dtype(doc):
    doc["graph"]["meta"]["autocast"] = [["cpu", "int8"]]
    with pytest.raises(PlanFileError, match="graph/meta/autocast"):
        parse_document(json.dumps(doc))
