"""Activation chunking for long-sequence inference (AutoChunk, Zhao et al. 2024).

Torch-free.  The input is an *op graph*: the inference graph as a list of `OpNode` (one per ATen call,
in execution order) with output shapes, element sizes, storage aliasing and the literal arguments the
dimension rules need.  ``memviz.plans.chunking`` builds it from ``torch.export`` and turns a `ChunkRegion`
back into a loop.

* Chunk flow (Sec. 3.3): `flow_region` traces a chunk dimension from the outputs of a node range back
  to its inputs with per-op rules (`RULES`).  A node whose rule cannot carry the dimension (softmax
  over it, a reshape that splits it, an op without a rule) breaks the flow and the region is illegal;
  the error names that op.  Nodes that some consumer needs whole, and everything they depend on, are
  *hoisted*: computed once before the loop and narrowed where a chunked consumer reads them (the
  paper's "move irrelevant flows out", Sec. 3.3 Graph Optimization).
* The four rules (Sec. 3.3, Eq. 5-7): (1) every region output is chunked or hoisted and the chunked
  part reads at least one narrowed input, (2) outputs are reassembled in place so they equal the
  unchunked ones, (3) every chunked node traces back to a narrowed input without a break, (4) every
  node has exactly one chunk dimension and the loop one extent.
* Memory (Sec. 3.4 Memory Estimation): `estimate_memory` replays the graph with free-after-last-use
  and loops (Eq. 2: inputs and outputs whole, the region's intermediates divided by the chunk count).
* Speed (Sec. 3.4, Eq. 8-10): `SpeedModel` is measured on the device, and so is every op
  (`OpNode.time`; the paper tunes its cost terms on the device too).  The macro term is the number
  of launches (nodes x chunks, times the measured per-op overhead) plus each op's measured work; the
  micro term is the measured loss of matmul efficiency at small row counts (computation density)
  and the copy cost of non-contiguous chunk dimensions (stride).  One term the paper's GPU does not
  need: on a CPU a large buffer is page-faulted in afresh on every call (`OpNode.fresh`, priced at
  the measured `SpeedModel.page_s`), which chunks small enough to be reused do not pay.
* Selection (Sec. 3.4): beam search over regions around the current peak, repeated until the budget
  is met (Eq. 11), each region with the cheapest chunk count that reaches the budget; then every
  region is relaxed to the cheapest count that keeps the graph's peak (the budget, or the lowest
  peak found when the budget is out of reach).  A model of repeated blocks has one twin peak per
  block: a plan's regions are copied to every twin (`with_twins`, not in the paper), so 115 layers
  take one round, not 115.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from solvers.deadline import timed_out
from solvers.ir import DataKind, Graph, GraphBuilder
from solvers.schedule import Schedule, Step

FULL = None  # demand marker: the consumer reads the whole tensor
MEMORY_WEIGHT = 10.0  # selection: relative excess over the budget versus relative slowdown


# --------------------------------------------------------------------------------------------------
# The op graph
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpNode:
    """One ATen call.  `op` is the overload packet name ("linear", "softmax", "getitem"); "input" marks
    placeholders, parameters and buffers (alive before the run, never counted as activations).
    `args`/`kwargs` are the call's literal arguments with tensor operands written as "%name".
    `shapes` has one entry per output (several for split/unbind); `alias` names the input whose
    storage the output views (no new bytes)."""

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    shapes: tuple[tuple[int, ...], ...] = ()
    itemsize: int = 4
    alias: str | None = None
    multi: bool = False
    temps: tuple[int, ...] = ()  # workspace bytes per operand (copies of it), then the unexplained rest
    kind: str = ""  # inputs: "parameter", "buffer" or "input" (the user's), for the memory breakdown
    dtype: str = ""  # element type name ("float32", "int64"): inputs are rebuilt from shape and dtype
    time: float = 0.0  # seconds the whole op took on the device (0: not measured, estimated instead)
    fresh: int = 0  # bytes of fresh pages the op touched in that run (first-touch page faults)
    backend: str = ""  # scaled_dot_product_attention: the kernel the device picks ("flash", "math" ...)
    #: scaled_dot_product_attention: (output dim, chunk length, kernel) where a chunk along that dim runs
    #: another kernel than the whole op (`chunk_backend`); length 2 stands for every length above 1
    chunk_backends: tuple[tuple[int, int, str], ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shapes[0] if self.shapes else ()

    @cached_property  # read for every node on every memory estimate the selection makes
    def nbytes(self) -> int:
        if self.alias is not None or self.op == "input":
            return 0
        return sum(math.prod(s) for s in self.shapes) * self.itemsize

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "op": self.op,
            "inputs": list(self.inputs),
            "args": _jsonable(self.args),
            "kwargs": _jsonable(self.kwargs),
            "shapes": [list(s) for s in self.shapes],
            "itemsize": self.itemsize,
            "alias": self.alias,
            "multi": self.multi,
            "temps": list(self.temps),
            "kind": self.kind,
            "dtype": self.dtype,
            "time": self.time,
            "fresh": self.fresh,
            "backend": self.backend,
            "chunk_backends": [list(c) for c in self.chunk_backends],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpNode:
        return cls(
            d["name"],
            d["op"],
            tuple(d["inputs"]),
            _tupled(d["args"]),
            _tupled(d["kwargs"]),
            tuple(tuple(s) for s in d["shapes"]),
            d["itemsize"],
            d["alias"],
            d["multi"],
            tuple(d.get("temps", ())),
            d.get("kind", ""),
            d.get("dtype", ""),
            float(d.get("time", 0.0)),
            int(d.get("fresh", 0)),
            d.get("backend", ""),
            tuple(tuple(c) for c in d.get("chunk_backends", ())),
        )


def _jsonable(x: Any) -> Any:
    """Strict JSON: lists for tuples, and non-finite floats (a -inf mask fill) as {"float": "-inf"}."""
    if isinstance(x, tuple | list):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return {"float": repr(x)}
    return x


def _tupled(x: Any) -> Any:
    if isinstance(x, dict) and set(x) == {"float"}:
        return float(x["float"])
    if isinstance(x, dict):
        return {k: _tupled(v) for k, v in x.items()}
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


@dataclass(frozen=True)
class OpGraph:
    nodes: tuple[OpNode, ...]
    outputs: tuple[str, ...]

    def __post_init__(self) -> None:
        index = {n.name: i for i, n in enumerate(self.nodes)}
        users: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for v in n.inputs:
                if v not in index:
                    raise ValueError(f"op graph: node {n.name!r} reads unknown node {v!r}")
                if index[v] >= index[n.name]:
                    raise ValueError(f"op graph: node {n.name!r} reads {v!r} before it is computed")
                if n.name not in users[v]:
                    users[v].append(n.name)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "users", users)
        # the smallest output that came from fresh pages in the measured run (most of its bytes
        # faulted): the allocator hands out smaller buffers from memory it keeps
        faulted = [n.nbytes for n in self.nodes if n.nbytes and n.fresh >= n.nbytes // 2]
        object.__setattr__(self, "fresh_from", min(faulted, default=1 << 62))

    def __getitem__(self, name: str) -> OpNode:
        return self.nodes[self.index[name]]  # type: ignore[attr-defined]

    def pos(self, name: str) -> int:
        return self.index[name]  # type: ignore[attr-defined]

    def users_of(self, name: str) -> list[str]:
        return self.users[name]  # type: ignore[attr-defined]

    def root(self, name: str) -> str:
        """The node owning the storage `name` lives in (follows view aliases)."""
        while self[name].alias is not None:
            name = self[name].alias  # type: ignore[assignment]
        return name

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [n.to_dict() for n in self.nodes], "outputs": list(self.outputs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpGraph:
        return cls(tuple(OpNode.from_dict(n) for n in d["nodes"]), tuple(d["outputs"]))


# --------------------------------------------------------------------------------------------------
# Dimension-flow rules (Sec. 3.3 "Chunk Flow"): output chunk dim -> demand on each tensor operand
# --------------------------------------------------------------------------------------------------
class FlowBreak(Exception):
    """The chunk dimension cannot pass this node."""


@dataclass(frozen=True)
class Demand:
    input: str
    dim: int | None  # None: the operand is read whole
    larger_ok: bool = False  # slice from 0: the operand may be longer than the loop extent


Rule = Callable[[OpNode, int, OpGraph], list[Demand]]
RULES: dict[str, Rule] = {}


def _rule(*ops: str) -> Callable[[Rule], Rule]:
    def deco(f: Rule) -> Rule:
        for op in ops:
            RULES[op] = f
        return f

    return deco


def _shape_of(g: OpGraph, ref: Any) -> tuple[int, ...]:
    node = g[ref[1:]]
    return node.shape


def _is_ref(a: Any) -> bool:
    return isinstance(a, str) and a.startswith("%")


def _arg(n: OpNode, i: int, key: str, default: Any = None) -> Any:
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(key, default)


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _bcast_dim(out: Sequence[int], inp: Sequence[int], d: int) -> int | None:
    """Operand dim aligned with output dim `d` under right-aligned broadcasting (None: broadcast)."""
    k = d - (len(out) - len(inp))
    if k < 0 or (inp[k] == 1 and out[d] != 1):
        return None
    return k


def _bcast_demand(g: OpGraph, ref: Any, out: Sequence[int], d: int) -> Demand | None:
    if not _is_ref(ref):
        return None
    return Demand(ref[1:], _bcast_dim(out, _shape_of(g, ref), d))


ELEMENTWISE = (
    "abs",
    "neg",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "relu6",
    "gelu",
    "silu",
    "mish",
    "elu",
    "leaky_relu",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "softplus",
    "erf",
    "reciprocal",
    "sign",
    "floor",
    "ceil",
    "round",
    "square",
    "logical_not",
    "bitwise_not",
    "isnan",
    "isinf",
    "nan_to_num",
    "clamp",
    "clamp_min",
    "clamp_max",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "fmod",
    "remainder",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "bitwise_and",
    "bitwise_or",
    "where",
    "masked_fill",
    "lerp",
    "addcmul",
    "addcdiv",
    "rsub",
    "true_divide",
    "floor_divide",
    "sigmoid_backward",
    "copy",
    "fill",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
)
IDENTITY = (
    "dropout",
    "contiguous",
    "clone",
    "alias",
    "detach",
    "_to_copy",
    "to",
    "lift_fresh_copy",
    "feature_dropout",
    "alpha_dropout",
)
RESHAPES = (
    "view",
    "reshape",
    "_unsafe_view",
    "unflatten",
    "flatten",
    "squeeze",
    "unsqueeze",
    "view_as",
    "reshape_as",
)


@_rule(*ELEMENTWISE)
def _elementwise(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    refs = [a for a in (*n.args, *n.kwargs.values()) if _is_ref(a)]
    return [dm for a in refs if (dm := _bcast_demand(g, a, n.shape, d)) is not None]


@_rule(*IDENTITY)
def _identity(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    return [Demand(n.inputs[0], d)] + [Demand(v, None) for v in n.inputs[1:]]


@_rule("type_as")
def _type_as(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    return [Demand(n.inputs[0], d), Demand(n.inputs[1], None)]


@_rule("expand", "expand_as", "broadcast_to")
def _expand(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    k = _bcast_dim(n.shape, g[n.inputs[0]].shape, d)
    return [Demand(n.inputs[0], k)] + [Demand(v, None) for v in n.inputs[1:]]


def reshape_dim(inp: Sequence[int], out: Sequence[int], d: int) -> int | None:
    """Input dim that output dim `d` of a contiguous reshape is exactly, or None when the reshape
    merges or splits it: the elements before and at the dim must be grouped identically."""
    pre = math.prod(out[:d])
    for k in range(len(inp)):
        if inp[k] == out[d] and math.prod(inp[:k]) == pre:
            return k
    return None


@_rule(*RESHAPES)
def _reshape(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    k = reshape_dim(g[n.inputs[0]].shape, n.shape, d)
    if k is None:
        raise FlowBreak(f"{n.op} merges or splits dim {d}")
    if n.op == "unflatten":  # its sizes would need the chunk length: only dims outside them pass
        ud = _norm(n.args[1], len(g[n.inputs[0]].shape))
        if ud <= d < ud + len(n.args[2]):
            raise FlowBreak(f"unflatten produces dim {d}")
    return [Demand(n.inputs[0], k)] + [Demand(v, None) for v in n.inputs[1:]]


@_rule("permute")
def _permute(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    dims = [_norm(x, len(n.shape)) for x in n.args[1]]
    return [Demand(n.inputs[0], dims[d])]


@_rule("transpose", "t", "swapaxes")
def _transpose(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    r = len(n.shape)
    a, b = (0, 1) if n.op == "t" else (_norm(n.args[1], r), _norm(n.args[2], r))
    return [Demand(n.inputs[0], b if d == a else a if d == b else d)]


@_rule("select")
def _select(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    sd = _norm(n.args[1], len(n.shape) + 1)
    return [Demand(n.inputs[0], d if d < sd else d + 1)]


@_rule("slice")
def _slice(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    r = len(n.shape)
    sd = _norm(_arg(n, 1, "dim", 0), r)
    if d != sd:
        return [Demand(n.inputs[0], d)]
    start, step = _arg(n, 2, "start", None), _arg(n, 4, "step", 1)
    if start in (None, 0) and step == 1:
        return [Demand(n.inputs[0], d, larger_ok=True)]
    raise FlowBreak(f"slice along dim {d} does not start at 0 with step 1")


@_rule("split", "split_with_sizes", "chunk", "tensor_split")
def _split(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    r = len(n.shape)
    sd = _norm(_arg(n, 2, "dim", 0), r)
    if d == sd:
        raise FlowBreak(f"{n.op} splits along dim {d}")
    return [Demand(n.inputs[0], d)]


@_rule("unbind")
def _unbind(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    ud = _norm(_arg(n, 1, "dim", 0), len(n.shape) + 1)
    return [Demand(n.inputs[0], d if d < ud else d + 1)]


@_rule("getitem")
def _getitem(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    if not g[n.inputs[0]].multi:
        raise FlowBreak("getitem of a non-tuple value")
    return [Demand(n.inputs[0], d)]


@_rule("cat", "concat", "concatenate")
def _cat(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    cd = _norm(_arg(n, 1, "dim", 0), len(n.shape))
    if d == cd:
        raise FlowBreak(f"cat joins along dim {d}")
    # cat skips legacy empty 1-D operands; every other operand has the output's rank
    return [Demand(v, d if len(g[v].shape) == len(n.shape) else None) for v in n.inputs]


@_rule("stack")
def _stack(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    sd = _norm(_arg(n, 1, "dim", 0), len(n.shape))
    if d == sd:
        raise FlowBreak(f"stack joins along dim {d}")
    return [Demand(v, d if d < sd else d - 1) for v in n.inputs]


@_rule("linear")
def _linear(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    x, w, b = n.args[0][1:], n.args[1][1:], _arg(n, 2, "bias")
    bias = [Demand(b[1:], 0 if d == len(n.shape) - 1 else None)] if _is_ref(b) else []
    if d == len(n.shape) - 1:  # output features: slice the weight rows
        return [Demand(x, None), Demand(w, 0), *bias]
    return [Demand(x, d), Demand(w, None), *bias]


def _matmul_demands(a: str, b: str, out: Sequence[int], d: int, g: OpGraph) -> list[Demand]:
    sa, sb, r = g[a].shape, g[b].shape, len(out)
    if len(sa) < 2 or len(sb) < 2:
        raise FlowBreak("matmul with a 1-D operand")
    if d == r - 2:
        return [Demand(a, len(sa) - 2), Demand(b, None)]
    if d == r - 1:
        return [Demand(a, None), Demand(b, len(sb) - 1)]
    return [Demand(a, _bcast_dim(out[:-2], sa[:-2], d)), Demand(b, _bcast_dim(out[:-2], sb[:-2], d))]


@_rule("matmul", "bmm", "mm")
def _matmul(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    return _matmul_demands(n.args[0][1:], n.args[1][1:], n.shape, d, g)


@_rule("addmm", "baddbmm")
def _addmm(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    bias = _bcast_demand(g, n.args[0], n.shape, d)
    return [*([bias] if bias else []), *_matmul_demands(n.args[1][1:], n.args[2][1:], n.shape, d, g)]


def einsum_subscripts(eq: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Per-operand subscripts and the output's of an einsum equation, one character per dim: an
    ellipsis becomes placeholder characters right-aligned across operands (broadcasting), and an
    implicit output is the ellipsis followed by the letters used once, sorted (torch.einsum's rule)."""
    lhs, arrow, rhs = eq.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise FlowBreak(f"einsum equation {eq!r} names {len(terms)} operands, got {len(ranks)}")
    widths = [r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True)]
    width = max([w for t, w in zip(terms, widths, strict=True) if "..." in t], default=0)

    def ell(w: int) -> str:
        return "".join(chr(0x100 + k) for k in range(width - w, width))

    subs = [t.replace("...", ell(w)) for t, w in zip(terms, widths, strict=True)]
    if arrow:
        return subs, rhs.replace("...", ell(width))
    letters = "".join(subs)
    once = sorted(c for c in set(letters) if c.isascii() and c.isalpha() and letters.count(c) == 1)
    return subs, ell(width) + "".join(once)


