"""Rotor: the optimal checkpointing dynamic program for heterogeneous chains (Beaumont, Herrmann,
Pallez, Shilova 2019, "Optimal checkpointing for heterogeneous chains"), in the multi-option form of
Rockmate's rk-Rotor (Rockmate Sec. 3.4, Appendix C).

`C(s, t, m)` is the least time to run the forward and backward of blocks s..t when the input a_{s-1}
and the incoming gradient are alive and `m` memory slots are free.  Either block s runs once, with
one of its saving options o (case 1, Appendix C eq. 1), or blocks s..s'-1 run forward keeping only
their outputs, a_{s'-1} is checkpointed, s'..t is solved, and s..s'-1 is solved again (case 2,
eq. 2).  Memory is discretised into slots (every size rounded up, so the plan is conservative); the
slot size depends only on the graph, which makes the cost monotone in the budget.  The block-level
plan is expanded into compute steps over the original graph, frees are placed at each tensor's last
use, and the result is checked by `solvers.simulate`.
"""

from __future__ import annotations

import itertools
import math
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solvers.chain import (
    BlockOption,
    Chain,
    NoSave,
    decompose,
    grad_bytes,
    nosave,
    replay,
    schedule_with_frees,
    store_all,
)
from solvers.deadline import Deadline
from solvers.ir import Graph
from solvers.memo import RecentMemo
from solvers.result import InfeasibleBudget, OutOfTime, SolveResult, SolverStats
from solvers.schedule import Schedule, keep_outputs_alive
from solvers.simulate import Timeline, simulate

#: default number of memory slots spanning the store-everything requirement
SLOTS = 4000

Op = tuple  # ("F0", k, drop_input) | ("F", k, o) | ("B", k, o) | ("free", k)


@dataclass(frozen=True)
class ChainModel:
    """Block-level numbers, in bytes (unit 1) or slots.  Index k is block k; `out[k]` the size of its
    output cut, `gin[k]` of the gradients it receives, `long[k]` of its long-lived backward products;
    `opts[k]` = (fwd time, bwd time, kept, fwd peak, bwd peak) per saving option."""

    unit: int
    out: tuple[int, ...]
    gin: tuple[int, ...]
    long: tuple[int, ...]
    f0_time: tuple[float, ...]
    f0_keep: tuple[int, ...]
    f0_drop: tuple[int, ...]
    opts: tuple[tuple[tuple[float, float, int, int, int], ...], ...]

    @property
    def n(self) -> int:
        return len(self.out)

    def gout(self, k: int) -> int:
        return self.gin[k - 1] if k > 0 else 0

    def e(self, s: int, t: int) -> int:
        """Net memory left by solving s..t: outgoing gradient + long-lived data - incoming gradient."""
        if s > t:
            return 0
        return self.gout(s) + sum(self.long[s:t + 1]) - self.gin[t]


def build_model(chain: Chain, menus: Sequence[Sequence[BlockOption]], ns: Sequence[NoSave]) -> ChainModel:
    blocks = chain.blocks
    size = lambda d: chain.graph.datas[d].bytes  # noqa: E731
    return ChainModel(
        unit=1,
        out=tuple(size(b.output) if b.output is not None else 0 for b in blocks),
        gin=tuple(grad_bytes(chain, b.grad_in) for b in blocks),
        long=tuple(grad_bytes(chain, b.long_lived) for b in blocks),
        f0_time=tuple(x.time for x in ns),
        f0_keep=tuple(x.peak_keep_input for x in ns),
        f0_drop=tuple(x.peak_drop_input for x in ns),
        opts=tuple(tuple((o.fwd_time, o.bwd_time, o.keep, o.fwd_peak, o.bwd_peak) for o in menu)
                   for menu in menus),
    )


