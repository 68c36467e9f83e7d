"""One pipeline stage of a training step as a CD-graph (`memviz.profile(..., parallel=Parallel(pp=N))`).

The model is split the way ``torch.distributed.pipelining`` splits it: its tracing frontend
(``pipeline(model, mb_args, split_spec)``, torch.export underneath) cuts the repeated blocks
(`memviz.parallel.distributed.blocks_of`) into `pp` equal runs, ``SplitPoint.BEGINNING`` at each run's
first block, so stage 0 also holds what comes before the blocks (embeddings) and the last stage what comes
after (final norm, head, loss).  This process builds stage `rank` with ``Pipe.build_stage`` on PyTorch's
fake process group (the other stages' sends and receives allocate their buffers and move no data) and
runs torch's own schedule on it (``Schedule1F1B`` or ``ScheduleGPipe`` over `microbatches`
micro-batches), recorded operator by operator by `memviz.parallel.distributed._Recorder`.

So the schedule's in-flight micro-batches are in the per-rank graph as they happen, not scaled: under 1F1B
stage i runs ``min(pp - i, microbatches)`` forwards before its first backward (torch's warm-up, then one
backward before each further forward), so its peak holds that many micro-batches' saved activations
(Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
Sec. 2.2.1; Korthikanti et al. Sec. 4.2.3: the first stage holds ``pp`` micro-batches); under GPipe every
stage holds all `microbatches` (Huang et al., "GPipe", Sec. 2.2).  The activations a stage receives
and the gradients it receives for its outputs are the buffers of ``c10d.recv_``: kind ``communication``;
what it sends are its outputs and input gradients, held as torch's stage holds them.

With ``Parallel(fsdp=True)`` the ranks form a ("pp", "dp") DeviceMesh and this rank's stage module is
``fully_shard``-ed over its "dp" group, block by block and then whole, as torchtitan does (`shard_stage`);
torch's stage then accumulates unsharded gradients over the micro-batches and reduce-scatters them after the
last backward (``backward_maybe_with_nosync``, ``_PipelineStageBase.perform_reduce_grad``), all recorded as
it runs: sharded parameters, gradients and optimizer state, FSDP2's all-gather / reduce-scatter buffers and
unsharded parameters (``communication``), and the in-flight micro-batches.

With ``Parallel(tp=..., fsdp=False)`` (PP x TP) the ranks form a ("pp", "tp") mesh.  torch's traced stages
cannot be tensor-parallel (their views have the full head count and width baked in, and they hold no
``nn.Linear`` for ``parallelize_module``), so the stage is split as torchtitan splits it by hand, from the
model's own modules (`split_eager`: ``torch.fx`` with the blocks as leaf modules), its blocks tensor-parallel
over "tp" (`memviz.parallel.distributed.tensor_parallelize`), and run by torch's manual ``PipelineStage``
(`tensor_parallel_stage`).  Its blocks run eagerly, so a per-rank plan checkpoints them as under FSDP2 and
TP alone (`memviz.parallel.distributed_sac`, each stage's plan over its own blocks): on 4 gloo ranks (2
stages x tp 2, tests/test_pipeline.py) every rank measured exactly the predicted peak, planned and not, and
the planned gradients equalled the unplanned ones.  With ``sp=True`` each stage's residual stream is split on
the sequence between its first block and its last, checked the same way on 4 gloo ranks
(tests/test_pipeline.py, ``bench_pipeline``'s PP x TP rows).

What is absent: PP x TP x FSDP2 (3-D), PP x TP for models whose forward torch.fx cannot trace around
their blocks (Hugging Face's, whose mask and rotary set-up branch on values; `split_eager` refuses them
with the reason), interleaved / zero-bubble schedules, estimated (fake-tensor) stages, plans of torch's
traced stages (pipeline alone, PP x FSDP2), export (a recorded graph is no FX program), and the sends and
receives as compute nodes with a time: the fake group's point-to-point operations do not pass through the
dispatcher, so only their buffers are in the graph. On 2 gloo ranks (and on 4, PP x FSDP2) a stage measured
up to one micro-batch's hidden state (2048 B, +0.3%) above the prediction: a sent tensor held by its gloo
work until the schedule waits for it, which the fake group completes at once (our reading, not proven).
"""

