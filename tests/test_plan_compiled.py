"""`memviz.plan(..., strategy="sac", compiled=True)`: SAC plans against the step torch.compile runs.

Compiled, AOTAutograd's min-cut recomputes cheap ops on its own, so the compiled baseline holds less
than eager PyTorch: a budget between the two needs no checkpointing at all, and a lower one needs less
than an eager-terms plan picks.  The plan must still honour its budget when its applied model is
measured under ``torch.compile(backend="aot_eager")``, and replay dropout (eager's gradients)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
import torch

import memviz
import tests.real_models  # noqa: F401  (torchvision's op shim, before transformers loads)
from memviz.plans.planning import PlanningError
from memviz.profiling.profile import Profile, profile
from memviz.profiling.tracker import allocator_peak, tensors_of
from solvers.result import InfeasibleBudget
from solvers.sac import LADDER, CompiledSavings, Overheads, choose, solve_menu
from tests.test_apply import _example, sac_plan
from tests.test_sac_overheads import _menu


class _LossOf(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, labels=ids, use_cache=False).loss


@functools.cache
def _profiled() -> tuple[torch.nn.Module, tuple[Any, ...], Profile]:
    """A tiny LlamaForCausalLM (2 layers, hidden 32, attention dropout 0.1) trained on its own loss, with
    op times from V100's roofline: a measured op time moves with the load, and so does the plan (CI once
    got one whose eager-terms peak already fit the budget)."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   attention_dropout=0.1)
    torch.manual_seed(0)
    model = _LossOf(transformers.LlamaForCausalLM(cfg).train())
    args = (torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0)),)
    prof = profile(model, args, measure=False)
    return model, args, prof.with_costs("fake:v100")


