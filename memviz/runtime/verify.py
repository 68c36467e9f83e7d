"""``memviz.export(plan, verify=True)``: run one measured step of the exported module before returning it.

A plan is only as good as its graph: memory the capture does not see (a kernel's workspace, an
allocation outside the traced code, a loss or optimizer that behaves unlike its model) makes the real
peak exceed the predicted one.  Verification runs one step of the exported module on the plan's example
inputs -- forward, the user's loss, backward and, when the plan models one, the optimizer step -- and
measures its peak the way the profile measured the eager step (`memviz.profiling.tracker.measure_peak`: live
storages on CPU, the caching allocator's peak on an accelerator).

* Measured over the budget: the plan is solved again, same strategy, under the budget minus the
  measured excess (the memory the prediction misses), exported and measured again, at most
  `MAX_TRIES` times; a `VerifyWarning` names the numbers.  No schedule under the reduced budget, or
  still over after the last try: `memviz.runtime.export.BudgetExceededError` with the measured, planned and
  budget bytes.  A module that measured over the budget is never returned.
* Measured within the budget but more than `TOLERANCE` over the prediction: returned, with a
  `VerifyWarning` (the plan's figures are off, its budget is honoured).  Re-planning would not help: a
  step under the budget already fits any margin its own excess asks for.
* ``backend=`` (``export(plan, verify=True, backend="inductor")``): the step measured is that of
  ``torch.compile(module, backend=backend)`` (`memviz.runtime.compiled`), after one step that compiles
  it; on an accelerator by its caching allocator as always, on CPU by the allocator's own peak
  (`memviz.profiling.tracker.allocator_peak`: compiled code allocates outside the dispatcher, and
  torch.compile runs eagerly under the live-storage tracker) less what the allocator also counts in a
  step of the uncompiled module beyond the live-storage tracker's peak (kernel workspaces, the RNG
  states kept for dropout replay: memory no plan models, and which the uncompiled export's
  verification does not count either).  What remains is the plan's memory plus what the backend adds
  to it (buffers its fused kernels keep alive, copies in other layouts): a compiled step over the
  budget is re-planned with that excess as margin, or refused, like any other.  The module returned
  is the uncompiled one, whose compiled code for that backend is cached: ``torch.compile(module,
  backend=backend)`` runs the code that was measured.
* A plan whose step accumulates into ``.grad`` (`memviz.profile(grads="accumulate")`) is measured with
  every gradient it holds from the start a zero tensor there beforehand, which backward adds into.
* Then the same step runs on the user's model and on the returned module from the same random state,
  and their loss and gradients (outputs, for inference) are compared (`memviz.runtime.equivalence`; an
  accumulating step over `equivalence.MICRO_BATCHES` micro-batches into the same ``.grad``):
  a module that computes something else raises `MismatchError` and is never returned; the comparison
  is ``module.verified_equal`` (on an accelerator without room for eager's step it is skipped, and says
  so there).
* Nothing the user sees changes: parameters, their ``.grad``, buffers (BatchNorm statistics) and the
  RNG streams are as before (buffers and, with an optimizer, parameters are copied to host memory and
  copied back; the RNG is forked).  The optimizer is a fresh one of the profiled class whose state is
  created beforehand by an update with zero gradients (the plan holds that state from the start, as in
  every step after the first); the user's optimizer is never stepped.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memviz.budget import format_bytes
from memviz.hardware import accelerator, amp
from memviz.hardware.amp import closure_values
from memviz.profiling.capture import accumulated_grads, draws_at_their_top, host_rng_forked
from memviz.profiling.tracker import allocator_peak, grad_alias, measure_peak, tensors_of
from memviz.runtime.equivalence import compare_to_eager
from memviz.runtime.export import BudgetExceededError, _example_inputs, build, split_inputs
from solvers.ir import DataKind, Phase
from solvers.result import InfeasibleBudget

#: The measured peak may exceed the predicted one by this fraction of it before it is reported: the
#: contract (DESIGN.md "Correctness means") is a measured peak within 1% of the plan's.
TOLERANCE = 0.01


class VerifyError(ValueError):
    """The verifying step could not run (its inputs, not the plan): the message says what to pass."""


#: Re-plans after the first measurement; each one costs a solve and a measured step.
MAX_TRIES = 3
#: Time limit of each re-plan's solve (seconds).
REPLAN_TIME_LIMIT = 30.0


class MismatchError(ValueError):
    """The rewritten module's verifying step computed something else than the model's own step
    (`memviz.runtime.equivalence`): nothing is returned (a ValueError like `BudgetExceededError`, so the
    CLI reports it as it reports a refusal)."""


class VerifyWarning(UserWarning):
    """The verifying step measured more than the plan predicted (the message gives the numbers)."""


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """What one verifying step runs: the call, the mode, the loss and the optimizer (class, hyper)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    mode: str
    loss_fn: Callable[[Any], torch.Tensor] | None
    optimizer: tuple[type, dict[str, Any]] | None
    updated: frozenset[str]  # parameter names the plan's optimizer step updates
    # the parameter groups a foreach / fused step runs over, one per optimizer node (`profile.add_optimizer`):
    # its temporaries are one group's; empty: one group (a for-loop step holds one parameter's)
    groups: tuple[tuple[str, ...], ...] = ()
    # torch.compile's backend the module is measured under (`memviz.runtime.compiled`); None: eagerly
    backend: Any = None
    # the inputs are zeros of the planned shapes (no ``inputs=``), which a model may not run on
    zeros: bool = False
    # the torch.autocast regions the step was profiled in (`Captured.autocast`, a loaded plan's
    # ``graph.meta.autocast``): forward, loss and backward run inside them, whatever the caller's; None (a
    # plan file older than memviz.plan/3, a recorded step): the caller's autocast, as it is
    autocast: tuple[tuple[str, torch.dtype], ...] | None = None
    # the parameters whose .grad the step starts with and adds into (`memviz.profile(grads="accumulate")`):
    # zeros before the measured step, counted from its start; empty: every .grad None
    accumulated: frozenset[str] = frozenset()
    # the torch.amp.GradScaler the step's loss is scaled by and its update goes through
    # (`memviz.hardware.amp`); the step runs a copy of it
    scaler: Any = None


