"""The sac menu's light options (`solvers.sac.LADDER`), between not checkpointing and keeping the matmuls,
where torch.compile's min-cut sits at its default budget: "pointwise" checkpoints only a block's
elementwise sub-modules (GPT-2's GELU, Llama's RMSNorm arithmetic), plainly; "matchable" checkpoints the
block keeping every op a policy can match (matmuls, attention, norms, softmax, GELU), recomputing the
elementwise rest, dropout and views.  Exactness as for the other options (`tests/test_apply.py`): run by
`memviz.apply` on real transformers models with dropout on, the measured peak is the plan's and outputs
and gradients equal eager's over 3 AdamW steps (the recomputed dropout replays its mask)."""

from __future__ import annotations

import unittest.mock
from typing import Any

import pytest

import memviz
import solvers.sac
from memviz.plans import sac
from memviz.profiling.profile import profile
from solvers.result import SolveResult, SolverStats
from tests.test_apply import check_applied


def _planned(prof: Any, option: str) -> Any:
    """A sac plan with every block on `option`, whatever its memory (the menu replaced by that candidate)."""

    def one(graph: Any, budget: int, blocks: Any, holds: Any, *, time_limit: float, overheads: Any,
            savings: Any = None) -> Any:
        choice = solvers.sac.choose(graph, blocks, (option,) * len(blocks), holds, overheads)
        stats = SolverStats("sac", "heuristic", 0.0, objective=choice.step_s)
        return SolveResult(choice.schedule, stats), choice

    with unittest.mock.patch.object(sac, "solve_menu", one):
        return memviz.plan(prof, None, strategy="sac")


def _own_loss(out: Any) -> Any:
    return out.loss


@pytest.mark.slow  # 80 s per model on 2 loaded cores: a profile and two 3-step truth loops
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_light_options_run_as_planned(name: str) -> None:
    """GPT-2 with few positions (the zoo's 4096 position embeddings would be its peak) and the zoo's Llama,
    both with dropout on, without a KV cache (as apply runs a checkpointed layer).

    Llama measures 128 B (0.04%) over each plan, "full" included: the position ids its layers take as an
    argument and never read, which the checkpoint keeps to the layer's backward (the graph records only
    what a block reads)."""
    from tests.real_models import llama
    from tests.test_apply_compose import _gpt2

    case = llama() if name == "llama" else _gpt2()
    case.model.config.use_cache = False
    loss_fn = _own_loss
    prof = profile(case.model, case.args, case.kwargs, loss_fn=loss_fn, repeats=1, warmup=0)
    plans = {o: _planned(prof, o) for o in ("pointwise", "matchable", "matmuls")}
    pieces = [r["module"] for r in plans["pointwise"].solver_stats.extra["sac"]["regions"]]
    assert pieces and all(r.endswith(("mlp.act", "layernorm")) for r in pieces), pieces
    regions = {o: p.solver_stats.extra["sac"]["regions"] for o, p in plans.items()}
    # "matchable" keeps more than the matmuls (attention's softmax at least)
    assert all(len(r["save"]) > len(m["save"]) for r, m in zip(regions["matchable"], regions["matmuls"],
                                                                strict=True))
    for option in ("pointwise", "matchable"):
        light = plans[option]
        assert light.timeline.recomputes > 0
        assert plans["matmuls"].peak_bytes < light.peak_bytes < prof.baseline.peak_bytes
        check_applied(case.model, case.args, case.kwargs, loss_fn, light)
