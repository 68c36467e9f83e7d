"""``torch.compile(memviz.export(plan))``: compiled by the caller's backend, the plan keeps its memory,
its recomputations and its dropout masks (`memviz.runtime.compiled`)."""

from __future__ import annotations

import collections
import copy
import functools
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

import memviz
import memviz.runtime.compiled
from examples.models import gpt, resnet
from memviz.plans.planning import minimum_budget
from memviz.profiling.capture import default_loss
from memviz.profiling.tracker import allocator_peak, measure_peak, tensors_of
from memviz.runtime.export import BudgetExceededError
from memviz.runtime.verify import TOLERANCE
from solvers import block_milp
from solvers.deadline import recording_cuts

STEPS = 3


@functools.cache
def _planned() -> tuple[torch.nn.Module, tuple, Any]:
    """A 2-layer GPT with dropout 0.1, planned halfway between rotor's minimum and the eager peak, so
    that the plan does not depend on the machine: op times from V100's roofline (a measured op time
    moves with the load, and so does the plan: CI once got one that recomputes no dropout), and time
    limits no loaded machine reaches (with a 10 s limit, two pytest workers beside two busy processes
    once got such a plan too), nor each block MILP's own 10 s cap (`block_milp.SOLVE_SECONDS`: at load 20
    on 2 cores one MILP ran past it and rockmate recorded a cut; its counted work bounds it)."""
    torch.manual_seed(0)
    model, args = gpt()
    prof = memviz.profile(model, args, mode="train", repeats=1, warmup=0, measure=False)
    prof = prof.with_costs("fake:v100")
    with recording_cuts() as cuts, mock.patch.object(block_milp, "SOLVE_SECONDS", 600.0):
        low, high = minimum_budget(prof.graph, "rotor", time_limit=600), prof.baseline.peak_bytes
        plan = memviz.plan(prof, low + (high - low) // 2, time_limit=600, frontier=False)
    assert not cuts, cuts
    return model, args, plan


def _step(module: torch.nn.Module, args: tuple, seed: int) -> np.ndarray:
    """One step that drops its output once the loss has read it, as the plan assumes; the output comes
    back as an untracked numpy copy, so the measured peak is the step's own."""
    torch.manual_seed(seed)
    out = module(*args)
    loss = default_loss(out)
    kept = out.detach().numpy().copy()
    del out
    loss.backward()
    return kept


def _executed_ops(plan: Any, program: Any) -> tuple[collections.Counter, int]:
    """How often the schedule runs each ATen operator (recomputations included), and how many
    distinct computes those runs are."""
    cap = program.captured
    ops: collections.Counter = collections.Counter()
    nodes = set()
    for s in plan.schedule:
        if s.op == "compute" and s.node < len(cap.compute_fx) and cap.compute_fx[s.node] is not None \
                and s.node != cap.loss_backward_compute:
            # a tied gradient's sum runs in place (`capture.accumulate_in_place`)
            in_place = s.node in cap.accumulates
            ops[torch.ops.aten.add_.Tensor if in_place else cap.nodes[cap.compute_fx[s.node]].target] += 1
            nodes.add(s.node)
    return ops, len(nodes)


def _train_side_by_side(backend: str, peak_of: Any) -> tuple[Any, list[int], Any]:
    """AdamW steps of the eager model and of the compiled export, same seeds: outputs and gradients
    compared (exactly for aot_eager, to rounding for inductor), each compiled step's peak measured."""
    model, args, plan = _planned()
    eager, planned_model = copy.deepcopy(model), copy.deepcopy(model)
    exported = memviz.export(plan, model=planned_model)
    compiled = torch.compile(exported, backend=backend)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, planned_model)]
    exact = backend == "aot_eager"
    # the first call traces and compiles the segments while the step's values are alive: compile time,
    # whose memory is the backend's, not the plan's (measured apart in benchmarks/bench_compile.py)
    _step(compiled, args, 0)
    peaks = []
    for step in range(STEPS):
        for m in (eager, planned_model):
            m.zero_grad(set_to_none=True)
        peak, out = peak_of(lambda step=step: _step(compiled, args, step), tensors_of(planned_model, args))
        peaks.append(peak)
        expected = _step(eager, args, step)
        grads = [(a.grad, b.grad, f"grad of {n}") for (n, a), b in
                 zip(eager.named_parameters(), planned_model.parameters(), strict=True)]
        pairs = [(torch.from_numpy(expected), torch.from_numpy(out), "output"), *grads]
        for a, b, what in pairs:
            if exact:
                assert torch.equal(a, b), f"{what}, step {step}"
            else:  # inductor fuses and reorders float sums; a fresh dropout mask would differ by ~1e-1
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"{what}, step {step}")
        for opt in opts:
            opt.step()
    return plan, peaks, exported


