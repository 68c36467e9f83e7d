"""Peak-minimising operator reordering (OLLA, Steiner et al. 2022, Sec. 3.1-3.2 and 4.1), exact.

The problem: choose a topological order of the compute nodes; the schedule is the eager schedule of
that order (`solvers.eager_schedule`: every tensor freed right after its last reader), and the cost
is its simulated peak.  Under that schedule the memory resident while the op at position ``t`` runs is

    persistent sources + sum(bytes(d) : pos(producer(d)) <= t <= last(d)) + workspace(op at t)

where ``last(d)`` is the position of the last reader of ``d`` (the end of the schedule for required
outputs, the producer's own position for a tensor nobody reads).  This is exactly what
`solvers.simulate` measures for the eager schedule.

Model (CP-SAT).  One timestep per op: OLLA compresses timesteps to shrink its ILP and so loses
optimality (DESIGN.md: 19% worse than eager on a branchy graph); we do not.  Each compute node gets a
position variable in its ASAP/ALAP window (Sec. 4.1, eq. 10-12, tightened: a node needs all its
ancestors before it and all its descendants after it), positions are all different, and each edge
keeps its producer at least ``1 + |nodes strictly between them|`` steps earlier (precedence
pruning).  Each tensor is an interval [pos(producer), last(d) + 1) with demand bytes(d), each
workspace a unit interval; one cumulative constraint with a variable capacity bounds them all and the
capacity is minimised.  The search is warm-started (AddHint) from the best of the eager order and
memory-aware list schedules; its incumbent is never worse than the eager order, and the result says
whether optimality was proved or gives the gap to the best lower bound known.  The search stops within
a relative gap of 1e-4 by default (Gurobi's default MIPGap, the solver of OLLA Sec. 5.1).

Weight updates (Sec. 4.3): captured training graphs keep parameter gradients as required outputs;
`free_updated_gradients` gives the paper's graph, where a gradient dies after its update, so the
order can interleave the updates with the backward pass (a plan-only what-if: `memviz.export` leaves
the step to the user's optimizer).

Decomposition: above `EXACT_MAX_NODES` compute nodes the one-shot model does not even load within a
few seconds, so the same model is solved on a window of consecutive positions of the incumbent
around its peak, everything outside fixed (a large-neighbourhood search), until the time is up or
no window around the peak improves it.  Optimality is then not proved: the status is "feasible"
with the gap to `lower_bound`.

The best order found is remembered for the last `CACHED_GRAPHS` graphs and is a candidate of every
later call on the same graph, so a time-limited search never answers worse than an earlier call did
(the peak an `InfeasibleBudget` named stays reachable when the caller asks for it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from solvers.deadline import Deadline, limit_cp_sat, note_cp_sat_cut, timed_out
from solvers.ir import DataKind, Graph, Phase
from solvers.memo import RecentMemo
from solvers.result import SolveResult, SolverStats
from solvers.schedule import eager_schedule
from solvers.simulate import simulate


def free_updated_gradients(graph: Graph) -> Graph:
    """The same graph with every parameter gradient that a weight update reads no longer a required
    output, so a schedule may free it right after its update (OLLA Sec. 4.3: "Running a weight update
    operation enables the freeing of the corresponding gradient tensor").

    memviz's captured training graphs keep parameter gradients alive to the end even when the
    optimizer step is modelled, because `memviz.export` returns them to the user's own optimizer.  This
    view is the graph OLLA optimises (its graphs contain the updates and free each gradient after it):
    a plan over it is a what-if that `memviz.export` does not execute.  Gradients nothing updates stay
    required; a graph without optimizer nodes is returned unchanged.
    """
    updated = {
        d
        for c in graph.computes
        if c.phase is Phase.OPTIMIZER
        for d in c.inputs
        if graph.datas[d].kind is DataKind.PARAMETER_GRADIENT and graph.datas[d].producer is not None
    }
    if not updated:
        return graph
    outputs = tuple(d for d in graph.outputs if d not in updated)
    return Graph(graph.computes, graph.datas, outputs, name=graph.name,
                 meta={**graph.meta, "gradients_freed_after_update": len(updated)})


@dataclass(frozen=True)
class _Lifetimes:
    """The parts of a graph that decide the eager peak of an order (see the module docstring)."""

    n: int
    persistent: int
    temp: tuple[int, ...]
    #: non-source tensors with bytes > 0: (bytes, producer, readers, kept until the end)
    tensors: tuple[tuple[int, int, tuple[int, ...], bool], ...]


def _lifetimes(graph: Graph) -> _Lifetimes:
    keep = set(graph.outputs)
    tensors = tuple(
        (d.bytes, d.producer, graph.consumers(d.id), d.id in keep)
        for d in graph.datas
        if d.producer is not None and d.bytes > 0
    )
    return _Lifetimes(
        n=len(graph.computes),
        persistent=graph.persistent_bytes(),
        temp=tuple(c.temp_bytes for c in graph.computes),
        tensors=tensors,
    )


def order_peak(graph: Graph, order: Sequence[int], lt: _Lifetimes | None = None) -> int:
    """Peak of `eager_schedule(graph, order)` in O(nodes + edges); equal to `simulate(...).peak_bytes`
    (tested), used to rank candidate orders quickly."""
    lt = lt or _lifetimes(graph)
    pos = [0] * lt.n
    for i, c in enumerate(order):
        pos[c] = i
    delta = [0] * (lt.n + 1)
    for size, prod, readers, kept in lt.tensors:
        start = pos[prod]
        end = lt.n - 1 if kept else max((pos[r] for r in readers), default=start)
        delta[start] += size
        delta[end + 1] -= size
    peak = live = 0
    for t, c in enumerate(order):
        live += delta[t]
        peak = max(peak, live + lt.temp[c])
    return lt.persistent + peak


def list_schedule(graph: Graph, key: Callable[[int, int, int], tuple]) -> list[int]:
    """Memory-aware list scheduling: repeatedly run the ready node that minimises
    ``key(step_bytes, delta_bytes, node)``, where step_bytes is the memory while it runs and
    delta_bytes the change of live memory once it has run and its dead inputs are freed."""
    keep = set(graph.outputs)
    n = len(graph.computes)
    remaining = [len(graph.consumers(d.id)) for d in graph.datas]
    indeg = [len(graph.predecessors(c)) for c in range(n)]
    ready = {c for c in range(n) if indeg[c] == 0}
    live = 0
    order: list[int] = []

    def freed_by(c: int) -> int:
        comp = graph.computes[c]
        gone = sum(
            graph.datas[d].bytes
            for d in set(comp.inputs)
            if remaining[d] == 1 and graph.datas[d].producer is not None and d not in keep
        )
        # a tensor nobody reads dies right after its producer
        return gone + sum(
            graph.datas[d].bytes for d in comp.outputs if not graph.consumers(d) and d not in keep
        )

    while ready:
        scored = []
        for c in ready:
            comp = graph.computes[c]
            out = sum(graph.datas[d].bytes for d in comp.outputs)
            scored.append((key(live + out + comp.temp_bytes, out - freed_by(c), c), c))
        _, c = min(scored)
        live += sum(graph.datas[d].bytes for d in graph.computes[c].outputs) - freed_by(c)
        for d in set(graph.computes[c].inputs):
            remaining[d] -= 1
        ready.remove(c)
        order.append(c)
        for s in graph.successors(c):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.add(s)
    return order


#: Priorities tried by the list scheduler: smallest growth first, smallest step first, and growth
#: first with a preference for capture order (keeps the forward pass intact, moves updates early).
_HEURISTIC_KEYS: dict[str, Callable[[int, int, int], tuple]] = {
    "min-delta": lambda step, delta, c: (delta, step, c),
    "min-step": lambda step, delta, c: (step, delta, c),
    "frees-first": lambda step, delta, c: (delta > 0, c),
}


def _ancestor_masks(graph: Graph) -> tuple[list[int], list[int]]:
    """Ancestor and descendant sets of every compute node as bit masks."""
    n = len(graph.computes)
    preds = [graph.predecessors(c) for c in range(n)]
    succs = [graph.successors(c) for c in range(n)]
    indeg = [len(p) for p in preds]
    stack = [c for c in range(n) if indeg[c] == 0]
    topo: list[int] = []
    while stack:
        c = stack.pop()
        topo.append(c)
        for s in succs[c]:
            indeg[s] -= 1
            if indeg[s] == 0:
                stack.append(s)
    anc = [0] * n
    for c in topo:
        for p in preds[c]:
            anc[c] |= anc[p] | (1 << p)
    desc = [0] * n
    for c in reversed(topo):
        for s in succs[c]:
            desc[c] |= desc[s] | (1 << s)
    return anc, desc


def lower_bound(graph: Graph) -> int:
    """A peak no order can beat.  While op ``c`` runs, every tensor produced by ``c`` or one of its
    ancestors and read by ``c`` or one of its descendants (or kept to the end) is necessarily alive,
    plus ``c``'s workspace; and the last op is a sink that runs with every required output alive."""
    persistent = graph.persistent_bytes()
    n = len(graph.computes)
    if n == 0:
        return persistent
    anc, desc = _ancestor_masks(graph)
    keep = set(graph.outputs)
    forced = [graph.computes[c].temp_bytes for c in range(n)]
    for d in graph.datas:
        if d.producer is None or d.bytes == 0:
            continue
        readers = graph.consumers(d.id)
        after = desc[d.producer] | (1 << d.producer)
        if d.id in keep:
            during = after
        elif readers:
            before = 0
            for r in readers:
                before |= anc[r] | (1 << r)
            during = after & before
        else:
            during = 1 << d.producer
        while during:
            low = during & -during
            forced[low.bit_length() - 1] += d.bytes
            during ^= low
    kept = {d for d in keep if graph.datas[d].producer is not None}
    kept_bytes = sum(graph.datas[d].bytes for d in kept)

    def last_op(c: int) -> int:
        comp = graph.computes[c]
        ds = {d for d in (*comp.inputs, *comp.outputs) if graph.datas[d].producer is not None} - kept
        return kept_bytes + sum(graph.datas[d].bytes for d in ds) + comp.temp_bytes

    end = min(last_op(c) for c in range(n) if not graph.successors(c))
    return persistent + max(max(forced), end)


def _cp_sat(
    graph: Graph, lt: _Lifetimes, hint: Sequence[int], upper: int, lower: int, seconds: float,
    relative_gap: float = 0.0,
) -> tuple[list[int] | None, int, str]:
    """Solve the exact one-step-per-op model; returns (order or None, proven bound, status name).
    CP-SAT says OPTIMAL once within `relative_gap`: the bound returned is its proven bound either way.
    `seconds` covers importing OR-Tools and building the model too: CP-SAT gets what is left of it."""
    solve_by = time.monotonic() + seconds
    from ortools.sat.python import cp_model


    n = lt.n
    anc, desc = _ancestor_masks(graph)
    hint_pos = [0] * n
    for i, c in enumerate(hint):
        hint_pos[c] = i
    m = cp_model.CpModel()
    pos = [
        m.NewIntVar(anc[c].bit_count(), n - 1 - desc[c].bit_count(), f"pos{c}") for c in range(n)
    ]
    m.AddAllDifferent(pos)
    for c in range(n):
        for p in graph.predecessors(c):
            between = (desc[p] & anc[c]).bit_count()
            m.Add(pos[c] >= pos[p] + 1 + between)
        m.AddHint(pos[c], hint_pos[c])

    intervals, demands = [], []
    for k, (size, prod, readers, kept) in enumerate(lt.tensors):
        start = pos[prod]
        if kept:
            end, hint_end = n, n
        elif not readers:
            end, hint_end = start + 1, hint_pos[prod] + 1
        elif len(readers) == 1:
            end, hint_end = pos[readers[0]] + 1, hint_pos[readers[0]] + 1
        else:
            lo = max(anc[r].bit_count() for r in readers)
            last = m.NewIntVar(lo, n - 1, f"last{k}")
            m.AddMaxEquality(last, [pos[r] for r in readers])
            hint_end = max(hint_pos[r] for r in readers) + 1
            m.AddHint(last, hint_end - 1)
            end = last + 1
        length = m.NewIntVar(1, n, f"len{k}")
        m.AddHint(length, hint_end - hint_pos[prod])  # a complete hint is accepted as is
        intervals.append(m.NewIntervalVar(start, length, end, f"t{k}"))
        demands.append(size)
    for c in range(n):
        if lt.temp[c] > 0:
            intervals.append(m.NewFixedSizeIntervalVar(pos[c], 1, f"w{c}"))
            demands.append(lt.temp[c])
    capacity = m.NewIntVar(lower - lt.persistent, upper - lt.persistent, "capacity")
    m.AddCumulative(intervals, demands, capacity)
    m.AddHint(capacity, upper - lt.persistent)
    m.Minimize(capacity)

    solver = cp_model.CpSolver()
    limit_cp_sat(solver, solve_by - time.monotonic(), EXACT_WORK)
    solver.parameters.relative_gap_limit = relative_gap
    if n > PROBING_MAX_NODES:
        solver.parameters.cp_model_probing_level = 0
    status = solver.Solve(m)
    note_cp_sat_cut(solver, status in (cp_model.OPTIMAL, cp_model.INFEASIBLE), "olla: reordering CP-SAT")
    name = solver.StatusName(status)
    bound = lower
    if status != cp_model.UNKNOWN:
        bound = math.ceil(solver.BestObjectiveBound() - 1e-6) + lt.persistent
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, max(bound, lower), name
    order = sorted(range(n), key=lambda c: solver.Value(pos[c]))
    return order, max(bound, lower), name


#: Presolve probing (one Boolean per op and position it may take) is kept up to this many compute
#: nodes: it proved a branchy 40-node DAG optimal that the search alone did not close in 10 s, but on
#: the 120-290-op example training graphs it cost 3-5 s of a 10 s limit and made the hint infeasible;
#: without it those graphs were proved optimal in 0.4-3 s (resnet, vit, gpt; see bench_papers.py).
PROBING_MAX_NODES = 64
#: Above this many compute nodes the one-shot model's loading alone overran a 5 s limit on 2 cores
#: (992 nodes: ~9 s before the first branch); larger graphs are improved window by window.
EXACT_MAX_NODES = 800
#: Window (consecutive positions of the incumbent order) re-optimised exactly at a time.
WINDOW = 240
#: CP-SAT's work per exact model / per window, in its deterministic time units (issue 18 item 4: the
#: same order on any machine).  The 591-op GPT and 121-op ResNet of bench_remat solve to optimality
#: in about 0.3 units (5-10 s of wall time on the 2-core CI machine, mostly building the model)
EXACT_WORK = 5.0
WINDOW_WORK = 1.0
#: windows re-optimised at most by one `reorder` on a graph too large for one model
MAX_WINDOWS = 60


def _window_peak(graph: Graph, lt: _Lifetimes, order: Sequence[int]) -> tuple[int, int]:
    """(peak, position of the peak) of the eager schedule of `order`."""
    pos = [0] * lt.n
    for i, c in enumerate(order):
        pos[c] = i
    delta = [0] * (lt.n + 1)
    for size, prod, readers, kept in lt.tensors:
        end = lt.n - 1 if kept else max((pos[r] for r in readers), default=pos[prod])
        delta[pos[prod]] += size
        delta[end + 1] -= size
    best, at, live = -1, 0, 0
    for t, c in enumerate(order):
        live += delta[t]
        if live + lt.temp[c] > best:
            best, at = live + lt.temp[c], t
    return lt.persistent + best, at


def _improve_window(
    graph: Graph, lt: _Lifetimes, order: list[int], a: int, b: int, seconds: float,
    masks: tuple[list[int], list[int]],
) -> list[int] | None:
    """Exactly re-order positions [a, b) of `order`, everything else fixed (a large-neighbourhood
    step): minimise the memory peak inside the window.  Returns the improved order or None.
    `seconds` covers importing OR-Tools and building the model too: CP-SAT gets what is left of it."""
    solve_by = time.monotonic() + seconds
    from ortools.sat.python import cp_model


    anc, desc = masks
    n = lt.n
    base = [0] * n
    for i, c in enumerate(order):
        base[c] = i
    free_nodes = order[a:b]
    fmask = 0
    for c in free_nodes:
        fmask |= 1 << c
    m = cp_model.CpModel()
    var = {
        c: m.NewIntVar(a + (anc[c] & fmask).bit_count(), b - 1 - (desc[c] & fmask).bit_count(), f"p{c}")
        for c in free_nodes
    }
    m.AddAllDifferent(list(var.values()))
    for c in free_nodes:
        m.AddHint(var[c], base[c])
        for p in graph.predecessors(c):
            if p in var:
                m.Add(var[c] >= var[p] + 1 + (desc[p] & anc[c] & fmask).bit_count())

    def at(c: int):
        return var[c] if c in var else base[c]

    intervals, demands = [], []
    for k, (size, prod, readers, kept) in enumerate(lt.tensors):
        if prod not in var and base[prod] >= b:
            continue  # produced after the window
        start = var[prod] if prod in var else max(base[prod], a)
        fixed = [base[r] for r in readers if r not in var]
        moving = [var[r] for r in readers if r in var]
        if kept or (fixed and max(fixed) >= b):
            last = b - 1  # alive past the window
        elif not readers:
            last = start  # dies right after its producer
        elif not moving:
            last = max(fixed)
        else:
            last = m.NewIntVar(a, b - 1, f"last{k}")
            m.AddMaxEquality(last, [*moving, *fixed])
        if isinstance(start, int) and isinstance(last, int):
            if start <= last:
                intervals.append(m.NewFixedSizeIntervalVar(start, last + 1 - start, f"c{k}"))
                demands.append(size)
            continue
        length = m.NewIntVar(0, b - a, f"len{k}")
        intervals.append(m.NewIntervalVar(start, length, last + 1, f"t{k}"))
        demands.append(size)
    for c in free_nodes:
        if lt.temp[c] > 0:
            intervals.append(m.NewFixedSizeIntervalVar(var[c], 1, f"w{c}"))
            demands.append(lt.temp[c])
    capacity = m.NewIntVar(0, sum(demands), "capacity")
    m.AddCumulative(intervals, demands, capacity)
    m.Minimize(capacity)
    solver = cp_model.CpSolver()
    limit_cp_sat(solver, solve_by - time.monotonic(), WINDOW_WORK)
    status = solver.Solve(m)
    note_cp_sat_cut(solver, status in (cp_model.OPTIMAL, cp_model.INFEASIBLE),
                    "olla: reordering window CP-SAT")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    window_order = sorted(free_nodes, key=lambda c: solver.Value(var[c]))
    return [*order[:a], *window_order, *order[b:]]


def _large_neighbourhood(
    graph: Graph, lt: _Lifetimes, order: list[int], deadline: float
) -> list[int]:
    """Repeatedly re-optimise the window around the current peak until no window position around the
    peak improves it, at most `MAX_WINDOWS` windows (decomposition for graphs too large for one
    model); the deadline is a safety cap."""
    masks = _ancestor_masks(graph)
    peak, where = _window_peak(graph, lt, order)
    shifts = (0, WINDOW // 3, -WINDOW // 3)
    stuck = 0
    for _ in range(MAX_WINDOWS):
        if stuck >= len(shifts) or timed_out(deadline - 0.3, "olla: reordering windows"):
            break
        a = min(max(0, where - WINDOW // 2 + shifts[stuck]), max(0, lt.n - WINDOW))
        b = min(lt.n, a + WINDOW)
        left = deadline - time.monotonic() - 0.2
        candidate = _improve_window(graph, lt, order, a, b, left, masks)
        if candidate is not None and graph.is_topological(candidate):
            new_peak, new_where = _window_peak(graph, lt, candidate)
            if new_peak < peak:
                order, peak, where, stuck = candidate, new_peak, new_where, 0
                continue
        stuck += 1
    return order


#: how many graphs' best orders `reorder` remembers (most recently used last)
CACHED_GRAPHS = 8
_BEST_ORDER: RecentMemo[Graph, list[int]] = RecentMemo(CACHED_GRAPHS)


def executor_tail(graph: Graph) -> tuple[int, ...]:
    """The weight updates, in capture order: what an executor that leaves the optimizer step to the
    user's optimizer (`memviz.export`) runs after every other compute, whatever order a plan names.
    Pass it as ``reorder(..., last=...)``; without it the updates may interleave with the backward
    (OLLA Sec. 4.3), a peak only an optimizer fused into the backward reaches."""
    return tuple(c.id for c in graph.computes if c.phase is Phase.OPTIMIZER)


def _head(graph: Graph, last: Sequence[int]) -> Graph:
    """`graph` without the computes `last`, which must be its final compute ids and produce nothing
    (the optimizer nodes `add_optimizer` appends).  What they read stays a required output of the head,
    so every lifetime in the head ends where it ends when `last` runs after it: the head's peak under any
    order is the full schedule's peak before the tail, and the tail's own steps see the same live set
    whatever the head's order."""
    n = len(graph.computes) - len(last)
    if sorted(last) != list(range(n, len(graph.computes))) or any(graph.computes[c].outputs for c in last):
        raise ValueError("reorder: `last` must be the graph's final compute nodes, producing nothing")
    read = {d for c in last for d in graph.computes[c].inputs if graph.datas[d].producer is not None}
    outputs = tuple(dict.fromkeys([*graph.outputs, *sorted(read)]))
    return Graph(graph.computes[:n], graph.datas, outputs, name=graph.name, meta=graph.meta)


def reorder(
    graph: Graph, *, time_limit: float = 10.0, relative_gap: float = 1e-4,
    last: Sequence[int] = (), deadline: Deadline | None = None,
) -> SolveResult:
    """A peak-minimising topological order, returned as its eager schedule (OLLA Sec. 3.1, exact).

    Never worse than the capture (eager) order: the eager order is a candidate and the solver is
    warm-started from the best candidate.  `stats.status` is "optimal" when the peak equals a proven
    bound, else "feasible" with `gap` = (peak - bound) / peak; `stats.extra` holds the eager and
    heuristic peaks.  The returned schedule always passes `solvers.simulate`.  CP-SAT runs
    one worker for `EXACT_WORK` units of deterministic time (the same order on any machine; the time
    limit is a safety cap, recorded by `solvers.deadline.note_cut` when it stops the search).
    `relative_gap`: the search stops once the peak is within this fraction of a proven bound (1e-4 is
    Gurobi's default MIPGap, the solver and setting of OLLA Sec. 5.1; 0 asks for proven optimality);
    the status stays "feasible" unless the gap is exactly 0.
    `last`: computes that run after all the others, in this order (`executor_tail`: the optimizer
    updates an executor leaves to the user's optimizer); the rest is reordered.
    Returns by `time_limit` seconds (or `deadline`, the earlier) plus the final simulation: CP-SAT gets
    what is left minus a reserve sized on one order evaluation of this graph.
    """
    end = Deadline.of(time_limit, deadline)
    if last:
        return _reorder_before(graph, tuple(last), deadline=end, relative_gap=relative_gap)
    started = time.monotonic()
    n = len(graph.computes)
    lt = _lifetimes(graph)
    candidates: dict[str, list[int]] = {"eager": list(range(n))}
    evaluated = time.monotonic()
    peaks = {"eager": order_peak(graph, candidates["eager"], lt)}
    # the eager schedule, the simulator check and (with `last`) the same for the whole graph come after
    # the search: a few order evaluations' worth, kept from its time
    reserve = 0.05 + 4 * (time.monotonic() - evaluated)
    for name, key in _HEURISTIC_KEYS.items():
        if not end.expired("olla: reordering heuristics"):
            candidates[name] = list_schedule(graph, key)
    earlier = _BEST_ORDER.get(graph)
    if earlier is not None:
        candidates["earlier"] = earlier
    peaks.update({name: order_peak(graph, order, lt) for name, order in candidates.items()
                  if name not in peaks})
    best_name = min(peaks, key=peaks.__getitem__)  # dict order: eager wins ties
    best = candidates[best_name]
    bound = lower_bound(graph)
    cp_status = "skipped"
    if peaks[best_name] - bound <= relative_gap * peaks[best_name]:
        pass  # the best candidate is already within the requested gap of the bound
    elif n > EXACT_MAX_NODES:
        order = _large_neighbourhood(graph, lt, best, end.at - reserve)
        peaks["windows"] = order_peak(graph, order, lt)
        cp_status = "windows"
        if peaks["windows"] < peaks[best_name]:
            best_name, best = "windows", order
    elif n > 1 and not timed_out(end.at - reserve - 0.1, "olla: reordering CP-SAT skipped"):
        # keep a little of the limit for the eager schedule and the simulator check afterwards
        left = end.left() - reserve - 0.1
        order, cp_bound, cp_status = _cp_sat(
            graph, lt, best, peaks[best_name], bound, left, relative_gap
        )
        bound = max(bound, cp_bound)
        if order is not None and graph.is_topological(order):
            peaks["cp-sat"] = order_peak(graph, order, lt)
            if peaks["cp-sat"] < peaks[best_name]:
                best_name, best = "cp-sat", order
    schedule = eager_schedule(graph, best)
    peak = simulate(graph, schedule).check().peak_bytes
    _BEST_ORDER.put(graph, best)  # never worse than the remembered order: that was a candidate
    if peak != peaks[best_name]:
        raise AssertionError(f"olla: order evaluation {peaks[best_name]} disagrees with simulate {peak}")
    bound = min(bound, peak)
    gap = (peak - bound) / peak if peak else 0.0
    stats = SolverStats(
        solver="olla",
        status="optimal" if peak == bound else "feasible",
        seconds=time.monotonic() - started,
        objective=float(peak),
        bound=float(bound),
        gap=gap,
        backend="cp-sat",
        extra={
            "eager_peak": peaks["eager"],
            "chosen": best_name,
            "cp_sat_status": cp_status,
            "candidate_peaks": dict(peaks),
        },
    )
    return SolveResult(schedule, stats)


def _reorder_before(graph: Graph, last: tuple[int, ...], *, deadline: Deadline,
                    relative_gap: float) -> SolveResult:
    """`reorder` of everything but `last`, then `last` in its order: the tail's peak does not depend on
    the head's order (`_head`), so the best head order is the best order with that tail."""
    head = reorder(_head(graph, last), time_limit=deadline.left(), deadline=deadline,
                   relative_gap=relative_gap)
    order = [s.node for s in head.schedule if s.op == "compute"] + list(last)
    schedule = eager_schedule(graph, order)
    peak = simulate(graph, schedule).check().peak_bytes
    st = head.stats
    # the tail's steps see the same live set under every head order: a peak they set is optimal
    bound = float(peak) if peak > (st.objective or 0.0) else min(st.bound or 0.0, float(peak))
    gap = (peak - bound) / peak if peak else 0.0
    stats = dataclasses.replace(st, objective=float(peak), bound=bound, gap=gap,
                                status="optimal" if peak == bound else "feasible",
                                extra={**st.extra, "last": len(last)})
    return SolveResult(schedule, stats)
