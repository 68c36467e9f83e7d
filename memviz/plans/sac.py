"""`memviz.plan(prof, budget, strategy="sac")`: plans PyTorch's own selective activation checkpointing
can run, and the conversion of other plans into that form.

A SAC plan checkpoints whole module calls (the children of the model's outermost ModuleList /
Sequential: the repeated blocks) and, inside each, saves the outputs of a chosen set of ops
(MUST_SAVE) and recomputes the rest.  Its schedule is `solvers.sac.sac_schedule`: the order and the
frees non-reentrant checkpointing really has, so the plan's timeline is what `memviz.apply` runs.
The per-block options are Rockmate's option menus (Sec. 4) reduced to what a per-op policy expresses.
The menu's time counts what checkpointing itself costs on the device (`overheads`: measured at profile
time on one of the model's blocks by `checkpoint_costs`, so a plan is a function of its profile and
budget): the selective policy is Python in every op a region dispatches.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import statistics
import time
import warnings
from typing import Any

from solvers import DataKind, Graph, Phase, simulate
from solvers.ir import PERSISTENT_KINDS
from solvers.result import InfeasibleBudget, SolverStats
from solvers.sac import Block, EagerHolds, Overheads, Region, calibrate, sac_schedule, solve_menu

#: ops whose eager dispatch matches the captured graph one for one (same ATen op, once per graph
#: node), so a policy can count them: the only ones a SAC plan may mark MUST_SAVE
ATTENTION = frozenset({"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"})
MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution"}) | ATTENTION
#: `_safe_softmax`: the softmax of PyTorch's math attention (CPU with dropout), dispatched as it is
MATCHABLE = MATMULS | {"native_layer_norm", "_softmax", "_safe_softmax", "gelu"}
EXPRESSIBLE = ("sac", "none")


def op_name(op: str) -> str:
    """'aten.addmm.default' -> 'addmm'; an in-place variant ('aten.relu_.default') names its op."""
    parts = op.split(".")
    base = parts[1] if len(parts) >= 3 else parts[0]
    return base[:-1] if base.endswith("_") and not base.endswith("__") else base


def policy(save: dict[str, frozenset[int]], seen: dict[str, int], ctx: Any, func: Any, *args: Any,
           **kwargs: Any) -> Any:
    """The selective policy `memviz.apply` runs in a region (``create_selective_checkpoint_contexts``):
    MUST_SAVE for the plan's kept ops (`save`: op name -> occurrences in this region call), else
    recompute; `seen` counts the countable ops so far.  Called once per op of the forward, in order (the
    recomputation replays the cache, not the policy).  It runs on every dispatched op of a selective
    region (views included), so an op no plan keeps costs one dict lookup."""
    from torch.utils.checkpoint import CheckpointPolicy

    name = _COUNTABLE.get(func, _UNSEEN)
    if name is _UNSEEN:
        name = _COUNTABLE[func] = _countable(func)
    if name is None:
        return CheckpointPolicy.PREFER_RECOMPUTE
    k = seen.get(name, 0)
    seen[name] = k + 1
    kept = save.get(name)
    return CheckpointPolicy.MUST_SAVE if kept is not None and k in kept else CheckpointPolicy.PREFER_RECOMPUTE


#: operator overload -> its `op_name` when a plan may keep it (MATCHABLE), else None
_COUNTABLE: dict[Any, str | None] = {}
_UNSEEN = object()


def _countable(func: Any) -> str | None:
    name = op_name(str(func))
    return name if name in MATCHABLE else None


def dispatched_counts(cap: Any, graph: Graph) -> dict[int, int]:
    """Forward compute id -> how many operators the dispatcher runs for it: the captured FX program's
    calls (views, detaches, ... are no graph nodes) folded into the next compute node of the forward;
    a selective policy's dispatch modes run once per dispatched operator."""
    position = {fx: c for c, fx in enumerate(cap.compute_fx) if fx is not None}
    counts: dict[int, int] = {}
    pending = 0
    for node in cap.gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        c = position.get(node.name)
        if c is None:
            pending += 1
        elif c < len(graph.computes) and graph.computes[c].phase is Phase.FORWARD:
            counts[c], pending = 1 + pending, 0
        else:
            pending = 0
    return counts