def verified_export(plan: Any, *, model: nn.Module | None = None, inputs: Any = None, loss_fn: Any = None,
                    optimizer: Any = None, backend: Any = None, scaler: Any = None) -> nn.Module:
    """`memviz.export` of `plan` after one measured step (module docstring), compiled by `backend` when
    one is given; the module's ``plan`` is the plan it runs (a re-planned one when the first measured
    over budget) and its ``verified_peak_bytes`` the step's measured peak."""
    spec = dataclasses.replace(step_spec(plan, _model_of(plan, model), inputs, loss_fn, optimizer, scaler),
                               backend=backend)
    caller = "memviz.export(verify=True" + ("" if backend is None else f", backend={backend!r}") + ")"
    return verified(plan, lambda p: build(p, model=model, inputs=inputs), spec, caller,
                    original=_model_of(plan, model))


def verified_apply(plan: Any, *, model: nn.Module | None = None, inputs: Any = None, loss_fn: Any = None,
                   optimizer: Any = None, scaler: Any = None) -> nn.Module:
    """`memviz.apply` of a "sac" `plan` (a copy of the model, checkpointed) after one measured step, as
    `verified_export`: a step over the budget is re-planned ("sac" again) or refused."""
    from memviz.runtime.apply import apply

    target = _model_of(plan, model)
    spec = step_spec(plan, target, inputs, loss_fn, optimizer, scaler)
    return verified(plan, lambda p: apply(p, target), spec, "memviz.apply (verified)", none_as="sac",
                    outside=_accelerator_bytes(target), original=target)


def _accelerator_bytes(model: nn.Module) -> int:
    """Bytes of `model`'s parameters, gradients and buffers on an accelerator: its allocator counts them
    in a step of a copy, which does not hold them (on the CPU the tracker counts only the step's own)."""
    storages = {}
    for t in tensors_of(model):
        if accelerator.is_accelerator(t.device):
            storage = t.untyped_storage()
            storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def _model_of(plan: Any, model: nn.Module | None) -> nn.Module:
    target = model if model is not None else getattr(getattr(plan, "profile", None), "model", None)
    if target is None:
        raise ValueError("verify=True runs the plan on its model, and this plan carries none (loaded from "
                         "JSON?): pass model= (and inputs=(args, kwargs) unless zeros of the planned shapes "
                         "are valid inputs)")
    return target


