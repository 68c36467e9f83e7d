"""Checkmate: optimal rematerialization as a MILP over frontier-advancing stages (Jain et al., MLSys 2020).

Stage t computes compute node t of a fixed topological order for the first time and may recompute
earlier nodes, in ascending order, each at most once (Checkmate Sec. 4.3: R and S are lower
triangular).  The model
works on the CD-graph (Rockmate Appendix B): a compute writes several data nodes, and each data node
is kept or freed on its own.

Variables, per stage t (positions in that order of the required compute nodes):
  R[t,j]    node j computed in stage t (R[t,t] = 1);
  S[t,d]    data d alive when stage t starts (kept from stage t-1);
  L[t,d,e]  data d resident at step e of stage t, only at d's *events* e (its producer and its
            readers up to t).  Between events d is resident iff it is resident at the next event, i.e.
            it is freed right after its last use (Rockmate B.3's DELETE/create variables, folded into
            "free as early as possible", which loses nothing and is what `with_early_frees` emits);
  U[t,k]    bytes resident at step k of stage t (Checkmate's U, chained over the steps where some
            data node's residency changes, so the memory rows stay sparse).
Memory during step k: persistent sources + U[t,k] + workspace_k R[t,k] <= budget, with the outputs of
node k counted once even when some of them are already alive (the simulator's rule).  The objective is
the total compute time sum R[t,j] time_j.

Every schedule returned passes `solvers.simulate` and fits the budget.  `solve` seeds the MILP
(a MIP start) with the fastest schedule it knows that fits: the eager order, the caller's incumbent,
Rockmate's and Rotor's plans and the LP rounding's; a time limit returns the best schedule known with
the gap against the MILP's bound, so it is never worse than any of them.  `solve_lp` is Checkmate's
two-phase LP rounding (Sec. 5): solve the LP relaxation (at the budget, then scaled-down budgets),
round S, recompute the cheapest R for that S (the dependency closure), keep the best schedule that
fits, never worse than the checkpointing heuristic it computes first.  `minimum_budget` solves the
same model with the peak as objective; its answer makes `InfeasibleBudget.minimum_bytes` tight and is
the last resort before giving up.  The lowest-peak schedule it found is remembered for the last
`CACHED_GRAPHS` graphs and joins the known schedules of every later call on the same graph: a budget an
`InfeasibleBudget` named stays feasible when the caller asks for it, however little time the MILP
gets then (a time-limited MILP finds different schedules from call to call).  Schedules that do not
come from a MILP proven optimal are pruned (`_prune`): a recomputation goes when keeping its outputs
alive from their previous computation keeps the memory within the budget.  The min-peak objective
has no time term, so below Rockmate's minimum (where no time-optimised start exists and the MILP of
an unrolled graph is not built in time) its schedule came back recomputing the forward from the
start for every backward node (16751 recomputations on a 386-node LSTM language model; 18 pruned).

Known limits: the stage class fixes the order of first computations (capture order, or the order of
the MILP's start) and recomputes in ascending order inside a stage, so a schedule in another order
can beat this "optimum" (tests/bruteforce.py finds such cases even on 3-layer training chains);
`status="optimal"` is optimal within the class (`extra["optimal_within"]` names the order).  The model
has O(n^2) variables: on captured graphs of a few hundred nodes (a 12-layer GPT: 591 nodes, 10^6
variables) neither the MILP nor its LP relaxation is built and solved within seconds, and the answer
is the best start with a gap against the no-recomputation bound.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from solvers import milp
from solvers.deadline import Deadline, timed_out
from solvers.ir import Graph, GraphError, Phase
from solvers.memo import RecentMemo
from solvers.result import InfeasibleBudget, OutOfTime, SolveResult, SolverStats
from solvers.schedule import Schedule, Step, compute, eager_schedule, free
from solvers.simulate import Timeline, simulate


# --- schedules from compute sequences -------------------------------------------------------------
def with_early_frees(graph: Graph, sequence: Sequence[int]) -> Schedule:
    """Turn a compute sequence (recomputes allowed) into a schedule that frees every produced tensor
    right after its last read before it is produced again (never: required outputs, which the caller
    holds, and sources).  Any valid placement of frees keeps a superset alive, so this is the
    lowest-memory one."""
    prods: dict[int, list[int]] = {}
    reads: dict[int, list[int]] = {}
    for q, c in enumerate(sequence):
        for d in graph.computes[c].outputs:
            prods.setdefault(d, []).append(q)
        for d in dict.fromkeys(graph.computes[c].inputs):
            if graph.datas[d].producer is not None:
                reads.setdefault(d, []).append(q)
    keep = set(graph.outputs)
    frees_after: dict[int, list[int]] = {}
    for d, ps in prods.items():
        rs = reads.get(d, [])
        ri = 0
        for i, a in enumerate(ps):
            b = ps[i + 1] if i + 1 < len(ps) else math.inf
            last = a  # unread before its next production: free right after this one
            while ri < len(rs) and rs[ri] < b:
                last = max(last, rs[ri])
                ri += 1
            if d in keep:  # required outputs stay once produced: the caller holds them
                continue
            frees_after.setdefault(last, []).append(d)
    steps: list[Step] = []
    for q, c in enumerate(sequence):
        steps.append(compute(c))
        steps.extend(free(d) for d in sorted(set(frees_after.get(q, ()))))
    return tuple(steps)


# --- the stage structure ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Stages:
    order: tuple[int, ...]                 # required compute ids in capture order; stage t adds order[t]
    pos: dict[int, int]
    datas: tuple[int, ...]                 # data produced by required nodes
    prod: dict[int, int]                   # data -> producer position
    readers: dict[int, tuple[int, ...]]    # data -> ascending positions of its required readers
    inputs: tuple[tuple[int, ...], ...]    # per position: produced data it reads
    outputs: frozenset[int]                # produced data that are required graph outputs
    base: int                              # persistent bytes (sources, always alive)

    @property
    def n(self) -> int:
        return len(self.order)


def _stages(graph: Graph, order: Sequence[int] | None = None) -> _Stages:
    """The stage structure for `order`, a topological order of the required compute nodes (default:
    capture order).  Checkmate fixes one topological order (Sec. 4.3); any valid one will do."""
    order = tuple(sorted(graph.required_computes)) if order is None else tuple(order)
    pos = {c: i for i, c in enumerate(order)}
    datas = tuple(d.id for d in graph.datas if d.producer is not None and d.producer in pos)
    prod = {d: pos[graph.datas[d].producer] for d in datas}  # type: ignore[index]
    readers = {d: tuple(sorted(pos[c] for c in graph.consumers(d) if c in pos)) for d in datas}
    inputs = tuple(tuple(d for d in dict.fromkeys(graph.computes[c].inputs) if d in prod) for c in order)
    return _Stages(order, pos, datas, prod, readers, inputs, frozenset(d for d in graph.outputs if d in prod),
                   graph.persistent_bytes())


def _first_order(graph: Graph, sequence: Sequence[int]) -> tuple[int, ...] | None:
    """The required compute nodes in the order `sequence` first computes them (None if it misses one)."""
    required = graph.required_computes
    order = tuple(c for c in dict.fromkeys(sequence) if c in required)
    return order if len(order) == len(required) else None


def _stage_sets(st: _Stages, sequence: Sequence[int]) -> list[list[int]] | None:
    """Positions computed in each stage, or None when `sequence` is outside Checkmate's class."""
    stages: list[list[int]] = [[]]
    t = 0
    for c in sequence:
        j = st.pos.get(c)
        if j is None or j > t or t >= st.n:
            return None
        if stages[-1] and j <= stages[-1][-1]:
            return None
        stages[-1].append(j)
        if j == t:
            t += 1
            stages.append([])
    if t != st.n or stages[-1]:
        return None
    return stages[:-1]


