"""Cut a CD-graph into a sequence of blocks at 1-separators (Rockmate Sec. 3.1 and Appendix A.4-A.5).

A forward data node `d` is a cut when every forward compute is either an ancestor of `d` (block side
"before") or reads nothing produced before `d` except `d` itself: all paths pass through `d`.
Parameters, buffers and inputs never count as cut points.  Backward computes are then assigned to the
blocks so that block k's backward reads only block k's forward data and its input cut; the remaining
freedom (gradient-of-input and reduction nodes that read no forward data) is fixed by a small LP that
minimises the gradient bytes crossing block boundaries (difference constraints, so the LP optimum is
integral).  Blocks with identical canonical structure get the same class id (Appendix A.5).

The block-level quantities Rotor needs (Beaumont et al. 2019, recalled in Rockmate Appendix C) are
measured by `block_option` / `nosave` with a small replay of each block's steps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from solvers.ir import DataKind, Graph, GraphError, Phase, frozen_instances
from solvers.milp import Model
from solvers.milp import solve as solve_milp
from solvers.schedule import Schedule, Step

#: seconds for the backward-assignment LP (a few hundred variables: milliseconds in practice)
LP_SECONDS = 10.0


@dataclass(frozen=True)
class Block:
    """Block k of the chain.  `input`/`output` are the cut data a_{k-1} / a_k (None at the ends);
    `saved` the block's forward data its backward reads; `grad_in` the backward data alive when this
    backward starts (produced by later blocks, read here or further down); `grad_out` those this
    backward hands to the previous block (it produced them, or they pass through to a lower reader);
    `long_lived` backward data alive to the end of the chain (parameter gradients, data read outside
    the backward)."""

    index: int
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    input: int | None
    output: int | None
    saved: tuple[int, ...]
    grad_in: tuple[int, ...]
    grad_out: tuple[int, ...]
    long_lived: tuple[int, ...]
    klass: int = 0


@dataclass(frozen=True)
class Chain:
    graph: Graph
    blocks: tuple[Block, ...]
    tail: tuple[int, ...]  # optimizer (and other) computes run once after the chain
    resident: frozenset[int]  # sources + forward-produced long-lived data, counted alive throughout

    @property
    def training(self) -> bool:
        return any(b.backward for b in self.blocks)

    def resident_bytes(self) -> int:
        return sum(self.graph.datas[d].bytes for d in self.resident)


@dataclass(frozen=True)
class BlockOption:
    """One way to run a block (Rockmate Sec. 3.3): forward sequence keeping `kept` (+ the output cut),
    backward sequence (with recomputations of forward nodes whose data were not kept).  Byte figures:
    `keep` stays between forward and backward; `fwd_peak` above the live memory at forward start;
    `bwd_peak` above the live memory at backward start (which includes `keep` and `grad_in`)."""

    kept: frozenset[int]
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    fwd_time: float
    bwd_time: float
    keep: int
    fwd_peak: int
    bwd_peak: int


@dataclass(frozen=True)
class NoSave:
    """Forward of a block keeping only its output: time, peak with the input kept (it is the
    segment's checkpoint) and peak when the input is freed after its last read (an intermediate)."""

    time: float
    peak_keep_input: int
    peak_drop_input: int


# --- liveness: the earliest frees for a given compute sequence --------------------------------------
def liveness_frees(graph: Graph, seq: Sequence[int], initially_alive: Iterable[int], keep: Iterable[int],
                   never_free: Iterable[int]) -> tuple[list[int], list[list[int]]]:
    """Frees for `seq`: each data is freed right after its last read before it is produced again (or
    right after production when nobody reads it).  Returns (frees at start, frees after position i)."""
    keep_s, never = set(keep), set(never_free)
    needed: dict[int, bool] = {d: True for d in keep_s}
    after: list[list[int]] = [[] for _ in seq]
    for i in range(len(seq) - 1, -1, -1):
        c = graph.computes[seq[i]]
        for d in c.outputs:
            if d in never:
                continue
            if not needed.get(d, False):
                after[i].append(d)
            needed[d] = False
        for d in dict.fromkeys(c.inputs):
            if d in never:
                continue
            if not needed.get(d, False):
                after[i].append(d)
                needed[d] = True
    start = [d for d in initially_alive if d not in never and not needed.get(d, False)]
    return start, after


def schedule_with_frees(graph: Graph, seq: Sequence[int]) -> Schedule:
    """The full schedule for a compute sequence over the whole graph: sources stay, outputs stay."""
    sources = graph.sources()
    start, after = liveness_frees(graph, seq, sources, graph.outputs, sources)
    # the steps as two columns, made into Step objects in C loops (`frozen_instances`): one Python call
    # per step was most of a Rotor plan's time on an 18.6k-operator rank (a schedule per proposal)
    ops: list[str] = ["free"] * len(start)
    nodes: list[int] = list(start)
    for i, c in enumerate(seq):
        frees = sorted(after[i])
        ops.append("compute")
        ops.extend(repeat("free", len(frees)))
        nodes.append(c)
        nodes.extend(frees)
    return frozen_instances(Step, ops, nodes)


def replay(graph: Graph, seq: Sequence[int], counted: set[int], alive: Iterable[int],
           keep: Iterable[int]) -> tuple[int, int, float]:
    """Replay `seq` counting only `counted` data (everything else is resident): returns (peak above
    the initial live bytes, final live bytes minus initial, time)."""
    alive_s = set(alive) & counted
    never = {d for c in seq for d in (*graph.computes[c].inputs, *graph.computes[c].outputs)} - counted
    start, after = liveness_frees(graph, seq, alive_s, keep, never)
    size = [d.bytes for d in graph.datas]
    live0 = sum(size[d] for d in alive_s)
    live = live0
    for d in start:
        alive_s.discard(d)
        live -= size[d]
    peak = live
    t = 0.0
    for i, cid in enumerate(seq):
        c = graph.computes[cid]
        t += c.time
        new = 0
        for d in c.outputs:
            if d in counted and d not in alive_s:
                alive_s.add(d)
                new += size[d]
        peak = max(peak, live + new + c.temp_bytes)
        live += new
        for d in after[i]:
            alive_s.discard(d)
            live -= size[d]
    return peak - live0, live - live0, t


# --- decomposition ---------------------------------------------------------------------------------


def decompose(graph: Graph, *, max_blocks: int = 64) -> Chain:
    """Cut `graph` at the 1-separators of its forward part (Rockmate Appendix A.4) and assign the
    backward computes to blocks; cuts that the backward cannot respect are merged away."""
    comps = graph.computes
    if not graph.is_topological(range(len(comps))):
        raise GraphError("compute ids are not in a valid execution (capture) order: renumber the graph "
                         "in topological order before chain decomposition")
    fwd = [c.id for c in comps if c.phase == Phase.FORWARD]
    bwd = [c.id for c in comps if c.phase == Phase.BACKWARD]
    tail = tuple(c.id for c in comps if c.phase not in (Phase.FORWARD, Phase.BACKWARD))
    outputs = set(graph.outputs)
    tail_set = set(tail)
    fset = set(fwd)
    fwd_data = [d.id for d in graph.datas if d.producer is not None and d.producer in fset]
    # forward data that must outlive the chain (model outputs, loss, running stats, optimizer reads)
    long_fwd = {d for d in fwd_data if d in outputs or any(u in tail_set for u in graph.consumers(d))}
    long_fwd |= _step_constants(graph, fset)
    resident = frozenset(graph.sources()) | frozenset(long_fwd)
    cuts = _forward_cuts(graph, fwd, fwd_data, long_fwd)
    while True:
        if len(cuts) + 1 > max_blocks:
            cuts = _thin(cuts, max_blocks - 1)
        fblock, blocks_fwd = _forward_blocks(graph, fwd, cuts)
        res = _assign_backward(graph, bwd, cuts, fblock, resident)
        if isinstance(res, tuple):  # conflict between blocks lo..hi: drop the cuts in between
            lo, hi = res
            cuts = [c for k, c in enumerate(cuts) if not lo <= k < hi]
            continue
        bblock = res
        break
    n = len(cuts) + 1
    blocks_bwd: list[list[int]] = [[] for _ in range(n)]
    for b in bwd:
        blocks_bwd[bblock[b]].append(b)
    grad_in: list[list[int]] = [[] for _ in range(n)]
    grad_out: list[list[int]] = [[] for _ in range(n)]
    long_lived: list[list[int]] = [[] for _ in range(n)]
    bset = set(bwd)
    for d in graph.datas:
        if d.producer is None or d.producer not in bset:
            continue
        j = bblock[d.producer]
        readers = graph.consumers(d.id)
        rb = {bblock[u] for u in readers if u in bset}
        other = any(u not in bset for u in readers)
        if d.id in outputs or other:
            long_lived[j].append(d.id)
        elif rb - {j}:
            # a gradient read further down (past blocks with no backward reader of it, e.g. a
            # ReLU's input gradient skipping its pooling block) is handed down block by block:
            # alive only until its last reader, not to the end of the chain
            for r in range(min(rb), j):
                grad_out[r + 1].append(d.id)
                grad_in[r].append(d.id)
    blocks = []
    for k in range(n):
        fw = set(blocks_fwd[k])
        own = {d for c in fw for d in comps[c].outputs} - long_fwd
        saved = sorted({d for c in blocks_bwd[k] for d in comps[c].inputs if d in own})
        blocks.append(Block(
            index=k, forward=tuple(sorted(fw)), backward=tuple(blocks_bwd[k]),
            input=cuts[k - 1] if k > 0 else None, output=cuts[k] if k < n - 1 else None,
            saved=tuple(saved), grad_in=tuple(grad_in[k]), grad_out=tuple(grad_out[k]),
            long_lived=tuple(long_lived[k]),
        ))
    chain = Chain(graph, tuple(blocks), tail, resident)
    return _with_classes(chain)


def _step_constants(graph: Graph, fset: set[int]) -> set[int]:
    """Forward data that no model input flows into (a rotary table, a causal mask built from ``arange``):
    every block may read them, so as ordinary data they would leave no 1-separator at all; they are
    computed once and kept, like parameters.  Communication buffers (FSDP2's all-gathered parameters,
    which read no input either) count only when the backward reads them too (the root's, kept unsharded
    through the step): a block's are freed after its forward and gathered again for its backward."""
    inputs = {d.id for d in graph.datas if d.kind is DataKind.INPUT}
    if not inputs:
        return set()
    flows: set[int] = set(inputs)
    for c in graph.computes:
        if any(i in flows for i in c.inputs):
            flows.update(c.outputs)
    return {d.id for d in graph.datas if d.producer in fset and d.id not in flows
            and (d.kind is not DataKind.COMMUNICATION
                 or any(graph.computes[u].phase is Phase.BACKWARD for u in graph.consumers(d.id)))}


def _forward_cuts(graph: Graph, fwd: list[int], fwd_data: list[int], long_fwd: set[int]) -> list[int]:
    pos = {c: i for i, c in enumerate(fwd)}
    readers = {}
    for d in fwd_data:
        r = 0
        for u in graph.consumers(d):
            if u in pos:
                r |= 1 << pos[u]
        readers[d] = r
    out_reads = [0] * len(fwd)  # per forward compute: readers of its (non long-lived) outputs
    for i, c in enumerate(fwd):
        for d in graph.computes[c].outputs:
            if d not in long_fwd:
                out_reads[i] |= readers[d]
    anc = [0] * len(fwd)  # strict ancestors, as bit sets of positions
    anc_reads = [0] * len(fwd)  # readers of the outputs of the strict ancestors (one pass, not per cut)
    for i, c in enumerate(fwd):
        m = r = 0
        for p in graph.predecessors(c):
            if p in pos:
                q = pos[p]
                m |= anc[q] | (1 << q)
                r |= anc_reads[q] | out_reads[q]
        anc[i], anc_reads[i] = m, r
    cuts: list[tuple[int, int]] = []
    everything = (1 << len(fwd)) - 1
    for d in fwd_data:
        if d in long_fwd or not readers[d]:
            continue
        p = pos[graph.datas[d].producer]
        a = anc[p] | (1 << p)
        if a == everything or not readers[d] & ~a:
            continue
        # every other datum produced inside `a` must be read only inside `a`
        m = anc_reads[p]
        for d2 in graph.computes[fwd[p]].outputs:
            if d2 != d and d2 not in long_fwd:
                m |= readers[d2]
        if m & ~a:
            continue
        cuts.append((a.bit_count(), d, a))
    cuts.sort()
    chosen: list[int] = []
    prev = 0
    for _, d, a in cuts:
        if a & prev == prev and a != prev:  # keep a nested sequence
            chosen.append(d)
            prev = a
    return chosen


def _thin(cuts: list[int], keep: int) -> list[int]:
    if keep <= 0:
        return []
    idx = np.linspace(0, len(cuts) - 1, keep).round().astype(int)
    return [cuts[i] for i in sorted(set(idx.tolist()))]


def _forward_blocks(graph: Graph, fwd: list[int], cuts: list[int]) -> tuple[dict[int, int], list[list[int]]]:
    fblock: dict[int, int] = {}
    n = len(cuts) + 1
    for k, d in enumerate(cuts):  # ancestors of each cut, smallest first
        stack = [graph.datas[d].producer]
        while stack:
            c = stack.pop()
            if c in fblock or graph.computes[c].phase != Phase.FORWARD:
                continue
            fblock[c] = k
            stack.extend(graph.predecessors(c))
    blocks: list[list[int]] = [[] for _ in range(n)]
    for c in fwd:
        blocks[fblock.setdefault(c, n - 1)].append(c)
    return fblock, blocks


def _assign_backward(graph: Graph, bwd: list[int], cuts: list[int], fblock: dict[int, int],
                     resident: frozenset[int]) -> dict[int, int] | tuple[int, int]:
    n = len(cuts) + 1
    cut_index = {d: k for k, d in enumerate(cuts)}
    bset = set(bwd)
    lo = {b: 0 for b in bwd}
    hi = {b: n - 1 for b in bwd}
    for b in bwd:
        for d in graph.computes[b].inputs:
            p = graph.datas[d].producer
            if d in resident or p is None or p not in fblock:
                continue
            j = fblock[p]
            if d in cut_index:
                lo[b], hi[b] = max(lo[b], j), min(hi[b], j + 1)
            else:
                lo[b], hi[b] = max(lo[b], j), min(hi[b], j)
    order = bwd  # ids ascending: capture order, checked topological in `decompose`
    for b in order:  # a backward node runs no earlier (higher block) than its producers
        for p in graph.predecessors(b):
            if p in bset:
                hi[b] = min(hi[b], hi[p])
    for b in reversed(order):
        for p in graph.predecessors(b):
            if p in bset:
                lo[p] = max(lo[p], lo[b])
    for b in bwd:
        if lo[b] > hi[b]:
            return hi[b], lo[b]
    free_nodes = [b for b in bwd if lo[b] < hi[b]]
    beta = {b: lo[b] for b in bwd}
    if free_nodes:
        beta.update(_crossing_lp(graph, bwd, free_nodes, lo, hi))
    return beta


def _crossing_lp(graph: Graph, bwd: list[int], free_nodes: list[int], lo: dict[int, int],
                 hi: dict[int, int]) -> dict[int, int]:
    """Block indices for the free backward nodes minimising sum(bytes * boundaries crossed)."""
    var = {b: i for i, b in enumerate(free_nodes)}
    bset = set(bwd)
    nv = len(free_nodes)
    rows: list[tuple[dict[int, float], float]] = []  # sum(coef * x) <= rhs
    cost: dict[int, float] = {}

    def term(b: int) -> tuple[int | None, float]:
        return (var[b], 0.0) if b in var else (None, float(lo[b]))

    zs = 0
    for d in graph.datas:
        if d.producer is None or d.producer not in bset:
            continue
        pv, pc = term(d.producer)
        w = float(max(d.bytes, 1))
        if pv is not None:
            cost[pv] = cost.get(pv, 0.0) + w
        readers = [u for u in graph.consumers(d.id) if u in bset]
        if not readers:
            continue
        z = nv + zs
        zs += 1
        cost[z] = cost.get(z, 0.0) - w
        for u in readers:  # z <= beta(u)
            uv, uc = term(u)
            coef = {z: 1.0}
            if uv is not None:
                coef[uv] = coef.get(uv, 0.0) - 1.0
            rows.append((coef, uc))
    for b in bwd:  # beta(b) <= beta(producer)
        for p in graph.predecessors(b):
            if p not in bset or (b not in var and p not in var):
                continue
            bv, bc = term(b)
            pv, pc = term(p)
            coef: dict[int, float] = {}
            if bv is not None:
                coef[bv] = 1.0
            if pv is not None:
                coef[pv] = coef.get(pv, 0.0) - 1.0
            rows.append((coef, pc - bc))
    # ties: run a free node as early as possible (higher block), the same way in identical blocks;
    # the total tie-break weight stays below one byte so it never overrides a real difference
    tie = 0.5 / (nv * (_max_block(hi) + 1))
    lp = Model()
    for b in free_nodes:
        lp.var(lo[b], hi[b], cost.get(var[b], 0.0) - tie, integer=False)
    for j in range(nv, nv + zs):
        lp.var(0, _max_block(hi), cost.get(j, 0.0), integer=False)
    for coef, bound in rows:
        lp.row(coef.items(), hi=bound)
    # HiGHS's simplex returns a vertex (as scipy's highs-ds did before); rounding maps it to blocks
    res = solve_milp(lp, time_limit=LP_SECONDS, relax=True, where="chain: backward-assignment LP")
    if res.status != "optimal" or res.x is None:
        return {b: lo[b] for b in free_nodes}
    return {b: int(round(res.x[var[b]])) for b in free_nodes}


def _max_block(hi: dict[int, int]) -> int:
    return max(hi.values(), default=0)


# --- identical blocks (Appendix A.5) ---------------------------------------------------------------
def local_data(block: Block, graph: Graph) -> list[int]:
    """The block's own data (forward and backward products) in first-appearance order."""
    seen: dict[int, None] = {}
    for c in (*block.forward, *block.backward):
        for d in graph.computes[c].outputs:
            seen.setdefault(d, None)
    return list(seen)


def block_signature(chain: Chain, block: Block) -> str:
    g = chain.graph
    local = {d: i for i, d in enumerate(local_data(block, g))}
    gin = {d: i for i, d in enumerate(block.grad_in)}
    roles = (set(block.saved), set(block.grad_out), set(block.long_lived), set(chain.resident))

    def ref(d: int) -> tuple:
        dn = g.datas[d]
        if d == block.input:
            return ("in",)
        if d in local:
            return ("l", local[d], dn.bytes, dn.kind.value, tuple(d in r for r in roles), d == block.output)
        if d in gin:
            return ("g", gin[d], dn.bytes)
        return ("x", dn.bytes, dn.kind.value, dn.shape, dn.dtype)

    parts = []
    for c in (*block.forward, *block.backward):
        cn = g.computes[c]
        parts.append((cn.phase.value, cn.op, cn.temp_bytes, tuple(ref(d) for d in cn.inputs),
                      tuple(ref(d) for d in cn.outputs)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _with_classes(chain: Chain) -> Chain:
    ids: dict[str, int] = {}
    blocks = []
    for b in chain.blocks:
        k = ids.setdefault(block_signature(chain, b), len(ids))
        blocks.append(Block(**{**b.__dict__, "klass": k}))
    return Chain(chain.graph, tuple(blocks), chain.tail, chain.resident)


# --- block-level measurements ----------------------------------------------------------------------
def _fwd_data(chain: Chain, block: Block) -> set[int]:
    g = chain.graph
    return {d for c in block.forward for d in g.computes[c].outputs} - chain.resident


def backward_sequence(chain: Chain, block: Block, kept: Iterable[int]) -> tuple[int, ...]:
    """The block's backward computes, each preceded by the recomputation of the forward nodes needed
    to regenerate dropped data (from the kept data and the block input)."""
    g = chain.graph
    own = _fwd_data(chain, block)
    avail = set(kept)
    if block.output is not None:
        avail.add(block.output)
    seq: list[int] = []

    def need(target: int) -> None:  # depth-first, iterative: long blocks would overflow recursion
        stack = [(target, False)]
        while stack:
            d, ready = stack.pop()
            if d not in own or d in avail:
                continue
            p = g.datas[d].producer
            if ready:
                seq.append(p)
                avail.update(g.computes[p].outputs)
                continue
            stack.append((d, True))
            stack.extend((x, False) for x in reversed(g.computes[p].inputs))

    for b in block.backward:
        for d in g.computes[b].inputs:
            need(d)
        seq.append(b)
        avail.update(g.computes[b].outputs)
    return tuple(seq)


def block_option(chain: Chain, block: Block, kept: Iterable[int]) -> BlockOption:
    """Measure running `block` keeping `kept` (a subset of its saved data) between its passes."""
    return sequence_option(chain, block, block.forward, backward_sequence(chain, block, kept))


def sequence_option(chain: Chain, block: Block, forward: Sequence[int],
                    backward: Sequence[int]) -> BlockOption:
    """Measure a block option given as two compute sequences (the backward may recompute forward
    nodes, e.g. an rk-Checkmate solution): the kept data are the forward data the backward reads
    before producing them again, and every tensor is freed at its last use."""
    g = chain.graph
    own = _fwd_data(chain, block)
    produced: set[int] = set()
    kept: set[int] = set()
    for c in backward:
        kept.update(d for d in g.computes[c].inputs if d in own and d not in produced)
        produced.update(g.computes[c].outputs)
    kept.discard(block.output)
    keep_f = kept | ({block.output} if block.output is not None else set())
    fpeak, fdelta, ftime = replay(g, forward, own, (), keep_f)
    bdata = {d for c in block.backward for d in g.computes[c].outputs}
    counted = own | bdata | set(block.grad_in)
    alive = keep_f | set(block.grad_in)
    bpeak, _, btime = replay(g, backward, counted, alive, set(block.grad_out) | set(block.long_lived))
    return BlockOption(frozenset(kept), tuple(forward), tuple(backward), ftime, btime, fdelta, fpeak, bpeak)


def store_all(chain: Chain, block: Block) -> BlockOption:
    """Rotor's "store everything the backward reads" option."""
    return block_option(chain, block, block.saved)


def nosave(chain: Chain, block: Block) -> NoSave:
    g = chain.graph
    own = _fwd_data(chain, block)
    out = {block.output} if block.output is not None else set()
    pk, _, t = replay(g, block.forward, own, (), out)
    if block.input is not None:
        pd, _, _ = replay(g, block.forward, own | {block.input}, {block.input}, out)
    else:
        pd = pk
    return NoSave(t, pk, pd)


def grad_bytes(chain: Chain, ids: Iterable[int]) -> int:
    return sum(chain.graph.datas[d].bytes for d in ids)
