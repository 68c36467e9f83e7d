"""Where the real-model zoo's predicted step-time overhead misses the measured one (issue 22 item 2).

Run: ``python benchmarks/check_real_overhead.py --models bert,gpt2_sdpa [--rounds 2] [--pairs 31]``
(CPU, one intra-op thread, this process's CPU time, as ``bench_real.py``).

Per model and round: a fresh profile as ``bench_real`` profiles it (AdamW, the rotated loss), the auto
plan at 50% of [auto's minimum, eager peak] and the ``strategy="none"`` plan (the eager schedule
exported: no recomputation, so its prediction is the profile's fixed costs alone), both exported and
measured against an eager copy with ``bench_real.time_ratio``.  It prints the profile's decomposition
(op times with and without the optimizer's update nodes, eager's and the executor's fixed costs, the
recompute rate) and, measured in the same alternating pairs, the eager step without and with its AdamW
update: the update's real time against the update nodes' summed time.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import copy
import os
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
from bench_real import time_ratio  # noqa: E402
from run import auto_minimum  # noqa: E402

import memviz  # noqa: E402
from memviz.hardware import accelerator  # noqa: E402
from solvers import Phase  # noqa: E402
from tests.real_models import REAL, rotating_loss  # noqa: E402
from tests.test_zoo import _fresh  # noqa: E402


def update_time(model: torch.nn.Module, loss_fn: Any, case: Any, pairs: int) -> tuple[float, float]:
    """Median CPU seconds of eager's step without its AdamW update (forward, loss, backward) and of the
    update with ``zero_grad``, timed inside the same steps."""
    opt = torch.optim.AdamW(model.parameters())
    steps, updates = [], []
    for i in range(pairs + 2):
        args, kwargs = _fresh((case.args, case.kwargs))
        torch.manual_seed(0)
        t0 = time.process_time()
        loss_fn(model(*args, **kwargs)).backward()
        t1 = time.process_time()
        opt.step()
        opt.zero_grad()
        t2 = time.process_time()
        if i >= 2:
            steps.append(t1 - t0)
            updates.append(t2 - t1)
    return statistics.median(steps), statistics.median(updates)


def _case(name: str) -> tuple[Any, Any]:
    """The zoo's model `name` with its rotated loss, or an example model at bench_export's timed size
    with the default loss (``examples/models.py``), as a RealCase."""
    if name in REAL:
        case = REAL[name]()
        return case, case.losses[rotating_loss(case, list(REAL).index(name))]
    import bench_export

    from examples.models import EXAMPLES
    from memviz.profiling.capture import default_loss
    from tests.real_models import RealCase

    model, args = EXAMPLES[name](**bench_export.SIZES[name])
    return RealCase(model, args), default_loss


def probe(name: str, pairs: int) -> dict[str, float]:
    torch.manual_seed(0)
    case, loss_fn = _case(name)
    prof = memviz.profile(case.model, case.args, case.kwargs, loss_fn=loss_fn,
                          optimizer=torch.optim.AdamW, fallback=False)
    g, meta = prof.graph, prof.graph.meta
    opt_s = sum(c.time for c in g.computes if c.phase is Phase.OPTIMIZER)
    base = prof.baseline.total_time
    low = auto_minimum(prof)
    none = memviz.plan(prof, strategy="none", frontier=False, packing=False)
    plan = none if low is None else memviz.plan(prof, low + (prof.baseline.peak_bytes - low) // 2,
                                                strategy="auto", time_limit=10.0, frontier=False,
                                                packing=False)
    eager = copy.deepcopy(case.model)
    out = {"base_ms": 1e3 * base, "opt_nodes_ms": 1e3 * opt_s,
           "eager_fixed_ms": 1e3 * meta.get("eager_fixed_s", 0.0),
           "exec_fixed_ms": 1e3 * meta.get("executor_fixed_s", 0.0),
           "rscale": meta.get("recompute_scale", 1.0), "ops": meta.get("executor_ops", 0),
           "phase_ms": 1e3 * meta.get("executor_phase_s", 0.0),
           "recomputed_ms": 1e3 * (plan.timeline.total_time - base), "recomputes": plan.timeline.recomputes,
           "pred_none": none.time_overhead, "pred_plan": plan.time_overhead}
    out["meas_none"] = time_ratio(memviz.export(none), eager, loss_fn, case, pairs)[0]
    exported = memviz.export(plan)
    out["meas_plan"] = time_ratio(exported, eager, loss_fn, case, pairs)[0]
    out["meas_plan2"] = time_ratio(exported, eager, loss_fn, case, pairs)[0]  # the measurement's own spread
    fb, upd = update_time(copy.deepcopy(case.model), loss_fn, case, pairs)
    out.update(eager_fb_ms=1e3 * fb, eager_update_ms=1e3 * upd)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2_sdpa,roberta")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=31)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    accelerator.cpu_clock = time.process_time  # as bench_real
    for r in range(a.rounds):
        for name in a.models.split(","):
            load = os.getloadavg()[0]
            o = probe(name, a.pairs)
            print(f"{name} r{r} load {load:.1f}: " + " ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in o.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