#: the ops a compiled segment runs memviz's CPU dropout as, its RNG state saved or replayed in the graph
_AS_DROPOUT = {torch.ops.memviz.cpu_dropout_saving.default: torch.ops.memviz.cpu_dropout.default,
               torch.ops.memviz.cpu_dropout_replayed.default: torch.ops.memviz.cpu_dropout.default}


def _dropout_replays(plan: Any, program: Any) -> list[int]:
    """The random ops the plan's schedule recomputes, once per recomputation."""
    seen: set[int] = set()
    return [s.node for s in plan.schedule if s.op == "compute" and s.node in program.random
            and (s.node in seen or seen.add(s.node))]


def test_compiled_export_keeps_plan_memory_recomputations_and_dropout() -> None:
    plan, peaks, exported = _train_side_by_side("aot_eager", measure_peak)
    eager_peak = plan.profile.baseline.peak_bytes
    assert plan.budget_bytes < eager_peak
    program = exported.program
    assert _dropout_replays(plan, program), "the plan recomputes no dropout"
    # every compiled step measured at the plan's peak plus the RNG states saved for the dropout replays
    # (the segments save them, so the live-storage tracker sees them: one CPU generator state per
    # dropout, all saved in the forward, before the backward's peak; no plan models them)
    states = len(program.random) * torch.get_rng_state().nbytes
    assert max(peaks) - states <= plan.budget_bytes, (peaks, plan.budget_bytes)
    assert peaks == [plan.peak_bytes + states] * STEPS
    # the compiled graphs run each operator as often as the schedule does: no recomputation merged
    code = next(iter(exported._compiled.values()))[1]
    expected, distinct = _executed_ops(plan, program)
    ran = collections.Counter(_AS_DROPOUT.get(n.target, n.target) for g in code.graphs for n in g.graph.nodes
                              if _AS_DROPOUT.get(n.target, n.target) in expected)
    assert ran == expected
    assert sum(expected.values()) - distinct == plan.timeline.recomputes > 0


def test_compiled_dropout_plan_is_one_segment_per_phase() -> None:
    """Memviz's CPU dropout saves or replays its RNG state inside the compiled graph, so the dropout plan
    is not cut at its random ops (it was: 11 segments, each a compiled call with the driver's RNG save or
    replay around it): one segment per phase, each dropout's first run saving its state, each
    recomputation replaying it; the gradients stay exact (the test above)."""
    model, args, plan = _planned()
    exported = memviz.export(plan, model=copy.deepcopy(model))
    _step(torch.compile(exported, backend="aot_eager"), args, 0)
    code = next(iter(exported._compiled.values()))[1]
    assert memviz.runtime.compiled.rng_in_graph(exported.program)
    assert len(code.graphs) == len(code.phases) == 3
    ops = collections.Counter(n.target for g in code.graphs for n in g.graph.nodes)
    assert ops[torch.ops.memviz.cpu_dropout_saving.default] == len(exported.program.random)
    replays = _dropout_replays(plan, exported.program)
    assert ops[torch.ops.memviz.cpu_dropout_replayed.default] == len(replays) > 0
    assert ops[torch.ops.memviz.cpu_dropout.default] == 0


