"""Activation chunking for long-sequence inference: the torch side of ``solvers.autochunk``.

``plan_chunks(model, args, budget=...)`` captures the inference graph with ``torch.export`` (high-level
ATen ops kept: linear, scaled_dot_product_attention, layer_norm, gelu ...), translates it into the
torch-free op graph, calibrates the speed model by timing the device, and selects chunk regions
(AutoChunk, Zhao et al. 2024, Sec. 3).  ``ChunkPlan.module()`` generates a ``torch.fx.GraphModule``
whose code runs each region as a readable ``for`` loop over chunks (Sec. 3.2 code generation);
``ChunkPlan.with_chunks`` validates regions a user edited.  ``measure_activation_bytes`` measures the
peak of live storages a call allocates (CPU: a dispatch mode with weak references on storages).
"""

from __future__ import annotations

import math
import operator
import resource
import time
import warnings
import weakref
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.fx.graph import CodeGen, PythonCode, _format_target
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from memviz.hardware import accelerator
from memviz.profiling.capture import StalePlanError, buffers_kept, eager_attention_masks
from solvers import autochunk as ac

__all__ = [
    "ChunkPlan",
    "ChunkedModule",
    "LengthGain",
    "calibrate",
    "capture",
    "export_chunks",
    "measure_activation_bytes",
    "max_length_gain",
    "measure_times",
    "plan_chunks",
    "unchunked_plan",
]


# --------------------------------------------------------------------------------------------------
# Capture: torch.export -> solvers.autochunk.OpGraph
# --------------------------------------------------------------------------------------------------
def capture(
    model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None = None
) -> tuple[torch.fx.GraphModule, ac.OpGraph]:
    """Export the inference graph (no decompositions, so high-level ops stay) and translate it.
    The model runs as given: call ``model.eval()`` first for inference semantics.  Library output
    containers (Hugging Face's ``DynamicCache``) are registered as pytree nodes first, as the training
    capture does."""
    from memviz.profiling.capture import (
        CaptureError,
        _data_dependent,
        _describe_trace_error,
        register_library_pytrees,
    )

    register_library_pytrees(model)
    try:
        with torch.no_grad(), eager_attention_masks(model, args, kwargs):
            ep = torch.export.export(model, tuple(args), kwargs=kwargs or {})
    except Exception as err:  # noqa: BLE001 - every export failure becomes a CaptureError
        if not _data_dependent(err):
            raise
        # the inputs are zeros of the profiled shapes (`_profiled_inputs`): no example values to specialise on
        described = _describe_trace_error(err, model)
        raise CaptureError(
            f"autochunk cannot capture {type(model).__name__}: its Python reads tensor values or sizes a "
            f"tensor by them ({described.source or 'line unknown'}); autochunk traces zeros of the profiled "
            "shapes, with no values to take: plan it with another strategy",
            described.module, described.source) from err
    gm = ep.module()
    return gm, translate(gm.graph)


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


def _ref_args(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return "%" + a.name
    if isinstance(a, list | tuple):
        return tuple(_ref_args(x) for x in a)
    if isinstance(a, bool | int | float | str) or a is None:
        return a
    return str(a)  # dtypes, devices, layouts: only for display; rules never need them


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, list | tuple):
        return type(v)(_meta(x) for x in v)
    return v


