"""`memviz.apply(plan, model)`: a plan run by PyTorch's own activation checkpointing on the user's model.

Each planned region (a module call, `memviz.plans.sac`) gets a forward that runs
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` with a selective policy
(``create_selective_checkpoint_contexts``): the ops the plan keeps are MUST_SAVE, every other op
PREFER_RECOMPUTE; a region whose plan keeps no op runs plain checkpointing (no policy, same memory,
faster).  Ops are matched by (op name, occurrence among the region's ops of that name), the
order the region's forward runs them.  Only the forward is replaced (an instance attribute), so the
module tree, parameters and ``state_dict`` keys are the user's; torch.compile, DDP and FSDP2 see
ordinary checkpointed modules.  Checkpointing restores the RNG state for the recomputation (dropout
masks replay); the region's buffers are restored after it, so BatchNorm statistics move once per step.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
import types
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from memviz.plans.planning import Plan, PlanningError
from memviz.plans.sac import EXPRESSIBLE, to_sac
from memviz.plans.sac import policy as save_policy
from memviz.profiling.own_checkpointing import MEMVIZ_REGION, Switch, switches, turn_off

_SPEC = MEMVIZ_REGION
#: the keyword arguments transformers' layers (and older ones) take their KV cache by: a checkpointed layer
#: that writes the cache would write it a second time when the backward recomputes it
CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


class ApplyWarning(UserWarning):
    """The applied model may not run the plan exactly (the message says why)."""


def apply(plan: Plan, model: nn.Module, *, inplace: bool = False, verify: bool = False, inputs: Any = None,
          loss_fn: Any = None, optimizer: Any = None, scaler: Any = None) -> nn.Module:
    """`model` (a deep copy, or the model itself with ``inplace=True``) with the plan's regions wrapped in
    non-reentrant checkpointing and the plan's per-op save policy.  A "sac" plan applies as it is; a plan
    of another strategy is converted (`memviz.plans.sac.to_sac`, which warns when the checkpointed run no
    longer fits the budget) when it still holds its profile, and refused otherwise.  The model's own
    activation checkpointing (transformers', timm's and DenseNet's switches: `own_checkpointing.turn_off`)
    is turned off in the model returned, with an `ApplyWarning`: the plan was made without it; and off it
    stays: switched on again later (HF Trainer's ``activation_checkpointing=True`` /
    ``gradient_checkpointing=True`` calls ``activation_checkpointing_enable()`` at train start, timm's
    ``set_grad_checkpointing()``), it is turned off before the next step with an `ApplyWarning`
    (`keep_own_checkpointing_off`).

    verify: run one measured step of the applied copy first, as ``memviz.export(verify=True)`` does
    (`memviz.runtime.verify.verified_apply`, with `inputs`, `loss_fn`, `optimizer` and `scaler` as there): the
    model's own kernels run here, not the captured ones, and a step over the budget is re-planned or raises
    `BudgetExceededError` (measured on an H100, Llama's attention ran another kernel under checkpointing
    than its capture and held 24% over the plan).  Not with ``inplace``: a re-plan wraps a fresh copy."""
    if verify:
        if plan.strategy == "sac" and "compiled" in plan.solver_stats.extra.get("sac", {}):
            raise PlanningError("this plan was made with compiled=: its peak is the compiled step's, which "
                                "planning already measured; verify=True measures an eager step, which holds "
                                "more.  Apply it without verify and run it under torch.compile")
        if inplace:
            raise ValueError("apply(verify=True) measures and may re-plan on copies of the model: drop "
                             "inplace=True, or verify first and apply the returned plan in place")
        from memviz.runtime.verify import verified_apply

        return verified_apply(plan, model=model, inputs=inputs, loss_fn=loss_fn, optimizer=optimizer,
                              scaler=scaler)
    if plan.model.get("mode", "train") != "train":
        raise PlanningError("memviz.apply runs training plans (checkpointing changes only what the backward "
                            "keeps); run an inference plan with memviz.export(plan)")
    if plan.strategy not in EXPRESSIBLE:
        plan = to_sac(plan)
    specs = plan.solver_stats.extra.get("sac", {}).get("regions", []) if plan.strategy == "sac" else []
    target = model if inplace else copied(model)
    off = turn_off(target)
    if off:
        warnings.warn(ApplyWarning(
            f"the model checkpointed its own activations ({', '.join(off[:3])}"
            f"{f' and {len(off) - 3} more' if len(off) > 3 else ''}): turned off in the model apply returns: "
            "the plan was made without it, and its regions nested in the model's own would recompute each "
            "layer twice and hold other memory than the plan"), stacklevel=2)
    for spec in specs:
        try:
            module = target.get_submodule(spec["module"])
        except AttributeError:
            raise PlanningError(f"the plan checkpoints module {spec['module']!r}, which this model does not "
                                "have: apply the plan to the model it was profiled from") from None
        wrap(module, spec)
    keep_own_checkpointing_off(target)
    return target


#: the root attribute that says `keep_own_checkpointing_off` hooked the model (one hook, however applied)
_KEEPS_OFF = "_memviz_keeps_own_checkpointing_off"


def keep_own_checkpointing_off(model: nn.Module) -> None:
    """Before each call of `model`, turn the libraries' checkpointing switches off again where something
    turned them on after `apply`: the plan was made and measured without them, and with them on the layers
    it leaves alone are checkpointed too and its regions run inside the library's (a Llama's step under
    ``activation_checkpointing_enable()`` measured 6.0% under the plan alone, 52 module calls instead of
    42).  The applied model keeps the plan rather than refusing: Trainer turns the switch on by itself at
    train start whenever ``TrainingArguments`` ask for checkpointing, which memviz's plan already is.  A
    forward pre-hook on the root, so DDP, FSDP2 and a deep copy keep it (a copy's hook holds the copy's
    modules, `switches`)."""
    where = switches(model)
    if where and _KEEPS_OFF not in model.__dict__:
        model.__dict__[_KEEPS_OFF] = True
        model.register_forward_pre_hook(functools.partial(_turn_off_again, where))


def _turn_off_again(where: tuple[Switch, ...], model: nn.Module, _args: Any) -> None:
    if torch.compiler.is_compiling():  # Dynamo would trace the attribute writes; compiled code guards on them
        return
    on = turn_off(model, where)
    if on:
        warnings.warn(ApplyWarning(
            f"the model's own activation checkpointing was turned on after memviz.apply ({', '.join(on[:3])}"
            f"{f' and {len(on) - 3} more' if len(on) > 3 else ''}: transformers' "
            "activation_checkpointing_enable / gradient_checkpointing_enable, which HF Trainer calls when "
            "its arguments ask for checkpointing, or timm's set_grad_checkpointing): turned off again before "
            "this step, so the plan's regions run alone as planned (inside the library's, the plan's memory "
            "and time would not hold).  To train with the library's checkpointing instead, do not apply the "
            "plan"), stacklevel=2)


def copied(model: nn.Module) -> nn.Module:
    """A deep copy of `model`; a model that keeps tensors a forward computed as attributes (a recurrent
    state: HF RecurrentGemma keeps each recurrent layer's ``rg_lru.recurrent_states`` after a training
    forward, and its ``conv1d_state`` with ``use_cache=True``) cannot be copied (torch deep-copies only graph
    leaves): a `PlanningError` naming them and what to do, not torch's error."""
    try:
        return copy.deepcopy(model)
    except RuntimeError as exc:
        held = [f"{path + '.' if path else ''}{name}" for path, module in model.named_modules()
                for name, value in vars(module).items()
                if isinstance(value, torch.Tensor) and not value.is_leaf]
        if not held:
            raise
        raise PlanningError(
            f"memviz.apply checkpoints a copy of the model, and the model keeps tensors its forward computed "
            f"(with their autograd history) as attributes, which torch cannot copy: {', '.join(held[:4])}"
            f"{f' and {len(held) - 4} more' if len(held) > 4 else ''}.  Set them to None before apply "
            "(what the last forward left; a Hugging Face model's cache: also use_cache=False in training), "
            "or apply with inplace=True"
        ) from exc


