"""Tensors a model keeps across calls are held as eager holds them (task fid36).

transformers' BEiT builds its relative position index once (an LRU cache, turned off while torch compiles
or exports) and every later call reads the cached tensor; the trace builds it again each step and the
plans freed it after its last reader, where eager holds it for good: `memviz.apply(verify=True)` measured
2.21 KiB over a plan at its minimum and refused it.  The capture's eager forward finds the tensors it made
or read that stay alive once it has returned (`memviz.profiling.capture.kept_across_calls`), the graph
values equal to them (`kept_values`), and the eager graph holds those to the step's end.  Planned on fixed
costs."""
from __future__ import annotations

import functools

import torch

import memviz
from tests.test_apply import _fixed_cost_profile, _square_loss, check_applied, sac_plan

nn = torch.nn
N = 64  # the sequence: the index is N x N int64, 32 KiB


def _build_index(n: int) -> torch.Tensor:
    coords = torch.arange(n)
    return coords[:, None] - coords[None, :] + (n - 1)


_cached_index = functools.lru_cache(maxsize=4)(_build_index)


def relative_index(n: int) -> torch.Tensor:
    """transformers' ``compile_compatible_method_lru_cache``: cached in eager, built again when compiled."""
    return _build_index(n) if torch.compiler.is_compiling() else _cached_index(n)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(N, N)
        self.table = nn.Parameter(torch.randn(2 * N - 1) / N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        bias = self.table[relative_index(n).view(-1)].view(n, n)  # read from the cached index, as BEiT
        return x + torch.tanh(self.lin(x)) * bias


def test_a_tensor_the_model_caches_is_held_for_good() -> None:
    from memviz.plans.sac import eager_graph

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N, N), Block(), Block(), Block(), nn.Linear(N, 4))
    args = (torch.randn(2, N, N),)
    prof = _fixed_cost_profile(model, args)
    graph = eager_graph(prof.graph, prof.captured)
    kept = [prof.captured.data_of_fx[n] for n in prof.captured.kept_fx]
    assert [graph.datas[d].bytes for d in kept] == [N * N * 8], prof.captured.kept_fx  # one, as eager
    assert sum(c.op == "aten.arange.default" for c in graph.computes) == 1  # built once, as eager
    assert prof.measured_peak_bytes == prof.baseline.peak_bytes  # main: 32 KiB over the baseline
    plan = sac_plan(prof, 0.5)
    assert plan.timeline.recomputes > 0
    verified = memviz.apply(plan, model, verify=True)
    assert verified.verified_peak_bytes <= plan.budget_bytes
    assert check_applied(model, args, {}, _square_loss, verified.plan) == [verified.plan.peak_bytes] * 3


def test_a_kept_tensor_is_held_through_the_optimizer_step() -> None:
    """The optimizer's update nodes come after the captured step: a kept tensor is alive there too (BEiT's
    sac plan with AdamW, both layers unchanged, measured 2.21 KiB over: its peak is in the update)."""
    from memviz.plans.sac import eager_graph, eager_holds
    from memviz.profiling.profile import profile
    from solvers.sac import sac_schedule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(N, N), Block(), nn.Linear(N, 4))
    prof = profile(model, (torch.randn(2, N, N),), loss_fn=_square_loss, optimizer=torch.optim.AdamW,
                   repeats=1, warmup=0, measure=False)
    (kept,) = [prof.captured.data_of_fx[n] for n in prof.captured.kept_fx]
    graph = eager_graph(prof.graph, prof.captured)
    last_update = len(graph.computes) - 1
    assert graph.computes[last_update].phase.name == "OPTIMIZER"
    for schedule in (prof.baseline_schedule, sac_schedule(graph, [], eager_holds(prof.captured, graph))):
        computes = [s.node for s in schedule if s.op == "compute"]
        freed = next(i for i, s in enumerate(schedule) if s.op == "free" and s.node == kept)
        assert all(s.op == "free" for s in schedule[freed:]) and computes[-1] == last_update