#: the version of the checkpointing costs a profile holds (``graph.meta["sac_costs"]``); a profile without
#: them (or of another version) plans with none counted
COSTS_VERSION = 2
#: seconds `checkpoint_costs` may spend timing a block beyond its first `COST_ROUNDS` rounds, and its most
#: rounds: a transformer block of bench_apply's runs in 10-20 ms on one CPU thread, so about 21 rounds;
#: the floor keeps a profile of a slow model short (every training profile pays it)
COST_BUDGET_S = 1.0
COST_ROUNDS = 3
COST_MAX_ROUNDS = 21


def checkpoint_costs(graph: Graph, cap: Any, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                     device: Any, repeats: int, warmup: int) -> dict[str, Any]:
    """What `memviz.apply`'s checkpointing costs on `device` beyond the ops it runs, measured at profile
    time (`memviz.profile`) so a sac plan is a function of its profile: the model's first checkpointable
    block (`candidate_blocks`) with the arguments it gets in one eager forward (its KV cache off, as apply
    runs a checkpointed layer), run alone (forward and backward of the sum of its outputs) as it is,
    checkpointed by `memviz.apply` keeping nothing, keeping its matmuls through the policy, and (when it
    has any) with its elementwise pieces checkpointed alone (`candidate_blocks`); medians
    of interleaved rounds (`COST_ROUNDS` at least, more within `COST_BUDGET_S`; one round with
    ``repeats=1``), turned into per-operator costs by `solvers.sac.calibrate`.  The model, its buffers
    and the RNG streams are left as they were.  Graph metadata (plain numbers, saved with plans); empty
    when the model has no checkpointable block."""
    import copy

    import torch
    import torch.utils._pytree as pytree

    from memviz.hardware import accelerator
    from memviz.profiling.capture import buffers_kept
    from memviz.runtime.apply import ApplyWarning, _without_cache, unwrap, wrap

    blocks = candidate_blocks(model, graph, cap)
    if not blocks:
        return {}
    block = blocks[0]
    path, ids, pieces = block.name, block.nodes, block.pieces
    # the policy's cost needs a region that keeps something: its matmuls, else its first countable op
    keep = block.matmuls or frozenset(sorted(block.matchable)[:1])
    full, selective = Region(path, ids, held=block.held), Region(path, ids, keep, block.held)
    piece_regions = [Region(p, p_ids) for p, p_ids in pieces]
    called: list[tuple[Any, Any]] = []
    handle = model.get_submodule(path).register_forward_pre_hook(
        lambda _m, a, k: called.append((a, k)) if not called else None, with_kwargs=True)
    devices = accelerator.as_list(device)
    try:
        with buffers_kept(model), accelerator.fork_rng(devices), torch.enable_grad():
            model(*args, **(kwargs or {}))
    finally:
        handle.remove()
    # without a KV cache, as apply runs a checkpointed layer (the runs would append to one cache object)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ApplyWarning)
        uncached = _without_cache(model.get_submodule(path), {}, *called[0])
    block_args = pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().requires_grad_(t.requires_grad and t.is_floating_point()),
        uncached)
    leaves = [t for t in pytree.tree_leaves(block_args) if isinstance(t, torch.Tensor) and t.requires_grad]
    runs = {"eager": copy.deepcopy(model.get_submodule(path))}
    for name, region in (("full", full), ("selective", selective)):
        runs[name] = copy.deepcopy(runs["eager"])
        wrap(runs[name], region_specs(graph, [region])[0])
    if piece_regions:  # each elementwise piece checkpointed alone: what a checkpoint call costs
        runs["pointwise"] = copy.deepcopy(runs["eager"])
        for spec in region_specs(graph, piece_regions):
            wrap(runs["pointwise"].get_submodule(spec["module"][len(path) + 1:]), spec)

    def step(module: Any) -> None:
        for t in (*leaves, *module.parameters()):
            t.grad = None
        out = module(*block_args[0], **block_args[1])
        grads = [t.sum() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if grads:
            torch.stack(grads).sum().backward()

    times: dict[str, list[float]] = {name: [] for name in runs}
    least = COST_ROUNDS if repeats > 1 else 1
    with warnings.catch_warnings(), accelerator.fork_rng(devices):
        warnings.simplefilter("ignore", ApplyWarning)  # the cache turned off: apply says so when it runs
        for _ in range(max(1, warmup)):
            for module in runs.values():
                step(module)
        start = time.perf_counter()
        while len(times["eager"]) < least or (len(times["eager"]) < COST_MAX_ROUNDS and repeats > 1
                                              and time.perf_counter() - start < COST_BUDGET_S):
            for name, module in runs.items():  # interleaved: a burst of load slows all three alike
                times[name].append(accelerator.timed(functools.partial(step, module), device)[0])
    # a wrapped module holds its checkpointed forward bound to itself: a reference cycle that kept the
    # copies (and the gradients of their last step) allocated until Python's next collection, 49 MiB of
    # one GPT-2 block's copies on a GPU in every step that `memviz.export(verify=True)` measured
    for module in runs.values():
        unwrap(module)
    runs.clear()
    median = {name: statistics.median(v) for name, v in times.items()}
    costs = calibrate(graph, full, selective, eager_holds(cap, graph), dispatched_counts(cap, graph),
                      eager_s=median["eager"], full_s=median["full"], selective_s=median["selective"],
                      pieces=piece_regions, pieces_s=median.get("pointwise"))
    return {"sac_costs": COSTS_VERSION, "sac_rerun_s": costs.rerun, "sac_policy_s": costs.policy,
            "sac_scale": costs.scale, "sac_region_s": costs.region,
            "sac_block": path, "sac_block_eager_s": median["eager"], "sac_block_full_s": median["full"],
            "sac_block_selective_s": median["selective"],
            **({"sac_block_pointwise_s": median["pointwise"]} if "pointwise" in median else {})}


def overheads(prof: Any, graph: Graph) -> Overheads:
    """`solvers.sac.Overheads` of a profile: the per-operator costs `checkpoint_costs` measured when it was
    made (in `graph`'s metadata), with its capture's dispatched-operator counts; none when not measured
    (an estimated device, ``measure=False``, a profile from before they were, a model with no block)."""
    meta = graph.meta
    if meta.get("sac_costs") != COSTS_VERSION:
        return Overheads()
    # no ``sac_scale`` (a profile from before it was measured): its costs were calibrated at scale 1
    return Overheads(_seconds(meta.get("sac_rerun_s")), _seconds(meta.get("sac_policy_s")),
                     dispatched_counts(prof.captured, graph), _seconds(meta.get("sac_scale")) or 1.0,
                     _seconds(meta.get("sac_region_s")))


def time_ratio(plan: Any) -> float:
    """A sac plan's predicted step time over eager's, as `memviz.apply` runs it: the schedule's op times
    plus checkpointing's own costs (``overhead_s``), over the baseline's, each plus what eager PyTorch
    spends per step beyond its ops (``eager_fixed_s``, measured at profile time, as
    `memviz.plans.planning.fixed_costs` counts it: the recomputation's costs were calibrated against the
    same op times, `checkpoint_costs`).  A compiled plan's is its prediction from the measured compiled
    steps (`memviz.plans.compiled`)."""
    from memviz.plans.planning import _finite, fixed_costs

    sac = plan.solver_stats.extra.get("sac")
    compiled = sac.get("compiled") if isinstance(sac, dict) else None
    if isinstance(compiled, dict) and _seconds(compiled.get("predicted_ratio")) > 0:
        return float(compiled["predicted_ratio"])  # priced from the measured compiled steps
    fixed = fixed_costs(plan.graph, plan.baseline.total_time)["eager_fixed_s"]
    # below 0 where the recomputed ops ran faster in step than timed alone (`solvers.sac.Overheads.scale`)
    extra = max(_finite(sac.get("overhead_s") if isinstance(sac, dict) else None),
                plan.baseline.total_time - plan.timeline.total_time)  # never faster than recomputing nothing
    eager = plan.baseline.total_time + fixed
    return (plan.timeline.total_time + extra + fixed) / eager if eager > 0 else 1.0


def _seconds(value: Any) -> float:
    """A duration read from a plan (a loaded one is untrusted): a finite non-negative number, else 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    return float(value) if math.isfinite(value) and value >= 0 else 0.0


def eager_holds(cap: Any, graph: Graph) -> EagerHolds:
    """What eager PyTorch holds beyond the joint graph's reads, from the capture: Python locals, module
    arguments and what the model keeps across calls (to the end of `graph`'s step, the optimizer's
    update included: `memviz.profile`), and per forward op what its autograd node saves and when that
    node's backward runs (`memviz.profiling.saved.autograd_nodes`, the walk the eager baseline's holds come
    from)."""
    from memviz.profiling.composite import composite_holds
    from memviz.profiling.profile import (
        autocast_cache_holds,
        kept_holds,
        module_argument_holds,
        python_local_holds,
    )
    from memviz.profiling.saved import autograd_nodes, gradient_input_holds

    local = python_local_holds(cap)
    # autocast's cache: the parameters with a gradient are those that require grad
    cached = autocast_cache_holds(cap, set(cap.grad_data), graph)
    for extra in (module_argument_holds(cap), gradient_input_holds(cap), kept_holds(cap, graph), cached,
                  composite_holds(cap)):
        for d, at in extra.items():
            local[d] = max(local.get(d, -1), at)
    walk = autograd_nodes(cap)
    release = {c: walk.released[s] for c, s in walk.savers.items() if s in walk.released}
    unpack = {c: walk.first.get(walk.savers[c], r) for c, r in release.items()}
    return EagerHolds(local, {d: tuple(sorted(set(cs))) for d, cs in walk.saved_by.items()}, release, unpack)


def candidate_blocks(model: Any, graph: Graph, cap: Any) -> list[Block]:
    """Each checkpointable block: the children of the outermost ModuleList / Sequential containers whose
    two or more ops ran as one contiguous call, with their matmul-class ops, the ops a policy can match
    ("matchable" keeps them: `MATCHABLE`), and their elementwise sub-modules ("pointwise" checkpoints each
    alone: `_pieces`).  What eager PyTorch writes in place (`in_place_writes`, from the capture `cap`)
    narrows them: a block with an input some op overwrites is no candidate (checkpointing keeps its
    inputs and refuses to unpack one whose version moved: ``nn.ReLU(inplace=True)`` as a block's first
    op), and an op whose output is overwritten later is never kept (the policy's cache refuses a mutated
    entry: ``allow_cache_entry_mutation``)."""
    from memviz.profiling.capture import block_paths

    mutated = frozenset(in_place_writes(cap, graph).values())
    forward = [c for c in graph.computes if c.phase is Phase.FORWARD]
    blocks = []
    for path in block_paths(model):
        ids = _call_ids(forward, path)
        if ids is None or _input_overwritten(graph, ids, mutated):
            # one op: nothing to gain; not contiguous: called twice, not one checkpoint frame
            continue
        names = {i: op_name(graph.computes[i].op) for i in ids}
        keepable = [i for i in ids if mutated.isdisjoint(graph.computes[i].outputs)]
        blocks.append(Block(path, ids, frozenset(i for i in keepable if names[i] in MATMULS),
                            frozenset(i for i in keepable if names[i] in MATCHABLE),
                            _pieces(model, graph, forward, path, mutated), _call_held(graph, cap, path, ids)))
    return blocks


def _call_held(graph: Graph, cap: Any, path: str, ids: tuple[int, ...]) -> frozenset[int]:
    """The data nodes block `path`'s call gets as arguments (`Captured.call_args`) that none of its ops
    `ids` reads: checkpointing keeps them until the block's backward all the same (Gemma's decoder layers
    get ``position_ids``, which only the model's rotary embedding reads: 120-128 B over the plan)."""
    read = {d for i in ids for d in graph.computes[i].inputs}
    names = getattr(cap, "call_args", {}).get(path, ())
    return frozenset(d for n in names if (d := cap.data_of_fx.get(cap.reads_instead.get(n, n))) is not None
                     and d not in read)