@pytest.mark.slow
def test_inductor_compiled_export_fuses_under_the_plan() -> None:
    """Inductor allocates outside the dispatcher: the allocator's own peak (torch.profiler) is what is
    measured.  It counts the RNG states the export keeps for dropout replay (one generator state per
    random op), which the plan does not; the eager model is measured the same way."""
    plan, peaks, exported = _train_side_by_side("inductor", allocator_peak)
    model, args, _ = _planned()
    eager = copy.deepcopy(model)
    eager_peak, _ = allocator_peak(lambda: _step(eager, args, 0), tensors_of(eager, args))
    rng_states = len(exported.program.random) * torch.get_rng_state().numel()
    assert max(peaks) <= plan.budget_bytes + rng_states
    assert max(peaks) < eager_peak


class _ConvBN(torch.nn.Module):
    """Three conv + BatchNorm + in-place ReLU blocks and a linear head: what Inductor lays out in
    channels-last on CPU and fuses with BatchNorm's statistics."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        c = 3
        for w in (8, 8, 16):
            layers += [torch.nn.Conv2d(c, w, 3, padding=1, bias=False), torch.nn.BatchNorm2d(w),
                       torch.nn.ReLU(inplace=True)]
            c = w
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


@functools.cache
def _convbn_planned() -> tuple[torch.nn.Module, tuple, Any]:
    """`_ConvBN` planned a quarter of the way from rotor's minimum to the eager peak (cost-model times
    and time limits no machine reaches: the plan does not depend on the machine)."""
    torch.manual_seed(0)
    model, args = _ConvBN(), (torch.randn(4, 3, 16, 16),)
    prof = memviz.profile(model, args, mode="train", repeats=1, warmup=0, measure=False)
    low, high = minimum_budget(prof.graph, "rotor", time_limit=600), prof.baseline.peak_bytes
    plan = memviz.plan(prof, low + (high - low) // 4, time_limit=600, frontier=False)
    assert plan.timeline.recomputes > 0
    return model, args, plan


def _unmodelled(module: torch.nn.Module, args: tuple) -> int:
    """What the CPU allocator counts in an uncompiled step beyond the live storages the plan models
    (convolution workspaces): the allowance `memviz.runtime.verify` gives a compiled step."""
    module.zero_grad(set_to_none=True)
    seen, _ = allocator_peak(lambda: _step(module, args, 0), tensors_of(module, args))
    module.zero_grad(set_to_none=True)
    tracked, _ = measure_peak(lambda: _step(module, args, 0), tensors_of(module, args))
    module.zero_grad(set_to_none=True)
    return seen - tracked


def test_inductor_compiled_convbn_export_keeps_its_plan_and_eager_gradients() -> None:
    """Inductor's layout optimisation would feed each convolution a channels-last copy of an activation
    the segment also returns contiguous: two copies where the plan counts one."""
    model, args, plan = _convbn_planned()
    eager, planned_model = copy.deepcopy(model), copy.deepcopy(model)
    exported = memviz.export(plan, model=planned_model)
    unmodelled = _unmodelled(memviz.export(plan, model=copy.deepcopy(model)), args)  # moves no statistics
    compiled = torch.compile(exported, backend="inductor")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, planned_model)]
    for m in (compiled, eager):  # the first compiles; both models' BatchNorm statistics move alike
        _step(m, args, 0)
    for step in range(STEPS):
        for m in (eager, planned_model):
            m.zero_grad(set_to_none=True)
        peak, out = allocator_peak(lambda step=step: _step(compiled, args, step),
                                   tensors_of(planned_model, args))
        # within the plan's contract (DESIGN.md: 1 %; Inductor's per-channel statistics buffers measured
        # 192 bytes over it) and never over the budget
        assert peak - unmodelled <= min(plan.budget_bytes, plan.peak_bytes * (1 + TOLERANCE)), \
            (step, peak, unmodelled, plan.peak_bytes, plan.budget_bytes)
        expected = _step(eager, args, step)
        torch.testing.assert_close(torch.from_numpy(out), torch.from_numpy(expected), rtol=1e-4, atol=1e-4)
        for (n, a), b in zip(eager.named_parameters(), planned_model.parameters(), strict=True):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-4, msg=f"grad of {n}, step {step}")
        for opt in opts:
            opt.step()
    # running statistics moved once per step, and num_batches_tracked counted up as in eager (the plan
    # recomputes: its solver skipped that update, nothing reads it, until `planning.with_buffer_updates`)
    for (n, a), b in zip(eager.named_buffers(), planned_model.buffers(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=n)


def _wasteful(extra: int) -> Any:
    """A torch.compile backend that runs each graph as traced while holding `extra` bytes of its own."""

    def backend(gm: torch.fx.GraphModule, example: list) -> Any:
        def call(*values: torch.Tensor) -> Any:
            held = torch.empty(extra, dtype=torch.uint8)
            out = gm(*values)
            del held
            return out

        return call

    return backend


def test_verify_measures_the_compiled_step_and_refuses_one_over_budget() -> None:
    model, args, plan = _convbn_planned()
    module = memviz.export(plan, model=copy.deepcopy(model), verify=True, backend="aot_eager")
    assert module.verified_peak_bytes <= plan.budget_bytes
    assert module._compiled  # the compiled code measured is what torch.compile(module) runs
    with pytest.raises(BudgetExceededError, match="over the budget"):
        memviz.export(plan, model=copy.deepcopy(model), verify=True, backend=_wasteful(plan.budget_bytes))
    with pytest.raises(ValueError, match="verify=True"):
        memviz.export(plan, model=copy.deepcopy(model), backend="aot_eager")


@functools.cache
def _resnet_planned() -> tuple[torch.nn.Module, tuple, Any]:
    """The examples' ResNet (residual blocks: a gradient sum feeds both branches' backward) planned a
    quarter of the way from rotor's minimum to the eager peak on V100-roofline op times (the plan does
    not depend on the machine)."""
    model, args = resnet(batch=4, image=16, widths=(8, 16), blocks_per_stage=2)
    prof = memviz.profile(model, args, mode="train", repeats=1, warmup=0, measure=False)
    prof = prof.with_costs("fake:v100")
    low, high = minimum_budget(prof.graph, "rotor", time_limit=600), prof.baseline.peak_bytes
    plan = memviz.plan(prof, low + (high - low) // 4, time_limit=600, frontier=False)
    assert plan.timeline.recomputes > 0
    return model, args, plan


@pytest.mark.slow
def test_inductor_stores_the_values_several_kernels_read() -> None:
    """By default Inductor recomputes a cheap pointwise value inside each kernel that reads it, so its
    inputs live until the last reader, past the plan's frees (a residual block's gradient sum and ReLU
    backward, inlined into both branches' BatchNorm backward kernels): measured over the plan.  With
    `REALIZE_READS_THRESHOLD` every such value is stored once, where the plan computes it, and the
    compiled step measures within the plan, under its budget."""
    model, args, plan = _resnet_planned()
    unmodelled = _unmodelled(memviz.export(plan, model=copy.deepcopy(model)), args)

    def compiled_peak(threshold: int) -> int:
        torch._dynamo.reset()
        exported = memviz.export(plan, model=copy.deepcopy(model))
        compiled = torch.compile(exported, backend="inductor")
        with mock.patch.object(memviz.runtime.compiled, "REALIZE_READS_THRESHOLD", threshold):
            _step(compiled, args, 0)  # compiles the segments
        exported.zero_grad(set_to_none=True)
        peak, _ = allocator_peak(lambda: _step(compiled, args, 0), tensors_of(exported, args))
        return peak - unmodelled

    inlined = compiled_peak(4)  # Inductor's default
    assert inlined > plan.peak_bytes * (1 + TOLERANCE), (inlined, plan.peak_bytes)
    stored = compiled_peak(memviz.runtime.compiled.REALIZE_READS_THRESHOLD)
    assert stored <= min(plan.budget_bytes, plan.peak_bytes * (1 + TOLERANCE)), (stored, plan.peak_bytes)


def test_a_segment_replays_a_dropout_it_saved_and_keeps_the_global_stream() -> None:
    """A dropout saved and replayed inside one segment draws the same noise twice from the state saved
    in the graph, and leaves the global generator where eager's single draw leaves it."""
    from torch._dynamo import lookup_backend

    from memviz.runtime.compiled import _call, _trace
    from memviz.runtime.export import _StepRng

    def segment(env: dict[str, Any], rng: Any, buffers: dict[str, Any], grad_outputs: dict[int, Any]) -> None:
        rng.save(0)
        env["first"] = torch.ops.memviz.cpu_dropout(env["x"], 0.5)[0]
        with rng.replay(0):
            env["again"] = torch.ops.memviz.cpu_dropout(env["x"], 0.5)[0]

    x = torch.ones(64)
    rng = _StepRng([])
    traced = _trace(segment, {"x": x}, {}, {}, lookup_backend("aot_eager"), rng)
    assert traced.states_in == [] and traced.states_out == [0]
    torch.manual_seed(3)
    env = {"x": x}
    _call(traced, env, {}, {}, rng)
    after = torch.rand(4)
    torch.manual_seed(3)
    expected = torch.ops.memviz.cpu_dropout(x, 0.5)[0]
    assert torch.equal(env["first"], expected) and torch.equal(env["again"], expected)
    assert torch.equal(after, torch.rand(4))


