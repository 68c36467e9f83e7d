"""What eager autograd saves for backward, and until when: the tensors the joint graph does not show.

The joint graph's backward reads what its decompositions need, which is not always what eager
autograd keeps: ``gather`` saves its whole ``self`` (``gather_backward`` takes it), where the
traced backward only reads the index and a shape.  Eager PyTorch holds every saved tensor in the
op's autograd node until that node has run in the backward (the engine releases its variables right
after it), so such a tensor stays alive far longer than its last reader in the graph says.

Which tensors an op saves is read from autograd itself, not from a table: each forward operator is
run once more on fake tensors (no memory, no compute) with its differentiable inputs requiring
grad, inside ``saved_tensors_hooks`` that record what it packs.  The autograd node's backward in
the joint graph is found through ``seq_nr``, which AOTAutograd copies from the forward op onto
the backward ops its node produced.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree

from memviz.hardware import accelerator
from memviz.profiling.capture import Captured, is_backward, is_in_place, op_key, origin_op
from memviz.profiling.capture import _storage_key as storage_key


def _source_grads(cap: Captured) -> set[str]:
    """Placeholders that require grad: the parameters and inputs the joint graph returns a gradient for."""
    params_with_grad = set(cap.grad_data)
    found = set()
    for n, (kind, key) in zip(cap.gm.graph.find_nodes(op="placeholder"), cap.placeholders, strict=True):
        if ((kind == "param" and cap.param_names.get(key, key) in params_with_grad)
                or (kind == "input" and key in cap.input_grad_data)):
            found.add(n.name)
    return found


def _differentiable(val: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
               for t in pytree.tree_leaves(val))


def _signature(node: torch.fx.Node, requires_grad: set[str]) -> tuple[Any, ...] | None:
    """What decides which of `node`'s tensors autograd saves: its `op_key` on the fake values, which
    input nodes require grad, and which input node each argument is (one passed twice stays
    recognisable); None when the call has no stable description."""
    key = op_key(node.target, *torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val")))
    if key is None:
        return None
    inputs = node.all_input_nodes
    first = {a: k for k, a in enumerate(inputs)}
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    which = tuple(first[a] for a in leaves if isinstance(a, torch.fx.Node))
    return key, tuple(a.name in requires_grad for a in inputs), which


#: an op's `_signature` -> the positions (("in", k): k-th input node, ("out", j): j-th output) of what
#: autograd saves for it
Positions = dict[tuple[Any, ...], frozenset[tuple[str, int]]]


def saved_storages(node: torch.fx.Node, requires_grad: set[str], positions: Positions) -> set[int]:
    """Storage keys (of the input and output fake values in ``meta["val"]``) eager autograd saves
    when it runs `node`'s operator with the inputs in `requires_grad` differentiable.  An op whose
    signature is in `positions` is looked up, not run again (the identical layers of a GPT)."""
    inputs = [storage_key(v) if isinstance(v := a.meta.get("val"), torch.Tensor) else None
              for a in node.all_input_nodes]
    outputs = [storage_key(v) for v in _tensor_vals(node)]
    sig = _signature(node, requires_grad)
    if sig is None or sig not in positions:
        keys = _run_saved_storages(node, requires_grad)
        if sig is None:
            return keys
        positions[sig] = frozenset(
            [("in", k) for k, key in enumerate(inputs) if key in keys]
            + [("out", j) for j, key in enumerate(outputs) if key in keys])
    table = {"in": inputs, "out": outputs}
    return {table[kind][i] for kind, i in positions[sig]} - {None}


def _run_saved_storages(node: torch.fx.Node, requires_grad: set[str]) -> set[int]:
    """`saved_storages` by running the operator on fake tensors under ``saved_tensors_hooks``."""
    prepared = _fake_inputs(node, requires_grad)
    if prepared is None:
        return set()
    mode, args, kwargs = prepared
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    try:
        # the graph holds autocast's casts: run under the caller's autocast (a step profiled inside
        # it), a float32 matmul of the model's own ran in bfloat16 and saved its casts, not its inputs,
        # which the baseline then freed at their last reader (the eager step 512 B, 2.4%, over it)
        with mode, accelerator.autocast_off(), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an op fake tensors cannot run: the graph's own reads stand for it
        return set()
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    # a saved output is a fresh fake tensor: name it by the graph's own output value
    out_keys = {storage_key(t): storage_key(v) for t, v in zip(outs, _tensor_vals(node), strict=False)}
    return {out_keys.get(storage_key(t), storage_key(t)) for t in packed}


def _fake_inputs(node: torch.fx.Node, requires_grad: set[str]) -> tuple[Any, Any, Any] | None:
    """`node`'s arguments as fake tensors (the differentiable ones in `requires_grad` requiring grad),
    and the fake mode; None when the node has no fake values to run on."""
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    mode = torch._guards.detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None or not callable(node.target):
        return None

    def fake(a: torch.fx.Node) -> Any:
        v = a.meta.get("val")
        if not isinstance(v, torch.Tensor):
            return v
        t = v.detach()  # shares `v`'s fake storage, so saved tensors map back to the graph
        return t.requires_grad_(True) if a.name in requires_grad and _differentiable(t) else t

    return mode, torch.fx.node.map_arg(node.args, fake), torch.fx.node.map_arg(node.kwargs, fake)


def carries_grad(node: torch.fx.Node, requires_grad: set[str], cache: dict[Any, bool]) -> bool:
    """Whether eager autograd records `node`'s operator (its output requires grad) when the inputs in
    `requires_grad` do: asked of autograd on fake tensors, once per `_signature`.  ``x.new_empty(...)``
    reads ``x`` for its shape only: its result, and the dropout mask drawn into it, carry no gradient,
    so what ``mask * x`` saves is the mask alone."""
    sig = _signature(node, requires_grad)
    if sig is not None and sig in cache:
        return cache[sig]
    found = True  # an op fake tensors cannot run: taken as differentiable, as its graph reads say
    prepared = _fake_inputs(node, requires_grad)
    if prepared is not None:
        mode, args, kwargs = prepared
        try:
            with mode, accelerator.autocast_off(), torch.enable_grad():
                out = node.target(*args, **kwargs)
            found = any(t.requires_grad for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        except Exception:  # noqa: BLE001
            pass
    if sig is not None:
        cache[sig] = found
    return found


def _tensor_vals(node: torch.fx.Node) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(node.meta.get("val")) if isinstance(t, torch.Tensor)]


def _ancestors(nodes: list[torch.fx.Node]) -> set[str]:
    """FX nodes `nodes` are computed from (themselves included)."""
    stack, found = list(nodes), set()
    while stack:
        n = stack.pop()
        if n.name not in found:
            found.add(n.name)
            stack.extend(n.all_input_nodes)
    return found


def _only_unused_outputs(cap: Captured) -> set[str]:
    """FX nodes only the model outputs the loss does not use are computed from."""
    outs = pytree.tree_leaves(cap.gm.graph.output_node().args[0], is_leaf=lambda x: x is None)
    user = [(n, kind[1]) for n, kind in zip(outs, cap.outputs, strict=False)
            if isinstance(n, torch.fx.Node) and kind is not None and kind[0] == "user"]
    unused = _ancestors([n for n, i in user if i not in cap.tangent_data])
    return unused - _ancestors([n for n, i in user if i in cap.tangent_data])


@dataclasses.dataclass(frozen=True)
class AutogradNodes:
    """Eager autograd's nodes over a capture, by ``seq_nr``: what each saves and when its backward runs.

    `saved`: seq -> data ids its forward ops saved.  `savers`: forward compute id -> its node's seq,
    for the computes that save some tensor.  `saved_by`: data id -> those saving forward compute ids.
    `first`: seq -> first backward compute id of the node (its saved tensors are unpacked just before).
    `released`: seq -> compute id after which the engine frees what the node saved: its last backward
    op, or the loss for a node only outputs the loss does not use lead to (its backward never runs;
    the outputs, which hold it, go once the loss has read them)."""

    saved: dict[int, set[int]]
    savers: dict[int, int]
    saved_by: dict[int, list[int]]
    first: dict[int, int]
    released: dict[int, int]


def autograd_nodes(cap: Captured) -> AutogradNodes:
    """`AutogradNodes` of `cap`: one walk over the joint graph, each forward op autograd records (its
    output requires grad: `carries_grad`) run again on fake tensors under ``saved_tensors_hooks``."""
    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    storage_data: dict[int, int] = {}
    nodes = cap.nodes  # built per access: once here, not once per value
    for name, d in cap.data_of_fx.items():
        val = nodes[name].meta.get("val")
        if isinstance(val, torch.Tensor):
            storage_data.setdefault(storage_key(val), d)
    grads = _source_grads(cap)
    found = AutogradNodes({}, {}, {}, {}, {})
    positions: Positions = {}  # per graph: repeated layers run their ops on fake tensors once
    carries: dict[Any, bool] = {}
    feeds = _only_unused_outputs(cap)
    to_output: set[int] = set()  # seq_nrs of forward ops only outputs the loss does not use need
    originals: dict[tuple[int, str], int] = {}  # (seq, FX input) -> data of autograd's copy of it
    read_back: dict[int, set[int]] = {}  # data id -> seq_nrs of the backward ops that read it
    functions: dict[int, int] = {}  # seq_nr of a custom autograd Function -> its last forward compute
    pos = -1
    for n in cap.gm.graph.nodes:
        if n.op != "call_function":
            continue
        pos = pos_of.get(n.name, pos)
        seq = n.meta.get("seq_nr")
        if is_backward(n):
            # gradient accumulation (``is_gradient_acc``) is the engine's, not the node's: it may run later
            if seq is not None and not n.meta.get("is_gradient_acc"):
                found.released[seq] = pos
                if n.name in pos_of:
                    found.first.setdefault(seq, pos)
                for a in n.all_input_nodes:
                    if a.name in cap.data_of_fx:
                        read_back.setdefault(cap.data_of_fx[a.name], set()).add(seq)
            continue
        if not any(a.name in grads for a in n.all_input_nodes) or not _differentiable(n.meta.get("val")):
            continue
        if not carries_grad(n, grads, carries):
            continue
        grads.add(n.name)
        if seq is None:
            continue
        if n.name in feeds:
            to_output.add(seq)
        if in_custom_function(n):  # autograd does not record a custom Function's forward ops
            functions[seq] = max(functions.get(seq, -1), pos)
            continue
        if _original_copy(n):
            originals[(seq, n.all_input_nodes[0].name)] = cap.data_of_fx.get(n.name, -1)
        keys = saved_storages(n, grads, positions)
        ids = {storage_data[k] for k in keys if k in storage_data}
        for a in n.all_input_nodes:  # an in-place op saves autograd's copy of the input it overwrites
            copy, val = originals.get((seq, a.name), -1), a.meta.get("val")
            if copy >= 0 and isinstance(val, torch.Tensor) and storage_data.get(storage_key(val)) in ids:
                ids.discard(storage_data[storage_key(val)])
                ids.add(copy)
        found.saved.setdefault(seq, set()).update(ids)
        if keys and pos >= 0:  # saving anything makes it a checkpoint's saver, graph data or not
            found.savers[pos] = seq
            for d in ids:
                found.saved_by.setdefault(d, []).append(pos)
    _function_saves(cap, found, functions, read_back)
    _released_by_readers(found, read_back)
    # the outputs go once the loss has read them (`capture._finish`), and with them such a node
    dropped = len(cap.compute_fx) - 1 if cap.loss_compute is None else cap.loss_compute
    for seq in to_output - found.released.keys():
        found.released[seq] = dropped
    return found


def in_custom_function(node: torch.fx.Node) -> bool:
    """Whether FX `node` is an op of a custom ``torch.autograd.Function``'s traced forward (its provenance
    is the Function's ``flat_apply``; its ops share the Function's ``seq_nr``, as its backward's do)."""
    return origin_op(node) == "flat_apply"


