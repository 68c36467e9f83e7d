"""The Planner widget's Python side: slider and strategy re-plan, export never clobbers."""

from __future__ import annotations

import json
import threading
import time

import pytest
from graphs import training_chain
from test_planfile import tiny_training_graph

import memviz.plans.planning
import memviz.views.widget
from memviz.plans.planning import Plan, budget_frontier, plan
from memviz.views.widget import SHARED, Planner, split_document
from solvers import simulate


def test_planner_from_plan_renders_and_exports(tmp_path):
    p = plan(tiny_training_graph(), frontier=False, packing=False)
    w = Planner(p)
    doc = json.loads(w.plan_json)
    assert doc["schema"] == "memviz.plan/3"
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


def test_export_on_the_default_path_creates_its_folder(tmp_path, monkeypatch):
    """Issue 18 item 5: Export's default path is memviz_export/model_opt.py beside the notebook, a folder
    that does not exist yet; a failure comes back as ok=False with the exception named."""
    monkeypatch.chdir(tmp_path)
    w = Planner(plan(tiny_training_graph(), frontier=False, packing=False))
    assert w.export_path == "memviz_export/model_opt.py" and not (tmp_path / "memviz_export").exists()
    w.export_request += 1
    result = json.loads(w.export_result)
    assert result["ok"], result
    assert (tmp_path / "memviz_export" / "model_opt.plan.json").is_file()
    assert (tmp_path / "memviz_export" / "model_opt.html").is_file()
    (tmp_path / "blocked").write_text("a file where the folder should be")
    w.export_path = "blocked/model_opt.py"
    w.export_request += 1
    failed = json.loads(w.export_result)
    assert not failed["ok"], failed
    assert failed["message"].startswith(("FileExistsError", "NotADirectoryError")), failed


def test_the_output_carries_the_plan_shown_for_a_notebook_without_kernel():
    """Issue 18 item 8: besides the widget view, the Planner's output holds the plan shown (the
    extension draws it when the widget model is gone) and an escaped HTML summary (GitHub, nbviewer)."""
    p = plan(training_chain(16), 0.8, strategy="rotor", time_limit=5)
    p.model["name"] = "<img src=x onerror=alert(1)>"
    w = Planner(p, strategy="rotor", time_limit=5)
    bundle = w._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == w.model_id
    saved = bundle[memviz.views.widget.PLANNER_MIME]
    assert saved["model_id"] == w.model_id
    assert Plan.from_dict(json.loads(json.dumps(saved["plan"]))).peak_bytes == p.peak_bytes
    assert saved["plan"]["frontier"] == p.frontier
    assert "<img" not in bundle["text/html"] and "&lt;img src=x" in bundle["text/html"]
    w.budget_index = 0  # the slider moved: a later display (a saved output) holds the plan shown now
    assert (w._repr_mimebundle_()[memviz.views.widget.PLANNER_MIME]["plan"]["planned"]
            == w.document()["planned"])
    w.close()


def test_a_refined_slider_plan_fits_the_allocator_reserved_peak():
    """Issue 18 item 1 on the slider: on a CUDA device the frontier's own plan is packed, and re-planned
    when the caching allocator would reserve more than the budget."""
    from test_reserved import chain_profile

    w = Planner(chain_profile("fake:h100"), budget=0.9, strategy="rotor", time_limit=5)
    assert w.plan.fits and w.plan.reserved_peak_bytes <= w.plan.budget_bytes
    w.settle_s = 0.0
    w.budget_index = 10  # rotor's frontier plan: 128 MiB live for 135 MiB, but 146 MiB reserved
    w.wait(120)
    assert w.refining == "" and w.plan.packing is not None, w.status
    assert w.plan.budget_bytes == w.plan.frontier[10]["budget_bytes"] and w.plan.strategy == "rotor"
    assert w.plan.fits and w.plan.reserved_peak_bytes <= w.plan.budget_bytes, w.plan.summary()
    w.close()