def _compiled_step(model: torch.nn.Module, args: tuple[Any, ...]) -> int:
    """Allocator peak of one ``torch.compile(backend="aot_eager")`` training step (after a compiling one,
    seed 0); the step's gradients are left in `model`."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")

    def step() -> None:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        compiled(*args).backward()

    step()
    model.zero_grad(set_to_none=True)
    peak = allocator_peak(step, tensors_of(model, args))[0]
    torch._dynamo.reset()
    return peak


def test_compiled_savings_turn_uniform_measurements_into_per_block_shares() -> None:
    """Each option's share predicts its uniform measurement back; a block whose backward began (not held)
    frees nothing, so a peak reached in one block's backward does not move with that block's option."""
    # per option: simulated bytes per step and how many of the 4 blocks are held then; the last step is
    # the first block's backward (held: 3), where the lowest options peak
    simulated = {"none": ((250, 1000, 900), (0, 4, 3)), "pointwise": ((250, 900, 850), (0, 4, 3)),
                 "matchable": ((250, 700, 700), (0, 4, 3)), "matmuls": ((250, 600, 620), (0, 4, 3)),
                 "full": ((250, 300, 310), (0, 4, 3))}
    measured = {"none": 792, "pointwise": 700, "matchable": 540, "matmuls": 500, "full": 290}
    s = CompiledSavings.from_uniform(simulated, measured, 4)
    assert s.outside == 20 and s.per_block["full"] == 0
    # "matchable" peaks in the first block's backward, with three blocks held
    assert s.per_block["none"] == pytest.approx(47) and s.per_block["matchable"] == pytest.approx(140 / 3)
    for option, (steps, held) in simulated.items():  # each measurement is predicted back exactly
        live = np.array([[1.0] * h + [0.0] * (4 - h) for h in held])
        assert s.peak(steps, live, (option,) * 4) == measured[option]
    # blocks 0 and 1 "full", 2 and 3 "none"; in the last step block 3's backward began: it frees nothing
    # there (every block's share taken off the schedule's peak would say 800 - 20 - 2 * 47)
    live = np.array([[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=float)
    assert s.peak((250, 800, 790), live, ("full", "full", "none", "none")) == 790 - 20 - 47


def test_held_blocks_end_where_the_backward_starts() -> None:
    """A block's values count as held from its forward until its backward reads them or its region
    recomputes them (`solvers.sac.held_blocks`); the shares are taken off only there."""
    from solvers.sac import held_blocks

    _, graph, blocks, holds = _menu("gpt")
    for options in (("none",) * len(blocks), ("full",) * len(blocks)):
        schedule = choose(graph, blocks, options, holds, Overheads()).schedule
        held = held_blocks(graph, blocks, schedule)
        assert held.shape == (len(schedule), len(blocks))
        for i, block in enumerate(blocks):
            steps = np.flatnonzero(held[:, i])
            assert len(steps) and (np.diff(steps) == 1).all()  # one interval
            first = min(t for t, st in enumerate(schedule) if st.op == "compute" and st.node in block.nodes)
            assert steps[0] >= first
            # it ends before any backward op reads what the block's forward produced
            produced = {d for c in block.nodes for d in graph.computes[c].outputs}
            read = min(t for t, st in enumerate(schedule) if st.op == "compute"
                       and graph.computes[st.node].phase != "forward"
                       and produced & set(graph.computes[st.node].inputs))
            assert steps[-1] < read
        # blocks finish their forward in order and start their backward in reverse: the last held first
        ends = [np.flatnonzero(held[:, i])[-1] for i in range(len(blocks))]
        assert ends == sorted(ends, reverse=True)


def test_the_menu_compares_compiled_peaks() -> None:
    """Just under eager's peak, the eager-terms menu must checkpoint something; with savings that bring
    the unchecked step under the budget it leaves every block alone: no recomputation is bought for what
    the compiler frees.  The schedule stays the one `solvers.simulate` checked."""
    _, graph, blocks, holds = _menu("gpt")
    eager = choose(graph, blocks, ("none",) * len(blocks), holds, Overheads())
    budget = eager.timeline.peak_bytes - 1
    _, planned = solve_menu(graph, budget, blocks, holds, time_limit=20.0)
    assert set(planned.options) != {"none"}
    saving = CompiledSavings(0, {o: 1 for o in LADDER})
    _, compiled = solve_menu(graph, budget, blocks, holds, time_limit=20.0, savings=saving)
    assert set(compiled.options) == {"none"}
    # a share is freed only while its block is held: the peak step may hold fewer than every block
    assert eager.timeline.peak_bytes - len(blocks) <= compiled.peak_bytes <= budget
    assert compiled.timeline.peak_bytes == eager.timeline.peak_bytes


def _untimed_compiles(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`memviz.plans.compiled` with a fresh calibration cache and its compiled steps measured but untimed:
    time ratios would move the plan with the machine's load."""
    import memviz.plans.compiled as compiled_mod

    real = compiled_mod.compiled_step
    monkeypatch.setattr(compiled_mod, "_CALIBRATED", {})
    monkeypatch.setattr(compiled_mod, "compiled_step",
                        lambda prof, graph, regions, backend, rounds=0: real(prof, graph, regions, backend,
                                                                             rounds=0))
    return compiled_mod