def in_place_writes(cap: Any, graph: Graph) -> dict[int, int]:
    """Forward compute id -> the data node eager PyTorch overwrites when it runs that op's source: the
    capture is functionalized (``hardswish_(x)`` became ``clone(x)`` and ``hardswish(x)``), so the op the
    model ran is read from the FX provenance (``node.meta["from_node"]``, its first record: the exported
    program's node), and what it overwrites is its first argument (an in-place op's ``self``).  Buffers
    written in place (BatchNorm's ``num_batches_tracked``) count too."""
    from memviz.profiling.capture import is_in_place, origin_op

    writes = {}
    for c, fx in enumerate(cap.compute_fx):
        if fx is None or c >= len(graph.computes) or graph.computes[c].phase is not Phase.FORWARD:
            continue
        origin = origin_op(cap.nodes[fx])
        written = _first_argument_data(cap, fx)
        if origin is not None and is_in_place(origin) and written is not None:
            writes[c] = written
    return writes


def _first_argument_data(cap: Any, fx: str) -> int | None:
    """The data node of FX node `fx`'s first tensor argument (what an in-place op or a ``copy_``
    writes), read where eager reads it (`Captured.reads_instead`); None when it has none."""
    first = next((a for a in cap.nodes[fx].args if hasattr(a, "name")), None)
    return None if first is None else cap.data_of_fx.get(cap.reads_instead.get(first.name, first.name))


