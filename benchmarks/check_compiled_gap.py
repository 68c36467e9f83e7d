"""Where compiled memviz loses to Inductor's default compile: one fixed plan, Inductor's settings toggled
one at a time on each side, in one process (issue 22, compile28).

Run: ``python benchmarks/check_compiled_gap.py [--fraction 1] [--pairs 15]`` (CPU, one thread; six
Inductor compiles: minutes).  bench_compile's ResNet and its plan at ``--fraction`` (1: the eager
schedule; `check_compiled_peak.fixed_plan`, V100-roofline op times, so the same plan on any load).
Contenders, each warmed by two steps, then ``--pairs`` rounds of (contender, eager) pairs, every contender
in every round so all see the same load; step time is the thread's CPU time (`bench_compile.CLOCK`):

* an eager copy (the noise floor) and the uncompiled export;
* ``torch.compile(model)``, Inductor's default; the same with ``layout_optimization`` off (no
  channels-last convolutions) and with ``realize_reads_threshold`` 0 (what memviz's segments use);
* ``torch.compile(memviz.export(plan))`` as shipped (threshold 0, layout optimisation off); with
  Inductor's default threshold 4; and with layout optimisation on and ``keep_output_stride`` off (a
  segment may return its channels-last values rather than copy them back).

It prints per contender the median step-time ratio to eager, that over Inductor's default's, the CPU
allocator's peak of one step, and the number of compiled segments.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from bench_compile import CLOCK, MiB  # noqa: E402
from bench_remat import _step, _timed_step  # noqa: E402
from check_compiled_peak import fixed_plan  # noqa: E402

import memviz  # noqa: E402
from memviz.profiling.tracker import allocator_peak, tensors_of  # noqa: E402

#: contender -> (compile memviz's export rather than the model, Inductor settings over the side's own)
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    "inductor default": (False, {}),
    "inductor, layout_optimization off": (False, {"layout_optimization": False}),
    "inductor, realize_reads_threshold 0": (False, {"realize_reads_threshold": 0}),
    "memviz compiled (shipped)": (True, {}),
    "memviz compiled, realize_reads_threshold 4": (True, {"realize_reads_threshold": 4}),
    "memviz compiled, channels-last kept": (True, {"layout_optimization": True, "keep_output_stride": False}),
}


def inductor_with(settings: dict[str, Any]) -> Callable[..., Any]:
    """A torch.compile backend: Inductor under `settings`, patched innermost (over memviz's own patch)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        with inductor_config.patch(**settings):
            return compile_fx(gm, example)

    return backend


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--pairs", type=int, default=15)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, args, plan = fixed_plan(a.fraction)
    eager = copy.deepcopy(model)
    contenders: dict[str, torch.nn.Module] = {
        "eager copy": copy.deepcopy(model),
        "memviz export, uncompiled": memviz.export(plan, model=copy.deepcopy(model))}
    exported: dict[str, Any] = {}
    for name, (ours, settings) in VARIANTS.items():
        target = memviz.export(plan, model=copy.deepcopy(model)) if ours else copy.deepcopy(model)
        backend = inductor_with(settings) if settings else "inductor"
        contenders[name] = torch.compile(target, backend=backend)
        if ours:
            exported[name] = target
    for c in [eager, *contenders.values()]:
        for _ in range(2):  # the first compiles
            _step(c, args, 0)
    peaks = {}
    for name, c in contenders.items():
        c.zero_grad(set_to_none=True)
        peaks[name] = allocator_peak(lambda c=c: _step(c, args, 0), tensors_of(c, args))[0]
    ratios: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(a.pairs):
        for name, c in contenders.items():
            t = _timed_step(c, args, i, CLOCK)
            ratios[name].append(t / _timed_step(eager, args, i, CLOCK))
    default = statistics.median(ratios["inductor default"])
    print(f"resnet at {a.fraction:.0%} ({plan.strategy}, {plan.timeline.recomputes} recomputations, plan "
          f"{plan.peak_bytes / MiB:.3f} MiB), {a.pairs} pairs, load {' '.join(map(str, os.getloadavg()))}")
    for name in contenders:
        r = statistics.median(ratios[name])
        segments = f", {len(next(iter(exported[name]._compiled.values()))[1].graphs)} segments" \
            if name in exported else ""
        print(f"{name:45s} {r:.3f}x eager, {r / default:.3f}x Inductor's default, peak "
              f"{peaks[name] / MiB:.3f} MiB{segments}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
