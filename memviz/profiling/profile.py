"""`memviz.profile`: capture a model, cost every operator on a device, simulate PyTorch's eager order.

Costs (Checkmate Sec. 4.4 profiles each op's time; Rockmate Appendix B.2 its memory):

* real device: the captured joint graph is replayed node by node in capture order; each operator runs
  ``warmup`` times, then ``repeats`` times timed (on the CPU on one intra-op thread, this process's CPU
  time: `accelerator.timing_threads`; CUDA events on GPU) and the fastest run is kept, stopping early
  within a time budget per operator or once runs agree (`_Timer`);
  operators identical in op, shapes, strides and dtypes share one measurement (`op_key`) and are not
  run again.  On CUDA the transient workspace is the allocator's peak during the op minus what the op
  returns; on CPU it is not observable and recorded as 0.
* ``device="fake:<target>"``: FLOPs from ``FlopCounterMode`` on fake tensors and bytes read+written,
  through the target's roofline (`memviz.hardware.devices`).  Nothing runs and no real memory is allocated.
  A real device whose available memory cannot hold one step (predicted from the fake-tensor capture)
  gets the same estimate for itself, with a `ProfileWarning`.

The baseline is the eager schedule (capture order, free after last use) through `solvers.simulate`;
on a real device `measured_peak_bytes` is what the original model really holds while running the same
step eagerly (live-storage tracker on CPU, allocator statistics on CUDA), without changing the model.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import copy
import functools
import inspect
import linecache
import operator
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from memviz.budget import format_bytes
from memviz.hardware import accelerator, amp, devices, xla
from memviz.hardware.devices import DeviceInfo, count_flops, resolve_device
from memviz.profiling import own_checkpointing
from memviz.profiling.capture import (
    GRADS,
    Captured,
    CaptureError,
    LossFn,
    Runner,
    accumulated_grads,
    accumulated_into_grads,
    buffers_kept,
    capture,
    default_loss,
    draws_at_their_top,
    fingerprint,
    forward_calls,
    is_backward,
    op_key,
    summed_as_eager,
    with_loss_memory,
    with_output_views,
)
from memviz.profiling.composite import composite_holds, with_dropped_results
from memviz.profiling.saved import autograd_saved_holds, gradient_input_holds
from memviz.profiling.tracker import StorageTracker, grad_alias, measure_peak, tensors_of
from solvers import (
    ComputeNode,
    DataKind,
    DataNode,
    Graph,
    GraphBuilder,
    Phase,
    Timeline,
    eager_schedule,
    simulate,
)
from solvers.schedule import Schedule, Step

__all__ = ["CaptureError", "Profile", "ProfileWarning", "profile"]


@dataclass
class Profile:
    """A profiled model: its CD-graph with costs and the baseline (eager) timeline.

    `captured` is what `memviz.export` replays (None for a hook-based fallback profile, which cannot
    be exported).  `model` is a reference to the user's model, never modified."""

    graph: Graph
    baseline: Timeline
    baseline_schedule: Schedule
    measured_peak_bytes: int | None
    device: DeviceInfo
    mode: str
    model_name: str
    fingerprint: str
    captured: Captured | None
    model: nn.Module = field(repr=False)
    loss_fn: LossFn | None = field(default=None, repr=False)
    optimizer: Any = field(default=None, repr=False)
    #: the torch.amp.GradScaler of a float16 step (`memviz.hardware.amp`): memviz's own steps scale by a copy
    scaler: Any = field(default=None, repr=False)
    fallback: bool = False
    input_spec: list[tuple[tuple[int, ...], torch.dtype] | None] = field(default_factory=list)
    #: the graph `baseline` runs on when eager holds what `graph`'s plans do not (`capture.summed_as_eager`:
    #: a tied weight's gradient sum); None: `graph`
    baseline_graph: Graph | None = None
    #: where the model calls ``torch.utils.checkpoint`` itself (module paths; `own_checkpointing`): the graph,
    #: the baseline, ``measured_peak_bytes`` and every plan are of the model without that checkpointing
    own_checkpointing: list[str] = field(default_factory=list)
    #: the peak one eager step holds with the model's own checkpointing on (as it runs today); None when it
    #: has none or nothing was measured
    as_run_peak_bytes: int | None = None

    @property
    def peak_bytes(self) -> int:
        return self.baseline.peak_bytes

    def with_costs(self, device: str | DeviceInfo) -> Profile:
        """This profile with every operator re-costed on `device` (a ``"fake:<target>"`` name or a
        `DeviceInfo` with a roofline target: `estimate_costs`) and its baseline timed on those costs.

        Costs that do not move with the machine's load, for plans that must be the same on every run
        (the tests' fixed costs).  Re-costing the graph alone (``dataclasses.replace(prof, graph=...)``)
        kept a baseline timed on the measured op times, and every plan's `time_overhead` compared its own
        op times with those (issue 18).  Memory, the schedule, the device the module runs on and the
        measured per-step costs in the graph's metadata stay the profile's."""
        info = devices.named_device(device) if isinstance(device, str) else device
        if self.captured is None:
            raise ValueError("a hook-based fallback profile has no captured operators to re-cost")
        graph = estimate_costs(self.graph, self.captured, info)
        eager_graph = _as_eager(graph, self.captured)
        return replace(self, graph=graph, baseline=simulate(eager_graph, self.baseline_schedule).check(),
                       baseline_graph=None if eager_graph is graph else eager_graph)

    @property
    def specialised(self) -> list[str]:
        """Python branches on tensor values the capture took as the example input takes them
        (``"file:line code: expr -> value"``): the graph, its plans and the exported module always take
        that branch."""
        return list(self.captured.specialised) if self.captured is not None else []


def profile(model: nn.Module, args: Any, kwargs: dict[str, Any] | None = None, *, mode: str = "train",
            loss_fn: LossFn | None = None, optimizer: Any = None, device: str | torch.device | None = None,
            fallback: bool = True, repeats: int = 3, warmup: int = 1, measure: bool = True,
            parallel: Any = None, grads: str = "none", scaler: Any = None) -> Profile:
    """Capture `model` on `args`/`kwargs` and profile it (DESIGN.md public API).

    mode: ``"train"`` (forward, loss, backward, and the optimizer step when `optimizer` is given) or
    ``"inference"`` (forward under ``no_grad``; the model's own train/eval state is kept).
    loss_fn: ``loss_fn(output) -> scalar``; default `memviz.profiling.capture.default_loss` (the sum of every
    floating output tensor, like ``out.sum()``).
    optimizer: a ``torch.optim.Optimizer`` class or instance; its state and step are added per parameter
    from the state layout the optimizer really creates (measured on a tiny tensor), not traced.
    device: ``None`` (where the model lives), ``"cpu"``, ``"cuda"``, ``"neuron"``, ``"xla"`` (torch-xla: the
    step is measured per graph, `memviz.hardware.xla`) or ``"fake:<target>"``.
    fallback: when the model cannot be traced, warn and return a coarse module-level profile built from
    forward/backward hooks (``Profile.fallback`` is True; it cannot be exported).  With ``False`` the
    `CaptureError` (naming the module and source line) is raised.

    scaler: the ``torch.amp.GradScaler`` of a float16 step (``scaler.scale(loss).backward();
    scaler.step(opt); scaler.update()``), with the unscaled loss as `loss_fn` (a `loss_fn` that scales is
    refused, `memviz.hardware.amp`): the scalars it holds join the graph as one runtime node, and memviz's
    own steps (verify, its comparison with eager) run the recipe on a copy of it.

    parallel: a `memviz.Parallel` (world size, FSDP2, tensor/sequence parallelism): one rank of that step,
    recorded on a fake process group (`memviz.parallel.distributed`); a model already wrapped with
    ``fully_shard`` / ``parallelize_module`` (DTensor parameters, initialised process group) is recorded as
    is.

    grads: what each parameter's ``.grad`` is when the step starts.  ``"none"`` (the default): None, as
    after ``optimizer.zero_grad()``; backward's gradients become ``.grad``.  ``"accumulate"``: alive from
    the start, backward adding into them (`capture.accumulated_into_grads`): a loop accumulating gradients
    over micro-batches (from the second one on) or zeroing them with ``zero_grad(set_to_none=False)``;
    the gradients then count all step long, and its plans, ``memviz.apply(verify=True)`` and the eager
    peak measured here run that step.  `memviz.export` refuses such a profile (its step hands gradients
    to autograd, not into ``.grad``): use ``memviz.apply``.

    `ProfileWarning` says when the figures may not be what runs: the model is a GraphModule with its own
    code generation (profiled as its plain graph), the predicted eager peak is more than 5% off the
    measured one, or one step would not fit the device's available memory (then nothing is run: the
    profile is estimated for that device, ``device.estimated`` is True, ``measured_peak_bytes`` None).
    """
    if not isinstance(args, (tuple, list)):
        args = (args,)
    args = tuple(args)
    if mode not in ("train", "inference"):
        raise ValueError(f"mode must be 'train' or 'inference', not {mode!r}")
    if mode == "inference" and optimizer is not None:
        raise ValueError("an optimizer only makes sense with mode='train'")
    if grads not in GRADS:
        raise ValueError(f"grads must be one of {', '.join(map(repr, GRADS))}, not {grads!r}")
    if grads != "none" and mode != "train":
        raise ValueError(f"grads={grads!r} only makes sense with mode='train'")
    amp.check_scaler(scaler, mode)
    amp.refuse_scaling_loss(loss_fn)
    from memviz.parallel import distributed  # torch.distributed loads only here

    if scaler is not None and (parallel is not None or distributed.is_parallel_model(model)):
        raise ValueError("scaler= is not modelled for a parallel rank's recorded step: profile it without")
    if parallel is not None or distributed.is_parallel_model(model):
        if grads != "none":
            raise ValueError(f"grads={grads!r} is not modelled for a parallel step (sharded gradients)")
        return distributed.profile_parallel(model, args, kwargs, mode=mode, loss_fn=loss_fn,
                                            optimizer=optimizer, device=device, parallel=parallel)
    with own_checkpointing.switched_off(model) as own:
        prof = _profiled(model, args, kwargs, mode, loss_fn, optimizer, device, fallback, repeats, warmup,
                         measure, grads, scaler)
    if own and mode == "train":
        prof = _with_own_checkpointing(prof, own, args, kwargs)
    return prof


