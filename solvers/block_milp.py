"""rk-Checkmate: the Checkmate MILP restricted to one block of the chain, solved over a grid of budget
pairs to give rk-Rotor a menu of block options (Rockmate Sec. 3.3 and Appendix B).

One block = its forward computes F_0..F_{m-1} and backward computes B_0..B_{p-1} (capture order),
its input cut (alive throughout, not counted), its output cut (kept from the forward to the end of
its backward reads: the next block holds it), the incoming gradients (alive when the backward
starts, freed after their last read).  Budget pair (Rockmate Sec. 3.3): `M_save` bounds the bytes
kept between the forward and the backward (output cut included: `BlockOption.keep`); `M_peak` bounds
the block's own peak, max(forward peak, kept + backward peak) in `BlockOption` terms.

Stages as in Checkmate (Jain et al. 2020, Sec. 4.3; Rockmate B.1): backward stage t runs B_t, first
(re)computing, in ascending order, any forward nodes it chooses; the forward data are kept or freed
on their own (CD-graph, Rockmate B.1/B.3), through the residency variables of `solvers.checkmate`
(residency at each data node's events; between events a datum is resident iff it is at the next
event, i.e. freed right after its last use).  Variables:
  K[d]      saved datum d kept from the forward to the backward (the S of the first backward stage);
  R[t,j]    forward node j recomputed in backward stage t (only ancestors of the saved data);
  S[t,d]    forward datum d alive when backward stage t starts;
  L[t,d,e]  d resident at its event e (its producer or one of its readers) in stage t.
Memory rows (Rockmate B.3): while step s of a stage runs, the resident forward data + its workspace +
the backward data and gradients alive then (a constant: backward nodes run once, in capture order)
<= M_peak (+ the incoming gradients, which `BlockOption.bwd_peak` does not count).  The forward runs
once in capture order with frees at last use, so its memory at step k is a constant plus the kept
data whose last forward use is before k; each forward step gets the same M_peak row.  Objective: the
recomputation time sum R[t,j] time_j (forward and backward run once besides).

Restrictions (why: each block MILP must solve in well under a second): no recomputation inside the
forward and no recomputation of backward nodes; forward node j is recomputed only in the stage of a
backward node that reads, directly or through other recomputed nodes, one of its products (computing
it earlier only to carry its outputs is not modelled); the producer of the output cut is never
recomputed (as in `solvers.chain.backward_sequence`).  Every early-free schedule of that class is a
feasible point of the MILP with exactly its replayed memory (`start_values` builds it, and the tests
check it against every kept-subset option of small blocks), so the optimum at a pair is no slower
than any such schedule meeting the pair.  Each solution is measured by
`solvers.chain.sequence_option` (the replay rockmate expands and `solvers.simulate` checks).
Solved by HiGHS through `solvers.milp` (highspy directly: it takes the MIP start; CBC through PuLP
when highspy is missing).  A time-limited solve returns its incumbent, never worse than its start;
so under time limits the options found, and the plans, depend on the machine's speed.
"""

from __future__ import annotations

import dataclasses
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass

from solvers import milp
from solvers.chain import Block, BlockOption, Chain, liveness_frees, sequence_option
from solvers.deadline import timed_out
from solvers.ir import Graph

#: per-MILP safety cap in seconds (a GPT attention block's model has under a thousand binaries and
#: is solved at the root in about 1 s on the 2-core CI machine at a load of 13)
SOLVE_SECONDS = 10.0
#: per-MILP branch-and-bound nodes: the work limit, the same on any machine (issue 18 item 4)
SOLVE_NODES = 500
#: the work one pair solve counts (`PairSearch.work`): its simplex iterations plus this, for the
#: fixed cost of a solve (on the 2-core CI machine about 1 ms per iteration and 5 ms per solve)
SOLVE_BASE_WORK = 5
#: simplex iterations per HiGHS MIP interrupt check on block models (21-52 measured on a 1k-op GPT's
#: 776-variable attention block): a pair solve given the work w stops at its w / this-th check, so no
#: one solve runs past the work its search has left (before, one took 42k iterations, 10 s, and met
#: `SOLVE_SECONDS`)
ITERATIONS_PER_CHECK = 40
#: larger block models are not built: HiGHS would not get past the root within a few seconds
MAX_VARS = 20_000