def backward_copies(cap: Any, graph: Graph) -> dict[int, int]:
    """Backward compute id -> the data node eager autograd overwrites when it runs that op: each
    ``aten.copy`` of the backward is a ``copy_`` the functionalized capture names apart from its
    destination (its first argument).  Autograd's ``CopySlices``, the backward of an in-place op on a
    view (``relu_`` on the view ``nn.Linear`` makes of a 4-d input: Swin-V2's continuous position bias
    MLP), runs ``result = grad.new_empty_strided(...); result.copy_(grad)``, then the op's own backward
    on a clone of the view's slice and ``copy_`` of its gradient back into ``result``: one storage where
    the graph held three (the eager baseline was one activation over the measured step there)."""
    writes = {}
    for c, fx in enumerate(cap.compute_fx):
        if fx is None or c >= len(graph.computes):
            continue
        node = graph.computes[c]
        if node.phase is not Phase.BACKWARD or node.op != "aten.copy.default":
            continue
        written = _first_argument_data(cap, fx)
        if written is not None:
            writes[c] = written
    return writes


def written_in_place(graph: Graph, cap: Any) -> Graph:
    """`graph` with the result of each in-place activation eager PyTorch runs (``relu_(x)``,
    ``hardswish_(x)``, `in_place_writes`) held in the storage it overwrites (`DataNode.in_place_of`), as
    eager and `memviz.apply` (eager autograd, checkpointed or not) run it; the functionalized capture's
    result is a second tensor, which `memviz.export` runs in place only where its schedule frees the
    input right after (`reusable_in_place`).  `graph` itself when there is none."""
    marks = _in_place_results(graph, cap)
    if not marks:
        return graph
    datas = tuple(dataclasses.replace(d, in_place_of=marks[d.id]) if d.id in marks else d
                  for d in graph.datas)
    return Graph(graph.computes, datas, graph.outputs, name=graph.name, meta=graph.meta)