def _closure_sequence(st: _Stages, keep: Sequence[set[int]], deadline: float = math.inf) -> list[int]:
    """Cheapest R for a given S (Checkmate Sec. 5.1): stage t runs node t, whatever the data kept into
    stage t+1 needs that is not carried in (keep[t]), and, recursively, the producers of their inputs.
    Raises `_Timeout` past `deadline` (quadratic in the stages: large graphs take seconds)."""
    seq: list[int] = []
    for t in range(st.n):
        if t % 64 == 0 and timed_out(deadline, "checkmate: dependency closure"):
            raise _Timeout
        # required outputs are carried from their production on (S[t, d] = 1 in the MILP)
        nxt = (keep[t + 1] | {d for d in st.outputs if st.prod[d] <= t}) if t + 1 < st.n else st.outputs
        carried = keep[t] | {d for d in st.outputs if st.prod[d] < t}
        run = {t}
        stack = [d for d in (*st.inputs[t], *(nxt - carried)) if d not in carried]
        while stack:
            d = stack.pop()
            j = st.prod[d]
            if j not in run:
                run.add(j)
                stack.extend(x for x in st.inputs[j] if x not in carried)
        seq.extend(st.order[j] for j in sorted(run))
    return seq


# --- the MILP --------------------------------------------------------------------------------------
@dataclass
class _Vars:
    R: list[list[int]]
    S: list[dict[int, int]]
    L: list[dict[int, dict[int, int]]]
    U: list[list[int]]


class _Timeout(Exception):
    pass


def _build(st: _Stages, graph: Graph, cap: float, deadline: float, *,
           minimize_peak: bool = False, forward_only: bool = False) -> tuple[milp.Model, _Vars]:
    """The stage MILP with memory in units of `cap` (budget minus persistent bytes) and time in units of
    one pass, so HiGHS's absolute tolerances mean the same on every graph.  `minimize_peak`: `cap` is
    only the unit; the objective is the peak (variable Z >= every step's memory) alone.
    `forward_only`: R[t,j] fixed to 0 for backward nodes j < t (recompute forward nodes only)."""
    n = st.n
    m = milp.Model()
    tscale = (sum(graph.computes[c].time for c in st.order) or 1.0) if not minimize_peak else math.inf
    Z = m.var(lb=0.0, ub=math.inf, cost=1.0, integer=False) if minimize_peak else None
    mem = {d: graph.datas[d].bytes / cap for d in st.datas}
    useful = {d for d in st.datas if st.readers[d] or d in st.outputs}
    # forward_only: only forward nodes are recomputed, so a datum no forward node reads and no forward
    # node writes is dead after its last reader (S fixed to 0 there; HiGHS's presolve drops the rest)
    redo = {j for j in range(n) if not forward_only or graph.computes[st.order[j]].phase == Phase.FORWARD}
    until = {d: n if d in st.outputs or st.prod[d] in redo or any(r in redo for r in st.readers[d])
             else max(st.readers[d], default=st.prod[d]) for d in st.datas}
    V = _Vars([], [], [], [])
    for t in range(n):
        if timed_out(deadline, "checkmate: building the MILP"):  # the variables alone are quadratic
            raise _Timeout
        V.R.append([m.var(cost=graph.computes[st.order[j]].time / tscale, lb=1.0 if j == t else 0.0,
                          ub=1.0 if j == t or j in redo else 0.0)
                    for j in range(t + 1)])
        # required outputs stay resident once produced: the caller holds them (the exported module
        # returns the forward outputs when the backward starts), so freeing them saves nothing real
        V.S.append({d: m.var(lb=1.0 if d in st.outputs else 0.0, ub=1.0 if t <= until[d] else 0.0)
                    for d in st.datas if st.prod[d] < t and d in useful})
    for t in range(n):
        if timed_out(deadline, "checkmate: building the MILP"):
            raise _Timeout
        R, S = V.R[t], V.S[t]
        Snext = V.S[t + 1] if t + 1 < n else {}
        L: dict[int, dict[int, int]] = {}
        # residency expression of d over the steps of stage t: (first step, last step, [(var, coef)], const)
        segments: dict[int, list[tuple[int, int, list[tuple[int, float]], float]]] = {}
        for d in st.datas:
            p = st.prod[d]
            if p > t:
                continue
            events = [p, *(c for c in st.readers[d] if c <= t)]
            Ld = {e: m.var() for e in events}
            L[d] = Ld
            # created only by its producer: L[p] <= S + R[p]; the producer writes it: L[p] >= R[p]
            m.row([(Ld[p], 1.0), (R[p], -1.0), *([(S[d], -1.0)] if d in S else [])], hi=0.0)
            m.row([(Ld[p], 1.0), (R[p], -1.0)], lo=0.0)
            for a, b in zip(events, events[1:], strict=False):
                m.row([(Ld[b], 1.0), (Ld[a], -1.0)], hi=0.0)        # no re-creation between events
            for c in events[1:]:
                m.row([(R[c], 1.0), (Ld[c], -1.0)], hi=0.0)         # a reader needs it resident
            last = events[-1]
            if d in Snext:
                m.row([(Snext[d], 1.0), (Ld[last], -1.0)], hi=0.0)  # kept only if resident at the end
            if t == n - 1 and d in st.outputs:
                m.row([(Ld[last], 1.0)], lo=1.0)
            segs = []
            if p > 0 and d in S:
                segs.append((0, p - 1, [(S[d], 1.0)], 0.0))
            prev = -1
            for e in events:
                segs.append((prev + 1 if prev >= 0 else p, e, [(Ld[e], 1.0)], 0.0))
                prev = e
            if last < t:
                if d in Snext:
                    segs.append((last + 1, t, [(Snext[d], 1.0)], 0.0))
                elif t == n - 1 and d in st.outputs:
                    segs.append((last + 1, t, [], 1.0))
            segments[d] = segs
        # U[t,k] = U[t,k-1] + sum of residency changes at k (each data changes only at segment starts)
        delta: list[list[tuple[int, float]]] = [[] for _ in range(t + 1)]
        const = [0.0] * (t + 1)
        for d, segs in segments.items():
            md = mem[d]
            prev_terms: list[tuple[int, float]] = []
            prev_const = 0.0
            for lo, _hi, terms, c0 in segs:
                delta[lo].extend((v, md * a) for v, a in terms)
                delta[lo].extend((v, -md * a) for v, a in prev_terms)
                const[lo] += md * (c0 - prev_const)
                prev_terms, prev_const = terms, c0
            end = segs[-1][1] + 1
            if end <= t:  # resident until `end - 1`, gone afterwards
                delta[end].extend((v, -md * a) for v, a in prev_terms)
                const[end] -= md * prev_const
        U = []
        for k in range(t + 1):
            u = m.var(lb=0.0, ub=math.inf, integer=False)
            back = [(U[-1], -1.0)] if U else []
            m.row([(u, 1.0), *back, *((v, -a) for v, a in delta[k])], lo=const[k], hi=const[k])
            U.append(u)
            temp = graph.computes[st.order[k]].temp_bytes / cap
            if Z is None:
                m.row([(u, 1.0), (R[k], temp)], hi=1.0)
            else:
                m.row([(u, 1.0), (R[k], temp), (Z, -1.0)], hi=0.0)
        V.L.append(L)
        V.U.append(U)
    return m, V