def _profiled(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
              loss_fn: LossFn | None, optimizer: Any, device: str | torch.device | None, fallback: bool,
              repeats: int, warmup: int, measure: bool, grads: str, scaler: Any) -> Profile:
    """`profile` on one process (the model's own checkpointing switched off by the caller)."""
    info = resolve_device(device, model, args)
    if not info.estimated:
        _check_on_device(model, args, kwargs, info.torch_device)
    codegen = custom_codegen(model)
    if codegen:
        warnings.warn(ProfileWarning(
            f"{codegen} generates its own code: torch.export captures the module's graph (gm.graph), not "
            "the code it runs (gm.code), so this profile's graph, predicted peak and plans describe the "
            "plain graph run op by op; measured_peak_bytes (on a real device) is what the generated code "
            "really holds.  Profile the original model instead to plan for it"), stacklevel=3)
    try:
        graph, cap = capture(model, args, kwargs, mode=mode, loss_fn=loss_fn, kernels=target_kernels(info))
    except CaptureError as err:
        if not fallback or info.estimated or grads != "none":  # the coarse profile cannot accumulate
            raise
        warnings.warn(f"{err}; returning a module-level profile from forward/backward hooks instead "
                      "(coarser, and it cannot be exported)", stacklevel=3)
        return _hooks_profile(model, args, kwargs, mode=mode, loss_fn=loss_fn, info=info)
    if cap.specialised:
        warnings.warn(ProfileWarning(specialised_warning(type(model).__name__, cap)), stacklevel=3)
    if cap.host_random:
        warnings.warn(ProfileWarning(
            f"{type(model).__name__} draws random numbers outside torch ({', '.join(cap.host_random)}) "
            "while it runs: the capture ran its Python once, so those draws are constants of the graph, "
            "and the exported module repeats them at every step where eager draws new ones (its outputs and "
            "gradients cannot match eager's).  Draw with torch's generator (torch.rand / torch.randint) to "
            "profile and export it exactly"), stacklevel=3)
    if cap.torch_draws is not None:
        eager, traced = cap.torch_draws
        warnings.warn(ProfileWarning(
            f"{type(model).__name__}'s forward draws from torch's generator {eager} times in eager mode but "
            f"{traced} times in its captured graph (a draw made only where no trace runs, under "
            "`if not torch.compiler.is_compiling()`, or a forward that draws differently from call to "
            "call): the exported module draws its dropout masks from other offsets of the stream than "
            "eager, so its outputs and gradients cannot match eager's.  memviz.apply runs the model's own "
            "forward and draws as eager does"), stacklevel=3)
    rnns = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.RNNBase)})
    if rnns and mode == "train":
        warnings.warn(ProfileWarning(
            f"{type(model).__name__} has {', '.join(rnns)} modules: eager runs torch's fused RNN kernels "
            "(oneDNN on CPU, cuDNN on CUDA), the captured graph their decomposition (a matmul and gates "
            "per step), which keeps other tensors for the backward and rounds differently.  The eager "
            "step's memory is not the predicted one (memviz.apply runs the model's own forward: its "
            "verify can refuse a plan), and the exported module's outputs and gradients equal eager's "
            "only to float rounding.  memviz.export runs the decomposition as profiled and planned; on CPU, "
            "eager without oneDNN (torch.backends.mkldnn.flags(enabled=False)) rounds as it does"),
            stacklevel=3)
    # the parameters whose .grad the step starts with: those that get a gradient
    held_grads = frozenset(cap.grad_data) if grads == "accumulate" else frozenset()
    if held_grads:
        graph = accumulated_into_grads(graph, cap)
    graph = _reusable_in_place(graph, cap)
    # one eager step without the optimizer: what running it needs and what measure_eager_peak sees
    requires_grad = {name for name, p in model.named_parameters() if p.requires_grad}
    step_schedule = python_eager_schedule(graph, cap, requires_grad)
    step_peak = simulate(_as_eager(graph, cap), step_schedule).peak_bytes
    if not info.estimated:
        info = _estimated_if_too_big(step_peak, graph.persistent_bytes(), info)
    if cap.loss_probe is not None and not info.estimated and not info.per_graph:
        # the loss's memory as the device's kernels hold it (fake tensors cannot see a kernel's storage:
        # CPU mse_loss returns a view of an input-sized buffer); the loss's own random draws are undone.
        # torch-xla runs whole graphs (no per-op storages to follow): its fake-tensor figures stand
        try:
            with accelerator.fork_rng(accelerator.as_list(info.torch_device)):
                graph = with_loss_memory(graph, cap, cap.loss_probe(
                    real=True, preexisting=tensors_of(model, args, kwargs)))
            step_peak = simulate(_as_eager(graph, cap), step_schedule).peak_bytes
        except Exception as err:  # noqa: BLE001 - a loss that refuses stand-in values: fake figures stand
            warnings.warn(ProfileWarning(
                f"loss_fn failed on stand-in outputs ({type(err).__name__}: {err}): its memory is the "
                "fake-tensor measurement, which cannot see a kernel's own storage choices"), stacklevel=3)
    fp = fingerprint(model, args, kwargs, mode)
    per_graph = None
    if info.estimated:
        graph = estimate_costs(graph, cap, info)
    elif info.per_graph:
        graph, per_graph = _measure_graph_costs(graph, cap, model, args, kwargs, mode, loss_fn, info,
                                                repeats, warmup, held_grads)
    else:
        with accelerator.timing_threads(info.torch_device):
            graph = _measure_costs(graph, cap, model, args, kwargs, loss_fn, info, repeats, warmup)
    if optimizer is not None:
        with accelerator.timing_threads(info.torch_device):
            graph = add_optimizer(graph, cap.grad_data, optimizer, info, model)
    graph = Graph(graph.computes, graph.datas, graph.outputs, name=type(model).__name__,
                  meta={**graph.meta, "mode": mode, "estimated": info.estimated, "device": info.name,
                        **({"drawn": list(cap.drawn)} if cap.drawn else {}),
                        **({"scaler": record} if (record := amp.scaler_record(scaler)) else {})})
    scaler_bytes = amp.scaler_bytes(scaler, info.torch_device)
    if scaler_bytes:
        graph = with_runtime(graph, scaler_bytes,
                             "GradScaler (scale, growth tracker, scaled loss, inverse scale, found inf)")
    # costs do not change the order: only the optimizer's nodes make the step's schedule another one
    schedule = step_schedule if optimizer is None else python_eager_schedule(graph, cap, requires_grad)
    measured = None
    if per_graph is not None:
        measured = per_graph.peak_bytes
        _report_graph_measurement(per_graph, step_peak, info)
    elif measure and not info.estimated:
        runtime, measured = accelerator.runtime_bytes(functools.partial(
            measure_eager_peak, model, args, kwargs, mode=mode, loss_fn=loss_fn, device=info.torch_device,
            held_grads=held_grads),
            info.torch_device)
        if runtime:
            graph = with_runtime(graph, runtime)
            step_peak += runtime
        _check_measured(step_peak, measured, bool(codegen))
        if mode == "train" and cap.loss_compute is not None:
            with accelerator.timing_threads(info.torch_device):
                fixed = step_fixed_costs(graph, cap, schedule, fp, model, args, kwargs, loss_fn,
                                         info.torch_device, repeats, warmup)
                fixed.update(_checkpoint_costs(graph, cap, model, args, kwargs, info, repeats, warmup))
            graph = Graph(graph.computes, graph.datas, graph.outputs, name=graph.name,
                          meta={**graph.meta, **fixed})
    # after the measurements: the runtime node and the fixed costs are part of the graph it simulates
    eager_graph = _as_eager(graph, cap)
    baseline = simulate(eager_graph, schedule).check()
    return Profile(graph=graph, baseline=baseline, baseline_schedule=schedule, measured_peak_bytes=measured,
                   baseline_graph=None if eager_graph is graph else eager_graph,
                   device=info, mode=mode, model_name=type(model).__name__,
                   fingerprint=fp, captured=cap, model=model,
                   loss_fn=loss_fn, optimizer=optimizer, scaler=scaler, input_spec=list(cap.input_meta))


def _with_own_checkpointing(prof: Profile, own: list[str], args: tuple[Any, ...],
                            kwargs: dict[str, Any] | None) -> Profile:
    """`prof` of a model that checkpoints itself (`own`: where), with the step as it runs today measured
    beside it, and a `ProfileWarning` saying what the profile describes."""
    as_run = None
    if prof.measured_peak_bytes is not None and not prof.fallback:
        as_run = measure_eager_peak(prof.model, args, kwargs, mode=prof.mode, loss_fn=prof.loss_fn,
                                    device=prof.device.torch_device, held_grads=accumulated_grads(prof.graph))
    shown = ", ".join(own[:3]) + (f" and {len(own) - 3} more" if len(own) > 3 else "")
    today = (f"; one eager step with it holds {format_bytes(as_run)}, without it "
             f"{format_bytes(prof.measured_peak_bytes)} (measured)" if as_run is not None else "")
    warnings.warn(ProfileWarning(
        f"{prof.model_name} checkpoints activations itself (torch.utils.checkpoint in {shown}){today}.  "
        "memviz chooses what to recompute: this profile, its baseline and its plans are of the model "
        "without that checkpointing (switched off while memviz measured; compare plans with "
        "as_run_peak_bytes, the step as it runs today).  memviz.apply turns the libraries' own switches "
        "off in the model it returns (transformers' gradient_checkpointing, timm's grad_checkpointing, "
        "DenseNet's memory_efficient) so only the plan's regions recompute; remove other checkpoint calls "
        "yourself"), stacklevel=3)
    return replace(prof, own_checkpointing=list(own), as_run_peak_bytes=as_run)


def specialised_warning(name: str, cap: Captured) -> str:
    """What `profile` says about the branches on tensor values its capture fixed (`Captured.specialised`),
    and about those read off a uniform draw (`Captured.drawn`: LayerDrop), which it fixed at their upper
    bound."""
    text = (f"{name} branches on tensor values (or sizes a tensor by them); the capture took each branch, "
            "and each size, as the example input gives them, and the graph, its plans and the exported "
            "module always take that branch (a label check always passes): " + "; ".join(cap.specialised))
    if not cap.drawn:
        return text
    return (text + f".  {len(cap.drawn)} of those places read a uniform random draw "
            f"({'; '.join(cap.drawn)}): LayerDrop, which skips a layer when its draw falls under the "
            "probability.  There the capture took the draw at its top, every layer run: the graph, the "
            "predicted and the measured eager peak (measured_peak_bytes) and every plan are the step in "
            "which no layer is skipped, the most any draw holds.  memviz.apply runs the model's own "
            "LayerDrop within its plan; memviz.export, one fixed graph, cannot skip layers and refuses")


def _as_eager(graph: Graph, cap: Captured) -> Graph:
    """The graph eager autograd runs (`memviz.plans.sac.eager_graph`): gradient sums out of place
    (`summed_as_eager`) and in-place activations in the storage they overwrite (`written_in_place`, a
    call up the flow as `_checkpoint_costs`)."""
    from memviz.plans.sac import written_in_place

    return with_dropped_results(written_in_place(summed_as_eager(graph), cap), cap)


def _reusable_in_place(graph: Graph, cap: Captured) -> Graph:
    """`graph` with the in-place activations the exported step may run in place marked
    (`memviz.plans.sac.reusable_in_place`, a call up the flow as `_as_eager`)."""
    from memviz.plans.sac import reusable_in_place

    return reusable_in_place(graph, cap)


def _checkpoint_costs(graph: Graph, cap: Captured, model: nn.Module, args: tuple[Any, ...],
                      kwargs: dict[str, Any] | None, info: DeviceInfo, repeats: int,
                      warmup: int) -> dict[str, Any]:
    """`memviz.plans.sac.checkpoint_costs` on the graph eager autograd runs (a call up the flow: what
    `memviz.apply` costs is measured with the profile, so sac plans do not time anything); a block that
    cannot run alone is said in a `ProfileWarning` and sac plans then count no checkpointing costs."""
    from memviz.plans.sac import checkpoint_costs

    try:
        return checkpoint_costs(_as_eager(graph, cap), cap, model, args, kwargs, info.torch_device, repeats,
                                warmup)
    except Exception as err:  # noqa: BLE001 - any failure of the block run alone: plans count no costs
        warnings.warn(ProfileWarning(
            f"checkpointing's own costs could not be measured on one block run alone ({type(err).__name__}: "
            f"{err}): strategy='sac' plans count only the ops they recompute"), stacklevel=4)
        return {}


