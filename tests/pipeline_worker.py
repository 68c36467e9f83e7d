"""The per-rank worker of tests/test_pipeline.py's gloo check: each of `world` processes builds its
pipeline stage of TinyGPT the way a user does with torch.distributed.pipelining (``pipeline`` split at the
blocks, ``build_stage``, ``ScheduleGPipe`` / ``Schedule1F1B``), runs two AdamW steps over the real gloo
group, and measures the second one's live-storage peak with
`memviz.parallel.distributed.ShardedStorageTracker`."""

from __future__ import annotations

import sys

import torch
from distributed_worker import loss_of, run_rank, tiny_gpt
from torch.distributed import pipelining

BATCH, LAYERS, MICROBATCHES = 4, 4, 4


def measure(rank: int, world: int, schedule: str) -> int:
    from memviz.parallel.distributed import ShardedStorageTracker
    from memviz.profiling.tracker import tensors_of

    model, (x,) = tiny_gpt(batch=BATCH, layers=LAYERS)
    per = LAYERS // world
    split = {f"blocks.{i * per}": pipelining.SplitPoint.BEGINNING for i in range(1, world)}
    pipe = pipelining.pipeline(model, mb_args=(x.chunk(MICROBATCHES)[0],), split_spec=split)
    stage = pipe.build_stage(rank, torch.device("cpu"))
    cls = {"1f1b": pipelining.Schedule1F1B, "gpipe": pipelining.ScheduleGPipe}[schedule]
    sched = cls(stage, MICROBATCHES, loss_fn=lambda out, _target: loss_of(out))
    opt = torch.optim.AdamW(stage.submod.parameters())

    def step() -> None:
        if stage.is_first:
            sched.step(x)
        elif stage.is_last:
            sched.step(target=torch.zeros(BATCH))
        else:
            sched.step()
        opt.step()

    step()
    opt.zero_grad(set_to_none=True)
    # the receive buffers torch's stage allocated once, per micro-batch: alive through every step
    buffers = [r.buffer for infos in (stage.args_recv_info, stage.grad_recv_info) for recvs in infos.values()
               for r in recvs if not r.is_root_arg and isinstance(r.buffer, torch.Tensor)]
    inputs = [x] if stage.is_first else []
    tracker = ShardedStorageTracker([*tensors_of(stage.submod, opt), *buffers, *inputs])
    with tracker:
        step()
    opt.zero_grad(set_to_none=True)
    return tracker.peak_bytes


def worker(rank: int, world: int, schedules: list[str], port: int, out_dir: str) -> None:
    run_rank(rank, world, port, out_dir, lambda: {s: measure(rank, world, s) for s in schedules})


if __name__ == "__main__":
    import torch.multiprocessing as mp

    schedules, world, port, out_dir = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn(worker, args=(world, schedules, port, out_dir), nprocs=world, join=True)
