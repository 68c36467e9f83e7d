"""The published-table benchmark's analyses (issue 21 items 1 and 5) on small models: where a minimum
comes from, the what-if graph that removes its cause, and the per-model reordering gap table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_papers as bp  # noqa: E402

import memviz  # noqa: E402
from examples import models  # noqa: E402
from memviz.planning import minimum_budget  # noqa: E402
from solvers import DataKind  # noqa: E402


@pytest.fixture(scope="module")
def tied_gpt():
    """A GPT whose tied embedding (vocab 2048 x 32) outweighs every activation, as GPT2-large's does."""
    model, args = models.gpt(batch=2, seq=16, d=32, heads=4, layers=2, vocab=2048, dropout=0.0)
    return memviz.profile(model, args, device="fake:v100").graph


def test_gpt_minimum_peaks_where_the_tied_gradient_is_summed(tied_gpt):
    g = tied_gpt
    fixed = bp.fixed_bytes(g)
    floor = bp.minimum_floor(g, fixed)
    wte = 2048 * 32 * 4
    held = sorted(size for _, _, size in floor["held"])
    # two gradient contributions and the 4-byte loss: the logits were freed once the loss read them
    assert held == [4, wte, wte]
    assert floor["peak"] - fixed == floor["held_bytes"] >= 2 * wte


def test_what_if_graph_lowers_the_minimum(tied_gpt):
    g = tied_gpt
    in_place = bp.accumulate_gradients_in_place(g)
    # one sum rewritten: its first contribution is now the parameter gradient, its output a 0-byte token
    grads = [d for d in g.datas if d.kind is DataKind.PARAMETER_GRADIENT]
    assert len([d for d in in_place.datas if d.kind is DataKind.PARAMETER_GRADIENT]) == len(grads)
    assert bp.fixed_bytes(in_place) == bp.fixed_bytes(g)
    minima = [minimum_budget(x, "rotor", 30.0) - bp.fixed_bytes(x) for x in (g, in_place)]
    assert minima[0] > minima[1]
    assert minima[0] - minima[1] <= 2048 * 32 * 4  # at most the contribution no longer held at the sum


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
