"""The per-rank worker of tests/test_pipeline.py's gloo check: each of `world` processes builds its
pipeline stage of TinyGPT the way a user does with torch.distributed.pipelining (``pipeline`` split at the
blocks, ``build_stage``, ``ScheduleGPipe`` / ``Schedule1F1B``; for "fsdp:" cases the stage module
fully_shard-ed on a ("pp", "dp") mesh first, as torchtitan does), runs two AdamW steps over the real gloo
group, and measures the second one's live-storage peak with
`memviz.parallel.distributed.ShardedStorageTracker`.

The "tp:<schedule>" case is PP x TP as torchtitan writes it: a ("pp", "tp") mesh, the stage split from the
model by hand (`GPTStage`), a Megatron ``parallelize_module`` plan inside its blocks, torch's manual
``PipelineStage``; it trains unplanned and with memviz's per-stage plan applied first (`plan_file`'s name in
the output folder), and reports both measured peaks and the largest gradient difference between them.
"tpsp:<schedule>" is the same with sequence parallelism inside the stage (norms on sequence shards, the
residual stream split on the sequence from the stage's first block to its last)."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from distributed_worker import TP_PLANS, loss_of, run_rank, tiny_gpt
from torch import nn
from torch.distributed import pipelining

BATCH, LAYERS, MICROBATCHES = 4, 4, 4


#: stages of the "fsdp:<schedule>" and "tp:<schedule>" cases (the other world // PP_STAGES ranks of each stage
#: shard it)
PP_STAGES = 2
#: the "tp:" cases' TinyGPT input and micro-batches: a sequence long enough for activations to matter next
#: to the parameters and AdamW's state, so that a stage's plan has something to save
TP_SHAPE, TP_MICROBATCHES = {"batch": 4, "seq": 64}, 2
#: steps of a "tp:" run: the first creates AdamW's state and the stage's metadata; the peak is the smallest
#: of the others' (tests/rank_plan_worker.py's `train` says why)
TP_STEPS = 3


def recv_buffers(stage: pipelining.PipelineStage) -> list[torch.Tensor]:
    """The receive buffers torch's stage allocated once, per micro-batch: alive through every step."""
    return [r.buffer for infos in (stage.args_recv_info, stage.grad_recv_info) for recvs in infos.values()
            for r in recvs if not r.is_root_arg and isinstance(r.buffer, torch.Tensor)]


class GPTStage(nn.Module):
    """torchtitan's manual split of TinyGPT: stage `index` of `stages` keeps its run of blocks (and the
    embedding on the first stage, the final norm and head on the last) under the model's own paths."""

    def __init__(self, model: nn.Module, index: int, stages: int) -> None:
        super().__init__()
        per = len(model.blocks) // stages
        last = index == stages - 1
        self.wte = model.wte if index == 0 else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(index * per, (index + 1) * per)})
        self.ln_f, self.head = (model.ln_f, model.head) if last else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:
            x = self.wte(x)
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.ln_f(x)) if self.head is not None else x


def plan_file(kind: str, stage: int) -> str:
    """The name of memviz's plan for `stage` of the "tp" or "tpsp" cases, in the output folder."""
    return f"{kind}-stage{stage}.plan.json"


