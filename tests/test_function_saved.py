"""What a custom ``torch.autograd.Function`` holds for its backward (task fid36).

Eager PyTorch runs a Function's forward without recording its operators: the Function's one autograd node
holds what ``ctx`` keeps (``ctx.save_for_backward``), which its backward reads.  The capture keeps the
Function one call (`memviz.profiling.capture.autograd_functions_in_graph`) but its walk of eager autograd
(`memviz.profiling.saved.autograd_nodes`) re-ran each operator of the traced forward as if autograd
recorded it, each saving its inputs, so the intermediates were held to the node's backward: HF Bloom's
``GeLUFunction`` (tanh GELU written out, saving only its input) made a sac plan predict 9.3% over what the
step measured.  Planned on fixed costs."""
from __future__ import annotations

import torch

import memviz
from tests.test_apply import _fixed_cost_profile, _square_loss, check_applied, sac_plan

nn = torch.nn


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class GeluFunction(torch.autograd.Function):
    """Bloom's ``GeLUFunction``: the tanh GELU, its derivative written out, only the input saved."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return _gelu(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return grad * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(GeluFunction.apply(self.up(x)))


def test_a_custom_function_holds_what_its_backward_reads() -> None:
    from memviz.plans.sac import eager_graph
    from memviz.profiling.saved import autograd_saved_holds

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), Block(), Block(), Block(), nn.Linear(32, 4))
    args = (torch.randn(2, 64, 32),)
    prof = _fixed_cost_profile(model, args)
    # each Function holds its input alone (2 x 64 x 128 float32) for its backward
    graph = eager_graph(prof.graph, prof.captured)
    held = autograd_saved_holds(prof.captured)
    tanh = [d for d in held if graph.datas[d].name.startswith("tanh") and graph.datas[d].producer is not None
            and graph.computes[graph.datas[d].producer].phase.name == "FORWARD"]
    assert tanh == [], [graph.datas[d].name for d in tanh]
    assert prof.measured_peak_bytes == prof.baseline.peak_bytes
    plan = sac_plan(prof, 0.5)
    assert plan.timeline.recomputes > 0
    verified = memviz.apply(plan, model, verify=True)
    assert verified.verified_peak_bytes <= plan.budget_bytes
    assert check_applied(model, args, {}, _square_loss, verified.plan) == [verified.plan.peak_bytes] * 3
