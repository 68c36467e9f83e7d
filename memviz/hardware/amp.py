"""Float16 training's loss scaling (``torch.amp.GradScaler``) in memviz's own runs of a step.

The recipe (PyTorch's "Automatic Mixed Precision" recipe, ``torch.amp``)::

    with torch.autocast(device, dtype=torch.float16):
        loss = loss_fn(model(x))
    scaler.scale(loss).backward()   # the loss times the scale: every gradient scaled
    scaler.step(opt)                # unscaled in place (inf / NaN checked), the update skipped on inf
    scaler.update()                 # the scale halved after a skip, grown after enough good steps

What it costs in memory is a handful of scalars: the scale and its growth tracker (kept across steps), the
scaled loss (to the backward's end), the inverse scale and found-inf flag (to ``update``); the gradients
are unscaled in place, and a skipped update holds less than a taken one (no optimizer temporaries).  memviz
captures the unscaled loss (``loss_fn``; scaling multiplies the backward's seed and nothing else) and is told
of the scaler apart (``memviz.profile(..., scaler=)``): a loss function that scales would be run on fake
tensors, and ``GradScaler.scale`` would keep a fake scale in the user's scaler.
"""

from __future__ import annotations

import copy
import functools
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch

#: scalars the recipe holds besides the step: scale, growth tracker, scaled loss, inverse scale, found inf
SCALER_SCALARS = 5


def closure_values(fn: Any, depth: int = 4) -> Iterator[Any]:
    """The values a function holds: closure cells, defaults, a ``functools.partial``'s arguments, a bound
    method's object's attributes, through nested functions `depth` deep (what is neither a function nor
    callable is yielded, tensors and modules included)."""
    if depth < 0:
        return
    for v in _held(fn):
        if callable(v) and not isinstance(v, (torch.Tensor, torch.nn.Module)):
            yield from closure_values(v, depth - 1)
        else:
            yield v


