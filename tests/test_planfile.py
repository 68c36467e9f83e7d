"""Plan JSON: round trip, schema, and hostile/malformed files rejected with a clear error."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memviz
from memviz.budget import parse_budget
from memviz.planfile import PlanFileError, parse_document, read_document
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
    with pytest.raises(PlanFileError, match="not a memviz.plan/1"):
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
