"""A synthetic GPT-2-style training graph at op granularity (shared by the chain-solver tests).

Each layer: ln -> qkv linear (+bias) -> split -> head reshapes -> scores matmul -> scale -> softmax ->
dropout -> attention matmul -> merge heads -> proj linear (+bias) -> dropout -> residual add -> ln ->
mlp up (+bias) -> gelu -> down (+bias) -> dropout -> residual add.  The backward has one node per
input gradient and per parameter gradient, and explicit adds where partial gradients meet, so the
graph looks like an AOT joint graph.  Op names are generic (as captured aten ops are), so identical
layers are identical blocks.
"""

from __future__ import annotations

from solvers import DataKind, Graph, GraphBuilder, Phase


def gpt_graph(layers: int = 12, *, batch: int = 2, seq: int = 128, hidden: int = 256, heads: int = 4,
              elem: int = 4) -> Graph:
    b = GraphBuilder(f"gpt{layers}")
    act = batch * seq * hidden * elem
    att = batch * heads * seq * seq * elem
    mask_att = batch * heads * seq * seq  # 1-byte dropout masks
    fwd: list[tuple[str, list[int], list[int], list[int], list[int], float]] = []
    # (op, act inputs, param inputs, outputs, saved-for-backward, time)
    sec = 1e-12

    def data(name: str, nbytes: int, kind: DataKind = DataKind.ACTIVATION) -> int:
        return b.data(name, nbytes, kind)

    def op(name: str, ins: list[int], params: list[int], outs: list[int], saved: list[int], t: float) -> None:
        b.compute(name, ins + params, outs, op=name, phase=Phase.FORWARD, time=t)
        fwd.append((name, ins, params, outs, saved, t))

    def param(name: str, nbytes: int) -> int:
        return data(name, nbytes, DataKind.PARAMETER)

    idx = data("idx", batch * seq * 8, DataKind.INPUT)
    wte = param("wte", 1000 * hidden * elem)
    h = data("emb", act)
    op("embedding", [idx], [wte], [h], [idx], act * sec)
    for k in range(layers):
        def lin(x: int, d_in: int, d_out: int, name: str, k: int = k) -> int:
            w, bias = param(f"{k}.{name}.w", d_in * d_out * elem), param(f"{k}.{name}.b", d_out * elem)
            y = data(f"{k}.{name}", act * d_out // hidden)
            op("linear", [x], [w, bias], [y], [x], 2 * batch * seq * d_in * d_out * sec)
            return y

        def ln(x: int, name: str, k: int = k) -> int:
            g, bb = param(f"{k}.{name}.g", hidden * elem), param(f"{k}.{name}.b", hidden * elem)
            y, stats = data(f"{k}.{name}", act), data(f"{k}.{name}.stats", batch * seq * 8)
            op("layer_norm", [x], [g, bb], [y, stats], [x, stats], 5 * act * sec)
            return y

        def dropout(x: int, size: int, msize: int, name: str, k: int = k) -> int:
            y, m = data(f"{k}.{name}", size), data(f"{k}.{name}.mask", msize)
            op("dropout", [x], [], [y, m], [m], size * sec)
            return y

        n1 = ln(h, "ln1")
        qkv = lin(n1, hidden, 3 * hidden, "qkv")
        q, kk, v = data(f"{k}.q", act), data(f"{k}.k", act), data(f"{k}.v", act)
        op("split", [qkv], [], [q, kk, v], [], act * sec)
        qh, kh, vh = (data(f"{k}.{n}h", act) for n in "qkv")
        for src, dst in ((q, qh), (kk, kh), (v, vh)):
            tr = data(f"{k}.t{b._datas[dst]['name']}", act)
            op("transpose", [src], [], [tr], [], act * sec)
            op("clone", [tr], [], [dst], [], act * sec)
        s = data(f"{k}.scores", att)
        op("bmm", [qh, kh], [], [s], [qh, kh], 2 * batch * seq * seq * hidden * sec)
        sm = data(f"{k}.scaled", att)
        op("mul", [s], [], [sm], [], att * sec)
        sc = data(f"{k}.masked", att)
        op("masked_fill", [sm], [], [sc], [], att * sec)
        p = data(f"{k}.probs", att)
        op("softmax", [sc], [], [p], [p], 5 * att * sec)
        pd = dropout(p, att, mask_att, "attn_drop")
        ctx = data(f"{k}.ctx", act)
        op("bmm", [pd, vh], [], [ctx], [pd, vh], 2 * batch * seq * seq * hidden * sec)
        mt, merged = data(f"{k}.ctx_t", act), data(f"{k}.merged", act)
        op("transpose", [ctx], [], [mt], [], act * sec)
        op("clone", [mt], [], [merged], [], act * sec)
        o = lin(merged, hidden, hidden, "proj")
        od = dropout(o, act, act // elem, "resid_drop1")
        h1 = data(f"{k}.h1", act)
        op("add", [h, od], [], [h1], [], act * sec)
        n2 = ln(h1, "ln2")
        u = lin(n2, hidden, 4 * hidden, "fc1")
        gl = data(f"{k}.gelu", 4 * act)
        op("gelu", [u], [], [gl], [u], 8 * 4 * act * sec)
        m = lin(gl, 4 * hidden, hidden, "fc2")
        md = dropout(m, act, act // elem, "resid_drop2")
        h = data(f"{k}.h2", act)
        op("add", [h1, md], [], [h], [], act * sec)
    hf = data("lnf", act)
    op("layer_norm", [h], [], [hf], [h], 5 * act * sec)
    logits = data("logits", batch * seq * 1000 * elem)
    op("linear", [hf], [wte], [logits], [hf], 2 * batch * seq * hidden * 1000 * sec)
    loss = data("loss", 4, DataKind.OUTPUT)
    op("cross_entropy", [logits], [], [loss], [logits], batch * seq * 1000 * sec)
    tangent = data("tangent", 4, DataKind.INPUT)
    # backward: gradients flow in reverse; partial gradients of one tensor are summed by add nodes
    grads: dict[int, list[int]] = {loss: [tangent]}
    size = {}
    outputs = [loss]
    for name, ins, params, outs, saved, t in reversed(fwd):
        parts = [x for o in outs for x in grads.get(o, [])]
        if not parts:
            continue
        while len(parts) > 1:  # accumulate partial gradients
            a, c = parts.pop(), parts.pop()
            s = data(f"acc{len(size)}", b._datas[a]["bytes"], DataKind.GRADIENT)
            size[s] = 1
            b.compute("add", [a, c], [s], op="add", phase=Phase.BACKWARD, time=b._datas[a]["bytes"] * sec)
            parts.append(s)
        g = parts[0]
        for x in ins:
            if b._datas[x]["kind"] == DataKind.INPUT:
                continue
            gx = data(f"d{b._datas[x]['name']}", b._datas[x]["bytes"], DataKind.GRADIENT)
            b.compute(f"{name}_backward", [g, *saved, *params], [gx], op=f"{name}_backward",
                      phase=Phase.BACKWARD, time=t)
            grads.setdefault(x, []).append(gx)
        for w in params:
            gw = data(f"d{b._datas[w]['name']}@{len(size)}", b._datas[w]["bytes"],
                      DataKind.PARAMETER_GRADIENT)
            size[gw] = 1
            b.compute(f"{name}_weight_backward", [g, *saved], [gw], op=f"{name}_weight_backward",
                      phase=Phase.BACKWARD, time=t)
            outputs.append(gw)
    b.outputs = outputs
    return b.build()