def verified(plan: Any, make: Callable[[Any], nn.Module], spec: StepSpec, caller: str, *,
             original: nn.Module, none_as: str = "auto", outside: int = 0) -> nn.Module:
    """`make(plan)` once one measured step of it is within the budget (module docstring): re-planned
    with the measured excess as margin at most `MAX_TRIES` times, else `BudgetExceededError`; then its
    step compared with `original`'s (`memviz.runtime.equivalence`), `MismatchError` when they differ.
    `outside`: bytes the measurement counts that the step does not hold (`_accelerator_bytes`)."""
    budget = plan.budget_bytes
    current, margin, history = plan, 0, []
    for attempt in range(MAX_TRIES + 1):
        module = make(current)
        measured = measured_on_zeros(module, spec, caller) - outside
        history.append((current.budget_bytes, current.peak_bytes, measured))
        if budget is None or measured <= budget:
            break
        if attempt == MAX_TRIES:
            raise BudgetExceededError(
                f"{caller}: the step measured {format_bytes(measured)} over the budget "
                f"{format_bytes(budget)} after {MAX_TRIES} re-plans ({_history(history)}): memory outside "
                "the captured graph grows as the plan tightens; raise the budget or try another strategy",
                measured=measured, planned=current.peak_bytes, budget=budget)
        margin = max(margin, measured - current.peak_bytes)
        current = replan(current, budget - margin, spec, measured=measured, none_as=none_as)
    if history[-1][2] > current.peak_bytes * (1 + TOLERANCE) or len(history) > 1:
        warnings.warn(VerifyWarning(_report(history, budget, caller)), stacklevel=3)
    module.plan = current
    module.verified_peak_bytes = measured
    module.verified_equal = compare_to_eager(module, original, spec.args, spec.kwargs, spec.loss_fn,
                                             spec.mode, plan.baseline.peak_bytes, spec.autocast,
                                             accumulated=spec.accumulated, scaler=spec.scaler)
    if module.verified_equal.equal is False:
        raise MismatchError(
            f"{caller}: the rewritten step is {module.verified_equal.describe()}, on the same inputs and "
            f"random state: it would change what the model computes, so it is not returned.  {_cause(plan)}")
    return module


def _cause(plan: Any) -> str:
    """Why an exported step can differ from eager's: what the profile warned about (`Captured`'s
    `host_random`, `torch_draws`: HF HuBERT's SpecAugment masks from NumPy are constants of the graph;
    `specialised`: branches taken as the example took them), else a memviz fault.  memviz.apply runs the
    model's own code, its draws and branches, either way."""
    cap = getattr(getattr(plan, "profile", None), "captured", None)
    if cap is not None and cap.host_random:
        return (f"The model draws random numbers outside torch ({', '.join(cap.host_random)}), which the "
                "captured graph holds as constants (the profile warned): no exported step can match eager's; "
                "memviz.apply runs the model's own code and draws as eager does")
    if cap is not None and cap.torch_draws is not None:
        return (f"The model's forward draws from torch's generator {cap.torch_draws[0]} times in eager mode "
                f"but {cap.torch_draws[1]} times in its captured graph (the profile warned); memviz.apply "
                "runs the model's own code and draws as eager does")
    if cap is not None and cap.specialised:
        return (f"The captured graph takes the {len(cap.specialised)} branches and sizes on tensor "
                "values the profile's example took (the profile warned: Autoformer's top-k delays), "
                "where eager decides them again at every step; if none of them differs "
                "here, this is a memviz fault (please report it with the plan file).  memviz.apply runs "
                "the model's own code")
    return ("This is a memviz fault (please report it with the plan file); memviz.apply (strategy 'sac') "
            "runs the model's own code and may serve meanwhile")


def measured_on_zeros(module: nn.Module, spec: StepSpec, caller: str) -> int:
    """`measure_step`; where the step ran on zeros of the planned shapes and failed, an error that says
    so and what to pass: the values can matter (mBART's labels all padding, the id zero, so shifting
    them right gathers at index -1)."""
    try:
        return measure_step(module, spec)
    except (RuntimeError, IndexError, ValueError) as exc:
        if not spec.zeros:
            raise
        raise VerifyError(
            f"{caller}: the verifying step runs on zeros of the planned input shapes (no inputs= given), "
            f"and the model failed on them ({type(exc).__name__}: {str(exc).strip().splitlines()[0]}): pass "
            "inputs=(args, kwargs), the example inputs the model was profiled on, or verify=False") from exc


