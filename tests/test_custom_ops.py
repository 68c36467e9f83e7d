"""Operators users register with ``torch.library.custom_op`` and ``register_autograd`` (transformers' MoE
``grouped_mm_fallback`` in Mixtral and Qwen2-MoE on CPU): one node of the graph, differentiated by the
backward the library registered, exported with eager's gradients."""

from __future__ import annotations

from typing import Any

import torch

import memviz
from tests.test_zoo import _assert_same


@torch.library.custom_op("memviz_tests::clamp_straight_through", mutates_args=())
def clamp_straight_through(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-1, 1)


@clamp_straight_through.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _setup(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    pass


def _backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad * 2  # not clamp's derivative: the registered backward must be the one that runs


clamp_straight_through.register_autograd(_backward, setup_context=_setup)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 8, dtype=torch.float64)
        self.b = torch.nn.Linear(8, 2, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(clamp_straight_through(self.a(x) * 3))


def test_custom_op_with_registered_autograd_trains_as_eager() -> None:
    """torch.library runs a registered backward as a generated ``torch.autograd.Function``
    (``torch._library.autograd``), which capture used to refuse as a user Function it cannot import."""
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(3, 4, dtype=torch.float64)
    prof = memviz.profile(model, (x,), fallback=False, repeats=1, warmup=0)
    assert "memviz_tests.clamp_straight_through.default" in {c.op for c in prof.graph.computes}
    eager = Model()
    eager.load_state_dict(model.state_dict())
    eager(x).sum().backward()
    exported = memviz.export(memviz.plan(prof, None))
    exported(x).sum().backward()
    for (name, pa), pb in zip(eager.named_parameters(), model.parameters(), strict=True):
        _assert_same(pa.grad, pb.grad, f"grad of {name}")
    assert not torch.equal(eager.a.weight.grad, torch.zeros_like(eager.a.weight.grad))