def _function_saves(cap: Captured, found: AutogradNodes, functions: dict[int, int],
                    read_back: dict[int, set[int]]) -> None:
    """What each custom ``torch.autograd.Function`` (kept one call by `capture.autograd_functions_in_graph`,
    its forward's operators traced with one ``seq_nr``) saves: eager runs its forward without recording
    those operators, so its one node holds what ``ctx`` keeps (``ctx.save_for_backward``, tensors set on
    ``ctx``), which is what its backward reads of the forward: the forward's values and the step's inputs,
    parameters and buffers its backward ops read.  Saved when the forward returns (its last operator).
    Walked as plain operators, each saving its inputs, Bloom's ``GeLUFunction`` (a tanh GELU saving only
    its input) held its intermediates to the backward: a sac plan 9.3% over its step."""
    nodes = cap.nodes
    tangents = {n.name for n, (kind, _) in zip(cap.gm.graph.find_nodes(op="placeholder"), cap.placeholders,
                                                strict=True) if kind == "tangent"}

    def of_forward(d: int) -> bool:
        name = cap.data_fx[d]
        node = None if name is None else nodes.get(name)
        return node is not None and not is_backward(node) and node.name not in tangents

    for seq, last in functions.items():
        ids = {d for d, seqs in read_back.items() if seq in seqs and of_forward(d)}
        found.saved.setdefault(seq, set()).update(ids)
        if ids and last >= 0:
            found.savers[last] = seq
            for d in ids:
                found.saved_by.setdefault(d, []).append(last)