def _start_values(st: _Stages, graph: Graph, m: milp.Model, V: _Vars, stages: list[list[int]]) -> list[float]:
    """MILP values of a schedule in Checkmate's class with early frees (see `with_early_frees`)."""
    x = [0.0] * m.num_vars
    n = st.n
    runs = [set(s) for s in stages]
    for t in range(n):
        for j in runs[t]:
            x[V.R[t][j]] = 1.0
    # global coordinates (t, k); a production or read happens at (t, j) when j runs in stage t
    prods: dict[int, list[tuple[int, int]]] = {d: [] for d in st.datas}
    reads: dict[int, list[tuple[int, int]]] = {d: [] for d in st.datas}
    for t in range(n):
        for j in sorted(runs[t]):
            for d in graph.computes[st.order[j]].outputs:
                if d in prods:
                    prods[d].append((t, j))
            for d in st.inputs[j]:
                reads[d].append((t, j))

    def alive(d: int, at: tuple[int, int], during: bool) -> bool:
        ps = [p for p in prods[d] if (p <= at if during else p < at)]
        if not ps:
            return False
        a = ps[-1]
        if during and a == at:
            return True
        later = [p for p in prods[d] if p > a]
        b = later[0] if later else None
        if any(at <= r and (b is None or r < b) for r in reads[d]):
            return True
        return d in st.outputs  # required outputs stay once produced

    for t in range(n):
        for d, v in V.S[t].items():
            x[v] = float(alive(d, (t, 0), during=False))
        for d, Ld in V.L[t].items():
            for e, v in Ld.items():
                x[v] = float(alive(d, (t, e), during=e in runs[t]))
    # U from its defining equality rows (in stage order, each U after its predecessor; U comes first)
    for r in range(m.num_rows):
        lo, hi = m.row_lo[r], m.row_hi[r]
        if lo != hi:
            continue
        ks = range(m.row_start[r], m.row_start[r + 1])
        u = m.row_index[ks[0]]
        x[u] = lo - sum(m.row_value[k] * x[m.row_index[k]] for k in ks[1:])
    return x


# --- heuristics and bounds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    schedule: Schedule
    timeline: Timeline
    source: str
    pruned_at: int = -1  # a budget `_prune` found no recomputation to remove at (none: -1)

    @property
    def time(self) -> float:
        return self.timeline.total_time

    @property
    def peak(self) -> int:
        return self.timeline.peak_bytes


#: per graph, the seconds the slowest step that builds and simulates a schedule took (at least
#: `STEP_SIMULATIONS` simulations): such a step starts only when one still fits before the deadline
_PACE: RecentMemo[Graph, float] = RecentMemo(16)
STEP_SIMULATIONS = 3


def _step_seconds(graph: Graph) -> float:
    """How long building and simulating one schedule of `graph` is expected to take (0: not yet seen)."""
    return _PACE.get(graph) or 0.0


def _note_step(graph: Graph, seconds: float) -> float:
    """Remember that one step on `graph` took `seconds`; returns the expected step time from now on."""
    _PACE.put(graph, max(seconds, _step_seconds(graph)))
    return _step_seconds(graph)


def _plan(graph: Graph, schedule: Schedule, source: str) -> _Plan | None:
    """`schedule` with its timeline, or None when it is invalid or frees a required output: the caller
    holds outputs once computed (`with_early_frees`), so such a schedule's peak understates the run."""
    started = time.monotonic()
    tl = simulate(graph, schedule)
    _note_step(graph, STEP_SIMULATIONS * (time.monotonic() - started))
    outputs = set(graph.outputs)
    if not tl.valid or any(s.op == "free" and s.node in outputs for s in schedule):
        return None
    return _Plan(schedule, tl, source)


# --- pruning recomputations the budget does not need -----------------------------------------------
_GONE = 1 << 62  # subtracted from the memory of a removed step


