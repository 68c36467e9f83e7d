"""Where the exported eager schedule of bench_export's ResNet loses to eager (issue 22 item 1, conv32).

Run: ``python benchmarks/check_conv_backward.py [--pairs 80]`` (CPU, one intra-op thread, this thread's CPU
time ``time.thread_time``).  It repeats `bench_export.bench_eager_schedule`'s sequence for bench_remat's
ResNet (a profile of `bench_export.PROFILE_REPEATS` repeats, the ``strategy="none"`` plan, the eager copy's
tracked peak, the export, the gradient check's step), then times `--pairs` pairs of steps in alternating
order with cyclic collection paused, and prints per model the medians of: forward and backward CPU time,
the minor page faults of each phase (mean), and the CPU time spent inside ``aten.convolution_backward``
(eager: prehook/hook on every ``ConvolutionBackward0`` node; exported: its generated code's operator
wrapped) -- the same Python timer around every call on both sides -- then the export/eager median ratios
and the per-call ratios of the 15 convolutions.

``--parameters`` picks the parameters the exported module runs on: ``copy`` (bench_export's: a deep copy
made after the eager copy's tracked step), ``twin`` (a deep copy made together with the eager one, before
that step) or ``same`` (the eager module itself: one set of parameters and buffers for both).

What conv32 read with it (2026-11-27 23:00-23:45 UTC, load 5.5-8, 80 pairs a run, export/eager medians):

* ``copy``: backward 1.034-1.057, ``convolution_backward`` 1.018-1.042 (7 runs, +0.22 to +0.67 ms of
  13-16 ms), the forward 0.93-0.99; per call 0.97-1.17 with the very same arguments (bias_sizes [0],
  output mask, strides, storage offset 0, a Parameter as weight, one thread on both sides);
* ``twin``: convolution_backward 1.016-1.026 (4 runs); ``same``: 1.000-1.014 in 4 runs (backward
  1.016-1.040) but 1.063 in a fifth (backward 1.090, the export faulting 763 pages a forward and 463 a
  backward against eager's 197 and 343): the parameters' placement is not the whole story; two eager
  copies against each other: 0.991 and 1.014;
* under glibc tunables that stop every page fault of the step (``GLIBC_TUNABLES=glibc.malloc.
  trim_threshold=1073741824:glibc.malloc.mmap_threshold=1073741824``) the backward still read
  1.039-1.054, so the page faults the export can add (130-200 a forward and 180-200 a backward against
  eager's 30-50 and 90-120 in some processes, none in others) are not the backward's loss.  They are
  part of the whole step's: `bench_export.bench_eager_schedule` itself (41 pairs x 2 rounds, process
  time) read 1.013-1.040 (mean 1.022, 8 processes) by default and 0.980-1.020 (mean 1.006, 8 processes,
  no faults) under those tunables, alternating processes, load 6-10;
* the generated backward edited to accumulate the residual gradients in place (eager's InputBuffer) and
  to free each node's gradient before its saved values (eager's engine order): gradients bitwise equal,
  convolution_backward 1.012-1.050 (3 runs), no measurable change.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from bench_export import PROFILE_REPEATS  # noqa: E402
from bench_remat import example_models, gradient_error, measured_peak  # noqa: E402

import memviz  # noqa: E402
from memviz.profiling.capture import default_loss  # noqa: E402

KEYS = ("forward", "backward", "conv", "forward_faults", "backward_faults")


class ConvClock:
    """CPU time inside each ``convolution_backward`` of a step, the same Python timer on both sides."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._start = 0.0

    def wrap(self, op: Any) -> Any:
        def timed(*args: Any) -> Any:
            start = time.thread_time()
            out = op(*args)
            self.calls.append(time.thread_time() - start)
            return out
        return timed

    def hook_eager(self, root: Any) -> None:
        """Time every ConvolutionBackward0 node of the autograd graph below `root`."""
        seen, stack = set(), [root]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node.name() == "ConvolutionBackward0":
                node.register_prehook(self._pre)
                node.register_hook(self._post)
            stack.extend(f for f, _ in node.next_functions)

    def _pre(self, _grads: Any) -> None:
        self._start = time.thread_time()

    def _post(self, _grad_inputs: Any, _grad_outputs: Any) -> None:
        self.calls.append(time.thread_time() - self._start)