def applies_as_is(plan: Plan) -> bool:
    """Whether `plan` runs as PyTorch checkpointing exactly as planned (its strategy is one `apply` takes
    without converting it), so that the CLI and the Planner export it with `apply` by default."""
    return plan.strategy in EXPRESSIBLE and plan.model.get("mode", "train") == "train"


def write_applied(plan: Plan, path: str | Path, *, factory: str | None = None,
                  overwrite: bool = False) -> tuple[Path, Path]:
    """The "apply" export: the plan JSON (``<path>.plan.json``) and, at `path`, a short Python file whose
    ``applied(model)`` loads that JSON and runs `apply` on the user's model; with `factory`
    (``MODULE.py:FUNCTION``, the CLI's) also ``load()``, the factory's model applied and its inputs.
    Names reach the source only as checked string literals; never clobbers unless asked; nothing is
    left half-written."""
    from memviz.plans.planfile import document_text, write_text_safely

    if plan.strategy not in EXPRESSIBLE:
        raise PlanningError(f"a {plan.strategy!r} plan does not apply as it is: convert it first "
                            "(memviz.plans.sac.to_sac) or plan with strategy='sac'")
    path = Path(path)
    plan_path = path.with_suffix(".plan.json")
    for p in (path, plan_path):
        if os.path.lexists(p) and not overwrite:
            raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
    source = applied_source(plan_path.name, factory)
    compile(source, str(path), "exec")  # never write code that does not parse
    doc_text = document_text(plan.to_dict(), "plan to save")
    created = not os.path.lexists(path)
    write_text_safely(path, source, overwrite=overwrite)
    try:
        write_text_safely(plan_path, doc_text, overwrite=overwrite)
    except BaseException:
        if created:  # the source alone would load another plan's JSON later
            path.unlink(missing_ok=True)
        raise
    return path, plan_path


