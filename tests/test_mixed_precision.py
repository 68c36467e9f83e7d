"""Mixed precision beyond a step profiled under autocast (test_export / test_apply ``-k autocast``): a plan
file that keeps its autocast regions, float16 with a GradScaler, pure low-precision models and chunked
inference under autocast."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import memviz


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 32))


def test_a_plan_saved_under_autocast_verifies_in_its_regions_when_loaded(tmp_path: Path) -> None:
    """A plan file kept no autocast regions: exported outside autocast, the model was captured again in
    float32, which is not the plan's graph (its bfloat16 casts): `StalePlanError`, and the verifying step
    would have run eager in float32.  Now ``graph.meta.autocast`` (memviz.plan/3) carries them: the capture
    and the verifying step enter them, and the loaded plan verifies as profiled."""
    model, x = _mlp(), torch.randn(64, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prof = memviz.profile(model, (x,), optimizer=torch.optim.AdamW, repeats=1, warmup=0)
    path = memviz.plan(prof, None, frontier=False).save(tmp_path / "plan.json")
    loaded = memviz.load_plan(path)
    module = memviz.export(loaded, model=model, verify=True, inputs=((x,), {}))
    assert module.verified_equal.equal and module.verified_peak_bytes <= loaded.peak_bytes
    assert loaded.graph.meta["autocast"] == [["cpu", "bfloat16"]]
