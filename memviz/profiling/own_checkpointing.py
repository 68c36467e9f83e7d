"""The model's own activation checkpointing, switched off while memviz profiles the model and in the
model `memviz.apply` returns.

A model may call ``torch.utils.checkpoint`` itself: transformers' ``gradient_checkpointing_enable``
(``GradientCheckpointingLayer``), timm's ``set_grad_checkpointing``, torchvision's DenseNet with
``memory_efficient=True``, a user's ``checkpoint(self.block, x)``.  memviz decides what to recompute: its
graph is the model without that checkpointing (the capture traces through the call), so the eager step it
measures, and the checkpointing costs sac plans are calibrated on, must be of that same model.  Measured
on a Llama with transformers' checkpointing on, they were not: the eager step measured 29% under its
prediction, and the plan applied ran its regions inside the model's own, 33% under the plan's peak and
recomputing each layer twice.

`switched_off` runs every such call as a plain call while memviz measures, and says where they were;
`turn_off` clears the libraries' own switches on a model, so `memviz.apply`'s regions are the only ones
(`memviz.runtime.apply` clears them again before each step of the model it returned: a training stack may
turn them on later, as HF Trainer does with ``activation_checkpointing=True``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any
from unittest import mock

from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from memviz.hardware.amp import cell_values

#: the attribute `memviz.apply` marks a checkpointed module with: its regions are never switched off
MEMVIZ_REGION = "_memviz_sac"

#: (attribute, the module a class must come from): the switches libraries check before they checkpoint
LIBRARY_SWITCHES = (
    ("gradient_checkpointing", "transformers"),  # GradientCheckpointingLayer, older encoders' own flag
    ("grad_checkpointing", "timm"),  # set_grad_checkpointing; checkpoint_seq reads it
    ("memory_efficient", "torchvision.models.densenet"),  # _DenseLayer.call_checkpoint_bottleneck
)


@contextlib.contextmanager
def switched_off(model: nn.Module) -> Iterator[list[str]]:
    """Within the block, ``torch.utils.checkpoint`` calls the model makes run their function as a plain
    call, reentrant or not; the yielded list is filled with where they were (module paths, or the
    function's qualified name), once each.  `memviz.apply`'s own regions run as they are."""
    found: list[str] = []
    paths = {id(m): name for name, m in model.named_modules()}
    original = torch_checkpoint._checkpoint_without_reentrant_generator

    def record(fn: Any) -> None:
        where = _where(fn, paths)
        if where is not None and where not in found:
            found.append(where)

    def plain_generator(fn: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
        if _memviz_region(fn):
            yield from original(fn, *args, **kwargs)
            return
        record(fn)
        yield  # `checkpoint` runs the function between its two `next` calls: no hooks, nothing recomputed

    class PlainFunction:
        @staticmethod
        def apply(fn: Any, _preserve_rng_state: bool, *args: Any) -> Any:
            record(fn)
            return fn(*args)

    with mock.patch.object(torch_checkpoint, "_checkpoint_without_reentrant_generator", plain_generator), \
            mock.patch.object(torch_checkpoint, "CheckpointFunction", PlainFunction):
        yield found


#: where a switch is: (module path, the module, or None for the model itself, the attribute)
Switch = tuple[str, nn.Module | None, str]


def switches(model: nn.Module) -> tuple[Switch, ...]:
    """Every switch in `LIBRARY_SWITCHES` that `model`'s modules have, on or off (the libraries set them off
    when they build a module).  The modules themselves, so that clearing them each step costs an attribute
    read each (resolving their paths took 21 us a layer on a Llama); a deep copy of the model maps them to
    its own copies.  The model itself is None: a hook on it holding it would be a reference cycle, which
    keeps a discarded copy's memory until Python's next collection."""
    return tuple((name, module if module is not model else None, attribute)
                 for name, module in model.named_modules()
                 for attribute, library in LIBRARY_SWITCHES
                 if hasattr(module, attribute) and type(module).__module__.startswith(library))


def turn_off(model: nn.Module, where: tuple[Switch, ...] | None = None) -> list[str]:
    """Clear the libraries' checkpointing switches on `model`'s modules (`where`, default `switches`); the
    paths of those that were on.  A model that calls ``torch.utils.checkpoint`` by other means keeps it."""
    off = []
    for name, module, attribute in switches(model) if where is None else where:
        module = model if module is None else module
        if getattr(module, attribute, None) is True:
            setattr(module, attribute, False)
            off.append(name or type(module).__name__)
    return off


def _memviz_region(fn: Any) -> bool:
    return MEMVIZ_REGION in getattr(getattr(fn, "__self__", None), "__dict__", {})


def _where(fn: Any, paths: dict[int, str]) -> str | None:
    """The module a checkpointed function runs (itself, a bound method's object, a partial's function or
    first argument: transformers passes ``partial(forward, layer)``; a closure's variable: timm's
    ``checkpoint_seq`` closes over the blocks) as its path; None for a module outside the model (a copy
    memviz times alone, `memviz.plans.sac.checkpoint_costs`); else the function's name."""
    candidates = [fn]
    while isinstance(candidates[-1], functools.partial):
        candidates += [*candidates[-1].args[:1], candidates[-1].func]
    candidates += [getattr(c, "__self__", None) for c in list(candidates)]
    candidates += [v for c in list(candidates) for v in cell_values(c)]
    for c in candidates:
        if isinstance(c, nn.Module) and id(c) in paths:
            return paths[id(c)] or type(c).__name__
        if isinstance(c, (list, tuple)) and c and all(id(m) in paths for m in c):  # a run of blocks
            return paths[id(c[0])] if len(c) == 1 else f"{paths[id(c[0])]} to {paths[id(c[-1])]}"
    if any(isinstance(c, nn.Module) for c in candidates):
        return None
    return getattr(fn, "__qualname__", type(fn).__name__)

