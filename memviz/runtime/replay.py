"""What a replay of the captured graph cannot reproduce (issue 17 item 9), said before it runs.

`memviz.export` runs the captured joint graph, not the model's Python code.  What the model's code does
beyond that graph therefore differs in the exported module, and `check_replay` names each case it finds:

* forward and forward pre-hooks (on any submodule, or registered globally): the trace ran them, so the
  tensors they compute are in the graph, but the exported module never calls them: their Python side
  effects (counters, logging, stored activations) do not happen and a hook changed afterwards has no
  effect.  A `ReplayWarning`;
* backward and backward pre-hooks: the joint trace does not record them, so what they do to gradients
  is missing from the exported module's gradients (measured: a hook scaling a gradient changes eager's
  parameter gradients, not the exported ones).  Refused (`UnfaithfulReplay`);
* module-level data a ``forward`` reads (a number, string, container, tensor or array global): the trace
  read its value once, so the exported module keeps computing with that value after the global changes.
  A `ReplayWarning`.

Globals are found statically: the ``LOAD_GLOBAL`` instructions of each submodule class's own ``forward``
(nested code objects included) whose value is data rather than a module, class or function.  Not seen:
globals read by helper functions ``forward`` calls, instance or class attributes, closure cells.

`memviz.apply` checkpoints the user's own modules, so hooks run and globals are read on every call: it
is the faithful route for such models.
"""

from __future__ import annotations

import dis
import inspect
import numbers
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules import module as module_mod

#: hook dicts every nn.Module carries -> (what the messages call them, whether it is a backward hook)
MODULE_HOOKS = {
    "_forward_pre_hooks": ("forward pre-hook", False),
    "_forward_hooks": ("forward hook", False),
    "_backward_pre_hooks": ("backward pre-hook", True),
    "_backward_hooks": ("backward hook", True),
}
#: torch.nn.modules.module's hooks for every module (`register_module_forward_hook` ...)
GLOBAL_HOOKS = {
    "_global_forward_pre_hooks": ("global forward pre-hook", False),
    "_global_forward_hooks": ("global forward hook", False),
    "_global_backward_pre_hooks": ("global backward pre-hook", True),
    "_global_backward_hooks": ("global backward hook", True),
}
#: values a trace takes as constants: data, not code (modules, classes and functions are code)
DATA_TYPES = (numbers.Number, str, bytes, bytearray, list, tuple, dict, set, frozenset, torch.Tensor,
              np.ndarray)


class UnfaithfulReplay(ValueError):
    """The exported module would compute something else than the model: backward hooks change gradients
    the replayed graph does not run them on; the message names each one."""


class ReplayWarning(UserWarning):
    """The exported module replays the captured graph, which cannot reproduce something the model's own
    code does (a hook's side effects, a global's later value); the message names each one."""


def _qualname(fn: Any) -> str:
    """`module.qualname` of a hook (a partial names its function)."""
    fn = getattr(fn, "func", fn)
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    owner = getattr(fn, "__module__", None)
    return f"{owner}.{name}" if owner else name


def hooks(model: nn.Module, *, backward: bool) -> list[str]:
    """The forward (or backward) hooks that would run in a step of `model`: "forward hook pkg.fn on
    encoder.0", global ones first, then in module order."""
    found = [f"{kind} {_qualname(h)}" for attr, (kind, bwd) in GLOBAL_HOOKS.items() if bwd == backward
             for h in getattr(module_mod, attr, {}).values()]
    for path, mod in model.named_modules(remove_duplicate=False):
        where = path or f"the model ({type(mod).__name__})"
        found += [f"{kind} {_qualname(h)} on {where}" for attr, (kind, bwd) in MODULE_HOOKS.items()
                  if bwd == backward for h in getattr(mod, attr, {}).values()]
    return found


def _global_loads(code: types.CodeType) -> Iterator[str]:
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            yield ins.argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # comprehensions, lambdas, nested functions
            yield from _global_loads(const)


def _forward_function(cls: type) -> Callable[..., Any] | None:
    fn = getattr(cls, "forward", None)
    fn = inspect.unwrap(fn) if fn is not None else None
    return fn if isinstance(fn, types.FunctionType) else None


_MISSING = object()


def data_globals(model: nn.Module) -> list[str]:
    """Module-level data each submodule class's own ``forward`` reads: "SCALE (float, read by Net.forward
    in pkg.models)", once per class and name."""
    found: list[str] = []
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        fn = _forward_function(cls)
        if fn is None:
            continue
        for name in dict.fromkeys(_global_loads(fn.__code__)):
            value = fn.__globals__.get(name, _MISSING)
            if value is not _MISSING and isinstance(value, DATA_TYPES):
                found.append(f"{name} ({type(value).__name__}, read by {fn.__qualname__} in {fn.__module__})")
    return found


APPLY = ("memviz.apply(plan, model) checkpoints your own modules instead, so hooks run and globals are "
         "read on every call")


def replay_warning(model: nn.Module) -> str | None:
    """The `ReplayWarning` message for a replay of `model`'s captured graph, or None when nothing is lost."""
    hooked, state = hooks(model, backward=False), data_globals(model)
    if not hooked and not state:
        return None
    parts = []
    if hooked:
        parts.append("the exported module does not call the model's forward hooks (the tensors they "
                     "computed at capture are traced into its graph, but their Python side effects do not "
                     "happen and later changes to them have no effect): " + "; ".join(hooked))
    if state:
        parts.append("the capture took the value these module-level globals had when it traced forward as "
                     "a constant, so the exported module ignores later changes to them: " + "; ".join(state))
    return ". ".join([*parts, APPLY])


def check_replay(model: nn.Module, *, training: bool, stacklevel: int = 3) -> None:
    """Refuse a training replay of `model` that would compute other gradients; warn about what else it
    loses (an inference replay runs no backward: its backward hooks never run in eager either)."""
    backward = hooks(model, backward=True) if training else []
    if backward:
        raise UnfaithfulReplay("the exported module cannot run the model's backward hooks (the captured "
                               "graph does not record them), so its gradients would miss what they change: "
                               + "; ".join(backward) + ". Remove them (handle.remove()) to export; or "
                               + APPLY)
    message = replay_warning(model)
    if message is not None:
        warnings.warn(ReplayWarning(message), stacklevel=stacklevel)