from __future__ import annotations

import copy
import functools
import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from memviz.parallel.distributed import ParallelError, blocks_of, tensor_parallelize
from solvers import DataKind, Graph, Phase
from solvers.schedule import Schedule

__all__ = ["SCHEDULES", "in_flight_microbatches", "peak_live_bytes", "record_stage", "split_points"]

#: the schedules a `Parallel.schedule` names, by torch.distributed.pipelining class
SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}


def in_flight_microbatches(schedule: str, pp: int, stage: int, microbatches: int) -> int:
    """Micro-batches whose activations stage `stage` of `pp` holds at its peak: ``min(pp - stage,
    microbatches)`` under 1F1B (its warm-up forwards), all `microbatches` under GPipe."""
    if schedule == "gpipe":
        return microbatches
    return min(pp - stage, microbatches)


def split_points(model: nn.Module, pp: int) -> list[str]:
    """The blocks that begin stages 1 .. pp-1: `pp` equal runs of the model's blocks."""
    blocks = blocks_of(model)
    if len(blocks) < pp or len(blocks) % pp:
        raise ParallelError(f"pp={pp} stages need a block count divisible by pp; {type(model).__name__} has "
                            f"{len(blocks)} blocks")
    per = len(blocks) // pp
    return [blocks[i * per][0] for i in range(1, pp)]


def _microbatch(args: tuple[Any, ...], microbatches: int) -> tuple[Any, ...]:
    """The first micro-batch of `args` (each tensor chunked on dim 0, as the schedule splits them)."""
    def first(t: torch.Tensor) -> torch.Tensor:
        if t.shape[0] % microbatches:
            raise ParallelError(f"batch {t.shape[0]} does not split into {microbatches} micro-batches")
        return t.chunk(microbatches)[0]

    return pytree.tree_map_only(torch.Tensor, first, args)


def build_stage(model: nn.Module, args: tuple[Any, ...], parallel: Any,
                loss_fn: Callable[[Any], torch.Tensor],
                regions: list[dict[str, Any]] = ()) -> tuple[Any, Any]:
    """(stage, schedule) of rank `parallel.rank` on the initialised process group, through torch's pipelining
    frontend (module docstring), or under tensor parallelism through `tensor_parallel_stage`, with `regions`
    (`memviz.apply`'s plan specs) checkpointed.  The schedule's loss is `loss_fn` of each micro-batch's
    output."""
    from torch.distributed import pipelining

    if parallel.tp > 1:
        stage = tensor_parallel_stage(model, args, parallel, regions)
    else:
        split_spec = {name: pipelining.SplitPoint.BEGINNING for name in split_points(model, parallel.pp)}
        # the frontend patches the forward of each split block in place, for good: a copy keeps the user's
        # model as it was (a second split of the same model recursed through the first one's patches)
        pipe = pipelining.pipeline(copy.deepcopy(model), mb_args=_microbatch(args, parallel.microbatches),
                                   split_spec=split_spec)
        if parallel.fsdp:
            index, group = shard_stage(pipe, model, parallel)
            stage = pipe.build_stage(index, torch.device("cpu"), group)
        else:
            stage = pipe.build_stage(parallel.rank, torch.device("cpu"))
    schedule_cls = getattr(pipelining, SCHEDULES[parallel.schedule])
    schedule = schedule_cls(stage, parallel.microbatches, loss_fn=lambda out, _target: loss_fn(out))
    return stage, schedule


def stage_blocks(model: nn.Module, pp: int, index: int) -> list[str]:
    """Module paths of the blocks stage `index` of `pp` runs (`split_points`' equal runs)."""
    names = [name for name, _ in blocks_of(model)]
    per = len(names) // pp
    return names[index * per:(index + 1) * per]