def applied_source(plan_name: str, factory: str | None) -> str:
    """The "apply" export's Python source (`write_applied`); `plan_name` and `factory` as literals."""
    from memviz.runtime.export import _str

    lines = [
        '"""Generated by memviz: a plan that runs as PyTorch\'s own selective activation checkpointing.',
        "",
        "    model = applied(model)  # a checkpointed copy: module tree, parameters, state_dict keys kept",
        "",
        "It composes with torch.compile, DDP, FSDP2 (fully_shard after applied) and Hugging Face training.",
        '"""',
        "",
        "from pathlib import Path",
        "",
        "import memviz  # its public names only: the file outlives memviz's internal layout",
        "",
        f"PLAN = Path(__file__).with_name({_str(plan_name)})",
        "",
        "",
        "def applied(model, *, inplace=False):",
        '    """`model` (a deep copy, or itself with inplace=True) checkpointed as the plan says."""',
        "    return memviz.apply(memviz.load_plan(PLAN), model, inplace=inplace)",
    ]
    if factory is not None:
        lines += [
            "",
            "",
            f"FACTORY = {_str(factory)}",
            "",
            "",
            "def load():",
            '    """The factory\'s (model, args, kwargs), the model checkpointed as the plan says."""',
            "    from memviz.cli import load_factory",
            "",
            "    made = load_factory(FACTORY)()",
            "    model, args, kwargs = (*made, None) if len(made) == 2 else made",
            "    return applied(model), tuple(args), dict(kwargs or {})",
        ]
    return "\n".join(lines) + "\n"


def wrap(module: nn.Module, spec: dict[str, Any]) -> None:
    """Give `module` a checkpointed forward running `spec` (a `memviz.plans.sac.region_specs` entry)."""
    if _SPEC in module.__dict__:
        raise PlanningError(f"module {spec['module']!r} is already checkpointed by memviz.apply")
    save: dict[str, set[int]] = {}
    for n, k in spec["save"]:
        save.setdefault(n, set()).add(int(k))
    module.__dict__[_SPEC] = {"save": {n: frozenset(ks) for n, ks in save.items()},
                              "counts": dict(spec["counts"]),
                              # a function: deep copies of the model (sharding one) keep calling it
                              **({"on_counts": spec["on_counts"]} if "on_counts" in spec else {})}
    # a bound method, so a deep copy of the applied model checkpoints its own copy of the module
    module.forward = types.MethodType(_checkpointed_forward, module)


def unwrap(module: nn.Module) -> None:
    """Undo `wrap` on every checkpointed submodule of `module`."""
    for m in module.modules():
        unwrap_module(m)


