"""An estimated CUDA target against the GPU itself: bench_cuda's GPT-2 (dropout on, AdamW, its own loss)
profiled on a CPU copy for ``device="fake:h100"`` and on the CUDA device, their predicted eager peaks beside
the measured one, then the estimated plan at 75 % of its range exported on the GPU with ``verify=True``.

Run on a machine with a CUDA GPU: ``python benchmarks/check_estimated_cuda.py`` (about a minute on an H100).
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_cuda import gpt2  # noqa: E402

import memviz  # noqa: E402

MiB = 2**20


def main() -> None:
    model, args, kwargs, loss_fn = gpt2()
    host = copy.deepcopy(model).cpu()
    to_cpu = {k: v.cpu() for k, v in kwargs.items()}
    t0 = time.perf_counter()
    est = memviz.profile(host, tuple(a.cpu() for a in args), to_cpu, loss_fn=loss_fn,
                         optimizer=torch.optim.AdamW, device="fake:h100")
    t1 = time.perf_counter()
    real = memviz.profile(model, args, kwargs, loss_fn=loss_fn, optimizer=torch.optim.AdamW, device="cuda")
    t2 = time.perf_counter()
    print(f"fake:h100 predicted eager peak {est.baseline.peak_bytes / MiB:.1f} MiB ({t1 - t0:.0f} s); cuda "
          f"predicted {real.baseline.peak_bytes / MiB:.1f} MiB, measured "
          f"{(real.measured_peak_bytes or 0) / MiB:.1f} MiB ({t2 - t1:.0f} s)", flush=True)
    plan = memviz.plan(est, 0.75, frontier=False, time_limit=20)
    print(f"fake:h100 plan at 75%: {plan.summary()}", flush=True)
    host.cuda()
    try:
        module = memviz.export(plan, verify=True, inputs=(args, kwargs))
        print(f"exported on cuda: verified peak {module.verified_peak_bytes / MiB:.1f} MiB against the plan "
              f"{module.plan.peak_bytes / MiB:.1f} MiB (replanned: {module.plan is not plan})", flush=True)
    except Exception as exc:  # noqa: BLE001 - the outcome is the report
        print(f"export on cuda: {type(exc).__name__}: {str(exc)[:400]}", flush=True)


if __name__ == "__main__":
    main()