class _Residency:
    """The memory of `with_early_frees(graph, sequence)` (Checkmate's U, Sec. 4, per compute step) as
    intervals, with removable recomputations.

    Data d produced at position a is resident from a to its last read before its next production
    (required outputs: from their first production to the end), so the memory during compute q is
    `mem[q]` = persistent bytes + the intervals covering q + q's workspace, exactly what `simulate`
    reports for that step.  Removing a recomputation at q merges each of its outputs' interval into the
    previous one (kept alive instead of recomputed: the only memory added), shortens the intervals of
    its inputs, and removes, in turn, every recomputation whose outputs nobody reads any more."""

    def __init__(self, graph: Graph, sequence: Sequence[int]) -> None:
        self.graph, self.seq = graph, list(sequence)
        self.keep = set(graph.outputs)
        self.ins = {c: [d for d in dict.fromkeys(graph.computes[c].inputs)
                        if graph.datas[d].producer is not None and d not in self.keep] for c in set(sequence)}
        self.outs = {c: [d for d in graph.computes[c].outputs if d not in self.keep] for c in set(sequence)}
        self.prods: dict[int, list[int]] = {}
        self.reads: dict[tuple[int, int], list[int]] = {}
        diff = np.zeros(len(self.seq) + 1, dtype=np.int64)
        diff[0] = graph.persistent_bytes()
        first: dict[int, int] = {}
        for q, c in enumerate(self.seq):
            first.setdefault(c, q)
            for d in self.ins[c]:
                self.reads[d, self.prods[d][-1]].append(q)
            for d in self.outs[c]:
                self.prods.setdefault(d, []).append(q)
                self.reads[d, q] = []
            if first[c] == q:
                diff[q] += sum(graph.datas[d].bytes for d in graph.computes[c].outputs if d in self.keep)
            diff[q] += graph.computes[c].temp_bytes
            diff[q + 1] -= graph.computes[c].temp_bytes
        for (d, a), rs in self.reads.items():
            diff[a] += graph.datas[d].bytes
            diff[(rs[-1] if rs else a) + 1] -= graph.datas[d].bytes
        self.mem = np.cumsum(diff[:-1])
        self.first = set(first.values())
        self.dead = np.zeros(len(self.seq), dtype=bool)
        self.log: list[tuple] = []

    def _add(self, lo: int, hi: int, v: int) -> None:
        if lo <= hi:
            self.mem[lo:hi + 1] += v
            self.log.append(("mem", lo, hi, v))

    def removable(self, q: int) -> bool:
        """A recomputation, not a node's first computation (required outputs stay from that one on)."""
        return not self.dead[q] and q not in self.first

    def remove(self, q: int, cap: int) -> bool:
        """Remove the recomputation at q (and what only it needed) iff memory stays <= `cap` throughout."""
        self.log = []
        grown: list[tuple[int, int]] = []
        self._remove(q, grown)
        if all(self.mem[lo:hi + 1].max(initial=0) <= cap for lo, hi in grown):
            return True
        for entry in reversed(self.log):
            self._undo(entry)
        return False

    def _remove(self, q: int, grown: list[tuple[int, int]]) -> None:
        c = self.seq[q]
        self.dead[q] = True
        self.log.append(("dead", q))
        self._add(q, q, -_GONE)  # no longer a step: never over the budget
        for d in self.outs[c]:
            ps = self.prods[d]
            i = bisect.bisect_left(ps, q)
            prev = ps[i - 1]
            rs = self.reads.pop((d, q))
            ps.pop(i)
            self.log.append(("prod", d, i, q, rs))
            if rs:
                before = self.reads[d, prev]
                end = before[-1] if before else prev
                before.extend(rs)
                self.log.append(("merge", d, prev, len(rs)))
                self._add(end + 1, q - 1, self.graph.datas[d].bytes)
                grown.append((end + 1, q - 1))
        for x in self.ins[c]:
            ps = self.prods[x]
            a = ps[bisect.bisect_left(ps, q) - 1]
            rs = self.reads[x, a]
            j = bisect.bisect_left(rs, q)
            rs.pop(j)
            self.log.append(("read", x, a, j, q))
            if j == len(rs):  # q was the last read: x goes after its previous read (or production)
                self._add((rs[-1] if rs else a) + 1, q, -self.graph.datas[x].bytes)
            if not rs and self.removable(a) and not any(self.reads[e, a] for e in self.outs[self.seq[a]]):
                self._remove(a, grown)

    def _undo(self, entry: tuple) -> None:
        kind, *args = entry
        if kind == "mem":
            lo, hi, v = args
            self.mem[lo:hi + 1] -= v
        elif kind == "dead":
            self.dead[args[0]] = False
        elif kind == "prod":
            d, i, q, rs = args
            self.prods[d].insert(i, q)
            self.reads[d, q] = rs
        elif kind == "merge":
            d, prev, k = args
            del self.reads[d, prev][-k:]
        else:
            x, a, j, q = args
            self.reads[x, a].insert(j, q)


def _prune(graph: Graph, plan: _Plan, budget: int, deadline: float) -> _Plan:
    """`plan` without recomputations `budget` does not need.  Each is removed (its outputs kept alive
    from their previous computation instead, `_Residency.remove`) when the memory stays within
    `budget`, in sweeps until none goes; which removals fit depends on their order, so three orders
    (earliest, latest, slowest node first) each start from `plan` while `deadline` allows, and the
    fastest result wins.  Every sweep stops at the deadline (the time limit is a promise, issue 21):
    what it removed by then is kept, as the removals made so far fit.  A schedule in Checkmate's class
    stays in it (Sec. 4.3: fewer recomputations per stage).  Every result is checked by `simulate`."""
    seq = [s.node for s in plan.schedule if s.op == "compute"]
    if len(set(seq)) == len(seq) or plan.pruned_at >= budget:  # less room removes nothing more
        return plan
    if timed_out(deadline - _step_seconds(graph), "checkmate: pruning"):  # no time to simulate one
        return plan
    n = len(seq)
    orders = (range(n), range(n - 1, -1, -1), sorted(range(n), key=lambda q: -graph.computes[seq[q]].time))
    best = plan
    for k, order in enumerate(orders):
        if k and timed_out(deadline, "checkmate: pruning"):
            break
        res = _Residency(graph, seq)
        removed = done = True
        sweeps = 0
        while removed and done:
            removed = False
            for i, q in enumerate(order):
                if res.removable(q) and res.remove(q, budget):
                    removed = True
                if i % 64 == 0 and timed_out(deadline, "checkmate: pruning"):
                    done = False
                    break
            sweeps += 1
        if not res.dead.any():
            continue  # nothing removed (the deadline came first): nothing to simulate again
        source = plan.source if plan.source.endswith(" pruned") else f"{plan.source} pruned"
        kept = [c for q, c in enumerate(seq) if not res.dead[q]]
        pruned = _plan(graph, with_early_frees(graph, kept), source)
        if pruned is not None and pruned.peak <= budget and pruned.time <= best.time:
            best = replace(pruned, pruned_at=budget if done else -1)
    return best


def _prune_fastest(graph: Graph, plans: Sequence[_Plan], budget: int, deadline: float,
                   count: int = 3) -> _Plan | None:
    """The fastest of the `count` fastest `plans` that fit `budget`, each pruned (`_prune`): a slower
    start can prune to a faster schedule (a checkpointing plan versus a min-peak one).  Only the
    first is pruned once `deadline` has passed."""
    fits = sorted({p.schedule: p for p in plans if p.peak <= budget}.values(), key=lambda p: p.time)
    pruned: list[_Plan] = []
    for p in fits[:count]:
        if pruned and timed_out(deadline, "checkmate: pruning"):
            break
        pruned.append(_prune(graph, p, budget, deadline))
    return min(pruned, key=lambda p: p.time, default=None)


def _forward_data(graph: Graph, st: _Stages) -> list[int]:
    """Data produced by forward nodes, other than required outputs: what checkpointing may drop."""
    return [d for d in st.datas
            if d not in st.outputs and graph.computes[st.order[st.prod[d]]].phase == Phase.FORWARD]