@dataclass(frozen=True)
class Stage:
    """Variables of backward stage t: R[j] forward position j recomputed, S_in[d] datum d alive when
    the stage starts, L[d][e] d resident at its event e (position m = the backward node itself)."""

    R: dict[int, int]
    S_in: dict[int, int]
    L: dict[int, dict[int, int]]


@dataclass(frozen=True)
class BlockMilp:
    """The rk-Checkmate model of one block: built once, solved for many budget pairs by changing the
    right-hand sides of `save_row` and of the memory rows.  Memory is in units of `unit` bytes."""

    block: Block
    model: milp.Model = dataclasses.field(repr=False)
    K: dict[int, int]
    stages: tuple[Stage, ...] = dataclasses.field(repr=False)
    save_row: int
    save_const: int                         # bytes always kept: the output cut
    # (row, constant bytes of the step; backward: less grad_in)
    peak_rows: tuple[tuple[int, int], ...] = dataclasses.field(repr=False)
    unit: float
    tscale: float


def peak(o: BlockOption) -> int:
    """The block's own peak of an option (Rockmate Sec. 3.3's M_peak): forward or kept + backward."""
    return max(o.fwd_peak, o.keep + o.bwd_peak)


def _own_forward_data(chain: Chain, block: Block) -> set[int]:
    g = chain.graph
    return {d for c in block.forward for d in g.computes[c].outputs} - chain.resident


def _recomputable(g: Graph, block: Block, own: set[int], pos: dict[int, int]) -> list[int]:
    """Forward positions that regenerating the saved data can need: their producers' ancestors."""
    out_producer = g.datas[block.output].producer if block.output is not None else None
    rel: set[int] = set()
    stack = [d for d in block.saved if d != block.output]
    while stack:
        p = g.datas[stack.pop()].producer
        if p is None or p == out_producer or pos[p] in rel:
            continue
        rel.add(pos[p])
        stack.extend(x for x in g.computes[p].inputs if x in own)
    return sorted(rel)


def _needed_by(g: Graph, b: int, own: set[int], pos: dict[int, int], rel: set[int]) -> list[int]:
    """Forward positions worth (re)computing in the stage of backward node `b`: the recomputable
    ancestors of the forward data `b` reads.  Computing a node in an earlier stage only to carry its
    outputs here is left out of the model (it keeps the MILP small; the schedules of
    `solvers.chain.backward_sequence`, which recompute right before the first need, all stay in)."""
    found: set[int] = set()
    stack = [d for d in g.computes[b].inputs if d in own]
    while stack:
        p = g.datas[stack.pop()].producer
        if p is None or pos[p] not in rel or pos[p] in found:
            continue
        found.add(pos[p])
        stack.extend(x for x in g.computes[p].inputs if x in own)
    return sorted(found)


def _backward_profile(chain: Chain, block: Block) -> list[tuple[int, int]]:
    """Per backward node: (bytes of backward data, incoming gradients and output cut alive before it
    starts, the same plus its new outputs and workspace while it runs).  Fixed, because backward
    nodes run once in capture order and recomputed forward nodes never touch those data."""
    g = chain.graph
    seq = block.backward
    out = {block.output} if block.output is not None else set()
    counted = {d for c in seq for d in g.computes[c].outputs} | set(block.grad_in) | out
    touched = {d for c in seq for d in (*g.computes[c].inputs, *g.computes[c].outputs)}
    alive = set(block.grad_in) | out
    keep = set(block.grad_out) | set(block.long_lived)
    start, after = liveness_frees(g, seq, alive, keep, touched - counted)
    alive -= set(start)
    size = [d.bytes for d in g.datas]
    live = sum(size[d] for d in alive)
    profile = []
    for i, c in enumerate(seq):
        node = g.computes[c]
        new = [d for d in dict.fromkeys(node.outputs) if d in counted and d not in alive]
        profile.append((live, live + sum(size[d] for d in new) + node.temp_bytes))
        alive.update(new)
        live += sum(size[d] for d in new)
        for d in after[i]:
            alive.discard(d)
            live -= size[d]
    return profile


