"""The per-rank worker tests/test_apply_compose.py spawns (gloo on CPU): a model `memviz.apply` checkpointed
with a plan loaded from JSON, then wrapped the way a user would (DDP, or FSDP2 ``fully_shard`` per block
and the root), trains 3 AdamW steps on rank-specific data; its local gradients are compared with the
same wrapping of the unplanned model.  Each rank writes what it found to ``rank{N}.json``."""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_worker import tiny_gpt  # noqa: E402

STEPS = 3


def _local(t: torch.Tensor) -> torch.Tensor:
    """An FSDP2 gradient is a DTensor: this rank's shard (both models are sharded alike)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _wrap(model: nn.Module, kind: str) -> nn.Module:
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _calls(model: nn.Module) -> Callable[[], int]:
    """How many times the first block's submodules were called: a checkpointed block's recomputation calls
    them again in the backward (the block's own hooks do not run then, its children's do)."""
    count = [0]

    def hook(*_: Any) -> None:
        count[0] += 1

    for m in model.blocks[0].children():
        m.register_forward_hook(hook)
    return lambda: count[0]


def train(model: nn.Module, kind: str, idx: torch.Tensor) -> tuple[list[list[torch.Tensor]], int, int]:
    """Each step's local gradients, the first block's submodule calls over `STEPS` AdamW steps, and the
    measured peak (forward and backward, this rank's live storages): the smallest of the steps after the
    first, as `rank_plan_worker.train` takes it, because gloo's worker thread sometimes drops a finished
    collective's buffer late (a CI rehearsal: rank 1's FSDP2 step once held 484280 B, rank 0's 433464)."""
    from memviz.parallel.distributed import ShardedStorageTracker, local_tensors

    calls = _calls(model)
    wrapped = _wrap(model, kind)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    grads, peaks = [], []
    for _ in range(STEPS):
        tracker = ShardedStorageTracker(local_tensors(wrapped, opt, idx))
        with tracker:
            wrapped(idx).float().sum().backward()
        peaks.append(tracker.peak_bytes)
        grads.append([_local(p.grad).detach().clone() for p in wrapped.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads, calls(), min(peaks[1:])


def compare(kind: str, plan: Any) -> dict[str, Any]:
    from memviz.runtime.apply import ApplyWarning, apply

    model, (idx,) = tiny_gpt()
    # each rank its own batch, so the gradients only agree after the all-reduce / reduce-scatter
    rank = torch.distributed.get_rank()
    idx = torch.randint(0, 64, idx.shape, generator=torch.Generator().manual_seed(rank))
    reference, ref_calls, ref_peak = train(copy.deepcopy(model), kind, idx)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ApplyWarning)  # a save decision landing on another op says so
        applied, applied_calls, applied_peak = train(apply(plan, model), kind, idx)
    worst = 0.0
    for ref_step, app_step in zip(reference, applied, strict=True):
        for a, b in zip(ref_step, app_step, strict=True):
            worst = max(worst, ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item())
    return {"max_relative_grad_difference": worst, "reference_calls": ref_calls,
            "applied_calls": applied_calls, "reference_peak": ref_peak, "applied_peak": applied_peak,
            "warnings": [str(w.message) for w in caught if issubclass(w.category, ApplyWarning)]}


def worker(rank: int, world: int, kinds: list[str], plan_path: str, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    import memviz

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        plan = memviz.load_plan(plan_path)
        result = {kind: compare(kind, plan) for kind in kinds}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    kinds, plan_path, port, out_dir = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    mp.spawn(worker, args=(2, kinds, plan_path, port, out_dir), nprocs=2, join=True)
