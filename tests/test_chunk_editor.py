"""memviz.ChunkEditor: edits re-estimate through ChunkPlan.with_chunks, illegal edits name the op, export
never clobbers."""

from __future__ import annotations

import json

import pytest
import torch

from examples.models import GPT
from memviz.plans.chunking import plan_chunks
from memviz.views.chunk_editor import ChunkEditor
from solvers import autochunk as ac


@pytest.fixture(scope="module")
def chunk_plan():
    torch.manual_seed(0)
    model = GPT(vocab=64, seq=128, d=64, heads=4, layers=1, dropout=0.0).eval()
    x = torch.randint(0, 64, (1, 128))
    return plan_chunks(model, (x,), 0.4, speed=ac.SpeedModel())


def test_document_shows_curve_and_regions(chunk_plan):
    ed = ChunkEditor(chunk_plan)
    doc = json.loads(ed.doc_json)
    assert len(doc["nodes"]) == len(doc["baseline"]) == len(doc["chunked"])
    assert doc["regions"], "the 40% budget needs at least one region"
    assert max(doc["chunked"]) == doc["estimate"]["achieved_bytes"] < doc["estimate"]["baseline_peak_bytes"]
    for r in doc["regions"]:
        assert 0 <= r["x0"] <= r["x1"] < len(doc["nodes"])
        assert doc["nodes"][r["x0"]]["name"] == r["start"]


def test_editing_chunk_count_changes_estimate(chunk_plan):
    ed = ChunkEditor(chunk_plan)
    before = json.loads(ed.doc_json)["estimate"]
    regions = json.loads(ed.regions_json)
    ed.regions_json = json.dumps([dict(r, chunks=2) for r in regions])  # what the view sends
    after = json.loads(ed.doc_json)
    assert ed.error == ""
    assert [r["chunks"] for r in after["regions"]] == [2] * len(regions)
    assert after["estimate"]["achieved_bytes"] > before["achieved_bytes"]
    assert after["estimate"]["achieved_bytes"] == ed.plan.peak_bytes


def test_illegal_edit_names_the_op_and_keeps_the_plan(chunk_plan):
    ed = ChunkEditor(chunk_plan)
    doc_before = ed.doc_json
    region = next(c for c in chunk_plan.chunks if any(chunk_plan.graph[n].op == "softmax" for n in c["dims"]))
    softmax = next(n for n in region["dims"] if chunk_plan.graph[n].op == "softmax")
    edited = dict(region, dims={**region["dims"], softmax: 3})
    with pytest.raises(ValueError, match="softmax"):
        ed.edit([edited])
    ed.regions_json = json.dumps([{**{k: region[k] for k in ("start", "end", "chunks")},
                                   "outputs": {o: 99 for o in region["outputs"]}}])
    assert ed.error and "chunk" in ed.error
    assert ed.doc_json == doc_before


def test_export_never_clobbers(chunk_plan, tmp_path):
    ed = ChunkEditor(chunk_plan)
    target = tmp_path / "chunked.py"
    first = ed.export(target)
    assert first["ok"], first
    text = target.read_text()
    assert "for " in text  # the chunk loops are readable code
    target.write_text("# mine")
    second = ed.export(target)
    assert not second["ok"] and str(target) in second["exists"]
    assert target.read_text() == "# mine"
    ed.export_path, ed.export_overwrite = str(target), True
    ed.export_request += 1
    assert json.loads(ed.export_result)["ok"] and target.read_text() != "# mine"


def test_moving_an_edge_revalidates_the_region(chunk_plan):
    ed = ChunkEditor(chunk_plan)
    doc = json.loads(ed.doc_json)
    regions = json.loads(ed.regions_json)
    first = doc["regions"][0]
    named = {f"{n['op']} '{n['name']}'" for n in doc["nodes"]}
    # start edge dragged back over the attention: every position is re-validated in the kernel; a
    # legal one (the keys and values hoisted out of the loop) re-estimates, an illegal one names the op
    estimates = set()
    for pos in range(first["x0"]):
        ed.regions_json = json.dumps([dict(regions[0], start=doc["nodes"][pos]["name"]), *regions[1:]])
        if ed.error:
            assert any(op in ed.error for op in named), ed.error
        else:
            estimates.add(json.loads(ed.doc_json)["estimate"]["achieved_bytes"])
    assert len(estimates) > 1, "moving the start over the graph must change the estimate"
    # a region chunked over the dim softmax normalises: refused, naming the softmax
    over_keys = {"start": "matmul", "end": "softmax", "chunks": 2, "outputs": {"softmax": 3}}
    ed.regions_json = json.dumps([over_keys])
    assert "softmax 'softmax'" in ed.error and "normalises over dim 3" in ed.error, ed.error
    # end edge moved one node later: the new region's outputs take the chosen dim
    later = doc["nodes"][first["x1"] + 1]["name"]
    ed.regions_json = json.dumps([dict(regions[0], end=later, chunks=2), *regions[1:]])
    assert ed.error == "", ed.error
    assert json.loads(ed.doc_json)["regions"][0]["end"] == later