def tp_stage(model: nn.Module, world: int, sp: bool = False) -> pipelining.PipelineStage:
    """What a torchtitan user writes for PP x TP: this rank's `GPTStage` on a ("pp", "tp") mesh, the
    Megatron plan of every block over "tp" (`sp`: rank_plan_worker.user_wrap's sequence-parallel plan over
    the stage's blocks), the stage's sends and receives on the "pp" group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = world // PP_STAGES
    mesh = init_device_mesh("cpu", (PP_STAGES, tp), mesh_dim_names=("pp", "tp"))
    index = mesh["pp"].get_local_rank()
    stage = GPTStage(model, index, PP_STAGES)
    layers = list(stage.blocks.values())
    for i, block in enumerate(layers):
        block.attn.heads //= tp
        plan: dict[str, Any] = {}
        for k, v in TP_PLANS["gpt"].items():
            if v == "col":
                plan[k] = ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel()
            else:
                plan[k] = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
        if sp:
            plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel()})
        parallelize_module(block, mesh["tp"], plan)
        if sp and i == 0:
            parallelize_module(block, mesh["tp"], PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
        if sp and i == len(layers) - 1:
            parallelize_module(block, mesh["tp"], PrepareModuleOutput(
                output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))
    return pipelining.PipelineStage(stage, index, PP_STAGES, torch.device("cpu"),
                                    group=mesh["pp"].get_group())


def tp_train(model: nn.Module, x: torch.Tensor, world: int, schedule: str,
             sp: bool = False) -> tuple[list[list[torch.Tensor]], int]:
    """`TP_STEPS` AdamW steps of this rank's PP x TP stage (`sp`: sequence-parallel): each step's local
    gradients and the measured peak (the smallest after the first step)."""
    from memviz.parallel.distributed import ShardedStorageTracker, local, local_tensors

    stage = tp_stage(model, world, sp)
    cls = {"1f1b": pipelining.Schedule1F1B, "gpipe": pipelining.ScheduleGPipe}[schedule]
    sched = cls(stage, TP_MICROBATCHES, loss_fn=lambda out, _target: loss_of(out))
    opt = torch.optim.AdamW(stage.submod.parameters(), lr=1e-2)
    grads, peaks = [], []
    for _ in range(TP_STEPS):
        tracker = ShardedStorageTracker([*local_tensors(stage.submod, opt), *recv_buffers(stage),
                                         *([x] if stage.is_first else [])])
        with tracker:
            if stage.is_first:
                sched.step(x)
            elif stage.is_last:
                sched.step(target=torch.zeros(x.shape[0]))
            else:
                sched.step()
            opt.step()
        grads.append([local(p.grad).detach().clone() for p in stage.submod.parameters()])
        opt.zero_grad(set_to_none=True)
        peaks.append(tracker.peak_bytes)
    return grads, min(peaks[1:])


def tp_run(rank: int, world: int, kind: str, schedule: str, plan_dir: str) -> dict[str, Any]:
    """The unplanned and the planned (memviz's plan for this rank's stage applied, then split and wrapped)
    PP x TP runs on the gloo group; `kind` "tp" or "tpsp" (sequence-parallel)."""
    import memviz
    from memviz.runtime.apply import apply

    sp = kind == "tpsp"
    plan = memviz.load_plan(os.path.join(plan_dir, plan_file(kind, rank // (world // PP_STAGES))))
    model, (x,) = tiny_gpt(layers=LAYERS, **TP_SHAPE)
    reference, measured = tp_train(model, x, world, schedule, sp)
    model, (x,) = tiny_gpt(layers=LAYERS, **TP_SHAPE)
    planned, planned_measured = tp_train(apply(plan, model), x, world, schedule, sp)
    worst = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()
                for ref_step, plan_step in zip(reference, planned, strict=True)
                for a, b in zip(ref_step, plan_step, strict=True))
    return {"measured": measured, "planned_measured": planned_measured, "max_relative_grad_difference": worst}


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
    inputs = [x] if stage.is_first else []
    tracker = ShardedStorageTracker([*local_tensors(stage.submod, opt), *recv_buffers(stage), *inputs])
    with tracker:
        step()
    opt.zero_grad(set_to_none=True)
    return tracker.peak_bytes


def worker(rank: int, world: int, cases: list[str], port: int, out_dir: str) -> None:
    def case(c: str) -> Any:
        kind, _, schedule = c.rpartition(":")
        return tp_run(rank, world, kind, schedule, out_dir) if kind in ("tp", "tpsp") else \
            measure(rank, world, c)

    run_rank(rank, world, port, out_dir, lambda: {c: case(c) for c in cases})


if __name__ == "__main__":
    import torch.multiprocessing as mp

    schedules, world, port, out_dir = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn(worker, args=(world, schedules, port, out_dir), nprocs=world, join=True)
