"""The per-rank worker of tests/test_pipeline.py's gloo check: each of `world` processes builds its
pipeline stage of TinyGPT the way a user does with torch.distributed.pipelining (``pipeline`` split at the
blocks, ``build_stage``, ``ScheduleGPipe`` / ``Schedule1F1B``; for "fsdp:" cases the stage module
fully_shard-ed on a ("pp", "dp") mesh first, as torchtitan does), runs two AdamW steps over the real gloo
group, and measures the second one's live-storage peak with
`memviz.parallel.distributed.ShardedStorageTracker`."""

from __future__ import annotations

import sys

import torch
from distributed_worker import loss_of, run_rank, tiny_gpt
from torch.distributed import pipelining

BATCH, LAYERS, MICROBATCHES = 4, 4, 4


#: stages of the "fsdp:<schedule>" cases (the other world // PP_STAGES ranks of each stage shard it)
PP_STAGES = 2


def fsdp_stage(pipe: pipelining.Pipe, world: int) -> pipelining.PipelineStage:
    """What a torchtitan user writes for PP x FSDP2: a ("pp", "dp") mesh, this rank's stage module
    fully_shard-ed over "dp" block by block and whole, the stage's sends and receives on the "pp" group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (PP_STAGES, world // PP_STAGES), mesh_dim_names=("pp", "dp"))
    index = mesh["pp"].get_local_rank()
    module = pipe.get_stage_module(index)
    per = LAYERS // PP_STAGES
    for i in range(index * per, (index + 1) * per):
        fully_shard(module.get_submodule(f"blocks.{i}"), mesh=mesh["dp"])
    fully_shard(module, mesh=mesh["dp"])
    return pipe.build_stage(index, torch.device("cpu"), mesh["pp"].get_group())


def measure(rank: int, world: int, case: str) -> int:
    """`case`: a schedule ("1f1b", "gpipe": `world` stages) or "fsdp:<schedule>" (`PP_STAGES` stages, each
    sharded over world / PP_STAGES ranks)."""
    from memviz.parallel.distributed import ShardedStorageTracker, local_tensors

    fsdp, schedule = case.startswith("fsdp:"), case.removeprefix("fsdp:")
    stages = PP_STAGES if fsdp else world
    model, (x,) = tiny_gpt(batch=BATCH, layers=LAYERS)
    per = LAYERS // stages
    split = {f"blocks.{i * per}": pipelining.SplitPoint.BEGINNING for i in range(1, stages)}
    pipe = pipelining.pipeline(model, mb_args=(x.chunk(MICROBATCHES)[0],), split_spec=split)
    stage = fsdp_stage(pipe, world) if fsdp else pipe.build_stage(rank, torch.device("cpu"))
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
    tracker = ShardedStorageTracker([*local_tensors(stage.submod, opt), *buffers, *inputs])
    with tracker:
        step()
    opt.zero_grad(set_to_none=True)
    return tracker.peak_bytes


def worker(rank: int, world: int, cases: list[str], port: int, out_dir: str) -> None:
    run_rank(rank, world, port, out_dir, lambda: {c: measure(rank, world, c) for c in cases})


if __name__ == "__main__":
    import torch.multiprocessing as mp

    schedules, world, port, out_dir = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn(worker, args=(world, schedules, port, out_dir), nprocs=world, join=True)
