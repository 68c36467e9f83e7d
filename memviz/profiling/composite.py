"""What eager PyTorch holds inside a C++ composite operator that the traced graph does not show.

A CompositeImplicitAutograd operator runs as the ATen operators its C++ body calls, and the AOT trace
records those; but the body's C++ locals live until it returns, where the graph frees each value after
its last reader, and a result the model drops is computed all the same, where the trace's dead-code pass
removes it.  The operator whose locals matter is the CPU's attention with dropout (or a mask the fused
kernel refuses): ``scaled_dot_product_attention`` runs ATen's ``_scaled_dot_product_attention_math``:

    query_acc, key_acc, value_acc = query.to(float), key.to(float), value.to(float)  # bf16 / fp16 only
    query = query_acc * scale                      # the key's scaled copy is a temporary of the matmul
    attn = matmul(query, key_acc.transpose(-2, -1) * scale); attn = attn + attn_mask
    attn = _safe_softmax(attn, -1); attn = dropout(attn, p)
    return matmul(attn, value_acc).to(origin_dtype), attn.to(origin_dtype)

and the outer ``scaled_dot_product_attention`` binds the boolean mask it converts (``where``) to a local
too.  A pure bfloat16 BERT's checkpointed layer measured 4,800 B over its sac plan in the recomputation
of that attention (the float32 casts, the scaled query, the mask and the probabilities held to the
return, the bfloat16 copy of the probabilities nobody reads), and `memviz.apply(verify=True)` refused
its smallest plan.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch

from memviz.profiling.capture import origin_source
from solvers.ir import Graph

#: the composite whose math body `sdpa_math_calls` finds
SDPA = "aten.scaled_dot_product_attention.default"


def _aten(node: torch.fx.Node, name: str) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.name == f"aten::{name}"


def sdpa_math_calls(cap: Any) -> list[list[torch.fx.Node]]:
    """Each forward ``scaled_dot_product_attention`` call of the capture that ran ATen's math body (its
    operators include ``_safe_softmax``), as its FX nodes in trace order."""
    from memviz.profiling.capture import forward_calls

    calls: dict[tuple[str, int], list[torch.fx.Node]] = {}
    for n in forward_calls(cap.gm):
        source = origin_source(n)
        if source is not None and str(source.target) == SDPA:
            calls.setdefault((source.name, source.graph_id), []).append(n)
    return [nodes for nodes in calls.values() if any(_aten(n, "_safe_softmax") for n in nodes)]


def _probabilities(nodes: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The call's last value of ``attn``: its dropout's result (the first output) after the softmax, else
    the softmax."""
    from memviz.profiling.capture import is_random

    attn = None
    for n in nodes:
        if _aten(n, "_safe_softmax"):
            attn = n
        elif attn is not None and is_random(n):
            attn = next((u for u in n.users if u.target is operator.getitem and u.args[1] == 0), n)
    return attn


def composite_holds(cap: Any) -> dict[int, int]:
    """data id -> compute id (the call's last) up to which eager holds a C++ local of an attention's math
    body (module docstring): the converted mask, the float32 casts of the call's inputs, the scaled query
    and the final probabilities."""
    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    hold: dict[int, int] = {}
    for nodes in sdpa_math_calls(cap):
        last = max((pos_of[n.name] for n in nodes if n.name in pos_of), default=None)
        if last is None:
            continue
        inside = set(nodes)
        muls = [n for n in nodes if _aten(n, "mul")]
        locals_ = [n for n in nodes if _aten(n, "where")
                   or (_aten(n, "_to_copy") and not any(a in inside for a in n.all_input_nodes))]
        locals_ += muls[:1]  # ``query = query_acc * scale``; the key's is the matmul's temporary
        attn = _probabilities(nodes)
        locals_ += [attn] if attn is not None else []
        for n in locals_:
            d = cap.data_of_fx.get(n.name)
            if d is not None:
                hold[d] = max(hold.get(d, -1), last)
    return hold


def with_dropped_results(graph: Graph, cap: Any) -> Graph:
    """`graph` with the bytes of each attention's second result, ``attn.to(origin_dtype)`` (module
    docstring), as workspace of the call's computes from the probabilities' to the return: eager computes
    it (bf16 / fp16: a copy; float32: the same tensor, nothing) and drops it when the call returns, and the
    graph, whose trace removed it as dead code, does not hold it.  `graph` itself when there is none."""
    pos_of = {name: i for i, name in enumerate(cap.compute_fx) if name is not None}
    extra: dict[int, int] = {}
    for nodes in sdpa_math_calls(cap):
        attn = _probabilities(nodes)
        val = attn.meta.get("val") if attn is not None else None
        origin = next((a.meta.get("val") for n in nodes if _aten(n, "_to_copy")
                       for a in n.all_input_nodes if a not in nodes), None)
        tensors = isinstance(val, torch.Tensor) and isinstance(origin, torch.Tensor)
        if not tensors or origin.dtype == val.dtype:
            continue
        size = val.numel() * origin.element_size()
        for n in nodes[nodes.index(attn) + 1:]:
            c = pos_of.get(n.name)
            if c is not None:
                extra[c] = extra.get(c, 0) + size
    if not extra:
        return graph
    computes = tuple(dataclasses.replace(c, temp_bytes=c.temp_bytes + extra[c.id]) if c.id in extra else c
                     for c in graph.computes)
    return Graph(computes, graph.datas, graph.outputs, name=graph.name, meta=graph.meta)