def _original_copy(node: torch.fx.Node) -> bool:
    """Whether forward FX `node` is autograd's copy of the input an in-place op overwrites: eager
    ``hardswish_(x)`` (whose backward reads the original ``x``) clones ``x`` into its autograd node
    before writing it, traced as ``clone(x)`` with the in-place op as provenance."""
    origin = origin_op(node)
    return (node.target is torch.ops.aten.clone.default and origin is not None and is_in_place(origin)
            and len(node.all_input_nodes) == 1)


def _released_by_readers(found: AutogradNodes, read_back: dict[int, set[int]]) -> None:
    """A saving node whose ``seq_nr`` no backward op carries (an in-place op saving its input's copy:
    on torch 2.13 ``hardswish_``'s backward carries the seq_nr before its forward's) is released with
    the one autograd node whose backward reads what it saved; left unknown when that is not one node."""
    for seq, ids in found.saved.items():
        if seq in found.released or not ids:
            continue
        readers = set().union(*(read_back.get(d, set()) for d in ids)) & found.released.keys()
        if len(readers) == 1:
            (reader,) = readers
            found.released[seq] = found.released[reader]
            if reader in found.first:
                found.first[seq] = found.first[reader]


def autograd_saved_holds(cap: Captured) -> dict[int, int]:
    """data id -> compute id after which eager autograd releases it (`AutogradNodes.released` of the
    node that saved it), for every forward tensor some forward op saves for backward.

    An autograd node whose backward never runs because the loss does not use the output it leads to
    (a model's own ``labels=`` loss next to a user loss: `capture.detach_outputs`) keeps what it saved
    as long as that output lives: until the loss has read it."""
    walk = autograd_nodes(cap)
    hold: dict[int, int] = {}
    for seq, ds in walk.saved.items():
        if seq in walk.released:
            for d in ds:  # saved by several nodes (``x.pow(2)`` and ``x * rsqrt(...)``): the last to run
                hold[d] = max(hold.get(d, -1), walk.released[seq])
    return hold