def _drop_plans(graph: Graph, st: _Stages, keep: Sequence[set[int]], candidates: Sequence[int], budget: int,
                deadline: float, source: str, everywhere: bool = False) -> list[_Plan]:
    """Schedules from the keep sets `keep` (S per stage) with the first k of `candidates` dropped: a
    dropped activation is held in no stage from its production up to its first non-forward reader, so
    the closure (`_closure_sequence`) recomputes it there, once, and the backward holds it from then
    on (`everywhere`: held in no stage at all, recomputed for every reader; slower, less memory).
    Binary search for the fewest drops that fit `budget` (peak falls, roughly, as k grows): O(log n)
    simulations.  Dropping all of them is evaluated first; if that does not fit, only it."""
    first_late: dict[int, int] = {}
    for d in candidates:
        late = [r for r in st.readers[d] if graph.computes[st.order[r]].phase != Phase.FORWARD]
        first_late[d] = late[0] if late else (st.readers[d][-1] if st.readers[d] else st.prod[d])
        if everywhere:
            first_late[d] = st.n - 1
    plans: dict[int, _Plan] = {}
    took = [_step_seconds(graph)]  # what the last evaluation took: the next starts only if it can end in time

    def evaluate(k: int) -> _Plan | None:
        if k not in plans:
            started = time.monotonic()
            sets = [set(s) for s in keep]
            for d in candidates[:k]:
                for t in range(st.prod[d] + 1, first_late[d] + 1):
                    sets[t].discard(d)
            try:
                seq = _closure_sequence(st, sets, deadline)
            except _Timeout:
                return None
            p = _plan(graph, with_early_frees(graph, seq), f"{source}({k}/{len(candidates)})")
            if p is not None:
                plans[k] = p
            took[0] = _note_step(graph, time.monotonic() - started)
        return plans.get(k)

    if timed_out(deadline - took[0], f"checkmate: {source} plans"):
        return []
    top = evaluate(len(candidates))
    if top is not None and top.peak <= budget:
        lo, hi = -1, len(candidates)  # invariant: hi fits
        while hi - lo > 1 and not timed_out(deadline - took[0], f"checkmate: {source} plans"):
            mid = (lo + hi) // 2
            p = evaluate(mid)
            if p is not None and p.peak <= budget:
                hi = mid
            else:
                lo = mid
    return list(plans.values())


def _checkpoint_plans(graph: Graph, st: _Stages, budget: int, deadline: float) -> list[_Plan]:
    """Checkpointing: everything is kept until its last use except the k forward activations cheapest
    to recompute per byte, which are dropped after the forward and recomputed once for the backward
    (`_drop_plans`); the fewest drops that fit `budget`.  When even dropping all of them does not fit,
    the same with the dropped activations recomputed for every reader (far slower, less memory)."""
    fwd = _forward_data(graph, st)
    fwd.sort(key=lambda d: graph.computes[st.order[st.prod[d]]].time / max(graph.datas[d].bytes, 1))
    made: list[list[int]] = [[] for _ in range(st.n)]
    for d in st.datas:
        made[st.prod[d]].append(d)
    keep = [set()]
    for t in range(1, st.n):  # stage t holds everything produced before it (copies: quadratic, in C)
        if t % 256 == 0 and timed_out(deadline, "checkmate: checkpoint plans"):
            return []
        keep.append(keep[-1] | set(made[t - 1]))
    plans = _drop_plans(graph, st, keep, fwd, budget, deadline, "checkpoint")
    if all(p.peak > budget for p in plans) and not timed_out(deadline, "checkmate: checkpoint plans"):
        plans += _drop_plans(graph, st, keep, fwd, budget, deadline, "checkpoint-everywhere", everywhere=True)
    return plans


def _lower_bound_bytes(graph: Graph, st: _Stages) -> int:
    """No schedule fits below this: some node must run with its inputs, outputs and workspace resident."""
    best = st.base
    for c in st.order:
        node = graph.computes[c]
        live = {d for d in (*node.inputs, *node.outputs) if graph.datas[d].producer is not None}
        best = max(best, st.base + sum(graph.datas[d].bytes for d in live) + node.temp_bytes)
    return best


def _min_peak_plan(graph: Graph, budget: int, known: list[_Plan], seconds: float) -> _Plan | None:
    """Last resort before giving up: the min-peak MILP's schedule (added to `known`), if it fits."""
    if seconds <= 0:
        return None
    m = minimum_budget(graph, time_limit=seconds)
    p = _plan(graph, m.schedule, "milp-min-peak")
    if p is None:
        return None
    known.append(p)
    return p if p.peak <= budget else None


def _prune_deadline(deadline: float, time_limit: float, share: float = 1.0) -> float:
    """When a pruning pass (`_prune`) stops: after `share` of the time left, or a tenth of the limit when
    slow earlier steps left less (so they do not leave an absurd schedule unpruned), and never after
    `deadline`."""
    now = time.monotonic()
    return min(now + max(share * (deadline - now), 0.1 * time_limit), deadline)


def _spare(deadline: float, time_limit: float) -> float:
    """Time to spend tightening the minimum budget of an infeasible answer: a quarter of the limit."""
    return min(max(deadline - time.monotonic(), 0.0), 0.25 * time_limit)


def _infeasible(budget: int, known: list[_Plan], solver: str, graph: Graph,
                time_limit: float = 0.0) -> InfeasibleBudget:
    """The error naming the smallest peak of a schedule known for `graph` (`known`, and what earlier
    calls remembered); first spend up to `time_limit` on the min-peak MILP (`minimum_budget`) to make
    that number tight.  That schedule is remembered, so the budget named stays feasible."""
    if time_limit > 0:
        minimum_budget(graph, time_limit=time_limit)
    best = min([*known, *_remembered(graph)], key=lambda p: p.peak, default=None)
    if best is None:
        return InfeasibleBudget(budget, None, solver)
    _remember(graph, MinimumBudget(best.peak, best.schedule, False, 0.0))
    return InfeasibleBudget(budget, best.peak, solver)


def _refusal(budget: int, known: list[_Plan], solver: str, graph: Graph, end: float) -> InfeasibleBudget:
    """`_infeasible`'s error, or `OutOfTime` (with the same smallest peak known) when the search stopped
    at the deadline `end` rather than running out of ideas."""
    exc = _infeasible(budget, known, solver, graph)
    if not timed_out(end, f"{solver}: search"):
        return exc
    return OutOfTime(f"{solver} search", budget, solver, exc.minimum_bytes)


#: how many graphs' lowest-peak schedules `minimum_budget` remembers (most recently used last)
CACHED_GRAPHS = 8
_MIN_PEAK: RecentMemo[Graph, MinimumBudget] = RecentMemo(CACHED_GRAPHS)


@dataclass(frozen=True)
class MinimumBudget:
    """The smallest budget found feasible: `schedule` simulates to `peak_bytes`.  `optimal`: proven the
    minimum over Checkmate's schedule class (capture order of first computations); a schedule in
    another order can still need less."""

    peak_bytes: int
    schedule: Schedule
    optimal: bool
    seconds: float


def minimum_budget(graph: Graph, *, time_limit: float = 10.0, backend: milp.Backend | None = None,
                   deadline: Deadline | None = None) -> MinimumBudget:
    """The stage MILP with the peak as objective (Checkmate Sec. 4 with the budget made a variable),
    seeded with the lowest-peak heuristic schedule; always returns a feasible schedule, without the
    recomputations its peak does not need (`_prune`: the peak objective has no time term)."""
    t0 = time.monotonic()
    time_limit = Deadline.of(time_limit, deadline).at - t0
    st = _stages(graph)
    known = [p for p in (_plan(graph, eager_schedule(graph), "eager"),) if p is not None] + _remembered(graph)
    known += _checkpoint_plans(graph, st, -1, t0 + 0.2 * time_limit)  # budget -1: only the extremes
    best, optimal = _min_peak_milp(graph, st, min(known, key=lambda p: p.peak), t0, time_limit, backend)
    best = _prune(graph, best, best.peak, _prune_deadline(t0 + time_limit, time_limit))
    return _remember(graph, MinimumBudget(best.peak, best.schedule, optimal, time.monotonic() - t0))


