"""`memviz.export`: run a plan's schedule -- recomputations and frees included -- as an nn.Module.

Mechanism (ARCHITECTURE.md, "export"): the exported module calls one ``torch.autograd.Function``
over the captured, functional joint graph (`memviz.profiling.capture`).  Its ``forward`` executes the
schedule's steps up to the first backward step (the synthetic ``loss_backward`` node, where the output
gradients enter) and keeps exactly the tensors the schedule keeps alive across that boundary; its ``backward``
binds the incoming output gradients and executes the remaining steps, recomputations included, then
returns every parameter's gradient.  The steps run as generated Python (`_Codegen`: one function per
phase, compiled once, the very code ``path=`` writes): a ``compute`` step is one FX operator call into a
local variable (views it reads are bound once, allocating nothing, and deleted with their storage); a
``free`` step is a ``del`` of memviz's only reference, so the storage is released exactly where
`solvers.simulate` releases it (Checkmate Sec. 4.1's execution model; Rockmate Sec. 4 executes its
schedules the same way).

* Random operators: the global RNG state is saved before an operator's first execution in a step
  and restored (in a forked RNG) for its recomputations: fresh masks every step, identical masks on
  recompute, and the global stream advances exactly as in eager mode.
* Mutated buffers (BatchNorm running statistics): the functional graph returns their new values; they
  are copied into the module's buffers once per step, at the end of the forward part, never again
  when a recomputation produces them a second time.
* The exported module holds the original model as ``_orig_mod`` (like ``torch.compile``): it shares
  its parameters and buffers (an optimizer on either trains both), ``train()``/``eval()`` switch both,
  and in eval mode the original forward runs.  Nothing else about the model is changed.
* The optimizer phase (modelled analytically by the profiler) is not executed: call your optimizer.
* A step that starts with every ``.grad`` alive (``memviz.profile(grads="accumulate")``: micro-batch
  gradient accumulation) adds each new gradient into ``.grad`` itself, at the compute the plan's graph
  says (`capture.accumulated_into_grads`: the last backward op of the autograd node that made it, where
  eager's ``AccumulateGrad`` runs ``grad += new``), and drops it there (`into_grads`, `add_into_grad`);
  autograd gets no gradient for those parameters.  A ``.grad`` that is None (a first micro-batch) takes
  the new gradient as the engine does: the bound case, never above the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import keyword
import linecache
import operator
import os
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._C._dynamo.eval_frame import get_eval_frame_callback

from memviz.hardware import accelerator, devices
from memviz.profiling.capture import (
    Captured,
    StalePlanError,
    accumulated_grad_data,
    accumulated_into_grads,
    capture,
    constant_values,
    fingerprint,
    in_place_op,
    is_random,
    replay_view,
)
from memviz.runtime.compiled import caller_backend, compiled_code
from memviz.runtime.replay import check_replay
from solvers import Graph, Phase, simulate
from solvers.schedule import Schedule, Step, turn_issue
from solvers.simulate import reused_in_place


class BudgetExceededError(ValueError):
    """``export(plan, verify=True)``: the exported step measured over the budget, and re-planning with
    the measured excess as margin did not bring it under (the numbers are attributes, in bytes)."""

    def __init__(self, message: str, *, measured: int, planned: int, budget: int) -> None:
        super().__init__(message)
        self.measured_bytes = measured
        self.planned_bytes = planned
        self.budget_bytes = budget


@dataclasses.dataclass(frozen=True)
class Program:
    """A plan compiled for execution: its steps split at the forward/backward boundary."""

    captured: Captured
    graph: Graph
    forward_steps: tuple[Step, ...]
    backward_steps: tuple[Step, ...]
    random: frozenset[int]
    params: tuple[str, ...]  # canonical parameter names, the Function's leading inputs
    fingerprint: str
    mode: str
    buffer_updates: dict[int, tuple[tuple[str, str], ...]]  # compute -> (FX value, buffer fqn)
    # backward steps run while autograd still holds the output gradients (up to their last free)
    release: int = 0
    # parameter fqn / flat input index -> the model outputs whose gradients its gradient depends on
    grad_tangents: dict[Any, frozenset[int]] = dataclasses.field(default_factory=dict)
    # compute -> the parameters whose ``.grad`` it adds the new gradient into (`into_grads`: a step that
    # starts with every ``.grad`` alive, ``memviz.profile(grads="accumulate")``); empty: autograd gets them
    into_grad: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # the step functions as Python source (`_Codegen`): what `code` runs and what ``path=`` writes
    source: str = ""
    code: Any = None  # `source` compiled once: a module with forward_steps, backward_steps, backward_rest

    @functools.cached_property
    def grad_keys(self) -> list[tuple[str, Any]]:
        """What ``backward_rest`` returns, in order: each parameter's gradient, then each input's."""
        return [("grad", n) for n in self.params] + [("input_grad", i)
                                                     for i in sorted(self.captured.input_grad_data)]

    @functools.cached_property
    def nodes(self) -> dict[str, torch.fx.Node]:
        return self.captured.nodes

    @functools.cached_property
    def phases(self) -> tuple[tuple[str, tuple[Step, ...], str, int], ...]:
        """Each phase's step function: (name, its steps, what it returns, the schedule index of its first
        step): forward; backward while autograd holds the output gradients; the rest."""
        n = len(self.forward_steps)
        return (("forward_steps", self.forward_steps, "outputs", 0),
                ("backward_steps", self.backward_steps[:self.release], "", n),
                ("backward_rest", self.backward_steps[self.release:], "grads", n + self.release))

    @functools.cached_property
    def placeholder_table(self) -> tuple[tuple[str, str, Any], ...]:
        """(FX name, kind, key) of each placeholder the step binds before it runs (no tangents)."""
        nodes = self.captured.gm.graph.find_nodes(op="placeholder")
        kinds = self.captured.placeholders
        return tuple((n.name, kind, key) for n, (kind, key) in zip(nodes, kinds, strict=True)
                     if kind != "tangent")


def compile_program(graph: Graph, captured: Captured, schedule: Schedule, fp: str) -> Program:
    """Check `schedule` with the simulator and split it where the output gradients enter."""
    timeline = simulate(graph, schedule)
    if not timeline.valid:
        raise ValueError(f"the plan's schedule is not valid for its graph: {timeline.issues[0]}")
    n_fx = len(captured.compute_fx)
    for c in graph.computes[:n_fx]:
        fx = captured.compute_fx[c.id]
        if (fx or c.name) != c.name:
            raise StalePlanError(f"compute node {c.id} is {c.name!r} in the plan but {fx!r} in the capture: "
                                 "the plan's graph was transformed or captured from another model")
    steps = tuple(schedule)
    early = _update_before_backward_ends(graph, steps)
    if early is not None:
        raise ValueError(f"the plan runs the optimizer update {early!r} before the backward ends: the "
                         "exported module leaves the update to your optimizer, after backward(), so its "
                         "peak would not be the plan's; plan it again (memviz.plan keeps the updates last)")
    if captured.loss_compute is not None and captured.loss_backward_compute is not None:
        why = turn_issue(steps, captured.loss_compute, captured.loss_backward_compute)
        if why is not None:
            raise ValueError(f"the plan's schedule cannot be exported: {why}; the exported module hands its "
                             "outputs to your loss once, when its forward returns, and the loss's backward "
                             "comes next, so its peak would not be the plan's (memviz.plan schedules it so)")
    boundary = len(steps)
    if captured.loss_backward_compute is not None:
        boundary = next(i for i, s in enumerate(steps)
                        if s.op == "compute" and s.node == captured.loss_backward_compute)
    nodes = captured.nodes
    random = frozenset(c for c, fx in enumerate(captured.compute_fx)
                       if fx is not None and is_random(nodes[fx]))
    params = tuple(dict.fromkeys(captured.param_names.values()))
    updates: dict[int, list[tuple[str, str]]] = {}
    outs = pytree.tree_leaves(captured.gm.graph.output_node().args[0], is_leaf=lambda x: x is None)
    for node, kind in zip(outs, captured.outputs, strict=True):
        if kind is not None and kind[0] == "buffer":
            d = captured.data_of_fx[node.name]
            updates.setdefault(graph.datas[d].producer, []).append((captured.data_fx[d], kind[1]))
    backward = steps[boundary:]
    into = into_grads(graph, captured, steps)
    program = Program(captured, graph, steps[:boundary], backward, random, params, fp, captured.mode,
                      {c: tuple(u) for c, u in updates.items()}, _release_point(backward, captured),
                      _grad_tangents(captured), into)
    source = _Codegen(program).source()
    return dataclasses.replace(program, source=source, code=_compiled(source, fp))


def into_grads(graph: Graph, cap: Captured, steps: Sequence[Step]) -> dict[int, tuple[str, ...]]:
    """compute -> the parameters whose held ``.grad`` it writes (`capture.accumulated_into_grads`: the last
    backward op of the autograd node that made the new gradient, where eager's ``AccumulateGrad`` runs
    ``grad += new``).  The exported step adds each new gradient there (`add_into_grad`) and drops it, so
    it is released where the plan releases it, and hands autograd no gradient for those parameters.

    The computes that make a gradient added so must run once: a second run would make it again after
    it went into ``.grad`` (`solvers.simulate` already runs a compute that writes ``.grad`` once)."""
    held = accumulated_grad_data(graph)
    into: dict[int, list[str]] = {}
    for c in graph.computes:
        for d in c.mutates:
            if d in held:
                into.setdefault(c.id, []).append(held[d])
    runs: dict[int, int] = {}
    for s in steps:
        if s.op == "compute":
            runs[s.node] = runs.get(s.node, 0) + 1
    for names in into.values():
        for name in names:
            made = graph.datas[cap.grad_data[name]].producer
            if runs.get(made, 0) > 1:
                # the new gradient's bytes are a data node without an FX value (`accumulated_into_grads`),
                # which a recomputation would free and make again beside the value the step holds
                raise ValueError(f"the plan runs {graph.computes[made].name!r}, which makes the gradient of "
                                 f"{name!r} that the step adds into its .grad, {runs[made]} times: "
                                 "memviz.export runs such a compute once; plan with another strategy, or "
                                 "apply a sac plan with memviz.apply")
    return {c: tuple(names) for c, names in into.items()}


def add_into_grad(param: torch.Tensor, new: torch.Tensor) -> None:
    """``param.grad += new`` as eager's ``AccumulateGrad`` runs it in backward (grad mode off; torch/csrc/
    autograd/functions/accumulate_grad.h).  Where ``.grad`` is None (a first micro-batch, after
    ``zero_grad()``) it becomes `new` itself when that owns its storage laid out as the parameter (the
    engine's steal), else a copy laid out as the parameter (its ``clone_obey_contract``).  That is the
    bound case of a plan that holds ``.grad`` from the step's start: until here the gradient is absent,
    and after it one gradient-sized storage stands where the plan held ``.grad``, so the step holds at
    most the plan at every moment."""
    grad = param.grad
    if grad is not None:
        grad.add_(new)
    elif new._base is None and new.stride() == param.stride() and new.dtype == param.dtype:
        param.grad = new
    else:
        param.grad = torch.empty_strided(param.shape, param.stride(), dtype=param.dtype,
                                         device=param.device).copy_(new)


def _compiled(source: str, fp: str) -> types.ModuleType:
    """`source` compiled and run once as a module (its step functions).  The text goes to linecache
    so a traceback through a step shows the generated line."""
    filename = f"<memviz plan {fp[:16]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType("memviz_plan")
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our own escaped source (`_str`)
    return module


def _placeholder_env(program: Program, params: dict[str, Any], buffers: dict[str, Any],
                     flat: Sequence[Any]) -> dict[str, Any]:
    """FX placeholder name -> the model's parameter or buffer or the user's input, plus the graph's
    tensor constants: what the step functions read from `env` before any step runs."""
    tables = {"param": params, "buffer": buffers, "input": flat}
    env = {name: tables[kind][key] for name, kind, key in program.placeholder_table}
    env.update(constant_values(program.captured.gm, program.captured.constants))
    return env


def _update_before_backward_ends(graph: Graph, steps: Sequence[Step]) -> str | None:
    """The first optimizer compute a schedule runs before some forward/backward compute, or None.  The
    plan's memory during an update is the live set where the schedule puts it; the user's optimizer
    runs once the backward has returned, beside everything the step keeps to its end."""
    optimizer = [s.op == "compute" and graph.computes[s.node].phase is Phase.OPTIMIZER for s in steps]
    last_step = max((i for i, s in enumerate(steps) if s.op == "compute" and not optimizer[i]), default=-1)
    early = next((s for s, opt in zip(steps[:last_step], optimizer, strict=False) if opt), None)
    return None if early is None else graph.computes[early.node].name


def _release_point(backward: Sequence[Step], cap: Captured) -> int:
    """How many backward steps run before autograd can drop the output gradients: it holds them until
    the Function that received them returns, so that Function runs up to the last one's free."""
    tangents = set(cap.tangent_data.values())
    frees = [i for i, s in enumerate(backward) if s.op == "free" and s.node in tangents]
    if len(frees) < len(tangents):
        return len(backward)  # one is never freed: it stays referenced to the end anyway
    return max(frees, default=-1) + 1


def _grad_tangents(cap: Captured) -> dict[Any, frozenset[int]]:
    """The model outputs each parameter (and input) gradient depends on: when none of them gets a
    gradient (an output the loss does not use), eager autograd leaves that gradient None."""
    deps: dict[str, frozenset[int]] = {}
    placeholders = cap.gm.graph.find_nodes(op="placeholder")
    for n, (kind, key) in zip(placeholders, cap.placeholders, strict=True):
        deps[n.name] = frozenset([key]) if kind == "tangent" else frozenset()
    for n in cap.gm.graph.nodes:
        if n.op == "call_function":
            deps[n.name] = frozenset().union(*(deps.get(a.name, frozenset()) for a in n.all_input_nodes))
    outs = pytree.tree_leaves(cap.gm.graph.output_node().args[0], is_leaf=lambda x: x is None)
    found: dict[Any, frozenset[int]] = {}
    for node, kind in zip(outs, cap.outputs, strict=True):
        if kind is not None and kind[0] in ("grad", "input_grad") and isinstance(node, torch.fx.Node):
            key = cap.param_names.get(kind[1], kind[1]) if kind[0] == "grad" else kind[1]
            found[(kind[0], key)] = found.get((kind[0], key), frozenset()) | deps.get(node.name, frozenset())
    return found


class _StepRng:
    """What generated code calls around random operators: `save` before an operator's first execution
    in a step, `replay` around its recomputations (the same mask; the global stream left alone)."""

    def __init__(self, devices: list[torch.device]) -> None:
        """`devices`: the accelerators the step runs on, whose generators random ops draw from."""
        self.devices = devices
        self.states: dict[int, Any] = {}

    def save(self, c: int) -> None:
        self.states[c] = accelerator.get_rng_state(self.devices)

    @contextlib.contextmanager
    def replay(self, c: int) -> Any:
        with accelerator.fork_rng(self.devices):
            accelerator.set_rng_state(self.devices, self.states[c])
            yield


class _StepState:
    """What one training step carries from forward to backward: the values the schedule keeps across
    the phase functions (`env`, FX name -> tensor), the RNG states of random ops, the output gradients."""

    def __init__(self, program: Program, code: Any, env: dict[str, Any], buffers: dict[str, torch.Tensor],
                 devices: list[torch.device], params: dict[str, Any] | None = None) -> None:
        """`code`: the compiled step functions (`Program.code`, or a module `load_source` imported);
        `params`: the model's parameters by name (those whose ``.grad`` the step adds into are read)."""
        self.program = program
        self.code = code
        self.env = env
        self.buffers = buffers
        self.params = params or {}
        self.rng = _StepRng(devices)
        self.grad_outputs: dict[int, torch.Tensor] = {}
        self.missing: set[int] = set()  # outputs that got no gradient (unused by the loss)
        self.unreached: list[str] = []  # parameters added into whose .grad eager would have left None

    # each phase runs with the caller's torch.autocast off (`accelerator.autocast_off`): the graph holds
    # the casts of a step profiled under autocast and the model's own float32 regions, which autocast
    # would cast again
    def forward(self) -> list[Any]:
        """The forward part: everything before the output gradients arrive; returns the flat outputs."""
        with accelerator.autocast_off():
            return self.code.forward_steps(self.env, self.rng, self.buffers)

    def backward(self) -> None:
        """The backward steps that run while autograd holds the output gradients."""
        if self.missing:
            # a parameter reached only through outputs without a gradient: eager's AccumulateGrad never runs
            # for it, where the step adds a gradient of zeros (values unchanged); a .grad None stays None
            tangents = self.program.grad_tangents
            self.unreached = [n for names in self.program.into_grad.values() for n in names
                              if self.params[n].grad is None
                              and (deps := tangents.get(("grad", n), frozenset())) and deps <= self.missing]
        with accelerator.autocast_off():
            self.code.backward_steps(self.env, self.rng, self.buffers, self.grad_outputs)
        self.grad_outputs.clear()

    def gradients(self, input_slots: Sequence[int]) -> tuple[list[Any], list[Any]]:
        """The backward steps after the output gradients' last use (autograd has released them), then
        the parameters' gradients and those of the inputs at `input_slots`; the step ends here."""
        with accelerator.autocast_off():
            values = self.code.backward_rest(self.env, self.rng, self.buffers)
        self.env.clear()
        for n in self.unreached:
            self.params[n].grad = None
        tangents = self.program.grad_tangents
        found = {}
        for key, value in zip(self.program.grad_keys, values, strict=True):
            deps = tangents.get(key, frozenset())
            # only reached through outputs without a gradient: None, as in eager autograd
            found[key] = None if deps and deps <= self.missing else value
        return ([found[("grad", n)] for n in self.program.params],
                [found.get(("input_grad", i)) for i in input_slots])


class _Leaves(torch.autograd.Function):
    """The link from the parameters and inputs to `_PlannedStep`.  Its backward runs the backward steps
    after the output gradients' last use -- by then autograd has released them, having returned from
    `_PlannedStep.backward` -- and returns the parameter and input gradients.

    The tensors it receives (parameters, then inputs) are only there so autograd routes their gradients
    back; the step state already holds them."""

    @staticmethod
    def forward(ctx: Any, holder: list[_StepState], input_slots: list[int], *tensors: torch.Tensor) -> Any:
        """`input_slots[j]`: flat input index of the j-th tensor input (after the parameters)."""
        ctx.holder, ctx.input_slots = holder, input_slots
        # empty (no memory) and floating (an integer output could not carry a gradient)
        return torch.empty(0, device=tensors[0].device if tensors else None)

    @staticmethod
    def backward(ctx: Any, _link: torch.Tensor | None) -> Any:
        state = ctx.holder[0]
        ctx.holder = None  # everything the step held goes with it once backward returns
        grads, input_grads = state.gradients(ctx.input_slots)
        return (None, None, *grads, *input_grads)


class _PlannedStep(torch.autograd.Function):
    """forward: the schedule up to the output gradients; backward: the steps up to their last use."""

    @staticmethod
    def forward(ctx: Any, holder: list[_StepState], link: torch.Tensor) -> Any:
        state = holder[0]
        outs = state.forward()
        ctx.state, ctx.link = state, (link.shape, link.dtype, link.device)
        ctx.diff = sorted(state.program.captured.tangent_data)
        ctx.meta = {i: (outs[i].shape, outs[i].dtype, outs[i].device) for i in ctx.diff}
        # an output the loss does not use gets None, not a materialised tensor of zeros (eager's memory)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(o for i, o in enumerate(outs)
                                      if isinstance(o, torch.Tensor) and i not in ctx.diff))
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor | None) -> Any:
        state: _StepState = ctx.state
        ctx.state = None
        for i in ctx.diff:
            g = grad_outputs[i]
            if g is None:
                shape, dtype, device = ctx.meta[i]
                g = torch.zeros((), dtype=dtype, device=device).expand(shape)  # one element, as planned
                state.missing.add(i)
            state.grad_outputs[i] = g
        del grad_outputs
        state.backward()
        shape, dtype, device = ctx.link
        return None, torch.empty(shape, dtype=dtype, device=device)


