"""SAC plans for the step torch.compile runs: ``memviz.plan(prof, budget, strategy="sac", compiled=True)``.

Compiled, `memviz.apply`'s selective policy runs once, at trace time: it tags the regions' ops and
AOTAutograd's min-cut partitioner (``min_cut_rematerialization_partition``, at torch's default
``activation_memory_budget`` 1.0) recomputes the tagged ones; everywhere else it still recomputes the
cheap ops it picks itself.  On a Llama that alone took 18.67 MiB to 15.03 MiB, so a plan budgeted in
eager terms overshoots and pays for recomputation the compiler did for free.

This module measures what the compiler frees and what it costs, and prices the menu the way the
compiled step runs:

* peaks: one compiled step per option of `solvers.sac.LADDER` with every block on it, measured by the
  CPU allocator (`memviz.profiling.tracker.allocator_peak`: the tracker cannot see compiled code), turned
  into per-option savings (`solvers.sac.CompiledSavings`) taken off the SAC schedule `solvers.simulate`
  checks, step by step, for the blocks whose values are held for their backward at each step (a mixed
  plan's peak is where some blocks' backward already began), which stays the plan's schedule;
* times: the same compiled steps, timed against the plain model run eagerly in interleaved pairs
  (`TIME_ROUNDS`, the median of the per-pair ratios: a burst of load slows both steps of a pair alike),
  turned into each option's compiled cost per block in eager steps.  The eager in-step rate of the ops
  the schedule recomputes missed what the partitioner does with a region (sac25 on Llama: "matchable"
  predicted 1.07-1.12, measured 1.16-1.26), so the menu took it where one fully recomputed block was no
  slower.  Measured once per profile (cached with the peaks): every budget of a profile is planned on the
  same prices, so its plans are a function of the profile and the budget;
* the chosen plan is compiled and measured once more (its time ratio recorded next to the prediction); a
  step over the budget is re-solved with the excess as margin (as ``memviz.export(verify=True)`` does), so
  a returned plan measured within it.

Compiling resets dynamo's caches (``torch._dynamo.reset``): a model the user compiled before recompiles
on its next call.  Measured on the CPU only.
"""

from __future__ import annotations

import copy
import functools
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from solvers import Graph
from solvers.sac import LADDER, Block, CompiledSavings, EagerHolds, Overheads, Region, choose, held_blocks

#: the backend `compiled=True` plans for: the partitioner torch.compile uses, with no kernel compiler,
#: so it runs on any machine
DEFAULT_BACKEND = "aot_eager"
#: backends `compiled=` refuses, and why (measured on this project's CPU runs, sac27)
REFUSED = {
    "inductor": "a plan's own compiled check does not bound what the user's Inductor step holds (a "
                "3-block residual MLP: its check measured within a 334344-byte budget, the applied model "
                "compiled again with torch.compile(backend='inductor') held 397704 bytes, 19% over, and "
                "413448 in a rerun with AOTAutograd's cache off); its "
                "per-option peaks do not order as the ladder does (a tiny Llama: 'matmuls' held more than "
                "no checkpointing), and calibrating compiles C++ five times (617 s for that Llama on a "
                "loaded CPU).  Plan with compiled=True (aot_eager: the same partitioner, no kernel "
                "compiler) and measure the Inductor step, or use memviz.export(plan, verify=True, "
                "backend='inductor'), which measures the step it returns",
}
#: re-solves after a compiled step measured over the budget; each costs a solve and a compile
MAX_TRIES = 3
#: interleaved (compiled step, eager step) pairs timed per calibration step: a Llama step of bench_apply's
#: is 40-50 ms of CPU, so about 1 s per option against the 15-20 s its compile takes
TIME_ROUNDS = 9
#: (id(profile), backend) -> (a weak reference to the profile, its savings and measurements): the savings
#: cost one compile per option, every budget of a profile shares them; the profile (and its model) is not
#: kept alive by the cache
_CALIBRATED: dict[tuple[int, str], tuple[weakref.ref, CompiledSavings, dict[str, Any]]] = {}


def backend_of(compiled: bool | str) -> str | None:
    """The torch.compile backend `compiled` names (True: `DEFAULT_BACKEND`), None when not compiled."""
    if compiled is True:
        return DEFAULT_BACKEND
    if compiled is False or compiled is None:
        return None
    if not isinstance(compiled, str) or not compiled:
        raise ValueError(f"compiled= takes True, False or a torch.compile backend name, not {compiled!r}")
    if compiled in REFUSED:
        from memviz.plans.planning import PlanningError

        raise PlanningError(f"compiled={compiled!r} is refused: {REFUSED[compiled]}")
    return compiled


def compiled_peak(prof: Any, graph: Graph, regions: Sequence[Region], backend: str) -> int:
    """`compiled_step`'s allocator peak, untimed."""
    return compiled_step(prof, graph, regions, backend, rounds=0)[0]