def replan(plan: Any, budget: int, spec: StepSpec, *, measured: int, none_as: str = "auto") -> Any:
    """`plan` solved again under `budget` with its own strategy (the eager order "none" as `none_as`: it
    has no tighter schedule); refusals become `BudgetExceededError` with the numbers."""
    from memviz.plans.planning import PlanningError
    from memviz.plans.planning import plan as make_plan

    strategy = none_as if plan.strategy == "none" else plan.strategy
    prof = getattr(plan, "profile", None)
    what = (f"the step measured {format_bytes(measured)}, over the budget "
            f"{format_bytes(plan.budget_bytes)} (the plan predicted {format_bytes(plan.peak_bytes)})")
    try:
        if budget <= 0:
            raise InfeasibleBudget(budget, None, strategy)
        new = make_plan(prof if prof is not None else plan.graph, budget, strategy=strategy,
                        time_limit=REPLAN_TIME_LIMIT, frontier=False, packing=plan.packing is not None)
    except (InfeasibleBudget, PlanningError) as exc:
        raise BudgetExceededError(
            f"{what}; re-planning with the {format_bytes(measured - plan.peak_bytes)} the prediction misses "
            f"as margin ({strategy} at {format_bytes(budget)}) failed: {exc}.  Raise the budget by at least "
            "that margin, or try another strategy",
            measured=measured, planned=plan.peak_bytes, budget=plan.budget_bytes) from exc
    # the user's budget stays the plan's budget; a loaded plan keeps its model and device records
    return dataclasses.replace(new, budget_bytes=plan.budget_bytes, model=plan.model, device=plan.device,
                               profile=prof)


def step_spec(plan: Any, model: nn.Module, inputs: Any, loss_fn: Any, optimizer: Any,
              scaler: Any = None) -> StepSpec:
    """The verifying step for `plan` on `model`: given inputs, else the profiled call rebuilt as zeros
    of the planned shapes on the model's device (the captured graph's memory depends on shapes only);
    `scaler` (else the profile's) scales its loss and steps its optimizer; a plan whose step had one and
    that holds no profile (a loaded plan file) needs `scaler` (`amp.refuse_unscaled`)."""
    prof = getattr(plan, "profile", None)
    amp.refuse_scaling_loss(loss_fn)
    scaler = scaler if scaler is not None else getattr(prof, "scaler", None)
    amp.refuse_unscaled(plan.graph.meta, scaler)
    if inputs is not None:
        args, kwargs = split_inputs(inputs)
    else:
        args, kwargs = _example_inputs(plan.graph, prof if getattr(prof, "captured", None) else None, model)
    mode = (getattr(plan, "model", None) or {}).get("mode", getattr(prof, "mode", "train"))
    # the parameters the optimizer nodes read (one node per parameter, or per group for foreach / fused)
    groups = tuple(tuple(plan.graph.datas[d].name for d in c.inputs
                         if plan.graph.datas[d].kind is DataKind.PARAMETER)
                   for c in plan.graph.computes if c.phase is Phase.OPTIMIZER)
    updated = frozenset(n for g in groups for n in g)
    grouped = plan.graph.meta.get("optimizer_update") in ("foreach", "fused")
    cap = getattr(prof, "captured", None)
    return StepSpec(args=args, kwargs=kwargs, mode=mode, zeros=inputs is None,
                    accumulated=accumulated_grads(plan.graph),
                    autocast=accelerator.autocast_from_json(plan.graph.meta.get("autocast")) if cap is None
                    else cap.autocast,
                    loss_fn=loss_fn if loss_fn is not None else getattr(prof, "loss_fn", None),
                    scaler=scaler,
                    optimizer=optimizer_spec(plan, optimizer) if updated else None, updated=updated,
                    groups=groups if grouped else ())