_CASTS = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _cast(*nodes: torch.fx.Node) -> bool:
    """Whether one of FX `nodes` is a dtype cast."""
    return any(n.target in _CASTS for n in nodes)


def gradient_input_holds(cap: Captured) -> dict[int, int]:
    """data id -> backward compute id after which eager autograd drops it as an autograd node's incoming
    gradient: the engine hands a node its gradients and they live until the node's backward returns, so
    one is held to the node's last op, not to its last reader.  A broadcast ``x * gate`` (a
    squeeze-excite gate) backpropagates ``grad * gate``, ``grad * x``, then sums the latter to the gate's
    shape; ``grad`` was freed before the sum (timm's CoAtNet measured 1 KiB over a sac plan).

    A value a node computes and reads itself is a temporary of its C++ derivative formula, which lives to
    the end of the full expression (or of the function, a named local) that computed it: also held to
    the node's last op.  ``x.pow(2)``'s backward, ``grad * (2 * x.pow(1))``, holds ``x.pow(1)`` and
    ``2 * x.pow(1)`` while it multiplies, where the graph freed each after its one reader (HF Mamba2's
    gated RMSNorm: the eager step 16 KiB over its baseline, at the step's peak).  Under autocast a cast is no
    such temporary: autocast's casts of a formula's inputs live inside the dispatch of the op they feed,
    and the engine's cast of a node's result to its input's dtype replaces it, both freed at once (a
    float32 ``bmm`` block under the caller's bfloat16 autocast: its backward's casts held to the node's
    end put the baseline 3.5 KiB, 17%, over the measured step).  A custom
    ``torch.autograd.Function``'s backward is Python, whose temporaries go at their last reader: its
    own values are not held (Bloom-like GELU Functions: the baseline 1.9x the measured step)."""
    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    nodes = cap.nodes
    functions = {n.meta.get("seq_nr") for n in cap.gm.graph.nodes
                 if n.op == "call_function" and not is_backward(n) and in_custom_function(n)}
    last: dict[int, int] = {}  # seq -> the node's last backward compute
    reads: list[tuple[int, int]] = []  # (seq, data id of a gradient another node produced)
    pos = -1
    for n in cap.gm.graph.nodes:
        if n.op != "call_function" or not is_backward(n):
            continue
        pos = pos_of.get(n.name, pos)
        seq = n.meta.get("seq_nr")
        if seq is None or n.meta.get("is_gradient_acc"):
            continue
        last[seq] = pos
        for a in n.all_input_nodes:
            d = cap.data_of_fx.get(a.name)
            source = None if d is None or cap.data_fx[d] is None else nodes.get(cap.data_fx[d])
            if source is not None and source.op == "call_function" and is_backward(source) \
                    and not (seq in functions and source.meta.get("seq_nr") == seq) \
                    and not (cap.autocast and source.meta.get("seq_nr") == seq and _cast(n, source)):
                reads.append((seq, d))
    hold: dict[int, int] = {}
    for seq, d in reads:
        hold[d] = max(hold.get(d, -1), last[seq])
    return hold
