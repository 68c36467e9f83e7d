"""Whether a rewritten module computes what the user's model computes: one step of each, compared.

`memviz.export(plan, verify=True)` and `memviz.apply(plan, model, verify=True)` measure a step's memory
(`memviz.runtime.verify`); a module within its budget that computes something else is worse than none, and
memory says nothing about it (Hugging Face BigBird's export drew its dropout masks from another offset of
the generator than eager: logits 0.31 off, verified within budget).  So the verifying step is also run
on the user's model, from the same generator state, and the two compared:

* training: the loss and every parameter's gradient (a gradient present on one side only is a
  difference); inference: every output tensor;
* tolerance `TOLERANCE`, relative to the largest magnitude on eager's side (fp32 sums in another order:
  recomputation, gradients summed in place), as the test suites compare;
* the user's model runs first, under `fork_rng`, and so does the module, so both draw the same random
  numbers (from the host's generators too: HF wav2vec2 / HuBERT / WavLM draw SpecAugment's masks with
  NumPy); parameters' ``.grad``, buffers (BatchNorm statistics) and the generators are left as they were.

The user's step needs eager's memory, which on an accelerator may not be there (the reason to plan):
where the device cannot hold eager's predicted peak besides what is allocated, nothing is compared and
the result says why.  On the CPU it always runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memviz.hardware import accelerator, amp
from memviz.profiling.tracker import grad_alias

#: largest difference, relative to the largest magnitude on eager's side, that still counts as equal
TOLERANCE = 1e-4

#: micro-batches an accumulating step (`memviz.profile(grads="accumulate")`) runs into the same ``.grad``
#: when compared: the second adds into gradients the first left, each drawing its own dropout masks
MICRO_BATCHES = 2


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The outcome: `equal` None when not compared (`reason` says why), else whether the module's step
    matched eager's; `worst` the largest relative difference and `where` what it was in."""

    equal: bool | None
    worst: float = 0.0
    where: str = ""
    reason: str = ""

    def describe(self) -> str:
        if self.equal is None:
            return f"not compared with the model's own step: {self.reason}"
        verdict = "equal to" if self.equal else "DIFFERENT from"
        return (f"{verdict} the model's own step (largest difference {self.worst:.1e} of the largest "
                f"value, in {self.where or 'nothing'}; tolerance {TOLERANCE:.0e})")


def compare_to_eager(module: nn.Module, original: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     loss_fn: Any, mode: str, eager_peak: int,
                     autocast: tuple[tuple[str, torch.dtype], ...] | None = None,
                     accumulated: frozenset[str] = frozenset(), scaler: Any = None) -> Comparison:
    """One step of `original` and one of `module` on the same inputs and generator state (module
    docstring), each in its own `autocast` regions (`accelerator.autocast_as`), its loss scaled by a copy
    of `scaler` when there is one (the float16 recipe: the gradients compared are the scaled ones its
    backward leaves).  `eager_peak`: the bytes eager's step is predicted to hold, checked against what an
    accelerator has free before it runs.  `accumulated`: parameters whose ``.grad`` the step adds into;
    each side then starts them at zero and runs `MICRO_BATCHES` micro-batches (the loss compared is their
    sum)."""
    tensors = [*original.parameters(), *original.buffers(), *pytree.tree_leaves((args, kwargs))]
    devices = accelerator.devices_of(tensors)
    if devices:
        # the device's free memory and all the allocator holds: eager's peak counts what is allocated now
        free = accelerator.memory_info(devices[0])[0] + torch.accelerator.memory_reserved(
            accelerator.index(devices[0]))
        if eager_peak > free:
            return Comparison(None, reason=f"its predicted peak ({eager_peak} bytes) does not fit in what "
                                           f"{devices[0]} has ({free} bytes)")
    with accelerator.autocast_as(autocast):
        eager = _one_step(original, args, kwargs, loss_fn, mode, devices, accumulated, amp.fresh_copy(scaler))
    with accelerator.autocast_as(autocast):
        mine = _one_step(module, args, kwargs, loss_fn, mode, devices, accumulated, amp.fresh_copy(scaler))
    return _compared(eager, mine)


def _one_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], loss_fn: Any, mode: str,
              devices: list[torch.device], accumulated: frozenset[str] = frozenset(),
              scaler: Any = None) -> dict[str, torch.Tensor | None]:
    """Name -> value of one step (the loss and each parameter's gradient, or the outputs), on the host;
    the model's gradients, buffers and the generators as they were.  `accumulated`
    (`compare_to_eager`): those gradients start at zero and `MICRO_BATCHES` micro-batches add into them."""
    from memviz.profiling.capture import buffers_kept, default_loss, host_rng_forked

    named = dict(getattr(model, "_orig_mod", model).named_parameters())
    grads = {n: p.grad for n, p in named.items()}
    step_args, step_kwargs = pytree.tree_map(grad_alias, (args, kwargs))
    try:
        with buffers_kept(model), accelerator.fork_rng(devices), host_rng_forked():
            for n, p in named.items():
                p.grad = torch.zeros_like(p) if n in accumulated else None
            if mode == "inference":
                with torch.no_grad():
                    out = model(*step_args, **step_kwargs)
                leaves = pytree.tree_leaves(out)
                return {f"output {i}": t.detach().cpu() for i, t in enumerate(leaves)
                        if isinstance(t, torch.Tensor)}
            total = None
            for _ in range(MICRO_BATCHES if accumulated else 1):
                loss = (loss_fn or default_loss)(model(*step_args, **step_kwargs))
                amp.backward(loss, scaler)
                total = loss.detach() if total is None else total + loss.detach()
            values: dict[str, torch.Tensor | None] = {"loss": total.cpu()}
            values.update({n: None if p.grad is None else p.grad.detach().cpu() for n, p in named.items()})
            return values
    finally:
        for n, p in named.items():
            p.grad = grads[n]


def _compared(eager: dict[str, torch.Tensor | None], mine: dict[str, torch.Tensor | None]) -> Comparison:
    worst, where = 0.0, ""
    for name in sorted(eager.keys() | mine.keys()):
        a, b = eager.get(name), mine.get(name)
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape:
            return Comparison(False, float("inf"), f"{name} (present or shaped on one side only)")
        if not a.is_floating_point():
            diff = float(torch.ne(a, b).any())
        else:
            # values equal on both sides are no difference, infinities too (a float16 step's overflow,
            # which a GradScaler skips): only where they differ is the distance taken, against the
            # largest finite magnitude
            differ = a.ne(b)
            finite = a[a.isfinite()]
            scale = float(finite.abs().max()) if finite.numel() else 0.0
            delta = float((a.double() - b.double())[differ].abs().max()) if bool(differ.any()) else 0.0
            diff = delta / scale if scale > 0 else delta
        if diff != diff:  # NaN on one side only: NaN on both compares as equal
            diff = 0.0 if bool(torch.isnan(a).any()) and bool(torch.isnan(b).any()) else float("inf")
        if diff > worst:
            worst, where = diff, name
    return Comparison(worst <= TOLERANCE, worst, where)
