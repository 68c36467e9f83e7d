"""CD-graph DOT: structure, fate colors on a rotor plan, collapsed repeats, hostile names escaped."""

from __future__ import annotations

import re

import pytest
from gpt_chain import gpt_graph
from graphs import training_chain

import memviz
from memviz.plans.cdgraph import FATES, cdgraph_dict, compute_fates, dot_escape, legend, repeats, report_html
from memviz.plans.planfile import PlanFileError, validate_document
from solvers import GraphBuilder, Phase
from solvers.result import InfeasibleBudget

# one statement per line: `"id" [k="v", k=v];` or `"a" -> "b";`; values may hold escaped quotes
_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^,\]\s]+)')
_NODE = re.compile(r'^\s*"([^"]+)" \[(.*)\];$')
_EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)";$')


def parse_dot(dot: str) -> tuple[dict[str, dict[str, str]], list[tuple[str, str]]]:
    """Nodes (id -> attributes, quotes stripped) and edges of the DOT text memviz writes; fails on
    any line it cannot account for, so a broken quote shows up as a parse failure."""
    lines = dot.splitlines()
    assert lines[0].startswith("digraph ") and lines[-1] == "}"
    nodes: dict[str, dict[str, str]] = {}
    edges: list[tuple[str, str]] = []
    for line in lines[1:-1]:
        if m := _EDGE.match(line):
            edges.append((m[1], m[2]))
        elif m := _NODE.match(line):
            attrs = {k: v[1:-1] if v.startswith('"') else v for k, v in _ATTR.findall(m[2])}
            rebuilt = ", ".join(f"{k}={v}" for k, v in _ATTR.findall(m[2]))
            assert rebuilt == m[2], f"unparsed attribute text in {line!r}"
            nodes[m[1]] = attrs
        else:
            assert re.match(r"^\s*(graph|node|edge) \[.*\];$", line), f"unexpected DOT line {line!r}"
    return nodes, edges


@pytest.fixture(scope="module")
def rotor_plan():
    g = training_chain(8, sizes=[64] * 8)
    return memviz.plan(g, 0.6, strategy="rotor", frontier=False, packing=False)


def test_expanded_dot_structure_and_recompute_colors(rotor_plan):
    g = rotor_plan.graph
    nodes, edges = parse_dot(cdgraph_dict(rotor_plan)["dot"])
    assert set(nodes) == {f"c{c.id}" for c in g.computes} | {f"d{d.id}" for d in g.datas}
    assert all(attrs["id"] == nid for nid, attrs in nodes.items())
    expected = {(f"d{i}", f"c{c.id}") for c in g.computes for i in c.inputs}
    expected |= {(f"c{c.id}", f"d{o}") for c in g.computes for o in c.outputs}
    assert set(edges) == expected
    runs = [s.node for s in rotor_plan.schedule if s.op == "compute"]
    recomputed = {c for c in set(runs) if runs.count(c) > 1}
    assert recomputed, "the 60% rotor plan must recompute something"
    for c in g.computes:
        attrs = nodes[f"c{c.id}"]
        want = "recomputed" if c.id in recomputed else "kept"
        assert attrs["class"] == want and attrs["fillcolor"] == FATES[want][0] and attrs["shape"] == "box"
    for d in g.datas:
        attrs = nodes[f"d{d.id}"]
        assert attrs["shape"] == "ellipse"
        if d.kind.value == "parameter":
            assert attrs["class"] == "parameter"
        elif d.producer in recomputed and d.kind.value in ("activation", "saved"):
            assert attrs["class"] == "freed_early" and attrs["fillcolor"] == FATES["freed_early"][0]
        elif d.kind.value == "gradient":
            assert attrs["class"] == "gradient"


def test_eager_plan_has_no_recompute():
    g = training_chain(4)
    plan = memviz.plan(g, None, frontier=False, packing=False)
    assert set(compute_fates(g, plan.schedule).values()) == {"kept"}