def _root(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def _aliases(node: torch.fx.Node, metas: Mapping[str, Any]) -> tuple[str | None, Any]:
    """Run the op on meta tensors with the captured strides: an output that is a view of (or is) an
    input owns no storage.  Views are single-input ops, so the first tensor input is the base."""
    tensor_inputs = [
        a for a in node.all_input_nodes if isinstance(metas.get(a.name), torch.Tensor | list | tuple)
    ]
    margs = torch.fx.node.map_arg(node.args, lambda n: metas.get(n.name))
    mkwargs = torch.fx.node.map_arg(node.kwargs, lambda n: metas.get(n.name))
    try:
        out = node.target(*margs, **mkwargs)
    except Exception:  # an op without a meta kernel: assume it allocates (the safe side)
        return None, _meta(node.meta.get("val"))
    outs = out if isinstance(out, list | tuple) else [out]
    ins = [metas[a.name] for a in tensor_inputs if isinstance(metas[a.name], torch.Tensor)]
    roots = [_root(i) for i in ins]
    is_alias = bool(outs) and all(
        isinstance(o, torch.Tensor) and any(_root(o) is r for r in roots) for o in outs
    )
    if node.target is operator.getitem:
        # an item of a multi-output op: its bytes are counted on the op (or the op is itself a view)
        return node.args[0].name, out
    return (tensor_inputs[0].name if is_alias and tensor_inputs else None), out


class _AllocCounter(TorchDispatchMode):
    """Bytes of the non-view tensors ops allocate (meta tensors: no memory is touched), and of those,
    the ones an op made from one operand alone (`operands`: storage -> operand index): a copy,
    permuted or cast, of that operand (einsum's bmm layout of its key), which stays whole in a chunk
    that reads the operand whole."""

    def __init__(self, operands: dict[int, int] | None = None) -> None:
        super().__init__()
        self.bytes = 0
        self.operands = operands or {}
        self.of_operand: list[tuple[int, int, int]] = []  # (storage, bytes, operand index)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        # _unsafe_view and friends share their operand's storage without being views
        ins = {
            t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        owners = {self.operands.get(k) for k in ins}
        owner = next(iter(owners)) if len(owners) == 1 else None  # None: no operand, or several
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t._is_view() and t.untyped_storage()._cdata not in ins:
                nbytes = t.numel() * t.element_size()
                self.bytes += nbytes
                if owner is not None:
                    self.of_operand.append((t.untyped_storage()._cdata, nbytes, owner))
        return out


def _counted(node: torch.fx.Node, metas: Mapping[str, Any], swap: str | None = None) -> dict[str, Any]:
    """The allocations of `node` run on meta tensors, each operand on a storage of its own (q, k and v
    split from one projection share one: a copy of k must not pass for one of q); `swap`: that
    operand contiguous.  ``bytes``: all of them; ``made``: operand name -> the bytes made from it
    alone, but for the op's own outputs."""
    fresh: dict[str, Any] = {}

    def get(n: torch.fx.Node) -> Any:
        v = metas.get(n.name)
        if not isinstance(v, torch.Tensor):
            return v
        if n.name not in fresh:
            fresh[n.name] = (torch.empty(v.shape, dtype=v.dtype, device="meta") if n.name == swap
                             else torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta"))
        return fresh[n.name]

    args, kwargs = torch.fx.node.map_arg(node.args, get), torch.fx.node.map_arg(node.kwargs, get)
    names = list(fresh)
    counter = _AllocCounter({fresh[x].untyped_storage()._cdata: i for i, x in enumerate(names)})
    with counter:
        out = node.target(*args, **kwargs)
    kept = {t.untyped_storage()._cdata for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
    made = dict.fromkeys(names, 0)
    for key, nbytes, i in counter.of_operand:
        if key not in kept:  # a view of the op's own output is no workspace
            made[names[i]] += nbytes
    return {"bytes": counter.bytes, "made": made}


def _allocated(node: torch.fx.Node, metas: Mapping[str, Any], swap: str | None = None) -> int:
    return _counted(node, metas, swap)["bytes"]


def _temps(
    node: torch.fx.Node, metas: Mapping[str, Any], inputs: tuple[str, ...], out_bytes: int
) -> tuple[int, ...]:
    """Workspace an op allocates besides its outputs, per operand: the copies it makes of a
    non-contiguous operand (matmul of a transposed key ...) are found by re-running it with that
    operand contiguous, and what it makes from that operand alone (einsum's permuted copy of a
    contiguous key, which a chunk reading the key whole makes whole) by following the storages.  The
    last entry is the part no operand explains (it shrinks with any chunk)."""
    try:
        whole = _counted(node, metas)
        total = whole["bytes"] - out_bytes
        if total <= 0:
            return ()
        per = [min(total, max(whole["made"].get(v, 0), total - (_allocated(node, metas, v) - out_bytes)))
               for v in inputs]
    except Exception:  # no meta kernel: no workspace known
        return ()
    return (*per, max(0, total - sum(per)))


def _autocast_casts(node: torch.fx.Node, metas: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The operands ``torch.autocast`` casts for this op, as the meta tensors it hands the op (operand
    name -> cast), or {} where autocast leaves it alone.  The captured graph holds no casts: autocast
    casts as ops run, and the capture's fake tensors went through it (the node's ``val`` has the dtype
    the op ran in), while the meta replay here does not (autocast skips meta tensors).  An op with an
    autocast kernel for its device (``AutocastCPU``: linear, matmul, attention, convolutions, cat ...)
    runs on its floating operands cast to that dtype, whatever its list (lower precision, float32 or
    widest type), each cast a copy alive while the op runs.  Without this the op graph kept float32
    operands where bfloat16 ran: attention's mixed-dtype operands sent its kernel choice to the math
    path (L x S scores the CPU's fused kernel never holds), 8.7x the float32 graph's peak on Llama at
    512 tokens, and a linear's weight cast was no workspace."""
    val = node.meta.get("val")
    first = next((v for v in tree_flatten(val)[0] if isinstance(v, torch.Tensor)), None)
    if (first is None or not first.dtype.is_floating_point or not torch.is_autocast_enabled(first.device.type)
            or not isinstance(node.target, torch._ops.OpOverload)):
        return {}
    try:
        autocast_kernel = torch._C._dispatch_has_kernel_for_dispatch_key(
            node.target.name(), f"Autocast{first.device.type.upper()}")
    except RuntimeError:  # no autocast dispatch key for this device type
        return {}
    if not autocast_kernel:
        return {}
    return {
        a.name: torch.empty_strided(m.shape, m.stride(), dtype=first.dtype, device="meta")
        for a in node.all_input_nodes
        if isinstance(m := metas.get(a.name), torch.Tensor)
        and m.is_floating_point() and m.dtype != first.dtype
    }


def _with_casts(
    temps: tuple[int, ...], inputs: tuple[str, ...], casts: dict[str, torch.Tensor]
) -> tuple[int, ...]:
    """`temps` (per operand, then the rest) with autocast's copy of each cast operand added to its
    operand's share: a chunk that reads the operand in chunks casts a chunk of it."""
    per = [t + (casts[v].numel() * casts[v].element_size() if v in casts else 0)
           for v, t in zip(inputs, temps, strict=False)]
    return (*per, temps[-1])


def _source_kind(n: torch.fx.Node, seen: dict[int, str]) -> tuple[str, str | None]:
    """("input" | "parameter" | "buffer", the earlier node holding the same tensor).  Tied weights are
    two attributes naming one Parameter: the second aliases the first, so it is counted once."""
    if n.op == "placeholder":
        return "input", None
    owner = n.graph.owning_module
    obj = operator.attrgetter(n.target)(owner) if owner is not None else None
    buffer = isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.Parameter)
    kind = "buffer" if buffer else "parameter"
    if obj is None:
        return kind, None
    first = seen.setdefault(id(obj), n.name)
    return kind, (first if first != n.name else None)


def translate(graph: torch.fx.Graph) -> ac.OpGraph:
    """FX graph (from torch.export) -> OpGraph: shapes from the fake-tensor metadata, aliases from a
    meta-device replay, tensor operands in argument order."""
    nodes: list[ac.OpNode] = []
    metas: dict[str, Any] = {}
    sources: dict[int, str] = {}
    outputs: tuple[str, ...] = ()
    for n in graph.nodes:
        val = n.meta.get("val")
        if n.op == "output":
            outputs = tuple(x.name for x in tree_flatten(n.args)[0] if isinstance(x, torch.fx.Node))
            continue
        vals = val if isinstance(val, list | tuple) else [val]
        tensors = [v for v in vals if isinstance(v, torch.Tensor)]
        shapes = tuple(tuple(int(s) for s in v.shape) for v in tensors)
        itemsize = tensors[0].dtype.itemsize if tensors else 0
        if n.op in ("placeholder", "get_attr"):
            metas[n.name] = _meta(val)
            kind, alias = _source_kind(n, sources)
            dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else ""
            nodes.append(
                ac.OpNode(
                    n.name, "input", shapes=shapes, itemsize=itemsize, alias=alias, kind=kind, dtype=dtype
                )
            )
            continue
        inputs = tuple(dict.fromkeys(a.name for a in n.all_input_nodes))
        if n.op != "call_function":
            metas[n.name] = _meta(val)
            nodes.append(ac.OpNode(n.name, f"{n.op}:{n.target}", inputs, shapes=shapes, itemsize=itemsize))
            continue
        casts = _autocast_casts(n, metas)
        operands = ChainMap(casts, metas)  # as autocast hands them to the op (it passes meta tensors by)
        alias, out = _aliases(n, operands)
        out_bytes = 0 if alias else sum(math.prod(sh) for sh in shapes) * itemsize
        # attention's meta kernel is always the math path: its workspace is modelled per kernel instead
        sdpa = _op_name(n.target) == "scaled_dot_product_attention"
        fused = n.target is operator.getitem or sdpa
        temps = () if fused else _temps(n, operands, inputs, out_bytes)
        if casts and not fused:  # autocast's copies live while the op runs, each made from one operand
            temps = _with_casts(temps or (0,) * (len(inputs) + 1), inputs, casts)
        metas[n.name] = out if out is not None else _meta(val)
        node = ac.OpNode(
            n.name,
            _op_name(n.target),
            inputs,
            _ref_args(n.args),
            {k: _ref_args(v) for k, v in n.kwargs.items()},
            shapes,
            itemsize,
            alias,
            multi=isinstance(val, list | tuple),
            temps=temps,
            dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
            backend=_sdpa_backend(n) if sdpa else "",
        )
        if sdpa:
            so_far = ac.OpGraph((*nodes, node), ())
            node = replace(node, temps=ac.sdpa_temps(so_far, node),
                           chunk_backends=_sdpa_chunk_backends(n, so_far, node))
        nodes.append(node)
    return ac.OpGraph(tuple(nodes), outputs)


_SDPA_BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def _sdpa_backend(n: torch.fx.Node, narrow: dict[str, int] | None = None, size: int = 0,
                  causal_rows: bool = False) -> str:
    """The kernel `scaled_dot_product_attention` runs with these operands on their device, as the
    dispatcher chooses it (``torch._fused_sdp_choice``: head dims, strides, mask, dropout, GQA).  The
    choice reads metadata only, so empty tensors of the captured shapes and strides stand in.  For a
    chunk: the operands named in `narrow` cut to `size` along their dim there (a narrow keeps the
    strides), and with `causal_rows` the chunk's boolean causal rows instead of ``is_causal``
    (`ChunkCodeGen`'s loop, `_Emitter._causal_mask_args`).  Under ``torch.autocast`` the kernel sees its
    floating operands cast to the dtype it ran in (the output's; eager attention takes one dtype), not
    the mixed ones the graph holds (Llama's rotary embedding hands it float32 queries and keys beside a
    bfloat16 value, for which the dispatcher has only the math kernel)."""
    narrow = narrow or {}
    val = n.meta.get("val")
    ran_in = val.dtype if isinstance(val, torch.Tensor) else None

    def real(a: Any) -> Any:
        v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(v, torch.Tensor):
            return a
        shape = list(v.shape)
        if a.name in narrow:
            shape[narrow[a.name]] = size
        dtype = ran_in if v.is_floating_point() and ran_in is not None else v.dtype
        return torch.empty_strided(shape, v.stride(), dtype=dtype, device=v.device)

    args = [real(a) for a in n.args]
    kwargs = {k: real(v) for k, v in n.kwargs.items()}
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    call = dict(zip(names, args, strict=False)) | kwargs
    if causal_rows:
        key = call["key"]
        call |= {"attn_mask": torch.ones((size, key.shape[-2]), dtype=torch.bool, device=key.device),
                 "is_causal": False}
    try:
        choice = torch._fused_sdp_choice(**call)
    except (RuntimeError, TypeError):  # no kernel fits (an error at run time too): the math path
        return "math"
    return _SDPA_BACKENDS.get(int(choice), "math")


def _sdpa_chunk_backends(
    n: torch.fx.Node, g: ac.OpGraph, node: ac.OpNode
) -> tuple[tuple[int, int, str], ...]:
    """Where a chunk of the attention `n` runs another kernel than the whole (`ac.OpNode.chunk_backends`),
    its operands cut as the loop cuts them (the flow rule's demands, `ac.demands_of`), at chunk lengths
    1 and 2 (every longer chunk has the shapes' equalities of a chunk of 2).  Falcon's multi-query
    attention is the case: its one key/value head is broadcast over the query heads, which only the
    math kernel takes, while a one-head chunk matches it and runs the fused kernel, without the
    L x S scores the math kernel's workspace was counted with (the sweep measured its chunked
    activations 35% under the plan)."""
    out = []
    for d, extent in enumerate(node.shape):
        try:
            demands = ac.demands_of(node, d, g)
        except ac.FlowBreak:
            continue
        narrow = {dm.input: dm.dim for dm in demands if dm.dim is not None}
        for size in (1, 2):
            if size < extent:
                kernel = _sdpa_backend(n, narrow, size, ac.causal_chunk_mask(node, d))
                if kernel != node.backend:
                    out.append((d, size, kernel))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# Speed model calibration (Sec. 3.4): measured on the device, not assumed
# --------------------------------------------------------------------------------------------------
def _reps_for(fn: Callable[[], Any], min_seconds: float) -> int:
    """Calls of `fn` that take at least `min_seconds` together (after one warm-up call)."""
    fn()
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if time.perf_counter() - t0 >= min_seconds:
            return reps
        reps *= 4


def _best_times(fns: Sequence[Callable[[], Any]], rounds: int = 5, min_seconds: float = 0.01) -> list[float]:
    """Best per-call time of each of `fns`, timed in interleaved rounds (every function once per
    round): on a shared machine a burst of load then slows every probe alike instead of one of them,
    and the best round of each is its unloaded time."""
    reps = [_reps_for(f, min_seconds) for f in fns]
    best = [math.inf] * len(fns)
    for _ in range(rounds):
        for i, (f, k) in enumerate(zip(fns, reps, strict=True)):
            t0 = time.perf_counter()
            for _ in range(k):
                f()
            best[i] = min(best[i], (time.perf_counter() - t0) / k)
    return best


@lru_cache(maxsize=4)
def calibrate(device: str = "cpu") -> ac.SpeedModel:
    """Time a tiny op (launch overhead), a 256x256 matmul at 1..4096 rows (FLOP/s versus rows: the
    density term), a 64 MiB copy (bandwidth: the stride term) and filling three freshly allocated
    buffers of 4 to 64 MiB, alive at once like a graph's large intermediates, versus reused memory
    (first-touch page faults: their cost per byte, and the smallest size the allocator maps afresh,
    where the fresh fills take over 1.25x the reused ones), in interleaved rounds.  About two seconds
    on a CPU.  The rate is made non-decreasing in rows: fewer rows never run denser, and noise must
    not say otherwise."""
    sizes = (2**20, 2 * 2**20, 4 * 2**20, 8 * 2**20, 16 * 2**20)  # floats: 4 MiB .. 64 MiB
    with torch.no_grad():
        a = torch.ones(8, device=device)
        w = torch.randn(256, 256, device=device)
        row_counts = (1, 16, 128, 1024, 4096)
        xs = [torch.randn(rows, 256, device=device) for rows in row_counts]
        big = torch.empty(sizes[-1], device=device)
        dst = torch.empty(3 * sizes[-1], device=device)

        def fresh(n: int) -> None:
            live = [torch.empty(n, device=device) for _ in range(3)]
            for t in live:
                t.fill_(1.0)

        def reused(n: int) -> None:
            for k in range(3):
                dst[k * n : (k + 1) * n].fill_(1.0)

        probes: list[Callable[[], Any]] = [
            lambda: torch.add(a, a),
            *[lambda x=x: x @ w for x in xs],
            lambda: dst[: big.numel()].copy_(big),
            *[lambda n=n: fresh(n) for n in sizes],
            *[lambda n=n: reused(n) for n in sizes],
        ]
        if accelerator.is_accelerator(device):  # asynchronous: time each probe to completion
            probes = [lambda p=p: (p(), accelerator.synchronize(device)) for p in probes]
        times = _best_times(probes)
    k = len(sizes)
    overhead, mm, copy = times[0], times[1 : 1 + len(row_counts)], times[1 + len(row_counts)]
    fresh_t, warm_t = times[-2 * k : -k], times[-k:]
    rates: list[tuple[int, float]] = []
    for rows, t in zip(row_counts, mm, strict=True):
        rates.append((rows, max(2.0 * rows * 256 * 256 / t, rates[-1][1] if rates else 0.0)))
    mapped = [4 * n for n, f, r in zip(sizes, fresh_t, warm_t, strict=True) if f > 1.25 * r]
    page_s = max(max(0.0, f - r) / (3 * 4 * n) for n, f, r in zip(sizes, fresh_t, warm_t, strict=True))
    return ac.SpeedModel(overhead, tuple(rates), 2 * big.nbytes / copy, page_s, min(mapped, default=1 << 62))


def measure_times(
    gm: torch.fx.GraphModule, g: ac.OpGraph, args: Sequence[Any], rounds: int = 3
) -> ac.OpGraph:
    """`g` with every op's time measured on the device: the captured graph run `rounds` times (twice
    when a run takes over two seconds) node by node, values freed after their last use as eager does;
    the best time of each op and the bytes of fresh pages it touched (minor page faults) in that run.
    The speed model then scales measured work instead of guessing it from FLOPs and bytes (AutoChunk
    Sec. 3.4: the cost terms are tuned on the device).  CPU page faults are counted by the process;
    other devices report none."""
    best: dict[str, tuple[float, int]] = {}
    page = resource.getpagesize()
    device = _device_of(gm, args)

    def sync() -> None:  # device ops run asynchronously: time them to completion
        accelerator.synchronize(device)

    class _Timer(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if n.op != "call_function":
                return super().run_node(n)
            sync()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            out = super().run_node(n)
            sync()
            t = time.perf_counter() - t0
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            if n.name not in best or t < best[n.name][0]:
                best[n.name] = (t, faults * page)
            return out

    with torch.no_grad(), buffers_kept(gm):
        for i in range(rounds):
            t0 = time.perf_counter()
            _Timer(gm).run(*args)
            if i >= 1 and time.perf_counter() - t0 > 2.0:  # a slow run: two are enough for a best
                break
    return ac.OpGraph(
        tuple(
            replace(n, time=best[n.name][0], fresh=best[n.name][1]) if n.name in best else n for n in g.nodes
        ),
        g.outputs,
    )


# --------------------------------------------------------------------------------------------------
# Memory measurement: live storages allocated during a call (CPU and any device)
# --------------------------------------------------------------------------------------------------
class _StorageTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        # an output sharing an operand's storage is a view or in-place result, not an allocation
        # (operands made before the call, like parameters, are never counted)
        operands = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                key = s.data_ptr()
                if key and key not in self._seen and key not in operands:
                    self._seen.add(key)
                    self.live += s.nbytes()
                    weakref.finalize(s, self._free, key, s.nbytes())
        self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def measure_activation_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """(peak bytes of storages allocated by `fn` and alive at once, fn's result).  Inputs and
    parameters exist before the call and are not counted; outputs are."""
    with torch.no_grad():
        tracker = _StorageTracker()
        with tracker:
            out = fn(*args, **kwargs)
    return tracker.peak, out


# --------------------------------------------------------------------------------------------------
# Code generation: each region becomes a for-loop over chunks
# --------------------------------------------------------------------------------------------------
_SIZE_ARG_OPS = {"view", "reshape", "_unsafe_view", "expand"}


class _Raw(str):
    """A pre-formatted expression inside an argument list (the chunk length variable)."""


class ChunkCodeGen(CodeGen):
    """Python code for an exported graph with chunk regions as loops.  Values die after their last
    use (like FX's own code); inside a loop, chunk locals are deleted as soon as they are read for
    the last time so one iteration's chunk does not outlive the next one's."""

    def __init__(self, regions: Sequence[ac.ChunkRegion], out_spec: Any, opgraph: ac.OpGraph) -> None:
        super().__init__()
        self.regions = list(regions)
        self.out_spec = out_spec
        self.opgraph = opgraph

    def _gen_python_code(self, nodes: Any, root_module: str, namespace: Any, **_: Any) -> PythonCode:
        return _Emitter(list(nodes), self.regions, self.out_spec, self.opgraph).python_code()


class _Emitter:
    def __init__(
        self, nodes: list[torch.fx.Node], regions: list[ac.ChunkRegion], out_spec: Any, opgraph: ac.OpGraph
    ) -> None:
        self.opgraph = opgraph
        self.nodes = nodes
        self.by_name = {n.name: n for n in nodes}
        self.regions = regions
        self.out_spec = out_spec
        self.globals: dict[str, Any] = {"torch": torch, "operator": operator}
        self.lines: list[str] = []
        self.region_of: dict[str, int] = {}
        for i, r in enumerate(regions):
            s = next(k for k, n in enumerate(nodes) if n.name == r.flow.start)
            e = next(k for k, n in enumerate(nodes) if n.name == r.flow.end)
            for n in nodes[s : e + 1]:
                if n.op == "call_function":
                    self.region_of[n.name] = i

    # -- formatting --------------------------------------------------------------------------
    def fmt(self, a: Any, env: dict[str, str]) -> str:
        if isinstance(a, _Raw):
            return str(a)
        if isinstance(a, torch.fx.Node):
            return env.get(a.name, a.name)
        if isinstance(a, tuple):
            inner = ", ".join(self.fmt(x, env) for x in a)
            return f"({inner},)" if len(a) == 1 else f"({inner})"
        if isinstance(a, list):
            return "[" + ", ".join(self.fmt(x, env) for x in a) + "]"
        if isinstance(a, float) and not math.isfinite(a):
            return f"float({str(a)!r})"
        if isinstance(a, bool | int | float | str) or a is None:
            return repr(a)
        if isinstance(a, torch.dtype | torch.device | torch.layout | torch.memory_format):
            return (
                "torch." + str(a).split(".")[-1]
                if not isinstance(a, torch.device)
                else f"torch.device({str(a)!r})"
            )
        return self.add_global(a)

    def add_global(self, obj: Any) -> str:
        base = "_g_" + "".join(
            c if c.isalnum() else "_" for c in getattr(obj, "__name__", type(obj).__name__)
        )
        name, k = base, 0
        while name in self.globals and self.globals[name] is not obj:
            k += 1
            name = f"{base}_{k}"
        self.globals[name] = obj
        return name

    def call(self, n: torch.fx.Node, env: dict[str, str], args: Any = None, kwargs: Any = None) -> str:
        args = n.args if args is None else args
        kwargs = n.kwargs if kwargs is None else kwargs
        if n.op == "get_attr":
            return _format_target("self", n.target)
        if n.target is operator.getitem:
            return f"{self.fmt(args[0], env)}[{self.fmt(args[1], env)}]"
        parts = [self.fmt(a, env) for a in args] + [f"{k}={self.fmt(v, env)}" for k, v in kwargs.items()]
        if n.op == "call_method":
            return f"{parts[0]}.{n.target}({', '.join(parts[1:])})"
        if n.op == "call_module":
            return f"{_format_target('self', n.target)}({', '.join(parts)})"
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            fn = f"torch.ops.{t.namespace}.{t._schema.name.split('::')[-1]}.{t._overloadname}"
        else:
            fn = self.add_global(t)
        return f"{fn}({', '.join(parts)})"

    # -- program -----------------------------------------------------------------------------
    def python_code(self) -> PythonCode:
        placeholders = [n.name for n in self.nodes if n.op == "placeholder"]
        # items: plain nodes, or a whole region at the position of its first node
        items: list[Any] = []
        for n in self.nodes:
            if n.op in ("placeholder", "output"):
                continue
            r = self.region_of.get(n.name)
            if r is None:
                items.append(n)
            elif not items or items[-1] != ("region", r):
                items.append(("region", r))
        last: dict[str, int] = {}
        for i, it in enumerate(items):
            readers = (
                [it]
                if isinstance(it, torch.fx.Node)
                else [self.by_name[x] for x in ac.region_nodes(self.opgraph, *self._span(it[1]))]
            )
            for rn in readers:
                for a in rn.all_input_nodes:
                    last[a.name] = i
        # a value nothing reads (the final state of a scan, selected and dropped) dies where it is made,
        # as FX's own code frees it: a view kept alive would hold its base's whole storage to the end
        # (Mamba2's and RecurrentGemma's chunk plans measured 13% over their estimate).  A region's
        # unread values are hoisted and dropped before its loop (`hoisted_only`)
        for i, it in enumerate(items):
            if isinstance(it, torch.fx.Node):
                last.setdefault(it.name, i)
        out_node = next(n for n in self.nodes if n.op == "output")
        keep = {a.name for a in out_node.all_input_nodes}
        # loop locals never exist outside their loop
        keep |= {x for r in self.regions for x in r.flow.dims if x not in r.flow.outputs}
        body: list[str] = []
        for i, it in enumerate(items):
            if isinstance(it, torch.fx.Node):
                body.append(f"{it.name} = {self.call(it, {})}")
            else:
                body.extend(self.region(it[1]))
            dead = sorted(k for k, v in last.items() if v == i and k not in keep)
            if dead:
                body.append("; ".join(f"{k} = None" for k in dead))
        outs = tree_flatten(out_node.args[0])[0]
        flat = "[" + ", ".join(self.fmt(o, {}) for o in outs) + "]"
        if self.out_spec is not None:
            self.globals["_tree_unflatten"] = tree_unflatten
            self.globals["_out_spec"] = self.out_spec
            body.append(f"return _tree_unflatten({flat}, _out_spec)")
        else:
            body.append(f"return {self.fmt(out_node.args[0], {})}")
        src = f"\n\ndef forward(self, {', '.join(placeholders)}):\n" + "".join(f"    {ln}\n" for ln in body)
        return PythonCode(src, self.globals, _lineno_map=None)

    def _span(self, ri: int) -> tuple[str, str]:
        return self.regions[ri].flow.start, self.regions[ri].flow.end

    def region(self, ri: int) -> list[str]:
        r = self.regions[ri]
        f = r.flow
        names = ac.region_nodes(self.opgraph, f.start, f.end)
        lo, size = f"_lo{ri}", f"_n{ri}"
        out = [
            f"# chunk region {ri}: {f.start} .. {f.end}, {r.chunks} chunks of {r.step} "
            f"along a loop of {f.extent}"
        ]
        for h in f.hoisted:
            out.append(f"{h} = {self.call(self.by_name[h], {})}")
        dead = ac.hoisted_only(self.opgraph, f)
        if dead:
            out.append("; ".join(f"{h} = None" for h in dead))
        for o in f.outputs:
            val = self.by_name[o].meta["val"]
            dev = self._device_expr(f)
            out.append(f"{o} = torch.empty({list(val.shape)}, dtype={self.fmt(val.dtype, {})}, device={dev})")
        out.append(f"for {lo} in range(0, {f.extent}, {r.step}):")
        loop: list[str] = [f"{size} = min({r.step}, {f.extent} - {lo})"]
        env: dict[str, str] = {}
        narrowed: dict[tuple[str, int], str] = {}
        for v, ds in f.narrow.items():
            for d in ds:
                narrowed[(v, d)] = f"{v}_{d}c"
        body = [x for x in names if x in f.dims]
        # last reader of each loop local, so it can be deleted right after
        locals_last: dict[str, int] = {}
        for i, x in enumerate(body):
            for dm in ac.demands_of(self._opnode(x), f.dims[x], self.opgraph):
                if dm.dim is not None and dm.input not in f.dims:
                    locals_last[narrowed[(dm.input, dm.dim)]] = i
                elif dm.input in f.dims:
                    locals_last[f"{dm.input}_c"] = i
        emitted: set[str] = set()
        for i, x in enumerate(body):
            n = self.by_name[x]
            env_x: dict[str, str] = {}
            for dm in ac.demands_of(self._opnode(x), f.dims[x], self.opgraph):
                if dm.input in f.dims:
                    env_x[dm.input] = f"{dm.input}_c"
                elif dm.dim is not None:
                    nv = narrowed[(dm.input, dm.dim)]
                    if nv not in emitted:
                        loop.append(f"{nv} = {dm.input}.narrow({dm.dim}, {lo}, {size})")
                        emitted.add(nv)
                    env_x[dm.input] = nv
            args = self._resize_args(n, f.dims[x], f.extent, size)
            kwargs = None
            if ac.causal_chunk_mask(self._opnode(x), f.dims[x]):
                args, kwargs = self._causal_mask_args(n, f"{x}_mask", lo, size, loop)
                locals_last[f"{x}_mask"] = i
            loop.append(f"{x}_c = {self.call(n, {**env, **env_x}, args, kwargs)}")
            if x in f.outputs:
                d = f.outputs[x]
                loop.append(f"{x}.narrow({d}, {lo}, {size}).copy_({x}_c)")
            dead = [k for k, v in locals_last.items() if v == i]
            if x in f.outputs and locals_last.get(f"{x}_c") is None:
                dead.append(f"{x}_c")
            if dead:
                loop.append("del " + ", ".join(sorted(set(dead))))
        out.extend("    " + ln for ln in loop)
        return out

    def _causal_mask_args(
        self, n: torch.fx.Node, mask: str, lo: str, size: str, loop: list[str]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A causal attention chunked along its queries: ``is_causal`` would align the chunk's first
        query with the first key, so the chunk gets rows [lo, lo + size) of the causal mask instead
        (`solvers.autochunk.causal_chunk_mask`; a boolean mask keeps the fused kernel on CPU)."""
        key = n.args[1]
        length = key.meta["val"].shape[-2]
        loop.append(
            f"{mask} = torch.ones(({size}, {length}), dtype=torch.bool, device={key.name}.device).tril({lo})"
        )
        args = list(n.args) + [None] * max(0, 4 - len(n.args))
        args[3] = _Raw(mask)
        if len(args) > 5:
            args[5] = False
        kwargs = {k: v for k, v in n.kwargs.items() if k not in ("attn_mask", "is_causal")}
        return tuple(args), kwargs

    def _device_expr(self, f: ac.Flow) -> str:
        v = next(iter(f.narrow))
        return f"{v}.device"

    def _resize_args(self, n: torch.fx.Node, d: int, extent: int, size: str) -> Any:
        """View/reshape/expand carry the output shape: its chunk dim becomes the chunk length."""
        if _op_name(n.target) not in _SIZE_ARG_OPS:
            return n.args
        shape = list(n.args[1])
        if d < len(shape) and shape[d] == extent:
            shape[d] = _Raw(size)
        return (n.args[0], shape, *n.args[2:])

    def _opnode(self, name: str) -> ac.OpNode:
        return self.opgraph[name]


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------
#: how far a chunked run may measure over its estimated activation peak (`ChunkPlan.checked`): the
#: chunking tests' tolerance
MEASURED_SLACK = 0.05


class EstimateMissed(ValueError):
    """The chunked run measured more activation bytes than the plan's estimate, beyond `MEASURED_SLACK`."""


@dataclass
class ChunkPlan:
    """Chosen chunk regions with their estimates.  `chunks` is the editable data view; `module()` the
    chunked GraphModule.  Serialisable with `to_dict`/`from_dict` (the graph module is not: rebuild
    it with `plan_chunks(model, args).with_chunks(plan.chunks)`)."""

    graph: ac.OpGraph
    regions: list[ac.ChunkRegion]
    speed: ac.SpeedModel
    budget_bytes: int | None
    baseline_peak_bytes: int
    peak_bytes: int
    gm: torch.fx.GraphModule | None = field(default=None, repr=False)
    #: set by `checked`: the activation peak measured running the chunked module, and the unchunked one's
    measured_peak_bytes: int | None = None
    measured_baseline_bytes: int | None = None
    #: regions the measured check dropped (they did not lower the measured peak), as `chunks` dicts
    refused: list[dict[str, Any]] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes

    @property
    def slowdown(self) -> float:
        total = ac.graph_time(self.graph, self.speed)
        return sum(ac.region_slowdown(self.graph, r, self.speed) for r in self.regions) / max(total, 1e-12)

    @property
    def chunks(self) -> list[dict[str, Any]]:
        est = ac.estimate_memory(self.graph, tuple(self.regions))
        total = max(ac.graph_time(self.graph, self.speed), 1e-12)
        out = []
        for r in self.regions:
            f = r.flow
            inside = set(ac.region_nodes(self.graph, f.start, f.end))
            out.append(
                {
                    "start": f.start,
                    "end": f.end,
                    "chunks": r.chunks,
                    "chunk_size": r.step,
                    "extent": f.extent,
                    "outputs": dict(f.outputs),
                    "dims": dict(f.dims),
                    "inputs": {v: list(ds) for v, ds in f.narrow.items()},
                    "hoisted": list(f.hoisted),
                    "memory_bytes": max((b for n, b in est.curve if n in inside), default=0),
                    "slowdown": ac.region_slowdown(self.graph, r, self.speed) / total,
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "peak_bytes": self.peak_bytes,
            "met": self.met,
            "slowdown": self.slowdown,
            "regions": len(self.regions),
            "measured_peak_bytes": self.measured_peak_bytes,
            "measured_baseline_bytes": self.measured_baseline_bytes,
            "refused": len(self.refused),
        }

    def checked(self, inputs: Sequence[torch.Tensor] | None = None) -> ChunkPlan:
        """This plan with only regions that lower the MEASURED activation peak: the chunked module and
        the unchunked capture run once each on `inputs` (the flat positional-then-keyword call; zeros
        of the captured shapes when None).  If the chunked run is not lower, regions are dropped one
        at a time, keeping a drop whenever the run without that region measures no higher, until the
        peak is lower than the unchunked one or no region is left; the dropped ones are in
        `refused`.  AutoChunk selects on its estimate (Sec. 3.4); this is the check that the estimate
        did not miss a temporary the device allocates: a chunked run measuring over its estimate by
        more than `MEASURED_SLACK` raises `EstimateMissed`."""
        if self.gm is None or not self.regions:
            return self
        device = _device_of(self.gm, [])
        flat = list(inputs) if inputs is not None else [t.to(device) for t in _graph_args(self.graph)]
        base = _measured_activation_bytes(_flat_call(self.gm), flat)
        kept, refused = list(self.regions), []
        peak = _measured_activation_bytes(self._with_regions(kept).module(), flat)
        # the costliest region first: of two that do not lower the peak, the slower one goes
        by_cost = sorted(self.regions, key=lambda r: -ac.region_slowdown(self.graph, r, self.speed))
        for r in by_cost:
            if peak < base:
                break
            trial = [x for x in kept if x is not r]
            trial_peak = (
                _measured_activation_bytes(self._with_regions(trial).module(), flat) if trial else base
            )
            if trial_peak <= peak:
                refused.extend(c for c in self._with_regions([r]).chunks)
                kept, peak = trial, trial_peak
        if peak >= base and kept:  # no subset found lower: refuse them all
            refused.extend(self._with_regions(kept).chunks)
            kept, peak = [], base
        out = self._with_regions(kept)
        if kept and peak > out.peak_bytes * (1 + MEASURED_SLACK):
            # the estimate missed an allocation of the chunked code: its peak is not a bound to plan on
            raise EstimateMissed(
                f"autochunk: the chunked run measured {peak} bytes of activations, "
                f"{peak / out.peak_bytes - 1:.1%} over the plan's estimate of {out.peak_bytes} (more than "
                f"{MEASURED_SLACK:.0%}), with the regions "
                + ", ".join(f"{c['start']}..{c['end']}" for c in out.chunks)
                + ": the estimate misses an allocation of the chunked code; no plan is returned that "
                "may not fit (a fault of memviz: please report it with the model)"
            )
        out.measured_peak_bytes, out.measured_baseline_bytes, out.refused = peak, base, refused
        if refused:
            warnings.warn(
                f"autochunk: {len(refused)} chunk region(s) did not lower the measured activation peak "
                f"({base} bytes unchunked) and were dropped: "
                + ", ".join(f"{c['start']}..{c['end']}" for c in refused),
                stacklevel=2,
            )
        return out

    def _with_regions(self, regions: Sequence[ac.ChunkRegion]) -> ChunkPlan:
        est = ac.estimate_memory(self.graph, tuple(regions))
        return ChunkPlan(
            self.graph, list(regions), self.speed, self.budget_bytes, self.baseline_peak_bytes,
            est.peak_bytes, self.gm,
        )

    def with_chunks(self, regions: Sequence[dict[str, Any]]) -> ChunkPlan:
        """A plan with these regions (dicts like `chunks`: start, end, chunks and the output dims in
        `outputs`, or in `dims`).  Illegal regions raise ValueError naming the op breaking the flow."""
        rs = [_region_from_dict(self.graph, d) for d in regions]
        spans = sorted((self.graph.pos(r.flow.start), self.graph.pos(r.flow.end), r.flow.start) for r in rs)
        for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:], strict=False):
            if s1 <= e0:
                raise ValueError(
                    f"regions starting at {n0!r} and {n1!r} overlap; nested chunking is not "
                    "supported: shorten one of them"
                )
        est = ac.estimate_memory(self.graph, tuple(rs))
        return ChunkPlan(
            self.graph, rs, self.speed, self.budget_bytes, self.baseline_peak_bytes, est.peak_bytes, self.gm
        )

    def select(
        self,
        budget_bytes: int,
        *,
        beam: int = 4,
        window: int = 24,
        time_limit: float | None = None,
        check: bool | Sequence[torch.Tensor] = True,
    ) -> ChunkPlan:
        """Regions chosen afresh for an activation budget on the same capture and speed model
        (Sec. 3.4 selection: beam search around the peak until the budget is met, or until
        `time_limit` seconds, returning the best found), then `checked` by measurement (`check`: True
        on zero inputs of the captured shapes, or the flat inputs to run; False skips it)."""
        sel = ac.select_chunks(self.graph, budget_bytes, self.speed, beam=beam, window=window,
                               time_limit=time_limit)
        plan = ChunkPlan(
            self.graph,
            list(sel.regions),
            self.speed,
            budget_bytes,
            self.baseline_peak_bytes,
            sel.peak_bytes,
            self.gm,
        )
        if check is False:
            return plan
        return plan.checked(None if check is True else check)

    def module(self) -> torch.fx.GraphModule:
        """The chunked GraphModule: same flat positional inputs and output structure as the model."""
        if self.gm is None:
            raise ValueError(
                "this plan was loaded without its model: rebuild it with "
                "plan_chunks(model, args).with_chunks(plan.chunks)"
            )
        src = self.gm
        graph = torch.fx.Graph()
        val_map: dict[torch.fx.Node, torch.fx.Node] = {}
        out = graph.graph_copy(src.graph, val_map)
        graph.output(out)
        renamed = {a.name: b.name for a, b in val_map.items() if a.name != b.name}
        if renamed:
            raise RuntimeError(f"graph copy renamed nodes {renamed}; cannot place regions")
        spec = getattr(getattr(src.graph._codegen, "pytree_info", None), "out_spec", None)
        graph.set_codegen(ChunkCodeGen(self.regions, spec, self.graph))
        return torch.fx.GraphModule(src, graph, class_name="ChunkedModule")

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph.to_dict(),
            "speed": self.speed.to_dict(),
            "budget_bytes": self.budget_bytes,
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "peak_bytes": self.peak_bytes,
            "chunks": self.chunks,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], gm: torch.fx.GraphModule | None = None) -> ChunkPlan:
        g = ac.OpGraph.from_dict(d["graph"])
        base = cls(
            g,
            [],
            ac.SpeedModel.from_dict(d["speed"]),
            d["budget_bytes"],
            d["baseline_peak_bytes"],
            d["baseline_peak_bytes"],
            gm,
        )
        return base.with_chunks(d["chunks"])


def _region_from_dict(g: ac.OpGraph, d: dict[str, Any]) -> ac.ChunkRegion:
    for key in ("start", "end", "chunks"):
        if key not in d:
            raise ValueError(f"chunk region {d!r} lacks {key!r}; give start, end, chunks and the output dims")
    for key in ("start", "end"):
        if d[key] not in g.index:  # type: ignore[attr-defined]
            raise ValueError(f"chunk region: no node named {d[key]!r}")
    nodes = ac.region_nodes(g, d["start"], d["end"])
    outs = ac.region_outputs(g, nodes)
    given = dict(d.get("dims", {}))
    out_dims = dict(d.get("outputs") or {o: given[o] for o in outs if o in given})
    if not out_dims:
        raise ValueError(
            f"chunk region {d['start']}..{d['end']}: give the chunk dim of its outputs "
            f"{outs} in 'outputs' (or 'dims')"
        )
    try:
        flow = ac.flow_region(g, d["start"], d["end"], {k: int(v) for k, v in out_dims.items()})
    except ac.IllegalRegion as e:
        raise ValueError(f"illegal chunk region {d['start']}..{d['end']}: {e}") from e
    for name, dim in given.items():
        if name in flow.dims and flow.dims[name] != dim:
            op = g[name].op
            raise ValueError(
                f"illegal chunk region {d['start']}..{d['end']}: {op} {name!r} was given dim {dim} "
                f"but the chunk flow from the outputs reaches it on dim {flow.dims[name]}"
            )
    try:
        return ac.with_count(ac.ChunkRegion(flow, 1), int(d["chunks"]))
    except ValueError as e:
        raise ValueError(f"illegal chunk region: {e}") from e


def plan_chunks(
    model: torch.nn.Module,
    args: Sequence[Any],
    budget: int | float | None = None,
    *,
    kwargs: dict[str, Any] | None = None,
    speed: ac.SpeedModel | None = None,
    beam: int = 4,
    window: int = 24,
    check: bool = True,
    time_limit: float | None = None,
) -> ChunkPlan:
    """Capture `model(*args)` for inference and choose chunk regions so the estimated activation peak
    fits `budget` (bytes, or a fraction in (0, 1] of the unchunked activation peak) with the least
    estimated slowdown.  Without a `speed` model the device is calibrated and every op timed on it
    (`calibrate`, `measure_times`: the model runs a few times).
    `plan.met` says whether the budget was reached; `plan.peak_bytes` what was.  With `check` the
    chosen regions are run once on `args` and those not lowering the measured peak dropped
    (`ChunkPlan.checked`; `EstimateMissed` if the run measures over the estimate).  `time_limit`
    bounds the region search (seconds; the best found is kept)."""
    gm, g = capture(model, args, kwargs)
    base = ac.estimate_memory(g)
    if budget is None:
        budget_bytes = base.peak_bytes
    elif isinstance(budget, float) and 0 < budget <= 1:
        budget_bytes = int(budget * base.peak_bytes)
    elif isinstance(budget, int) and budget > 0:
        budget_bytes = budget
    else:
        raise ValueError(
            f"budget {budget!r}: give bytes (int > 0) or a fraction of the activation peak in (0, 1]"
        )
    if speed is None:  # calibrated on the device, with every op of this graph timed there
        speed = calibrate(_device_of(model, args))
        g = measure_times(gm, g, tree_flatten((tuple(args), kwargs or {}))[0])
    unchunked = ChunkPlan(g, [], speed, budget_bytes, base.peak_bytes, base.peak_bytes, gm)
    flat = tree_flatten((tuple(args), kwargs or {}))[0]
    inputs = flat if all(isinstance(a, torch.Tensor) for a in flat) else True
    return unchunked.select(budget_bytes, beam=beam, window=window, time_limit=time_limit,
                            check=inputs if check else False)


def _flat_call(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """`gm` (an exported module, which checks its call against the captured keyword structure) called
    with the flat inputs the chunked module takes.  A Module, so its parameters count as existing."""

    class _Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gm = gm

        def forward(self, *flat: Any) -> Any:
            spec = getattr(gm, "_in_spec", None)
            if spec is None:
                return gm(*flat)
            args, kwargs = tree_unflatten(list(flat), spec)
            return gm(*args, **kwargs)

    return _Flat()


def _measured_activation_bytes(
    fn: Callable[..., Any], flat: Sequence[Any], kwargs: dict[str, Any] | None = None
) -> int:
    """Peak bytes `fn(*flat, **kwargs)` allocates beyond what exists before the call (parameters,
    buffers, inputs; outputs count): `memviz.profiling.tracker.measure_peak` (CPU storages, or the device
    allocator)."""
    from memviz.profiling.tracker import measure_peak, tensors_of

    pre = tensors_of(fn, tuple(flat), kwargs or {})
    device = next((t.device for t in pre), torch.device("cpu"))
    with torch.no_grad(), buffers_kept(fn):
        if accelerator.is_accelerator(device):  # the allocator counts what exists before the call
            before, peak, _ = accelerator.peak_allocated(lambda: fn(*flat, **(kwargs or {})), device)
            return peak - before
        peak, _ = measure_peak(lambda: fn(*flat, **(kwargs or {})), pre, device)
    return peak - sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in pre}.values())


@dataclass(frozen=True)
class LengthGain:
    """The longest input whose inference fits `budget_bytes` of activations, unchunked (eager) and
    chunked (`plan_chunks` at that budget, exported and measured), both found by running."""

    budget_bytes: int
    base_length: int
    unchunked_length: int
    chunked_length: int
    capped: bool  # the chunked run still fitted at `max_length`: the gain is a lower bound
    probes: tuple[tuple[int, int, int], ...]  # (length, measured chunked peak, estimated peak)
    #: the longest the captured graph runs without regions (freeing each value after its last use,
    #: where eager Python holds locals longer): the part of the gain that is not chunking's
    exported_length: int | None = None

    @property
    def gain(self) -> float:
        return self.chunked_length / max(1, self.unchunked_length)

    @property
    def chunking_gain(self) -> float | None:
        """The gain over the unchunked export (chunking's own share)."""
        return None if not self.exported_length else self.chunked_length / self.exported_length


Factory = Callable[[int], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]


def _longest(fits: Callable[[int], bool], lo: int, hi: int, step: int) -> tuple[int, bool]:
    """The largest multiple of `step` in [lo, hi] with `fits` (given that `lo` fits and fitting is
    monotone in the length): doubling, then bisection.  Also whether `hi` itself fits."""
    good, bad = lo, None
    n = lo
    while bad is None:
        n = min(2 * n, hi)
        if fits(n):
            good = n
            if n >= hi:
                return good, True
        else:
            bad = n
    while bad - good > step:
        mid = (good + bad) // 2 // step * step
        if mid <= good:
            break
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, False


def max_length_gain(
    factory: Factory,
    base_length: int = 1024,
    *,
    budget_bytes: int | None = None,
    max_length: int = 16384,
    step: int = 64,
    speed: ac.SpeedModel | None = None,
    exported: bool = False,
) -> LengthGain:
    """Max-length gain of chunking (AutoChunk Sec. 4.2 reports it as the longest sequence under a fixed
    memory): `factory(n)` gives (model in eval mode, args, kwargs) for an input of length n.  The
    budget defaults to the unchunked (eager) activation peak measured at `base_length`; each length
    is judged by running it: eager measured for the unchunked side, the exported chunked module of a
    plan for the budget (`plan_chunks`, measured check included) for the chunked side.  A fixed speed
    model by default: the length depends on memory, and calibrating at every probe would only slow
    the search.  With `exported` the unchunked capture is searched too (`exported_length`)."""
    speed = speed or ac.SpeedModel()
    probes: list[tuple[int, int, int]] = []

    def eager(n: int) -> int:
        model, args, kwargs = factory(n)
        return _measured_activation_bytes(model, args, kwargs)

    budget = eager(base_length) if budget_bytes is None else budget_bytes

    def chunked_fits(n: int) -> bool:
        model, args, kwargs = factory(n)
        plan = plan_chunks(model, args, budget, kwargs=kwargs, speed=speed)
        flat = tree_flatten((tuple(args), kwargs))[0]
        peak = _measured_activation_bytes(plan.module(), flat)
        probes.append((n, peak, plan.peak_bytes))
        return peak <= budget

    unchunked, _ = _longest(lambda n: eager(n) <= budget, base_length, max_length, step)
    if not chunked_fits(unchunked):  # chunking never raises the peak, but say so if it did
        return LengthGain(budget, base_length, unchunked, 0, False, tuple(probes))
    chunked, capped = _longest(chunked_fits, unchunked, max_length, step)
    export_len = None
    if exported:

        def export_fits(n: int) -> bool:
            model, args, kwargs = factory(n)
            gm, _ = capture(model, args, kwargs)
            return _measured_activation_bytes(gm, tree_flatten((tuple(args), kwargs))[0]) <= budget

        export_len = _longest(export_fits, unchunked, chunked, step)[0]
    return LengthGain(budget, base_length, unchunked, chunked, capped, tuple(probes), export_len)


def _device_of(model: torch.nn.Module, args: Sequence[Any]) -> str:
    for t in (*model.parameters(), *[a for a in args if isinstance(a, torch.Tensor)]):
        return t.device.type
    return "cpu"


# --------------------------------------------------------------------------------------------------
# memviz.plan(strategy="autochunk") and memviz.export of its plans
# --------------------------------------------------------------------------------------------------
#: each live profile's unchunked plan (`unchunked_plan`), by the profile's id
_UNCHUNKED: dict[int, ChunkPlan] = {}


def unchunked_plan(prof: Any) -> ChunkPlan:
    """The profile's model captured for chunking (no regions yet; AutoChunk Sec. 3.1 works on the
    high-level op graph), on inputs rebuilt from the profiled
    shapes and dtypes (the capture is shape-specialised; values do not matter), with the speed model
    calibrated on the profile's device.  Once per profile: the export is most of a plan's time on a
    long graph (Mamba's 5,324 ops at 256 tokens: 151 s of 215 under load, at every call), and a
    profile's plans then rank regions on the same op times."""
    key = id(prof)
    if key not in _UNCHUNKED:
        _UNCHUNKED[key] = _captured_unchunked(prof)
        weakref.finalize(prof, _UNCHUNKED.pop, key, None)
    return _UNCHUNKED[key]


def _captured_unchunked(prof: Any) -> ChunkPlan:
    if getattr(prof, "captured", None) is None:
        raise ValueError(
            "this profile was built from module hooks (the model could not be traced): chunking "
            "needs a torch.export capture of the model"
        )
    if getattr(prof.device, "estimated", False):
        raise ValueError(
            f"autochunk calibrates its speed model by timing the device; {prof.device.name} is an "
            "estimate: profile on the real device (device=None, 'cpu' or 'cuda')"
        )
    flat = _profiled_inputs(prof.captured)
    args, kwargs = tree_unflatten(flat, prof.captured.in_spec)
    # in the torch.autocast regions the profile was taken in, wherever the plan is asked for: the op graph's
    # dtypes (its bytes) and its op times are those of the precision the model runs in
    with accelerator.autocast_as(prof.captured.autocast):
        gm, g = capture(prof.model, args, kwargs)
        base = ac.estimate_memory(g).peak_bytes
        speed = calibrate(_device_of(prof.model, flat))
        return ChunkPlan(measure_times(gm, g, flat), [], speed, base, base, base, gm)


def _profiled_inputs(cap: Any) -> list[torch.Tensor]:
    """The profiled call's flat inputs (positional, then keyword) as zero tensors of their shapes."""
    flat = []
    for i, meta in enumerate(cap.input_meta):
        if meta is None:
            raise ValueError(
                f"input {i} of the profiled call is not a tensor: autochunk captures the model on "
                "tensor inputs only"
            )
        flat.append(torch.zeros(meta[0], dtype=meta[1]))
    return flat


def _kwarg_names(gm: torch.fx.GraphModule | None) -> tuple[str, ...]:
    """Keyword inputs of the captured call, in the order of the graph's inputs (after the positional
    ones)."""
    spec = getattr(gm, "_in_spec", None)
    if spec is None or spec.num_children != 2:
        return ()
    return tuple(spec.child(1).context or ())


def _graph_args(g: ac.OpGraph) -> tuple[torch.Tensor, ...]:
    """The user inputs of a captured op graph as zero tensors of their shapes and dtypes."""
    return tuple(
        torch.zeros(n.shape, dtype=getattr(torch, n.dtype))
        for n in g.nodes
        if n.op == "input" and n.kind == "input"
    )


class ChunkedModule(torch.nn.Module):
    """A chunk plan's GraphModule (`chunked`, readable loops in ``chunked.code``) behind the model's call
    signature.  Runs without autograd (chunk plans are inference plans) and refuses inputs of other
    shapes: the loops are specialised to the planned lengths.  `autocast`: the ``torch.autocast`` regions
    the plan was captured in (`accelerator.autocast_as`; None: the caller's): the op graph holds no casts
    (autocast casts as the ops run), so outside them it ran in float32, 46% over its planned activations
    (GPT-2, 512 tokens, bfloat16).  Their cast cache is off: it would hold a low-precision copy of every
    weight to the forward's end, which the op graph does not count (15% over the planned activations at
    256 tokens); uncached, each copy lives for its op, and the values are the same."""

    def __init__(
        self,
        model: torch.nn.Module,
        chunked: torch.fx.GraphModule,
        g: ac.OpGraph,
        kwarg_names: Sequence[str] = (),
        autocast: tuple[tuple[str, torch.dtype], ...] | None = None,
    ) -> None:
        super().__init__()
        self._orig_mod = model
        self._autocast = autocast
        self.chunked = chunked
        self._inputs = [(n.name, n.shape, n.dtype) for n in g.nodes if n.op == "input" and n.kind == "input"]
        self._kwarg_names = tuple(kwarg_names)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if set(kwargs) != set(self._kwarg_names) and kwargs:
            raise StalePlanError(
                f"the chunk plan was made for keyword inputs {list(self._kwarg_names)}, got {sorted(kwargs)}"
            )
        args = (*args, *(kwargs[k] for k in self._kwarg_names if kwargs))
        if len(args) != len(self._inputs):
            raise StalePlanError(
                f"the chunk plan was made for {len(self._inputs)} positional inputs "
                f"({', '.join(n for n, _, _ in self._inputs)}), got {len(args)}"
            )
        for a, (name, shape, dtype) in zip(args, self._inputs, strict=True):
            if not isinstance(a, torch.Tensor) or tuple(a.shape) != shape or str(a.dtype) != f"torch.{dtype}":
                got = (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
                raise StalePlanError(
                    f"input {name!r} is {got}, but the chunk plan was made for {shape} {dtype}: chunk loops "
                    "are shape-specific; profile and plan again for these shapes"
                )
        with torch.no_grad(), accelerator.autocast_as(self._autocast, cache=False):
            return self.chunked(*args)


def export_chunks(
    plan: Any, path: Any = None, *, model: torch.nn.Module | None = None, overwrite: bool = False
) -> ChunkedModule:
    """`memviz.export` of an autochunk plan: the model with the plan's regions as loops (AutoChunk
    Sec. 3.2 code generation, `ChunkCodeGen`).  A plan from
    `memviz.plan` reuses its capture; a loaded plan (or another model) is captured again on the
    planned input shapes, checked against the plan's fingerprint, and its regions re-validated."""
    from memviz.plans.planfile import write_text_safely
    from memviz.profiling.capture import fingerprint

    prof = getattr(plan, "profile", None)
    target = model if model is not None else getattr(prof, "model", None)
    if target is None:
        raise ValueError("the plan carries no model (loaded from JSON?): pass model=")
    cp = plan.chunk_plan()
    regions = accelerator.autocast_from_json(plan.graph.meta.get("autocast"))
    if cp.gm is None or prof is None or target is not prof.model:
        args = _graph_args(cp.graph)
        expected = plan.model.get("fingerprint")
        if expected and fingerprint(target, args, None, "inference") != expected:
            raise StalePlanError(
                "the model differs from the one this plan was made for (parameter names, shapes or "
                "dtypes, or input shapes changed): profile and plan again"
            )
        with accelerator.autocast_as(regions):
            gm, g = capture(target, args)
        cp = ChunkPlan(g, [], cp.speed, cp.budget_bytes, cp.baseline_peak_bytes, cp.peak_bytes, gm)
        cp = cp.with_chunks(plan.chunks)
    module = ChunkedModule(target, cp.module(), cp.graph, _kwarg_names(cp.gm), regions)
    if path is not None:
        source, plan_path = Path(path), Path(path).with_suffix(".plan.json")
        for p in (source, plan_path):
            if p.exists() and not overwrite:
                raise FileExistsError(f"{p} exists; pass overwrite=True to replace it")
        header = (
            f"# Generated by memviz.export from an autochunk plan ({len(cp.regions)} regions, planned peak "
            f"{plan.peak_bytes} bytes).\n# The forward of ChunkedModule.chunked, for reading: it runs inside "
            "memviz (its globals come from the GraphModule); the plan JSON is beside it.\n"
        )
        write_text_safely(source, header + module.chunked.code, overwrite=overwrite)
        plan.save(plan_path, overwrite=overwrite)
    return module
