"""Print an autochunk plan document (the GPT example in inference at 512 tokens, as tests/test_chunking.py
plans it) and the [first, last] planned step of each chunk region as `solvers.autochunk.chunked_run`
records them, so regions.test.ts checks where the report shades regions against the planner's truth."""

from __future__ import annotations

import json
import sys

import memviz
from examples.models import gpt
from solvers.autochunk import chunked_run

model, args = gpt(batch=1, seq=512, d=64, heads=4, layers=2, vocab=128, dropout=0.0)
model.eval()
plan = memviz.plan(memviz.profile(model, args, mode="inference"), 0.4, strategy="autochunk", frontier=False)
cp = plan.chunking
run = chunked_run(cp.graph, tuple(cp.regions), cp.speed, plan.model["name"])
assert [s.to_json() for s in run.schedule] == [s.to_json() for s in plan.schedule], "not the planned run"
json.dump({"doc": plan.to_dict(), "spans": run.spans}, sys.stdout)