def optimizer_spec(plan: Any, optimizer: Any) -> tuple[type, dict[str, Any]]:
    """(class, hyper-parameters) of the optimizer a plan's optimizer nodes model: `optimizer` (class or
    instance), else the profile's, else the ``torch.optim`` class the graph names with its defaults."""
    opt = optimizer if optimizer is not None else getattr(getattr(plan, "profile", None), "optimizer", None)
    if isinstance(opt, torch.optim.Optimizer):
        # a param group also holds what its constructor does not take (AdamW's decoupled_weight_decay)
        accepted = inspect.signature(type(opt)).parameters
        return type(opt), {k: v for k, v in opt.param_groups[0].items() if k != "params" and k in accepted}
    if isinstance(opt, type) and issubclass(opt, torch.optim.Optimizer):
        return opt, {}
    name = plan.graph.meta.get("optimizer") or next(
        c.op.split(".")[0] for c in plan.graph.computes if c.phase is Phase.OPTIMIZER)
    cls = getattr(torch.optim, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"the plan models a {name} optimizer step, which is not a torch.optim class: "
                         "pass optimizer= (the class or instance it was profiled with)")
    # the step as the plan models it (`profile.update_kind`), not this device's default
    kind = plan.graph.meta.get("optimizer_update")
    return cls, {"foreach": False} if kind == "for-loop" and "foreach" in inspect.signature(cls).parameters \
        else {kind: True} if kind in ("foreach", "fused") else {}


def measure_step(module: nn.Module, spec: StepSpec) -> int:
    """Peak bytes of one step of `module` (`spec`), leaving parameters, ``.grad``, buffers and RNG as
    they were.  Uncompiled, reads off a uniform draw are read as the draw at its top gives them
    (`memviz.profiling.capture.draws_at_their_top`): a LayerDrop model runs every layer, the step its plan
    bounds, not the lighter one the verifying step's own draws might give."""
    # named as in the user's model (the plan's optimizer nodes name its parameters), not "_orig_mod.*"
    params = dict(getattr(module, "_orig_mod", module).named_parameters())
    buffers = list(module.buffers())
    grads = {n: p.grad for n, p in params.items()}
    # host copies: on an accelerator they are not part of the measured device memory, on CPU the
    # tracker counts only storages it was given or saw created
    saved_buffers = [b.detach().to("cpu", copy=True) for b in buffers]
    saved_params = {n: p.detach().to("cpu", copy=True) for n, p in params.items()} if spec.optimizer else {}
    args, kwargs = pytree.tree_map(grad_alias, (spec.args, spec.kwargs))
    devices = accelerator.devices_of([*params.values(), *buffers, *pytree.tree_leaves((args, kwargs))])
    device = devices[0] if devices else torch.device("cpu")
    if accelerator.is_accelerator(device):
        # the allocator counts everything on the device, garbage in reference cycles too (a module a
        # re-plan replaced, a wrapped copy: `memviz.runtime.apply.wrap` binds its forward to it); the
        # CPU tracker counts only the step's own storages
        gc.collect()
    try:
        with accelerator.fork_rng(devices), host_rng_forked():
            for p in params.values():
                p.grad = None
            opt = _primed_optimizer(spec, params)
            for n in spec.accumulated & params.keys():  # held from the start, added into by backward
                params[n].grad = torch.zeros_like(params[n])
            scaler = amp.fresh_copy(spec.scaler)  # its scale and growth tracker count from the start
            held = tensors_of(module, opt, (args, kwargs), vars(scaler) if scaler is not None else None)
            loss_held, outside = loss_only(spec.loss_fn, held, device)
            if spec.backend is None:
                step = _step(module, spec, args, kwargs, opt, scaler)
                # the step the plan holds: every layer a uniform draw may skip (LayerDrop) run
                with draws_at_their_top():
                    peak = measure_peak(step, held + loss_held, device)[0] - outside
            else:
                peak = _compiled_peak(module, spec, args, kwargs, opt, device, held + loss_held) - outside
    finally:
        with torch.no_grad():
            for b, saved in zip(buffers, saved_buffers, strict=True):
                b.copy_(saved)
            for n, saved in saved_params.items():
                params[n].copy_(saved)
        for n, p in params.items():
            p.grad = grads[n]
    return peak


def loss_only(loss_fn: Any, held: list[torch.Tensor], device: torch.device) -> tuple[list[torch.Tensor], int]:
    """The tensors only the loss function holds (`closed_over`: not among `held`, the step's module,
    optimizer and inputs) and their bytes on `device`.  In the user's step the labels the loss closes over
    are those the model gets; the verifying step's inputs are rebuilt, so there they are other storages,
    which the step holds besides its own labels (or counts as its allocation when a view of them,
    ``labels.reshape(-1)``, is the first it sees): BERT-like masked LMs with a user cross-entropy measured
    256 B over the plan, and a plan at the minimum budget was refused.  The caller counts them from the
    start and takes their bytes off the peak."""
    seen = {t.untyped_storage()._cdata for t in held}
    extra: dict[int, torch.Tensor] = {}
    for t in closed_over(loss_fn):
        key = t.untyped_storage()._cdata
        if key not in seen and t.device.type == torch.device(device).type:
            extra[key] = t
    return list(extra.values()), sum(int(t.untyped_storage().nbytes()) for t in extra.values())