def unwrap_module(module: nn.Module) -> None:
    """Undo `wrap` on `module` alone (its submodules stay as they are)."""
    if module.__dict__.pop(_SPEC, None) is not None:
        module.__dict__.pop("forward", None)


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward = type(self).forward.__get__(self)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)  # nothing is saved for a backward: nothing to checkpoint
    spec = self.__dict__[_SPEC]
    compiling = torch.compiler.is_compiling()
    # compiled too: Dynamo may trace this wrapper and still run the checkpoint eagerly (a graph break in the
    # region), whose recomputation then calls the block again and writes the cache a second time (an H200,
    # torch 2.11: HF GPT-2's applied blocks failed their backward, `benchmarks/bench_cuda_compile.py`)
    args, kwargs = _without_cache(self, spec, args, kwargs, warn=not compiling)
    # the call's containers as they are now: checkpoint keeps the arguments by reference for the
    # recomputation, and a caller may grow a list it passed after the call (torchvision's DenseNet block
    # appends each layer's output to the list its layers read: the recomputed layer read 32 channels more)
    args, kwargs = _as_now((args, kwargs))
    if not spec["save"]:
        # the plan keeps nothing here: plain checkpointing saves the same (only the region's inputs) without
        # a policy call and a dispatch-mode hop per op, which made it 1.14-1.24x slower per step
        if compiling:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        plain = functools.partial(_plain_contexts, self)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=plain, **kwargs)
    if compiling:
        # torch.compile calls context_fn each time it traces the region (dynamo's speculation, then
        # AOTAutograd's trace of the joint graph): each trace counts the region's ops from zero, or the
        # occurrences run past the plan's and every kept op is recomputed
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=functools.partial(_counting_contexts, spec["save"]), **kwargs)
    seen: dict[str, int] = {}
    policy = functools.partial(save_policy, spec["save"], seen)
    context_fn = functools.partial(_contexts, policy, self)
    out = checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    # the per-rank planner counting the region's ops (memviz.parallel.distributed_sac)
    if "on_counts" in spec:
        spec["on_counts"](seen)
    elif seen != spec["counts"] and not spec.get("warned"):
        spec["warned"] = True
        warnings.warn(ApplyWarning(
            f"{type(self).__name__} ran its countable ops as {seen}, the plan's capture as {spec['counts']}: "
            "the save decisions are matched by op and occurrence, so some may land on other ops (memory may "
            "differ from the plan; results do not)"), stacklevel=2)
    return out


def _as_now(value: Any) -> Any:
    """`value` with its plain lists, tuples and dicts copied (their items as they are now), recursively;
    anything else (a library's cache or output object) as it is."""
    if type(value) in (list, tuple):
        return type(value)(_as_now(v) for v in value)
    if type(value) is dict:
        return {k: _as_now(v) for k, v in value.items()}
    return value