def reusable_in_place(graph: Graph, cap: Any) -> Graph:
    """`graph` (the functional one `memviz.export` runs) with each in-place activation's result marked
    as one that may take over the storage it overwrote in eager (`DataNode.reuses`): where the plan's
    schedule frees that input right after the op (`solvers.simulate.reused_in_place`), the exported step
    runs the op in place, as eager does (out-of-place ReLUs and residual adds cost the example ResNet's
    exported eager schedule 1-5% of its step: a fresh activation-sized storage per op).  Only where
    the in-place form reads nothing else of that storage, and the storage is an activation of the step
    (not the user's input or one of the model's outputs, which the caller still holds)."""
    from memviz.profiling.capture import in_place_op

    outputs = set(graph.outputs) | set(getattr(cap, "output_data", {}).values())
    marks = {}
    for out, written in _in_place_results(graph, cap).items():
        c = graph.datas[out].producer
        node = cap.nodes[cap.compute_fx[c]]
        others = [cap.data_of_fx.get(cap.reads_instead.get(a.name, a.name)) for a in node.args[1:]
                  if hasattr(a, "name")]
        if (written in outputs or graph.datas[written].kind not in (DataKind.ACTIVATION, DataKind.SAVED)
                or written in others or in_place_op(node) is None):
            continue
        marks[out] = written
    if not marks:
        return graph
    datas = tuple(dataclasses.replace(d, reuses=marks[d.id]) if d.id in marks else d for d in graph.datas)
    return Graph(graph.computes, datas, graph.outputs, name=graph.name, meta=graph.meta)


def _in_place_results(graph: Graph, cap: Any) -> dict[int, int]:
    """Result data node -> the data node eager overwrites to make it (`in_place_writes`): only the op
    itself writes (not autograd's copy of its input, ``clone``: `memviz.profiling.saved`), into an
    activation of its own size."""
    from memviz.profiling.capture import origin_op

    marks = {}
    for c, written in {**in_place_writes(cap, graph), **backward_copies(cap, graph)}.items():
        node = graph.computes[c]
        origin = (origin_op(cap.nodes[cap.compute_fx[c]]) or "").split(".")
        # 'aten.relu_.default' ran as 'aten.relu.default'
        if len(node.outputs) != 1 or (node.phase is Phase.FORWARD and (
                len(origin) < 3 or node.op.split(".")[:2] != [origin[0], origin[1][:-1]])):
            continue
        out = node.outputs[0]
        if graph.datas[written].kind in PERSISTENT_KINDS or _size(graph, out) != _size(graph, written):
            continue  # (a buffer's count, BatchNorm's ``num_batches_tracked``, is no activation)
        if any(u > c for u in graph.consumers(written)):
            # the functionalized graph still reads the value as it was before the write (HF's
            # ``shift_tokens_right``: ``copy_`` into a slice of ``new_zeros``, then ``slice_scatter`` reads
            # the zeros): those are not one storage
            continue
        marks[out] = written
    return marks