def with_runtime(graph: Graph, nbytes: int, name: str = "device runtime (cuBLAS workspaces)") -> Graph:
    """`graph` with the device runtime's persistent scratch (`accelerator.runtime_bytes`: cuBLAS
    workspaces; a GradScaler's scalars, `memviz.hardware.amp`) as one data node alive for the whole step:
    every plan holds it, no schedule can free it.  Appended after every other node, it is not part of the
    capture (`export.plan_capture_difference` checks the captured nodes only) and the executor binds
    nothing to it."""
    node = DataNode(id=len(graph.datas), name=name, bytes=int(nbytes), kind=DataKind.RUNTIME)
    return Graph(graph.computes, (*graph.datas, node), graph.outputs, name=graph.name, meta=graph.meta)


class ProfileWarning(UserWarning):
    """The profile may not describe what the model really does on the device (the message says why
    and what the figures mean)."""


#: Predicted and measured eager peaks further apart than this (relative to the measurement) are
#: reported: the capture is exact to within a few percent on every example model (DESIGN.md).
MISMATCH_TOLERANCE = 0.05
#: Run on the device only when the step's activations fit this fraction of the available memory
#: (the replay and the eager measurement each hold about one step's activations, one after the other).
MEMORY_HEADROOM = 0.9


def custom_codegen(model: nn.Module) -> str:
    """The first (sub)module that is a GraphModule whose graph emits code through a non-default
    ``CodeGen`` (memviz.plans.chunking's loops, ...), named with its codegen class; "" when none."""
    from torch.fx.graph import CodeGen, _PyTreeCodeGen

    default = (CodeGen, _PyTreeCodeGen)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.fx.GraphModule) and type(mod.graph._codegen) not in default:
            where = f"submodule {name!r}" if name else "the model"
            return f"{where} ({type(mod).__name__} with {type(mod.graph._codegen).__name__})"
    return ""


def _check_measured(predicted: int, measured: int, codegen: bool) -> None:
    """Warn when the predicted eager peak is more than `MISMATCH_TOLERANCE` off the measured one."""
    if not measured or abs(predicted - measured) <= MISMATCH_TOLERANCE * measured:
        return
    why = ("the module generates its own code (see the warning above)" if codegen else
           "the model does something its traced graph does not show (Python-side caches, hooks that "
           "keep tensors, custom autograd code run differently in eager mode)")
    warnings.warn(ProfileWarning(
        f"predicted eager peak {predicted} bytes differs from the measured {measured} bytes by "
        f"{100 * (predicted - measured) / measured:+.1f}% (more than {100 * MISMATCH_TOLERANCE:.0f}%): "
        f"probably {why}.  Plans and budgets use the predicted graph; measured_peak_bytes is what "
        "the original model really held in one eager step"), stacklevel=4)


def _report_graph_measurement(m: xla.GraphMeasurement, predicted: int, info: DeviceInfo) -> None:
    """Say what a per-graph measurement could not: a peak it could not read, a graph that compiled
    again on every run, a peak the XLA compiler's own buffer assignment put elsewhere."""
    if m.peak_bytes is None:
        warnings.warn(ProfileWarning(
            f"{info.name}: {m.memory_source}, so measured_peak_bytes is None; the step's time was "
            f"measured ({m.timer}, median {m.seconds * 1e3:.3f} ms) and shared out over the operators "
            "by their roofline estimates"), stacklevel=4)
    elif abs(predicted - m.peak_bytes) > MISMATCH_TOLERANCE * m.peak_bytes:
        off = 100 * (predicted - m.peak_bytes) / m.peak_bytes
        warnings.warn(ProfileWarning(
            f"{info.name}: the measured peak {m.peak_bytes} bytes ({m.memory_source}) differs from the "
            f"predicted eager peak {predicted} bytes by {off:+.1f}%: "
            "XLA compiles the whole step and orders and fuses it itself (and this counter runs since the "
            "runtime started).  Plans use the predicted graph"), stacklevel=4)
    if m.recompiled:
        warnings.warn(ProfileWarning(
            f"{info.name}: the step's graph compiled again during the timed runs (its shapes or Python "
            "control flow change from run to run), so the measured time may include compilation"),
            stacklevel=4)


#: up to this many interleaved pairs of steps time the executor against eager (`step_fixed_costs`)
#: where ``repeats`` > 1: with the 3-7 of ``repeats`` the median ratio of a ResNet's steps moved by 5
#: points from run to run on a loaded machine (issue 22), and medians of 11 pairs of the example GPT's
#: 4 ms steps ranged 1.12-1.30 within one run of 60 (load 11, exec23); pairs beyond ``repeats`` are
#: added only while `FIXED_COST_BUDGET_S` lasts, and ``repeats=1`` (a quick profile) times one pair.
#: 101, not 51 (pred30): the pairs' ratios spread with sd 7-14 % at load 7, so the median of 51 moved
#: by 1.0-1.4 points (bootstrap sd) and 3 consecutive profiles of bench_export's GPT / ResNet read
#: ratios 1.5 / 2.8 points apart and recompute rates 0.57 / 0.55 apart; with the budget's 70-100
#: pairs 1.2 / 1.1 and 0.16 / 0.30 (sd 0.7 / 0.9 points), at +0.6 / +1.2 s of profile CPU time
FIXED_COST_PAIRS = 101
FIXED_COST_BUDGET_S = 3.0


