"""What ``torch.compile(memviz.export(plan))`` adds per step over Inductor's own compiled step on a tiny
model, and what cmin32's fix took off it (issue 22).

Run: ``python benchmarks/check_compiled_fixed_cost.py [--model gpt-2l-dropout] [--fraction 0.5]
[--pairs 30]`` (CPU, one thread; three Inductor compiles: a minute or two).  bench_compile's ``--model``
and its plan at ``--fraction`` on V100-roofline op times (`check_compiled_peak.fixed_plan`: the same plan on
any load).  Contenders, warmed by two steps each, then ``--pairs`` rounds of (contender, eager) pairs with
every contender in every round (the same load for all); step time is the thread's CPU time
(`bench_compile.CLOCK`):

* ``torch.compile(model)``, Inductor's default;
* memviz compiled as before cmin32: the module's ``forward`` under ``torch._dynamo.disable(recursive=False)``,
  which runs Dynamo's Python frame callback on that frame at every call (`torch._dynamo.convert_frame`
  re-derives "non-recursively disabled" from the calling frame each time, never caching it);
* as shipped: ``forward`` marked once by ``torch._dynamo.decorators.skip`` (the same semantics, cached on
  the code object).

For the shipped one it also splits the step: time inside the compiled segments (`compiled._call`) and the
rest (the driver, autograd's two Function nodes, the loss, ``zero_grad``, the seed), beside Inductor's.
Gradients after one seeded step are checked equal (dropout masks replayed) for every memviz contender.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from bench_compile import CLOCK  # noqa: E402
from bench_remat import _step, gradient_error  # noqa: E402
from check_compiled_gap import timed_rounds  # noqa: E402
from check_compiled_peak import fixed_plan  # noqa: E402
from torch._C._dynamo.eval_frame import get_eval_frame_callback  # noqa: E402

import memviz  # noqa: E402
from memviz.runtime import compiled as compiled_module  # noqa: E402
from memviz.runtime.export import PlannedModule  # noqa: E402


class NonRecursiveDisable(PlannedModule):
    """`PlannedModule` with its ``forward`` marked as before cmin32."""

    @torch._dynamo.disable(recursive=False)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._step(get_eval_frame_callback(), args, kwargs)


#: contender -> the module class its export runs as
MEMVIZ: dict[str, type[PlannedModule]] = {
    "memviz compiled, before": NonRecursiveDisable,
    "memviz compiled (shipped)": PlannedModule,
}


class _Timer:
    """Accumulates the CPU time spent inside a wrapped function (here: the compiled segments' calls)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.spent = fn, 0.0

    def __call__(self, *args: Any) -> Any:
        start = CLOCK()
        try:
            return self.fn(*args)
        finally:
            self.spent += CLOCK() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-2l-dropout")
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--pairs", type=int, default=30)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, args, plan = fixed_plan(a.fraction, a.model)
    eager = copy.deepcopy(model)
    contenders = {"inductor default": torch.compile(copy.deepcopy(model), backend="inductor")}
    for name, cls in MEMVIZ.items():
        exported = memviz.export(plan, model=copy.deepcopy(model))
        exported.__class__ = cls
        contenders[name] = torch.compile(exported, backend="inductor")
    errors = {}
    for name, c in contenders.items():
        _step(c, args, 0)  # compiles
        _step(c, args, 0)
        errors[name] = gradient_error(eager, c, args)
    timer = _Timer(compiled_module._call)
    segments: list[float] = []

    def keep(name: str) -> None:
        """The shipped contender's time in its segments this step; the timer starts again for the next."""
        if name == "memviz compiled (shipped)":
            segments.append(timer.spent)
        timer.spent = 0.0

    with mock.patch.object(compiled_module, "_call", timer):
        ratios, times = timed_rounds(eager, contenders, args, a.pairs, keep)
    default = statistics.median(ratios["inductor default"])
    print(f"{a.model} at {a.fraction:.0%} ({plan.strategy}, {plan.timeline.recomputes} recomputations, "
          f"predicted {plan.time_overhead:.3f}x eager), {a.pairs} pairs, "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'eager':36s} {statistics.median(times['eager']) * 1e3:.3f} ms")
    for name in contenders:
        r = statistics.median(ratios[name])
        print(f"{name:36s} {r:.3f}x eager, {r / default:.3f}x Inductor's default, "
              f"{statistics.median(times[name]) * 1e3:.3f} ms, gradient error {errors[name]:.1e}")
    shipped = statistics.median(times["memviz compiled (shipped)"])
    inside = statistics.median(segments)
    print(f"shipped step split: {inside * 1e3:.3f} ms inside the compiled segments, "
          f"{(shipped - inside) * 1e3:.3f} ms outside them; Inductor's whole step "
          f"{statistics.median(times['inductor default']) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