@_rule("einsum")
def _einsum(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    refs = [a[1:] for a in n.args[1]]
    subs, out = einsum_subscripts(n.args[0], [len(g[v].shape) for v in refs])
    letter = out[d]
    demands = []
    for v, sub in zip(refs, subs, strict=True):
        if sub.count(letter) > 1:
            raise FlowBreak(f"einsum takes a diagonal along dim {d}")
        k = sub.find(letter)
        broadcast = k < 0 or (g[v].shape[k] == 1 and n.shape[d] != 1)
        demands.append(Demand(v, None if broadcast else k))
    return demands


@_rule("glu")
def _glu(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    if _norm(_arg(n, 1, "dim", -1), len(n.shape)) == d:
        raise FlowBreak(f"glu halves dim {d}")
    return [Demand(n.inputs[0], d)]


@_rule("softmax", "log_softmax", "_softmax", "_log_softmax", "cumsum", "cumprod", "logcumsumexp")
def _softmax(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    if _norm(n.args[1], len(n.shape)) == d:
        raise FlowBreak(f"{n.op} normalises over dim {d}")
    return [Demand(n.inputs[0], d)]


@_rule("layer_norm", "rms_norm")
def _layer_norm(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    if d >= len(n.shape) - len(n.args[1]):
        raise FlowBreak(f"{n.op} normalises over dim {d}")
    return [Demand(n.inputs[0], d)] + [Demand(v, None) for v in n.inputs[1:]]


@_rule("group_norm", "instance_norm")
def _group_norm(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    if d != 0:
        raise FlowBreak(f"{n.op} normalises over dim {d}")
    return [Demand(n.inputs[0], 0)] + [Demand(v, None) for v in n.inputs[1:]]


@_rule("batch_norm", "_native_batch_norm_legit_no_training")
def _batch_norm(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    if n.op == "batch_norm" and _arg(n, 5, "training", False):
        raise FlowBreak("batch_norm in training mode normalises over the batch")
    per_channel = 0 if d == 1 else None
    return [Demand(n.inputs[0], d)] + [Demand(v, per_channel) for v in n.inputs[1:]]


@_rule("scaled_dot_product_attention")
def _sdpa(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    """Query positions, batch and heads chunk; V's head dim does not: every chunk of it would run the
    whole attention again (the S x S scores per chunk, and the math kernel, since the head dims of
    Q/K and V then differ).  A causal attention chunked along the queries gets an explicit mask per
    chunk (`causal_chunk_mask`), the rows [lo, lo + n) of the causal one."""
    q, k, v = (a[1:] for a in n.args[:3])
    mask = _arg(n, 3, "attn_mask")
    r = len(n.shape)
    if d == r - 2:
        out = [Demand(q, len(g[q].shape) - 2), Demand(k, None), Demand(v, None)]
    elif d == r - 1:
        raise FlowBreak(
            "scaled_dot_product_attention along V's head dim recomputes the whole attention per chunk"
        )
    else:
        if d == r - 3 and g[k].shape[d] not in (1, n.shape[d]):
            # grouped-query attention: query head i reads key head i // (Hq / Hkv), not head i
            raise FlowBreak("scaled_dot_product_attention with grouped key/value heads (enable_gqa)")
        out = [Demand(x, _bcast_dim(n.shape, g[x].shape, d)) for x in (q, k, v)]
    if _is_ref(mask):
        ms = _shape_of(g, mask)
        out.append(Demand(mask[1:], _bcast_dim(n.shape[:-1] + (ms[-1],), ms, d)))
    return out


def causal_chunk_mask(n: OpNode, d: int) -> bool:
    """Whether `n` chunked along output dim `d` runs with an explicit per-chunk causal mask (an
    ``is_causal`` attention chunked along its queries: ``is_causal`` aligns a chunk's first query with
    the first key, so the loop passes ``ones(n, S).tril(lo)`` instead)."""
    return (
        n.op == "scaled_dot_product_attention"
        and d == len(n.shape) - 2
        and bool(_arg(n, 5, "is_causal", False))
    )


@_rule("embedding")
def _embedding(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    w, idx = n.args[0][1:], n.args[1][1:]
    if d == len(n.shape) - 1:
        return [Demand(w, 1), Demand(idx, None)]
    return [Demand(w, None), Demand(idx, d)]


@_rule("conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d")
def _conv(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    x, w = n.args[0][1:], n.args[1][1:]
    b = _arg(n, 2, "bias")
    extra = [b[1:]] if _is_ref(b) else []
    if d == 0:
        return [Demand(x, 0), Demand(w, None)] + [Demand(v, None) for v in extra]
    groups = n.args[8] if n.op == "convolution" and len(n.args) > 8 else _arg(n, 6, "groups", 1)
    transposed = n.op.startswith("conv_transpose") or (
        n.op == "convolution" and bool(_arg(n, 6, "transposed"))
    )
    if d == 1 and groups == 1 and not transposed:
        return [Demand(x, None), Demand(w, 0)] + [Demand(v, 0) for v in extra]
    raise FlowBreak(f"{n.op} mixes neighbouring positions along dim {d}")


@_rule(
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool2d",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "upsample_bilinear2d",
    "upsample_linear1d",
    "upsample_bicubic2d",
    "upsample_trilinear3d",
)
def _pool(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    spatial = int(next(c for c in reversed(n.op) if c.isdigit()))
    if d >= len(n.shape) - spatial:
        raise FlowBreak(f"{n.op} mixes neighbouring positions along dim {d}")
    return [Demand(n.inputs[0], d)]


@_rule("sum", "mean", "amax", "amin", "var", "std", "prod", "logsumexp", "any", "all")
def _reduce(n: OpNode, d: int, g: OpGraph) -> list[Demand]:
    inp = g[n.inputs[0]].shape
    dims = _arg(n, 1, "dim")
    if dims is None or dims == []:
        raise FlowBreak(f"{n.op} reduces every dim")
    dims = {_norm(x, len(inp)) for x in (dims if isinstance(dims, tuple | list) else [dims])}
    keepdim = _arg(n, 2, "keepdim", False) if n.op not in ("var", "std") else n.kwargs.get("keepdim", False)
    kept = list(range(len(inp))) if keepdim else [k for k in range(len(inp)) if k not in dims]
    if kept[d] in dims:
        raise FlowBreak(f"{n.op} reduces dim {d}")
    return [Demand(n.inputs[0], kept[d])]


#: assertions torch.export inserts (a `.to(dtype)` checks its operand's dtype, device and layout): they
#: produce nothing and hold for every chunk when they held at capture, so a region omits them
CHECKS = ("_assert_tensor_metadata", "_assert_async", "_assert_scalar")


def demands_of(node: OpNode, d: int, g: OpGraph) -> list[Demand]:
    """Demands of `node` chunked along output dim `d`; FlowBreak when the dim cannot pass."""
    rule = RULES.get(node.op)
    if rule is None:
        raise FlowBreak(f"no dimension rule for {node.op}")
    try:
        return rule(node, d, g)
    except (IndexError, TypeError, KeyError, StopIteration) as e:  # unexpected argument layout
        raise FlowBreak(f"{node.op}: unsupported arguments ({type(e).__name__})") from e


# --------------------------------------------------------------------------------------------------
# Regions and their flow (Sec. 3.3, Algorithm 1)
# --------------------------------------------------------------------------------------------------
class IllegalRegion(ValueError):
    """The region breaks one of the four chunk rules; `node`/`op` name where the flow breaks."""

    def __init__(self, msg: str, node: str | None = None, op: str | None = None) -> None:
        super().__init__(msg)
        self.node, self.op = node, op


@dataclass(frozen=True)
class Flow:
    """A legal chunk flow over nodes [start, end]: `dims` for chunked nodes, `hoisted` nodes computed
    whole before the loop, `narrow` = {(value, dim)} read in chunks inside the loop, `outputs` the
    chunked region outputs with their dims, `extent` the loop length."""

    start: str
    end: str
    dims: dict[str, int]
    hoisted: tuple[str, ...]
    narrow: dict[str, list[int]]
    outputs: dict[str, int]
    extent: int


def region_nodes(g: OpGraph, start: str, end: str) -> list[str]:
    s, e = g.pos(start), g.pos(end)
    if s > e:
        raise IllegalRegion(f"region start {start!r} comes after its end {end!r}")
    return [n.name for n in g.nodes[s : e + 1] if n.op not in ("input", "output")]


def region_outputs(g: OpGraph, nodes: Sequence[str]) -> list[str]:
    inside = set(nodes)
    return [n for n in nodes if n in g.outputs or any(u not in inside for u in g.users_of(n))]


def flow_region(g: OpGraph, start: str, end: str, out_dims: dict[str, int]) -> Flow:
    """Trace the chunk flow bottom-up from the region outputs (Algorithm 1).  `out_dims` gives the
    chunk dim of region outputs; an output not listed must end up hoisted.  Raises IllegalRegion."""
    force: frozenset[str] = frozenset()
    while True:
        flow = _flow(g, start, end, out_dims, force)
        # an item of a hoisted multi-output op (q of a fused qkv split) is hoisted too: a tuple
        # cannot be narrowed, its items can
        more = {
            x
            for x in flow.dims
            if g[x].op == "getitem" and g[g[x].inputs[0]].multi and g[x].inputs[0] not in flow.dims
        }
        if not more:
            return flow
        if more <= force:  # a region output that is such an item cannot be hoisted
            x = sorted(more)[0]
            raise IllegalRegion(
                f"getitem {x!r} reads a tuple that is not chunked; start the region after {g[x].inputs[0]!r}",
                x,
                "getitem",
            )
        force |= more


def _flow(g: OpGraph, start: str, end: str, out_dims: dict[str, int], force: frozenset[str]) -> Flow:
    nodes = region_nodes(g, start, end)
    inside = set(nodes)
    outs = region_outputs(g, nodes)
    for o in out_dims:
        if o not in outs:
            raise IllegalRegion(f"{o!r} is not an output of the region {start}..{end}", o, None)
        if g[o].multi:  # a tuple has no buffer to reassemble chunks in; its items each have one
            raise IllegalRegion(
                f"{g[o].op} {o!r} returns several tensors read after the region: end the region before "
                "it, or after every item of it is read",
                o,
                g[o].op,
            )
    demand: dict[str, list[int | None]] = {n: [] for n in nodes}
    dims: dict[str, int] = {}
    hoisted: list[str] = []
    narrow: dict[str, list[int]] = {}
    extent: int | None = None
    for o, d in out_dims.items():
        rank = len(g[o].shape)
        if not 0 <= d < rank:
            raise IllegalRegion(f"{o!r} has no dim {d} (rank {rank})", o, g[o].op)
    constant: set[str] = set()
    for name in nodes:
        if all(v in constant for v in g[name].inputs):
            constant.add(name)
    for name in reversed(nodes):
        node = g[name]
        if node.op in CHECKS:  # no output to chunk or hoist: the loop leaves it out
            continue
        wanted = demand[name] + ([out_dims[name]] if name in out_dims else [])
        if name in outs and name not in out_dims:
            wanted.append(FULL)
        # built from creation ops only (a causal mask from ones/tril): hoisted, read in chunks
        creation = name in constant
        if name in force and name not in out_dims:
            wanted.append(FULL)
        if creation or not wanted or FULL in wanted or len(set(wanted)) > 1:
            # Rule 4 allows one setting per node: a node read whole, or along two dims, is hoisted.
            if name in out_dims:
                raise IllegalRegion(
                    f"{node.op} {name!r} is a region output read whole inside the region; it cannot be "
                    f"chunked along dim {out_dims[name]}",
                    name,
                    node.op,
                )
            hoisted.append(name)
            for v in node.inputs:
                if v in inside:
                    demand[v].append(FULL)
            continue
        d = wanted[0]
        L = node.shape[d] if d < len(node.shape) else -1
        if extent is None:
            extent = L
        if L != extent:
            raise IllegalRegion(
                f"{node.op} {name!r} has extent {L} along chunk dim {d}, the loop runs over {extent}",
                name,
                node.op,
            )
        try:
            ds = demands_of(node, d, g)
        except FlowBreak as e:
            raise IllegalRegion(f"the chunk flow breaks at {node.op} {name!r}: {e}", name, node.op) from e
        dims[name] = d
        for dm in ds:
            if dm.input in inside:
                demand[dm.input].append(dm.dim)
            elif dm.dim is not None:
                L_in = g[dm.input].shape[dm.dim]
                if L_in != extent and not (dm.larger_ok and L_in >= extent):
                    raise IllegalRegion(
                        f"{node.op} {name!r} reads {dm.input!r} along dim {dm.dim} with extent "
                        f"{L_in}, the loop runs over {extent}",
                        name,
                        node.op,
                    )
                narrow.setdefault(dm.input, [])
                if dm.dim not in narrow[dm.input]:
                    narrow[dm.input].append(dm.dim)
    # hoisted nodes read by chunked nodes along a dim are narrowed like region inputs
    for name in nodes:
        if name in dims:
            for dm in demands_of(g[name], dims[name], g):
                if dm.input in inside and dm.input not in dims and dm.dim is not None:
                    if g[dm.input].shape[dm.dim] < (extent or 0):
                        raise IllegalRegion(
                            f"{g[name].op} {name!r} reads hoisted {dm.input!r} along dim "
                            f"{dm.dim}, shorter than the loop",
                            name,
                            g[name].op,
                        )
                    narrow.setdefault(dm.input, [])
                    if dm.dim not in narrow[dm.input]:
                        narrow[dm.input].append(dm.dim)
    if not dims:
        raise IllegalRegion(f"nothing in {start}..{end} can be chunked along the requested dims")
    if not narrow:  # Rule 3: the flow must trace back to a chunked input
        raise IllegalRegion(f"the chunk flow of {start}..{end} reaches no input")
    chunked_outs = {o: dims[o] for o in outs if o in dims}
    if not chunked_outs:
        raise IllegalRegion(f"no output of {start}..{end} is chunked")
    return Flow(start, end, dims, tuple(reversed(hoisted)), narrow, chunked_outs, int(extent or 0))


def candidate_flows(g: OpGraph, start: str, end: str, max_outputs: int = 3) -> list[Flow]:
    """Every legal flow of [start, end] (Algorithm 1's loop over output dims).  The first region output
    picks the dim; the others take every dim with the same extent."""
    nodes = region_nodes(g, start, end)
    outs = [o for o in region_outputs(g, nodes) if g[o].inputs]
    if not outs or len(outs) > max_outputs:
        return []
    found: list[Flow] = []
    seen: set[tuple] = set()

    def assign(i: int, acc: dict[str, int], extent: int | None) -> None:
        if i == len(outs):
            try:
                f = flow_region(g, start, end, dict(acc))
            except IllegalRegion:
                return
            key = tuple(sorted(f.dims.items()))
            if key not in seen:
                seen.add(key)
                found.append(f)
            return
        shape = g[outs[i]].shape
        for d, L in enumerate(shape):
            if L > 1 and (extent is None or L == extent):
                assign(i + 1, {**acc, outs[i]: d}, L)

    assign(0, {}, None)
    return found


# --------------------------------------------------------------------------------------------------
# Memory estimation (Sec. 3.4, Eq. 2)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkRegion:
    flow: Flow
    chunks: int

    @property
    def step(self) -> int:
        return -(-self.flow.extent // self.chunks)


def _slice_bytes(node: OpNode, d: int, size: int) -> int:
    """Bytes of `size` entries of the node's outputs along dim `d` (views included)."""
    return (
        sum(math.prod(size if i == d else s for i, s in enumerate(shape)) for shape in node.shapes)
        * node.itemsize
    )


def _chunk_bytes(node: OpNode, d: int, size: int) -> int:
    return _slice_bytes(node, d, size) if node.alias is None else 0


#: the dtypes autocast casts (`OpNode.dtype` names them without the ``torch.`` prefix)
_FLOATING = frozenset({"float64", "float32", "float16", "bfloat16"})


def sdpa_temps(g: OpGraph, n: OpNode, backend: str | None = None) -> tuple[int, ...]:
    """Bytes `scaled_dot_product_attention` allocates besides its output, per operand (in `n.inputs`
    order) then the rest, for the kernel the device picked (`n.backend`, or `backend`), as torch's composite
    ``scaled_dot_product_attention`` dispatches it (what a storage tracker sees):

    * fused kernels (``flash``, ``efficient``, ``cudnn``; CPU flash included): a boolean mask becomes an
      additive one of the query dtype (``where``, the mask's shape); the kernel returns the
      log-sum-exp (B, H, L) in float32 beside the output.  No L x S scores.
    * ``math`` (``_scaled_dot_product_attention_math``): at its peak (the softmax) the scaled query,
      key and value repeated for grouped-query attention, ``is_causal``'s L x S additive mask (its
      bool source and the scaled key are gone by then), and the B x H x L x S scores with their
      softmax.

    An operand of another floating dtype than the output's is ``torch.autocast``'s copy in the output's
    dtype (eager attention takes one dtype; the graph holds no casts), alive while the op runs.

    The AutoChunk paper (Sec. 3.4, Eq. 2) counts an op's workspace with its activation; per operand
    so that chunking along the queries shrinks the query's share and not the key's."""
    q, k, v = (g[a[1:]] for a in n.args[:3])
    mask = _arg(n, 3, "attn_mask")
    causal = bool(_arg(n, 5, "is_causal", False))
    isz = n.itemsize
    L, S = q.shape[-2], k.shape[-2]
    per: dict[str, int] = {
        x.name: math.prod(x.shape) * isz
        for x in (q, k, v, g[mask[1:]] if _is_ref(mask) else None)
        if x is not None and x.dtype in _FLOATING and x.dtype != n.dtype
    }
    if _is_ref(mask) and g[mask[1:]].dtype == "bool":
        per[mask[1:]] = per.get(mask[1:], 0) + math.prod(g[mask[1:]].shape) * isz
    if (backend or n.backend) == "math":
        rep = max(1, q.shape[-3] // k.shape[-3]) if len(q.shape) >= 3 and bool(
            n.kwargs.get("enable_gqa", False)) else 1
        per[q.name] = per.get(q.name, 0) + math.prod(q.shape) * isz
        if rep > 1:
            per[k.name] = per.get(k.name, 0) + math.prod(k.shape) * isz * rep
            per[v.name] = per.get(v.name, 0) + math.prod(v.shape) * isz * rep
        scores = math.prod(n.shape[:-1]) * S * isz
        rest = 2 * scores + (L * S * isz if causal else 0)
    else:
        rest = math.prod(q.shape[:-1]) * 4
    return (*(per.get(x, 0) for x in n.inputs), rest)


def _chunked_inputs(g: OpGraph, node: OpNode, d: int) -> frozenset[str]:
    """Operands `node` reads in chunks along output dim `d`; memoised on the graph (the selection
    estimates thousands of plans over the same nodes)."""
    cache = g.__dict__.setdefault("_chunked_inputs", {})
    key = (node.name, d)
    if key not in cache:
        cache[key] = frozenset(dm.input for dm in demands_of(node, d, g) if dm.dim is not None)
    return cache[key]


def chunk_backend(node: OpNode, d: int, size: int) -> str:
    """The kernel a chunk of `size` along output dim `d` of an attention runs: the whole op's, unless
    the device picks another for the chunk's operands (`OpNode.chunk_backends`: a multi-query
    attention's one key/value head, broadcast over the query heads, sends the whole op to the math
    kernel; a one-head chunk matches it and runs a fused kernel without the L x S scores)."""
    length = min(size, 2)
    return next((k for dim, n, k in node.chunk_backends if dim == d and n == length), node.backend)


def chunk_workspace(g: OpGraph, node: OpNode, d: int, size: int, extent: int) -> int:
    """Workspace of one chunk of `node` along output dim `d` (`size` of `extent`), for the kernel the
    chunk runs (`chunk_backend`): copies of chunked operands shrink with the chunk, copies of whole
    ones do not, the rest shrinks; a causal attention chunked along its queries also holds its chunk's
    causal mask (bool and additive, `size` x S; `causal_chunk_mask`)."""
    frac = size / extent
    chunked_in = _chunked_inputs(g, node, d)
    backend = chunk_backend(node, d, size)
    temps = node.temps if backend == node.backend else sdpa_temps(g, node, backend)
    ws = sum(w * (frac if v in chunked_in else 1.0) for v, w in zip(node.inputs, temps, strict=False))
    if len(temps) > len(node.inputs):
        ws += temps[-1] * frac
    if backend == "math" and bool(_arg(node, 5, "is_causal", False)) and not causal_chunk_mask(node, d):
        # the rest's is_causal mask is L x S whatever batch or heads a chunk holds: it does not shrink
        ws += node.shape[-2] * g[node.args[1][1:]].shape[-2] * node.itemsize * (1 - frac)
    if causal_chunk_mask(node, d):
        # the math kernel's rest already counts is_causal's additive mask, shrunk to the chunk
        additive = 0 if backend == "math" else node.itemsize
        ws += size * g[node.args[1][1:]].shape[-2] * (1 + additive)
    return int(ws)


def hoisted_only(g: OpGraph, f: Flow) -> list[str]:
    """Hoisted values read by nothing but other hoisted nodes (views included): dead before the loop."""
    hoisted = set(f.hoisted)
    done: dict[str, bool] = {}

    def only(h: str) -> bool:
        if h not in done:
            done[h] = h not in g.outputs and all(
                u in hoisted and (g[u].alias != h or only(u)) for u in g.users_of(h)
            )
        return done[h]

    return [h for h in f.hoisted if only(h)]


@dataclass(frozen=True)
class MemoryEstimate:
    peak_bytes: int
    peak_node: str
    curve: tuple[tuple[str, int], ...]  # (node, resident bytes while it runs)


@dataclass(frozen=True)
class _Static:
    """Per-graph tables `estimate_memory` reads on every call, by node position: the selection makes
    thousands of estimates over the same graph, and name lookups were most of their time."""

    names: tuple[str, ...]
    skip: tuple[bool, ...]  # input and output nodes: nothing runs
    alias: tuple[int, ...]  # position of the node whose storage this one views, or -1
    nbytes: tuple[int, ...]
    full: tuple[int, ...]  # bytes of the outputs even for a view (a region output's own buffer)
    temps: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[int, ...]


def _static(g: OpGraph) -> _Static:
    st = g.__dict__.get("_estimate_static")
    if st is None:
        idx = g.index  # type: ignore[attr-defined]
        st = _Static(
            tuple(n.name for n in g.nodes),
            tuple(n.op in ("input", "output") for n in g.nodes),
            tuple(-1 if n.alias is None else idx[n.alias] for n in g.nodes),
            tuple(n.nbytes for n in g.nodes),
            tuple(_full_bytes(n) for n in g.nodes),
            tuple(sum(n.temps) for n in g.nodes),
            tuple(tuple(idx[v] for v in n.inputs) for n in g.nodes),
            tuple(idx[o] for o in g.outputs),
        )
        g.__dict__["_estimate_static"] = st
    return st


def estimate_memory(
    g: OpGraph, regions: Sequence[ChunkRegion] = (), temp: Callable[[OpNode], int] | None = None
) -> MemoryEstimate:
    """Activation bytes while each node runs: new storages of the run (outputs included, inputs and
    parameters not), freed after their last reader.  A region runs its hoisted nodes, allocates its
    outputs whole, then one chunk of its chunked nodes at a time (Eq. 2)."""
    st = _static(g)
    idx = g.index  # type: ignore[attr-defined]
    temps = st.temps if temp is None else tuple(temp(n) for n in g.nodes)
    # a region is one item, at its last position: a storage read inside it dies after the region
    region_of: dict[int, int] = {}
    end_of: list[int] = []
    for ri, r in enumerate(regions):
        s, e = g.pos(r.flow.start), g.pos(r.flow.end)
        for i in range(s, e + 1):
            if not st.skip[i]:
                region_of[i] = ri
        end_of.append(e)
    # a chunked region output is reassembled in a buffer of its own, even where it was a view
    buffers = {idx[o] for r in regions for o in r.flow.outputs}
    alias, nbytes, full = st.alias, st.nbytes, st.full
    if buffers:
        roots = list(range(len(st.names)))
        for i, a in enumerate(alias):
            if a >= 0 and i not in buffers:
                roots[i] = roots[a]  # aliases point backwards: the alias's root is already known
    else:
        roots = g.__dict__.get("_estimate_roots")
        if roots is None:
            roots = list(range(len(st.names)))
            for i, a in enumerate(alias):
                if a >= 0:
                    roots[i] = roots[a]
            g.__dict__["_estimate_roots"] = roots

    def own(v: int) -> int:
        return full[v] if v in buffers else nbytes[v]

    far = 1 << 60
    last = [-1] * len(st.names)
    for i, ins in enumerate(st.inputs):
        at = end_of[region_of[i]] if i in region_of else i
        for v in ins:
            r = roots[v]
            if last[r] < at:
                last[r] = at
    for o in st.outputs:
        last[roots[o]] = far
    live: set[int] = set()
    cur, peak, peak_node = 0, 0, -1
    curve: list[tuple[str, int]] = []
    dying: list[tuple[int, int]] = []  # (last reader, storage): a heap, so freeing is not a scan

    def keep(v: int) -> None:
        live.add(v)
        heapq.heappush(dying, (last[v], v))

    def free_dead(p: int) -> None:
        nonlocal cur
        while dying and dying[0][0] <= p:
            s = heapq.heappop(dying)[1]
            if s in live:
                live.discard(s)
                cur -= own(s)

    def run(i: int, extra: int = 0, b: int | None = None) -> None:
        nonlocal cur, peak, peak_node
        whole = b is None
        b = nbytes[i] if whole else b
        resident = cur + extra + b + temps[i]
        curve.append((st.names[i], resident))
        if resident > peak:
            peak, peak_node = resident, i
        if whole:
            cur += b
            if b:
                keep(i)

    done_regions: set[int] = set()
    for p in range(len(st.names)):
        if st.skip[p]:
            continue
        ri = region_of.get(p)
        if ri is None:
            run(p)
            free_dead(p)
            continue
        if ri in done_regions:
            continue
        done_regions.add(ri)
        r = regions[ri]
        f = r.flow
        for h in f.hoisted:
            run(idx[h])
        for h in hoisted_only(g, f):  # read only while hoisting (the ones/tril of a causal mask)
            v = idx[h]
            if v in live:
                live.discard(v)
                cur -= own(v)
        for o in f.outputs:  # output buffers, filled chunk by chunk
            v = idx[o]
            cur += own(v)
            keep(v)
        # one chunk: chunked nodes at chunk size, freed after their last reader inside the chunk
        body = [x for x in region_nodes(g, f.start, f.end) if x in f.dims]
        body_set = set(body)
        blast: dict[str, int] = {}
        for i, x in enumerate(body):
            for v in g[x].inputs:
                rv = g.root(v)
                if rv in body_set:
                    blast[rv] = i
        for i, x in enumerate(body):  # a chunk result lives until it is copied into its buffer
            if x in f.outputs:
                blast[g.root(x)] = max(blast.get(g.root(x), -1), i)
        chunk_live: dict[str, int] = {}
        for i, x in enumerate(body):
            node = g[x]
            b = _chunk_bytes(node, f.dims[x], r.step)
            ws = chunk_workspace(g, node, f.dims[x], r.step, f.extent)
            xi = idx[x]
            run(xi, extra=sum(chunk_live.values()) + ws - temps[xi], b=b)
            if b:
                chunk_live[x] = b
            for s in [s for s in chunk_live if blast.get(s, -1) <= i]:
                del chunk_live[s]
        free_dead(end_of[ri])
    return MemoryEstimate(peak, st.names[peak_node] if peak_node >= 0 else "", tuple(curve))


# --------------------------------------------------------------------------------------------------
# Speed model (Sec. 3.4, Eq. 8-10), calibrated by measurement on the device
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpeedModel:
    """`overhead_s`: measured cost of one extra op launch (macro term, alpha * N_node).
    `matmul_rate`: measured (rows, FLOP/s) pairs of a matmul at different row counts: small chunks run
    at lower density (micro term, gamma * N_density).  `bandwidth`: measured bytes/s of a copy: the
    price of non-contiguous chunk dims (micro term, lambda * N_stride) and of memory-bound ops that
    were not timed.  `page_s`: measured seconds per byte of memory touched for the first time (the
    page faults of a large buffer the allocator maps afresh on every call; 0 where it caches them);
    `fresh_from`: the smallest buffer the allocator was measured to map afresh."""

    overhead_s: float = 5e-6
    matmul_rate: tuple[tuple[int, float], ...] = ((1, 1e9), (64, 2e10), (4096, 5e10))
    bandwidth: float = 5e9
    page_s: float = 0.0
    fresh_from: int = 1 << 62

    def rate(self, rows: float) -> float:
        pts = sorted(self.matmul_rate)
        if rows <= pts[0][0]:
            return pts[0][1]
        for (r0, f0), (r1, f1) in zip(pts, pts[1:], strict=False):
            if rows <= r1:  # interpolate in log(rows)
                t = (math.log(rows) - math.log(r0)) / (math.log(r1) - math.log(r0))
                return f0 + t * (f1 - f0)
        return pts[-1][1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "overhead_s": self.overhead_s,
            "matmul_rate": [list(p) for p in self.matmul_rate],
            "bandwidth": self.bandwidth,
            "page_s": self.page_s,
            "fresh_from": self.fresh_from,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeedModel:
        return cls(
            d["overhead_s"],
            tuple((int(a), float(b)) for a, b in d["matmul_rate"]),
            d["bandwidth"],
            float(d.get("page_s", 0.0)),
            int(d.get("fresh_from", 1 << 62)),
        )


def node_flops(g: OpGraph, n: OpNode) -> float:
    """Multiply-add FLOPs of the compute-bound ops (0 for memory-bound ones)."""
    if not n.shapes or n.alias is not None:
        return 0.0
    out = math.prod(n.shape)
    if n.op in ("linear",):
        return 2.0 * out * g[n.inputs[1]].shape[-1]
    if n.op in ("matmul", "bmm", "mm", "addmm", "baddbmm"):
        a = g[n.args[1 if n.op in ("addmm", "baddbmm") else 0][1:]].shape
        return 2.0 * out * a[-1]
    if n.op == "scaled_dot_product_attention":
        q, k = g[n.args[0][1:]].shape, g[n.args[1][1:]].shape
        return 4.0 * math.prod(q[:-1]) * k[-2] * q[-1]
    if n.op.startswith("conv"):
        w = g[n.args[1][1:]].shape
        return 2.0 * out * math.prod(w[1:])
    return 0.0


def _rows(n: OpNode, fraction: float) -> float:
    """Rows of the matrix product `n` runs at (per head for attention): its computation density."""
    rows = math.prod(n.shape[:-1]) * fraction
    if n.op == "scaled_dot_product_attention":
        rows /= max(1, math.prod(n.shape[:-2]))
    return max(1.0, rows)


def node_time(g: OpGraph, n: OpNode, m: SpeedModel, fraction: float = 1.0, dim: int | None = None) -> float:
    """Estimated seconds for `n` computing `fraction` of its output (one chunk along `dim`).

    A node timed on the device (`n.time`) keeps its measured time whole; a chunk costs one more launch
    (macro term) plus its share of the measured work, slowed by the lower density of a matrix product
    over fewer rows (micro term), and pays first-touch page faults only when the chunk's output is as
    large as a buffer that comes from fresh pages (`fresh_from`).  Untimed nodes: FLOPs at the
    calibrated matmul rate, other ops at the copy bandwidth."""
    if n.op in ("input", "output") or n.alias is not None:
        return m.overhead_s * 0.2 if n.op not in ("input", "output") else 0.0
    fl = node_flops(g, n)
    if n.time > 0:
        if fraction >= 1.0:
            return n.time
        faults = n.fresh * m.page_s
        work = max(0.0, n.time - faults - m.overhead_s) * fraction
        if fl:
            work *= m.rate(_rows(n, 1.0)) / m.rate(_rows(n, fraction))
        fresh = faults * fraction if n.nbytes * fraction >= fresh_from(g, m) else 0.0
        return m.overhead_s + work + fresh
    if fl:
        return m.overhead_s + fl * fraction / m.rate(_rows(n, fraction))
    moved = (n.nbytes + sum(g[v].nbytes or _full_bytes(g[v]) for v in n.inputs)) * fraction
    return m.overhead_s + moved / m.bandwidth


def _full_bytes(n: OpNode) -> int:
    return sum(math.prod(s) for s in n.shapes) * n.itemsize


def graph_time(g: OpGraph, m: SpeedModel) -> float:
    return sum(node_time(g, n, m) for n in g.nodes)


def region_slowdown(g: OpGraph, r: ChunkRegion, m: SpeedModel) -> float:
    """Extra seconds of running `r` chunked: per chunk every chunked node launches again (macro) at
    lower density (micro), non-contiguous narrowed inputs and output chunks are copied (stride); page
    faults the whole ops paid and the chunks do not are saved (see `node_time`)."""
    f = r.flow
    n = r.chunks
    base = sum(node_time(g, g[x], m) for x in f.dims)
    chunked = 0.0
    whole, rest = divmod(f.extent, r.step)  # `whole` chunks of `step`, maybe one shorter chunk
    for x, d in f.dims.items():
        node = g[x]
        chunked += whole * node_time(g, node, m, r.step / f.extent, d)
        if rest:
            chunked += node_time(g, node, m, rest / f.extent, d)
    copies = 0.0
    for v, ds in f.narrow.items():
        for d in ds:
            if any(s != 1 for s in g[v].shape[:d]):  # a chunk along an inner dim is strided
                copies += _full_bytes(g[v]) / m.bandwidth + n * m.overhead_s
    for o in f.outputs:
        copies += _full_bytes(g[o]) / m.bandwidth + n * m.overhead_s + buffer_faults(g, o, m)
    # negative when the chunks run faster (the unchunked ops paid page faults the chunks do not)
    return chunked + copies - base


def buffer_faults(g: OpGraph, o: str, m: SpeedModel) -> float:
    """Seconds of first-touch page faults of the whole buffer a chunked output `o` is copied into: as
    large as a buffer that faulted in the measured run, it comes from fresh pages too."""
    b = _full_bytes(g[o])
    return b * m.page_s if b >= fresh_from(g, m) else 0.0


def fresh_from(g: OpGraph, m: SpeedModel) -> int:
    """The smallest buffer taken to come from fresh pages: the smallest the allocator was measured to
    map afresh, or the smallest output that faulted in the measured run if smaller."""
    return min(m.fresh_from, g.fresh_from)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------
# Selection (Sec. 3.4): beam search over candidate regions around the peak until the budget is met
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    regions: tuple[ChunkRegion, ...]
    peak_bytes: int
    baseline_peak_bytes: int
    budget_bytes: int
    slowdown: float  # estimated relative time increase of the whole graph
    met: bool


def _chunk_counts(extent: int) -> list[int]:
    out, n = [], 2
    while n < extent:
        out.append(n)
        n *= 2
    out.append(extent)
    return out


def candidates_around(g: OpGraph, peak: str, taken: Sequence[ChunkRegion], window: int) -> list[Flow]:
    """Regions [s, e] containing the peak node within `window` nodes, disjoint from chosen ones
    (Algorithm 1, restricted to a local window as in Sec. 3.3 Complexity Optimization)."""
    p = g.pos(peak)
    blocked = {x for r in taken for x in region_nodes(g, r.flow.start, r.flow.end)}
    if peak in blocked:
        return []
    ops = [i for i, n in enumerate(g.nodes) if n.op not in ("input", "output")]
    lo = [i for i in ops if p - window <= i <= p]
    hi = [i for i in ops if p <= i <= p + window]
    flows: dict[tuple, Flow] = {}
    for s in lo:
        if any(g.nodes[k].name in blocked for k in range(s, p + 1)):
            continue
        # Sec. 3.3 two-stage filter: a region starting at a node no chunked flow can enter is skipped
        for e in hi:
            if any(g.nodes[k].name in blocked for k in range(p, e + 1)):
                break
            for f in candidate_flows(g, g.nodes[s].name, g.nodes[e].name):
                # regions differing only in what they hoist run the same loop: keep the tightest
                key = (tuple(sorted(f.dims.items())), f.extent)
                if key not in flows or len(f.hoisted) < len(flows[key].hoisted):
                    flows[key] = f
    return list(flows.values())


def select_chunks(
    g: OpGraph,
    budget_bytes: int,
    model: SpeedModel,
    *,
    beam: int = 4,
    window: int = 24,
    max_regions: int = 16,
    temp: Callable[[OpNode], int] | None = None,
    time_limit: float | None = None,
) -> Selection:
    """Pick regions and chunk counts whose estimated peak fits `budget_bytes` with the least estimated
    slowdown (Eq. 11).  Each round finds the current peak node, tries every legal region around it
    with the cheapest chunk count that fits the budget (or the most useful count), and keeps the
    `beam` best partial plans ranked by slowdown plus their remaining excess over the budget; the
    chosen plan's counts are then relaxed (`_relax`).  After `time_limit` seconds no further
    candidate is tried: the best plan found so far is relaxed and returned (``met`` says whether it
    fits)."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    base = estimate_memory(g, temp=temp)
    total = max(graph_time(g, model), 1e-12)
    if base.peak_bytes <= budget_bytes:
        return Selection((), base.peak_bytes, base.peak_bytes, budget_bytes, 0.0, True)

    states: list[tuple[tuple[ChunkRegion, ...], MemoryEstimate, float, int]] = [
        ((), base, 0.0, base.peak_bytes)
    ]
    finished = list(states)
    cache: dict[tuple, list[Flow]] = {}
    for _ in range(max_regions):
        if deadline is not None and timed_out(deadline, "autochunk: region search", time.perf_counter()):
            break
        nxt: list[tuple[tuple[ChunkRegion, ...], MemoryEstimate, float, int]] = []
        for regions, est, cost, _ in states:
            if est.peak_bytes <= budget_bytes:
                nxt.append((regions, est, cost, 0))
                continue
            key = (est.peak_node, tuple((r.flow.start, r.flow.end) for r in regions))
            if key not in cache:
                cache[key] = candidates_around(g, est.peak_node, regions, window)
            for f in cache[key]:
                if deadline is not None and nxt and timed_out(deadline, "autochunk: region search",
                                                               time.perf_counter()):
                    break  # out of time: rank what this round found
                trial = _best_count(g, regions, f, budget_bytes, model, temp)
                if trial is not None and trial[1].peak_bytes <= est.peak_bytes and _moved(trial[1], est):
                    nxt.append((regions + (trial[0],), trial[1], cost + trial[2], trial[3]))
        if not nxt:
            break
        # memory first (the paper's primary rule): the excess left at the region just added, and the
        # excess left in the whole graph, weigh ten times the relative slowdown; without the second a
        # region that only moves the peak to its neighbour (a fused qkv projection chunked, its
        # contiguous copy not) ranks with one that lowers it, and the beam can fill with dead ends
        nxt.sort(
            key=lambda s: (
                s[2] / total
                + MEMORY_WEIGHT * max(0, s[3] - budget_bytes) / budget_bytes
                + MEMORY_WEIGHT * max(0, s[1].peak_bytes - budget_bytes) / budget_bytes,
                len(s[0]),
            )
        )
        uniq, seen = [], set()
        for s in nxt:
            k = tuple(sorted((r.flow.start, r.flow.end, r.chunks) for r in s[0]))
            if k not in seen:
                seen.add(k)
                uniq.append(s)
        states = uniq[:beam]
        finished.extend(states)
        if all(s[1].peak_bytes <= budget_bytes for s in states):
            break
        # a model of repeated blocks: the best plan's regions copied to every twin block may fit
        # already, where the search would spend a round per block (at 115 layers, hours)
        twins = with_twins(g, states[0][0])
        if len(twins) > len(states[0][0]):
            est = estimate_memory(g, twins, temp=temp)
            if est.peak_bytes <= budget_bytes:
                cost = sum(region_slowdown(g, r, model) for r in twins)
                finished.append((twins, est, cost, est.peak_bytes))
                break
    fitting = [s for s in finished if s[1].peak_bytes <= budget_bytes]
    best = (
        min(fitting, key=lambda s: (s[2], len(s[0])))
        if fitting
        else min(finished, key=lambda s: (s[1].peak_bytes, s[2]))
    )
    chosen = best[0]
    if best[1].peak_bytes > budget_bytes:
        # out of rounds (`max_regions`) or time before every repeated block had its region: a model of
        # L alike blocks has L twin peaks, and one region lowers only its own (its twin's peak then
        # ties the unchunked one).  The last round's plans, each with its regions copied to the twins.
        low = best[1].peak_bytes
        for regions, _, _, _ in states:
            if regions:
                twins = with_twins(g, regions)
                peak = estimate_memory(g, twins, temp=temp).peak_bytes
                if peak < low:
                    chosen, low = twins, peak
    reached = estimate_memory(g, chosen, temp=temp).peak_bytes
    regions = _relax(g, chosen, max(budget_bytes, reached), model, temp)
    est = estimate_memory(g, regions, temp=temp)
    cost = sum(region_slowdown(g, r, model) for r in regions)
    return Selection(
        regions, est.peak_bytes, base.peak_bytes, budget_bytes, cost / total, est.peak_bytes <= budget_bytes
    )


def with_twins(g: OpGraph, regions: Sequence[ChunkRegion]) -> tuple[ChunkRegion, ...]:
    """`regions` plus a copy of each at every other place the graph repeats its ops (same op and
    output shapes node for node: a model's repeated blocks), where the copy is a legal flow
    (`flow_region`) with the same loop and overlaps no region; in graph order.  The beam search adds
    one region per round around the current peak (Sec. 3.4), so a model of L alike blocks, with L twin
    peaks, needs L rounds: the twins give every block the region found for one."""
    taken = [False] * len(g.nodes)
    for r in regions:
        for i in range(g.pos(r.flow.start), g.pos(r.flow.end) + 1):
            taken[i] = True
    out = list(regions)
    sig = [(n.op, n.shapes) for n in g.nodes]
    for r in regions:
        s, e = g.pos(r.flow.start), g.pos(r.flow.end)
        span = sig[s : e + 1]
        outs = {g.pos(o) - s: d for o, d in r.flow.outputs.items()}
        p = 0
        while p + len(span) <= len(g.nodes):
            q = p + len(span)
            if any(taken[p:q]) or sig[p:q] != span:
                p += 1
                continue
            try:
                f = flow_region(g, g.nodes[p].name, g.nodes[q - 1].name,
                                {g.nodes[p + k].name: d for k, d in outs.items()})
            except IllegalRegion:
                p += 1
                continue
            if f.extent != r.flow.extent or len(f.dims) != len(r.flow.dims):
                p += 1
                continue
            out.append(ChunkRegion(f, r.chunks))
            taken[p:q] = [True] * len(span)
            p = q
    return tuple(sorted(out, key=lambda r: g.pos(r.flow.start)))


def _relax(
    g: OpGraph,
    regions: tuple[ChunkRegion, ...],
    target: int,
    model: SpeedModel,
    temp: Callable[[OpNode], int] | None,
) -> tuple[ChunkRegion, ...]:
    """Each region's count lowered to the cheapest that keeps the whole graph's estimated peak at
    `target` (the budget, or the lowest peak found where the budget is out of reach): a region chosen
    for its own peak may be chunked finer than the graph's peak needs once the other regions are in
    place, or not be needed at all (Eq. 11: least slowdown subject to the memory limit)."""
    # None where a region was dropped: positions stay those of `regions` (dropping by slicing shifted
    # the later regions' positions, so a later region counted itself among the others, or was written
    # past the list's end)
    out: list[ChunkRegion | None] = list(regions)
    for i, r in enumerate(regions):

        def fits(n: int, i: int = i, r: ChunkRegion = r) -> bool:
            trial = [ChunkRegion(r.flow, n) if j == i else x for j, x in enumerate(out)]
            kept = tuple(x for j, x in enumerate(trial) if x is not None and (j != i or n > 1))
            return estimate_memory(g, kept, temp=temp).peak_bytes <= target

        if fits(1):  # not needed
            out[i] = None
            continue
        lo, hi = 1, r.chunks
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        options = [hi] + [c for c in _chunk_counts(r.flow.extent) if c > hi][:2]
        n = min(options, key=lambda c: (region_slowdown(g, ChunkRegion(r.flow, c), model), c))
        out[i] = ChunkRegion(r.flow, n)
    return tuple(x for x in out if x is not None)


def _moved(new: MemoryEstimate, old: MemoryEstimate) -> bool:
    """Progress: the peak fell, or it stayed but now sits at another node (another block's twin)."""
    return new.peak_bytes < old.peak_bytes or new.peak_node != old.peak_node


def _best_count(
    g: OpGraph,
    regions: tuple[ChunkRegion, ...],
    f: Flow,
    budget: int,
    model: SpeedModel,
    temp: Callable[[OpNode], int] | None,
) -> tuple[ChunkRegion, MemoryEstimate, float, int] | None:
    """The chunk count with the least estimated slowdown among those that bring the region's own peak
    under the budget: the fewest that do (found by doubling, then bisection), or up to two doublings
    more where smaller chunks run faster (they avoid page faults); memory only falls with more chunks.
    If no count fits, the count after which more chunks lower the peak by under 2% (more chunks then
    only cost time).  The region's own peak, not the graph's: other peaks are the next rounds' work."""
    inside = set(region_nodes(g, f.start, f.end))

    def local(n: int) -> tuple[MemoryEstimate, int]:
        est = estimate_memory(g, (*regions, ChunkRegion(f, n)), temp=temp)
        return est, max(b for x, b in est.curve if x in inside)

    best: tuple[int, MemoryEstimate, int] | None = None
    below = 1  # the largest count known not to fit
    fits = False
    for n in _chunk_counts(f.extent):
        est, peak = local(n)
        if peak <= budget:
            best, fits = (n, est, peak), True
            break
        if best is not None and peak > 0.98 * best[2]:
            break
        best, below = (n, est, peak), n
    if best is None:
        return None
    if fits:
        hi = best[0]
        while hi - below > 1:  # the fewest chunks that fit
            mid = (below + hi) // 2
            est, peak = local(mid)
            if peak <= budget:
                hi, best = mid, (mid, est, peak)
            else:
                below = mid
        options = [hi] + [c for c in _chunk_counts(f.extent) if c > hi][:2]
        n = min(options, key=lambda c: (region_slowdown(g, ChunkRegion(f, c), model), c))
        if n != best[0]:
            best = (n, *local(n))
    r = ChunkRegion(f, best[0])
    return r, best[1], region_slowdown(g, r, model), best[2]


def regions_memory(
    g: OpGraph, regions: Iterable[ChunkRegion], temp: Callable[[OpNode], int] | None = None
) -> MemoryEstimate:
    return estimate_memory(g, tuple(regions), temp=temp)


#: ops drawing random numbers (dropouts only when their `train` argument is true)
RANDOM = (
    "rand_like",
    "randn_like",
    "bernoulli",
    "dropout",
    "feature_dropout",
    "alpha_dropout",
    "native_dropout",
)


def random_chunked(g: OpGraph, regions: Sequence[ChunkRegion]) -> list[str]:
    """Chunked nodes that draw random numbers (a dropout in training mode, rand_like ...).  A loop draws
    them chunk by chunk, in another order than the whole op does, so the chunked outputs equal the
    unchunked ones in distribution only (Sec. 3.3 Rule 2 holds for deterministic ops)."""
    out = []
    for r in regions:
        for x in r.flow.dims:
            n = g[x]
            if n.op in RANDOM and not (n.op.endswith("dropout") and _arg(n, 2, "train", True) is False):
                out.append(x)
    return out


def with_count(r: ChunkRegion, chunks: int) -> ChunkRegion:
    if not 1 <= chunks <= r.flow.extent:
        raise ValueError(
            f"chunk count {chunks} outside 1..{r.flow.extent} for region {r.flow.start}..{r.flow.end}"
        )
    return replace(r, chunks=chunks)


# --------------------------------------------------------------------------------------------------
# The chunked run as a CD-graph + schedule, so `solvers.simulate` checks and measures it
# --------------------------------------------------------------------------------------------------
_SOURCE_KINDS = {"parameter": DataKind.PARAMETER, "buffer": DataKind.BUFFER}


@dataclass(frozen=True)
class ChunkedRun:
    """The inference run with `regions` as loops: a CD-graph with one compute node per op outside the
    regions, an ``empty`` per region output buffer and one compute node per chunked op *per chunk*,
    and the schedule the generated code executes (frees where its references die).  `spans[i]` is
    the [first, last] schedule step of region i."""

    graph: Graph
    schedule: Schedule
    spans: tuple[tuple[int, int], ...]


class _RunBuilder:
    """Emits compute and free steps while tracking which storages are alive (Sec. 3.4, Eq. 2 made
    explicit: the same accounting as `estimate_memory`, step by step)."""

    def __init__(self, g: OpGraph, speed: SpeedModel, name: str) -> None:
        self.g, self.speed = g, speed
        self.b = GraphBuilder(name)
        self.steps: list[Step] = []
        self.data: dict[str, int] = {}  # storage (root node or region buffer) -> data id
        self.live: set[str] = set()
        self.outputs: set[str] = set()

    def compute(
        self,
        name: str,
        op: str,
        ins: Iterable[int],
        out: tuple[str, int, DataKind] | None,
        time: float,
        temp: int,
    ) -> int | None:
        d = None
        outs: tuple[int, ...] = ()
        if out is not None and out[1] > 0:
            d = self.b.data(out[0], out[1], out[2])
            outs = (d,)
        c = self.b.compute(name, tuple(dict.fromkeys(ins)), outs, op=op, time=time, temp_bytes=int(temp))
        self.steps.append(Step("compute", c))
        return d

    def free(self, d: int) -> None:
        self.steps.append(Step("free", d))


def chunked_run(
    g: OpGraph, regions: Sequence[ChunkRegion] = (), speed: SpeedModel | None = None, name: str = "inference"
) -> ChunkedRun:
    """The CD-graph and schedule of running `g` with `regions` chunked (none: the unchunked run).

    Sources (parameters, buffers, user inputs; tied weights once) are alive throughout; every other
    storage is freed after the last op or region reading it, region intermediates after their last
    reader inside the chunk; a chunked region output is an ``empty`` buffer each chunk writes into.
    Times come from the speed model (Eq. 8-10): chunk `k` of an op costs `node_time` at its fraction,
    and each chunk's output copy and strided input copies are charged to the op doing them.
    """
    speed = speed or SpeedModel()
    rb = _RunBuilder(g, speed, name)
    buffers = {o for r in regions for o in r.flow.outputs}

    def store(v: str) -> str:
        while v not in buffers and g[v].alias is not None:
            v = g[v].alias  # type: ignore[assignment]
        return v

    region_of: dict[str, int] = {}
    for ri, r in enumerate(regions):
        for x in region_nodes(g, r.flow.start, r.flow.end):
            region_of[x] = ri
    item = {n.name: ("r", region_of[n.name]) if n.name in region_of else ("n", n.name) for n in g.nodes}
    order: dict[tuple, int] = {}
    for n in g.nodes:
        order.setdefault(item[n.name], len(order))
    last: dict[str, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            last[store(v)] = max(last.get(store(v), -1), order[item[n.name]])
    finals = {store(o) for o in g.outputs}

    def kind(v: str) -> DataKind:
        return DataKind.OUTPUT if v in finals else DataKind.ACTIVATION

    def free_dead(p: int) -> None:
        for s in sorted(s for s in rb.live if s not in finals and last.get(s, -1) <= p):
            rb.live.discard(s)
            rb.free(rb.data[s])

    def whole(n: OpNode) -> None:
        ins = [rb.data[store(v)] for v in n.inputs if store(v) in rb.data]
        d = rb.compute(
            n.name, n.op, ins, (n.name, n.nbytes, kind(n.name)), node_time(g, n, speed), sum(n.temps)
        )
        if d is not None:
            rb.data[n.name] = d
            rb.live.add(n.name)

    for n in g.nodes:
        if n.op == "input" and n.alias is None:
            rb.data[n.name] = rb.b.data(
                n.name,
                _full_bytes(n),
                _SOURCE_KINDS.get(n.kind, DataKind.INPUT),
                shape=n.shape,
                dtype=n.dtype,
            )
    spans: list[tuple[int, int]] = []
    done: set[int] = set()
    for n in g.nodes:
        if n.op in ("input", "output"):
            continue
        key = item[n.name]
        if key[0] == "n":
            whole(n)
            free_dead(order[key])
            continue
        if key[1] in done:
            continue
        done.add(key[1])
        first = len(rb.steps)
        _emit_region(g, regions[key[1]], rb, store, whole, kind)
        free_dead(order[key])
        spans.append((first, len(rb.steps) - 1))
    rb.b.outputs = sorted({rb.data[v] for v in finals if v in rb.data})
    return ChunkedRun(rb.b.build(), tuple(rb.steps), tuple(spans))


def _emit_region(
    g: OpGraph,
    r: ChunkRegion,
    rb: _RunBuilder,
    store: Callable[[str], str],
    whole: Callable[[OpNode], None],
    kind: Callable[[str], DataKind],
) -> None:
    """Hoisted ops whole, output buffers, then every chunk's ops in turn (the generated loop)."""
    f, speed = r.flow, rb.speed
    for h in f.hoisted:
        whole(g[h])
    for h in hoisted_only(g, f):  # read only while hoisting (the ones/tril of a causal mask)
        if h in rb.live:
            rb.live.discard(h)
            rb.free(rb.data[h])
    for o in f.outputs:
        # its page faults only: the copies into the buffer are charged to the chunks, as in
        # region_slowdown
        buf = rb.compute(
            f"{o}.buffer", "empty", (), (o, _full_bytes(g[o]), kind(o)), buffer_faults(g, o, speed), 0
        )
        if buf is not None:
            rb.data[o] = buf
            rb.live.add(o)
    body = [x for x in region_nodes(g, f.start, f.end) if x in f.dims]
    inside = set(body)
    blast: dict[str, int] = {}  # chunk storage -> index of its last reader in the body
    for i, x in enumerate(body):
        for v in g[x].inputs:
            if g.root(v) in inside:
                blast[g.root(v)] = i
        if x in f.outputs:  # a chunk result lives until it is copied into its buffer
            blast[g.root(x)] = max(blast.get(g.root(x), -1), i)
    # a narrowed input chunked along an inner dim is copied by its first reader (the stride term)
    strided = {v for v, ds in f.narrow.items() for d in ds if any(s != 1 for s in g[v].shape[:d])}
    copier = {
        v: next(x for x in body if v in g[x].inputs) for v in strided if any(v in g[x].inputs for x in body)
    }
    for lo in range(0, f.extent, r.step):
        size = min(r.step, f.extent - lo)
        frac = size / f.extent
        chunk: dict[str, int] = {}  # chunk storage (root node in the body) -> data id

        def operand(v: str, chunk: dict[str, int] = chunk) -> int | None:
            return chunk.get(g.root(v)) if g.root(v) in inside else rb.data.get(store(v))

        for i, x in enumerate(body):
            node, d = g[x], f.dims[x]
            ins = [a for a in map(operand, node.inputs) if a is not None]
            t = node_time(g, node, speed, frac, d)
            t += sum(
                _full_bytes(g[v]) * frac / speed.bandwidth + speed.overhead_s
                for v in strided
                if copier.get(v) == x
            )
            if x in f.outputs:  # written into its buffer
                ins.append(rb.data[x])
                t += _slice_bytes(node, d, size) / speed.bandwidth + speed.overhead_s
            ws = chunk_workspace(g, node, d, size, f.extent)
            label = f"{x}[{lo}:{lo + size}]"
            out = rb.compute(
                label, node.op, ins, (label, _chunk_bytes(node, d, size), DataKind.ACTIVATION), t, int(ws)
            )
            if out is not None:
                chunk[x] = out
            for s in [s for s in chunk if blast.get(s, -1) <= i]:
                rb.free(chunk.pop(s))
