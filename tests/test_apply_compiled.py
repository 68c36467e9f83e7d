"""`memviz.apply` under ``torch.compile(backend="aot_eager")``: the plan's decisions survive tracing.

Compiled, the selective policy runs once at trace time: it tags the regions' ops (MUST_SAVE /
PREFER_RECOMPUTE) and AOTAutograd's partitioner puts the recomputed ones into the backward graph.
The test reads those graphs: the backward recomputes exactly the matmul-class ops the plan's schedule
recomputes (the partitioner never recomputes one on its own: they are "compute intensive"), replays
each recomputed dropout from its saved RNG state, and the gradients equal eager PyTorch's."""

from __future__ import annotations

import collections
import copy
import functools
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.partitioners import min_cut_rematerialization_partition

import memviz
from examples.models import EXAMPLES
from memviz.plans.sac import MATMULS, candidate_blocks, op_name, region_specs
from memviz.profiling.capture import default_loss
from memviz.profiling.profile import Profile, profile
from memviz.runtime.apply import wrap
from solvers.sac import Region
from tests.test_apply import sac_plan


@functools.cache
def _profiled() -> tuple[torch.nn.Module, tuple[Any, ...], Profile]:
    # dropout 0.1: a recomputed block replays its masks or its gradients differ
    model, args = EXAMPLES["gpt"]()
    return model, args, profile(model, args, repeats=1, warmup=0)


def _recording_aot_eager(backward: list[torch.fx.GraphModule]) -> Any:
    """``backend="aot_eager"`` (the same partitioner and no-op boxed compilers) keeping each backward
    graph it compiles."""

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        backward.append(gm)
        return boxed_nop(gm, example_inputs)

    return aot_autograd(fw_compiler=boxed_nop, bw_compiler=bw_compiler,
                        partition_fn=min_cut_rematerialization_partition, keep_inference_input_mutations=True)


def _backward_ops(model: torch.nn.Module, args: tuple[Any, ...]) -> collections.Counter:
    """ATen op names (`op_name`) the backward graphs of one compiled training step (seed 0) run; the
    step leaves its gradients in `model`."""
    torch._dynamo.reset()  # another model's graphs are not reused
    graphs: list[torch.fx.GraphModule] = []
    compiled = torch.compile(model, backend=_recording_aot_eager(graphs))
    torch.manual_seed(0)
    default_loss(compiled(*args)).backward()
    ops: collections.Counter = collections.Counter()
    for g in graphs:
        for n in g.graph.nodes:
            if n.op == "call_function":
                aten = isinstance(n.target, torch._ops.OpOverload)
                ops[op_name(str(n.target)) if aten else str(n.target)] += 1
    return ops


@functools.cache
def _plain_backward_ops() -> collections.Counter:
    """`_backward_ops` of the model without a plan (torch.compile's own min-cut alone)."""
    model, args, _ = _profiled()
    return _backward_ops(copy.deepcopy(model), args)


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


def _check_eager_gradients(model: torch.nn.Module, applied: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """`applied`'s gradients (left by `_backward_ops`'s step, seed 0) equal eager PyTorch's, dropout
    included."""
    eager = copy.deepcopy(model)
    torch.manual_seed(0)
    default_loss(eager(*args)).backward()
    for (name, a), b in zip(eager.named_parameters(), applied.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=0, msg=name)


def _replays_dropout(ops: collections.Counter) -> bool:
    """Whether a backward runs a random op with the generator state its forward saved
    (the partitioner's `functionalize_rng_ops`)."""
    return any("run_with_rng_state" in k for k in ops)


def test_compiled_apply_recomputes_what_the_plan_says_and_replays_dropout() -> None:
    model, args, prof = _profiled()
    plan = sac_plan(prof, 1e-3)  # refused: planned at the minimum, where blocks recompute their matmuls
    expected = _recomputed_matmuls(plan)
    assert expected > 0, plan.solver_stats.extra["sac"]["options"]
    base = _plain_backward_ops()
    applied = memviz.apply(plan, model)
    ops = _backward_ops(applied, args)
    options = plan.solver_stats.extra["sac"]["options"]
    assert sum(ops[m] - base[m] for m in MATMULS) == expected, (options, ops)
    assert not _replays_dropout(base) and _replays_dropout(ops), ops
    _check_eager_gradients(model, applied, args)


def test_compiled_apply_keeps_what_the_policy_saves() -> None:
    """A region whose policy keeps its matmuls (MUST_SAVE) recomputes none of them compiled, while its
    dropout is still recomputed (PREFER_RECOMPUTE) from the saved RNG state."""
    model, args, prof = _profiled()
    graph = prof.graph if prof.baseline_graph is None else prof.baseline_graph
    block = candidate_blocks(prof.model, graph, prof.captured)[0]
    assert block.matmuls
    (spec,) = region_specs(graph, [Region(block.name, block.nodes, block.matmuls)])
    applied = copy.deepcopy(model)
    wrap(applied.get_submodule(block.name), spec)
    base = _plain_backward_ops()
    ops = _backward_ops(applied, args)
    assert all(ops[m] == base[m] for m in MATMULS), (ops, base)
    assert _replays_dropout(ops), ops
    _check_eager_gradients(model, applied, args)
