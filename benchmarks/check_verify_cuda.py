"""The eager-schedule export's verifying step on a GPU: bench_cuda's GPT-2 profiled on the device, its
strategy-"none" plan exported with ``verify=True`` three times (is the excess over the plan a first-call
cost?), then once more after ``torch._C._cuda_clearCublasWorkspaces()`` (is it cuBLAS's workspaces?).

Run on a machine with a CUDA GPU: ``python benchmarks/check_verify_cuda.py`` (about 30 s on an H100).
On 2026-11-28 (H100, torch 2.11): 1319.2 MiB verified against a 1266.1 MiB plan at each of the three
exports, 1286.2 after clearing the workspaces (the plan holds them as a 65 MiB "runtime" node).  A second
call printed ``torch.cuda.memory_allocated()`` along the way: 90.2 MiB after building the model (89.2 of
parameters), 205.3 after ``memviz.profile`` returned (no gradients left), 139.3 after clearing the
workspaces: the profile leaves 66 MiB of cuBLAS workspaces and 49 MiB of tensors of its own allocated,
and verify's accelerator measurement (``max_memory_allocated``, everything on the device) counts those 49
MiB on top of the plan.  Found with check_allocator_cuda.py (the allocator's history, garbage collected
first): nothing but the workspaces stays; the 49 MiB were block copies of the profile's checkpoint-cost
calibration in reference cycles, with their gradients.  Freed since (03d3483); on an H200 the same run
verifies at 1269.1 MiB against the 1266.1 MiB plan, 1236.1 after clearing the workspaces.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_cuda import gpt2  # noqa: E402

import memviz  # noqa: E402

MiB = 2**20


def main() -> None:
    model, args, kwargs, loss_fn = gpt2()
    prof = memviz.profile(model, args, kwargs, loss_fn=loss_fn, optimizer=torch.optim.AdamW, device="cuda")
    plan = memviz.plan(prof, None, strategy="none", frontier=False)
    for i in range(3):
        module = memviz.export(plan, verify=True)
        print(f"export {i}: verified {module.verified_peak_bytes / MiB:.1f} MiB, "
              f"plan {plan.peak_bytes / MiB:.1f} MiB, "
              f"allocated after {torch.cuda.memory_allocated() / MiB:.1f} MiB", flush=True)
        del module
    torch._C._cuda_clearCublasWorkspaces()
    module = memviz.export(plan, verify=True)
    verified = module.verified_peak_bytes / MiB
    print(f"after clearing cuBLAS's workspaces: verified {verified:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