def _min_peak_milp(graph: Graph, st: _Stages, best: _Plan, t0: float, time_limit: float,
                   backend: milp.Backend | None) -> tuple[_Plan, bool]:
    """The min-peak MILP's schedule from MIP start `best` (or `best` itself, when the MILP is not
    built by `t0 + time_limit / 2` or finds nothing lower), and whether its peak is proven minimal."""
    unit = max(best.peak - st.base, 1)
    try:
        model, V = _build(st, graph, unit, t0 + 0.5 * time_limit, minimize_peak=True)
    except _Timeout:
        return best, False
    start = None
    stages = _stage_sets(st, [s.node for s in best.schedule if s.op == "compute"])
    if stages is not None:
        start = _start_values(st, graph, model, V, stages)
        start[0] = max(start[u] + graph.computes[st.order[k]].temp_bytes / unit * start[V.R[t][k]]
                       for t in range(st.n) for k, u in enumerate(V.U[t]))  # Z is variable 0
    sol = milp.solve(model, time_limit=max(time_limit - (time.monotonic() - t0), 0.05), start=start,
                     backend=backend, nodes=MILP_NODES, checks=MILP_CHECKS,
                     where="checkmate: min-peak MILP")
    if sol.x is None:
        return best, False
    seq = [st.order[j] for t in range(st.n) for j in range(t + 1) if sol.x[V.R[t][j]] > 0.5]
    plan = _plan(graph, with_early_frees(graph, seq), "milp-min-peak")
    if plan is None or plan.peak > best.peak:
        return best, False
    # the simulated peak of the rounded solution, not the solver's float, is what we report
    return plan, sol.status == "optimal" and plan.peak <= math.ceil(st.base + sol.objective * unit) + 1


def _remember(graph: Graph, found: MinimumBudget) -> MinimumBudget:
    """`found`, remembered for `graph` unless an earlier call found a lower peak (then that one)."""
    earlier = _MIN_PEAK.get(graph)
    best = found if earlier is None or found.peak_bytes < earlier.peak_bytes else earlier
    _MIN_PEAK.put(graph, best)
    return best


def known_minimum(graph: Graph) -> MinimumBudget | None:
    """The lowest-peak schedule an earlier call found for `graph`, without solving anything."""
    return _MIN_PEAK.get(graph)


def _remembered(graph: Graph) -> list[_Plan]:
    """The lowest-peak schedule an earlier `minimum_budget` call found for `graph` (none: empty)."""
    earlier = _MIN_PEAK.get(graph)
    plan = None if earlier is None else _plan(graph, earlier.schedule, "min-peak (earlier call)")
    return [] if plan is None else [plan]


# --- public entry points --------------------------------------------------------------------------
#: the part of the time left that Checkmate gives Rockmate and Rotor for its MIP starts
HIERARCHY_SHARE = 0.6
#: the work limit of one Checkmate MILP, the same on any machine (issue 18 item 4; the time limit is
#: the safety cap): branch-and-bound nodes, and HiGHS's interrupt checks, which also bound the root
#: node (a 52-op ResNet's 7.5k-variable MILP took 184 checks, 21 s on a quiet 2-core machine, to prove
#: optimality; 100 checks took 15 s there, 48 s at three times the load, stopping at the same point)
MILP_NODES = 2000
MILP_CHECKS = 100


def _hierarchy_plans(graph: Graph, budget: int, time_limit: float, end: float) -> list[_Plan]:
    """Rockmate's and Rotor's schedules at `budget` (Rockmate Sec. 3-4), each also with its frees moved
    as early as possible (`with_early_frees`: the form the MILP's start values describe).  Where one
    cannot fit `budget`, its schedule at the smallest budget it reports instead (a schedule behind the
    minimum an `InfeasibleBudget` of ours may name).  Both share `HIERARCHY_SHARE` of the time left
    before `end` (Rotor's DP is Rockmate's store-all DP, kept from it); Rockmate's MILP time is the one
    of a plain rockmate plan at the caller's `time_limit`, so both share the block menus `rockmate.solve`
    caches, when the time left lets them finish."""
    from solvers import rockmate, rotor  # rockmate -> block_milp -> milp: no cycle, but only used here

    until = Deadline(end).part(HIERARCHY_SHARE)
    plans: list[_Plan] = []
    rock = functools.partial(rockmate.solve, milp_seconds=rockmate.milp_time(time_limit))
    for name, solver in (("rockmate", rock), ("rotor", rotor.solve)):
        try:
            try:
                result = solver(graph, budget, time_limit=time_limit, deadline=until)
            except OutOfTime:
                continue
            except InfeasibleBudget as exc:
                if exc.minimum_bytes is None:
                    continue
                result = solver(graph, exc.minimum_bytes, time_limit=time_limit, deadline=until)
        except InfeasibleBudget:  # the solver could not reach its own minimum (or ran out of time)
            continue
        except GraphError:  # not a chain of blocks: no hierarchy plans
            break
        seq = [s.node for s in result.schedule if s.op == "compute"]
        plans += [p for p in (_plan(graph, with_early_frees(graph, seq), name),
                              _plan(graph, result.schedule, name)) if p is not None]
    return plans


def _warm_start(graph: Graph, plans: Sequence[_Plan]) -> tuple[_Stages, _Plan | None, list[list[int]] | None]:
    """The stage order of the MILP and its MIP start: the fastest of `plans` that lies in Checkmate's
    class for the order of its own first computations (recomputations ascending, at most once per
    stage), with that order; otherwise capture order and no start."""
    for p in sorted(plans, key=lambda p: p.time):
        seq = [s.node for s in p.schedule if s.op == "compute"]
        order = _first_order(graph, seq)
        if order is None:
            continue
        st = _stages(graph, order)
        stages = _stage_sets(st, seq)
        if stages is not None:
            return st, p, stages
    return _stages(graph), None, None