def timed_step(model: torch.nn.Module, args: tuple, clock: ConvClock, eager: bool) -> dict[str, Any]:
    """One training step as bench_export times it, split into forward and backward."""
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = None
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.thread_time()
    loss = default_loss(model(*args))
    mid, mid_faults = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if eager:
        clock.hook_eager(loss.grad_fn)  # outside the clocks
        mid = time.thread_time()
    clock.calls = []
    loss.backward()
    end = time.thread_time()
    return {"forward": mid - start, "backward": end - mid, "conv": sum(clock.calls), "calls": clock.calls,
            "forward_faults": mid_faults - faults,
            "backward_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - mid_faults}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=80)
    parser.add_argument("--parameters", choices=("copy", "twin", "same"), default="copy")
    opts = parser.parse_args(argv)
    pairs = opts.pairs
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, args = example_models(False)["resnet"]
    prof = memviz.profile(model, args, mode="train", repeats=PROFILE_REPEATS)
    plan = memviz.plan(prof, strategy="none", frontier=False, packing=False)
    eager = copy.deepcopy(model)
    twin = copy.deepcopy(model) if opts.parameters == "twin" else None
    measured_peak(eager, args)
    own = {"copy": copy.deepcopy(model) if opts.parameters == "copy" else None, "twin": twin, "same": eager}
    exported = memviz.export(plan, model=own[opts.parameters])
    error = gradient_error(eager, exported, args)  # also the warm-up step of both, as in bench_export
    if opts.parameters != "same":  # one set of parameters: its gradients would be compared with themselves
        print(f"gradient error {error:.1e}")
    clock = ConvClock()
    code = exported.program.code  # this process's compiled steps: its operator wrapped here only
    code.aten_convolution_backward = clock.wrap(code.aten_convolution_backward)
    models = {"export": (exported, False), "eager": (eager, True)}
    steps: dict[str, list[dict[str, Any]]] = {name: [] for name in models}
    load = [os.getloadavg()[0]]
    gc.collect()
    gc.disable()
    for i in range(pairs):
        for name in (("export", "eager") if i % 2 == 0 else ("eager", "export")):
            module, is_eager = models[name]
            steps[name].append(timed_step(module, args, clock, is_eager))
    gc.enable()
    load.append(os.getloadavg()[0])
    print(f"ResNet (bench_remat sizes), parameters: {opts.parameters}, {pairs} pairs, "
          f"load {min(load):.1f}-{max(load):.1f}")
    for name, rows in steps.items():
        print(f"{name:6s} " + "  ".join(
            f"{k} {statistics.mean(r[k] for r in rows):.0f}" if k.endswith("faults")
            else f"{k} {1e3 * statistics.median(r[k] for r in rows):.2f} ms" for k in KEYS))
    pairs_of = list(zip(steps["export"], steps["eager"], strict=True))
    print("export/eager: " + "  ".join(
        f"{k} {statistics.median(x[k] / e[k] for x, e in pairs_of):.3f} "
        f"({1e3 * statistics.median(x[k] - e[k] for x, e in pairs_of):+.2f} ms)" for k in KEYS[:3]))
    for i in range(len(steps["eager"][0]["calls"])):
        eager_us = 1e6 * statistics.median(e["calls"][i] for _, e in pairs_of)
        ratio = statistics.median(x["calls"][i] / e["calls"][i] for x, e in pairs_of)
        print(f"  convolution_backward {i:2d}: eager {eager_us:5.0f} us, export/eager {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