def closed_over(fn: Any) -> list[torch.Tensor]:
    """The tensors a loss function holds (`amp.closure_values`, modules aside): its labels."""
    return [t for v in closure_values(fn) if not isinstance(v, torch.nn.Module) for t in tensors_of(v)]


def _compiled_peak(module: nn.Module, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
                   opt: torch.optim.Optimizer | None, device: torch.device,
                   preexisting: list[torch.Tensor]) -> int:
    """Peak bytes of a step of ``torch.compile(module, backend=spec.backend)``, `preexisting` counted from
    the start, measured after a first step that compiles it (whose memory is the compiler's), on CPU less
    the allocator's excess over the live-storage tracker in an uncompiled step (module docstring); only the
    measured step runs the optimizer (the caller restores the parameters it moved)."""
    if accelerator.is_accelerator(device):
        unmodelled = 0
    else:  # before anything is compiled: a tracked step of a compiled module would run eagerly
        seen = allocator_peak(_step(module, spec, args, kwargs, None), preexisting)[0]
        _clear_grads(module)
        unmodelled = max(0, seen - measure_peak(_step(module, spec, args, kwargs, None), preexisting)[0])
        _clear_grads(module)
    compiled = torch.compile(module, backend=spec.backend)
    _step(compiled, spec, args, kwargs, None)()
    _clear_grads(module)
    step = _step(compiled, spec, args, kwargs, opt)
    if accelerator.is_accelerator(device):
        return measure_peak(step, preexisting, device)[0]
    return allocator_peak(step, preexisting)[0] - unmodelled


def _clear_grads(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _step(module: nn.Module, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
          opt: torch.optim.Optimizer | None, scaler: Any = None) -> Callable[[], None]:
    """One step returning nothing, so every tensor it made is released when it returns; with `scaler`
    (a copy of the spec's) as the float16 recipe runs it (`memviz.hardware.amp`)."""
    from memviz.profiling.capture import default_loss

    def step() -> None:
        with accelerator.autocast_as(spec.autocast):
            if spec.mode == "inference":
                with torch.no_grad():
                    module(*args, **kwargs)
                return
            loss = (spec.loss_fn or default_loss)(module(*args, **kwargs))
            amp.backward(loss, scaler)
        amp.update(opt, scaler)

    return step


def _primed_optimizer(spec: StepSpec, params: dict[str, nn.Parameter]) -> torch.optim.Optimizer | None:
    """A fresh optimizer over the parameters the plan updates, its state created by one update with
    zero gradients (the parameters are restored by the caller), gradients None again."""
    if spec.optimizer is None:
        return None
    cls, hyper = spec.optimizer
    chosen = [p for n, p in params.items() if n in spec.updated and p.requires_grad]
    if not chosen:
        return None
    groups = [[params[n] for n in g if n in params and params[n].requires_grad] for g in spec.groups]
    opt = cls([{"params": g} for g in groups if g] if groups else chosen, **hyper)
    for p in chosen:
        p.grad = torch.zeros_like(p)
    opt.step()
    for p in chosen:
        p.grad = None
    return opt


def _history(history: list[tuple[int | None, int, int]]) -> str:
    return "; ".join(f"planned {format_bytes(p)} at {format_bytes(b) if b else 'no budget'}, measured "
                     f"{format_bytes(m)}" for b, p, m in history)


def _report(history: list[tuple[int | None, int, int]], budget: int | None, caller: str) -> str:
    """The warning text: every try's planned and measured peak."""
    _, planned, measured = history[-1]
    head = (f"{caller}: the step measured {format_bytes(measured)}, "
            f"{(measured - planned) / planned:+.1%} off the plan's predicted {format_bytes(planned)}")
    if len(history) > 1:
        first_planned, first_measured = history[0][1], history[0][2]
        head = (f"{caller}: the first plan (predicted {format_bytes(first_planned)}) "
                f"measured {format_bytes(first_measured)}, over the budget {format_bytes(budget)}; "
                f"re-planned {len(history) - 1} time(s), the measured excess as margin "
                f"({_history(history)})")
    if budget is None:
        return head
    return f"{head}; the returned module is within the budget {format_bytes(budget)}"