class PlannedModule(nn.Module):
    """The original model executed by a memory plan; same call signature, outputs and gradients."""

    def __init__(self, model: nn.Module, program: Program) -> None:
        super().__init__()
        self._orig_mod = model
        self._program = program
        self._walk = _StateWalk(model)  # the model's parameters and buffers, walked again when changed
        self._param_shapes = {n: tuple(p.shape) for n, p in self._walk.state[0].items()}
        self._generated: Any = None  # a module written by write_source, when loaded by load_source
        # torch.compile backend -> `memviz.runtime.compiled` code
        self._compiled: dict[int, tuple[Any, Any]] = {}

    @property
    def program(self) -> Program:
        return self._program

    # Dynamo skips this frame but not its callees: under torch.compile its callback is set here, and
    # names the backend that then compiles the plan's steps (`memviz.runtime.compiled`); `_step` runs with
    # Dynamo off, so nothing else of the driver is traced.  ``skip`` marks the code once; ``disable(
    # recursive=False)``, which means the same, runs Dynamo's Python frame callback on this frame at every
    # call (it re-derives the skip each time): on bench_compile's dropout GPT at 50 % that was 0.17-0.23
    # of an eager step, the compiled plan 1.50-1.59x Inductor's own step against 1.29x with ``skip``
    # (cmin32, `benchmarks/check_compiled_fixed_cost.py`, two runs of 30 pairs, load 8-10)
    @torch._dynamo.decorators.skip
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(get_eval_frame_callback(), args, kwargs)

    @torch._dynamo.disable
    def _step(self, callback: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.training and self._program.mode == "train":
            return self._orig_mod(*args, **kwargs)
        if not self._walk.current():
            self._walk = _StateWalk(self._orig_mod)
        params, buffers = self._walk.state
        flat = self._check(args, kwargs, params)
        cap = self._program.captured
        env = _placeholder_env(self._program, params, buffers, flat)
        # only random operators' generators are saved and replayed (`_StepRng`): a walk over every
        # tensor's device is a fixed cost per step worth skipping where there are none
        devices = accelerator.devices_of([*params.values(), *buffers.values(), *flat]) \
            if self._program.random else []
        code = self._program.code if self._generated is None else self._generated
        backend = caller_backend(callback)
        if backend is not None:
            code = self._compiled.get(id(backend), (None, None))[1]
            if code is None:
                code = compiled_code(self._program, backend)
                self._compiled[id(backend)] = (backend, code)  # the backend kept: its id stays its own
        state = _StepState(self._program, code, env, buffers, devices, params)
        slots = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor)]
        if self._program.mode == "inference" or not torch.is_grad_enabled():
            with torch.no_grad():
                if self._program.mode == "train":
                    raise RuntimeError("this plan is a training plan: call it with gradients enabled, or "
                                       "switch to eval() to run the original forward")
                outs = state.forward()
                env.clear()
            return pytree.tree_unflatten(outs, cap.out_spec)
        holder = [state]
        link = _Leaves.apply(holder, slots, *(params[n] for n in self._program.params),
                             *(flat[i] for i in slots))
        outs = list(_PlannedStep.apply(holder, link))
        for i, view in cap.output_views.items():  # aliased outputs: their view replayed on the real base
            outs[i] = replay_view(view, self._program.nodes, view.base_value(outs, params, buffers, flat))
        return pytree.tree_unflatten(outs, cap.out_spec)

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any], params: dict[str, Any]) -> list[Any]:
        flat, spec = pytree.tree_flatten((tuple(args), kwargs))
        cap = self._program.captured
        if spec != cap.in_spec:
            raise StalePlanError(f"the plan was profiled with inputs structured as {cap.in_spec}, got "
                                 f"{spec}; profile and plan again for this call signature")
        for i, (x, meta) in enumerate(zip(flat, cap.input_meta, strict=True)):
            if meta is None:
                _check_constant(i, x, cap.input_consts.get(i))
                continue
            if not isinstance(x, torch.Tensor) or (tuple(x.shape), x.dtype) != meta:
                got = (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
                raise StalePlanError(f"input {i} is {got}, but the plan was made for {meta}: memory plans "
                                     "are shape-specific; profile and plan again for these shapes")
        shapes = self._param_shapes
        if params.keys() != shapes.keys() or any(p.shape != shapes[n] for n, p in params.items()):
            raise StalePlanError("the model's parameters changed since export: profile and plan again")
        return flat


class _StateWalk:
    """``named_parameters`` and ``named_buffers`` (duplicates included) of a model (`state`), read in
    one walk over its modules and kept with what it read: every ``_modules``,
    ``_parameters`` and ``_buffers`` dict, its size and the object under each key.  `current` says
    whether the model still holds exactly that (a parameter, buffer or submodule set, added or deleted
    since changes one of them), which costs a fraction of a new walk: on a 12-layer GPT the walk was
    2% of a launch-bound step (issue 22)."""

    def __init__(self, model: nn.Module) -> None:
        params: dict[str, Any] = {}
        buffers: dict[str, Any] = {}
        seen: list[tuple[dict[str, Any], int]] = []
        held: list[tuple[dict[str, Any], str, Any]] = []
        stack = [("", model)]  # depth first, in named_modules' order, without its generators
        while stack:
            prefix, module = stack.pop()
            tables = ((module._parameters, params), (module._buffers, buffers), (module._modules, None))
            for table, out in tables:
                seen.append((table, len(table)))
                held.extend((table, k, v) for k, v in table.items())
                if out is not None:
                    out.update((prefix + k, v) for k, v in table.items() if v is not None)
            stack.extend((f"{prefix}{k}.", m) for k, m in reversed(module._modules.items()) if m is not None)
        self.state = (params, buffers)
        self._seen = seen
        self._held = held

    def current(self) -> bool:
        return all(len(t) == n for t, n in self._seen) and all(t.get(k) is v for t, k, v in self._held)


def _check_constant(i: int, value: Any, traced: Any) -> None:
    """A non-tensor input (flag, scale, None) was baked into the captured graph: another value would
    silently run the traced one."""
    try:
        same = type(value) is type(traced) and bool(value == traced)
    except Exception:  # noqa: BLE001 - values that cannot be compared are treated as different
        same = False
    if not same:
        raise StalePlanError(f"input {i} is {value!r}, but the plan was traced with {traced!r}: non-tensor "
                             "inputs are constants of the captured graph; profile and plan again for it")


# --- entry points -----------------------------------------------------------------------------------
def export(plan: Any, path: str | Path | None = None, *, model: nn.Module | None = None,
           overwrite: bool = False, verify: bool = False, inputs: Any = None, loss_fn: Any = None,
           optimizer: Any = None, backend: Any = None, scaler: Any = None) -> nn.Module:
    """An nn.Module running `plan`'s schedule with the original call signature (DESIGN.md).

    plan: a `memviz.Plan` (from `memviz.plan`, or `memviz.load_plan` together with ``model=``).  An
    autochunk plan gives a `memviz.plans.chunking.ChunkedModule` (regions as loops; ``path`` gets their code).
    path: also write readable Python source of the scheduled steps there, and the plan JSON beside it
    (``<path>.plan.json``); existing files are never overwritten unless ``overwrite=True``.
    model: the model to run (default: the profiled one).  A model whose parameters, or a plan whose
    inputs, differ from what was profiled raises `StalePlanError`.
    verify: run one measured step of the exported module first (`memviz.runtime.verify`): a step over the
    budget is re-planned with the measured excess as margin, or raises `BudgetExceededError`; the
    returned module's ``verified_peak_bytes`` is the measured peak and ``plan`` the plan it runs.  Off
    by default: it costs one training step (plus, with an optimizer, a host copy of the parameters),
    and `backend` exports graphs mid-trace, where no step can be run.
    inputs: example inputs, ``(args, kwargs)`` or a tuple of positional args: what a verifying step and
    a loaded plan's capture run on (default: the profiled structure, tensors rebuilt as zeros of the
    planned shapes on the model's device -- memory depends on shapes only).
    loss_fn, optimizer: the verifying step's loss and optimizer (default: the profile's; for a loaded
    plan the default loss and the ``torch.optim`` class its optimizer nodes name).
    scaler: the verifying step's ``torch.amp.GradScaler`` (default: the profile's): its loss scaled and its
    update through a copy of it, as the float16 recipe runs (`memviz.hardware.amp`).
    backend: with ``verify=True``, the torch.compile backend (``"inductor"``) the module will run under:
    the step verified is the compiled one (`memviz.runtime.verify`), and ``torch.compile(module,
    backend=backend)`` runs the compiled code that was measured.
    """
    if backend is not None and not verify:
        raise ValueError("backend= names what a verifying step compiles with: pass verify=True too (to "
                         "compile without verifying, call torch.compile on the exported module)")
    if verify:
        from memviz.runtime.verify import verified_export

        module = verified_export(plan, model=model, inputs=inputs, loss_fn=loss_fn, optimizer=optimizer,
                                 backend=backend, scaler=scaler)
        if path is not None:
            # the source of the plan that passed, written only once it passed
            _write_exported(module.plan, module, path, model, overwrite)
        return module
    module = build(plan, model=model, inputs=inputs)
    if path is not None:
        _write_exported(plan, module, path, model, overwrite)
    return module


def _write_exported(plan: Any, module: nn.Module, path: str | Path, model: nn.Module | None,
                    overwrite: bool) -> None:
    if getattr(plan, "strategy", None) == "autochunk":
        from memviz.plans.chunking import export_chunks

        export_chunks(plan, path, model=model, overwrite=overwrite)  # writes its loops' code
    else:
        write_source(plan, module.program, Path(path), overwrite=overwrite)


def build(plan: Any, *, model: nn.Module | None = None, inputs: Any = None) -> nn.Module:
    """The exported module for `plan` (what `export` returns), writing nothing and running nothing.

    A `ReplayWarning` names what the replayed graph cannot reproduce of the model's own code (forward hooks,
    module-level data its forward reads); backward hooks, whose gradient changes it would drop, raise
    `memviz.runtime.replay.UnfaithfulReplay` (`memviz.runtime.replay.check_replay`)."""
    prof = getattr(plan, "profile", None)
    target = model if model is not None else getattr(prof, "model", None)
    mode = (getattr(plan, "model", None) or {}).get("mode", getattr(prof, "mode", "train"))
    if getattr(plan, "strategy", None) == "autochunk":
        # a chunk plan rewrites the model into loops instead of scheduling the captured graph
        from memviz.plans.chunking import export_chunks

        if target is not None:
            check_replay(target, training=False, stacklevel=3)
        return export_chunks(plan, None, model=model)
    graph: Graph = plan.graph
    if getattr(prof, "not_exportable", None):  # a recorded parallel profile (memviz.parallel.distributed)
        raise ValueError(prof.not_exportable)
    if prof is not None and prof.captured is None:
        raise ValueError("this plan comes from a hook-based fallback profile (the model could not be "
                         "traced): it cannot be exported")
    if target is None:
        raise ValueError("the plan carries no model (loaded from JSON?): pass model=")
    check_replay(target, training=mode == "train", stacklevel=3)
    info = getattr(plan, "model", None)
    expected = info.get("fingerprint") if isinstance(info, dict) else None
    expected = expected or (prof.fingerprint if prof is not None else None)
    check_not_estimated_for_cuda(graph, prof, target)
    check_no_drawn_layers(graph)
    if prof is not None and (model is None or model is prof.model):
        captured, fp = prof.captured, prof.fingerprint
    else:
        args, kwargs = split_inputs(inputs) if inputs is not None else _example_inputs(graph, prof, target)
        fp = fingerprint(target, args, kwargs, mode)
        if expected and fp != expected:
            raise StalePlanError("the model differs from the one this plan was made for (parameter names, "
                                 "shapes or dtypes, or input shapes changed): profile and plan again")
        # in the autocast regions the plan was captured in (a plan file's ``graph.meta.autocast``): its
        # graph holds their casts, which a capture in the caller's state would not
        with accelerator.autocast_as(accelerator.autocast_from_json(graph.meta.get("autocast"))):
            fresh, captured = capture(target, args, kwargs, mode=mode, loss_fn=getattr(prof, "loss_fn", None))
        if graph.meta.get("grads") == "accumulate":  # the step the profile modelled (`profile(grads=)`)
            fresh = accumulated_into_grads(fresh, captured)
        check_plan_matches_capture(graph, fresh)
    if expected and fp != expected:
        raise StalePlanError("the plan's fingerprint does not match its profile: profile and plan again")
    program = compile_program(graph, captured, tuple(plan.schedule), fp)
    return PlannedModule(target, program)


def check_not_estimated_for_cuda(graph: Graph, prof: Any, target: nn.Module) -> None:
    """Refuse to export a plan estimated for a CUDA target on a CPU host (``device="fake:h100"``): its graph
    holds the kernels CUDA runs (fused attention, bool dropout masks), which the CPU has not, and the
    tensors the CPU trace made (index and mask constants) stay on the CPU, so on the GPU itself the step
    failed too (an H100, torch 2.11: ``index_select`` with a CPU index, `benchmarks/check_estimated_cuda.py`).
    Such a plan says what fits on the target; the export needs a profile taken on the device.  Its
    profile's capture says whose kernels it holds (`memviz.profiling.capture.kernel_family`); a plan
    without one (loaded from JSON) holds CUDA's where it was estimated for a CUDA target
    (`memviz.profiling.profile.target_kernels`)."""
    captured = getattr(prof, "captured", None)
    meta = graph.meta or {}
    estimated_cuda = captured.kernels == "cuda" if captured is not None else \
        bool(meta.get("estimated")) and devices.uses_caching_allocator(str(meta.get("device", "")))
    if not estimated_cuda:
        return
    where = sorted({t.device.type for t in [*target.parameters(), *target.buffers()]}) or ["no device"]
    raise ValueError(f"this plan was estimated for a CUDA target ({meta.get('device', 'cuda')}) on a host "
                     "without it: its graph holds the kernels CUDA runs (fused attention, bool dropout "
                     "masks) and tensors the host's trace made, and the model is on "
                     f"{', '.join(where)}; to export, profile and plan on the device itself "
                     "(memviz.profile(model.to('cuda'), ..., device='cuda')), or on this host's device for a "
                     "module that runs here")


def check_no_drawn_layers(graph: Graph) -> None:
    """Refuse to export a graph captured with a uniform draw deciding a branch (``graph.meta["drawn"]``,
    `memviz.profiling.capture.draws_at_their_top`: LayerDrop's ``torch.rand([]) < layerdrop`` skipping a
    layer).  The graph runs every such layer at every step, the upper bound its plans hold, where eager
    skips the layers each step's draws drop: the exported step would train another model.  memviz.apply
    runs the model's own forward, its draws and skips included, within the same plan."""
    drawn = (graph.meta or {}).get("drawn")
    if drawn:
        raise ValueError(
            f"this model skips layers on random draws (LayerDrop: {'; '.join(drawn)}): memviz.export runs "
            "one fixed graph, in which every layer runs at every step, so it cannot train as the model "
            "does.  The plan is the upper bound over the draws (no layer skipped): run it with "
            "memviz.apply(plan, model) (strategy='sac'), which keeps the model's own LayerDrop, or export a "
            "profile taken with LayerDrop off (layerdrop=0)")


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)``, a tuple or list of positional args, or one tensor -> ``(args, kwargs)``."""
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], dict) \
            and isinstance(inputs[0], (tuple, list)):
        return tuple(inputs[0]), dict(inputs[1])
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def check_plan_matches_capture(plan_graph: Graph, captured: Graph) -> None:
    """Refuse a plan whose graph is not the model's own capture (`StalePlanError` naming the first
    difference).  A plan file can be edited and stay self-consistent -- its timelines re-simulated --
    while claiming what the model does not do: a gradient dropped from the outputs exports a module
    whose gradient is None, activations shrunk to a byte claim a peak the run never has."""
    why = plan_capture_difference(plan_graph, captured)
    if why is not None:
        raise StalePlanError(f"the plan's graph is not this model's capture: {why}; the plan file was edited "
                             "or made for another model: profile and plan again")


_DATA_FIELDS = ("kind", "shape", "dtype", "bytes", "producer", "aliases")
_COMPUTE_FIELDS = ("name", "op", "phase", "inputs", "outputs", "mutates")
_LOSS_OPS = frozenset({"loss_fn", "loss_fn.backward"})  # the synthetic loss nodes (`capture.add_loss_nodes`)


def plan_capture_difference(plan_graph: Graph, captured: Graph) -> str | None:
    """The first difference between a plan's graph and a fresh capture of the model, or None.

    Compared: every data node's kind, shape, dtype, bytes, producer and aliases, every compute's name,
    op, phase, edges and in-place writes, and the outputs (each parameter gradient among them).  Times,
    workspace sizes and the bytes of the loss's own nodes are measurements and may differ; names of data
    nodes are labels.  A profile with an optimizer appends optimizer-phase computes and their state after the
    captured nodes."""
    if len(plan_graph.datas) < len(captured.datas) or len(plan_graph.computes) < len(captured.computes):
        return (f"it has {len(plan_graph.computes)} computes and {len(plan_graph.datas)} data nodes, the "
                f"capture {len(captured.computes)} and {len(captured.datas)}")
    # what the user's loss holds is measured on the device the profile ran on (`capture.loss_memory`);
    # a capture measures it on fake tensors: those bytes, like times, may differ
    measured = {d for c in captured.computes if c.op in _LOSS_OPS for d in c.outputs}
    for a, b in zip(plan_graph.datas, captured.datas, strict=False):
        for f in _DATA_FIELDS:
            if f == "bytes" and b.id in measured:
                continue
            if getattr(a, f) != getattr(b, f):
                return (f"data node {b.id} ({b.name!r}) has {f} {getattr(a, f)!r} in the plan but "
                        f"{getattr(b, f)!r} in the capture")
    for a, b in zip(plan_graph.computes, captured.computes, strict=False):
        for f in _COMPUTE_FIELDS:
            if getattr(a, f) != getattr(b, f):
                return (f"compute node {b.id} ({b.name!r}) has {f} {getattr(a, f)!r} in the plan but "
                        f"{getattr(b, f)!r} in the capture")
    for c in plan_graph.computes[len(captured.computes):]:
        if c.phase.value != "optimizer":
            return f"compute node {c.id} ({c.name!r}) is not in the capture"
    for d in plan_graph.datas[len(captured.datas):]:
        if d.producer is not None and d.producer < len(captured.computes):
            return f"data node {d.id} ({d.name!r}) is not in the capture"
    outputs = set(plan_graph.outputs)
    for d in captured.outputs:
        if d not in outputs:
            what = "parameter gradient" if captured.datas[d].kind.value == "parameter_gradient" else "output"
            return f"{what} data node {d} ({captured.datas[d].name!r}) of the capture is not a plan output"
    expected = set(captured.outputs)
    for d in plan_graph.outputs:
        if d < len(captured.datas) and d not in expected:
            return f"data node {d} ({captured.datas[d].name!r}) is a plan output but not a capture output"
    return None


def _example_inputs(graph: Graph, prof: Any, model: nn.Module | None = None) -> tuple[tuple[Any, ...],
                                                                                     dict[str, Any]]:
    """Example (args, kwargs) to trace again, as zeros on `model`'s device (the CPU without one; a
    model on a GPU traced with CPU inputs failed its first ``index_select``): the profiled call's
    structure, constants, tensor shapes and repeated tensors (``model(ids, labels=ids)``: one tensor
    twice, or the capture's aliases differ) when the profile is at hand, else positional tensors rebuilt
    from the graph's input nodes."""
    device = next((t.device for t in [*model.parameters(), *model.buffers()]), None) if model else None
    if prof is not None and getattr(prof, "captured", None) is not None:
        cap = prof.captured
        flat: list[Any] = []
        for i, m in enumerate(cap.input_meta):
            shared = cap.input_shared.get(i)
            flat.append(cap.input_consts.get(i) if m is None else flat[shared] if shared is not None else
                        torch.zeros(m[0], dtype=m[1], device=device).requires_grad_(i in cap.input_grad_data))
        args, kwargs = pytree.tree_unflatten(flat, cap.in_spec)
        return tuple(args), dict(kwargs)
    inputs = sorted((d for d in graph.datas if d.kind.value == "input"), key=lambda d: int(d.name[5:]))
    return tuple(torch.zeros(d.shape, dtype=getattr(torch, d.dtype), device=device) for d in inputs), {}


# --- generated step functions ------------------------------------------------------------------------
_RESERVED = frozenset({"torch", "operator", "memviz", "env", "rng", "buffers", "grad_outputs", "out_",
                       "outputs_", "forward_steps", "backward_steps", "backward_rest", "into_grad"})
# functional operator -> its in-place form and, per output that is a buffer's new value, the argument
# (the old value) it updates.  Functionalization turns eager's in-place BatchNorm statistics update into
# clones of the running statistics and new values the step copied back, and ``num_batches_tracked += 1``
# into an add and a copy: six extra operator calls per BatchNorm in a step, 0.19 ms of bench_remat's
# 26 ms ResNet step (15 BatchNorms; those lines alone, 300 interleaved pairs of CPU time, load 7.5)
_IN_PLACE = {
    torch.ops.aten._native_batch_norm_legit_functional.default:
        (torch.ops.aten._native_batch_norm_legit.default, {3: 3, 4: 4}),
    torch.ops.aten.add.Tensor: (torch.ops.aten.add_.Tensor, {None: 0}),  # None: the op's one output
}


class _Codegen:
    """The Program's steps as straight-line Python: one function per phase (forward; backward while
    autograd holds the output gradients; the rest of the backward), compiled once and run by the
    exported module, and written as is by ``path=``.

    Each FX value is a local variable (``_`` + its name); a ``free`` is a ``del``, so the storage goes
    exactly where `solvers.simulate` releases it.  A view (or any value that owns no storage) is bound
    once, where first read, and deleted with its storage's free, so it never keeps a freed storage
    alive.  What a later phase needs crosses the function boundary in `env` (FX name -> tensor): a
    function loads a value from it where it first reads it (popping it when it frees or recomputes
    it), and stores back what it computed that is still alive when it returns."""

    def __init__(self, program: Program) -> None:
        self.p = program
        cap = self.cap = program.captured
        graph_nodes = list(cap.gm.graph.nodes)
        self.nodes = {n.name: n for n in graph_nodes}
        self.locals = {n.name: _local_name(n.name, i) for i, n in enumerate(graph_nodes)}
        self.owners = cap.compute_fx_set
        placeholders = {name for name, _, _ in program.placeholder_table} | set(cap.constants)
        elems = {g for pairs in cap.elem_fx.values() for _, g in pairs}
        # values that live in `env` or a local between steps (the rest is derived from them on demand)
        self.stored = (placeholders | set(cap.tangent_fx.values()) | elems
                       | {n for n in self.owners if n not in cap.elem_fx})
        self.live = set(placeholders)  # stored values alive at this point of the step
        self.ops: dict[Any, str] = {}  # FX target -> the module-level name it is bound to
        self.op_lines: list[str] = []
        self.first_done: set[int] = set()  # computes that ran once already in the step
        # step index -> outputs that run in place in an input the schedule frees right after
        self.reused = reused_in_place(program.graph, (*program.forward_steps, *program.backward_steps))
        # canonical parameter name -> its placeholder, for the parameters whose .grad the step adds into
        self.param_fx = {}
        for name, kind, key in program.placeholder_table:
            if kind == "param":
                self.param_fx.setdefault(cap.param_names.get(key, key), name)
        self.into_grad = {n for names in program.into_grad.values() for n in names}

    # -- one function ---------------------------------------------------------------------------------
    def function(self, name: str, steps: Sequence[Step], doc: str, returns: str, start: int) -> list[str]:
        """`steps` are the schedule's from index `start` on."""
        self.lines: list[str] = []
        self.bound: dict[str, bool] = {}  # stored value -> whether this function must store it back
        self.derived: dict[str, int | None] = {}  # bound derived value -> the data node of its storage
        self.changed = self._changed(steps)  # values freed or assigned here: popped from env when loaded
        self.handed = returns != "outputs"  # the outputs are taken where the user's loss reads them
        for i, step in enumerate(steps, start):
            if step.op == "free":
                self.free(step.node)
            else:
                self.compute(step.node, bool(self.reused.get(i)))
        result = self.gradients() if returns == "grads" else None
        if returns == "outputs":
            result = "outputs_" if self.handed else self.outputs()
        if returns != "grads":  # the step ends with the gradients: nothing is read after them
            self.lines += [f"    env[{_str(n)}] = {self.locals[n]}" for n, back in self.bound.items()
                           if back and n in self.live]
        if result is not None:
            self.lines.append(f"    return {result}")
        head = [f"def {_identifier(name)}(env, rng, buffers, grad_outputs=None):", f"    {_str(doc)}"]
        return [*head, *self.lines, ""]

    def _changed(self, steps: Sequence[Step]) -> set[str]:
        cap, changed = self.cap, set()
        for step in steps:
            if step.op == "free":
                changed.update(n for n in (cap.data_fx[step.node], *cap.held_fx.get(step.node, ())) if n)
            elif step.node < len(cap.compute_fx) and cap.compute_fx[step.node] is not None:
                fx = cap.compute_fx[step.node]
                changed.update([g for _, g in cap.elem_fx[fx]] if fx in cap.elem_fx else [fx])
        return changed

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    # -- reading values -------------------------------------------------------------------------------
    def read(self, a: Any) -> str:
        """`a` (an FX argument) as an expression, binding what it needs first.  An operator's argument
        that is a ``detach`` of a value is that value: inside the step functions nothing records
        gradients, so the alias would change nothing but cost a dispatch."""
        if isinstance(a, torch.fx.Node):
            while a.target is torch.ops.aten.detach.default and a.name not in self.stored:
                a = a.args[0]
            if a.name in self.cap.reads_instead:  # a buffer's new value, written back: the buffer
                a = self.nodes[self.cap.reads_instead[a.name]]
            return self.value(a)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.read(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{_literal(k)}: {self.read(v)}" for k, v in a.items()) + "}"
        return _literal(a)

    def value(self, node: torch.fx.Node) -> str:
        name, local = node.name, self.locals[node.name]
        if name in self.stored:
            if name not in self.live:
                raise ValueError(f"cannot generate the plan's steps: a step reads {name!r} where the "
                                 "schedule has freed it or not computed it yet")
            if name not in self.bound:  # alive since an earlier phase: load it from env
                pop = name in self.changed
                self.emit(f"{local} = env.pop({_str(name)})" if pop else f"{local} = env[{_str(name)}]")
                self.bound[name] = pop
            return local
        if name in self.derived:
            return local
        if node.op != "call_function" or name in self.owners:
            raise ValueError(f"cannot generate the plan's steps: {name!r} is not a value a step can read")
        call = self.call(node)
        self.emit(f"{local} = {call}")
        self.derived[name] = self.cap.data_of_fx.get(name)
        return local

    def call(self, node: torch.fx.Node, target: Any = None) -> str:
        """`node`'s call, or that of `target` (its in-place form) on the same arguments."""
        parts = [self.read(a) for a in node.args]
        parts += [f"{_identifier(k)}={self.read(v)}" for k, v in node.kwargs.items()]
        return f"{self.op(node.target if target is None else target)}({', '.join(parts)})"

    def op(self, target: Any) -> str:
        """The module-level name `target` is bound to (bound once, at import: no lookups per call)."""
        if target not in self.ops:
            path = _target(target)
            base = "_".join(path.split(".")[2:]).removesuffix("_default") if path.startswith("torch.ops.") \
                else path.split(".")[-1]
            name = base if not base.startswith("_") and base not in _RESERVED else f"op_{base}"
            if name in self.ops.values():
                name = f"{name}_{len(self.ops)}"
            self.ops[target] = name
            # an OpOverload's ``__call__`` is a Python frame around ``_op``, the C++ operator: bound to
            # ``_op`` each call skips it (tiny-GPT eager schedule 1.19x -> 1.06x of eager, issue 22)
            bound = f"{path}._op" if path.startswith("torch.ops.") else path
            self.op_lines.append(f"{name} = {bound}")
        return self.ops[target]

    # -- steps ----------------------------------------------------------------------------------------
    def compute(self, c: int, reuses: bool = False) -> None:
        """`reuses`: run the op in place in the input the schedule frees right after it, as eager does
        (`solvers.simulate.reused_in_place`, `memviz.plans.sac.reusable_in_place`)."""
        cap, gc = self.cap, self.p.graph.computes[c]
        # names from the model or a plan file reach comments only as ASCII string literals (`_str`)
        where = f" | {_str(gc.module or '-')} | {_str(gc.source)}" if gc.source else ""
        if c == cap.loss_backward_compute:
            self.emit("# compute loss_backward: the output gradients arrive from autograd")
            for i, name in sorted(cap.tangent_fx.items()):
                self.assign(name)
                self.emit(f"{self.locals[name]} = grad_outputs[{_int(i)}]")
            return
        if c == cap.loss_compute and not self.handed:
            # the outputs go to the user's loss here; what the schedule frees after it is memviz's own
            # reference only (the user drops them once the loss has read them, as in eager)
            self.emit(f"# compute {_str(gc.name)}: the user's loss reads the outputs ({_str(gc.op)})")
            self.emit(f"outputs_ = {self.outputs()}")
            self.handed = True
            return
        if c >= len(cap.compute_fx) or cap.compute_fx[c] is None:
            self.emit(f"# compute {_str(gc.name)}: runs outside the module ({_str(gc.op)})")
            return
        node = self.nodes[cap.compute_fx[c]]
        self.emit(f"# compute {_str(gc.name)}{where}")
        # binds the views it reads before anything is replaced
        # a gradient sum runs in place where the plan's graph says so (also in a plan made for eager
        # autograd, `capture.summed_as_eager`, whose model holds eager's out-of-place result beside it)
        in_place = c in cap.accumulates and bool(gc.mutates)
        first = c not in self.first_done
        written = self.written_in_place(c, node) if first else set()
        if in_place:
            call = self.accumulate(node, cap.accumulates[c])
        elif written:
            call = self.call(node, _IN_PLACE[node.target][0])
        elif reuses:
            call = self.call(node, in_place_op(node))
        else:
            call = self.call(node)
        elems = cap.elem_fx.get(node.name)
        if elems is not None:
            elems = [(i, g) for i, g in elems if g not in written]
        outs = [n for n in ([node.name] if elems is None else [g for _, g in elems]) if n not in written]
        for name in outs:
            self.assign(name)
        self.first_done.add(c)
        indent = ""
        if c in self.p.random:
            if first:  # the global stream advances as in eager; a recomputation replays this state
                self.emit(f"rng.save({_int(c)})")
            else:
                self.emit(f"with rng.replay({_int(c)}):")
                indent = "    "
        if elems is None:
            self.emit(f"{indent}{call}" if not outs else f"{indent}{self.locals[node.name]} = {call}")
        else:
            self.emit(f"{indent}out_ = {call}")
            self.lines += [f"    {self.locals[g]} = out_[{_int(i)}]" for i, g in elems]
            self.emit("del out_")
        if first:  # mutated buffers (BatchNorm statistics) are written back once per step
            for fx, fqn in self.p.buffer_updates.get(c, ()):
                if fx not in written:
                    self.emit(f"buffers[{_str(fqn)}].copy_({self.value(self.nodes[fx])})")
        for name in self.p.into_grad.get(c, ()):
            self.add_into_grad(name)

    def add_into_grad(self, name: str) -> None:
        """Parameter `name`'s new gradient added into its ``.grad`` (`add_into_grad`), then released: the
        plan's data node for it is a 0-byte token from here (`capture.accumulated_into_grads`)."""
        cap = self.cap
        g = cap.grad_data[name]
        # the gradient's own FX value: a view of its storage is replayed from it, shaped as the parameter
        fx = cap.grad_fx.get(("grad", name), cap.data_fx[g])
        param = self.value(self.nodes[self.param_fx[name]])
        self.emit(f"into_grad({param}, {self.value(self.nodes[fx])})  # .grad += new, as AccumulateGrad")
        self.free(g)

    def written_in_place(self, c: int, node: torch.fx.Node) -> set[str]:
        """The buffers' new values (FX names) that `node`'s in-place form (`_IN_PLACE`) writes straight
        into the buffers, as eager does, at its first execution; empty where it cannot: each new value
        must be written back into the buffer that the matching argument reads, and nothing else may read
        that argument's old value.  A recomputation runs the functional form: it reads the updated
        buffer, which changes only the new values, never used again, as the BatchNorm output and saved
        statistics of training mode do not depend on the running statistics."""
        if node.target not in _IN_PLACE:
            return set()
        _, updates = _IN_PLACE[node.target]
        elems = dict(self.cap.elem_fx.get(node.name, ()))
        written_back = {fx for fx, _ in self.p.buffer_updates.get(c, ())}
        found = set()
        for out, arg in updates.items():
            fx = node.name if out is None else elems.get(out)
            old = node.args[arg]
            if (fx not in written_back or not isinstance(old, torch.fx.Node)
                    or self.cap.reads_instead.get(fx) != old.name or set(old.users) != {node}):
                return set()
            found.add(fx)
        return found

    def accumulate(self, node: torch.fx.Node, slot: int) -> str:
        """A gradient sum (``aten.add``, alpha 1) as ``add_`` into its argument `slot`, the buffer the
        sum reuses (`capture.accumulate_in_place`); the operands swap when `slot` is the second, which
        changes no bit (IEEE addition commutes)."""
        a, b = node.args if slot == 0 else node.args[::-1]
        return f"{self.op(torch.ops.aten.add_.Tensor)}({self.read(a)}, {self.read(b)})"

    def assign(self, name: str) -> None:
        """`name` gets a new value here: views of its storage and an older value of it go first."""
        self.drop_derived(self.cap.data_of_fx.get(name))
        if name in self.live and name not in self.bound:
            self.emit(f"del env[{_str(name)}]")
        self.live.add(name)
        self.bound[name] = True

    def drop_derived(self, d: int | None) -> None:
        gone = [n for n, of in self.derived.items() if d is not None and of == d]
        for n in gone:
            del self.derived[n]
        if gone:
            self.emit(f"del {', '.join(self.locals[n] for n in gone)}")

    def free(self, d: int) -> None:
        cap = self.cap
        label = self.p.graph.datas[d].name
        self.drop_derived(d)
        names = [n for n in (cap.data_fx[d], *cap.held_fx.get(d, ())) if n is not None and n in self.live]
        if not names:
            self.emit(f"# free {_str(label)} (not held)")
            return
        targets = []
        for n in names:
            self.live.discard(n)
            targets.append(self.locals[n] if self.bound.pop(n, None) is not None else f"env[{_str(n)}]")
        self.emit(f"del {', '.join(targets)}  # free {_str(label)}")

    # -- what the phases return -----------------------------------------------------------------------
    def outputs(self) -> str:
        """The model's flat outputs (None where one is rebuilt from its base outside the step)."""
        cap = self.cap
        outs = pytree.tree_leaves(cap.gm.graph.output_node().args[0], is_leaf=lambda x: x is None)
        flat: dict[int, str] = {}
        for node, kind in zip(outs, cap.outputs, strict=True):
            if kind is not None and kind[0] == "user" and kind[1] not in cap.output_views:
                flat[kind[1]] = self.value(node) if isinstance(node, torch.fx.Node) else _literal(node)
        return "[" + ", ".join(flat.get(i, "None") for i in range(cap.out_spec.num_leaves)) + "]"

    def gradients(self) -> str:
        """Each parameter's gradient, then each input's (`Program.grad_keys`); None where there is none."""
        cap, exprs = self.cap, []
        for kind, key in self.p.grad_keys:
            if kind == "grad" and key in self.into_grad:  # added into .grad already: autograd gets None
                exprs.append("None")
                continue
            d = cap.grad_data.get(key) if kind == "grad" else cap.input_grad_data.get(key)
            # the gradient's own FX value: a view of its storage is replayed from it, shaped as the parameter
            fx = None if d is None else cap.grad_fx.get((kind, key), cap.data_fx[d])
            exprs.append("None" if fx is None or (fx in self.stored and fx not in self.live)
                         else self.value(self.nodes[fx]))
        return "[" + ", ".join(exprs) + "]"

    # -- the whole module -----------------------------------------------------------------------------
    def source(self) -> str:
        p = self.p
        docs = {"forward_steps": "Forward part: everything before the output gradients arrive.",
                "backward_steps": "Backward while autograd holds the output gradients (to their last use).",
                "backward_rest": "Rest of the backward: recomputations, gradients, frees."}
        body = []
        for name, steps, returns, start in p.phases:
            body += [*([""] if body else []), *self.function(name, steps, docs[name], returns, start)]
        cap = self.cap
        # a gradient that is a view of its storage is its own FX value (`Captured.grad_fx`)
        grads = [(n, cap.grad_fx.get(("grad", n), cap.data_fx[d])) for n, d in cap.grad_data.items()]
        head = [
            "import operator  # noqa: F401",
            "",
            "import torch",
            "",
            "import memviz.profiling.capture  # noqa: F401  (registers torch.ops.memviz.*)",
            *(["import memviz.runtime.export"] if self.into_grad else []),
            "",
            f"FINGERPRINT = {_str(p.fingerprint)}",
            f"MODE = {_str(p.mode)}",
            f"PLACEHOLDERS = {_data(_placeholder_table(cap))}",
            f"PARAMS = {_data(list(p.params))}",
            f"GRADS = {_data(grads)}",
            f"INPUTS = {_data([(list(m[0]), str(m[1])) if m else None for m in cap.input_meta])}",
            "",
            *(["# .grad += new gradient (memviz.profile(grads='accumulate'))",
               "into_grad = memviz.runtime.export.add_into_grad", ""] if self.into_grad else []),
            "# the operators the steps call, bound once",
            *self.op_lines,
            "",
            "",
        ]
        return "\n".join(head + body)


def _local_name(name: str, index: int) -> str:
    """The local variable holding FX value `name`: ``_`` + the name when that is a plain ASCII
    identifier (so it never shadows a module-level name, which never starts with ``_``), else the node's
    position."""
    return f"_{name}" if name.isidentifier() and name.isascii() else f"_{index}"


# Everything generated source holds that did not come from this file is one of: a string literal of
# printable ASCII (`_str`, so no quote, newline, \r, NUL, U+2028 or U+0085 can end it or the comment
# it sits in), an int or float literal of an exact built-in type, a checked Python identifier, or a
# torch attribute path checked against its pattern.  Anything else refuses to be written.
_TORCH_ATTR = re.compile(r"torch\.[A-Za-z_][A-Za-z0-9_]*")


def _str(x: Any) -> str:
    """A name from the model or a plan file as a Python string literal of printable ASCII only."""
    if not isinstance(x, str):
        raise ValueError(f"cannot write source: expected a name, got {type(x).__name__}")
    return ascii(str(x))  # str(): a str subclass could override __repr__


def _int(x: Any) -> str:
    if type(x) is not int:  # bool, numpy and subclasses could print as anything
        raise ValueError(f"cannot write source: expected an int, got {type(x).__name__}")
    return repr(x)


def _identifier(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise ValueError(f"cannot write source: {name!r} is not a Python identifier")
    return str(name)


def _target(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        ns, op = target._schema.name.split("::")
        return f"torch.ops.{_identifier(ns)}.{_identifier(op)}.{_identifier(target._overloadname)}"
    if target is operator.getitem:
        return "operator.getitem"
    raise ValueError(f"cannot write source for FX target {target!r}")


def _literal(x: Any) -> str:
    """A constant argument of an FX operator as Python source; unknown types are refused."""
    if isinstance(x, (torch.dtype, torch.layout, torch.memory_format)):
        text = str(x)
        if not _TORCH_ATTR.fullmatch(text):
            raise ValueError(f"cannot write source for constant {text!r}")
        return text
    if isinstance(x, torch.device):
        return f"torch.device({_str(str(x))})"
    if x is None or type(x) is bool:
        return repr(x)
    if type(x) is int:
        return _int(x)
    if type(x) is float:
        return f"float({str(x)!r})" if x != x or x in (float("inf"), float("-inf")) else repr(x)
    if type(x) is complex:
        return f"complex({_literal(x.real)}, {_literal(x.imag)})"
    if type(x) is str:
        return _str(x)
    if type(x) is slice:
        return f"slice({_literal(x.start)}, {_literal(x.stop)}, {_literal(x.step)})"
    if x is Ellipsis:
        return "..."
    raise ValueError(f"cannot write source for a constant of type {type(x).__name__}")


def _data(x: Any) -> str:
    """A metadata table (lists, tuples, dicts of names and numbers) as a Python literal."""
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        inner = ", ".join(_data(a) for a in x)
        return f"[{inner}]" if type(x) is list else f"({inner}{',' if len(x) == 1 else ''})"
    if type(x) is dict:
        return "{" + ", ".join(f"{_data(k)}: {_data(v)}" for k, v in x.items()) + "}"
    return _literal(x)


def _placeholder_table(cap: Captured) -> list[tuple[str, tuple[str, Any]]]:
    nodes = cap.gm.graph.find_nodes(op="placeholder")
    return [(n.name, k) for n, k in zip(nodes, cap.placeholders, strict=True)]


def program_source(program: Program, plan: Any) -> str:
    """The source ``path=`` writes: the plan's name, strategy and peak, then `Program.source` -- the very
    code the exported module runs."""
    budget = getattr(plan, "budget_bytes", None)
    header = [
        # the docstring is fixed text: the plan's names follow as string literals (MODEL, STRATEGY)
        '"""Generated by memviz.export: a memory plan as straight-line PyTorch code.',
        "",
        "Each step is one operator of the captured joint graph, each value a local variable; a `del` is a",
        "free; `env` carries what a later phase reads; `rng.save(c)` records the random state of operator c",
        "before its first run, `rng.replay(c)` restores it for a recomputation.",
        "Load it with memviz.runtime.export.load_source(path, model).",
        '"""',
        "",
        f"MODEL = {_str(plan.graph.name)}",
        f"STRATEGY = {_str(str(getattr(plan, 'strategy', '?')))}",
        f"PLANNED_PEAK_BYTES = {_int(plan.peak_bytes)}",
        f"BUDGET_BYTES = {'None' if budget is None else _int(budget)}",
        "",
    ]
    return "\n".join(header) + "\n" + program.source


def write_source(plan: Any, program: Program, path: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write the program's source to `path` and the plan JSON beside it; never clobber unless asked.

    Both texts are made (and checked) before either file is written; each is written atomically by
    `planfile.write_text_safely` (missing folders created, a symlink at the target replaced, never
    followed); when the plan JSON cannot be written, a source file this call created is removed."""
    from memviz.plans.planfile import document_text, write_text_safely

    plan_path = path.with_suffix(".plan.json")
    for p in (path, plan_path):
        if os.path.lexists(p) and not overwrite:
            raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
    source = program_source(program, plan)
    compile(source, str(path), "exec")  # never write code that does not parse
    doc_text = document_text(plan.to_dict(), "plan to save") if hasattr(plan, "to_dict") else None
    created = not os.path.lexists(path)
    write_text_safely(path, source, overwrite=overwrite)
    if doc_text is not None:
        try:
            write_text_safely(plan_path, doc_text, overwrite=overwrite)
        except BaseException:
            if created:  # nothing half-written: the source alone would load another plan's JSON later
                path.unlink(missing_ok=True)
            raise
    return path, plan_path


def load_source(path: str | Path, model: nn.Module, plan: Any = None) -> PlannedModule:
    """Rebuild the exported module from source written by ``export(plan, path=...)`` and the original model.

    The file's step functions run instead of the ones `export` compiles from the plan (the same code
    when the file is unedited); the model's state (parameters, buffers) is the one passed in.  `plan`
    defaults to the plan JSON written beside the source."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"memviz_generated_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    if plan is None:
        from memviz.plans.planning import load_plan

        plan = load_plan(path.with_suffix(".plan.json"))
    exported = export(plan, model=model)
    if mod.FINGERPRINT != exported.program.fingerprint:
        raise StalePlanError("the generated source belongs to another model or plan (fingerprint differs)")
    exported._generated = mod
    return exported




__all__ = ["BudgetExceededError", "PlannedModule", "StalePlanError", "backend", "build",
           "check_plan_matches_capture", "export", "load_source", "plan_capture_difference", "program_source",
           "write_source"]


# --- torch.compile ---------------------------------------------------------------------------------------
def backend(budget: int | float | str | None = None, *, strategy: str = "auto", time_limit: float = 60.0,
            loss_fn: Any = None) -> Any:
    """A ``torch.compile`` backend that plans each captured graph under `budget` and runs the plan:
    ``torch.compile(model, backend=memviz.backend(budget="50%"), dynamic=False)``.

    Each graph Dynamo hands over is profiled on its example inputs (parameters arrive as inputs that
    require grad, whose gradients the planned module returns), planned with `memviz.plan` and exported.
    Budgets as in `memviz.plan` (bytes, "1.5GiB", or a fraction of the graph's eager peak); a budget no
    schedule fits raises the planner's error.  Shapes are specialised: use ``dynamic=False``."""
    from memviz.plans.planning import plan as make_plan
    from memviz.profiling.profile import profile

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if any(isinstance(x, torch.SymInt) for x in example_inputs):
            raise ValueError("memviz.backend plans fixed shapes: compile with dynamic=False")
        train = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in (*example_inputs, *gm.parameters()))
        prof = profile(gm, tuple(example_inputs), mode="train" if train else "inference", loss_fn=loss_fn,
                       measure=False, repeats=1, warmup=0, fallback=False)
        planned = export(make_plan(prof, budget, strategy=strategy, time_limit=time_limit))
        compile_graph.plans.append(planned)
        return planned.forward

    compile_graph.plans = []  # type: ignore[attr-defined]  # the exported modules, for inspection
    return compile_graph