def build(chain: Chain, block: Block, *, max_vars: int = MAX_VARS) -> BlockMilp | None:
    """The rk-Checkmate MILP of `block` (Rockmate Appendix B.2-B.3, restricted as in the module doc);
    None when it would have more than `max_vars` variables."""
    g = chain.graph
    fwd, bwd = block.forward, block.backward
    m, n_b = len(fwd), len(bwd)
    pos = {c: i for i, c in enumerate(fwd)}
    own = _own_forward_data(chain, block)
    out = block.output
    size = {d: g.datas[d].bytes for d in own}
    rel = _recomputable(g, block, own, pos)
    saved = [d for d in block.saved if d != out]
    # the data a backward stage may hold: saved data, and what recomputing their producers reads or writes
    data = sorted((set(saved) | {d for j in rel for c in [g.computes[fwd[j]]] for d in (*c.inputs, *c.outputs)
                                 if d in own}) - {out})
    prod = {d: pos[g.datas[d].producer] for d in own}
    reads_f: dict[int, list[int]] = {d: [] for d in own}
    for j, c in enumerate(fwd):
        for d in dict.fromkeys(g.computes[c].inputs):
            if d in own:
                reads_f[d].append(j)
    rel_set = set(rel)
    gin = sum(g.datas[d].bytes for d in block.grad_in)
    unit = float(max(sum(size.values()) + sum(g.datas[d].bytes for c in bwd for d in g.computes[c].outputs)
                     + sum(g.datas[d].bytes for d in block.grad_in), 1))
    tscale = sum(g.computes[c].time for c in (*fwd, *bwd)) or 1.0
    mdl = milp.Model()
    K = {d: mdl.var() for d in saved}
    save_row = mdl.num_rows
    mdl.row(((K[d], size[d] / unit) for d in saved), hi=0.0)
    out_bytes = g.datas[out].bytes if out is not None else 0
    peak_rows: list[tuple[int, int]] = []
    # forward: runs once in capture order; d is resident from its producer to its last forward read,
    # and after that iff kept (the output cut always is)
    last_f = {d: max([prod[d], *reads_f[d]]) for d in own}
    for k, c in enumerate(fwd):
        const = g.computes[c].temp_bytes
        terms = []
        for d in own:
            if prod[d] > k:
                continue
            if k <= last_f[d] or d == out:
                const += size[d]
            elif d in K:
                terms.append((K[d], size[d] / unit))
        peak_rows.append((mdl.num_rows, const))
        mdl.row(terms, hi=0.0)
    profile = _backward_profile(chain, block)
    needed = [_needed_by(g, b, own, pos, rel_set) for b in bwd]
    events = [{d: sorted({*([prod[d]] if prod[d] in need else []), *(j for j in reads_f[d] if j in need),
                          *([m] if d in g.computes[b].inputs else [])}) for d in data}
              for b, need in zip(bwd, needed, strict=True)]
    # a datum is worth carrying into stage t only if some stage >= t has an event of it
    last_use = {d: max((t for t in range(n_b) if events[t][d]), default=-1) for d in data}
    n_vars = len(saved) + sum(map(len, needed)) + sum(len(e) for ev in events for e in ev.values())
    if n_vars + sum(max(last_use[d], 0) for d in data) > max_vars:  # the count of K, R, L and S
        return None
    stages: list[Stage] = []
    s_in: dict[int, int] = dict(K)
    for t in range(n_b):
        R = {j: mdl.var(cost=g.computes[fwd[j]].time / tscale) for j in needed[t]}
        s_out = {d: mdl.var() for d in data if last_use[d] > t}
        L = {d: {e: mdl.var(lb=1.0 if e == m else 0.0) for e in ev} for d, ev in events[t].items() if ev}
        pieces = {d: _residency(mdl, m, prod[d], R, L.get(d, {}), s_in.get(d), s_out.get(d)) for d in data}
        for step in [*R, m]:
            pre, during = profile[t]
            terms = [(R[step], g.computes[fwd[step]].temp_bytes / unit)] if step != m else []
            for d, ps in pieces.items():
                vs = next((vs for last, vs in ps if step <= last), [])
                terms.extend((v, size[d] / unit) for v in vs)
            peak_rows.append((mdl.num_rows, (during if step == m else pre) - gin))
            mdl.row(terms, hi=0.0)
        stages.append(Stage(R, s_in, L))
        s_in = s_out
    return BlockMilp(block, mdl, K, tuple(stages), save_row, out_bytes, tuple(peak_rows), unit, tscale)