# --- the slider: frontier plans shown at once, refined in the background ---------------------------
def chain_plan(strategy: str = "rotor"):
    """A training chain whose rotor frontier has 20 distinct budgets (the tiny graph has one)."""
    return plan(training_chain(16), 0.8, strategy=strategy, time_limit=5)


class CountingPlan:
    """Stands in for `memviz.views.widget.plan`: counts the solves and can hold them until released."""

    def __init__(self) -> None:
        self.budgets: list[int] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, source, budget, **kwargs):
        self.budgets.append(budget)
        assert self.release.wait(30)
        return memviz.plans.planning.plan(source, budget, **kwargs)


@pytest.fixture
def solves(monkeypatch):
    counting = CountingPlan()
    monkeypatch.setattr(memviz.views.widget, "plan", counting)
    return counting


def shown_plans(w: Planner) -> list[Plan]:
    """Every plan document the view receives from now on, loaded back (schema + re-simulation)."""
    docs: list[Plan] = []
    w.observe(lambda change: docs.append(Plan.from_dict(w.document())), "plan_json")
    return docs


# --- what travels per plan: the shared members once, the CD-graph on demand, one message per move ----
def test_plan_json_leaves_out_the_shared_members_and_the_cdgraph_until_the_view_needs_it(solves):
    w = Planner(chain_plan(), strategy="rotor", time_limit=5)
    base, first = json.loads(w.plan_base_json), json.loads(w.plan_json)
    assert sorted(base) == sorted(SHARED) and not set(SHARED) & set(first)
    assert "cdgraph" not in first and first["schema"] == "memviz.plan/3"
    full = w.plan.to_dict()
    full["frontier"] = w.plan.frontier
    full.pop("cdgraph")
    assert w.document() == json.loads(json.dumps(full))  # base + plan_json = the plan's document
    w.budget_index = 0  # a frontier plan: its graph, baseline and frontier are the base's
    moved = json.loads(w.plan_json)
    assert not set(SHARED) & set(moved) and moved["planned"] != first["planned"]
    assert len(w.plan_json) < len(w.plan_base_json) / 2  # the base is what made the message large

    sent: list[str] = []
    w.observe(lambda change: sent.append(change["new"]), "plan_json")
    w.view_needs = ["cdgraph"]  # the Graph tab was shown: the same plan again, with its CD-graph
    assert len(sent) == 1 and json.loads(sent[0])["cdgraph"] == w.plan.to_dict()["cdgraph"]
    w.budget_index = 5
    assert "cdgraph" in json.loads(w.plan_json)
    w.view_needs = []
    assert "cdgraph" not in json.loads(w.plan_json) and len(sent) == 3


def test_a_member_unlike_the_base_is_sent():
    base = {"graph": '{"computes":[]}', "frontier": "[]"}
    members = {"schema": '"memviz.plan/1"', "graph": '{"computes":[1]}', "frontier": "[]",
               "cdgraph": '{"dot":""}'}
    assert json.loads(split_document(members, base, frozenset())) == {
        "schema": "memviz.plan/1", "graph": {"computes": [1]}}
    assert "cdgraph" in json.loads(split_document(members, base, frozenset({"cdgraph"})))