def solve(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0, relax: bool = False,
          incumbent: Schedule | None = None, backend: milp.Backend | None = None,
          hierarchy: bool = True, deadline: Deadline | None = None) -> SolveResult:
    """Minimum total compute time schedule within `budget_bytes` (Checkmate's MILP, Sec. 4).

    The MILP is warm-started (MIP start) from the fastest schedule known that fits: the eager order,
    `incumbent` (a schedule the caller already has), with `hierarchy` Rockmate's and Rotor's plans at
    this budget, and the two-phase LP rounding's (`solve_lp`, given 70% of the time then left).  Its
    stages follow the first-computation order of that start (Checkmate fixes one topological order,
    Sec. 4.3), so the start lies in the MILP's class and the MILP's bound is a bound for it.  The
    fastest known schedule is returned when the MILP does not beat it, with the gap against the
    MILP's bound.  `relax=True` runs the two-phase LP rounding instead (`solve_lp`).  `backend`:
    "highs" (default when highspy imports) or "cbc".  Raises `InfeasibleBudget` when no schedule is
    known to fit.
    """
    if relax:
        return solve_lp(graph, budget_bytes, time_limit=time_limit, deadline=deadline)
    t0 = time.monotonic()
    end = Deadline.of(time_limit, deadline).at
    time_limit = end - t0
    lb_time = sum(graph.computes[c].time for c in graph.required_computes)
    known: list[_Plan] = [p for p in (_plan(graph, eager_schedule(graph), "eager"),) if p is not None]
    known += _remembered(graph)
    if incumbent is not None:
        p = _plan(graph, tuple(incumbent), "incumbent")
        if p is None:
            why = next(iter(simulate(graph, incumbent).issues), "it frees a required output")
            raise ValueError(f"the incumbent schedule is invalid ({why}): pass one that simulates cleanly")
        known.append(p)

    def fastest() -> _Plan | None:
        return min((p for p in known if p.peak <= budget_bytes), key=lambda p: p.time, default=None)

    best = fastest()
    if hierarchy and (best is None or best.time > lb_time * (1 + 1e-12)):
        known += _hierarchy_plans(graph, budget_bytes, time_limit, end)
        best = fastest()
    if budget_bytes < _lower_bound_bytes(graph, _stages(graph)):
        raise _infeasible(budget_bytes, known, "checkmate", graph, _spare(end, time_limit))
    if best is None or best.time > lb_time * (1 + 1e-12):
        # the LP rounding (Sec. 5) and checkpointing plans: more starts, in 70% of the time left
        try:
            lp = solve_lp(graph, budget_bytes, time_limit=0.7 * (end - time.monotonic()))
            known += [p for p in (_plan(graph, lp.schedule, f"checkmate-lp {lp.stats.extra['source']}"),)
                      if p is not None]
        except InfeasibleBudget:  # its smallest schedule is remembered for `_infeasible`
            pass
        best = fastest()
    if best is not None and best.timeline.recomputes:
        # without the recomputations this budget does not need: the answer and the MIP start improve
        # (below the hierarchy's minimum the fastest known plan is the min-peak schedule, quadratic)
        known.append(_prune_fastest(graph, known, budget_bytes, _prune_deadline(end, time_limit, 0.3)))
        best = fastest()
    st, seed, seed_stages = _warm_start(graph, [p for p in known if p.peak <= budget_bytes])
    extra: dict[str, object] = {
        "stages": st.n, "warm_start_from": None if seed is None else seed.source,
        "optimal_within": f"first computations in the order of {'capture' if seed is None else seed.source}"}

    def incumbent_result(why: str, bound: float | None) -> SolveResult:
        nonlocal best
        if best is None:
            best = _min_peak_plan(graph, budget_bytes, known, _spare(end, time_limit))
            if best is not None:
                best = _prune(graph, best, budget_bytes, _prune_deadline(end, time_limit))
        if best is None:
            raise _refusal(budget_bytes, known, "checkmate", graph, end)
        # a MILP bound above the fastest plan: that plan lies outside the MILP's stage class
        bound = lb_time if bound is None or bound > best.time else max(bound, lb_time)
        gap = max(0.0, best.time - bound) / best.time if best.time > 0 else 0.0
        status = "optimal" if gap <= 1e-9 else "feasible"
        extra.update(stopped=why, incumbent=best.source)
        return SolveResult(best.schedule, SolverStats(
            "checkmate", status, time.monotonic() - t0, objective=best.time, bound=bound, gap=gap,
            backend=extra.get("backend", ""), extra=extra))  # type: ignore[arg-type]

    if best is not None and best.time <= lb_time * (1 + 1e-12):
        return incumbent_result("incumbent computes every node once", None)
    cap = budget_bytes - st.base
    tscale = lb_time or 1.0
    shrink = 0.0
    for _attempt in range(3):
        now = time.monotonic()
        try:
            model, V = _build(st, graph, max(cap - shrink, 0.5), now + 0.6 * (end - now))
        except _Timeout:
            return incumbent_result("time limit while building the MILP", None)
        extra.update(variables=model.num_vars, constraints=model.num_rows, nonzeros=len(model.row_index),
                     build_seconds=round(time.monotonic() - now, 3))
        if timed_out(end - 0.1 * time_limit, "checkmate: MILP not solved"):
            return incumbent_result("time limit: too little left after building the MILP", None)
        start = None
        if seed_stages is not None:
            start = _start_values(st, graph, model, V, seed_stages)
            if model.num_vars < 5_000 and model.violation(start) > 1e-6:
                start = None  # a bug here must not poison the search; the MILP still runs
        extra["warm_start"] = start is not None
        sol = milp.solve(model, time_limit=max(end - time.monotonic(), 0.05), start=start,
                         backend=backend, nodes=MILP_NODES, checks=MILP_CHECKS, where="checkmate: MILP")
        extra["backend"] = sol.backend
        bound = sol.bound * tscale if sol.bound is not None else None
        if sol.status == "infeasible":
            if best is not None:  # numerically infeasible at a budget some known schedule fits
                return incumbent_result("MILP reported infeasible", None)
            raise _infeasible(budget_bytes, known, "checkmate", graph, _spare(end, time_limit))
        if sol.x is None:
            return incumbent_result("time limit before the MILP found a solution", bound)
        seq = [st.order[j] for t in range(st.n) for j in range(t + 1) if sol.x[V.R[t][j]] > 0.5]
        plan = _plan(graph, with_early_frees(graph, seq), "milp")
        if plan is None:
            raise AssertionError("checkmate produced an invalid schedule: a model bug")
        if plan.peak > budget_bytes:
            # tolerance of the MIP solver on a budget-tight solution: solve again a few bytes lower
            shrink += plan.peak - budget_bytes + 1
            continue
        if sol.status != "optimal":  # an incumbent cut short may recompute what the budget does not need
            plan = _prune(graph, plan, budget_bytes, _prune_deadline(end, time_limit))
        if best is not None and best.time < plan.time - 1e-12:
            return incumbent_result(f"MILP ({sol.status}) no better than the incumbent", bound)
        if sol.status == "optimal":
            status, gap = "optimal", 0.0
            bound = plan.time
        else:
            status = "feasible"
            bound = lb_time if bound is None else max(bound, lb_time)
            gap = max(0.0, plan.time - bound) / plan.time if plan.time > 0 else 0.0
        extra.update(incumbent=None if best is None else best.source, recomputes=plan.timeline.recomputes)
        return SolveResult(plan.schedule, SolverStats(
            "checkmate", status, time.monotonic() - t0, objective=plan.time, bound=bound, gap=gap,
            backend=sol.backend, extra=extra))
    return incumbent_result("MILP solutions exceeded the budget by solver tolerance", None)


