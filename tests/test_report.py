"""The offline report: self-contained (no network), all views present, untrusted names escaped."""

from __future__ import annotations

import re

import pytest

import memviz
from memviz.report import fragmentation_series, memory_figure, packing_figure, render_html, write_report
from solvers import GraphBuilder, Phase

HOSTILE = "<img src=x onerror=alert(1)>"


def hostile_graph():
    b = GraphBuilder(HOSTILE)
    w = b.data(HOSTILE, 1 << 20, "parameter")
    x = b.data("x", 1 << 18, "input")
    a = b.data("</script><script>alert(2)</script>", 1 << 21, "saved")
    loss = b.data("loss", 4, "output")
    gw = b.data("gw", 1 << 20, "parameter_gradient")
    b.compute(HOSTILE, [x, w], [a], time=1.0, module=HOSTILE, source="evil.py:1")
    b.compute("loss", [a], [loss], time=0.1)
    b.compute("back", [a, loss, x], [gw], time=2.0, phase=Phase.BACKWARD)
    b.outputs = [loss, gw]
    return b.build()


def test_report_escapes_untrusted_names_and_needs_no_network(tmp_path):
    plan = memviz.plan(hostile_graph(), frontier=False, packing=False)
    text = render_html(plan.to_dict())
    assert HOSTILE not in text
    assert "<script>alert(2)" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text  # shown, as text
    # no external resource of any kind: scripts, styles and images are all inline
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)\s*=\s*["']?https?:""", text)
    assert text.count("Plotly.newPlot") >= 1
    path = write_report(plan, tmp_path / "r.html")
    with pytest.raises(FileExistsError):
        write_report(plan, path)


def test_report_has_summary_and_breakdown_at_peak():
    plan = memviz.plan(hostile_graph(), frontier=False, packing=False)
    text = render_html(plan.to_dict())
    assert "planned peak" in text and "at the planned peak" in text
    assert "parameters 1.00 MiB" in text


def test_memory_figure_stacks_the_allocator_fragmentation_up_to_what_it_reserves():
    doc = memviz.plan(hostile_graph(), frontier=False).to_dict()
    reserved = doc["packing"]["allocator"]["reserved"]
    layers = [t for t in memory_figure(doc)["data"] if t.get("stackgroup") == "plan"]
    assert layers[-1]["name"] == "fragmentation (allocator)"
    for i, top in enumerate(reserved):
        assert sum(t["y"][i] for t in layers) == pytest.approx(top / 2**20)
    # the simulated allocator rounds up to whole segments: it reserves more than is live here
    assert any(fragmentation_series(doc))
    assert all(t["type"] == "scatter" for t in packing_figure(doc)["data"])


def test_memory_figure_has_no_fragmentation_layer_without_allocator_steps():
    doc = memviz.plan(hostile_graph(), frontier=False, packing=False).to_dict()
    assert fragmentation_series(doc) is None
    names = [t["name"] for t in memory_figure(doc)["data"]]
    assert "fragmentation (allocator)" not in names