def test_a_slider_move_is_one_message(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    w.settle_s = 60.0  # no refinement lands during the test
    messages: list[dict] = []
    w.send_state = lambda key=None: messages.append(w.get_state(key))  # what the comm would send
    w.set_state({"budget_index": 3})  # as the view's message sets it
    assert [sorted(m) for m in messages] == [["plan_json", "refining"]]
    assert messages[0]["refining"].startswith("showing the frontier's rotor plan")
    w.close()


def test_frontier_keeps_each_points_checked_run_out_of_the_json():
    p = chain_plan()
    assert len(p.frontier) == len(p.frontier_points) == 20
    for row, point in zip(p.frontier, p.frontier_points, strict=True):
        timeline = simulate(p.graph, point.result.schedule).check()
        assert row["strategy"] == point.strategy == point.result.stats.solver
        assert row["budget_bytes"] == point.budget_bytes
        assert row["peak_bytes"] == timeline.peak_bytes == point.timeline.peak_bytes <= point.budget_bytes
        assert row["time_overhead"] == pytest.approx(timeline.total_time / p.baseline.total_time)
    assert p.frontier_points[-1].strategy == "none"
    assert p.frontier_points[-1].result.schedule == p.baseline_schedule
    doc = p.to_dict()
    assert "frontier_points" not in doc and doc["frontier"] == p.frontier
    assert budget_frontier(p.graph, p.baseline, time_limit=5) == p.frontier


def test_slider_shows_the_frontier_plan_at_once_then_the_selected_strategys(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    docs = shown_plans(w)
    point, frontier = w.plan.frontier_points[3], w.plan.frontier
    solves.release.clear()  # hold the refinement: what is shown before it must be the frontier's
    w.budget_index = 3
    assert [d.strategy for d in docs] == ["rotor"]
    assert docs[0].schedule == point.result.schedule and docs[0].solver_stats.solver == "rotor"
    assert w.plan.strategy == "rotor" and w.status == ""  # the plan is described by the view, once
    assert w.refining == "showing the frontier's rotor plan; solving with sqrt"
    solves.release.set()
    w.wait(30)
    assert solves.budgets == [point.budget_bytes]
    assert [d.strategy for d in docs] == ["rotor", "sqrt"] and w.refining == ""
    assert docs[1].peak_bytes <= point.budget_bytes and docs[1].packing is not None
    assert w.plan.strategy == "sqrt" and w.status == ""

    w.budget_index = 5
    w.wait(30)
    w.budget_index = 3  # a revisit: the refined plan again, at once, without solving
    assert w.plan.schedule == docs[1].schedule and len(docs) == 5
    assert w.plan.strategy == "sqrt" and w.refining == ""
    w.wait(30)
    assert solves.budgets == [point.budget_bytes, frontier[5]["budget_bytes"]]


def test_frontier_documents_are_encoded_ahead_of_the_slider(solves, monkeypatch):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    w.wait(30)  # the worker encodes every frontier point's plan after the widget is made
    encoded: list[str] = []
    real = Plan.to_dict
    monkeypatch.setattr(Plan, "to_dict", lambda self: encoded.append(self.strategy) or real(self))
    for index in range(len(w.plan.frontier)):
        w.budget_index = index  # first visits: only ready documents are sent
        assert w.plan.frontier_points[index].result.schedule == w.plan.schedule
    assert encoded == []
    w.wait(30)
    assert encoded == ["sqrt"]  # the refined plan where the slider stopped


def test_the_frontiers_own_strategy_is_only_packed_not_solved_again(solves):
    w = Planner(chain_plan(), strategy="rotor", time_limit=5)
    docs = shown_plans(w)
    w.budget_index = 7
    w.wait(30)
    assert solves.budgets == []
    assert [d.strategy for d in docs] == ["rotor", "rotor"]
    assert docs[0].packing is None and docs[1].packing is not None
    assert docs[0].schedule == docs[1].schedule == w.plan.frontier_points[7].result.schedule
    w.budget_index = 8
    w.budget_index = 7
    assert w.plan.packing is not None and w.refining == ""


def test_a_drag_solves_only_where_the_slider_stops(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    frontier = w.plan.frontier
    for index in (2, 4, 6):  # a drag: each index's frontier plan is shown, none is solved yet
        w.budget_index = index
        assert w.plan.strategy == "rotor" and w.plan.budget_bytes == frontier[index]["budget_bytes"]
    w.wait(30)
    assert solves.budgets == [frontier[6]["budget_bytes"]]
    assert w.plan.strategy == "sqrt" and w.plan.budget_bytes == frontier[6]["budget_bytes"]


def test_a_solve_already_started_finishes_into_the_cache_but_is_not_shown(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    w.settle_s = 0.0
    frontier = w.plan.frontier
    solves.release.clear()
    w.budget_index = 2
    while not solves.budgets:  # index 2's solve has started (and is held)
        time.sleep(0.01)
    w.budget_index = 4
    w.budget_index = 6  # 4 is overtaken by 6 before its solve starts
    solves.release.set()
    w.wait(30)
    assert solves.budgets == [frontier[2]["budget_bytes"], frontier[6]["budget_bytes"]]
    assert w.plan.strategy == "sqrt" and w.plan.budget_bytes == frontier[6]["budget_bytes"]
    w.budget_index = 2
    assert w.plan.strategy == "sqrt" and w.refining == ""  # from the cache
    w.wait(30)
    assert len(solves.budgets) == 2


def test_a_loaded_plan_without_frontier_runs_says_it_is_solving(solves, tmp_path):
    p = chain_plan()
    loaded = memviz.plans.planning.load_plan(p.save(tmp_path / "p.plan.json"))
    assert loaded.frontier == p.frontier and loaded.frontier_points == []
    w = Planner(loaded, strategy="sqrt", time_limit=5)
    before = w.plan_json
    solves.release.clear()
    w.budget_index = 4
    budget = loaded.frontier[4]["budget_bytes"]
    assert w.plan_json == before and w.refining == f"solving with sqrt for {budget} B"
    solves.release.set()
    w.wait(30)
    assert w.plan.strategy == "sqrt" and w.refining == ""


def test_close_stops_the_worker(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    w.close()
    w.budget_index = 3  # nothing listens any more: no solve, no error
    assert solves.budgets == []


# --- issue 18 item 4: a typed budget, device presets, cancel, the same plan for the same inputs -------
def test_a_typed_budget_shows_the_fitting_frontier_plan_then_solves_exactly_it(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    frontier = w.plan.frontier
    typed = (frontier[3]["budget_bytes"] + frontier[4]["budget_bytes"]) // 2
    assert frontier[3]["budget_bytes"] < typed < frontier[4]["budget_bytes"]
    solves.release.clear()
    w.budget_index = 6
    w.budget_bytes = typed
    w.budget_request += 1
    # at once: the cheapest frontier plan that fits the typed budget, labelled with it
    assert w.budget_index == -1 and w.plan.budget_bytes == typed
    assert w.plan.schedule == w.plan.frontier_points[3].result.schedule
    assert w.refining == "showing the frontier's rotor plan; solving with sqrt"
    solves.release.set()
    w.wait(30)
    assert solves.budgets[-1] == typed and w.refining == "" and w.status == ""
    assert w.plan.strategy == "sqrt" and w.plan.budget_bytes == typed and w.plan.peak_bytes <= typed
    w.strategy = "rotor"  # another strategy solves the typed budget, not a frontier point's
    w.wait(30)
    assert solves.budgets[-1] == typed and w.plan.strategy == "rotor" and w.plan.budget_bytes == typed
    w.close()


def test_a_typed_budget_below_every_plan_is_an_error_naming_the_minimum(solves):
    w = Planner(chain_plan(), strategy="rotor", time_limit=5)
    shown = w.plan
    w.budget_bytes = 1
    w.budget_request += 1
    w.wait(30)
    assert w.plan is shown and w.refining == ""
    assert w.status.startswith("error: rotor: ") and "smallest feasible budget" in w.status, w.status
    w.budget_bytes = 0
    w.budget_request += 1
    assert w.status.startswith("error: a budget must be a positive number of bytes")
    w.close()


def test_device_capacity_presets_start_with_the_plans_own_device():
    presets = memviz.views.widget.capacity_presets({"name": "cuda:0", "capacity_bytes": 24 << 30})
    assert presets[0] == {"label": "this device (cuda:0)", "bytes": 24 << 30}
    sizes = [p["bytes"] for p in presets[1:]]
    assert sizes == sorted(sizes) and 80 << 30 in sizes and 141 << 30 in sizes
    labels = [p["label"] for p in presets]
    assert len(labels) == len(set(labels))  # aliases (a100 = a100-80gb) once
    unknown = memviz.views.widget.capacity_presets({"name": "cpu", "capacity_bytes": None})
    assert not unknown[0]["label"].startswith("this device")


def test_cancel_leaves_the_shown_plan_and_frees_the_planner_at_once(solves):
    w = Planner(chain_plan(), strategy="sqrt", time_limit=5)
    w.settle_s = 0.0
    solves.release.clear()
    w.budget_index = 3
    while not solves.budgets:  # the sqrt solve has started, and is held
        time.sleep(0.01)
    shown = w.plan
    assert w.refining
    w.cancel_request += 1
    assert w.refining == "" and w.plan is shown
    assert w.status.startswith("cancelled: showing the rotor plan for"), w.status
    w.strategy = "rotor"  # a new request runs at once on a fresh worker while the abandoned solve is held
    w.wait(30)
    assert w.plan.strategy == "rotor" and w.plan.packing is not None and w.refining == ""
    solves.release.set()
    time.sleep(0.5)  # the abandoned solve ends; its plan is never shown
    assert w.plan.strategy == "rotor"
    w.close()


@pytest.mark.slow
def test_rerunning_a_planner_cell_on_the_same_model_plans_the_same_graph():
    """Issue 18 item 4: a second Planner for the same model and inputs (a re-run cell) re-measures op
    times that differ by up to 2x on CPU; it plans with the first times, so its graph is the same, and
    so is its plan: Rockmate bounds its work by counted measures, not by the clock (the time limit is a
    safety cap, not reached here: `Plan.time_cuts` would name where it stopped it).  Not 'auto': on
    this graph that is Checkmate, whose counted MILP work (`checkmate.MILP_CHECKS`) took 60 s for the
    two Planners on a quiet 2-core machine (same plan, no cut): too long for this suite, and near the
    cap under load (its plan then says it may differ between runs)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
                                  for _ in range(6)])
    args = (torch.randn(512, 32),)  # activations well above the parameters: checkmate recomputes
    first = Planner(model, args, budget=0.7, strategy="rockmate", time_limit=60)
    again = Planner(model, args, budget=0.7, strategy="rockmate", time_limit=60)
    assert first.plan.timeline.recomputes > 0
    assert again.profile.graph == first.profile.graph
    assert first.plan.time_cuts == [] and again.plan.time_cuts == []
    assert again.plan.schedule == first.plan.schedule
    # the frontier's budgets, peaks and strategies; not its overheads: they include the fixed step
    # costs each profile measures anew (graph.meta, outside graph equality)
    def points(p: Plan) -> list[tuple]:
        return [(r["budget_bytes"], r["peak_bytes"], r["strategy"]) for r in p.frontier]

    assert points(again.plan) == points(first.plan)
    first.close()
    again.close()


def test_sac_plan_exports_as_apply_by_default(tmp_path):
    """A plan checkpointing runs as it is exports as `memviz.apply` (snippet, plan JSON, report), verified
    by one measured step within the budget; export_as="module" writes the scheduled module instead."""
    import importlib.util

    import torch

    from tests.test_apply import _example

    model, args, prof = _example("gpt")
    w = Planner(prof, budget=0.9, strategy="sac", time_limit=10)
    assert w.plan.strategy == "sac" and w.default_export() == "apply"
    target = tmp_path / "opt.py"
    result = w.export(target)
    assert result["ok"] and result["export_as"] == "apply", result
    assert result["paths"] == [str(target), str(tmp_path / "opt.plan.json"), str(tmp_path / "opt.html")]
    assert result["verified_peak_bytes"] <= w.plan.budget_bytes
    spec = importlib.util.spec_from_file_location("opt", target)
    snippet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippet)
    applied = snippet.applied(model)
    assert applied is not model and any("_memviz_sac" in m.__dict__ for m in applied.modules())
    torch.manual_seed(0)
    assert applied(*args).shape == model(*args).shape
    w.export_as = "module"
    result = w.export(tmp_path / "module.py")
    assert result["ok"] and result["export_as"] == "module", result
    assert "def forward_steps" in (tmp_path / "module.py").read_text()
    w.export_as = "other"
    assert not w.export(tmp_path / "x.py")["ok"]
    w.close()
