"""Where compiled memviz loses to Inductor's default compile: one fixed plan, Inductor's settings toggled
one at a time on each side, in one process (issue 22, compile28; dropout models: compile29).

Run: ``python benchmarks/check_compiled_gap.py [--model resnet] [--fraction 1] [--pairs 15]`` (CPU, one
thread; several Inductor compiles: minutes).  bench_compile's ``--model`` (`bench_compile.MODELS`) and its
plan at ``--fraction`` (1: the eager schedule; `check_compiled_peak.fixed_plan`, V100-roofline op times, so
the same plan on any load).  Contenders, each warmed by two steps, then ``--pairs`` rounds of (contender,
eager) pairs, every contender in every round so all see the same load; step time is the thread's CPU time
(`bench_compile.CLOCK`):

* an eager copy (the noise floor) and the uncompiled export;
* ``torch.compile(model)``, Inductor's default;
* a model without random ops (ResNet): Inductor's default with ``layout_optimization`` off (no
  channels-last convolutions) and with ``realize_reads_threshold`` 0 (what memviz's segments use);
  ``torch.compile(memviz.export(plan))`` as shipped (threshold 0, layout optimisation off); with
  Inductor's default threshold 4; with Inductor's own fusion choices (horizontal fusion across operators,
  which memviz refuses: `compiled._plan_order_choices`); with layout optimisation on and
  ``keep_output_stride`` off (a segment may return its channels-last values rather than copy them back);
  and that with the convolution weights stored channels-last outside the step (`channels_last_weights`);
* a model with dropout: ``torch.compile(memviz.export(plan))`` as shipped (one segment per phase, each
  dropout saving or replaying its RNG state inside the graph, `compiled.rng_in_graph`); the same plan cut
  at every random op's execution with the driver's RNG save or replay around each segment (compile28's
  way); and compiled *uncut*, one segment per phase and no RNG handling (its recomputed dropout draws
  fresh masks: wrong gradients, timed only).  Cut and uncut differ by what the cuts cost: segment calls,
  RNG states and fusion lost across the cuts.  For the first two it also times, in the same process, a
  trivial compiled segment's call through memviz's driver (`compiled._call`) and the export's RNG save
  and replay (`export._StepRng`), and counts them in the cut plan's step; the rest of the cuts' cost is
  lost fusion and the segments' per-input handling.

It prints per contender the median step-time ratio to eager, that over Inductor's default's, the median
step's CPU time, the CPU allocator's peak of one step, and the number of compiled segments.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from bench_compile import CLOCK, MODELS, MiB  # noqa: E402
from bench_remat import _step, _timed_step  # noqa: E402
from check_compiled_peak import fixed_plan  # noqa: E402

import memviz  # noqa: E402
from memviz.profiling.tracker import allocator_peak, tensors_of  # noqa: E402
from memviz.runtime import compiled as compiled_module  # noqa: E402
from memviz.runtime.export import _StepRng  # noqa: E402

#: contender -> (compile memviz's export rather than the model, Inductor settings over the side's own)
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    "inductor default": (False, {}),
    "inductor, layout_optimization off": (False, {"layout_optimization": False}),
    "inductor, realize_reads_threshold 0": (False, {"realize_reads_threshold": 0}),
    "memviz compiled (shipped)": (True, {}),
    "memviz compiled, realize_reads_threshold 4": (True, {"realize_reads_threshold": 4}),
    "memviz compiled, horizontal fusion across operators": (True, {}),
    "memviz compiled, channels-last kept": (True, {"layout_optimization": True, "keep_output_stride": False}),
    "memviz compiled, channels-last kept, weights channels-last":
        (True, {"layout_optimization": True, "keep_output_stride": False}),
}
#: contenders whose 4-d parameters are stored channels-last after the export, outside the step (the same
#: bytes: the plan is unchanged; the convolution backward's scratch is not)
CHANNELS_LAST_WEIGHTS = {"memviz compiled, channels-last kept, weights channels-last"}
#: contenders compiled with Inductor's own fusion choices, horizontal fusion across operators allowed
#: (`compiled._plan_order_choices` refuses it: cmin33)
INDUCTOR_CHOICES = {"memviz compiled, horizontal fusion across operators"}
#: the contenders for a model with random ops: (compile memviz's export, RNG in the graph, cut at random ops)
DROPOUT_VARIANTS: dict[str, tuple[bool, bool, bool]] = {
    "inductor default": (False, True, True),
    "memviz compiled (shipped)": (True, True, True),
    "memviz compiled, cut at random ops": (True, False, True),
    "memviz compiled, uncut (fresh masks)": (True, False, False),
}
#: calls per timing of the fixed costs below
CALLS = 2000


def inductor_with(settings: dict[str, Any]) -> Callable[..., Any]:
    """A torch.compile backend: Inductor under `settings`, patched innermost (over memviz's own patch)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        with inductor_config.patch(**settings):
            return compile_fx(gm, example)

    return backend


def inductor_choices() -> type:
    """Inductor's default fusion heuristics, as a `compiled._plan_order_choices` stand-in."""
    from torch._inductor.choices import InductorChoices

    class Default(InductorChoices):
        def uuid(self) -> str:  # a key of its own in Inductor's FX-graph cache
            return "check_compiled_gap.Default"

    return Default


def channels_last_weights(module: torch.nn.Module) -> None:
    """Store `module`'s 4-d parameters channels-last, in place (after `memviz.export`: its capture
    must see the layout the profile saw)."""
    for p in module.parameters():
        if p.dim() == 4:
            p.data = p.data.contiguous(memory_format=torch.channels_last)


def _uncut(steps: Any, random: frozenset[int], first_done: set[int]) -> list[tuple[int, int, None]]:
    """`compiled._cuts` without cuts: each phase one segment, no RNG save or replay."""
    return [(0, len(steps), None)]


def segment_call_s() -> float:
    """CPU seconds of one call of a trivial compiled segment (one add on a 1-element tensor) through
    memviz's driver (`compiled._call`: its argument list, env pops and writes), compiled as a segment is."""
    from torch._inductor.compile_fx import compile_fx

    def fn(env: dict[str, Any], rng: Any, buffers: dict[str, Any], grad_outputs: dict[int, Any]) -> None:
        env["y"] = env.pop("x") + 1

    x = torch.ones(1)
    traced = compiled_module._trace(fn, {"x": x}, {}, {}, compile_fx)
    envs = [{"x": x} for _ in range(CALLS)]
    start = CLOCK()
    for env in envs:
        compiled_module._call(traced, env, {}, {}, None)  # reads no RNG state
    return (CLOCK() - start) / CALLS


def rng_s() -> tuple[float, float]:
    """CPU seconds of the export's RNG save and of entering and leaving its replay (`export._StepRng`,
    the CPU generator), one call each."""
    rng = _StepRng([])
    start = CLOCK()
    for _ in range(CALLS):
        rng.save(0)
    save = (CLOCK() - start) / CALLS
    start = CLOCK()
    for _ in range(CALLS):
        with rng.replay(0):
            pass
    return save, (CLOCK() - start) / CALLS


def timed_rounds(eager: torch.nn.Module, contenders: dict[str, Any], args: Any, pairs: int,
                 after: Callable[[str], None] = lambda name: None,
                 ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """`pairs` rounds with every contender in each (the same load for all), each contender's step followed by
    one of `eager`'s: the (contender, eager) step-time ratios per contender, and every step's time by name
    (``"eager"`` included); `after` runs after each contender's timed step, before eager's."""
    ratios: dict[str, list[float]] = {name: [] for name in contenders}
    times: dict[str, list[float]] = {name: [] for name in ["eager", *contenders]}
    for i in range(pairs):
        for name, c in contenders.items():
            t = _timed_step(c, args, i, CLOCK)
            after(name)
            times[name].append(t)
            times["eager"].append(_timed_step(eager, args, i, CLOCK))
            ratios[name].append(t / times["eager"][-1])
    return ratios, times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet", choices=sorted(MODELS))
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--pairs", type=int, default=15)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, args, plan = fixed_plan(a.fraction, a.model)
    eager = copy.deepcopy(model)
    contenders: dict[str, torch.nn.Module] = {
        "eager copy": copy.deepcopy(model),
        "memviz export, uncompiled": memviz.export(plan, model=copy.deepcopy(model))}
    exported: dict[str, Any] = {}
    patches: dict[str, list[Any]] = {}
    random = bool(contenders["memviz export, uncompiled"].program.random)
    variants = {name: (ours, {}) for name, (ours, *_) in DROPOUT_VARIANTS.items()} if random else VARIANTS
    for name, (ours, settings) in variants.items():
        target = memviz.export(plan, model=copy.deepcopy(model)) if ours else copy.deepcopy(model)
        if name in CHANNELS_LAST_WEIGHTS:
            channels_last_weights(target)
        backend = inductor_with(settings) if settings else "inductor"
        contenders[name] = torch.compile(target, backend=backend)
        in_graph, cut = DROPOUT_VARIANTS[name][1:] if random else (True, True)
        patches[name] = [*([] if in_graph else [("rng_in_graph", lambda program: False)]),
                         *([] if cut else [("_cuts", _uncut)]),
                         *([("_plan_order_choices", inductor_choices)] if name in INDUCTOR_CHOICES else [])]
        if ours:
            exported[name] = target
    for name, c in [("eager", eager), *contenders.items()]:
        # the first step compiles; a variant's segments are cut then (`compiled.compiled_code`)
        with contextlib.ExitStack() as stack:
            for attribute, value in patches.get(name, []):
                stack.enter_context(mock.patch.object(compiled_module, attribute, value))
            for _ in range(2):
                _step(c, args, 0)
    peaks = {}
    for name, c in contenders.items():
        c.zero_grad(set_to_none=True)
        peaks[name] = allocator_peak(lambda c=c: _step(c, args, 0), tensors_of(c, args))[0]
    ratios, times = timed_rounds(eager, contenders, args, a.pairs)
    default = statistics.median(ratios["inductor default"])
    print(f"{a.model} at {a.fraction:.0%} ({plan.strategy}, {plan.timeline.recomputes} recomputations, "
          f"predicted {plan.time_overhead:.3f}x eager, plan {plan.peak_bytes / MiB:.3f} MiB), "
          f"{a.pairs} pairs, load {' '.join(map(str, os.getloadavg()))}")
    print(f"{'eager':45s} {statistics.median(times['eager']) * 1e3:.2f} ms")
    for name in contenders:
        r = statistics.median(ratios[name])
        segments = f", {len(next(iter(exported[name]._compiled.values()))[1].graphs)} segments" \
            if name in exported else ""
        print(f"{name:45s} {r:.3f}x eager, {r / default:.3f}x Inductor's default, "
              f"{statistics.median(times[name]) * 1e3:.2f} ms, peak {peaks[name] / MiB:.3f} MiB{segments}")
    if random:
        print(_fixed_costs(exported["memviz compiled, cut at random ops"], statistics.median(times["eager"])))
    return 0


def _fixed_costs(exported: Any, eager_s: float) -> str:
    """The cut compiled export's segment calls and RNG saves and replays per step, each timed alone
    (`segment_call_s`, `rng_s`), in ms and as a share of an eager step."""
    code = next(iter(exported._compiled.values()))[1]
    segments = [seg for segs in code.phases.values() for seg in segs]
    saves = sum(1 for seg in segments if seg.rng is not None and seg.rng[0] == "save")
    replays = sum(1 for seg in segments if seg.rng is not None and seg.rng[0] == "replay")
    call = segment_call_s()
    save, replay = rng_s()
    total = len(segments) * call + saves * save + replays * replay
    return (f"fixed costs per step: {len(segments)} segment calls x {call * 1e6:.1f} us, {saves} RNG saves x "
            f"{save * 1e6:.1f} us, {replays} replays x {replay * 1e6:.1f} us = {total * 1e3:.3f} ms, "
            f"{total / eager_s:.3f} of an eager step")


if __name__ == "__main__":
    raise SystemExit(main())
