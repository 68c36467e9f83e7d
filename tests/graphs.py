"""Training-shaped CD-graphs for solver tests (forward, loss, backward mirror), built with GraphBuilder.

`training_graph` turns a forward op list into a full training graph: every forward op gets a backward
op that reads what the forward saved (its activation inputs, optionally its outputs) and the gradients
of its outputs, and writes the gradients of its activation inputs and of its parameters.  Gradients
flowing into one tensor from several consumers arrive as separate partial gradients that the
producer's backward op reads together, so no data node has two producers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from solvers import DataKind, Graph, GraphBuilder, Phase


@dataclass(frozen=True)
class Op:
    """One forward op: reads `inputs` (tensor names), writes `outputs` ((name, bytes) pairs)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]
    time: float = 1.0
    temp_bytes: int = 0
    saves_outputs: bool = False  # backward reads the op's outputs too (relu, softmax)
    backward_factor: float = 2.0
    grad_sizes: dict[str, int] = field(default_factory=dict)


def training_graph(
    name: str, inputs: dict[str, int], params: dict[str, int], ops: Sequence[Op], *, loss_bytes: int = 4,
) -> Graph:
    b = GraphBuilder(name)
    ids: dict[str, int] = {}
    for n, size in inputs.items():
        ids[n] = b.data(n, size, DataKind.INPUT)
    for n, size in params.items():
        ids[n] = b.data(n, size, DataKind.PARAMETER)
    consumers: dict[str, list[str]] = {}
    for op in ops:
        for n, size in op.outputs:
            ids[n] = b.data(n, size, DataKind.ACTIVATION)
        b.compute(op.name, [ids[i] for i in op.inputs], [ids[n] for n, _ in op.outputs], op=op.name,
                  phase=Phase.FORWARD, time=op.time, temp_bytes=op.temp_bytes)
        for i in op.inputs:
            consumers.setdefault(i, []).append(op.name)
    produced = [n for op in ops for n, _ in op.outputs]
    dangling = [n for n in produced if n not in consumers]
    loss = b.data("loss", loss_bytes, DataKind.OUTPUT)
    # partial gradient of tensor t flowing back from consumer op c (the loss is a consumer too)
    partial: dict[tuple[str, str], int] = {}
    size_of = {n: s for op in ops for n, s in op.outputs}
    size_of.update(inputs)
    size_of.update(params)
    loss_grads = []
    for n in dangling:
        partial[(n, "loss")] = b.data(f"d{n}@loss", size_of[n], DataKind.GRADIENT)
        loss_grads.append(partial[(n, "loss")])
        consumers.setdefault(n, []).append("loss")
    b.compute("loss", [ids[n] for n in dangling], [loss, *loss_grads], phase=Phase.FORWARD,
              time=0.1 * max(1, len(dangling)))
    outputs = [loss]
    for op in reversed(ops):
        reads = [ids[i] for i in op.inputs if i not in params]
        if op.saves_outputs:
            reads += [ids[n] for n, _ in op.outputs]
        reads += [partial[(n, c)] for n, _ in op.outputs for c in consumers.get(n, ())]
        writes = []
        for i in op.inputs:
            if i in params:
                g = b.data(f"d{i}@{op.name}", params[i], DataKind.PARAMETER_GRADIENT)
                outputs.append(g)
                writes.append(g)
            elif i not in inputs:
                g = b.data(f"d{i}@{op.name}", op.grad_sizes.get(i, size_of[i]), DataKind.GRADIENT)
                partial[(i, op.name)] = g
                writes.append(g)
        if not writes:  # an op fed only by the model input: nothing to propagate
            continue
        b.compute(f"{op.name}_bwd", reads, writes, phase=Phase.BACKWARD,
                  time=op.time * op.backward_factor, temp_bytes=op.temp_bytes)
    b.outputs = outputs
    return b.build()


def training_chain(n: int, sizes: Sequence[int] | None = None, times: Sequence[float] | None = None,
                   *, param_bytes: int = 8, input_bytes: int | None = None) -> Graph:
    """Forward chain f0..f{n-1} (f_i: a_{i-1}, w_i -> a_i), loss, backward chain where b_i reads the
    forward activation a_i (and a_{i-1}) and the gradient from b_{i+1}; 2n+1 compute nodes."""
    sizes = list(sizes) if sizes is not None else [16] * n
    times = list(times) if times is not None else [1.0] * n
    ops = []
    prev = "x"
    for i in range(n):
        ops.append(Op(f"f{i}", (prev, f"w{i}"), ((f"a{i}", sizes[i]),), time=times[i], saves_outputs=True))
        prev = f"a{i}"
    return training_graph(f"chain{n}", {"x": input_bytes if input_bytes is not None else sizes[0]},
                          {f"w{i}": param_bytes for i in range(n)}, ops)