def quantize(model: ChainModel, unit: int) -> ChainModel:
    q = lambda x: -((-x) // unit)  # noqa: E731  (ceil, also for negative values)
    return ChainModel(
        unit=unit, out=tuple(map(q, model.out)), gin=tuple(map(q, model.gin)),
        long=tuple(map(q, model.long)), f0_time=model.f0_time, f0_keep=tuple(map(q, model.f0_keep)),
        f0_drop=tuple(map(q, model.f0_drop)),
        opts=tuple(tuple((uf, ub, q(x), q(pf), q(pb)) for uf, ub, x, pf, pb in menu) for menu in model.opts),
    )


def evaluate(model: ChainModel, ops: Sequence[Op]) -> tuple[int, float]:
    """Peak memory (model units, above the resident data) and time of a block-level sequence."""
    usage = peak = 0
    t = 0.0
    kept: dict[int, int] = {}
    for op in ops:
        k = op[1]
        if op[0] == "F0":
            if op[2]:
                peak = max(peak, usage + model.f0_drop[k])
                usage += model.out[k] - model.out[k - 1]
            else:
                peak = max(peak, usage + model.f0_keep[k])
                usage += model.out[k]
            t += model.f0_time[k]
        elif op[0] == "F":
            uf, _, x, pf, _ = model.opts[k][op[2]]
            peak = max(peak, usage + pf)
            usage += x
            kept[k] = x
            t += uf
        elif op[0] == "B":
            _, ub, x, _, pb = model.opts[k][op[2]]
            peak = max(peak, usage + pb)
            usage += model.gout(k) + model.long[k] - kept.pop(k) - model.gin[k]
            t += ub
        elif op[0] == "free":
            usage -= model.out[k]
        else:
            raise ValueError(f"unknown block-level operation {op!r}")
    return peak, t


def _shift(arr: np.ndarray, d: int) -> np.ndarray:
    """out[m] = arr[m - d]; below 0 infeasible, above the table its last (largest-memory) value."""
    n = len(arr)
    out = np.empty_like(arr)
    if d >= 0:
        out[:min(d, n)] = np.inf
        if d < n:
            out[d:] = arr[:n - d]
    else:
        d = -d
        if d < n:
            out[:n - d] = arr[d:]
            out[n - d:] = arr[-1]
        else:
            out[:] = arr[-1]
    return out


@dataclass
class Tables:
    cost: dict[tuple[int, int], np.ndarray]
    choice: dict[tuple[int, int], np.ndarray]
    size: int


def dp(model: ChainModel, size: int, deadline: Deadline | None = None) -> Tables:
    """Fill C(s, t, m) for m in [0, size) (Appendix C, eq. 1-3); raises `OutOfTime` once `deadline`
    passes (the tables are all or nothing).  Case 2 reads C(s', t) shifted by the checkpoint a_{s'-1}
    for every s < s': that shift is made once per (s', t), and the other term is added in place."""
    n = model.n
    long_sum = [0, *itertools.accumulate(model.long)]
    cost: dict[tuple[int, int], np.ndarray] = {}
    after_checkpoint: dict[tuple[int, int], np.ndarray] = {}  # (s', t) -> C(s', t) shifted by out[s'-1]
    choice: dict[tuple[int, int], np.ndarray] = {}
    for length in range(n):
        for s in range(n - length):
            if deadline is not None and deadline.expired("rotor: DP"):
                raise OutOfTime("rotor dynamic program")
            t = s + length
            best = np.full(size, np.inf)
            arg = np.full(size, -1, dtype=np.int32)
            rest_e = model.e(s + 1, t)
            for o, (uf, ub, x, pf, pb) in enumerate(model.opts[s]):
                if s == t:
                    val = np.full(size, uf + ub)
                else:
                    val = uf + ub + _shift(cost[(s + 1, t)], x)
                val[:max(pf, x + rest_e + pb, 0)] = np.inf
                _keep_better(best, arg, val, o)
            sweep_peak = model.f0_keep[s]
            sweep_time = 0.0
            for s2 in range(s + 1, t + 1):
                k = s2 - 1
                sweep_time += model.f0_time[k]
                if k > s:
                    sweep_peak = max(sweep_peak, model.out[k - 1] + model.f0_drop[k])
                val = sweep_time + after_checkpoint[(s2, t)]
                left = model.gout(s2) + long_sum[t + 1] - long_sum[s2] - model.gin[t]  # model.e(s2, t)
                _add_shifted(val, cost[(s, k)], left)
                val[:max(sweep_peak, 0)] = np.inf
                _keep_better(best, arg, val, -2 - s2)
            cost[(s, t)] = best
            choice[(s, t)] = arg
            if s:
                after_checkpoint[(s, t)] = _shift(best, model.out[s - 1])
    return Tables(cost, choice, size)


def _keep_better(best: np.ndarray, arg: np.ndarray, val: np.ndarray, code: int) -> None:
    """Where `val` is strictly lower than `best`: take it, and `code` as the choice (in place)."""
    better = val < best
    np.putmask(best, better, val)
    np.putmask(arg, better, code)


def _add_shifted(val: np.ndarray, arr: np.ndarray, d: int) -> None:
    """`val += _shift(arr, d)` without the shifted copy."""
    n = len(arr)
    if d >= 0:
        val[:min(d, n)] = np.inf
        if d < n:
            val[d:] += arr[:n - d]
    else:
        d = -d
        if d < n:
            val[:n - d] += arr[d:]
            val[n - d:] += arr[-1]
        else:
            val += arr[-1]


def reconstruct(model: ChainModel, tables: Tables, s: int, t: int, mem: int) -> list[Op]:
    ops: list[Op] = []

    def rec(s: int, t: int, mem: int) -> None:
        mem = min(mem, tables.size - 1)
        code = int(tables.choice[(s, t)][mem])
        if code == -1:
            raise AssertionError("reconstructing an infeasible subproblem")
        if code >= 0:
            x = model.opts[s][code][2]
            ops.append(("F", s, code))
            if s < t:
                rec(s + 1, t, mem - x)
            ops.append(("B", s, code))
            return
        s2 = -2 - code
        ops.append(("F0", s, False))
        ops.extend(("F0", k, True) for k in range(s + 1, s2))
        rec(s2, t, mem - model.out[s2 - 1])
        ops.append(("free", s2 - 1))
        rec(s, s2 - 1, mem - model.e(s2, t))

    rec(s, t, mem)
    return ops


def expand(chain: Chain, menus: Sequence[Sequence[BlockOption]], ops: Sequence[Op]) -> list[int]:
    """Block-level operations -> compute sequence over the original graph (then the tail)."""
    seq: list[int] = []
    for op in ops:
        b = chain.blocks[op[1]]
        if op[0] == "F0":
            seq.extend(b.forward)
        elif op[0] == "F":
            seq.extend(menus[op[1]][op[2]].forward)
        elif op[0] == "B":
            seq.extend(menus[op[1]][op[2]].backward)
    seq.extend(chain.tail)
    return seq


def chain_schedule(chain: Chain, menus: Sequence[Sequence[BlockOption]], ops: Sequence[Op]) -> Schedule:
    """The full schedule of a block-level plan: frees at last use, the graph's outputs kept alive once
    computed (the exported module hands them to the caller: `keep_outputs_alive`)."""
    g = chain.graph
    return keep_outputs_alive(g, schedule_with_frees(g, expand(chain, menus, ops)))


def store_all_ops(n: int) -> list[Op]:
    return [("F", k, 0) for k in range(n)] + [("B", k, 0) for k in reversed(range(n))]


def tail_requirement(chain: Chain) -> int:
    """Bytes needed while the tail (optimizer) runs, counting every long-lived product as alive."""
    g = chain.graph
    longs = {d for b in chain.blocks for d in b.long_lived} | set(chain.blocks[0].grad_out)
    counted = longs | {d for c in chain.tail for d in g.computes[c].outputs}
    peak, _, _ = replay(g, chain.tail, counted - set(chain.resident), longs, g.outputs)
    return chain.resident_bytes() + grad_bytes(chain, longs) + max(peak, 0)


def slot_bytes(chain: Chain, ns: Sequence[NoSave], slots: int = SLOTS) -> int:
    """The slot size: the store-all requirement over `slots`.  It depends only on the graph (not on the
    menus or the budget), so rotor, rockmate and sqrt share it and costs are monotone in the budget."""
    exact = build_model(chain, [[store_all(chain, b)] for b in chain.blocks], ns)
    ref, _ = evaluate(exact, store_all_ops(exact.n))
    return max(1, math.ceil(max(ref, 1) / slots))


def quantized_model(chain: Chain, menus: Sequence[Sequence[BlockOption]], slots: int = SLOTS) -> ChainModel:
    """The chain model in slots (`slot_bytes`)."""
    ns = [nosave(chain, b) for b in chain.blocks]
    return quantize(build_model(chain, menus, ns), slot_bytes(chain, ns, slots))


@dataclass(frozen=True)
class ChainPlan:
    ops: tuple[Op, ...]
    model_peak_bytes: int  # resident + model peak (an upper bound on the simulated peak)
    time: float


#: how many chains (graph, menus) keep their lowest-peak plan across calls (`ChainSolver`)
CACHED_CHAINS = 8
_LEAST: RecentMemo[tuple, tuple[ChainPlan, int]] = RecentMemo(CACHED_CHAINS)


class ChainSolver:
    """Quantised model + DP tables for one chain and one option menu per block.

    Every size is rounded up to whole slots, so each data alive at a moment can be overcounted by up
    to one slot: on a long chain the DP's peak sits many slots above the plan's exact one.  The DP is
    therefore used only to propose plans, one per level of its time table (the least memory for that
    time); each is costed again in bytes (`evaluate` on the unrounded model) and simulated over the
    whole graph (`solvers.simulate`, tail included), and the fastest whose simulated peak fits the
    budget is returned.  The block-level model is itself only an upper bound on the simulated peak
    (it counts data alive across whole block operations): a 61-op MLP's least plan peaks 114 KB below
    its model peak, so judging plans by the model refused budgets its own plan fits (issue 17).

    Which proposals a budget considers depends on the model's slots (`_window`), so a plan returned
    at a large budget can peak below every proposal a small budget considers.  The lowest-peak plan
    found for a chain is therefore remembered across calls (`_LEAST`) and offered to every budget it
    fits: the minimum `min_budget` states, and the peak of any plan returned, stay feasible."""

    def __init__(self, chain: Chain, menus: Sequence[Sequence[BlockOption]], *, slots: int = SLOTS,
                 deadline: Deadline | None = None) -> None:
        self.chain = chain
        self.menus = menus
        ns = [nosave(chain, b) for b in chain.blocks]
        self.exact = build_model(chain, menus, ns)
        self.model = quantize(self.exact, slot_bytes(chain, ns, slots))
        self.unit = self.model.unit
        full, _ = evaluate(self.model, self._all_ops())
        # each gradient counted once: one handed down through several blocks is in each one's grad_in
        grads = grad_bytes(chain, {d for b in chain.blocks for d in b.grad_in})
        self.size = max(full, 0) + -(-grads // self.unit) + 2
        self.tables = dp(self.model, self.size, deadline)
        self.base = chain.resident_bytes()
        top = self.tables.cost[(0, self.model.n - 1)]
        finite = np.isfinite(top)
        # first slot count of each time level: the plans of least rounded memory for their time
        self.levels = np.flatnonzero(finite & ~np.concatenate(([False], top[1:] >= top[:-1])))
        if not len(self.levels):
            raise AssertionError("store-all must be feasible in the table")
        # rounding up overcounts each data alive at once by less than a slot: per block its kept data
        # or its output checkpoint, and its long-lived data, plus one gradient and one transient, so a
        # plan proposed at slot count m never peaks below m - slack slots in bytes
        self.slack = 2 * self.model.n + 2
        self._exact: dict[int, tuple[tuple[Op, ...], int, float]] = {}
        self._simulated: dict[int, int] = {}
        # the block-level model's peak, with the tail's, bounds the simulated peak from above
        # (`checked_result` insists): a proposal whose bound fits needs no simulation to be accepted
        self._tail = tail_requirement(chain)
        self._key = (chain.graph, tuple(map(tuple, menus)), slots)

    def _all_ops(self) -> list[Op]:
        ops: list[Op] = []
        for k, menu in enumerate(self.model.opts):
            ops.append(("F", k, min(range(len(menu)), key=lambda o: menu[o][0] + menu[o][1])))
        return ops + [("B", k, o) for _, k, o in reversed(ops)]

    def _proposal(self, m: int) -> tuple[tuple[Op, ...], int, float]:
        """The DP's plan at slot count `m` with its exact peak (bytes, resident data included) and time."""
        if m not in self._exact:
            ops = tuple(reconstruct(self.model, self.tables, 0, self.model.n - 1, m))
            peak, t = evaluate(self.exact, ops)
            self._exact[m] = (ops, self.base + max(peak, 0), t)
        return self._exact[m]

    def _peak(self, m: int) -> int:
        """The simulated peak of the DP's plan at slot count `m`: what that plan really needs."""
        if m not in self._simulated:
            schedule = chain_schedule(self.chain, self.menus, self._proposal(m)[0])
            self._simulated[m] = simulate(self.chain.graph, schedule).peak_bytes
        return self._simulated[m]

    def _window(self, budget: int) -> np.ndarray:
        """Time levels whose plans can fit `budget` exactly, fastest (most slots) first.  The window
        depends on the budget only through its upper end, so a larger budget sees a superset."""
        m = max((budget - self.base) // self.unit, int(self.levels[0]))
        return self.levels[self.levels <= m + self.slack][::-1]

    def _found(self, m: int) -> ChainPlan:
        """The proposal at slot count `m`, remembered when it peaks lower than every plan before."""
        ops, model_peak, t = self._proposal(m)
        plan, peak = ChainPlan(ops, model_peak, t), self._peak(m)
        least = _LEAST.get(self._key)
        _LEAST.put(self._key, (plan, peak) if least is None or peak < least[1] else least)
        return plan

    def min_budget(self, deadline: Deadline | None = None) -> int:
        """The least simulated peak of a plan known for this chain: `plan` succeeds from it up (past
        `deadline`: the least of the proposals simulated so far, an upper bound)."""
        best: tuple[int, int] | None = None
        for m in self._window(0):
            peak = self._peak(int(m))
            if best is None or peak < best[1]:
                best = (int(m), peak)
            if deadline is not None and deadline.expired("rotor: minimum budget search"):
                break
        if best is not None:
            self._found(best[0])
        return _LEAST.get(self._key)[1]

    def plan(self, budget: int, deadline: Deadline | None = None) -> ChainPlan | None:
        """The fastest proposal in the budget's window whose simulated peak fits the budget; else the
        lowest-peak plan known for the chain, when it fits.  Raises `OutOfTime` when `deadline` passes
        before either is found."""
        out_of_time = False
        window = [int(m) for m in self._window(budget)]
        # fastest first.  The fastest proposal whose bound fits is taken without simulating the faster
        # ones whose bound is over (each simulation is a pass over the graph; a frontier asks ~20
        # budgets): those are simulated only when no bound fits, near the minimum
        bounded = next((m for m in window if max(self._proposal(m)[1], self._tail) <= budget), None)
        if bounded is not None:
            return self._found(bounded)
        for m in window:
            if deadline is not None and deadline.expired("rotor: plan search"):
                out_of_time = True
                break
            if self._peak(m) <= budget:
                return self._found(m)
        least = _LEAST.get(self._key)
        if least is not None and least[1] <= budget:
            return least[0]
        if out_of_time:
            raise OutOfTime("rotor plan search", budget)
        return None


def checked_result(chain: Chain, menus: Sequence[Sequence[BlockOption]], plan: ChainPlan, budget: int,
                   solver: str, started: float, extra: dict) -> SolveResult:
    """Expand, simulate, and refuse to return anything the simulator does not accept."""
    g = chain.graph
    schedule = chain_schedule(chain, menus, plan.ops)
    tl = simulate(g, schedule)
    if not tl.valid:
        raise AssertionError(f"{solver} produced an invalid schedule: {tl.issues[:3]}")
    if tl.peak_bytes > budget or tl.peak_bytes > max(plan.model_peak_bytes, tail_requirement(chain)):
        raise AssertionError(
            f"{solver}: simulated peak {tl.peak_bytes} exceeds the budget {budget} or the model's "
            f"bound {plan.model_peak_bytes}")
    return SolveResult(schedule, SolverStats(
        solver=solver, status="heuristic",
        seconds=_time.monotonic() - started, objective=tl.total_time, backend="dp",
        extra={"blocks": len(chain.blocks), "peak_bytes": tl.peak_bytes, "recomputes": tl.recomputes,
               "block_ops": len(plan.ops), **extra}))


#: the chains and DP tables of the last few graphs: neither depends on the budget, so the plans of one
#: graph at several budgets (a frontier, a retry at the minimum, Rockmate's store-all DP) share them
CACHED_GRAPHS = 4
_NO_RECOMPUTE: RecentMemo[Graph, tuple[Schedule, Timeline]] = RecentMemo(CACHED_GRAPHS)


def no_recompute(graph: Graph) -> tuple[Schedule, Timeline]:
    """The capture order with frees at last use: no recomputation, so the least time of any plan.
    Kept for the last `CACHED_GRAPHS` graphs: every solve at every budget asks for it first."""
    found = _NO_RECOMPUTE.get(graph)
    if found is None:
        schedule = schedule_with_frees(graph, list(range(len(graph.computes))))
        found = (schedule, simulate(graph, schedule).check())
    _NO_RECOMPUTE.put(graph, found)
    return found


def no_recompute_result(graph: Graph, budget: int, solver: str, started: float) -> SolveResult | None:
    """The no-recomputation schedule when it fits: optimal in time, and the chain model (rounded to
    slots, long-lived data kept to the end) can be more pessimistic than the real order.  For
    forward-only graphs nothing is saved for a backward, so it is also the chain's least memory."""
    schedule, tl = no_recompute(graph)
    if tl.peak_bytes > budget:
        return None
    return SolveResult(schedule, SolverStats(solver, "heuristic", _time.monotonic() - started,
                                             objective=tl.total_time, backend="no-recompute",
                                             extra={"peak_bytes": tl.peak_bytes, "recomputes": 0}))


def infeasible(graph: Graph, budget: int, chain_minimum: int | None, solver: str) -> InfeasibleBudget:
    floor = no_recompute(graph)[1].peak_bytes
    return InfeasibleBudget(budget, floor if chain_minimum is None else min(floor, chain_minimum), solver)


_CHAINS: RecentMemo[Graph, Chain] = RecentMemo(CACHED_GRAPHS)
_SOLVERS: RecentMemo[Graph, tuple[list[list[BlockOption]], ChainSolver]] = RecentMemo(CACHED_GRAPHS)


def chain_of(graph: Graph) -> Chain:
    """`decompose(graph)`, kept for the last `CACHED_GRAPHS` graphs."""
    chain = _CHAINS.get(graph)
    if chain is None:
        chain = decompose(graph)
    _CHAINS.put(graph, chain)
    return chain


def store_all_solver(graph: Graph, deadline: Deadline) -> tuple[list[list[BlockOption]], ChainSolver, bool]:
    """The store-all menus of `chain_of(graph)` (rotor's: per block "store everything" or "keep only the
    output"), their DP, and whether both were kept from an earlier call.  Raises `OutOfTime` when the DP
    is not done by `deadline`."""
    cached = _SOLVERS.get(graph)
    reused = cached is not None
    if cached is None:
        chain = chain_of(graph)
        menus = [[store_all(chain, b)] for b in chain.blocks]
        cached = (menus, ChainSolver(chain, menus, deadline=deadline))
    _SOLVERS.put(graph, cached)
    return (*cached, reused)


def solve(graph: Graph, budget_bytes: int, *, time_limit: float = 60.0,
          deadline: Deadline | None = None) -> SolveResult:
    """Rotor over the graph's block chain: per block "store everything" or "keep only the output".
    The DP is polynomial (blocks^3 x slots) and independent of the budget: its tables are kept for the
    last `CACHED_GRAPHS` graphs.  Returns within `time_limit` seconds (or by `deadline`, the earlier)
    plus one DP step; raises `OutOfTime` when the DP is not done by then."""
    started = _time.monotonic()
    deadline = Deadline.of(time_limit, deadline)
    quick = no_recompute_result(graph, budget_bytes, "rotor", started)
    if quick is not None:
        return quick
    chain = chain_of(graph)
    if not chain.training:
        raise infeasible(graph, budget_bytes, None, "rotor")
    try:
        menus, solver, reused = store_all_solver(graph, deadline)
        plan = solver.plan(budget_bytes, deadline)
    except OutOfTime as exc:
        raise exc.within(budget_bytes, "rotor") from None
    if plan is None:
        raise infeasible(graph, budget_bytes, solver.min_budget(deadline), "rotor")
    return checked_result(chain, menus, plan, budget_bytes, "rotor", started,
                          {"slot_bytes": solver.unit, "model_time": plan.time, "dp_cached": reused})