def stage_index(parallel: Any) -> int:
    """The stage rank `parallel.rank` runs: ranks form a (pp, world / pp) mesh, row by row."""
    return parallel.rank // (parallel.world_size // parallel.pp)


def split_eager(model: nn.Module, pp: int) -> list[Any]:
    """`model` traced by ``torch.fx`` with its blocks as leaf modules and split at `split_points` into its
    `pp` stages (``torch.fx.passes.split_module``).  Each stage is a GraphModule that calls the model's own
    modules (the same objects, under their paths in the model), so the blocks run eagerly:
    ``parallelize_module`` shards their ``nn.Linear`` layers and their forwards take the local widths from
    their tensors, which torch's export-traced stages (fixed full-width views) cannot.  This is torchtitan's
    manual split, made from the model's forward instead of by hand."""
    from torch import fx
    from torch.fx.passes.split_module import split_module

    starts = set(split_points(model, pp))
    leaves = {id(m) for _, m in blocks_of(model)}

    class BlockLeaves(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return id(m) in leaves or super().is_leaf_module(m, qualname)

    try:
        traced = fx.GraphModule(model, BlockLeaves().trace(model))
    except Exception as err:  # fx raises TraceError, TypeError, AttributeError ... on Python it cannot trace
        raise ParallelError(f"pipeline x tensor parallelism splits the model with torch.fx (blocks as leaf "
                            f"modules); {type(model).__name__}'s forward does not trace: {err}") from err
    stage_of, current = {}, 0
    for node in traced.graph.nodes:
        current += node.op == "call_module" and node.target in starts
        stage_of[node] = current
    split = split_module(traced, model, lambda node: stage_of[node])
    calls = [n for n in split.graph.nodes if n.op == "call_module"]
    if len(calls) != pp or any(node.args != (prev,) for prev, node in zip(calls, calls[1:], strict=False)):
        raise ParallelError(f"pipeline x tensor parallelism: {type(model).__name__}'s stages pass more than "
                            "one tensor from stage to stage (the hidden state); memviz splits no other")
    return [_with_model_paths(getattr(split, node.target), model) for node in calls]


def _with_model_paths(stage: Any, model: nn.Module) -> Any:
    """`stage` (a GraphModule of ``split_module``, which names the modules it calls ``blocks_0``) rebuilt
    over the same modules and tensors under their paths in `model` (``blocks.0``): a plan's regions, the
    recorded graph's module names (``TinyGPT.blocks.0``: the class is named after the model's) and the
    user's own stage modules all use the model's paths."""
    from torch import fx

    paths = {id(m): n for n, m in model.named_modules()}
    paths.update({id(t): n for n, t in (*model.named_parameters(), *model.named_buffers())})
    owned: dict[str, Any] = {}
    for node in stage.graph.nodes:
        if node.op in ("call_module", "get_attr"):
            obj = functools.reduce(getattr, node.target.split("."), stage)
            if id(obj) not in paths:
                raise ParallelError(f"pipeline x tensor parallelism: the traced stage holds {node.target}, "
                                    f"which is no module, parameter or buffer of {type(model).__name__}")
            node.target = paths[id(obj)]
            owned[node.target] = obj
    return fx.GraphModule(owned, stage.graph, class_name=type(model).__name__)


def tensor_parallel_stage(model: nn.Module, args: tuple[Any, ...], parallel: Any,
                          regions: list[dict[str, Any]] = ()) -> Any:
    """PP x TP on the initialised (fake) group: a ("pp", "tp") DeviceMesh, this rank's stage (its coordinate
    on "pp") split from a copy of `model` by `split_eager`, `regions` checkpointed, tensor parallelism inside
    the stage's blocks over "tp" (`memviz.parallel.distributed.tensor_parallelize`: with sequence
    parallelism the stage's residual stream is whole at its ends), and torch's manual ``PipelineStage`` over
    "pp" with its input and output shapes given (static metadata: the fake group carries no metadata
    messages, and with them every stage votes static, so the warm-up vote is answered here)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage

    from memviz.runtime.apply import wrap

    work = copy.deepcopy(model)
    for spec in regions:
        wrap(work.get_submodule(spec["module"]), spec)
    mesh = init_device_mesh("cpu", (parallel.pp, parallel.tp), mesh_dim_names=("pp", "tp"))
    index = mesh["pp"].get_local_rank()
    stages = split_eager(work, parallel.pp)
    inputs, outputs = _stage_examples(stages, args, parallel.microbatches, index)
    module = stages[index]
    tensor_parallelize([module.get_submodule(n) for n in stage_blocks(model, parallel.pp, index)], mesh["tp"],
                       parallel)
    stage = PipelineStage(module, index, parallel.pp, torch.device("cpu"), input_args=inputs,
                          output_args=outputs, group=mesh["pp"].get_group())
    static = torch.ones(1, dtype=torch.int32)
    stage._warmup_forward_vote = lambda has_backward, received_acc=None: static
    stage._warmup_backward_result = lambda received_result=None: static
    return stage


def _stage_examples(stages: list[Any], args: tuple[Any, ...], microbatches: int,
                    index: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Stage `index`'s input and output for the first micro-batch (the unsharded stages run in turn, without
    autograd), on the meta device, marked as the schedule's are (a received activation is a leaf its
    backward differentiates)."""
    x = _microbatch(args, microbatches)
    with torch.no_grad():
        for i in range(index + 1):
            inputs, x = x, stages[i](*x)
            x = tuple(pytree.tree_leaves(x))

    def meta(t: torch.Tensor, grad: bool) -> torch.Tensor:
        return torch.empty_like(t, device="meta").requires_grad_(grad and t.is_floating_point())

    return tuple(meta(t, index > 0) for t in inputs), tuple(meta(t, True) for t in x)


def shard_stage(pipe: Any, model: nn.Module, parallel: Any) -> tuple[int, Any]:
    """torchtitan's PP x FSDP2 on torch's split: a ("pp", "dp") DeviceMesh over the initialised group, this
    rank's stage module (its coordinate on "pp") ``fully_shard``-ed over its "dp" group, block by block (the
    stage keeps the model's module paths) and then whole, with `parallel.reshard_after_forward` for the
    blocks.  Returns (stage index, the "pp" group its sends and receives use)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (parallel.pp, parallel.dp), mesh_dim_names=("pp", "dp"))
    index = mesh["pp"].get_local_rank()
    module = pipe.get_stage_module(index)
    for name in stage_blocks(model, parallel.pp, index):
        fully_shard(module.get_submodule(name), mesh=mesh["dp"],
                    reshard_after_forward=parallel.reshard_after_forward)
    fully_shard(module, mesh=mesh["dp"])
    return index, mesh["pp"].get_group()


def stage_step(stage: Any, schedule: Any, args: tuple[Any, ...], opt: torch.optim.Optimizer | None,
               phase: Callable[[Phase], None] = lambda p: None) -> Callable[[], None]:
    """One training step of this stage as its rank runs it: the schedule's forwards and backwards (the
    first stage feeds `args`, the last computes the loss against a placeholder target that only gives the
    micro-batch count), then the optimizer.  `phase` is told when each micro-batch's forward or backward
    starts, and when the optimizer does."""
    batch = pytree.tree_leaves(args)[0].shape[0]

    def forward(*a: Any, **k: Any) -> Any:
        phase(Phase.FORWARD)
        return forward_one_chunk(*a, **k)

    def backward(*a: Any, **k: Any) -> Any:
        phase(Phase.BACKWARD)
        return backward_one_chunk(*a, **k)

    forward_one_chunk, backward_one_chunk = stage.forward_one_chunk, stage.backward_one_chunk

    def step() -> None:
        stage.forward_one_chunk, stage.backward_one_chunk = forward, backward
        try:
            if stage.is_first:
                schedule.step(*args)
            elif stage.is_last:
                schedule.step(target=torch.zeros(batch))
            else:
                schedule.step()
        finally:
            del stage.forward_one_chunk, stage.backward_one_chunk
        if opt is not None:
            phase(Phase.OPTIMIZER)
            opt.step()

    return step


def record_stage(model: nn.Module, args: tuple[Any, ...], parallel: Any, *,
                 loss_fn: Callable[[Any], torch.Tensor], optimizer: Any, regions: list[dict[str, Any]] = (),
                 quick: bool = False) -> tuple[Graph, Schedule, int | None]:
    """`memviz.parallel.distributed.record_step` for one pipeline stage: (graph, schedule as it ran, the
    live-storage peak of a second, unrecorded step of the same stage; None with `quick`, the per-rank
    planner's candidates).  A first step runs unrecorded (the optimizer's state, the stage's lazy
    initialisation: shape inference and its receive metadata).  `regions`: a plan's checkpointed blocks
    (pipeline x tensor parallelism only, `build_stage`)."""
    from memviz.parallel.distributed import (
        ShardedStorageTracker,
        _Recorder,
        _resize_hook,
        _sources,
        _unrecorded_sharding_propagation,
        _zero,
        fake_process_group,
        local,
        local_tensors,
        make_optimizer,
        recorded_graph,
    )

    with fake_process_group(parallel.world_size, parallel.rank), torch.random.fork_rng():
        stage, schedule = build_stage(model, args, parallel, loss_fn, regions)
        opt = make_optimizer(optimizer, stage.submod)
        feed = args if stage.is_first else ()
        stage_step(stage, schedule, args, opt)()
        _zero(stage.submod, opt)
        gc.collect()
        rec = _Recorder({**_sources(stage.submod, feed, None, opt), "communication": recv_buffers(stage)})
        # FSDP2's unsharded parameters and gradients are storages it resizes (record_step's hooks)
        with rec.modules, _resize_hook(rec._resized), _unrecorded_sharding_propagation(rec), rec:
            stage_step(stage, schedule, args, opt, phase=lambda p: setattr(rec, "phase", p))()
        held = [local(p.grad).untyped_storage()._cdata for p in stage.submod.parameters()
                if p.grad is not None]
        grads = {rec.alive[k] for k in held if k in rec.alive}
        graph, recorded = recorded_graph(rec, type(model).__name__, grads)
        _zero(stage.submod, opt)
        if quick:
            return graph, recorded, None
        gc.collect()
        tracker = ShardedStorageTracker([*local_tensors(stage.submod, *([opt] if opt is not None else [])),
                                         *pytree.tree_leaves(feed), *(t for _, t in recv_buffers(stage))])
        with tracker:
            stage_step(stage, schedule, args, opt)()
        _zero(stage.submod, opt)
    return graph, recorded, tracker.peak_bytes


def recv_buffers(stage: Any) -> list[tuple[str, torch.Tensor]]:
    """The stage's receive buffers: one per micro-batch for each activation it receives from the previous
    stage (the stage's input, kept as the autograd leaf its backward differentiates) and for each gradient
    it receives from the next stage.  torch's stage allocates them once (``_make_tensor_from_meta``) and
    ``irecv`` writes into them every step, so they live through the whole step."""
    found = []
    for kind, infos in (("activation", stage.args_recv_info), ("gradient", stage.grad_recv_info)):
        for chunk, recvs in infos.items():
            found += [(f"recv {kind} {chunk}.{i}", r.buffer) for i, r in enumerate(recvs)
                      if not r.is_root_arg and isinstance(r.buffer, torch.Tensor)]
    return found


def peak_live_bytes(graph: Graph, schedule: Schedule, kind: DataKind = DataKind.SAVED) -> int:
    """The most bytes of `kind` alive at once over `schedule` (a stage's saved activations at their peak:
    its in-flight micro-batches)."""
    live = peak = 0
    for step in schedule:
        if step.op == "compute":
            live += sum(graph.datas[d].bytes for d in graph.computes[step.node].outputs
                        if graph.datas[d].kind is kind)
            peak = max(peak, live)
        elif graph.datas[step.node].kind is kind:
            live -= graph.datas[step.node].bytes
    return peak
