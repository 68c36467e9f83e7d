"""The published-table benchmark's analyses (issue 21 items 1 and 5) on small models: where a minimum
comes from and the per-model reordering gap table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_papers as bp  # noqa: E402

import memviz  # noqa: E402
from examples import models  # noqa: E402


@pytest.fixture(scope="module")
def tied_gpt():
    """A GPT whose tied embedding (vocab 2048 x 32) outweighs every activation, as GPT2-large's does."""
    model, args = models.gpt(batch=2, seq=16, d=32, heads=4, layers=2, vocab=2048, dropout=0.0)
    return memviz.profile(model, args, device="fake:v100").graph


def test_gpt_minimum_holds_one_tied_gradient_contribution(tied_gpt):
    """The two contributions to the tied embedding's gradient are summed in place (as autograd does,
    `capture.accumulate_in_place`): the minimum plan peaks where the embedding's contribution is made,
    beside the first one (a parameter gradient, so among the fixed bytes), not at an out-of-place sum
    holding both and their sum (session 17's floor: ``[4, wte, wte]`` above the fixed bytes)."""
    g = tied_gpt
    fixed = bp.fixed_bytes(g)
    floor = bp.minimum_floor(g, fixed)
    wte = 2048 * 32 * 4
    held = sorted(size for _, _, size in floor["held"])
    # the 4-byte loss, the embedding output's gradient (2 x 16 x 32 fp32) and the second contribution
    assert held == [4, 2 * 16 * 32 * 4, wte]
    assert floor["peak"] - fixed == floor["held_bytes"]


def test_reorder_case_splits_the_gap_into_models_and_search():
    model, args = models.mlp(batch=1)[:2]
    prof = memviz.profile(model, args, device="fake:v100")
    case = bp._reorder_case("mlp", *bp._with_updates(prof, "SGD"), 5.0, 5.0)
    assert case["bound"] <= case["best_peak"] <= case["peak"] <= case["eager_peak"]
    assert case["structural_bound"] <= case["bound"]
    assert case["proven_optimal"] and case["search_share_pct"] == 0.0
    row = bp._row("olla", "q", 22.5, 1.0, "%", "s", batch=1, optimizer="SGD", per_model=[case])
    table = bp.olla_gap_table([row])
    assert "| 1 | mlp |" in table and "proven" in table
    assert bp.olla_gap_table([row], optimizer="Adam") == ""
