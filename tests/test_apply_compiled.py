"""`memviz.apply` under ``torch.compile(backend="aot_eager")``: the plan's decisions survive tracing.

Compiled, the selective policy runs once at trace time: it tags the regions' ops (MUST_SAVE /
PREFER_RECOMPUTE) and AOTAutograd's partitioner puts the recomputed ones into the backward graph.
The test reads those graphs: the backward recomputes exactly the matmul-class ops the plan's schedule
recomputes (the partitioner never recomputes one on its own: they are "compute intensive"), replays
each recomputed dropout from its saved RNG state, and the gradients equal eager PyTorch's."""

from __future__ import annotations

import collections
import copy
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.partitioners import min_cut_rematerialization_partition

import memviz
from examples.models import EXAMPLES
from memviz.plans.sac import MATMULS, op_name
from memviz.profiling.capture import default_loss
from memviz.profiling.profile import profile
from tests.test_apply import sac_plan


def _recording_aot_eager(backward: list[torch.fx.GraphModule]) -> Any:
    """``backend="aot_eager"`` (the same partitioner and no-op boxed compilers) keeping each backward
    graph it compiles."""

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        backward.append(gm)
        return boxed_nop(gm, example_inputs)

    return aot_autograd(fw_compiler=boxed_nop, bw_compiler=bw_compiler,
                        partition_fn=min_cut_rematerialization_partition, keep_inference_input_mutations=True)


def _backward_ops(model: torch.nn.Module, args: tuple[Any, ...]) -> collections.Counter:
    """ATen op names (`op_name`) the backward graphs of one compiled training step run, and the
    compiled model's parameter gradients after that step (seed 0)."""
    torch._dynamo.reset()  # another model's graphs are not reused
    graphs: list[torch.fx.GraphModule] = []
    compiled = torch.compile(model, backend=_recording_aot_eager(graphs))
    torch.manual_seed(0)
    default_loss(compiled(*args)).backward()
    ops: collections.Counter = collections.Counter()
    for g in graphs:
        for n in g.graph.nodes:
            if n.op == "call_function":
                ops[op_name(str(n.target)) if isinstance(n.target, torch._ops.OpOverload) else str(n.target)] += 1
    return ops


def _recomputed_matmuls(plan: Any) -> int:
    """How many matmul-class computes the plan's schedule runs a second time (its recomputations)."""
    seen: set[int] = set()
    again = 0
    for s in plan.schedule:
        if s.op != "compute":
            continue
        if s.node in seen and op_name(plan.graph.computes[s.node].op) in MATMULS:
            again += 1
        seen.add(s.node)
    return again


def test_compiled_apply_recomputes_what_the_plan_says_and_replays_dropout() -> None:
    model, args = EXAMPLES["gpt"]()  # dropout 0.1: a recomputed block replays its masks or its gradients differ
    prof = profile(model, args, repeats=1, warmup=0)
    plan = sac_plan(prof, 1e-3)  # refused: planned at the minimum, where blocks recompute their matmuls
    expected = _recomputed_matmuls(plan)
    assert expected > 0, plan.solver_stats.extra["sac"]["options"]
    plain, applied = copy.deepcopy(model), memviz.apply(plan, model)
    base = _backward_ops(plain, args)
    ops = _backward_ops(applied, args)
    extra = sum(ops[m] - base[m] for m in MATMULS)
    assert extra == expected, (plan.solver_stats.extra["sac"]["options"], ops, base)
    # the recomputed dropout runs with the generator state its forward saved (`functionalize_rng_ops`)
    assert not any("run_with_rng_state" in k for k in base)
    assert any("run_with_rng_state" in k for k in ops), ops
    # gradients: eager PyTorch's, dropout included (the compiled step above ran with seed 0)
    eager = copy.deepcopy(model)
    torch.manual_seed(0)
    default_loss(eager(*args)).backward()
    for (name, a), b in zip(eager.named_parameters(), applied.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=0, msg=name)