def _rounded_plans(graph: Graph, st: _Stages, values: list[dict[int, float]], budget: int, deadline: float,
                   source: str, rng: random.Random, samples: int) -> list[_Plan]:
    """Two-phase rounding of an LP solution `values` (S* per stage, Checkmate Sec. 5): round S, then the
    cheapest R for that S (the dependency closure, `_closure_sequence`), frees as early as possible.

    Deterministic rounding keeps d into stage t iff S*[t,d] >= theta, for the paper's theta = 0.5 and
    higher thresholds up to 0.99 (keep less).  When the theta = 0.5 rounding does not fit, it is
    repaired: forward activations it holds across the forward are dropped until their first backward
    reader (as in checkpointing, `_drop_plans`), lowest LP value first, the fewest that fit.  Then up
    to `samples` randomized roundings (keep with probability S*) while time is left."""
    plans: list[_Plan] = []

    def evaluate(keep: list[set[int]], label: str) -> _Plan | None:
        try:
            seq = _closure_sequence(st, keep, deadline)
        except _Timeout:
            return None
        p = _plan(graph, with_early_frees(graph, seq), f"{source} {label}")
        if p is not None:
            plans.append(p)
        return p

    def rounded(rule: Callable[[float], bool]) -> list[set[int]]:
        return [{d for d, v in values[t].items() if rule(v)} for t in range(st.n)]

    if timed_out(deadline - _step_seconds(graph), "checkmate: LP rounding"):
        return plans
    half = rounded(lambda v: v >= 0.5)
    p = evaluate(half, "theta=0.5")
    if p is None or p.peak > budget:
        score: dict[int, float] = {}
        for d in _forward_data(graph, st):
            held = [values[t].get(d, 0.0) for t in range(st.prod[d] + 1, st.n) if d in half[t]]
            if held:
                score[d] = sum(held) / len(held)
        candidates = sorted(score, key=lambda d: (score[d], graph.computes[st.order[st.prod[d]]].time
                                                  / max(graph.datas[d].bytes, 1)))
        plans += _drop_plans(graph, st, half, candidates, budget, deadline, f"{source} theta=0.5 repaired")
    for theta in (0.6, 0.7, 0.8, 0.9, 0.95, 0.99):
        if timed_out(deadline - _step_seconds(graph), "checkmate: LP rounding"):
            return plans
        evaluate(rounded(lambda v, th=theta: v >= th), f"theta={theta}")
    for _ in range(samples):
        if timed_out(deadline - _step_seconds(graph), "checkmate: LP rounding"):
            break
        evaluate(rounded(lambda v: rng.random() < v), "random")
    return plans


def solve_lp(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0,
             scales: Sequence[float] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
             samples: int = 8, seed: int = 0, deadline: Deadline | None = None) -> SolveResult:
    """Two-phase LP rounding (Checkmate Sec. 5), returning within about `time_limit` seconds.

    First the checkpointing heuristic (`_checkpoint_plans`, a binary search over how many forward
    activations to drop), so the answer is never worse than it.  Then, for each budget scale while
    time is left: solve the LP relaxation of the stage MILP at the scaled budget, with recomputation
    restricted to forward nodes (a smaller LP, solved about 40% faster on a captured ResNet; the
    closure may still recompute anything), and round it (`_rounded_plans`).  Rounding at the full
    budget may not fit, hence the scales.  The cheapest schedule that fits wins.  When the LP of a
    large graph cannot be built or solved in the time left, the checkpointing plan is the answer
    (`extra["stopped"]` says so)."""
    t0 = time.monotonic()
    end = Deadline.of(time_limit, deadline).at
    time_limit = end - t0
    st = _stages(graph)
    rng = random.Random(seed)
    known: list[_Plan] = [p for p in (_plan(graph, eager_schedule(graph), "eager"),) if p is not None]
    known += _remembered(graph)
    lb_time = sum(graph.computes[c].time for c in st.order)
    extra: dict[str, object] = {"stages": st.n, "lp_solves": 0}

    def fastest() -> _Plan | None:
        return min((p for p in known if p.peak <= budget_bytes), key=lambda p: p.time, default=None)

    if budget_bytes < _lower_bound_bytes(graph, st):
        known += _checkpoint_plans(graph, st, budget_bytes, t0 + 0.25 * time_limit)
        raise _infeasible(budget_bytes, known, "checkmate-lp", graph, _spare(end, time_limit))
    bound = None
    backend = ""
    best = fastest()
    if best is None or best.time > lb_time * (1 + 1e-12):
        # O(log n) simulations, never cut short before the deadline: the LP gets what is left
        known += _checkpoint_plans(graph, st, budget_bytes, end)
        extra["stopped"] = "all budget scales rounded"
        for scale in scales:
            now = time.monotonic()
            if timed_out(end - 0.15 * time_limit, "checkmate-lp: LP scales", now):
                extra["stopped"] = "time limit"
                break
            try:
                model, V = _build(st, graph, max((budget_bytes - st.base) * scale, 0.5),
                                  now + 0.4 * (end - now), forward_only=True)
            except _Timeout:
                extra["stopped"] = "time limit while building the LP"
                break
            # keep a tenth of the limit for rounding this LP's solution
            sol = milp.solve(model, time_limit=end - time.monotonic() - 0.1 * time_limit, relax=True,
                             where="checkmate-lp: LP")
            backend = sol.backend
            if sol.x is None:
                extra["stopped"] = "time limit while solving the LP" if sol.status != "infeasible" else \
                    f"LP infeasible at budget scale {scale}"
                break
            extra["lp_solves"] = int(extra["lp_solves"]) + 1  # type: ignore[call-overload]
            if scale == 1.0 and sol.status == "optimal":
                # the LP optimum at the real budget bounds the schedules of the LP's class
                bound = sol.objective * (lb_time or 1.0)
                extra["bound_within"] = "forward recomputations only, first computations in capture order"
            values = [{d: sol.x[v] for d, v in V.S[t].items()} for t in range(st.n)]
            known += _rounded_plans(graph, st, values, budget_bytes, end, f"lp@{scale}", rng, samples)
            best = fastest()
            if best is not None and best.time <= lb_time * (1 + 1e-12):
                break
    best = _prune_fastest(graph, known, budget_bytes, _prune_deadline(end, time_limit))
    if best is None:
        best = _min_peak_plan(graph, budget_bytes, known, _spare(end, time_limit))
        if best is not None:
            best = _prune(graph, best, budget_bytes, _prune_deadline(end, time_limit))
    if best is None:
        raise _refusal(budget_bytes, known, "checkmate-lp", graph, end)
    gap = max(0.0, best.time - bound) / best.time if bound is not None and best.time > 0 else None
    extra.update(source=best.source, roundings=sum(p.source.startswith("lp@") for p in known))
    return SolveResult(best.schedule, SolverStats(
        "checkmate-lp", "heuristic", time.monotonic() - t0, objective=best.time, bound=bound, gap=gap,
        backend=backend, extra=extra))