def _without_cache(module: nn.Module, spec: dict[str, Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any], warn: bool = True) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with caching turned off, as transformers' own gradient checkpointing does
    (``GradientCheckpointingLayer``, and GPT-2's model passing its layers no cache): ``use_cache=False``,
    and no cache unless the layer only reads it (``_can_checkpoint_with_cache``), whether passed by
    keyword or by position.  The training loss does not read the cache.  `warn`: say so once (not while
    Dynamo traces: a warning there breaks the graph)."""
    try:
        signature = _signature(type(module))
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return args, kwargs  # a signature inspect cannot read, or a call it would refuse: as it is
    var_kw = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    places = [bound.arguments, *([bound.arguments[var_kw]] if var_kw in bound.arguments else [])]
    names = ("use_cache", *(() if getattr(module, "_can_checkpoint_with_cache", False) else CACHE_KWARGS))
    dropped = [k for where in places for k in names if where.get(k) is not None and where.get(k) is not False]
    if not dropped:
        return args, kwargs
    for where in places:
        for k in names:
            if k in where:
                where[k] = False if k == "use_cache" else None
    if warn and not spec.get("warned_cache"):
        spec["warned_cache"] = True
        warnings.warn(ApplyWarning(
            f"{type(module).__name__} is checkpointed, so it runs without caching ({', '.join(dropped)} "
            "turned off, as transformers' gradient checkpointing does): its recomputation would write the "
            "cache again.  The step holds less than the plan, which counted the cache; set "
            "model.config.use_cache = False before profiling for a plan of this run"), stacklevel=4)
    return bound.args, bound.kwargs


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    """The signature of ``cls.forward`` without ``self`` (wrappers followed to the function they wrap)."""
    signature = inspect.signature(cls.forward)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _contexts(policy: Any, module: nn.Module | None) -> tuple[Any, Any]:
    fwd, rec = create_selective_checkpoint_contexts(policy)
    if module is None:  # under torch.compile the recomputation is the compiled backward's (no buffer writes)
        return fwd, rec
    writes = _WrittenBuffers(fwd, module)
    return writes, _RestoringBuffers(rec, module, writes)


def _counting_contexts(save: dict[str, frozenset[int]]) -> tuple[Any, Any]:
    """The selective contexts of one compiled trace of a region: its own op counts, from zero."""
    return _contexts(functools.partial(save_policy, save, {}), None)


def _plain_contexts(module: nn.Module) -> tuple[Any, Any]:
    """Plain checkpointing's contexts (none) with the region's buffers put back after the recomputation."""
    writes = _WrittenBuffers(contextlib.nullcontext(), module)
    return writes, _RestoringBuffers(contextlib.nullcontext(), module, writes)


#: how many memviz-checkpointed recomputations are running now (nested regions): the per-rank planner's
#: recorder names the operators they run (`recomputing`)
_RECOMPUTING = [0]


def recomputing() -> bool:
    """Whether the operators running now are a checkpointed region's recomputation (in the backward)."""
    return _RECOMPUTING[0] > 0


class _WrittenBuffers:
    """The forward's context plus which of the region's buffers its forward writes (their version
    counters move, or the module holds another tensor there): the only ones its recomputation must put
    back (`_RestoringBuffers`)."""

    def __init__(self, inner: Any, module: nn.Module) -> None:
        self.inner = inner
        self.module = module
        self.before: dict[int, int] = {}
        self.written: set[int] = set()

    def __enter__(self) -> Any:
        self.before = {id(b): b._version for b in self.module.buffers()}
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            self.written = {id(b) for b in self.module.buffers() if self.before.get(id(b)) != b._version}


class _RestoringBuffers:
    """The recomputation's context plus the region's buffers left as the forward left them: recomputing
    BatchNorm in training mode would move its running statistics a second time.  A BatchNorm recomputes
    with momentum 0 (its running statistics then stay as they are, bit for bit: ``0 * batch + 1 *
    running``) and its batch count is put back, so nothing is copied: a copy of its statistics was
    memory the plan does not hold (timm's ConvMixer measured 8 B over a sac plan at its minimum, so
    `apply(verify=True)` refused it).  Other buffers the forward wrote (`writes`) are copied and put back;
    one it only reads is left alone (HF Swin's relative position indices, copied before: 4 KiB a
    recomputation that no plan holds)."""

    def __init__(self, inner: Any, module: nn.Module, writes: _WrittenBuffers) -> None:
        self.inner = inner
        self.module = module
        self.writes = writes
        self.norms: list[tuple[nn.modules.batchnorm._BatchNorm, float | None, int | None]] = []
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> Any:
        norms = [m for m in self.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        held = {id(b) for m in norms for b in (m.running_mean, m.running_var, m.num_batches_tracked)
                if b is not None}
        self.norms = [(m, m.momentum, None if m.num_batches_tracked is None else int(m.num_batches_tracked))
                      for m in norms]
        for m in norms:
            m.momentum = 0.0
        with torch.no_grad():
            self.saved = [(b, b.clone()) for b in self.module.buffers()
                          if id(b) not in held and id(b) in self.writes.written]
        _RECOMPUTING[0] += 1
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            _RECOMPUTING[0] -= 1
            with torch.no_grad():
                for m, momentum, count in self.norms:
                    m.momentum = momentum
                    if count is not None:
                        m.num_batches_tracked.fill_(count)
                for b, v in self.saved:
                    b.copy_(v)
            self.norms, self.saved = [], []