def test_chunk_count_zero_is_refused_not_read_as_one(chunk_plan):
    """Issue 18 item 6: chunks=0 (or 1, or 2.5) is an error naming the value; the plan and the accepted
    regions (what the view's inputs are reset to) stay, and the same bad edit sent again is heard."""
    ed = ChunkEditor(chunk_plan)
    doc_before, accepted = ed.doc_json, ed.regions_json
    errors: list[str] = []
    ed.observe(lambda change: errors.append(change["new"]), "error")
    for bad in (0, 1, 2.5, "3"):
        sent = json.dumps([dict(r, chunks=bad) for r in json.loads(accepted)])
        ed.regions_json = sent
        assert f"chunks={bad!r}" in ed.error and "at least 2" in ed.error, ed.error
        assert ed.doc_json == doc_before and ed.regions_json == accepted
        errors.clear()
        ed.regions_json = sent  # again: a change, so the kernel answers again
        assert errors and errors[-1] == ed.error != ""
    ed.regions_json = json.dumps([dict(r, chunks=10**6) for r in json.loads(accepted)])
    assert "outside" in ed.error and ed.regions_json == accepted


def test_a_plan_no_better_than_unchunked_is_not_exported(chunk_plan, tmp_path):
    """The plan chunks=0 used to become (one chunk: 704 KiB against 672 KiB unchunked) is refused by
    export, as are no regions and a plan over its budget; nothing is written."""
    region = {k: chunk_plan.chunks[0][k] for k in ("start", "end", "outputs")}
    cases = {
        "one chunk": (chunk_plan.with_chunks([dict(region, chunks=1)]), "not below the unchunked"),
        "two chunks": (chunk_plan.with_chunks([dict(region, chunks=2)]), "over the budget"),
        "no regions": (chunk_plan.with_chunks([]), "no chunk regions"),
    }
    for name, (p, reason) in cases.items():
        target = tmp_path / f"{name.replace(' ', '_')}.py"
        out = ChunkEditor(p).export(target)
        assert not out["ok"] and reason in out["message"], (name, out)
        assert not target.exists() and not target.with_suffix(".chunks.json").exists()
    assert ChunkEditor(chunk_plan).export(tmp_path / "good.py")["ok"]


def test_regions_are_added_and_removed(chunk_plan):
    ed = ChunkEditor(chunk_plan)
    doc = json.loads(ed.doc_json)
    region = json.loads(ed.regions_json)[0]
    ed.regions_json = "[]"  # the view's Remove on the only region
    assert ed.error == "" and json.loads(ed.doc_json)["regions"] == []
    # the view's Add: a region without dims at the chunked curve's peak node; the kernel picks its flow
    peak = doc["nodes"][max(range(len(doc["baseline"])), key=doc["baseline"].__getitem__)]["name"]
    ed.regions_json = json.dumps([{"start": peak, "end": peak, "chunks": 4}])
    assert ed.error == "", ed.error
    added = json.loads(ed.doc_json)
    assert len(added["regions"]) == 1 and added["regions"][0]["chunks"] == 4
    assert added["estimate"]["achieved_bytes"] < added["estimate"]["baseline_peak_bytes"]
    assert json.loads(ed.regions_json)[0]["outputs"]  # the kernel's choice is what the view edits next
    # a second region over the same span overlaps the first: refused, the plan kept
    ed.regions_json = json.dumps([*json.loads(ed.regions_json), {"start": peak, "end": peak, "chunks": 2}])
    assert "overlap" in ed.error or "new chunk region" in ed.error, ed.error
    assert len(json.loads(ed.doc_json)["regions"]) == 1
    assert region["start"] in {n["name"] for n in doc["nodes"]}
