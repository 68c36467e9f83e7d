"""The Planner widget's Python side: slider and strategy re-plan, export never clobbers."""

from __future__ import annotations

import json

from test_planfile import tiny_training_graph

from memviz.planning import plan
from memviz.widget import Planner


def test_planner_from_plan_renders_and_exports(tmp_path):
    p = plan(tiny_training_graph(), frontier=False, packing=False)
    w = Planner(p)
    doc = json.loads(w.plan_json)
    assert doc["schema"] == "memviz.plan/1"
    assert doc["planned"]["timeline"]["peak_bytes"] == p.peak_bytes
    target = tmp_path / "opt.py"
    first = w.export(target)
    assert first["ok"], first
    second = w.export(target)
    assert not second["ok"] and "confirm to overwrite" in second["message"]
    (tmp_path / "opt.plan.json").write_text("user data")
    assert not w.export(target)["ok"]
    assert (tmp_path / "opt.plan.json").read_text() == "user data"


def test_export_request_trait_reports_back(tmp_path):
    w = Planner(plan(tiny_training_graph(), frontier=False, packing=False))
    w.export_path = str(tmp_path / "m.py")
    w.export_request += 1
    result = json.loads(w.export_result)
    assert result["ok"] and any(path.endswith("m.plan.json") for path in result["paths"])