def step_fixed_costs(graph: Graph, cap: Captured, schedule: Schedule, fp: str, model: nn.Module,
                     args: tuple[Any, ...], kwargs: dict[str, Any] | None, loss_fn: LossFn | None,
                     device: torch.device, repeats: int, warmup: int) -> dict[str, float]:
    """What a training step costs beyond its operators' measured times, for eager PyTorch and for the
    exported module (issue 22), on the device:

    * ``eager_fixed_s``: eager's step less its operators' times (module calls, autograd's graph and engine);
    * ``executor_fixed_s``: the same for `schedule` exported (the driver, its two autograd Functions, the
      generated step functions' own Python), where each operator runs once;
    * ``executor_op_s``: what the exported module adds per operator it runs, over the operator's
      measured time: the generated phase functions' time less their operators' times, over how many they
      run (``executor_ops``).  A recomputation pays it again (`memviz.plans.planning.step_time_ratio`):
      on a launch-bound accelerator an operator costs its host-side launch, not only its kernel time
      (device events).  0 on the CPU: there each op's time is read on the host clock around its Python
      call, launch included, and charging the in-step extra again over-predicted recomputing plans
      (tiny 12-layer GPT, 25/51 recomputations: 1.150/1.191 predicted against 1.121/1.155 measured, 1.129/
      1.149 without it; bench_export's examples likewise, issue 22).
    * ``recompute_scale``: on the host clock, the exported step's phase functions (the generated code
      that runs every operator and every recomputation) over their operators' summed times, timed inside
      the same pairs (``executor_phase_s``, median): the rate operators run at where a recomputation
      runs, at which `memviz.plans.planning.step_time_ratio` prices recomputed operators: timed one by
      one in the exported step, 30 recomputations of bench_export's GPT (1.65 ms timed alone) took what
      the same nodes' first runs took there (2.66 / 2.59 ms).  It was eager's step over its operators'
      times, which stands for eager's own per-step costs (module calls, autograd's graph and engine), not
      the generated code's; measured in the same pairs the two agree within their quartiles on
      bench_export's GPT (1.705 / 1.680, 1.602 / 1.631 in two profiles at load 16) and ResNet (1.640 /
      1.749, 1.521 / 1.487), and both move with the load (GPT 1.37-1.70 across profiles at load 10-20:
      op times are the fastest of runs timed alone, the steps are not).  1.0 on an accelerator.

    Measured in interleaved pairs of steps (``loss_fn(model(x)).backward()``, after `warmup` untimed
    steps each), eager and the exported module in alternating order with cyclic collection paused
    (`accelerator.alternating_pairs`: the order alone moved a sub-ms step's ratio by 40 points), the
    exported module's phase functions timed in its steps on the host clock (6 clock readings a step), and
    on an accelerator in as many steps after the pairs (their timers synchronise, so they are kept out of
    the ratio); `repeats` pairs, more up to `FIXED_COST_PAIRS` within
    `FIXED_COST_BUDGET_S` (of CPU time on the CPU, `accelerator.host_clock`), medians throughout (the
    exported step as eager's median times the median ratio of the pairs: a burst of load slows both
    steps of a pair).
    `memviz.Plan.time_overhead` adds them to the planned and the baseline op times.  Nothing in the model
    changes: gradients, buffers and the RNG streams are restored.  Empty when the schedule cannot be
    exported (the ratio of op times stands)."""
    from memviz.runtime.export import PlannedModule, compile_program

    try:
        module = PlannedModule(model, compile_program(graph, cap, schedule, fp))
    except ValueError:  # not exportable (the plan says why at export): no executor to time
        return {}
    phases = _PhaseClock(module.program.code, device)
    kwargs = kwargs or {}
    fn = loss_fn or default_loss
    leaves = [t for t in (*model.parameters(), *pytree.tree_leaves((args, kwargs)))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = [t.grad for t in leaves]

    def step(m: nn.Module) -> None:
        for t in leaves:
            t.grad = None
        fn(m(*args, **kwargs)).backward()

    def phased_step() -> float:
        """The exported step with its phase functions timed: the phases' time."""
        module._generated, phases.seconds = phases, 0.0
        try:
            step(module)
        finally:
            module._generated = None
        return phases.seconds

    host = not accelerator.is_accelerator(device)

    def exported_step() -> tuple[float, float]:
        """The exported step's seconds and, on the host clock, its phase functions' (0 elsewhere)."""
        phases.seconds = 0.0
        return accelerator.timed(functools.partial(step, module), device)[0], phases.seconds

    target = FIXED_COST_PAIRS if repeats > 1 else 1
    try:
        with buffers_kept(model), accelerator.fork_rng(accelerator.as_list(device)):
            for _ in range(warmup):
                step(model)
                step(module)
            # the budget on the clock the steps are timed on: on a loaded machine the wall clock cut a
            # 25 ms step's pairs to the 7 of `repeats` (exec24), whose median ratio then moved by points
            clock = accelerator.host_clock() if host else time.perf_counter
            start = clock()
            module._generated = phases if host else None
            eager, exported = accelerator.alternating_pairs(
                lambda: accelerator.timed(functools.partial(step, model), device)[0], exported_step,
                lambda n: n < max(1, repeats) or (n < target and clock() - start < FIXED_COST_BUDGET_S))
            module._generated = None
            # timed apart from the pairs: the phase timers synchronise the device
            in_phases = [] if host else [phased_step() for _ in eager]
    finally:
        for t, g in zip(leaves, grads, strict=True):
            t.grad = g
    executor = [seconds for seconds, _ in exported]
    return fixed_costs_of(graph, cap, eager, executor, in_phases, [p for _, p in exported] if host else [])


def fixed_costs_of(graph: Graph, cap: Captured, eager: list[float], executor: list[float],
                   in_phases: list[float], paired_phases: list[float]) -> dict[str, float]:
    """`step_fixed_costs` from its timings: the eager and exported steps of each pair, on an accelerator
    the exported steps' phase functions timed after the pairs (`in_phases`), on the host clock within
    them (`paired_phases`); each cost against the op times in `graph`."""
    ops = sum(c.time for c in graph.computes if c.phase is not Phase.OPTIMIZER)
    # the operators the generated code runs (the loss and its backward run in the user's code: None)
    generated = [c for c in graph.computes[:len(cap.compute_fx)] if cap.compute_fx[c.id] is not None]
    step_s = statistics.median(eager)
    ratios = [x / e for x, e in zip(executor, eager, strict=True) if e > 0]
    ratio = statistics.median(ratios)
    generated_s = sum(c.time for c in generated)
    per_op = 0.0 if not in_phases else (statistics.median(in_phases) - generated_s) / max(1, len(generated))
    # host-timed ops: the generated code's time over its ops timed alone is the rate they run at where a
    # recomputation runs them (an accelerator's per-op term above prices its launches instead)
    phase_s = statistics.median(paired_phases) if paired_phases else 0.0
    scale = phase_s / generated_s if phase_s > 0 and generated_s > 0 else 1.0
    return {"eager_fixed_s": step_s - ops, "executor_fixed_s": ratio * step_s - ops,
            "executor_op_s": per_op, "executor_ops": len(generated), "recompute_scale": scale,
            **({"executor_phase_s": phase_s} if phase_s > 0 else {}),
            **_quartile_costs(eager, ratios, ops, paired_phases, generated_s)}


def _quartile_costs(eager: list[float], ratios: list[float], ops: float,
                    paired_phases: list[float], generated_s: float) -> dict[str, float]:
    """The fixed costs of `step_fixed_costs` at the lower and upper quartile (``_q1``, ``_q3``) of what the
    pairs measured: eager's step, and the exported step's ratio to it in its pair.  How far the steps
    spread within this one profile, run to run on the same machine: `memviz.plans.planning.
    step_time_range` predicts a plan's step time at them (issue 18: the overhead readout was shown as
    exact, while benchmarks/check_overhead_spread.py saw it move by ~10 points across runs); on the host
    clock also the recompute rate at the quartiles of the exported steps' phase functions (``paired_phases``
    over their ops' `generated_s`).  Empty with fewer than 4 pairs (no quartiles worth the name)."""
    if len(eager) < 4 or len(ratios) < 4:
        return {}
    step_s = statistics.median(eager)
    e1, _, e3 = statistics.quantiles(eager, n=4)
    r1, _, r3 = statistics.quantiles(ratios, n=4)
    out = {"eager_fixed_s_q1": e1 - ops, "eager_fixed_s_q3": e3 - ops,
           "executor_fixed_s_q1": r1 * step_s - ops, "executor_fixed_s_q3": r3 * step_s - ops}
    if len(paired_phases) >= 4 and generated_s > 0:  # host-timed: the phase functions' rate
        p1, _, p3 = statistics.quantiles(paired_phases, n=4)
        out.update(recompute_scale_q1=p1 / generated_s, recompute_scale_q3=p3 / generated_s)
    return out


class _PhaseClock:
    """The exported module's step functions (`memviz.runtime.export.Program.code`), each call timed on
    the device and added to `seconds` (`step_fixed_costs`)."""

    def __init__(self, code: Any, device: torch.device) -> None:
        self.code, self.device, self.seconds = code, device, 0.0
        # on the host clock the reading's own window is measured once: `accelerator.timed` measures it
        # per call (101 readings), which inside the timed pairs would add 0.2 ms to the exported step
        self.clock = None if accelerator.is_accelerator(device) else accelerator.host_clock()
        self.floor = accelerator.empty_window(self.clock) if self.clock is not None else 0.0

    def _timed(self, name: str, *args: Any) -> Any:
        fn = getattr(self.code, name)
        if self.clock is None:
            seconds, out = accelerator.timed(functools.partial(fn, *args), self.device)
        else:
            start = self.clock()
            out = fn(*args)
            seconds = max(0.0, self.clock() - start - self.floor)
        self.seconds += seconds
        return out

    def forward_steps(self, *args: Any) -> Any:
        return self._timed("forward_steps", *args)

    def backward_steps(self, *args: Any) -> Any:
        return self._timed("backward_steps", *args)

    def backward_rest(self, *args: Any) -> Any:
        return self._timed("backward_rest", *args)


def _estimated_if_too_big(peak: int, resident: int, info: DeviceInfo) -> DeviceInfo:
    """`info`, or an estimate for the same device (`memviz.hardware.devices.estimated_on`) when one step's
    activations (`peak`, the eager peak predicted from the fake-tensor capture, less the `resident`
    parameters, buffers and inputs already allocated) would not fit `MEMORY_HEADROOM` of the memory
    still available there: running it to time the ops would exhaust the machine."""
    available = devices.available_memory(info)
    if available is None:
        return info
    need = peak - resident
    if need <= MEMORY_HEADROOM * available:
        return info
    est = devices.estimated_on(info)
    assert est.target is not None
    warnings.warn(ProfileWarning(
        f"one step needs about {format_bytes(need)} beyond the parameters and inputs (predicted eager "
        f"peak {format_bytes(peak)}) but only {format_bytes(available)} is available on {info.name}: "
        f"nothing is run; times are estimated from FLOPs and bytes (roofline of target "
        f"'{est.target.name}') and the profile is labelled estimated (device.estimated, no "
        "measured_peak_bytes).  Free memory, or pass device='fake:<target>' to choose the target"),
        stacklevel=3)
    return est


# --- PyTorch's own eager order ------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _statements(code: str) -> tuple[ast.stmt, ...]:
    """The statements of a source excerpt (none when it does not parse); cached: every layer of a
    model runs the same source lines."""
    try:
        return tuple(ast.parse(code.strip()).body)
    except SyntaxError:
        return ()


def _bound_names(code: str) -> list[str]:
    """Names a statement binds (``x = ...``, ``q, k, v = ...``); ``+name`` for ``name.append(...)``."""
    body = _statements(code)
    if not body:
        return []
    st = body[0]
    call = st.value if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) else None
    func = call.func if call is not None else None
    if (isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "insert")
            and isinstance(func.value, ast.Name)):
        return ["+" + func.value.id]
    targets = (st.targets if isinstance(st, ast.Assign)
               else [st.target] if isinstance(st, (ast.AnnAssign, ast.AugAssign)) else [])
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _name_alias(code: str, names: dict[str, int | None]) -> tuple[str, int | None] | None:
    """(statement, value) for a statement that only binds or stores an existing name's value
    (``y = x``, ``xs.append(x)``); None for anything else."""
    body = _statements(code)
    if len(body) != 1:
        return None
    st = body[0]
    if isinstance(st, ast.Assign) and isinstance(st.value, ast.Name):
        src = st.value.id
    elif (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and len(st.value.args) == 1
          and isinstance(st.value.args[0], ast.Name) and isinstance(st.value.func, ast.Attribute)
          and st.value.func.attr == "append"):
        src = st.value.args[0].id
    else:
        return None
    return (code, names[src]) if names.get(src) is not None else None


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.TryStar,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Match)


@functools.cache
def _file_tree(file: str) -> ast.Module | None:
    """`file` parsed once for every reader of its statements; None when it cannot be read or parsed."""
    try:
        return ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None