def test_a_compiled_export_step_enters_dynamo_only_once() -> None:
    """Dynamo skips the exported module's ``forward`` frame by a mark on its code (``skip``), so a step
    after the first converts no frame: ``disable(recursive=False)``, which means the same, ran Dynamo's
    Python frame callback on that frame at every call (0.17-0.23 of an eager step on bench_compile's
    dropout GPT, `benchmarks/check_compiled_fixed_cost.py`)."""
    from torch._dynamo.utils import counters

    model, args, plan = _planned()
    compiled = torch.compile(memviz.export(plan, model=copy.deepcopy(model)), backend="aot_eager")
    _step(compiled, args, 0)
    before = counters["frames"]["total"]
    for seed in range(1, STEPS):
        _step(compiled, args, seed)
    assert counters["frames"]["total"] == before


def test_inductor_does_not_run_a_recomputation_beside_its_first_run() -> None:
    """Two runs of one LayerNorm on the same input, the second placed by the plan where its output is
    used: Inductor's default choices fuse the two side by side (they read the same buffers) into one kernel
    at the first, so both outputs live across what runs between them; memviz's segments refuse horizontal
    fusion across operators (`compiled._plan_order_choices`) and hold one at a time."""
    from torch._inductor.choices import InductorChoices
    from torch._inductor.compile_fx import compile_fx

    from memviz.runtime.compiled import _call, _trace

    def segment(env: dict[str, Any], rng: Any, buffers: dict[str, Any], grad_outputs: dict[int, Any]) -> None:
        x, w = env["x"], env["w"]
        a = torch.nn.functional.layer_norm(x, (256,))
        y = torch.mm(a, w)
        del a
        z = torch.mm(y, w)
        del y
        env["s"] = z.sum()
        del z
        b = torch.nn.functional.layer_norm(x, (256,))  # the recomputation
        env["out"] = torch.mm(b, w)

    class Default(InductorChoices):
        def uuid(self) -> str:
            return "test_compile_export.Default"

    x, w = torch.randn(256, 256), torch.randn(256, 256)
    value = x.numel() * x.element_size()

    def peak() -> int:
        traced = _trace(segment, {"x": x, "w": w}, {}, {}, compile_fx)
        return allocator_peak(lambda: _call(traced, {"x": x, "w": w}, {}, {}, None))[0]

    with mock.patch.object(memviz.runtime.compiled, "_plan_order_choices", lambda: Default):
        fused = peak()
    assert fused >= 3 * value, fused  # both LayerNorms' outputs and the first matmul's
    assert peak() <= 2 * value + 4096  # two values at a time (with a LayerNorm's statistics and the sum)