def _size(graph: Graph, d: int) -> int:
    return graph.datas[d].bytes


def eager_graph(graph: Graph, cap: Any) -> Graph:
    """The graph eager autograd runs (the profile's baseline, `memviz.apply`'s plans): gradient sums out
    of place (`memviz.profiling.capture.summed_as_eager`) and in-place activations in the storage they
    overwrite (`written_in_place`)."""
    from memviz.profiling.capture import summed_as_eager
    from memviz.profiling.composite import with_dropped_results

    return with_dropped_results(written_in_place(summed_as_eager(graph), cap), cap)


def _input_overwritten(graph: Graph, ids: tuple[int, ...], mutated: frozenset[int]) -> bool:
    """Whether a value the ops `ids` read from outside them (not a parameter's or a buffer's: apply puts
    a region's buffers back itself) is overwritten in place by some op (`in_place_writes`)."""
    inside = set(ids)
    return any(d in mutated and graph.datas[d].producer not in inside
               and graph.datas[d].kind not in (DataKind.PARAMETER, DataKind.BUFFER)
               for i in ids for d in graph.computes[i].inputs)


def _call_ids(forward: list[Any], path: str) -> tuple[int, ...] | None:
    """The forward compute ids module `path` ran, when two or more in one contiguous call; else None."""
    ids = tuple(c.id for c in forward if c.module == path or c.module.startswith(path + "."))
    return ids if len(ids) >= 2 and ids == tuple(range(ids[0], ids[-1] + 1)) else None