@functools.cache
def _statement_spans(file: str) -> tuple[tuple[int, int], ...]:
    """(first line, last line) of every simple statement of `file`, sorted (compound statements are
    left out: their bodies are listed); () when the file cannot be read or parsed."""
    tree = _file_tree(file)
    if tree is None:
        return ()
    return tuple(sorted((n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
                        if isinstance(n, ast.stmt) and not isinstance(n, _COMPOUND)))


@functools.cache
def _loop_bodies(file: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(first, last line) of a simple statement of `file` -> (first, last line) of the body of the
    innermost ``for``/``while`` loop of the same function that runs it; {} when it cannot be parsed."""
    tree = _file_tree(file)
    if tree is None:
        return {}
    found: dict[tuple[int, int], tuple[int, int]] = {}

    def visit(node: ast.AST, loop: tuple[int, int] | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                visit(child, None)
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
                body = (child.body[0].lineno, child.body[-1].end_lineno or child.body[-1].lineno)
                for st in child.body:
                    visit_stmt(st, body)
                for st in child.orelse:
                    visit_stmt(st, loop)
            elif isinstance(child, ast.stmt):
                visit_stmt(child, loop)

    def visit_stmt(st: ast.stmt, loop: tuple[int, int] | None) -> None:
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                           ast.ClassDef)):
            wrapper = ast.Module(body=[st], type_ignores=[])
            visit(wrapper, loop)
        elif isinstance(st, _COMPOUND):
            visit(st, loop)
        elif loop is not None:
            found[st.lineno, st.end_lineno or st.lineno] = loop

    visit(tree, None)
    return found


def _iterations(targets: list[Any]) -> int:
    """How many times a statement in a loop ran, from the operators its frame ran while the stack
    traces named it (file and line only, so consecutive iterations read as one statement): the
    sequence's shortest period splits it; 1 when it is not periodic."""
    n = len(targets)
    for p in range(1, n // 2 + 1):
        if n % p == 0 and all(targets[i] == targets[i - p] for i in range(p, n)):
            return n // p
    return 1


def _statement_at(file: str, line: int) -> tuple[int, int]:
    """(first, last line) of the statement `line` belongs to: a frame reports the line of the call
    running, which in a statement spread over lines (``x = (a.view(...)\n .reshape(...))``) is not
    the line that binds the name."""
    spans = _statement_spans(file)
    i = bisect.bisect_right(spans, (line, sys.maxsize)) - 1
    return spans[i] if i >= 0 and spans[i][0] <= line <= spans[i][1] else (line, line)


def _statements_between(file: str, after: int, before: int) -> list[tuple[int, int]]:
    """The statements starting after line `after` and before line `before`, in order."""
    spans = _statement_spans(file)
    if not spans:
        return [(line, line) for line in range(after + 1, before)]
    return [s for s in spans if after < s[0] < before]


@functools.cache
def _if_branches(file: str) -> tuple[tuple[int, int, int, int], ...]:
    """(first, last line of the body, first, last line of the ``else``) of each ``if`` of `file` that has
    an ``else`` (an ``elif`` is an ``if`` in it); () when it cannot be parsed."""
    tree = _file_tree(file)
    if tree is None:
        return ()
    return tuple((n.body[0].lineno, n.body[-1].end_lineno or n.body[-1].lineno,
                  n.orelse[0].lineno, n.orelse[-1].end_lineno or n.orelse[-1].lineno)
                 for n in ast.walk(tree) if isinstance(n, ast.If) and n.orelse)


def _ran_after(file: str, span: tuple[int, int], before: int) -> list[tuple[int, int]]:
    """The statements between statement `span` and line `before` that ran after it: those in the other
    branch of an ``if`` that `span` is in did not (``if shift: x = roll(h) else: x = h``: the ``else``
    lies between the ``roll`` and the next traced statement, and read as run it rebound ``x`` to ``h``,
    freeing Swin-V2's shifted windows, which the layer holds to its return, 32 KiB early)."""
    def other_branch(s: tuple[int, int]) -> bool:
        return any((b0 <= span[0] <= b1 and e0 <= s[0] <= e1) or (e0 <= span[0] <= e1 and b0 <= s[0] <= b1)
                   for b0, b1, e0, e1 in _if_branches(file))

    return [s for s in _statements_between(file, span[1], before) if not other_branch(s)]


def _source(file: str, span: tuple[int, int]) -> str:
    return "".join(linecache.getlines(file)[span[0] - 1:span[1]])


def _deleted_names(code: str, skip_first: bool = False) -> list[str]:
    """Names a source excerpt unbinds: ``del q_scaled, k`` and ``x = None`` (how generated code, the
    ``<eval_with_key>`` forward of an autocast region, drops a value after its last use:
    ``relu = torch.ops.aten.relu.default(linear);  linear = None``); the first statement left out with
    `skip_first` (the one binding the excerpt's value)."""
    names = []
    for st in _statements(code)[1 if skip_first else 0:]:
        if isinstance(st, ast.Delete):
            names += [t.id for t in st.targets if isinstance(t, ast.Name)]
        elif isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and st.value.value is None:
            names += [t.id for t in st.targets if isinstance(t, ast.Name)]
    return names


_CASTS = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def autocast_cache_holds(cap: Captured, requires_grad: Collection[str] | None,
                         graph: Graph) -> dict[int, int]:
    """data id -> compute id after which eager autocast still holds a parameter's down-cast copy.

    Inside ``torch.autocast`` a float32 leaf that requires grad (a parameter, under ``no_grad`` too) is
    cast once and kept in autocast's cache until the outermost region exits
    (``torch.is_autocast_cache_enabled``).  The region is the run of forward nodes export traced
    through ``wrap_with_autocast``, or, for a step captured inside the caller's region
    (`Captured.autocast_cached`), the whole forward, whose casts are then held to the backward's last
    compute (`step_end` of `graph`: memviz runs the step in that region again, the optimizer's update
    outside it, `accelerator.autocast_as`).  `requires_grad` names the parameters that require grad
    (None: all)."""
    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    params = {n.name: key for n, (kind, key) in zip(cap.gm.graph.find_nodes(op="placeholder"),
                                                     cap.placeholders, strict=True) if kind == "param"}
    hold: dict[int, int] = {}
    cached: list[int] = []
    pos = -1
    for n in forward_calls(cap.gm):
        inside = cap.autocast_cached or (n.meta.get("torch_fn") or ("",))[0] == "wrap_with_autocast"
        if not inside:
            for d in cached:
                hold[d] = max(hold.get(d, -1), pos)
            cached = []
        pos = pos_of.get(n.name, pos)
        src = n.args[0] if n.args else None
        out, val = n.meta.get("val"), getattr(src, "meta", {}).get("val")
        if (inside and n.target in _CASTS
                and isinstance(src, torch.fx.Node) and src.name in params
                and (requires_grad is None or cap.param_names.get(params[src.name], params[src.name])
                     in requires_grad)
                and isinstance(val, torch.Tensor) and val.dtype == torch.float32
                and isinstance(out, torch.Tensor) and out.dtype in (torch.bfloat16, torch.float16)
                and n.name in cap.data_of_fx):
            cached.append(cap.data_of_fx[n.name])
    for d in cached:
        hold[d] = max(hold.get(d, -1), step_end(graph) if cap.autocast_cached else pos)
    return hold


def step_end(graph: Graph) -> int:
    """The last compute of forward, loss and backward: the optimizer's update nodes come after it."""
    return max(c.id for c in graph.computes if c.phase is not Phase.OPTIMIZER)


def _autograd_only_output(node: torch.fx.Node) -> bool:
    """Whether forward FX `node` takes a later output of a multi-output op that no forward op reads, only
    its backward: what autograd saves (dropout's mask, layer norm's mean and rstd), never a value the
    Python statement running the op gets (``F.dropout`` returns the output alone).  Such a getitem comes
    after the op's output [0] in the trace, so it must not become the statement's value: Swin-V2's
    ``attention_outputs = self.attention(...)`` bound the last dropout's mask, and its output, which the
    layer's locals hold to its return, was freed at its last reader (the eager baseline 32 KiB under the
    measured step)."""
    if node.target is not operator.getitem or not isinstance(node.args[1], int) or node.args[1] == 0:
        return False
    readers = list(node.users)
    while readers:
        u = readers.pop()
        if u.target is torch.ops.aten.detach.default:  # how the joint graph saves a value for backward
            readers += u.users
        elif u.op == "call_function" and not is_backward(u):
            return False
    return True


def _builds_each(code: str) -> bool:
    """Whether a statement assigns a tuple or list it builds itself (``a, b = f(x), g(x)``, ``a, b = [f(t)
    for t in (x, y)]``), whose values come in its names' order; a call returning a tuple does not say
    which of its values is which (HF Swin's ``attention_output, attn_weights = self.attention(...)``)."""
    body = _statements(code)
    st = body[0] if body else None
    return isinstance(st, ast.Assign) and isinstance(st.value, (ast.Tuple, ast.List, ast.ListComp))


def _statement_values(nodes: Sequence[tuple[Any, int | None, int, frozenset[int]]]) -> list[int]:
    """The values a statement's operators (``(op, data, position, data read)`` each, in order) leave it:
    each data no later operator of the statement reads, in order.  A tuple target of as many names binds
    one each: HF Mamba2's ``hidden_states, A, B, C = [reshape_into_chunks(t, ...) for t in (...)]``
    bound all four names to the last (``C``'s chunks), and the other three, which the names hold to the
    scan's return, were freed after their last readers (the checkpointed layer's recomputation 15.5 KiB
    over its sac plan, 1.1 MiB under it mid-scan)."""
    values: list[int] = []
    for i, (_, d, _, _) in enumerate(nodes):
        if d is not None and d not in values and not any(d in r for _, _, _, r in nodes[i + 1:]):
            values.append(d)
    return values


def python_local_holds(cap: Captured) -> dict[int, int]:
    """data id -> compute id after which eager PyTorch still holds it through a Python local.

    Eager mode frees a tensor when its last reference goes: temporaries inside a statement die at once,
    but a value bound to a local (``identity = x``, ``q, k, v = qkv.unbind(0)``) lives until the name is
    rebound or its function returns.  Each forward FX node's stack trace gives, per frame (module path,
    file, function), the statement it belongs to; the statement's last node is its value, bound to the
    names the statement assigns (parsed with ``ast``)."""
    from memviz.profiling.capture import _FRAME

    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    hold: dict[int, int] = {}
    current: dict[tuple[Any, ...], tuple[tuple[int, int], int | None, int]] = {}  # lines, value, end
    ran: dict[tuple[Any, ...], list[tuple[Any, int | None, int]]] = {}  # (op, data, position) per node
    binds: dict[tuple[Any, ...], dict[str, int | None]] = {}
    last_pos: dict[tuple[Any, ...], int] = {}

    def release(d: int | None, at: int) -> None:
        if d is not None:
            hold[d] = max(hold.get(d, -1), at)

    def bind(key: tuple[Any, ...], code: str, value: int | None, end: int,
             values: Sequence[int] = ()) -> None:
        names = binds.setdefault(key, {})
        bound = _bound_names(code)
        for i, name in enumerate(bound):
            if len(values) == len(bound) > 1 and _builds_each(code):  # ``a, b = f(x), g(x)``
                value = values[i]
            if name.startswith("+"):  # a container keeps everything put in it
                names[f"{name}#{len(names)}"] = value
                continue
            old = names.get(name)
            if old is not None and old != value:
                release(old, end)
            names[name] = value
        for name in _deleted_names(code, skip_first=True):
            release(names.pop(name, None), end)

    def untraced(key: tuple[Any, ...], gaps: list[tuple[int, int]], end: int) -> None:
        for gap in gaps:
            code = _source(key[1], gap)
            alias = _name_alias(code, binds.get(key, {}))
            if alias is not None:
                bind(key, *alias, end)
            for name in _deleted_names(code):  # ``del x`` drops the local's reference there
                release(binds.get(key, {}).pop(name, None), end)

    def finish(key: tuple[Any, ...], next_line: int | None = None) -> None:
        span, value, end = current.pop(key)
        nodes = ran.pop(key)
        code = _source(key[1], span)
        loop = _loop_bodies(key[1]).get(span)
        count = _iterations([op for op, _, _, _ in nodes]) if loop is not None else 1
        if count > 1:
            # ``for w in ws: x = f(x @ w)``: each iteration binds its value when it ends (the previous
            # one is held until then), and runs the loop's other, untraced statements
            size = len(nodes) // count
            others = [s for s in _statements_between(key[1], loop[0] - 1, loop[1] + 1) if s != span]
            last = None
            for i in range(count - 1):
                chunk = nodes[i * size:(i + 1) * size]
                last = next((d for _, d, _, _ in reversed(chunk) if d is not None), last)
                bind(key, code, last, chunk[-1][2])
                untraced(key, others, chunk[-1][2])
        bind(key, code, value, end, _statement_values(nodes) if count == 1 else ())
        # statements that run no operator (``skips.append(x)``, ``identity = x``) leave no FX node: the
        # straight-line source between this statement and the next traced one of the same frame ran too
        untraced(key, _ran_after(key[1], span, next_line or span[1]), end)

    # autograd's extra outputs (and the detached copies the joint graph saves them through) are no value
    # of the statement that runs their op
    hidden = {cap.data_of_fx[n.name] for n in forward_calls(cap.gm)
              if n.name in cap.data_of_fx and _autograd_only_output(n)}
    pos = -1
    for n in forward_calls(cap.gm):
        pos = pos_of.get(n.name, pos)
        d = cap.data_of_fx.get(n.name)
        d = None if d in hidden else d
        reads = frozenset(cap.data_of_fx[a.name] for a in n.all_input_nodes if a.name in cap.data_of_fx)
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        depth = -1
        entered: dict[tuple[str, str], int] = {}
        for f in _FRAME.finditer(n.meta.get("stack_trace") or ""):
            depth += f["fn"] == "forward"  # module forwards and nn_module_stack entries correspond
            # a function re-entered through ``handle_torch_function`` (torch.nn.functional under
            # export's torch-function mode) is a frame per entry: the outer ones wait on one line
            again = entered[f["file"], f["fn"]] = entered.get((f["file"], f["fn"]), -1) + 1
            key = (stack[depth][0] if 0 <= depth < len(stack) else "", f["file"], f["fn"], depth, again)
            span = _statement_at(f["file"], int(f["line"]))
            if key in current and current[key][0] != span:
                finish(key, span[0])
            prev = current.get(key)
            current[key] = (span, d if d is not None else (prev[1] if prev else None), pos)
            ran.setdefault(key, []).append((n.target, d, pos, reads))
            last_pos[key] = pos
    for key in list(current):
        finish(key)
    for key, names in binds.items():
        for d in names.values():
            release(d, last_pos[key])
    return hold


def kept_holds(cap: Captured, graph: Graph) -> dict[int, int]:
    """data id -> the last compute id of `graph`'s step (the optimizer's update included), for each value
    the model keeps across calls (`memviz.profiling.capture.kept_values`: BEiT's cached relative position
    index): eager holds it for good, where the graph would free it after its last reader."""
    last = len(graph.computes) - 1
    return {cap.data_of_fx[n]: last for n in cap.kept_fx if n in cap.data_of_fx}


def module_argument_holds(cap: Captured) -> dict[int, int]:
    """data id -> compute id after which eager PyTorch still holds it as a module call's argument.

    ``conv(torch.cat([a, b]))``: the temporary passed to a module lives until the call returns, held by
    ``Module.__call__``'s ``*args`` (``Sequential`` rebinds its own ``input`` but its caller does not).
    A module call is a maximal run of forward FX nodes sharing the same ``nn_module_stack`` entry; a
    value produced outside it and read inside it is held until the call's last operator."""
    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    hold: dict[int, int] = {}
    open_calls: list[tuple[str, set[int], set[int]]] = []  # (stack key, produced inside, read from outside)
    pos = -1

    def close(depth: int) -> None:
        while len(open_calls) > depth:
            _, _, read = open_calls.pop()
            for d in read:
                hold[d] = max(hold.get(d, -1), pos)

    for n in forward_calls(cap.gm):
        keys = list(n.meta.get("nn_module_stack") or {})
        depth = next((i for i, (k, c) in enumerate(zip(keys, open_calls, strict=False)) if k != c[0]),
                     min(len(keys), len(open_calls)))
        close(depth)
        open_calls.extend((k, set(), set()) for k in keys[depth:])
        ins = {cap.data_of_fx[a.name] for a in n.all_input_nodes if a.name in cap.data_of_fx}
        out = cap.data_of_fx.get(n.name)
        for _, produced, read in open_calls:
            read.update(ins - produced)
            if out is not None:
                produced.add(out)
        pos = pos_of.get(n.name, pos)
    close(0)
    return hold


def python_eager_schedule(graph: Graph, cap: Captured,
                          requires_grad: Collection[str] | None = None) -> Schedule:
    """PyTorch's own eager order: `solvers.eager_schedule` (capture order, free after last use) with the
    frees of tensors held by Python locals, module arguments, autograd's saved variables and autocast's
    cache postponed to where eager mode releases them.  `requires_grad`: the parameters that require
    grad (None: all)."""
    schedule = eager_schedule(graph)
    hold = python_local_holds(cap)
    for extra in (module_argument_holds(cap), autograd_saved_holds(cap), gradient_input_holds(cap),
                  kept_holds(cap, graph), autocast_cache_holds(cap, requires_grad, graph),
                  composite_holds(cap)):
        for d, at in extra.items():
            hold[d] = max(hold.get(d, -1), at)
    out: list[Step] = []
    pending: dict[int, list[Step]] = {}
    done = -1
    for s in schedule:
        if s.op == "free" and hold.get(s.node, -1) > done:
            pending.setdefault(hold[s.node], []).append(s)
            continue
        out.append(s)
        if s.op == "compute":
            done = s.node
            out.extend(pending.pop(done, []))
    for rest in pending.values():
        out.extend(rest)
    return tuple(out)


def _check_on_device(model: nn.Module, args: Any, kwargs: Any, dev: torch.device) -> None:
    for t in (*model.parameters(), *model.buffers(), *pytree.tree_leaves((args, kwargs))):
        if isinstance(t, torch.Tensor) and t.device.type != dev.type:
            raise ValueError(f"the model and its inputs must live on {dev} to be profiled there (found a "
                             f"tensor on {t.device}); move them first, or use device='fake:<target>'")


def _with_costs(graph: Graph, times: dict[int, float], temps: dict[int, int],
                flops: dict[int, float] | None = None) -> Graph:
    computes = tuple(
        ComputeNode(c.id, c.name, c.op, c.phase, c.inputs, c.outputs, time=times.get(c.id, c.time),
                    temp_bytes=temps.get(c.id, c.temp_bytes), module=c.module, source=c.source, block=c.block,
                    flops=(flops or {}).get(c.id, c.flops), mutates=c.mutates)
        for c in graph.computes
    )
    return Graph(computes, graph.datas, graph.outputs, name=graph.name, meta=dict(graph.meta))


# --- measured costs -------------------------------------------------------------------------------
class _Timer:
    """Wall time of an operator: ``warmup`` untimed runs then up to ``repeats`` timed ones (at least one),
    the fastest kept, stopping early once the two fastest agree or the operator's time budget is spent.

    Checkmate (Sec. 4.4) profiles each op.  A deterministic kernel's run is its own time plus whatever
    the machine adds (descheduling, an OpenMP barrier waiting for a preempted thread: 9-265 ms around a
    50 us matmul at load 8), never less, so the minimum of the runs is the load-robust estimate
    (Python's ``timeit`` keeps the minimum for this reason); a median of three kept a stall whenever two
    runs met one, and the warm-up run alone stood for an operator when it overran the budget, so one
    re-profile of the demo GPT summed its ops to 292 ms and the next to 3959 ms (issue 18 item 4).
    Runs stop once ``budget_s`` seconds are spent at the operator's fastest run (a stall does not use up
    the budget), and a warm-up run over the budget ends the warm-up: a kernel that alone takes longer
    than the budget runs twice and is measured by its timed run (a stall in the warm-up no longer stands
    for the operator), where warm-up effects (first-touch allocation, cache misses) are small next to its
    own time.  They also stop once the two fastest samples lie within ``spread`` of each other
    (max/min - 1): the minimum is confirmed and more runs would not lower it."""

    def __init__(self, device: torch.device, budget_s: float = 0.05, spread: float = 0.05) -> None:
        self.device = device
        self.budget_s = budget_s
        self.spread = spread

    def _once(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        return accelerator.timed(fn, self.device)

    def __call__(self, fn: Callable[[], Any], repeats: int, warmup: int) -> tuple[float, Any]:
        samples: list[float] = []
        out = None
        for i in range(max(0, warmup) + max(1, repeats)):
            out = None  # drop the previous result before the next run, like the real schedule
            seconds, out = self._once(fn)
            if i < warmup:
                if seconds >= self.budget_s:  # a long kernel (or a stall): one timed run decides
                    warmup = i + 1
                continue
            samples.append(seconds)
            if min(samples) * len(samples) >= self.budget_s or self._settled(samples):
                break
        return min(samples), out

    def _settled(self, samples: list[float]) -> bool:
        if len(samples) < 2:
            return False
        first, second = sorted(samples)[:2]
        return second <= (1 + self.spread) * first


def _measure_costs(graph: Graph, cap: Captured, model: nn.Module, args: tuple[Any, ...],
                   kwargs: dict[str, Any] | None, loss_fn: LossFn | None, info: DeviceInfo, repeats: int,
                   warmup: int) -> Graph:
    """Replay the graph in capture order on the real device, timing every operator (`_Timer`; Checkmate
    Sec. 4.4 profiles each op once per shape).  Operators with equal `op_key` (same op, shapes,
    strides, dtypes: the 12 blocks of a GPT) share one measurement: a later one runs once, untimed.
    It still runs, because the ops after it read its value, not only its shape: an index computed from
    it (T5's relative-position buckets into an embedding), a length (``ctc_loss``), a mask whose count
    sizes a ``masked_select``.  Another op's output standing in for it could index out of range or
    change what runs.  The replay costs one eager step plus the timed repeats of distinct ops."""
    seen: dict[tuple[Any, ...], tuple[float, int]] = {}
    flat_in = pytree.tree_leaves((args, kwargs or {}))
    timer = _Timer(info.torch_device)
    times: dict[int, float] = {}
    temps: dict[int, int] = {}
    with accelerator.fork_rng(accelerator.as_list(info.torch_device)), torch.no_grad():
        values = cap.placeholder_values(model, flat_in)  # non-tensor inputs stay as they are
        runner = Runner(cap, {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in values.items()})
        loss_state: dict[str, Any] = {}
        for step in eager_schedule(graph):
            if step.op == "free":
                runner.free(step.node)
                continue
            c = step.node
            if c == cap.loss_compute:
                times[c] = _run_loss(runner, cap, graph, loss_fn, loss_state, timer, repeats, warmup)
            elif c == cap.loss_backward_compute:
                times[c] = _run_loss_backward(runner, cap, loss_state, timer, repeats, warmup)
            else:
                node = runner.nodes[cap.compute_fx[c]]
                a, kw = runner.resolve(node)
                key = op_key(node.target, a, kw)
                fn = functools.partial(node.target, *a, **kw)
                if cap.autocast:  # the graph holds autocast's casts: its ops run as traced (bare otherwise)
                    fn = accelerator.autocast_off()(fn)
                if key is not None and key in seen:  # same op on the same shapes: its time, its own value
                    times[c], temps[c] = seen[key]
                    runner.store(c, fn())
                    continue
                times[c], out = timer(fn, repeats, warmup)
                if accelerator.is_accelerator(info.torch_device):
                    temps[c] = accelerator.workspace_bytes(fn, info.torch_device)
                if key is not None:
                    seen[key] = (times[c], temps.get(c, 0))
                runner.store(c, out)
    return _with_costs(graph, times, temps)


def _user_outputs(runner: Runner, cap: Captured) -> list[Any]:
    outs = pytree.tree_leaves(cap.gm.graph.output_node().args[0], is_leaf=lambda x: x is None)
    flat: dict[int, Any] = {}
    for node, kind in zip(outs, cap.outputs, strict=False):
        if kind is not None and kind[0] == "user":
            flat[kind[1]] = runner.value(node)
    return [flat.get(i) for i in range(cap.out_spec.num_leaves)]


def _run_loss(runner: Runner, cap: Captured, graph: Graph, loss_fn: LossFn | None, state: dict[str, Any],
              timer: _Timer, repeats: int, warmup: int) -> float:
    flat = _user_outputs(runner, cap)
    leaves = with_output_views(cap, [t.detach().requires_grad_(i in cap.tangent_data)
                                     if isinstance(t, torch.Tensor) else t for i, t in enumerate(flat)])
    fn = loss_fn or default_loss
    with torch.enable_grad():
        seconds, loss = timer(lambda: fn(pytree.tree_unflatten(leaves, cap.out_spec)), repeats, warmup)
    state["loss"], state["leaves"] = loss, leaves
    return seconds


def _run_loss_backward(runner: Runner, cap: Captured, state: dict[str, Any], timer: _Timer, repeats: int,
                       warmup: int) -> float:
    idx = sorted(cap.tangent_data)
    diff = [state["leaves"][i] for i in idx]
    with torch.enable_grad():
        seconds, grads = timer(lambda: torch.autograd.grad(state["loss"], diff, retain_graph=True,
                                                           allow_unused=True), repeats, warmup)
    for i, g in zip(idx, grads, strict=False):
        if g is None:  # the loss ignores this output: its gradient is zero
            g = torch.zeros_like(state["leaves"][i])
        runner.env[cap.tangent_fx[i]] = g
    state.clear()
    return seconds


# --- estimated costs --------------------------------------------------------------------------------
def estimate_costs(graph: Graph, cap: Captured, info: DeviceInfo) -> Graph:
    """FLOPs on fake tensors and bytes moved, through the target's roofline."""
    assert info.target is not None
    nodes = cap.nodes
    times: dict[int, float] = {}
    flops: dict[int, float] = {}
    seen: dict[tuple[Any, ...], float] = {}  # op_key -> FLOPs: the repeated blocks are counted once
    for c in graph.computes:
        # no FX node: the loss's synthetic nodes, and the optimizer's update nodes `add_optimizer` appends
        # after the captured ones (bytes moved only)
        fx = cap.compute_fx[c.id] if c.id < len(cap.compute_fx) else None
        moved = sum(graph.datas[d].bytes for d in (*c.inputs, *c.outputs))
        dtype = graph.datas[c.outputs[0]].dtype if c.outputs else "float32"
        f = 0.0
        if fx is not None:
            n = nodes[fx]
            fargs = torch.fx.node.map_arg(n.args, lambda a: a.meta.get("val"))
            fkwargs = torch.fx.node.map_arg(n.kwargs, lambda a: a.meta.get("val"))
            key = op_key(n.target, fargs, fkwargs)
            if key is not None and key in seen:
                f = seen[key]
            else:
                vals = [a.meta.get("val") for a in n.all_input_nodes]
                mode = torch._guards.detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
                try:
                    with mode if mode is not None else torch._subclasses.FakeTensorMode():
                        f, _ = count_flops(functools.partial(n.target, *fargs, **fkwargs))
                except (DynamicOutputShapeException, DataDependentOutputException):
                    # sized by values (an expert loop's `nonzero`, a boolean mask's indexing: HF SpecAugment's
                    # masked write and its backward), which fake tensors cannot run: no FLOP formula for them
                    f = 0.0
                if key is not None:
                    seen[key] = f
        flops[c.id] = f
        times[c.id] = info.target.op_time(f, moved, dtype)
    return _with_costs(graph, times, {}, flops)


# --- the eager reference ------------------------------------------------------------------------------
def _eager_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, mode: str,
                loss_fn: LossFn | None,
                held_grads: Collection[str] = ()) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    """One eager step of the original model that changes nothing in it, and the tensors that exist
    before it: parameters and inputs that require grad are replaced by detached aliases (same storage)
    that ``loss.backward()`` writes its ``.grad`` on, buffers by copies (BatchNorm statistics
    untouched).  Not ``torch.autograd.grad``: reentrant ``torch.utils.checkpoint`` refuses it.
    `held_grads`: the parameters whose ``.grad`` is a zero tensor existing before the step, which backward
    adds into (`profile`'s ``grads="accumulate"``)."""
    params = {k: grad_alias(v) for k, v in model.named_parameters()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    fn = loss_fn or default_loss
    args, kwargs = pytree.tree_map(grad_alias, (tuple(args), kwargs or {}))
    leaves = pytree.tree_leaves((args, kwargs))
    trainable = [p for p in (*params.values(), *leaves) if isinstance(p, torch.Tensor) and p.requires_grad]
    # a tied weight is one alias (functional_call ties it): one .grad
    held = {id(p): torch.zeros_like(p) for k, p in params.items() if k in held_grads}

    def step() -> Any:
        for t in trainable:
            t.grad = held.get(id(t))
        out = torch.func.functional_call(model, {**params, **buffers}, args, kwargs, tie_weights=True)
        if mode == "inference":
            return out
        loss = fn(out)
        del out  # once the loss has read them the outputs go, as in ``loss_fn(model(x)).backward()``
        loss.backward()
        return loss, [t.grad for t in trainable]

    return step, tensors_of(list(params.values()), list(buffers.values()), (args, kwargs),
                            list(held.values()))


def measure_eager_peak(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, *,
                       mode: str = "train", loss_fn: LossFn | None = None,
                       device: torch.device | str = "cpu", held_grads: Collection[str] = ()) -> int:
    """Peak bytes the original model holds running one step eagerly (`_eager_step`: the model is not
    changed), the RNG state restored afterwards.  A read off a uniform draw (LayerDrop's) is read as the
    draw at its top gives it, as the capture takes it (`capture.draws_at_their_top`): the step measured
    is the one in which every such layer runs, the most any draw holds."""
    step, existing = _eager_step(model, args, kwargs, mode, loss_fn, held_grads)
    with buffers_kept(model) as changed, accelerator.fork_rng(accelerator.as_list(device)), \
            _grad_mode(mode), draws_at_their_top():
        peak, result = measure_peak(step, existing, device)
    del result
    if changed:
        warnings.warn(ProfileWarning(_recomputed_buffers(changed)), stacklevel=2)
    return peak


def _recomputed_buffers(names: list[str]) -> str:
    """Why eager's buffers will differ from a memviz step's: the eager step ran on copies of the buffers,
    so a write to the model's own ones came from code run outside that call, the backward's recomputation
    of a ``torch.utils.checkpoint`` region (torchvision's DenseNet with ``memory_efficient=True``)."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"the eager step updated buffers {shown} again in its backward: torch.utils.checkpoint "
            "re-runs the checkpointed forward there, and BatchNorm in train mode moves its running "
            "statistics a second time per step.  memviz.export's step runs that forward once, so it updates "
            "them once per step, as the model without checkpointing does: its outputs and gradients equal "
            "eager's, these buffers will not (memviz.apply runs the model's own code and matches eager).  "
            "Keep buffer updates out of the checkpointed region, or drop the model's own checkpointing: "
            "memviz plans the recomputation")


def _grad_mode(mode: str) -> contextlib.AbstractContextManager[Any]:
    return torch.no_grad() if mode == "inference" else contextlib.nullcontext()


def _measure_graph_costs(graph: Graph, cap: Captured, model: nn.Module, args: tuple[Any, ...],
                         kwargs: dict[str, Any] | None, mode: str, loss_fn: LossFn | None, info: DeviceInfo,
                         repeats: int, warmup: int,
                         held_grads: Collection[str] = ()) -> tuple[Graph, xla.GraphMeasurement]:
    """Costs on a device that runs whole graphs (torch-xla, `memviz.hardware.xla`): the eager step is run and
    measured as the graphs it executes, and its time is shared out over the operators in proportion to
    their roofline estimates on the device's target."""
    estimated = estimate_costs(graph, cap, info)
    step, _ = _eager_step(model, args, kwargs, mode, loss_fn, held_grads)
    with accelerator.fork_rng([]), xla.fork_rng(info.torch_device), _grad_mode(mode):
        measured = xla.measure_step(step, info.torch_device, repeats=repeats, warmup=warmup)
    times = xla.share_time({c.id: c.time for c in estimated.computes}, measured.seconds)
    return _with_costs(estimated, times, {}), measured


# --- optimizer ----------------------------------------------------------------------------------------
def optimizer_layout(optimizer: Any) -> tuple[type, dict[str, Any], float, float, float]:
    """(class, hyper-parameters, state bytes per parameter byte, transient bytes per parameter byte,
    bytes per parameter byte still held while the next parameter is updated).

    Measured, not assumed: one real step on a small float32 tensor shows which per-parameter state the
    optimizer keeps (Adam: exp_avg and exp_avg_sq, SGD with momentum: momentum_buffer) and, with the
    storage tracker, the temporaries its update allocates (steady state: the second step).  A step over
    two tensors shows what one update leaves behind for the next: the single-tensor Adam loop rebinds
    its local ``denom`` only when the next parameter's is computed, so one parameter-sized temporary is
    alive during the next update."""
    cls, hyper = optimizer_hyper(optimizer)
    # a param group also holds entries its class's constructor does not take (AdamW's
    # decoupled_weight_decay, a scheduler's initial_lr): only the accepted ones are passed back
    accepted = inspect.signature(cls.__init__).parameters
    hyper_ok = {k: v for k, v in hyper.items() if k in accepted}
    for k in ("foreach", "fused", "capturable", "differentiable"):
        hyper_ok.pop(k, None)
    if "foreach" in accepted:
        hyper_ok["foreach"] = False
    n = 4096
    one, state = _update_transient(cls, hyper_ok, n, 1)
    two, _ = _update_transient(cls, hyper_ok, n, 2)
    return cls, hyper, state / (4 * n), one / (4 * n), max(two - one, 0) / (4 * n)


def _update_transient(cls: type, hyper: dict[str, Any], n: int, count: int) -> tuple[int, int]:
    """(peak bytes above the step's start, state bytes of one tensor) of the second step of `cls` over
    `count` float32 tensors of `n` elements."""
    params = [torch.zeros(n, requires_grad=True) for _ in range(count)]
    for p in params:
        p.grad = torch.ones(n)
    opt = cls(params, **hyper)
    opt.step()
    state = sum(int(v.untyped_storage().nbytes()) for v in opt.state[params[0]].values()
                if isinstance(v, torch.Tensor) and v.numel() == n)
    tracker = StorageTracker(tensors_of([*params, *(p.grad for p in params)], opt))
    with tracker:
        opt.step()
    return tracker.peak_bytes - tracker.start_bytes, state


def fixed_state_bytes(optimizer: Any, device: torch.device) -> int:
    """State bytes per parameter the optimizer keeps whatever the parameter's size (Adam's ``step``
    counter, a scalar tensor), counted where it lives: on the CPU unless ``capturable``/``fused`` put it
    beside the parameter.  `export(verify=True)` measured them missing (4 bytes per parameter)."""
    cls, hyper = optimizer_layout(optimizer)[:2]
    on_device = bool(hyper.get("capturable") or hyper.get("fused"))
    if torch.device(device).type != "cpu" and not on_device:
        return 0
    w = torch.zeros(8, requires_grad=True)
    w.grad = torch.ones(8)
    opt = cls([w], **{k: v for k, v in hyper.items() if k in inspect.signature(cls.__init__).parameters
                      and k not in ("foreach", "fused", "capturable", "differentiable")})
    opt.step()
    return sum(int(v.untyped_storage().nbytes()) for v in opt.state[w].values()
               if isinstance(v, torch.Tensor) and v.numel() != w.numel())


def target_kernels(info: DeviceInfo) -> str | None:
    """Whose kernels the capture takes (`memviz.profiling.capture.kernel_family`): an estimated CUDA target
    (``fake:h100``) is traced as CUDA runs it (fused attention, bool dropout masks), as `update_kind`
    decides its optimizer; otherwise the tensors' own device decides."""
    return "cuda" if info.estimated and devices.uses_caching_allocator(info.name) else None


def update_kind(optimizer: Any, info: DeviceInfo) -> str:
    """How the user's optimizer runs its step on `info`'s device: ``"fused"`` (one kernel per parameter
    group), ``"foreach"`` (list operations over a parameter group: its temporaries are allocated for every
    parameter of the group at once) or ``"for-loop"`` (one parameter after another).  Explicit ``fused`` /
    ``foreach`` hyper-parameters win; when both are unset the default is decided as torch.optim's step
    functions decide it (``_default_to_fused_or_foreach``: foreach on CUDA and other devices with foreach
    kernels, for-loop on the CPU).  An estimated CUDA target (``fake:h100``) decides as CUDA does."""
    from torch.optim.optimizer import _default_to_fused_or_foreach, _get_foreach_kernels_supported_devices

    cls, hyper = optimizer_hyper(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    if "foreach" not in accepted and "fused" not in accepted:
        return "for-loop"
    fused, foreach = hyper.get("fused"), hyper.get("foreach")
    if fused is None and foreach is None:
        differentiable = bool(hyper.get("differentiable"))
        device = torch.device("cuda") if target_kernels(info) == "cuda" else info.torch_device
        try:
            _, foreach = _default_to_fused_or_foreach([torch.empty(0, device=device)], differentiable,
                                                      use_fused=False)
        except (RuntimeError, AssertionError):  # a target estimated on a host without its device
            foreach = not differentiable and device.type in _get_foreach_kernels_supported_devices()
        # torch.optim.adam: "Do not flip on foreach for the unsupported case where lr is a Tensor"
        if foreach and isinstance(hyper.get("lr"), torch.Tensor) and not hyper.get("capturable"):
            foreach = False
    return "fused" if fused else "foreach" if foreach else "for-loop"


def optimizer_hyper(optimizer: Any) -> tuple[type, dict[str, Any]]:
    """(class, hyper-parameters of its first parameter group) of an optimizer class or instance."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return type(optimizer), {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer, {}
    raise TypeError(f"optimizer must be a torch.optim.Optimizer class or instance, not {optimizer!r}")


def group_transient(optimizer: Any, kind: str) -> tuple[float, float]:
    """(bytes per byte of the whole group, bytes per byte of its largest tensor) a ``foreach`` or ``fused``
    step allocates above its start, measured as `optimizer_layout` measures the for-loop: the second step
    over one and over two float32 tensors with the storage tracker (a foreach Adam holds one square root
    per parameter of the group at once: 1.0 and 0.0)."""
    cls, hyper = optimizer_hyper(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    hyper_ok = {k: v for k, v in hyper.items()
                if k in accepted and k not in ("foreach", "fused", "capturable", "differentiable")}
    hyper_ok[kind] = True
    n = 4096
    one, _ = _update_transient(cls, hyper_ok, n, 1)
    two, _ = _update_transient(cls, hyper_ok, n, 2)
    per_group = max(two - one, 0) / (4 * n)
    return per_group, max(one / (4 * n) - per_group, 0.0)


def _groups(params: list[DataNode], optimizer: Any, model: nn.Module | None) -> list[list[DataNode]]:
    """`params` split as the optimizer's step splits them into one foreach / fused call each: by parameter
    group (an instance's, matched to names through `model`; otherwise one group), then by dtype
    (torch.optim groups tensors by device and dtype)."""
    group_of: dict[str, int] = {}
    if isinstance(optimizer, torch.optim.Optimizer) and model is not None:
        name_of = {id(p): n for n, p in model.named_parameters()}
        for i, g in enumerate(optimizer.param_groups):
            group_of.update({name_of[id(p)]: i for p in g["params"] if id(p) in name_of})
    out: dict[tuple[int, str], list[DataNode]] = {}
    for p in params:
        out.setdefault((group_of.get(p.name, len(optimizer.param_groups) if group_of else 0), p.dtype),
                       []).append(p)
    return [out[k] for k in sorted(out, key=lambda k: (k[0], min(p.id for p in out[k])))]


def add_optimizer(graph: Graph, grad_data: dict[str, int], optimizer: Any, info: DeviceInfo,
                  model: nn.Module | None = None) -> Graph:
    """Append the optimizer step as the user's optimizer runs it (`update_kind`): a for-loop step is one
    compute node per parameter with a gradient (phase optimizer) reading the parameter, its gradient and
    its state (optimizer_state data nodes, alive from the start, as in every step after the first); a
    foreach or fused step is one compute node per parameter group and dtype reading all of theirs, whose
    workspace is the group's temporaries (`group_transient`), all alive at once.  Updates are in place: no
    new storage, only the measured transient, plus (for-loop) what the previous update still holds (the
    user's optimizer runs in its own parameter order whatever the plan's order of these nodes).
    `model`: the profiled model, which names an optimizer instance's parameter groups."""
    cls, _, state_ratio, temp_ratio, held_ratio = optimizer_layout(optimizer)
    kind = update_kind(optimizer, info)
    fixed = fixed_state_bytes(optimizer, info.torch_device)
    b = GraphBuilder(graph.name)
    b._datas = [{"name": d.name, "bytes": d.bytes, "kind": d.kind, "producer": d.producer, "shape": d.shape,
                 "dtype": d.dtype, "aliases": d.aliases} for d in graph.datas]
    b._computes = [{"name": c.name, "op": c.op, "phase": c.phase, "inputs": c.inputs, "outputs": c.outputs,
                    "time": c.time, "temp_bytes": c.temp_bytes, "module": c.module, "source": c.source,
                    "block": c.block, "flops": c.flops, "mutates": c.mutates} for c in graph.computes]
    b.outputs = list(graph.outputs)
    # torch.optim skips a parameter whose gradient is None (frozen, or reached only through outputs the
    # loss does not use): no update, no state
    params = [d for d in graph.datas if d.kind is DataKind.PARAMETER and d.name in grad_data]
    timer = _Timer(info.torch_device)
    timed: dict[tuple[Any, ...], float] = {}  # (shape, dtype) -> seconds: repeated blocks timed once
    impl = {kind: True} if kind != "for-loop" else \
        {"foreach": False} if "foreach" in inspect.signature(cls.__init__).parameters else {}
    reads: dict[int, list[int]] = {}
    seconds: dict[int, float] = {}
    for p in params:
        g = grad_data[p.name]
        states = []
        if state_ratio or fixed:
            states.append(b.data(f"{p.name}.optimizer_state", int(round(p.bytes * state_ratio)) + fixed,
                                 DataKind.OPTIMIZER_STATE, shape=p.shape, dtype=p.dtype))
        if info.estimated:  # an update reads parameter, gradient and state and writes parameter and state
            moved = p.bytes * (3 + 2 * state_ratio)
            seconds[p.id] = info.target.op_time(0.0, moved, p.dtype) if info.target else 0.0
        else:
            key = (tuple(p.shape), p.dtype)
            if key not in timed:
                timed[key] = _time_update(cls, p, timer, impl)
            seconds[p.id] = timed[key]
        # a gradient summed in place (`capture.accumulate_in_place`, `capture.accumulated_into_grads`)
        # lives in the storage its sum wrote: the update reads that storage, after the sum (whose 0-byte
        # output `g` is); a tied weight's first contribution added on into .grad is not read again
        summed = graph.datas[g].producer
        written = [d for d in graph.computes[summed].mutates
                   if graph.datas[d].kind is DataKind.PARAMETER_GRADIENT] if summed is not None else ()
        reads[p.id] = [p.id, g, *written, *states]
    if kind == "for-loop":
        for i, p in enumerate(params):
            held = int(round(params[i - 1].bytes * held_ratio)) if i else 0
            b.compute(f"{cls.__name__}.step[{p.name}]", reads[p.id], [], op=f"{cls.__name__}.step",
                      phase=Phase.OPTIMIZER, time=seconds[p.id],
                      temp_bytes=int(round(p.bytes * temp_ratio)) + held,
                      module=p.name.rsplit(".", 1)[0], source=f"torch.optim.{cls.__name__}.step")
    else:
        per_group, per_largest = group_transient(optimizer, kind)
        for group in _groups(params, optimizer, model):
            total, largest = sum(p.bytes for p in group), max(p.bytes for p in group)
            b.compute(f"{cls.__name__}.step[{kind}: {len(group)} {group[0].dtype} parameters]",
                      [d for p in group for d in reads[p.id]], [], op=f"{cls.__name__}.step",
                      phase=Phase.OPTIMIZER, time=sum(seconds[p.id] for p in group),
                      temp_bytes=int(round(total * per_group + largest * per_largest)),
                      module="", source=f"torch.optim.{cls.__name__}.step ({kind})")
    return b.build(**graph.meta, optimizer=cls.__name__, optimizer_update=kind)


def _time_update(cls: type, p: Any, timer: _Timer, impl: dict[str, bool]) -> float:
    """Median time of one real update of a tensor shaped like parameter `p` (on a copy), run as the
    user's optimizer runs it (`impl`: ``foreach=True``, ``fused=True`` or ``foreach=False``)."""
    dtype = getattr(torch, p.dtype, torch.float32)
    dev = timer.device
    w = torch.zeros(p.shape, dtype=dtype, device=dev, requires_grad=True)
    w.grad = torch.ones_like(w)
    opt = cls([w], **impl)
    opt.step()
    seconds, _ = timer(opt.step, repeats=3, warmup=1)
    return seconds


# --- fallback: module-level profile from hooks ----------------------------------------------------------
def _hooks_profile(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, *, mode: str,
                   loss_fn: LossFn | None, info: DeviceInfo) -> Profile:
    """Coarse CD-graph of an untraceable model: one forward and one backward compute node per leaf-module
    call, recorded with hooks on a copy of the model (the user's model is not touched).  Data nodes are
    the module outputs (saved for backward in training), their gradients and the parameter gradients;
    times are the wall-clock time between pre-hook and hook."""
    work = copy.deepcopy(model)
    b = GraphBuilder(type(model).__name__)
    data_of: dict[int, int] = {}
    param_data: dict[int, int] = {}
    for name, p in work.named_parameters():
        param_data[id(p)] = data_of[p.untyped_storage()._cdata] = b.data(
            name, p.untyped_storage().nbytes(), DataKind.PARAMETER, shape=tuple(p.shape),
            dtype=str(p.dtype).replace("torch.", ""))
    for name, buf in work.named_buffers():
        data_of[buf.untyped_storage()._cdata] = b.data(name, buf.untyped_storage().nbytes(), DataKind.BUFFER)
    for i, t in enumerate(pytree.tree_leaves((args, kwargs or {}))):
        if isinstance(t, torch.Tensor):
            nbytes = t.untyped_storage().nbytes()
            data_of[t.untyped_storage()._cdata] = b.data(f"input{i}", nbytes, DataKind.INPUT)
    calls: list[dict[str, Any]] = []
    starts: dict[int, float] = {}
    keep: list[Any] = []  # storages stay alive while recording so their keys stay unique

    def pre(mod: nn.Module, inp: Any) -> None:
        starts[id(mod)] = time.perf_counter()

    def post(mod: nn.Module, inp: Any, out: Any) -> None:
        seconds = time.perf_counter() - starts.pop(id(mod), time.perf_counter())
        ins = [data_of[t.untyped_storage()._cdata] for t in pytree.tree_leaves(inp)
               if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata in data_of]
        ins += [param_data[id(p)] for p in mod.parameters(recurse=False)]
        outs = []
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in data_of:
                keep.append(t)
                d = b.data(f"{names[id(mod)]}.out{len(outs)}", t.untyped_storage().nbytes(),
                           DataKind.ACTIVATION,
                           shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""))
                data_of[t.untyped_storage()._cdata] = d
                outs.append(d)
        calls.append({"module": names[id(mod)], "ins": ins, "outs": outs, "time": seconds,
                      "params": [param_data[id(p)] for p in mod.parameters(recurse=False)]})

    names = {id(m): n for n, m in work.named_modules()}
    handles = []
    for m in work.modules():
        if not list(m.children()):
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        with torch.random.fork_rng(), (torch.no_grad() if mode == "inference" else torch.enable_grad()):
            out = work(*args, **(kwargs or {}))
            if mode == "train":
                t0 = time.perf_counter()
                (loss_fn or default_loss)(out).backward()
                backward_seconds = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    fwd_ids = []
    for call in calls:
        if not call["outs"]:
            continue
        fwd_ids.append(b.compute(f"{call['module']}.forward", sorted(set(call["ins"])), call["outs"],
                                 op=call["module"], phase=Phase.FORWARD, time=call["time"],
                                 module=call["module"]))
    final = [d for call in calls for d in call["outs"]][-1:] if calls else []
    if mode == "train" and calls:
        share = backward_seconds / max(1, len(fwd_ids))
        grad_in: int | None = None
        for call in reversed([c for c in calls if c["outs"]]):
            outs = [call["outs"][0]]
            in_bytes = b._datas[call["ins"][0]]["bytes"] if call["ins"] else 0
            gout = b.data(f"{call['module']}.grad_input", in_bytes, DataKind.GRADIENT)
            pgrads = [b.data(f"{b._datas[p]['name']}.grad", b._datas[p]["bytes"], DataKind.PARAMETER_GRADIENT)
                      for p in call["params"]]
            ins = [*outs, *call["ins"], *([grad_in] if grad_in is not None else [])]
            b.compute(f"{call['module']}.backward", sorted(set(ins)), [gout, *pgrads], op=call["module"],
                      phase=Phase.BACKWARD, time=share, module=call["module"])
            b.outputs.extend(pgrads)
            grad_in = gout
        b.outputs.append(grad_in)
    b.outputs.extend(final)
    graph = b.build(mode=mode, estimated=False, device=info.name, fallback="hooks")
    schedule = eager_schedule(graph)
    return Profile(graph=graph, baseline=simulate(graph, schedule).check(), baseline_schedule=schedule,
                   measured_peak_bytes=None, device=info, mode=mode, model_name=type(model).__name__,
                   fingerprint=fingerprint(model, args, kwargs, mode), captured=None, model=model,
                   loss_fn=loss_fn, fallback=True)