def _residency(mdl: milp.Model, m: int, produced_at: int, R: dict[int, int], L: dict[int, int],
               s_in: int | None, s_out: int | None) -> list[tuple[int, list[int]]]:
    """Rows tying one datum's residency in one stage together (Checkmate's validity constraints on
    the CD-graph, Rockmate B.2-B.3) and its residency as pieces (last step, variables): resident
    before its first event iff carried in (or resident at that event when it is a read), between
    events iff resident at the next one, after the last iff carried out.  Absent variables are 0."""
    carried = [(s_in, -1.0)] if s_in is not None else []
    events = sorted(L)
    if not events:
        if s_out is None:
            return []
        mdl.row([(s_out, 1.0), *carried], hi=0.0)  # carried through a stage that never touches it
        return [(m, [s_out])]
    first = events[0]
    pieces: list[tuple[int, list[int]]] = []
    if first == produced_at:  # created by its producer or carried in; the producer writes it
        mdl.row([(L[first], 1.0), (R[first], -1.0), *carried], hi=0.0)
        mdl.row([(L[first], 1.0), (R[first], -1.0)], lo=0.0)
        pieces.append((first - 1, [s_in] if s_in is not None else []))
    else:
        mdl.row([(L[first], 1.0), *carried], hi=0.0)
    for a, e in zip(events, events[1:], strict=False):
        mdl.row([(L[e], 1.0), (L[a], -1.0)], hi=0.0)  # no re-creation between events
    for e in events:
        if e != m and e != produced_at:
            mdl.row([(R[e], 1.0), (L[e], -1.0)], hi=0.0)  # a recomputed reader needs it resident
        pieces.append((e, [L[e]]))
    if s_out is not None:
        mdl.row([(s_out, 1.0), (L[events[-1]], -1.0)], hi=0.0)  # carried out only if resident at the end
        pieces.append((m, [s_out]))
    return pieces


def start_values(chain: Chain, bm: BlockMilp, option: BlockOption) -> list[float] | None:
    """MILP values of a known option (a MIP start): its recomputations per stage and the residency
    of the early-free replay.  None when the option lies outside the model's class."""
    g = chain.graph
    block = bm.block
    pos = {c: j for j, c in enumerate(block.forward)}
    m = len(block.forward)
    x = [0.0] * bm.model.num_vars
    steps: list[tuple[int, int]] = []  # (stage, position) of every executed backward-phase step
    t = 0
    for c in option.backward:
        if t < len(block.backward) and c == block.backward[t]:
            steps.append((t, m))
            t += 1
        elif c in pos and t < len(bm.stages) and pos[c] in bm.stages[t].R:
            if steps and steps[-1][0] == t and steps[-1][1] >= pos[c]:
                return None  # not ascending within the stage
            steps.append((t, pos[c]))
            x[bm.stages[t].R[pos[c]]] = 1.0
        else:
            return None
    if t != len(block.backward) or tuple(option.forward) != tuple(block.forward):
        return None
    counted = {d for st in bm.stages for d in (*st.S_in, *st.L)} | set(bm.K)
    seq = list(option.backward)
    touched = {d for c in seq for d in (*g.computes[c].inputs, *g.computes[c].outputs)}
    alive = set(option.kept) & counted
    start, after = liveness_frees(g, seq, alive, (), touched - counted)
    alive -= set(start)
    for d, v in bm.K.items():
        x[v] = float(d in option.kept)
    before: list[set[int]] = []
    during: list[set[int]] = []
    for i, c in enumerate(seq):
        before.append(set(alive))
        alive |= set(g.computes[c].outputs) & counted
        during.append(set(alive))
        alive -= set(after[i])
    for t, st in enumerate(bm.stages):
        mine = [i for i, (s, _) in enumerate(steps) if s == t]
        for d, v in st.S_in.items():
            x[v] = float(d in before[mine[0]])
        for d, ev in st.L.items():
            for e, v in ev.items():
                i = next(i for i in mine if steps[i][1] >= e)
                x[v] = float(d in (during[i] if steps[i][1] == e else before[i]))
    return x