def test_collapsed_dot_groups_identical_layers():
    g = gpt_graph(4, seq=16, hidden=32)
    with pytest.raises(InfeasibleBudget) as info:  # plan at rotor's own minimum: most layers recompute
        memviz.plan(g, 0.1, strategy="rotor", frontier=False, packing=False)
    plan = memviz.plan(g, info.value.minimum_bytes, strategy="rotor", frontier=False, packing=False)
    cd = cdgraph_dict(plan)
    assert cd["nodes"] == len(g.computes) + len(g.datas)
    nodes, edges = parse_dot(cd["collapsed_dot"])
    runs = [n for n in nodes if n.startswith("b")]
    assert len(runs) == 1 and "block x 4" in nodes[runs[0]]["label"]
    assert nodes[runs[0]]["class"] == "recomputed"
    assert len(nodes) < len(g.computes) // 4
    # the run is connected to the rest of the graph on both sides, and no edge is a self loop
    assert any(b == runs[0] for _, b in edges) and any(a == runs[0] for a, _ in edges)
    assert all(a != b for a, b in edges)
    assert set(a for e in edges for a in e) <= set(nodes)


def test_repeats_finds_periods():
    assert repeats([0, 1, 2, 1, 2, 1, 2, 3]) == [(1, 2, 3)]
    assert repeats([0, 1, 1, 1, 2, 2]) == [(1, 1, 3), (4, 1, 2)]
    assert repeats([0, 1, 2, 3]) == []


def test_chain_without_repeats_has_no_collapsed_view():
    g = training_chain(3, sizes=[8, 16, 32])
    plan = memviz.plan(g, None, frontier=False, packing=False)
    assert cdgraph_dict(plan)["collapsed_dot"] is None


HOSTILE = '<img src=x onerror=alert(1)>"];evil'


def hostile_graph():
    b = GraphBuilder(HOSTILE)
    x = b.data(HOSTILE, 32, "input")
    w = b.data("w\\N\nx", 8, "parameter")
    a = b.data("a & b", 64, "saved")
    y = b.data("y", 4, "output")
    ga = b.data("ga", 64, "gradient")
    gw = b.data("gw", 8, "parameter_gradient")
    b.compute(HOSTILE, [x, w], [a], time=1.0, module=HOSTILE, source=HOSTILE)
    b.compute("loss", [a], [y], time=1.0)
    b.compute("bwd", [a, y], [ga], time=1.0, phase=Phase.BACKWARD)
    b.compute("bw", [ga, x], [gw], time=1.0, phase=Phase.BACKWARD)
    b.outputs = [y, gw]
    return b.build()


def test_hostile_names_are_escaped():
    plan = memviz.plan(hostile_graph(), None, frontier=False, packing=False)
    dot = cdgraph_dict(plan)["dot"]
    nodes, edges = parse_dot(dot)  # a name that broke out of its quotes would fail here
    assert len(nodes) == 10 and len(edges) == 11
    assert "<img" not in dot and dot.count('"];evil') == dot.count('\\"];evil') > 0
    label = nodes["c0"]["label"]
    assert label == '&lt;img src=x onerror=alert(1)&gt;\\"];evil'
    assert nodes["d1"]["label"].startswith("w\\\\N\\nx")  # backslash doubled, newline a DOT \n
    assert "&amp; b" in nodes["d2"]["label"]
    assert dot_escape('a"b') == 'a\\"b'
    frag = report_html(plan)
    assert "<img" not in frag and "&amp;lt;img" in frag  # DOT text, HTML-escaped once more


def test_plan_document_carries_cdgraph_and_old_files_load(rotor_plan):
    doc = rotor_plan.to_dict()
    assert set(doc["cdgraph"]) == {"dot", "collapsed_dot", "nodes"}
    validate_document(doc)
    old = {k: v for k, v in doc.items() if k != "cdgraph"}
    validate_document(old)  # plan files written before the field existed still load
    with pytest.raises(PlanFileError, match="cdgraph|dot"):
        validate_document({**doc, "cdgraph": {"dot": 3, "collapsed_dot": None}})


def test_legend_lists_every_fate_once():
    rows = legend()
    assert [r["fate"] for r in rows] == list(FATES)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", r["color"]) for r in rows)


def test_bad_input_says_what_to_pass():
    with pytest.raises(TypeError, match="Plan or a plan dict"):
        cdgraph_dict(42)
    with pytest.raises(ValueError, match="Plan.to_dict"):
        cdgraph_dict({"graph": {}})