def random_training_dag(rng: random.Random, n: int) -> Graph:
    """n random forward ops (1-2 activation inputs incl. skip connections, an optional parameter,
    1-2 outputs, random sizes/times/workspace) plus loss and backward: at most 2n+1 compute nodes."""
    ops = []
    tensors = ["x"]
    params: dict[str, int] = {}
    for i in range(n):
        ins = rng.sample(tensors, k=min(len(tensors), rng.randint(1, 2)))
        if rng.random() < 0.6:
            params[f"w{i}"] = rng.randint(1, 16)
            ins.append(f"w{i}")
        outs = tuple((f"t{i}_{j}", rng.randint(1, 64)) for j in range(rng.choice([1, 1, 2])))
        ops.append(Op(f"op{i}", tuple(ins), outs, time=round(rng.uniform(0.5, 4.0), 2),
                      temp_bytes=rng.choice([0, 0, 4, 16]), saves_outputs=rng.random() < 0.4))
        tensors.extend(name for name, _ in outs)
    return training_graph(f"rdag{n}", {"x": rng.randint(1, 32)}, params, ops)


def transformer_blocks(blocks: int, *, seq: int = 64, hidden: int = 64, heads: int = 4, batch: int = 2,
                       elem: int = 4) -> Graph:
    """A GPT-like stack (pre-LN attention + MLP with residuals), sizes from the shapes, times ~ FLOPs."""
    act = batch * seq * hidden * elem
    att = batch * heads * seq * seq * elem
    ops: list[Op] = []
    params: dict[str, int] = {}
    h = "x"
    us = 1e-9  # seconds per FLOP-ish unit, only the ratios matter

    def lin(name: str, x: str, out: str, d_in: int, d_out: int) -> Op:
        params[f"{name}.w"] = d_in * d_out * elem
        return Op(name, (x, f"{name}.w"), ((out, act * d_out // hidden),),
                  time=2 * batch * seq * d_in * d_out * us)

    for k in range(blocks):
        p = f"b{k}"
        params[f"{p}.ln1"] = 2 * hidden * elem
        ops.append(Op(f"{p}.ln1", (h, f"{p}.ln1"), ((f"{p}.n1", act),), time=5 * act * us))
        params[f"{p}.qkv.w"] = 3 * hidden * hidden * elem
        ops.append(Op(f"{p}.qkv", (f"{p}.n1", f"{p}.qkv.w"),
                      ((f"{p}.q", act), (f"{p}.k", act), (f"{p}.v", act)),
                      time=6 * batch * seq * hidden * hidden * us))
        ops.append(Op(f"{p}.scores", (f"{p}.q", f"{p}.k"), ((f"{p}.s", att),),
                      time=2 * batch * seq * seq * hidden * us))
        ops.append(Op(f"{p}.softmax", (f"{p}.s",), ((f"{p}.pr", att),), time=5 * att * us,
                      saves_outputs=True))
        ops.append(Op(f"{p}.av", (f"{p}.pr", f"{p}.v"), ((f"{p}.ctx", act),),
                      time=2 * batch * seq * seq * hidden * us))
        ops.append(lin(f"{p}.proj", f"{p}.ctx", f"{p}.o", hidden, hidden))
        ops.append(Op(f"{p}.res1", (h, f"{p}.o"), ((f"{p}.h1", act),), time=act * us))
        params[f"{p}.ln2"] = 2 * hidden * elem
        ops.append(Op(f"{p}.ln2", (f"{p}.h1", f"{p}.ln2"), ((f"{p}.n2", act),), time=5 * act * us))
        ops.append(lin(f"{p}.fc1", f"{p}.n2", f"{p}.u", hidden, 4 * hidden))
        ops.append(Op(f"{p}.gelu", (f"{p}.u",), ((f"{p}.g", 4 * act),), time=8 * 4 * act * us))
        ops.append(lin(f"{p}.fc2", f"{p}.g", f"{p}.m", 4 * hidden, hidden))
        ops.append(Op(f"{p}.res2", (f"{p}.h1", f"{p}.m"), ((f"{p}.h2", act),), time=act * us))
        h = f"{p}.h2"
    return training_graph(f"transformer{blocks}", {"x": act}, params, ops)


def chain_of_blocks(blocks: int, width: int = 3, rng: random.Random | None = None) -> Graph:
    """`blocks` residual blocks of `width` ops each (a chain with skip connections inside each block)."""
    rng = rng or random.Random(0)
    ops = []
    h = "x"
    params: dict[str, int] = {}
    for k in range(blocks):
        cur = h
        for j in range(width):
            params[f"w{k}_{j}"] = 8
            out = f"a{k}_{j}"
            ops.append(Op(f"f{k}_{j}", (cur, f"w{k}_{j}"), ((out, rng.randint(16, 64)),),
                          time=round(rng.uniform(0.5, 2.0), 2)))
            cur = out
        ops.append(Op(f"res{k}", (h, cur), ((f"h{k}", 32),), time=0.1))
        h = f"h{k}"
    return training_graph(f"blocks{blocks}x{width}", {"x": 32}, params, ops)
