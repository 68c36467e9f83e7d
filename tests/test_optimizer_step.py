"""The optimizer step planned as the user's optimizer runs it: for-loop, foreach (torch's default on CUDA:
list operations whose temporaries exist for a whole parameter group at once) or fused."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memviz
from memviz.hardware.devices import named_device
from memviz.profiling.profile import profile, update_kind
from memviz.runtime.verify import optimizer_spec
from solvers import DataKind, Phase
from solvers.result import BelowHeldMemory, InfeasibleBudget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from check_optimizer_step import measured_step  # noqa: E402  (the device check measures it the same way)


def _model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Four square weights and a batch of two: the step's peak is in the optimizer's update."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(4)]), (torch.randn(2, 256),)


@pytest.mark.parametrize("impl", [{"foreach": True}, {"fused": True}, {"foreach": False}])
def test_update_peak_is_predicted_as_the_users_optimizer_runs_it(impl: dict[str, bool]) -> None:
    """AdamW foreach holds one square root per parameter of the group at once (4 weights here), fused
    none, the for-loop two of one weight: each predicted to the byte but for the loss scalars the graph
    holds through the step."""
    model, args = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, **impl)
    prof = profile(model, args, optimizer=opt, repeats=1, warmup=0)
    kind = next(iter(k for k, v in impl.items() if v), "for-loop")
    peak_step = prof.baseline_schedule[prof.baseline.peak_step]
    assert (prof.graph.computes[peak_step.node].phase is Phase.OPTIMIZER) is (kind != "fused")
    measured = measured_step(model, args, opt)
    scalars = sum(d.bytes for d in prof.graph.datas if d.name in ("loss", "loss_grad"))
    assert 0 <= prof.baseline.peak_bytes - measured <= scalars, (impl, prof.baseline.peak_bytes, measured)
    assert prof.graph.meta["optimizer_update"] == kind


def test_default_is_decided_as_torch_optim_decides_it() -> None:
    """Unset foreach/fused: foreach on CUDA (an estimated CUDA target too), the for-loop on the CPU; an
    explicit choice wins; an optimizer without foreach kernels runs its for-loop."""
    cpu, h100 = named_device("cpu"), named_device("fake:h100")
    assert update_kind(torch.optim.AdamW, cpu) == "for-loop"
    assert update_kind(torch.optim.AdamW, h100) == "foreach"
    assert update_kind(torch.optim.SGD, h100) == "foreach"
    w = [nn.Parameter(torch.zeros(2))]
    assert update_kind(torch.optim.AdamW(w, foreach=False), h100) == "for-loop"
    assert update_kind(torch.optim.AdamW(w, fused=True), cpu) == "fused"
    assert update_kind(torch.optim.Adam(w, fused=False), h100) == "for-loop"  # as torch.optim.adam decides
    assert update_kind(torch.optim.LBFGS, h100) == "for-loop"


def test_groups_and_estimated_cuda_target() -> None:
    """On an estimated CUDA target the default AdamW step is one foreach node per parameter group whose
    workspace is every square root of the group; an instance's two groups are two nodes."""
    model, args = _model()
    params = sum(p.numel() * 4 for p in model.parameters())
    prof = profile(model, args, optimizer=torch.optim.AdamW, device="fake:h100")
    (node,) = [c for c in prof.graph.computes if c.phase is Phase.OPTIMIZER]
    assert node.temp_bytes == params
    weights = list(model.parameters())
    opt = torch.optim.AdamW([{"params": weights[:1]}, {"params": weights[1:]}], foreach=True)
    prof = profile(model, args, optimizer=opt, repeats=1, warmup=0)
    nodes = [c for c in prof.graph.computes if c.phase is Phase.OPTIMIZER]
    assert [c.temp_bytes for c in nodes] == [params // 4, 3 * params // 4]
    measured = measured_step(model, args, opt)
    assert 0 <= prof.baseline.peak_bytes - measured <= 8, (prof.baseline.peak_bytes, measured)


def test_export_verifies_with_the_modelled_update(tmp_path: Any) -> None:
    """export(verify=True) runs the profiled optimizer (foreach, over the user's two parameter groups, as
    a weight-decay split has them), within the plan; a loaded plan verifies with the update its graph
    models, not this device's default."""
    model, args = _model()
    weights = list(model.parameters())
    opt = torch.optim.AdamW([{"params": weights[:2]}, {"params": weights[2:], "weight_decay": 0.0}],
                            lr=0.01, foreach=True)
    prof = profile(model, args, optimizer=opt, repeats=1, warmup=0)
    plan = memviz.plan(prof, budget=None)  # the peak is the update: no remat lowers it
    module = memviz.export(plan, verify=True)
    assert module.verified_peak_bytes <= plan.peak_bytes, (module.verified_peak_bytes, plan.peak_bytes)
    path = tmp_path / "p.plan.json"
    plan.save(path)
    loaded = memviz.load_plan(path)
    assert optimizer_spec(loaded, None) == (torch.optim.AdamW, {"foreach": True})
    assert functools.reduce(lambda a, c: a + (c.phase is Phase.OPTIMIZER), loaded.graph.computes, 0) == 2


def test_fixed_costs_price_the_optimizer_update() -> None:
    """`Profile.with_costs` on a profile with an optimizer: its update nodes follow the captured ones and
    have no FX node (an IndexError before), so they are priced by the bytes they move."""
    model, args = _model()
    prof = profile(model, args, optimizer=torch.optim.AdamW, repeats=1, warmup=0).with_costs("fake:v100")
    updates = [c for c in prof.graph.computes if c.phase is Phase.OPTIMIZER]
    assert len(updates) == 4 and all(c.time > 0 for c in updates)
    assert memviz.plan(prof, None).peak_bytes == prof.baseline.peak_bytes


def test_a_budget_under_the_parameters_and_optimizer_state_is_refused_for_that(monkeypatch: Any) -> None:
    """Every schedule holds the parameters and AdamW's state all step.  Where the solvers run out of time
    on a budget under them (GhostNet's auto, 30 s), the refusal says so, not "raise time_limit"; a budget
    the solvers answer keeps their own refusal and its minimum (a probe at 1 byte names the minimum)."""
    from memviz.plans import planning
    from solvers.result import OutOfTime

    model, args = _model()
    prof = profile(model, args, optimizer=torch.optim.AdamW, repeats=1, warmup=0).with_costs("fake:v100")
    held = prof.graph.held_bytes()
    # weights, exp_avg and exp_avg_sq (and AdamW's step counters)
    assert held >= 3 * sum(p.numel() * 4 for p in model.parameters())
    kept = (DataKind.PARAMETER, DataKind.OPTIMIZER_STATE)
    assert held == sum(d.bytes for d in prof.graph.datas if d.kind in kept)
    with pytest.raises(InfeasibleBudget) as probed:
        memviz.plan(prof, 1, time_limit=20.0, frontier=False)
    assert probed.value.minimum_bytes is not None and probed.value.minimum_bytes > held

    def out_of_time(graph: Any, candidates: Any, budget: int, *rest: Any) -> Any:
        raise OutOfTime("rotor plan search", budget, "rotor")

    monkeypatch.setattr(planning, "_solve_first", out_of_time)
    with pytest.raises(BelowHeldMemory, match=f"every schedule holds {held} bytes"):
        memviz.plan(prof, held - 1, time_limit=20.0, frontier=False)
    with pytest.raises(OutOfTime):  # above what is held, more time may find one
        memviz.plan(prof, held + 1, time_limit=20.0, frontier=False)



def test_a_budget_under_what_is_held_names_a_minimum_when_a_slow_solver_runs_out(monkeypatch: Any) -> None:
    """Autoformer's auto plan at 50% (under its AdamW state) was refused with `BelowHeldMemory` and no
    budget to ask for: Rockmate's cold hierarchy ran past the solve's 60% share of the limit and Rotor,
    tried after it, had none left.  A budget under what is held fits no schedule before any solve, so the
    solve only names the minimum: it gets the whole limit, Rotor first (its chain DP answers at once).
    Here every solver but Rotor waits out its deadline; the refusal names Rotor's minimum, at which
    'auto' plans."""
    import time

    from memviz.plans import planning
    from solvers.result import OutOfTime

    model, args = _model()
    prof = profile(model, args, optimizer=torch.optim.AdamW, repeats=1, warmup=0).with_costs("fake:v100")
    held = prof.graph.held_bytes()
    solver = planning._solver

    def slow(strategy: str) -> Any:
        if strategy == "rotor":
            return solver(strategy)

        def out_of_time(graph: Any, budget: int, *, time_limit: float, deadline: Any) -> Any:
            time.sleep(max(0.0, deadline.left()))
            raise OutOfTime(f"{strategy} plan search", budget, strategy)

        return out_of_time

    monkeypatch.setattr(planning, "_solver", slow)
    with pytest.raises(InfeasibleBudget) as refused:
        memviz.plan(prof, held - 1, time_limit=2.0, frontier=False)
    assert refused.value.minimum_bytes is not None and refused.value.minimum_bytes > held, refused.value
    monkeypatch.undo()
    assert memviz.plan(prof, refused.value.minimum_bytes, time_limit=20.0, frontier=False).fits

def test_a_sac_budget_under_what_is_held_is_refused_without_the_search(monkeypatch: Any) -> None:
    """sac's greedy search strengthened block after block to its time limit when no choice could fit
    (GhostNet under its AdamW state: 32 s at a 30 s limit); under `Graph.held_bytes` it now simulates two
    candidates (none, and the strongest option everywhere) and names the lower peak."""
    import solvers.sac
    from tests.test_apply import EXAMPLES

    model, args = EXAMPLES["gpt"]()
    prof = profile(model, args, optimizer=torch.optim.AdamW, repeats=1, warmup=0).with_costs("fake:v100")
    held = prof.graph.held_bytes()
    made: list[tuple[str, ...]] = []
    choose = solvers.sac.choose

    def counted(graph: Any, blocks: Any, options: tuple[str, ...], *rest: Any) -> Any:
        made.append(options)
        return choose(graph, blocks, options, *rest)

    monkeypatch.setattr(solvers.sac, "choose", counted)
    with pytest.raises(InfeasibleBudget) as refused:
        memviz.plan(prof, held - 1, strategy="sac", time_limit=20.0)
    assert len(made) == 2 and len(set(made)) == 2, made
    assert refused.value.minimum_bytes is not None and refused.value.minimum_bytes > held
    made.clear()
    at = refused.value.minimum_bytes  # the named budget is one the same call meets
    assert memviz.plan(prof, at, strategy="sac", time_limit=20.0).peak_bytes <= at