def _held(fn: Any) -> list[Any]:
    """What `fn` holds itself: a ``functools.partial``'s function and arguments; a bound method's function,
    its object and that object's attributes (``scaler.scale`` is bound to the scaler itself); a function's
    closure cells and defaults; a callable object's ``__call__`` and attributes (a loss class holding its
    labels, or a scaler)."""
    if isinstance(fn, functools.partial):
        return [fn.func, *fn.args, *fn.keywords.values()]
    if inspect.ismethod(fn):
        return [fn.__func__, fn.__self__, *getattr(fn.__self__, "__dict__", {}).values()]
    if inspect.isfunction(fn):
        return [v for v in cell_values(fn) if v is not fn] + [
            *(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    if callable(fn) and not isinstance(fn, (type, torch.nn.Module)) and hasattr(fn, "__dict__"):
        return [type(fn).__call__, *vars(fn).values()]
    return []


def cell_values(fn: Any) -> list[Any]:
    """The values of a function's closure cells that hold one (a cell of a variable the enclosing function
    assigns later is empty, and reading it raises)."""
    values = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:
            continue
    return values


def refuse_scaling_loss(loss_fn: Any) -> None:
    """A `loss_fn` that holds a ``GradScaler`` (``lambda out: scaler.scale(ce(out))``) is refused with what
    to pass instead: memviz runs the loss on fake tensors, where ``scale`` would set the user's scaler's
    scale to a fake tensor (module docstring)."""
    if _holds_scaler(loss_fn):
        raise ValueError("loss_fn holds a torch.amp.GradScaler: pass the unscaled loss as loss_fn and the "
                         "scaler as scaler= (memviz runs loss_fn on stand-in tensors, where scaler.scale "
                         "would replace your scaler's scale; scaling changes the backward's seed, not its "
                         "memory)")


def _holds_scaler(fn: Any, depth: int = 4) -> bool:
    """Whether `fn` reaches a ``GradScaler``: in what it holds (`_held`: ``scaler.scale`` bound, in a
    ``functools.partial``, a closure or a callable object) or in the module globals its code names (a
    script's ``lambda out: scaler.scale(ce(out))``, ``scale = scaler.scale`` beside it, or an object whose
    attribute is the scaler: ``state.scaler``), through the functions either holds, `depth` deep."""
    if depth < 0:
        return False
    code = getattr(fn, "__code__", None)
    named = [fn.__globals__[n] for n in _names(code) if n in fn.__globals__] if code is not None else []
    for v in [*_held(fn), *named]:
        if isinstance(v, torch.amp.GradScaler):
            return True
        if isinstance(v, (torch.Tensor, torch.nn.Module, type, types.ModuleType)):
            continue
        if callable(v):
            if _holds_scaler(v, depth - 1):
                return True
        elif any(isinstance(a, torch.amp.GradScaler) for a in getattr(v, "__dict__", {}).values()):
            return True
    return False


def _names(code: Any) -> set[str]:
    """The global names a code object and the code objects nested in it read."""
    found = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            found |= _names(const)
    return found


def check_scaler(scaler: Any, mode: str) -> None:
    """`scaler` is a ``torch.amp.GradScaler`` of a training profile, else a ValueError saying so."""
    if scaler is None:
        return
    if not isinstance(scaler, torch.amp.GradScaler):
        raise ValueError(f"scaler= takes a torch.amp.GradScaler, not {type(scaler).__name__}")
    if mode != "train":
        raise ValueError("a GradScaler scales a training step's loss: scaler= needs mode='train'")


def scaler_bytes(scaler: Any, device: torch.device) -> int:
    """Bytes the recipe holds besides the step (`SCALER_SCALARS` float32 / int32 scalars), as `device`
    allocates them: 4 each where storages are counted by size (the CPU), the caching allocator's
    512-byte block each on an accelerator.  0 without an enabled scaler."""
    if scaler is None or not scaler.is_enabled():
        return 0
    per_scalar = 4 if torch.device(device).type == "cpu" else 512
    return SCALER_SCALARS * per_scalar


def scaler_record(scaler: Any) -> str | None:
    """What a plan file keeps of the step's ``GradScaler`` (``graph.meta.scaler``): that there was an enabled
    one, as its device type; None without.  A loaded plan's verifying step has no profile to take the scaler
    from, and run without it the step holds less than planned and is not the recipe the user trains with
    (`refuse_unscaled`)."""
    if scaler is None or not scaler.is_enabled():
        return None
    return str(getattr(scaler, "_device", "cpu"))


def refuse_unscaled(meta: dict[str, Any], scaler: Any) -> None:
    """A ValueError saying what to pass when a plan whose step used a GradScaler (`scaler_record` in its
    graph's `meta`) would be verified without one."""
    device = meta.get("scaler")
    if device and scaler is None:
        raise ValueError(
            "this plan's step scaled its loss with a torch.amp.GradScaler (float16 training; the plan file "
            "records it): pass scaler= to verify it, your scaler or a fresh torch.amp.GradScaler("
            f"{device!r}) with its settings (verify runs the recipe on a copy and "
            "leaves yours as it is); without it the verifying step holds less than the plan and is not the "
            "step you train")


def fresh_copy(scaler: Any) -> Any:
    """A copy of `scaler` to run memviz's steps with: the user's scale, growth tracker and per-optimizer
    records are left as they are (``update`` and a skipped step move them)."""
    return None if scaler is None else copy.deepcopy(scaler)


def backward(loss: torch.Tensor, scaler: Any) -> None:
    """``loss.backward()``, the loss scaled by `scaler` first when there is one."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def update(opt: torch.optim.Optimizer | None, scaler: Any) -> None:
    """The optimizer's step: through `scaler` (unscale, skipped on inf, then the scale's update) when there
    is one."""
    if opt is None:
        return
    if scaler is None:
        opt.step()
        return
    scaler.step(opt)
    scaler.update()