@pytest.mark.slow
@pytest.mark.timeout(1200)  # seven compiles of a tiny Llama
def test_a_mixed_plans_compiled_peak_is_predicted_from_the_uniform_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: the compiled peak of a plan mixing options is predicted from the uniform calibration
    steps (each block's share taken off while its values are held for its backward) within 5% of the
    measured one: every block's share taken off the schedule's peak put ("full", "none") at 351784
    bytes, 14% under the measured 409768 (at the schedule's peak the second block's backward began:
    its share is not freed there).  Untimed."""
    from memviz.plans.sac import candidate_blocks, eager_graph, eager_holds

    compiled_mod = _untimed_compiles(monkeypatch)
    _, _, prof = _profiled()
    graph = eager_graph(prof.graph, prof.captured)
    holds = eager_holds(prof.captured, graph)
    blocks = candidate_blocks(prof.model, graph, prof.captured)
    savings, _ = compiled_mod.savings(prof, graph, blocks, holds, "aot_eager", prof.baseline.total_time)
    for options in (("full", "none"), ("none", "full")):
        chosen = choose(graph, blocks, options, holds, Overheads(), savings)
        measured = compiled_mod.compiled_peak(prof, graph, chosen.regions, "aot_eager")
        assert abs(chosen.peak_bytes - measured) <= 0.05 * measured, (options, chosen.peak_bytes, measured)


def test_a_compiled_plan_is_not_verified_eagerly() -> None:
    """verify=True measures an eager step, which holds what the compiler would have freed: refused."""
    _, _, prof = _example("gpt")
    plan = sac_plan(prof, 0.9)
    sac = {**plan.solver_stats.extra["sac"], "compiled": {"peak_bytes": plan.timeline.peak_bytes - 1}}
    compiled = dataclasses.replace(plan, solver_stats=dataclasses.replace(
        plan.solver_stats, extra={**plan.solver_stats.extra, "sac": sac}))
    assert compiled.peak_bytes == plan.timeline.peak_bytes - 1
    with pytest.raises(PlanningError, match="compiled="):
        memviz.apply(compiled, prof.model, verify=True)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about eight compiles of a tiny Llama: minutes of wall on a loaded machine
def test_compiled_plan_recomputes_less_than_the_eager_one_and_honours_its_budget_compiled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled steps are measured (peaks) but untimed: their time ratios would move the plan with
    the machine's load; priced at the eager rate of the estimated op times, the plan is a function of
    the model and the budget."""
    _untimed_compiles(monkeypatch)
    model, args, prof = _profiled()
    base = memviz.plan(prof, None, strategy="sac", compiled=True).solver_stats.extra["sac"]["compiled"]
    compiled_base = base["baseline_peak_bytes"]
    assert compiled_base < prof.baseline.peak_bytes, base  # min-cut frees cheap ops with no plan at all
    low = base["measured"]["full"]
    # a quarter of the way from the compiled baseline down to the lowest compiled peak
    budget = low + (compiled_base - low) * 3 // 4
    plan = memviz.plan(prof, budget, strategy="sac", compiled=True)
    options = plan.solver_stats.extra["sac"]["options"]
    assert plan.peak_bytes <= budget < plan.timeline.peak_bytes, (base, options)  # eager terms: over
    assert set(options.values()) != {"none"}
    # planned in eager terms the same budget buys more recomputation than the compiled step needs
    try:
        eager_plan = memviz.plan(prof, budget, strategy="sac")
    except InfeasibleBudget:  # or cannot reach it at all
        pass
    else:
        assert eager_plan.solver_stats.extra["sac"]["options"] != options
        assert eager_plan.timeline.total_time > plan.timeline.total_time
    applied = memviz.apply(plan, model)
    assert _compiled_step(applied, args) <= budget  # real inputs, dropout on
    eager = copy.deepcopy(model)
    torch.manual_seed(0)
    eager(*args).backward()
    for (name, a), b in zip(eager.named_parameters(), applied.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=0, msg=name)


def test_apply_bench_counts_a_refused_compiled_plan_as_no_point() -> None:
    """A compiled-plan budget the planner refused (its measured step over) is a row without a peak: the
    lowest-peak line skips it (it crashed bench_apply's report once)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_apply

    rows = [{"contender": "memviz compiled-plan", "setting": "min", "plan_s": 1.0, "not_run": "refused"},
            {"contender": "memviz+compile", "setting": "75%", "alloc_peak": 7, "grad_error": 0.0},
            {"contender": "memviz", "setting": "50%", "alloc_peak": 5, "grad_error": 1.0}]
    assert bench_apply.lowest_alloc(rows) == 7


def test_compiled_menu_prices_options_from_the_compiled_calibration_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the calibration's compiled steps time a selective region (one that keeps ops) dearer than
    the eager in-step rate of its recomputed ops says, the compiled menu prices it so: at a budget where
    the eager-rate prices keep matmuls (or every matchable op), the measured prices recompute plainly
    instead, and the plan's predicted time is the one the measured ratios give.  The compiled steps are
    replaced by their simulated peaks and set time ratios (no compile, no timing)."""
    import memviz.plans.compiled as compiled_mod
    from memviz.plans.sac import eager_holds
    from solvers import simulate
    from solvers.sac import sac_schedule

    _, _, prof = _example("gpt")
    graph = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    holds = eager_holds(prof.captured, graph)
    _, _, blocks, _ = _menu("gpt")

    def fake(timed: bool) -> Any:
        def step(prof: Any, graph: Any, regions: Any, backend: str,
                 rounds: int = 9) -> tuple[int, float | None]:
            peak = simulate(graph, sac_schedule(graph, tuple(regions), holds)).check().peak_bytes
            # a region keeping ops costs 0.3 eager steps compiled, a plain one 0.05
            ratio = 1.0 + sum(0.3 if r.save else 0.05 for r in regions)
            return peak, (ratio if timed and rounds else None)
        return step

    def uniform(option: str) -> int:
        return choose(graph, blocks, (option,) * len(blocks), holds, Overheads()).timeline.peak_bytes

    budget = max(uniform("matmuls"), uniform("full"))
    plans = {}
    for timed in (False, True):
        monkeypatch.setattr(compiled_mod, "_CALIBRATED", {})
        monkeypatch.setattr(compiled_mod, "compiled_step", fake(timed))
        plans[timed] = memviz.plan(prof, budget, strategy="sac", compiled=True, time_limit=20.0)
    eager_rate = set(plans[False].solver_stats.extra["sac"]["options"].values())
    options = list(plans[True].solver_stats.extra["sac"]["options"].values())
    assert eager_rate & {"matmuls", "matchable"}, eager_rate  # cheap in op times
    assert not set(options) & {"matmuls", "matchable"}, options
    assert plans[True].peak_bytes <= budget
    c = plans[True].solver_stats.extra["sac"]["compiled"]
    assert c["time_ratio"]["matmuls"] == pytest.approx(1.0 + 0.3 * len(blocks))
    pieces = {b.name: len(b.pieces) for b in blocks}
    expected = 1.0 + sum(0.05 * (1 if o == "full" else pieces[b] if o == "pointwise" else 0)
                         for b, o in zip(pieces, options, strict=True))
    assert plans[True].time_overhead == pytest.approx(expected)
    assert c["tries"][-1]["measured_ratio"] == pytest.approx(expected)


def test_apply_bench_narrowed_run_keeps_the_other_models_saved_rows(tmp_path: Any) -> None:
    """``bench_apply.py --models llama`` overwrites results/apply.json: the saved gpt2 and resnet18 entries
    stay (in the full run's order), llama's is this run's, so the rebuilt section is whole and generated."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_apply

    saved = tmp_path / "apply.json"
    names = ("gpt2", "llama", "resnet18")
    saved.write_text(json.dumps({"models": [{"model": m, "run": "old"} for m in names]}))
    merged = bench_apply.kept_models(saved, [{"model": "llama", "run": "new"}])
    assert [(m["model"], m["run"]) for m in merged] == list(zip(names, ("old", "new", "old"), strict=True))
    assert bench_apply.kept_models(tmp_path / "none.json", [{"model": "llama"}]) == [{"model": "llama"}]



def test_inductor_is_refused_with_its_reason() -> None:
    """``compiled="inductor"`` planned within its own compiled check but not within what the user's
    Inductor step holds (`memviz.plans.compiled.REFUSED`): refused before anything compiles."""
    _, _, prof = _example("gpt")
    with pytest.raises(PlanningError, match="inductor.*refused.*19% over"):
        memviz.plan(prof, 0.8, strategy="sac", compiled="inductor")