def _pieces(model: Any, graph: Graph, forward: list[Any], block: str,
            mutated: frozenset[int]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The outermost sub-modules of `block` that checkpointing alone recomputes cheaply: two or more ops in
    one call, none matmul-class, and no input overwritten in place (`_input_overwritten`: checkpointing
    keeps it), e.g. an activation written as arithmetic (GPT-2's GELU) or a norm's float32 arithmetic
    (Llama's RMSNorm); not ``nn.Hardswish(inplace=True)``."""
    pieces: list[tuple[str, tuple[int, ...]]] = []
    for sub, _ in model.get_submodule(block).named_modules():
        path = f"{block}.{sub}"
        if not sub or any(path.startswith(p + ".") for p, _ in pieces):
            continue
        ids = _call_ids(forward, path)
        if ids is None:
            continue
        if not any(op_name(graph.computes[i].op) in MATMULS for i in ids) and \
                not _input_overwritten(graph, ids, mutated):
            pieces.append((path, ids))
    return tuple(pieces)


def region_specs(graph: Graph, regions: tuple[Region, ...] | list[Region]) -> list[dict[str, Any]]:
    """What `memviz.apply` needs per region (plan JSON, `solver_stats.extra["sac"]`): the module path,
    the MUST_SAVE ops as [op name, occurrence among the region's ops of that name], and how many of
    each countable op the region runs (checked at run time)."""
    specs = []
    for r in regions:
        counts: dict[str, int] = {}
        save = []
        for c in r.nodes:
            name = op_name(graph.computes[c].op)
            if name not in MATCHABLE:
                continue
            if c in r.save:
                save.append([name, counts.get(name, 0)])
            counts[name] = counts.get(name, 0) + 1
        specs.append({"module": r.name, "save": save, "counts": counts})
    return specs


def plan_sac(prof: Any, budget: int | float | str | None, *, time_limit: float = 60.0,
             compiled: bool | str = False) -> Any:
    """`memviz.plan(prof, budget, strategy="sac")`: per block none / pointwise / matchable / save-matmuls /
    full recompute (`solvers.sac.LADDER`), searched by `solvers.sac.solve_menu`, as a Plan whose schedule
    is the SAC schedule.  `compiled` (True, or a torch.compile backend name): peaks and prices are the
    compiled step's (`memviz.plans.compiled`); a fraction or percentage budget is then of the compiled
    baseline's peak, the plan's `peak_bytes` is its predicted compiled peak, and the returned plan's
    compiled step measured within the budget."""
    from memviz.budget import parse_budget
    from memviz.hardware.devices import uses_caching_allocator
    from memviz.parallel.distributed import ParallelProfile
    from memviz.plans.compiled import backend_of
    from memviz.plans.planning import (
        PACKING_SECONDS,
        Plan,
        PlanningError,
        _device_info,
        _model_info,
        packing_of,
    )

    backend = backend_of(compiled)
    if isinstance(prof, ParallelProfile):  # one rank of FSDP2 / tensor parallelism: recorded candidates
        from memviz.parallel.distributed_sac import plan_parallel_sac

        if backend is not None:
            raise PlanningError("compiled= plans one process's compiled step; a parallel profile's is not "
                                "measured")
        return plan_parallel_sac(prof, budget, time_limit=time_limit)
    if getattr(prof, "captured", None) is None or getattr(prof, "model", None) is None:
        raise PlanningError("strategy 'sac' needs the profile from memviz.profile(model, args, "
                            "mode='train') (its capture and model), not a bare graph or a loaded plan")
    if prof.mode != "train":
        raise PlanningError("strategy 'sac' plans activation checkpointing, which only changes training")
    # `memviz.apply` runs eager autograd, which sums a tied weight's gradient as eager does: the plan runs
    # on the baseline's graph (`capture.summed_as_eager`), not on the in-place sum `memviz.export` runs
    # and runs in-place activations in place (`eager_graph`; from `prof.graph`, whose costs a caller may
    # have replaced)
    graph = eager_graph(prof.graph, prof.captured)
    holds = eager_holds(prof.captured, graph)
    blocks = candidate_blocks(prof.model, graph, prof.captured)
    costs = overheads(prof, graph)
    savings, compiled_info = None, None
    base_peak = prof.baseline.peak_bytes
    if backend is not None:
        from memviz.plans.compiled import compiled_overheads
        from memviz.plans.compiled import savings as compiled_savings

        if prof.device.torch_device.type != "cpu":
            raise PlanningError("compiled= measures the compiled step with the CPU allocator (not yet an "
                                "accelerator's): profile on the CPU")
        from memviz.plans.planning import fixed_costs

        eager_s = prof.baseline.total_time + fixed_costs(graph, prof.baseline.total_time)["eager_fixed_s"]
        savings, compiled_info = compiled_savings(prof, graph, blocks, holds, backend, eager_s)
        costs = compiled_overheads(costs)
        base_peak = compiled_info["baseline_peak_bytes"]
    budget_bytes = None if budget is None else parse_budget(budget, base_peak)
    target = base_peak if budget_bytes is None else budget_bytes
    result, choice = solve_menu(graph, target, blocks, holds, time_limit=time_limit, overheads=costs,
                                savings=savings)
    extra: dict[str, Any] = {}
    if backend is not None:
        result, choice, extra = _measured_within(prof, graph, blocks, holds, costs, savings, backend,
                                                 budget_bytes, result, choice, time_limit)
        extra = {"compiled": {**compiled_info, **extra, "peak_bytes": choice.peak_bytes,
                              "predicted_ratio": savings.step_ratio(choice.options)}}
    stats = dataclasses.replace(result.stats, extra={"sac": {
        "expressible": True,
        # seconds per step beyond the schedule's op times (`Plan.time_overhead` adds them) and the
        # measured constants they come from
        "overhead_s": choice.overhead_s,
        "costs": {"rerun_s": costs.rerun, "policy_s": costs.policy, "scale": costs.scale,
                  "region_s": costs.region,
                  "measured": graph.meta.get("sac_costs") == COSTS_VERSION},
        "options": {b.name: o for b, o in zip(blocks, choice.options, strict=True)},
        "regions": region_specs(graph, choice.regions), **extra}})
    the_plan = Plan(graph=graph, schedule=choice.schedule, timeline=choice.timeline,
                    baseline_schedule=prof.baseline_schedule, baseline=prof.baseline, strategy="sac",
                    budget_bytes=budget_bytes, solver_stats=stats, model=_model_info(prof, graph),
                    device=_device_info(prof), profile=prof)
    if backend is None and uses_caching_allocator(str(the_plan.device.get("name", ""))):
        # apply's step runs through PyTorch's caching allocator too: without its reserved peak a sac plan
        # within the budget by live bytes ran out of memory on a device of the budget's size (GPT-2 and
        # ResNet-18 at 75 % on an H200, bench_cuda's capped steps); with it `memviz.plan` fits the plan
        # to its reserve as for every other strategy (`planning.fit_reserved`)
        the_plan.packing = packing_of(graph, choice.schedule, the_plan.device,
                                      time_limit=min(PACKING_SECONDS, time_limit))
    return the_plan


def _measured_within(prof: Any, graph: Graph, blocks: list[Block], holds: EagerHolds, costs: Overheads,
                     savings: Any, backend: str, budget: int | None, result: Any, choice: Any,
                     time_limit: float) -> tuple[Any, Any, dict[str, Any]]:
    """(result, choice, measurements) once the chosen plan's compiled step measured within `budget`:
    over it, solved again under the budget less the largest excess over the prediction so far, at most
    `memviz.plans.compiled.MAX_TRIES` times; still over: `InfeasibleBudget` (not proven: the prediction,
    not the schedule, missed)."""
    from memviz.plans.compiled import MAX_TRIES, compiled_step

    margin, tries = 0, []
    for attempt in range(MAX_TRIES + 1):
        measured, ratio = compiled_step(prof, graph, choice.regions, backend)
        tries.append({"planned_at": None if budget is None else budget - margin,
                      "predicted": choice.peak_bytes, "measured": measured,
                      "predicted_ratio": savings.step_ratio(choice.options), "measured_ratio": ratio})
        if budget is None or measured <= budget:
            return result, choice, {"measured_peak_bytes": measured, "tries": tries}
        if attempt == MAX_TRIES:
            break
        margin = max(margin, measured - choice.peak_bytes)
        result, choice = solve_menu(graph, budget - margin, blocks, holds, time_limit=time_limit,
                                    overheads=costs, savings=savings)
    raise InfeasibleBudget(budget, None, "sac", proven=False)


def to_sac(plan: Any) -> Any:
    """A plan of another strategy as the SAC plan closest to it: every block holding a forward op the
    plan recomputes is checkpointed; in it, the countable ops the plan keeps are MUST_SAVE and every
    other op is recomputed (a per-op policy cannot keep the rest).  Re-simulated: the returned plan's
    peak is what `memviz.apply` will really hold, which may exceed the original plan's budget."""
    from memviz.plans.planning import PlanningError

    prof = plan.profile
    if getattr(prof, "not_exportable", None):  # a recorded parallel profile: plan it as sac directly
        raise PlanningError(
            f"a {plan.strategy!r} plan of one rank of a parallel step cannot be converted to checkpointing "
            "(its graph is recorded, not captured, so no op maps onto a policy): make the per-rank plan with "
            "memviz.plan(profile, budget, strategy='sac'), which memviz.apply runs")
    if getattr(prof, "captured", None) is None or getattr(prof, "model", None) is None:
        raise PlanningError(
            f"a {plan.strategy!r} plan cannot run as PyTorch checkpointing without its profile (a loaded "
            f"plan has none): plans of strategies {', '.join(EXPRESSIBLE)} apply as they are; make one with "
            "memviz.plan(profile, budget, strategy='sac'), or run this one with memviz.export(plan)")
    graph = eager_graph(plan.graph, prof.captured)  # checkpointing runs eager autograd (`eager_graph`)
    runs: dict[int, int] = {}
    for s in plan.schedule:
        if s.op == "compute":
            runs[s.node] = runs.get(s.node, 0) + 1
    recomputed = {c for c, k in runs.items() if k > 1 and graph.computes[c].phase is Phase.FORWARD}
    regions = tuple(Region(b.name, b.nodes, b.matchable - recomputed, b.held)
                    for b in candidate_blocks(prof.model, graph, prof.captured) if recomputed & set(b.nodes))
    start = time.perf_counter()
    holds = eager_holds(prof.captured, graph)
    schedule = sac_schedule(graph, regions, holds)
    timeline = simulate(graph, schedule).check()
    extra_s = overheads(prof, graph).seconds(graph, regions, holds)
    stats = SolverStats("sac", "heuristic", time.perf_counter() - start,
                        objective=timeline.total_time + extra_s,
                        extra={"sac": {"expressible": True, "converted_from": plan.strategy,
                                       "overhead_s": extra_s,
                                       "original_peak_bytes": plan.peak_bytes,
                                       "regions": region_specs(graph, regions)}})
    if plan.budget_bytes is not None and timeline.peak_bytes > plan.budget_bytes:
        warnings.warn(
            f"the {plan.strategy!r} plan as PyTorch checkpointing peaks at {timeline.peak_bytes} bytes, over "
            f"its budget of {plan.budget_bytes} (the plan itself: {plan.peak_bytes}); plan with "
            "strategy='sac' for a plan that checkpointing runs within the budget", stacklevel=3)
    return dataclasses.replace(plan, graph=graph, schedule=schedule, timeline=timeline, strategy="sac",
                               solver_stats=stats, packing=None, frontier=[], frontier_points=[],
                               baseline_graph=None if plan.baseline_graph == graph else plan.baseline_graph)
