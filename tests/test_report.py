"""The offline report: self-contained (no network), all views present, untrusted names escaped."""

from __future__ import annotations

import re

import pytest

import memviz
from memviz.report import render_html, write_report
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