@dataclass(frozen=True)
class PairResult:
    option: BlockOption | None
    status: milp.MilpStatus
    seconds: float
    warm_start: bool
    cut: bool = False  # stopped by its time cap (`SOLVE_SECONDS`), not by its node limit or an answer
    iterations: int = 0  # HiGHS's simplex iterations: the solve's counted work


def solve_pair(chain: Chain, bm: BlockMilp, m_save: int, m_peak: int, *, time_limit: float = SOLVE_SECONDS,
               start: BlockOption | None = None, work: int | None = None) -> PairResult:
    """The fastest block option with keep <= m_save and block peak <= m_peak (within the model's
    class), measured by replay; `option` None when the pair is infeasible or no solution was found.
    `start`, a known option meeting the pair, is handed to the solver as its first incumbent.  `work`
    (simplex iterations, None: no bound) stops the solve at HiGHS's interrupt check that many
    iterations in (`ITERATIONS_PER_CHECK`): counted, so the same on any machine."""
    t0 = _time.perf_counter()
    hi = list(bm.model.row_hi)
    hi[bm.save_row] = (m_save - bm.save_const) / bm.unit
    for r, const in bm.peak_rows:
        hi[r] = (m_peak - const) / bm.unit
    model = dataclasses.replace(bm.model, row_hi=hi)
    x0 = start_values(chain, bm, start) if start is not None else None
    if x0 is not None and model.violation(x0) > 1e-9:
        x0 = None  # outside the model (it over-counts some schedule): solve without it
    checks = None if work is None else max(1, work // ITERATIONS_PER_CHECK)
    sol = milp.solve(model, time_limit=time_limit, start=x0, nodes=SOLVE_NODES, checks=checks,
                     where="rockmate: a block MILP")
    if sol.x is None:
        return PairResult(None, sol.status, _time.perf_counter() - t0, x0 is not None, sol.cut,
                          sol.iterations)
    block = bm.block
    bseq: list[int] = []
    for st, b in zip(bm.stages, block.backward, strict=True):
        bseq.extend(block.forward[j] for j, v in sorted(st.R.items()) if sol.x[v] > 0.5)
        bseq.append(b)
    option = sequence_option(chain, block, block.forward, bseq)
    return PairResult(option, sol.status, _time.perf_counter() - t0, x0 is not None, sol.cut, sol.iterations)


def budget_pairs(bm: BlockMilp, known: Sequence[BlockOption], levels: int) -> list[tuple[int, int]]:
    """Rockmate Sec. 3.3's grid: `levels` kept-byte budgets evenly spaced from the output cut alone to
    the most any known option keeps, times `levels` peak budgets evenly spaced from the model's floor
    (the largest constant part of a memory row) to the largest known peak.  Pairs that no known
    option meets come first (they can only widen the menu), then the others; largest first in each
    (see `options`)."""
    top_keep = max(o.keep for o in known)
    top_peak = max(peak(o) for o in known)
    floor = min(max(c for _, c in bm.peak_rows), top_peak)

    def spaced(lo: int, hi: int) -> list[int]:
        return sorted({lo + (hi - lo) * i // max(levels - 1, 1) for i in range(levels)}, reverse=True)

    pairs = [(s, p) for s in spaced(min(bm.save_const, top_keep), top_keep) for p in spaced(floor, top_peak)]
    return sorted(pairs, key=lambda sp: _fastest(known, *sp) is not None)


def _fastest(options: Sequence[BlockOption], m_save: int, m_peak: int) -> BlockOption | None:
    fit = [o for o in options if o.keep <= m_save and peak(o) <= m_peak]
    return min(fit, key=lambda o: o.fwd_time + o.bwd_time, default=None)


@dataclass
class PairSearch:
    """The rk-Checkmate options of one block model over ever finer budget-pair grids (Rockmate Sec.
    3.3), resumable: each `run` visits the pairs of its grid not visited before.  Each MILP starts
    from the fastest known option meeting its pair that lies in the model's class.  Pairs no known
    option meets come first, then the others from the largest down: an optimum found at a larger pair
    that meets a smaller pair is optimal there too (the smaller pair's feasible set is a subset), and
    a pair proven infeasible rules out every smaller pair, so neither is solved."""

    chain: Chain
    bm: BlockMilp
    known: Sequence[BlockOption]
    found: list[BlockOption] = dataclasses.field(default_factory=list)
    solves: int = 0
    work: int = 0  # counted work of the solves so far (`SOLVE_BASE_WORK` + simplex iterations each)
    cut: bool = False  # the time cap stopped a `run` before its work was done
    _visited: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    _proven: list[tuple[tuple[int, int], BlockOption]] = dataclasses.field(default_factory=list)
    _infeasible: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    _in_class: dict[int, bool] = dataclasses.field(default_factory=dict)  # id(option) -> a valid start

    def run(self, levels: int, deadline: float, max_work: int | None = None) -> bool:
        """Visit the `levels` x `levels` grid, starting no MILP once this run's `work` reached
        `max_work` (None: no limit; the work bound, the same on any machine), until `deadline`
        (time.perf_counter(); the safety cap, which sets `cut`); True when done."""
        if not self.bm.model.num_vars:
            return True  # nothing to choose: the block saves nothing but its output
        spent = self.work
        for s, p in budget_pairs(self.bm, self.known, levels):
            left = deadline - _time.perf_counter()
            if timed_out(deadline, "rockmate: block MILP grid", _time.perf_counter()):
                self.cut = True
                return False
            if max_work is not None and self.work - spent >= max_work and (s, p) not in self._visited:
                return False
            if (s, p) in self._visited:
                continue
            self._visited.add((s, p))
            if any(s <= s2 and p <= p2 for s2, p2 in self._infeasible):
                continue
            if any(s <= s2 and p <= p2 and o.keep <= s and peak(o) <= p for (s2, p2), o in self._proven):
                continue
            # the solve gets the work this run has left, so the run ends within its share
            res = solve_pair(self.chain, self.bm, s, p, time_limit=min(SOLVE_SECONDS, left),
                             start=self._start(s, p),
                             work=None if max_work is None else max_work - (self.work - spent))
            self.solves += 1
            self.work += SOLVE_BASE_WORK + res.iterations
            self.cut = self.cut or res.cut
            if res.status == "infeasible":
                self._infeasible.append((s, p))
            elif res.option is not None:
                self.found.append(res.option)
                if res.status == "optimal":
                    self._proven.append(((s, p), res.option))
        return True

    def _start(self, s: int, p: int) -> BlockOption | None:
        for o in sorted([*self.known, *self.found], key=lambda o: o.fwd_time + o.bwd_time):
            if o.keep <= s and peak(o) <= p:
                if id(o) not in self._in_class:
                    self._in_class[id(o)] = start_values(self.chain, self.bm, o) is not None
                if self._in_class[id(o)]:
                    return o
        return None