def compiled_step(prof: Any, graph: Graph, regions: Sequence[Region], backend: str,
                  rounds: int = TIME_ROUNDS) -> tuple[int, float | None]:
    """(peak, time ratio) of one compiled training step of a copy of the profiled model with `regions`
    applied (`memviz.apply`'s wrapping), on the profiled call's shapes (zeros), under
    ``torch.compile(backend=backend)`` at torch's default ``activation_memory_budget``.  The peak: the
    CPU allocator's, parameters and inputs counted from the start, as the plan's peak counts them.  The
    ratio: the median over `rounds` interleaved pairs of the compiled step's time over the plain model's
    eager step (`accelerator.alternating_pairs` of `accelerator.timed`: the order swapped every pair,
    garbage collection paused, as the profile's own step ratios); None with no rounds.  The first
    step compiles; the second is measured.  The user's model and RNG streams are left as they were."""
    import statistics

    import torch

    from memviz.hardware import accelerator
    from memviz.plans.sac import region_specs
    from memviz.profiling.capture import default_loss
    from memviz.profiling.tracker import allocator_peak, tensors_of
    from memviz.runtime.apply import ApplyWarning, wrap
    from memviz.runtime.export import _example_inputs

    model = copy.deepcopy(prof.model)
    for spec in region_specs(graph, regions):
        wrap(model.get_submodule(spec["module"]), spec)
    reference = copy.deepcopy(prof.model) if rounds > 0 else None
    args, kwargs = _example_inputs(graph, prof)
    loss_fn = prof.loss_fn if prof.loss_fn is not None else default_loss
    torch._dynamo.reset()  # another model's (or option's) graphs are never reused
    step_model = torch.compile(model, backend=backend)

    def step(of: Any = None) -> None:
        run = step_model if of is None else of
        (model if of is None else of).zero_grad(set_to_none=True)
        loss_fn(run(*args, **kwargs)).backward()

    try:
        with (torch._functorch.config.patch(activation_memory_budget=1.0, enable_autograd_cache=False),
              accelerator.fork_rng([]), warnings.catch_warnings()):
            warnings.simplefilter("ignore", ApplyWarning)  # the KV cache turned off: apply says so when run
            step()
            model.zero_grad(set_to_none=True)
            peak = allocator_peak(step, tensors_of(model, args, kwargs))[0]
            if reference is None:
                return peak, None
            eager = functools.partial(step, reference)
            eager()  # warm, as the compiled step is
            # interleaved (a burst of load slows both steps of a pair alike), the order swapped every pair
            ours, theirs = accelerator.alternating_pairs(lambda: accelerator.timed(step, "cpu")[0],
                                                         lambda: accelerator.timed(eager, "cpu")[0],
                                                         lambda done: done < rounds)
            pairs = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
            return peak, statistics.median(pairs) if pairs else None
    finally:
        torch._dynamo.reset()


def savings(prof: Any, graph: Graph, blocks: Sequence[Block], holds: EagerHolds, backend: str,
            eager_s: float) -> tuple[CompiledSavings, dict[str, Any]]:
    """What the compiled step frees beyond the SAC schedule and what it costs, per option
    (`CompiledSavings.from_uniform`; `eager_s`: the profile's eager step, in whose units the measured
    time ratios price the menu), and the measurements behind it: per option, the simulated and the
    measured compiled peak with every block on it ("none": the compiled baseline, the plain model under
    torch.compile), and its measured step time over eager's.  Cached per profile and backend."""
    key = (id(prof), backend)
    hit = _CALIBRATED.get(key)
    if hit is not None and hit[0]() is prof:
        return hit[1], hit[2]
    simulated, steps, measured, ratios = {}, {}, {}, {}
    for option in LADDER:
        chosen = choose(graph, blocks, (option,) * len(blocks), holds, Overheads())
        simulated[option] = chosen.timeline.peak_bytes
        # per step, the bytes and how many blocks are held: a block frees its share only until its backward
        held = held_blocks(graph, blocks, chosen.schedule).sum(axis=1)
        steps[option] = (chosen.timeline.step_bytes, held)
        measured[option], ratio = compiled_step(prof, graph, chosen.regions, backend)
        if ratio is not None:
            ratios[option] = ratio
    # priced by the measured times only when every option was timed (else the eager rate: `Overheads`)
    found = CompiledSavings.from_uniform(steps, measured, len(blocks),
                                         ratios if len(ratios) == len(LADDER) else None, eager_s)
    info = {"backend": backend, "simulated": simulated, "measured": measured, "outside": found.outside,
            "per_block": dict(found.per_block), "baseline_peak_bytes": measured["none"],
            "time_ratio": ratios, "per_block_ratio": dict(found.per_block_ratio)}
    for k in [k for k, v in _CALIBRATED.items() if v[0]() is None]:  # profiles since collected
        del _CALIBRATED[k]
    _CALIBRATED[key] = (weakref.ref(prof), found, info)
    return found, info


def compiled_overheads(costs: Overheads) -> Overheads:
    """`costs` as the compiled step pays them: the recomputed ops at the measured in-step rate, and none
    of eager checkpointing's Python (the policy, the re-run's dispatch, the frame): traced away."""
    return Overheads(dispatched=costs.dispatched, scale=costs.scale)
