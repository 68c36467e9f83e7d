"""`memviz.plan`: pick a strategy, solve, check every schedule with `solvers.simulate`, package a Plan.

The algorithms live in the torch-free `solvers` package; this module only parses budgets, dispatches,
refuses anything the simulator rejects, and builds the budget frontier the UI slider walks.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memviz.budget import format_bytes, parse_budget
from memviz.hardware.neuron import warn_neuron_checkpointing
from memviz.plans.cdgraph import cdgraph_dict
from memviz.plans.planfile import MIME_TYPE, SCHEMA_ID, checked_runs, gc_paused, read_document, write_document
from solvers import DataKind, Graph, Phase, Timeline, eager_schedule, simulate
from solvers.deadline import Deadline, recording_cuts
from solvers.memo import RecentMemo
from solvers.result import BelowHeldMemory, InfeasibleBudget, OutOfTime, SolveResult, SolverStats
from solvers.schedule import Schedule, Step, keep_outputs_alive, run_turn_once

#: strategy name -> (module, function).  Each is `f(graph, budget_bytes, time_limit=..., deadline=...)
#: -> SolveResult`, returning by the earlier of the two (`solvers.deadline`).
REMAT_STRATEGIES: dict[str, tuple[str, str]] = {
    "checkmate": ("solvers.checkmate", "solve"),
    "checkmate-lp": ("solvers.checkmate", "solve_lp"),
    "rotor": ("solvers.rotor", "solve"),
    "rockmate": ("solvers.rockmate", "solve"),
    "sqrt": ("solvers.sqrt", "solve"),
}
STRATEGIES = ("auto", "none", *REMAT_STRATEGIES, "olla", "autochunk", "sac")
#: Exact Checkmate proves optimality up to a few dozen nodes here (TOOLCHAIN.md); beyond, decompose.
CHECKMATE_MAX_NODES = 60
FRONTIER_POINTS = 20
#: of `plan`'s time limit, the part the solve may use when a frontier or a packing follows it (they share
#: the rest; the rotor DP the frontier walks is usually the solve's own, kept by `solvers.rotor`)
SOLVE_SHARE = 0.6
#: the part of what is left after the solve that the packing may use before the frontier
PACKING_SHARE = 0.3
#: the address packing's safety cap in seconds (`packing_of`, `with_packing`, `plan`): its search is
#: bounded by counted work (`solvers.olla.pack`) and by `PACKING_GAP`; the cap only stops it on a slow
#: machine, and inside `plan` the packing gets at most `PACKING_SHARE` of the time left anyway
PACKING_SECONDS = 10.0
#: the packing's search stops once its peak is within this fraction of the max-live bound (a relative
#: gap tolerance, as a MILP solver's): the export runs the plan through the framework's allocator, not at
#: the packed addresses (`Plan.fits`), so the packing is a layout bound; closing the last 0.064% (64 KB of
#: 101 MB) of a 1k-op GPT's greedy packing took the search 12.6 CPU s (its 10 s cap, under load, did not)
PACKING_GAP = 1e-3
#: the budget frontier's safety cap in seconds (`solve_frontier`): its `FRONTIER_POINTS` solves of one
#: strategy share a DP (`solvers.rotor`), a few seconds at 10k ops; inside `plan` it also ends with
#: `plan`'s own deadline
FRONTIER_SECONDS = 30.0
#: `minimum_budget`'s safety cap in seconds: one solve of the strategy at a 1-byte budget
MINIMUM_SECONDS = 10.0


class PlanningError(ValueError):
    """A plan request memviz cannot satisfy; the message says what to do."""


@dataclass
class Plan:
    """A solved memory plan.  Everything but `profile` round-trips through the plan JSON."""

    graph: Graph
    schedule: Schedule
    timeline: Timeline
    baseline_schedule: Schedule
    baseline: Timeline
    strategy: str
    budget_bytes: int | None
    solver_stats: SolverStats
    model: dict[str, Any]
    device: dict[str, Any]
    packing: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    frontier: list[dict[str, Any]] = field(default_factory=list)
    profile: Any = field(default=None, repr=False, compare=False)
    #: the graph the baseline schedule runs on, when the plan rewrote the model (autochunk); else `graph`
    baseline_graph: Graph | None = None
    #: autochunk: the `memviz.plans.chunking.ChunkPlan` (or its JSON, after loading) regions are checked on
    chunking: Any = field(default=None, repr=False, compare=False)
    #: the solved run behind each `frontier` row, kept in the kernel only (never in the plan JSON) so
    #: the Planner can show a frontier budget's plan without solving it again
    frontier_points: list[FrontierPoint] = field(default_factory=list, repr=False, compare=False)

    @property
    def peak_bytes(self) -> int:
        """The predicted peak: the timeline's, or for a plan made with ``compiled=`` the compiled step's
        (`memviz.plans.compiled`: the timeline less what the compiler's partitioner frees, measured)."""
        compiled = self.solver_stats.extra.get("sac", {}).get("compiled") if self.strategy == "sac" else None
        if isinstance(compiled, dict) and isinstance(compiled.get("peak_bytes"), int):
            return compiled["peak_bytes"]
        return self.timeline.peak_bytes

    @property
    def time_overhead(self) -> float:
        """Predicted step time of the exported plan over eager's (1.0 = no slowdown): the op times, plus
        the per-step and per-operator costs the profile measured (`step_time_ratio`)."""
        if self.strategy == "sac":  # `memviz.apply` runs eager PyTorch, not the exported executor
            from memviz.plans.sac import time_ratio

            return time_ratio(self)
        return step_time_ratio(self.graph, self.timeline.total_time, self.baseline.total_time,
                               self.timeline.recomputes)

    @property
    def time_overhead_range(self) -> tuple[float, float] | None:
        """`time_overhead` at the quartiles of the step pairs the profile measured (`step_time_range`);
        None where nothing measured its spread (an estimated device, a sac plan: `memviz.plans.sac`
        prices its own steps)."""
        if self.strategy == "sac":
            return None
        return step_time_range(self.graph, self.timeline.total_time, self.baseline.total_time,
                               self.timeline.recomputes)

    @property
    def collective_seconds(self) -> float:
        """Predicted seconds of the plan's collectives (a parallel profile's all-gathers, reduce-scatters,
        all-reduces; 0 on one device), part of the step time `time_overhead` compares."""
        from memviz.hardware.collectives import collective_time

        return collective_time(self.graph, self.schedule)

    @property
    def overlapped_seconds(self) -> float:
        """The plan's step time were every collective overlapped with compute
        (`memviz.hardware.collectives.overlapped_time`): a lower bound of the step whose
        `timeline.total_time` runs the collectives in order, without overlap (an upper bound)."""
        from memviz.hardware.collectives import overlapped_time

        return overlapped_time(self.timeline.total_time, self.collective_seconds)

    def to_dict(self) -> dict[str, Any]:
        from memviz import __version__

        return {
            "schema": SCHEMA_ID,
            "memviz_version": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": self.model,
            "device": self.device,
            "strategy": self.strategy,
            "budget_bytes": self.budget_bytes,
            "time_overhead": self.time_overhead,  # the views show this one number, not their own
            "time_overhead_range": None if (spread := self.time_overhead_range) is None else list(spread),
            "graph": {**self.graph.to_dict(), "meta": _json_meta(self.graph.meta)},
            "baseline": {
                **_run_dict(self.baseline_schedule, self.baseline),
                **({} if self.baseline_graph is None else {"graph": self.baseline_graph.to_dict()}),
            },
            "planned": _run_dict(self.schedule, self.timeline),
            "solver_stats": self.solver_stats.to_dict(),
            "packing": self.packing,
            "chunks": self.chunks,
            "frontier": self.frontier,
            "cdgraph": cdgraph_dict(self),
            **({} if self.chunking is None else {"chunking": _chunking_dict(self.chunking)}),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str = "plan document") -> Plan:
        """The plan of document `doc`, validated once (PlanFileError says why not)."""
        runs = checked_runs(doc, source)  # the graphs, schedules and timelines validation built
        graph, schedule, timeline = runs["planned"]
        base_graph, base_schedule, baseline = runs["baseline"]
        return cls(
            graph=graph,
            schedule=schedule,
            timeline=timeline,
            baseline_schedule=base_schedule,
            baseline=baseline,
            baseline_graph=base_graph if "graph" in doc["baseline"] else None,
            chunking=doc.get("chunking"),
            strategy=doc["strategy"],
            budget_bytes=doc["budget_bytes"],
            solver_stats=SolverStats(**doc["solver_stats"]),
            model=doc["model"],
            device=doc["device"],
            packing=doc["packing"],
            chunks=doc["chunks"],
            frontier=doc["frontier"],
        )

    def chunk_plan(self) -> Any:
        """The `memviz.plans.chunking.ChunkPlan` of an autochunk plan (rebuilt from the JSON after loading,
        without its GraphModule: export then captures the model again)."""
        if self.strategy != "autochunk" or self.chunking is None:
            raise PlanningError(
                f"this is a {self.strategy!r} plan; chunk regions belong to plans made with "
                "memviz.plan(profile, budget, strategy='autochunk') on an inference profile"
            )
        if isinstance(self.chunking, dict):
            from memviz.plans.chunking import ChunkPlan

            self.chunking = ChunkPlan.from_dict({**self.chunking, "chunks": self.chunks})
        return self.chunking

    def with_chunks(self, regions: list[dict[str, Any]]) -> Plan:
        """This autochunk plan with user-edited regions (dicts like `chunks`: start, end, chunks and the
        outputs' dims), re-validated (AutoChunk Sec. 3.3: an illegal region raises ValueError naming
        the op that breaks the dimension flow) and re-estimated through `solvers.simulate`.  The
        budget is not enforced on edits: compare `peak_bytes` with `budget_bytes`."""
        cp = self.chunk_plan().with_chunks(regions)
        return chunked_plan(
            cp, self.budget_bytes, self.model, self.device, self.profile, packing=self.packing is not None
        )

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the plan JSON; an existing file is kept unless `overwrite=True`."""
        return write_document(self.to_dict(), path, overwrite=overwrite)

    @property
    def reserved_peak_bytes(self) -> int | None:
        """What PyTorch's caching allocator reserves at most running the schedule (`solvers.allocator`),
        on a device that uses one; None elsewhere, or before packing."""
        allocator = (self.packing or {}).get("allocator")
        return None if allocator is None else int(allocator["reserved_bytes"])

    @property
    def fits(self) -> bool:
        """Whether the plan fits its budget as the export runs it: the allocator's reserved peak where
        the device has a caching allocator (the export does not place tensors at the packed
        addresses), the live bytes elsewhere."""
        reserved = self.reserved_peak_bytes
        held = self.peak_bytes if reserved is None else reserved
        return self.budget_bytes is None or held <= self.budget_bytes

    def summary(self) -> str:
        budget = "no budget" if self.budget_bytes is None else f"budget {format_bytes(self.budget_bytes)}"
        if self.reserved_peak_bytes is not None:
            budget += f", reserved by the allocator {format_bytes(self.reserved_peak_bytes)}"
        if not self.fits:
            budget += " (DOES NOT FIT)"
        gap = "" if self.solver_stats.gap is None else f", gap {self.solver_stats.gap:.1%}"
        return (
            f"memviz plan [{self.strategy}, {self.solver_stats.status}{gap}] {self.model.get('name', '')}: "
            f"peak {format_bytes(self.peak_bytes)} (baseline {format_bytes(self.baseline.peak_bytes)}), "
            f"{budget}, {self._time_text()}, {self.recomputations} recomputations"
            f"{self._comm_note()}{self._time_cut_note()}"
        )

    def _time_text(self) -> str:
        """The step time over eager's, with the spread the profile measured (`time_overhead_range`).

        An eager plan ("none") is the eager step: x1.000 (`memviz.apply` leaves the model as it is, as
        the views' readout says).  Its `time_overhead` is what `memviz.export`'s module would take, which
        printed as the plan's own "x0.850" on a small CPU MLP: the executor's per-step cost (straight-line
        ATen calls) measured under eager autograd's.  It is named as the exported module's, with that
        reason; so is any other ratio below 1 (a plan never runs fewer ops than eager)."""
        ratio, spread = self.time_overhead, self.time_overhead_range
        text = f"x{ratio:.3f}" + ("" if spread is None else f" (x{spread[0]:.3f}-x{spread[1]:.3f} at the "
                                                           "quartiles of the measured steps)")
        planned_s, eager_s = self.timeline.total_time, self.baseline.total_time
        fixed = fixed_costs(self.graph, eager_s)
        why = ""  # said only for a ratio below 1 with a known cause (a sac plan prices its own steps)
        below = ratio < 1 - 5e-4 and self.strategy != "sac"
        if below and fixed["executor_fixed_s"] < fixed["eager_fixed_s"]:
            why = (f": the exported module's per-step cost measured {fixed['executor_fixed_s'] * 1e3:.3g} ms "
                   f"against eager's {fixed['eager_fixed_s'] * 1e3:.3g} ms")
        elif below and planned_s < eager_s:  # the baseline was timed apart from the plan's graph
            why = (f": its op times sum to {planned_s * 1e3:.3g} ms, the eager baseline's to "
                   f"{eager_s * 1e3:.3g} ms")
        if self.strategy == "none":
            return "time x1.000 (eager)" if abs(ratio - 1) < 5e-4 else \
                f"time x1.000 (eager; exported module {text}{why})"
        return f"time {text}{why}"

    @property
    def time_cuts(self) -> list[str]:
        """Where the time limit stopped the planning (`memviz.plan`); empty when the plan is the same on
        any machine (the solvers' own counted work decided it)."""
        return list(self.solver_stats.extra.get("time_cuts", []))

    def _time_cut_note(self) -> str:
        cuts = self.time_cuts
        return f"; stopped by the time limit ({', '.join(cuts)}): may differ between runs" if cuts else ""

    def _comm_note(self) -> str:
        """The collectives' share of the planned step, for plans of a parallel profile."""
        comm = self.collective_seconds
        if not comm:
            return ""
        step = self.timeline.total_time
        return (f", collectives {comm * 1e3:.3g} ms of {step * 1e3:.3g} ms op time (run in order, not "
                f"overlapped; {self.overlapped_seconds * 1e3:.3g} ms if all overlapped compute)")

    @property
    def recomputations(self) -> int:
        """Operators run again: repeated computes of the schedule, or, in a per-rank plan whose graph is a
        recorded step (`memviz.parallel.distributed_sac`), the recomputation's own compute nodes."""
        return self.timeline.recomputes or self.solver_stats.extra.get("sac", {}).get("recomputed_ops", 0)

    def __repr__(self) -> str:
        return f"<{self.summary()}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {MIME_TYPE: self.to_dict(), "text/plain": self.summary()}


@dataclass(frozen=True)
class FrontierPoint:
    """The run behind one frontier row: the cheapest schedule found at or below `budget_bytes`, with
    the statistics of the solver that made it and its timeline from `solvers.simulate` (checked)."""

    budget_bytes: int
    strategy: str
    result: SolveResult
    timeline: Timeline


def frontier_plan(base: Plan, point: FrontierPoint) -> Plan:
    """`base` (same graph, baseline, model and frontier) with a frontier point's run as its plan, named
    after the strategy that solved it.  No packing: that is solved on demand (`with_packing`)."""
    return dataclasses.replace(
        base,
        schedule=point.result.schedule,
        timeline=point.timeline,
        strategy=point.strategy,
        budget_bytes=point.budget_bytes,
        solver_stats=point.result.stats,
        packing=None,
        chunks=[],
        chunking=None,
    )


def with_packing(the_plan: Plan, *, time_limit: float = PACKING_SECONDS) -> Plan:
    """A copy of `the_plan` with its address packing solved (the original is left as it is)."""
    packing = packing_of(the_plan.graph, the_plan.schedule, the_plan.device, time_limit=time_limit)
    return dataclasses.replace(the_plan, packing=packing)


def load_plan(path: str | Path) -> Plan:
    """Load and validate a plan file (schema + re-simulation).  `memviz.export` needs the model too:
    `memviz.export(plan, model=model)`."""
    with gc_paused():
        return Plan.from_dict(read_document(path, validate=False), str(path))  # validated once, by from_dict


def _chunking_dict(chunking: Any) -> dict[str, Any]:
    """What re-validating regions needs: the captured op graph and the calibrated speed model."""
    d = chunking if isinstance(chunking, dict) else chunking.to_dict()
    return {k: d[k] for k in ("graph", "speed", "budget_bytes", "baseline_peak_bytes", "peak_bytes")}


def _run_dict(schedule: Schedule, timeline: Timeline) -> dict[str, Any]:
    return {"schedule": [s.to_json() for s in schedule], "timeline": timeline.to_dict()}


def _finite(value: Any) -> float:
    """A number read from a plan (a loaded one is untrusted): a finite number, else 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    return float(value) if math.isfinite(value) else 0.0


#: the share of the in-step rate's excess (``recompute_scale`` - 1) a recomputed operator adds net
#: (`step_time_ratio`).  A recomputation runs as long as its node's first run in the step (pred30's per-op
#: timers: GPT 2.94 / 3.01 ms), but the backward operators reading its just-written value then run faster
#: (GPT -8 to -10 %, ViT and UNet -4 to -5 %), so the step grew by less than the full rate: measured net,
#: 0.45-0.7 of the excess on bench_export's GPT and ViT (pred30: 1.30-1.39x their op time against
#: 1.44-1.77x charged), 0.64 / 0.86 on its GPT at 25 % (exec24: 1.197 / 1.208 measured, 1.165 at the
#: alone rate, 1.215 at the full rate), least squares 0.55 (median 0.62, single plans 0.06-1.34 and UNet's
#: 9.6: each the difference of two measured ratios) over 12 plans of the real zoo and the examples with
#: 9-20 recomputations (predict38, `benchmarks/check_real_overhead.py`, load 5-11), where the full rate
#: over-predicted the HF encoders' rows by 2-7 points (benchmarks/NOTES_step_time.md)
RECOMPUTE_EXCESS_SHARE = 0.6

#: the least share of the summed op times an eager step may measure for the fixed costs measured with it to
#: count: below it the step is no step but a measurement spoilt by load (`fixed_costs`)
MIN_STEP_SHARE = 0.5


def fixed_costs(graph: Graph, baseline_s: float) -> dict[str, float]:
    """`fixed_costs_of` the graph's metadata."""
    return fixed_costs_of(graph.meta, baseline_s)


def fixed_costs_of(meta: Mapping[str, Any], baseline_s: float) -> dict[str, float]:
    """The per-step costs beyond the op times that the profile measured (``eager_fixed_s``,
    ``executor_fixed_s``, ``executor_op_s``: `memviz.profiling.profile.step_fixed_costs`), 0 where not
    measured, and ``recompute_scale`` (1 where not measured).  One may be below 0: each op timed alone
    took longer than inside the step (a CPU ResNet's
    convolutions, 1.23x), and the step as measured is still the step.  All count 0 when the eager step
    measured under `MIN_STEP_SHARE` of its op times `baseline_s` (a 100-layer GPT profiled under load:
    -6.8 s, which made a plan of +16% in op times read x2.85)."""
    keys = ("eager_fixed_s", "executor_fixed_s", "executor_op_s")
    costs = {key: _finite(meta.get(key)) for key in keys}
    if baseline_s + costs["eager_fixed_s"] < MIN_STEP_SHARE * baseline_s:
        return {**dict.fromkeys(costs, 0.0), "recompute_scale": 1.0}
    return {**costs, "recompute_scale": _finite(meta.get("recompute_scale")) or 1.0}


def step_time_ratio(graph: Graph, planned_s: float, baseline_s: float, recomputations: int = 0) -> float:
    """A schedule's predicted step time over the eager step's: its op times `planned_s` plus what the
    exported module costs per step beyond them, over the baseline's `baseline_s` plus what eager costs
    beyond them (`fixed_costs`, measured on the device at profile time; 0 where nothing was measured: the
    plain ratio of op times).  The exported module's also holds what it adds to each operator it runs,
    once each; each of the schedule's `recomputations` pays that again (``executor_op_s``: on a
    launch-bound GPU an operator costs its launch, not only its kernel time).  Recomputations add their
    measured op times at the rate ops ran inside the exported step's generated code, where a
    recomputation runs (``recompute_scale``, host-timed profiles), less what their readers save
    (`RECOMPUTE_EXCESS_SHARE` of that rate's excess is charged); the fixed costs only scale the ratio,
    so no solver's choice depends on them (solvers compare op times)."""
    return _time_ratio(graph.meta, planned_s, baseline_s, recomputations)


def _time_ratio(meta: Mapping[str, Any], planned_s: float, baseline_s: float, recomputations: int) -> float:
    fixed = fixed_costs_of(meta, baseline_s)
    eager = baseline_s + fixed["eager_fixed_s"]
    # the recomputed op time again at `RECOMPUTE_EXCESS_SHARE` of the in-step rate's excess over the rate
    # timed alone: the recomputation's own cold run less what its just-written value saves its readers.
    # Per op this moves (UNet's 0.33 ms of recomputations netted 0.03 and 0.82 ms in two runs, pred30), and
    # measured whole (pred32, reverted: a probe recomputing half of each block's saved data timed in the
    # profile's pairs, net rates 1.2-1.5) it cut bench_export's recomputing rows' bias (+1.1 -> +0.4
    # points) but not their rms (1.6): the profile's own run-to-run movement (3 points on GPT) dominates
    in_step = RECOMPUTE_EXCESS_SHARE * (fixed["recompute_scale"] - 1.0) * max(0.0, planned_s - baseline_s)
    executor = planned_s + in_step + fixed["executor_fixed_s"] + recomputations * fixed["executor_op_s"]
    return executor / eager if eager > 0 and executor > 0 else 1.0


def step_time_range(graph: Graph, planned_s: float, baseline_s: float,
                    recomputations: int = 0) -> tuple[float, float] | None:
    """`step_time_ratio` at the quartiles of the step pairs the profile measured (`profile._quartile_costs`:
    eager's step and the exported step's ratio to it, each at its lower and upper quartile; the least and
    the most of the four): how much the prediction moves with the steps' own spread on this machine.
    None when the profile measured no pairs (estimated devices, older plans): then nothing says how exact
    the ratio is.  Op times are each the fastest of several runs and not varied here."""
    meta = graph.meta
    keys = ("eager_fixed_s", "executor_fixed_s")
    if not all(isinstance(meta.get(f"{key}_{q}"), (int, float)) for key in keys for q in ("q1", "q3")):
        return None
    corners = []
    for e in ("q1", "q3"):
        for x in ("q1", "q3"):
            at = {**meta, "eager_fixed_s": meta[f"eager_fixed_s_{e}"],
                  "executor_fixed_s": meta[f"executor_fixed_s_{x}"]}
            if f"recompute_scale_{e}" in meta:
                at["recompute_scale"] = meta[f"recompute_scale_{e}"]
            corners.append(_time_ratio(at, planned_s, baseline_s, recomputations))
    return min(corners), max(corners)


def _json_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Graph metadata that is plain JSON (capture may keep richer objects there), the module classes
    (path -> class name, strings only) the views name blocks by, the places a uniform draw decided a
    branch (``drawn``: `memviz.runtime.export.check_no_drawn_layers` refuses a loaded plan by them too), and
    the autocast regions the step was captured in (`accelerator.autocast_json` pairs), which a loaded plan's
    verifying step enters."""
    plain = {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool, type(None)))}
    classes = meta.get("module_classes")
    if isinstance(classes, dict) and classes:
        plain["module_classes"] = {str(k): str(v) for k, v in classes.items()}
    drawn = meta.get("drawn")
    if isinstance(drawn, list) and drawn:
        plain["drawn"] = [str(d) for d in drawn]
    if isinstance(meta.get("autocast"), list):
        plain["autocast"] = [[str(device_type), str(dtype)] for device_type, dtype in meta["autocast"]]
    return plain


# --- solving -------------------------------------------------------------------------------------
def _solver(strategy: str) -> Callable[..., SolveResult]:
    module, func = REMAT_STRATEGIES[strategy]
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise PlanningError(f"strategy {strategy!r} is not available in this build ({exc})") from None


def _eager(graph: Graph, budget: int, deadline: Deadline) -> SolveResult:
    start = time.perf_counter()
    schedule = eager_schedule(graph)
    peak = simulate(graph, schedule).peak_bytes
    if peak > budget:
        raise InfeasibleBudget(budget, peak, "none", proven=True)
    return SolveResult(schedule, SolverStats("none", "heuristic", time.perf_counter() - start))


def _reorder(graph: Graph, budget: int, deadline: Deadline) -> SolveResult:
    from solvers.olla import executor_tail, reorder

    # the exported module leaves the update to the user's optimizer, after the backward returns: an
    # order interleaving updates with the backward would plan a peak no exported step reaches
    result = reorder(graph, time_limit=deadline.left(), deadline=deadline, last=executor_tail(graph))
    peak = simulate(graph, result.schedule).peak_bytes
    if peak > budget:
        raise InfeasibleBudget(budget, peak, "olla", proven=result.stats.status == "optimal")
    return result


def is_training(graph: Graph) -> bool:
    return any(c.phase is Phase.BACKWARD for c in graph.computes)


def auto_candidates(graph: Graph, baseline_peak: int, budget: int) -> list[str]:
    """'auto', in the order tried: no change when the eager order fits; for training graphs exact
    Checkmate when small (it proves optimality there), then the Rockmate hierarchy, then Rotor; for
    inference graphs operator reordering (free of slowdown).  When reordering cannot fit an inference
    profile, `plan` falls back to activation chunking (it rewrites the model, so it needs the profile's
    model, not only its graph: see `can_chunk`)."""
    if baseline_peak <= budget:
        return ["none"]
    if not is_training(graph):
        return ["olla"]
    small = len(graph.computes) <= CHECKMATE_MAX_NODES
    return [*(["checkmate"] if small else []), "rockmate", "rotor"]


def minimum_search(candidates: list[str]) -> list[str]:
    """The candidates for a budget under `Graph.held_bytes`, which no schedule fits: the solve only names
    the smallest budget for the refusal, and no packing or frontier follows it, so it gets the whole
    time limit (`_plan`), Rotor first: its chain DP names a minimum at once, where the others may run out
    of time before naming theirs (Autoformer's auto at 50%, under its AdamW state: Rockmate's cold
    hierarchy took 22 s at load 8, over the 12 s share it had, and Rotor, second, had none left: the
    refusal named no budget).  A lower minimum found after it is still the one the refusal names
    (`_solve_first` raises the lowest)."""
    return sorted(candidates, key=lambda name: name != "rotor")


def solve_checked(
    graph: Graph, strategy: str, budget: int, time_limit: float, deadline: Deadline | None = None
) -> tuple[SolveResult, Timeline]:
    """Run one strategy (by `time_limit` seconds or `deadline`, the earlier) and insist the simulator
    agrees: valid, and within the budget."""
    deadline = Deadline.of(time_limit, deadline)
    if strategy == "none":
        result = _eager(graph, budget, deadline)
    elif strategy == "olla":
        result = _reorder(graph, budget, deadline)
    elif strategy in REMAT_STRATEGIES:
        result = _solver(strategy)(graph, budget, time_limit=deadline.left(), deadline=deadline)
    elif strategy == "autochunk":
        raise PlanningError(
            "strategy 'autochunk' rewrites the model, not a schedule of this graph: call "
            "memviz.plan(profile, budget, strategy='autochunk') with an inference profile"
        )
    else:
        raise PlanningError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    result = SolveResult(as_exported(graph, result.schedule), result.stats)
    timeline = simulate(graph, result.schedule).check()
    if timeline.peak_bytes > budget:
        # keeping the model outputs alive, or the loss's computes moved where the export runs them, can
        # push a solver's schedule over (it fitted before)
        raise InfeasibleBudget(budget, timeline.peak_bytes, strategy, proven=False)
    return result, timeline


def loss_turn(graph: Graph) -> tuple[int, int] | None:
    """The synthetic loss node and its backward (`capture.add_loss_nodes`), or None (no user loss)."""
    ids = {c.op: c.id for c in graph.computes if c.op in ("loss_fn", "loss_fn.backward")}
    return (ids["loss_fn"], ids["loss_fn.backward"]) if len(ids) == 2 else None


def as_exported(graph: Graph, schedule: Schedule) -> Schedule:
    """A solver's schedule as `memviz.export` runs it: the model outputs kept alive once computed (it
    hands them to the caller) and the loss computed once, right before its backward (the caller runs it
    once the forward has returned: `solvers.schedule.run_turn_once`).  Its simulation is the measured
    step's memory.  Raises `PlanningError` for a schedule the export cannot run."""
    schedule = keep_outputs_alive(graph, with_buffer_updates(graph, schedule))
    turn = loss_turn(graph)
    if turn is None:
        return schedule
    try:
        once = run_turn_once(graph, schedule, *turn)
    except ValueError as exc:
        raise PlanningError(f"the exported module cannot run this schedule: {exc}") from None
    issues = () if once is schedule else simulate(graph, once).issues
    if issues:  # a node other than the loss's backward read what an earlier loss computation made
        raise PlanningError(f"the exported module cannot run this schedule: run with the loss once, "
                            f"{issues[0]}")
    return once


def with_buffer_updates(graph: Graph, schedule: Schedule) -> Schedule:
    """`schedule` with every buffer update computed once.  A buffer's new value that no node reads and
    no output keeps (BatchNorm's ``num_batches_tracked + 1``) is dead code to a solver, which then skips
    it, and the exported module never moves the buffer (eager counts it up every step: with
    ``momentum=None`` it weighs the running statistics).  Such an update is computed first, when it reads
    only persistent values (parameters, buffers, inputs), and its value freed as soon as it is written
    back, so it adds its few bytes at the step's lowest point."""
    computed = {s.node for s in schedule if s.op == "compute"}
    required = set(graph.outputs)
    first: list[Step] = []
    for c in graph.computes:
        if c.id in computed or not any(graph.datas[d].kind is DataKind.BUFFER for d in c.outputs):
            continue
        if any(d in required or graph.consumers(d) for d in c.outputs):
            continue  # read by another node or kept: a valid schedule computes it
        if any(graph.datas[d].producer is not None for d in c.inputs):
            raise PlanningError(f"the schedule never computes {c.name!r}, the new value of a buffer, and it "
                                "reads values the step makes: plan again with strategy='none'")
        first += [Step("compute", c.id), *(Step("free", d) for d in c.outputs)]
    return (*first, *schedule) if first else schedule


def plan(
    prof: Any,
    budget: int | float | str | None = None,
    strategy: str = "auto",
    time_limit: float = 60.0,
    *,
    frontier: bool = True,
    packing: bool = True,
    compiled: bool | str = False,
) -> Plan:
    """Solve a memory plan for a profile (from `memviz.profile`) or a bare `solvers.Graph`.

    `budget`: total device bytes as an int, "1.5GiB", "50%", or a float in (0, 1] (fraction of the
    baseline peak); None plans the eager order.  Raises `solvers.result.InfeasibleBudget` naming the
    smallest feasible budget when nothing fits.  Every schedule is checked by `solvers.simulate`.
    `time_limit` bounds the whole call for graph strategies (solve, packing and frontier share one
    `solvers.deadline.Deadline`; the solve may use `SOLVE_SHARE` of it when a packing or frontier
    follows); autochunk and sac pass it to their selection.
    `compiled` (strategy "sac" only; True or a torch.compile backend name, True meaning "aot_eager"):
    plan for the applied model under ``torch.compile``, whose own partitioner already recomputes cheap
    ops; peaks and prices are the compiled step's, measured (`memviz.plans.compiled`).
    """
    try:
        with recording_cuts() as cuts:
            deadline = Deadline.after(time_limit)
            first = _plan(prof, budget, strategy, time_limit, frontier=frontier, packing=packing,
                          compiled=compiled)
            # re-plans against the allocator's reserved peak share what the first plan left of the limit
            def replan(at: int) -> Plan:
                return _plan(prof, at, strategy, max(deadline.left(), 0.1), frontier=False, packing=True,
                             compiled=compiled)

            chosen = fit_reserved(first, replan)
        return with_time_cuts(chosen, cuts)
    except InfeasibleBudget as exc:
        # the refusal in the user's units too: a "50%" budget's minimum as a share of the eager peak
        raise exc.with_eager_peak(_baseline_of(prof)[2].peak_bytes) from exc.__cause__


def with_time_cuts(the_plan: Plan, cuts: list[str]) -> Plan:
    """`the_plan` with `solver_stats.extra["time_cuts"]`: where the time limit, not the solvers' counted
    work, stopped something while planning it (`solvers.deadline.recording_cuts`).  Empty: the plan
    depends on the profile and the budget alone, and re-planning returns the same plan."""
    stats = dataclasses.replace(the_plan.solver_stats,
                                extra={**the_plan.solver_stats.extra, "time_cuts": list(cuts)})
    return dataclasses.replace(the_plan, solver_stats=stats)


def _plan(prof: Any, budget: int | float | str | None, strategy: str, time_limit: float, *, frontier: bool,
          packing: bool, compiled: bool | str = False) -> Plan:
    if compiled and strategy != "sac":
        raise PlanningError(f"compiled= plans memviz.apply under torch.compile: strategy 'sac', not "
                            f"{strategy!r}")
    if strategy == "autochunk":
        return plan_autochunk(prof, budget, packing=packing, time_limit=time_limit)
    if strategy == "sac":  # PyTorch's own selective checkpointing, run by memviz.apply (memviz.plans.sac)
        from memviz.plans.sac import plan_sac

        return plan_sac(prof, budget, time_limit=time_limit, compiled=compiled)
    deadline = Deadline.after(time_limit)
    graph, base_schedule, baseline = _baseline_of(prof)
    # eager's own run may hold more than the same order on `graph` (`Profile.baseline_graph`)
    base_graph = getattr(prof, "baseline_graph", None)
    budget_bytes = None if budget is None else parse_budget(budget, baseline.peak_bytes)
    effective = baseline.peak_bytes if budget_bytes is None else budget_bytes
    candidates = auto_candidates(graph, baseline.peak_bytes, effective) if strategy == "auto" else [strategy]
    more = packing or (frontier and is_training(graph))
    solve_by = deadline.part(SOLVE_SHARE) if more else deadline
    if effective < graph.held_bytes():
        candidates, solve_by = minimum_search(candidates), deadline
    try:
        # the solvers alone, without cyclic collection (`gc_paused`): each schedule they build and
        # simulate allocates ~10^5 acyclic objects, whose collections rescanned the profile's whole heap
        # (a 70B rank's Rotor plan: 9.1 CPU s, 6.3 with that heap out of the collector's reach)
        with progress(len(candidates), f"memviz: planning ({strategy})") as bar, gc_paused():
            result, timeline, name = _solve_first(graph, candidates, effective, solve_by, bar.update)
    except InfeasibleBudget as exc:
        if isinstance(exc, OutOfTime) and effective < graph.held_bytes():
            # more time cannot help (what OutOfTime says): the budget is under what every schedule holds
            raise BelowHeldMemory(effective, graph.held_bytes(), strategy) from exc
        known = _known_minimum(graph) if strategy == "auto" and "checkmate" not in candidates else None
        if known is not None and known[1].peak_bytes <= effective:
            result, timeline, name = (*known, "checkmate")
        elif known is not None and known[1].peak_bytes < (exc.minimum_bytes or 1 << 62):
            raise InfeasibleBudget(effective, known[1].peak_bytes, "auto") from None
        elif strategy != "auto" or not can_chunk(prof):
            raise
        else:
            # inference that reordering cannot fit: chunk the activations instead (costs time, so second)
            try:
                return plan_autochunk(prof, effective, packing=packing, time_limit=time_limit)
            except InfeasibleBudget as chunk_exc:
                raise min((exc, chunk_exc), key=lambda e: e.minimum_bytes or 1 << 62) from None
            except ValueError as cannot_chunk:  # e.g. a non-tensor input: the reordering minimum stands
                raise exc from cannot_chunk
    if strategy == "auto" and name == "checkmate" and result.stats.status != "optimal":
        # a time-limited MILP incumbent can be worse than the hierarchy's plan: keep the cheaper
        try:
            other, other_tl = solve_checked(graph, "rockmate", effective, time_limit, solve_by)
            if other_tl.total_time < timeline.total_time:
                result, timeline, name = other, other_tl, "rockmate"
        except (PlanningError, InfeasibleBudget):
            pass
    if timeline.total_time > baseline.total_time and baseline.peak_bytes <= effective:
        # never worse than PyTorch's own order when that order already fits
        result = SolveResult(base_schedule, SolverStats("none", "heuristic", result.stats.seconds))
        timeline = baseline if base_graph is None else simulate(graph, base_schedule).check()
        name = "none"
    the_plan = Plan(
        graph=graph,
        schedule=result.schedule,
        timeline=timeline,
        baseline_schedule=base_schedule,
        baseline=baseline,
        baseline_graph=base_graph,
        strategy=name,
        budget_bytes=budget_bytes,
        solver_stats=result.stats,
        model=_model_info(prof, graph),
        device=_device_info(prof),
        profile=prof if graph is not prof else None,
    )
    if timeline.recomputes:
        # Neuron's compiler can fold recomputation away unless compiled with -O1: say so on Neuron targets.
        warn_neuron_checkpointing(the_plan.device["name"], stacklevel=4)  # user -> plan -> _plan
    if packing:
        share = deadline.part(PACKING_SHARE) if frontier and is_training(graph) else deadline
        the_plan.packing = packing_of(graph, result.schedule, the_plan.device, time_limit=PACKING_SECONDS,
                                      deadline=share)
    if frontier and is_training(graph):
        the_plan.frontier, the_plan.frontier_points = solve_frontier(
            graph, baseline, baseline_schedule=base_schedule, time_limit=FRONTIER_SECONDS, deadline=deadline
        )
    return the_plan


#: solves spent planning against the caching allocator's reserved peak before a budget is refused
RESERVED_TRIES = 6


def fit_reserved(first: Plan, solve: Callable[[int], Plan]) -> Plan:
    """`first`, or, when PyTorch's caching allocator (simulated on a device that uses one) would
    reserve more than the budget running it, the plan `solve` makes for a lower planning budget whose
    reserved peak fits: the export runs the schedule through that allocator and does not lay tensors
    out at the packed addresses, so a plan fits only if its reserved peak fits.

    The allocator's reserve grows about in proportion to the live bytes (segments rounded up, blocks
    cached whole), so each planning budget aims at the budget scaled by the last plan's live/reserved
    ratio, and steps at least twice as far down as the step before (the reserve is not monotone in
    the planning budget: a fixed step stalled above plans that fit, CUDA GPT-2 on an H100).  Once one
    fits, the planning budget is bisected upwards (a larger one recomputes less).  At most
    `RESERVED_TRIES` solves; InfeasibleBudget when none fits."""
    budget = first.budget_bytes
    if budget is None or first.reserved_peak_bytes is None or first.reserved_peak_bytes <= budget:
        return first
    best: Plan | None = None
    fits_at, over = 0, budget  # planning budgets known to fit / to reserve too much
    lowest, step = budget, 0
    at = budget * first.peak_bytes // first.reserved_peak_bytes
    for _ in range(RESERVED_TRIES):
        if not fits_at < at < over:
            break
        try:
            candidate = solve(at)
        except InfeasibleBudget as exc:  # below what any schedule needs: try that minimum instead
            if exc.minimum_bytes is None or exc.minimum_bytes <= at:
                break
            at = exc.minimum_bytes
            continue
        lowest = min(lowest, at)
        reserved = candidate.reserved_peak_bytes or 0
        if reserved <= budget:
            best, fits_at = candidate, at
            at = (at + over) // 2
        elif best is not None:
            over, at = at, (fits_at + at) // 2
        else:
            step = max(2 * step, at - budget * candidate.peak_bytes // reserved, 1)
            over, at = at, at - step
    if best is None:
        raise InfeasibleBudget(
            budget, None, f"{first.strategy}: PyTorch's caching allocator reserves "
            f"{format_bytes(first.reserved_peak_bytes)} running the plan for this budget, and no plan for a "
            f"lower planning budget tried ({RESERVED_TRIES} solves, down to {format_bytes(lowest)}) reserves "
            "less than the budget"
        )
    return dataclasses.replace(best, budget_bytes=budget, frontier=first.frontier,
                               frontier_points=first.frontier_points)


def _known_minimum(graph: Graph) -> tuple[SolveResult, Timeline] | None:
    """The lowest-peak schedule Checkmate remembers for `graph` (a checkmate plan or minimum asked for
    earlier), checked by the simulator: on graphs too large for 'auto' to run Checkmate, a budget that
    Checkmate was seen to reach still gets a plan, and a refusal names the smallest budget known."""
    from solvers.checkmate import known_minimum

    found = known_minimum(graph)
    if found is None or not is_training(graph):
        return None
    try:
        schedule = as_exported(graph, found.schedule)
    except PlanningError:
        return None
    timeline = simulate(graph, schedule).check()
    stats = SolverStats("checkmate", "heuristic", 0.0, objective=timeline.total_time,
                        extra={"source": "lowest-peak schedule found by an earlier checkmate call"})
    return SolveResult(schedule, stats), timeline


def _solve_first(
    graph: Graph, candidates: list[str], budget: int, deadline: Deadline,
    tried: Callable[[], Any] = lambda: None,
) -> tuple[SolveResult, Timeline, str]:
    """The first candidate that returns a plan by `deadline` (they share it: a candidate gets what the
    ones before it left); if none does, the most informative error.  `tried` is called before each
    candidate (progress)."""
    errors: list[Exception] = []
    for name in candidates:
        tried()
        try:
            result, timeline = solve_checked(graph, name, budget, deadline.left(), deadline)
            return result, timeline, name
        except (PlanningError, InfeasibleBudget) as exc:
            if len(candidates) == 1:
                raise
            errors.append(exc)
    infeasible = [e for e in errors if isinstance(e, InfeasibleBudget) and e.minimum_bytes is not None]
    if infeasible:
        raise min(infeasible, key=lambda e: e.minimum_bytes)
    raise errors[-1]


def minimum_budget(graph: Graph, strategy: str, time_limit: float = MINIMUM_SECONDS,
                   deadline: Deadline | None = None) -> int:
    """The smallest budget a strategy reports feasible (asks it for 1 byte and reads its answer);
    `OutOfTime` when it could not answer by the deadline.  Without cyclic collection, as `_plan`'s solve."""
    try:
        with gc_paused():
            solve_checked(graph, strategy, graph.persistent_bytes() or 1, time_limit, deadline)
    except OutOfTime:
        raise
    except InfeasibleBudget as exc:
        if exc.minimum_bytes is None:
            raise PlanningError(f"{strategy} cannot tell its minimum budget") from None
        return exc.minimum_bytes
    return graph.persistent_bytes()


def budget_frontier(
    graph: Graph,
    baseline: Timeline,
    *,
    strategy: str = "rotor",
    points: int = FRONTIER_POINTS,
    time_limit: float = FRONTIER_SECONDS,
    deadline: Deadline | None = None,
) -> list[dict[str, Any]]:
    """`points` budgets from the strategy's minimum to the baseline peak -> (peak, time overhead): the
    rows of `solve_frontier`, without the runs behind them."""
    rows, _ = solve_frontier(graph, baseline, strategy=strategy, points=points, time_limit=time_limit,
                             deadline=deadline)
    return rows


def solve_frontier(
    graph: Graph,
    baseline: Timeline,
    *,
    baseline_schedule: Schedule | None = None,
    strategy: str = "rotor",
    points: int = FRONTIER_POINTS,
    time_limit: float = FRONTIER_SECONDS,
    deadline: Deadline | None = None,
) -> tuple[list[dict[str, Any]], list[FrontierPoint]]:
    """The frontier rows (`budget_bytes`, `peak_bytes`, `time_overhead`, `strategy`: what the plan JSON
    holds) and, row for row, the checked run each row describes.

    Monotone by construction: a plan that fits a smaller budget fits every larger one, so each point
    keeps the cheapest plan found at or below its budget.  The largest budget is the baseline peak,
    where the eager order (`baseline_schedule`, or `eager_schedule(graph)`) is the plan.  Returns by
    `time_limit` seconds or `deadline`, the earlier: budgets not solved by then keep the cheapest plan
    of a smaller budget (the eager order's at the top); no minimum by then, no frontier.
    """
    deadline = Deadline.of(time_limit, deadline)
    try:
        low = minimum_budget(graph, strategy, deadline.left(), deadline)
    except (PlanningError, InfeasibleBudget):  # InfeasibleBudget: an OutOfTime refusal
        return [], []
    high = baseline.peak_bytes
    eager = _eager_point(graph, baseline_schedule, high)
    if low >= high:
        return [_frontier_row(graph, eager, baseline)], [eager]
    rows: list[dict[str, Any]] = []
    runs: list[FrontierPoint] = []
    best: FrontierPoint | None = None
    bar = progress(points, f"memviz: budget frontier ({strategy})")
    for i in range(points):
        bar.update()
        budget = low + (high - low) * i // (points - 1)
        run = eager if i == points - 1 else None
        if run is None and not deadline.expired("frontier: budgets not solved"):
            try:
                result, tl = solve_checked(graph, strategy, budget, deadline.left(), deadline)
                run = FrontierPoint(budget, strategy, result, tl)
            except (InfeasibleBudget, PlanningError):
                run = None
        if run is not None and (best is None or run.timeline.total_time < best.timeline.total_time):
            best = run
        if best is not None:
            # the row is for this budget; its run may be a smaller budget's (it fits this one too)
            kept = dataclasses.replace(best, budget_bytes=budget)
            rows.append(_frontier_row(graph, kept, baseline))
            runs.append(kept)
    bar.close()
    return rows, runs


def progress(total: int, desc: str) -> Any:
    """A progress bar that shows only when the work takes over 2 s (issue 23: no silent minute-long solve):
    a widget in notebooks, a line on stderr in a terminal; it clears itself when done."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, delay=2.0, leave=False, unit="step")


def _eager_point(graph: Graph, schedule: Schedule | None, budget: int) -> FrontierPoint:
    """The eager order as a frontier point, simulated and checked like every solver's schedule."""
    schedule = eager_schedule(graph) if schedule is None else schedule
    result = SolveResult(schedule, SolverStats("none", "heuristic", 0.0))
    return FrontierPoint(budget, "none", result, simulate(graph, schedule).check())


def _frontier_row(graph: Graph, point: FrontierPoint, baseline: Timeline) -> dict[str, Any]:
    overhead = step_time_ratio(graph, point.timeline.total_time, baseline.total_time,
                               point.timeline.recomputes)
    return {
        "budget_bytes": point.budget_bytes,
        "peak_bytes": point.timeline.peak_bytes,
        "time_overhead": overhead,
        "strategy": point.strategy,
    }


def packing_of(graph: Graph, schedule: Schedule, device: dict[str, Any], *,
               time_limit: float = PACKING_SECONDS, deadline: Deadline | None = None,
               gap: float = PACKING_GAP) -> dict[str, Any] | None:
    """Address packing of the schedule (by `time_limit` seconds or `deadline`, the earlier; its search
    stops within `gap` of the max-live bound: `solvers.olla.pack.pack`), plus
    PyTorch's caching allocator on the same schedule when the device uses one
    (`memviz.hardware.devices.uses_caching_allocator`: CUDA; not the CPU)."""
    try:
        from solvers.allocator import simulate_caching_allocator
        from solvers.olla import pack_schedule
    except ImportError:
        return None
    from memviz.hardware.devices import uses_caching_allocator

    packed = pack_schedule(graph, schedule, time_limit=time_limit, deadline=deadline, gap=gap).to_dict()
    if not uses_caching_allocator(str(device.get("name", ""))):
        return packed
    return {**packed, "allocator": simulate_caching_allocator(graph, schedule).to_dict()}


def _baseline_of(prof: Any) -> tuple[Graph, Schedule, Timeline]:
    if isinstance(prof, Graph):
        schedule = eager_schedule(prof)
        return prof, schedule, simulate(prof, schedule).check()
    if isinstance(prof, Plan):
        return prof.graph, prof.baseline_schedule, prof.baseline
    try:  # a re-costed profile is re-timed with it (`Profile.with_costs`)
        return prof.graph, prof.baseline_schedule, prof.baseline
    except AttributeError:
        raise TypeError(
            f"memviz.plan needs a profile from memviz.profile(model, args) or a solvers.Graph, "
            f"not {type(prof).__name__}"
        ) from None


def _model_info(prof: Any, graph: Graph) -> dict[str, Any]:
    if isinstance(prof, Graph):
        return {"name": graph.name, "mode": "train" if is_training(graph) else "inference", "fingerprint": ""}
    return {"name": prof.model_name, "mode": prof.mode, "fingerprint": prof.fingerprint}


def _device_info(prof: Any) -> dict[str, Any]:
    dev = getattr(prof, "device", None)
    if dev is None:
        return {"name": "unspecified", "estimated": True, "capacity_bytes": None, "timing": "estimated"}
    info = {
        "name": str(getattr(dev, "name", dev)),
        "estimated": bool(getattr(dev, "estimated", False)),
        "capacity_bytes": getattr(dev, "capacity_bytes", None),
    }
    timing = getattr(dev, "timing", None)  # memviz.hardware.devices.DeviceInfo.timing
    return info if timing is None else {**info, "timing": timing}


# --- autochunk: activation chunking for inference (AutoChunk, Zhao et al. 2024) ---------------------
def can_chunk(prof: Any) -> bool:
    """An inference profile that still holds its traced model (chunking rewrites the model)."""
    return getattr(prof, "mode", None) == "inference" and getattr(prof, "captured", None) is not None


def plan_autochunk(
    prof: Any, budget: int | float | str | None, *, packing: bool = True, time_limit: float | None = None
) -> Plan:
    """`memviz.plan(prof, budget, strategy="autochunk")`: chunk regions chosen so the chunked inference
    run fits `budget` (total device bytes, like every plan: parameters and inputs included; a fraction
    is of the unchunked run's peak) with the least estimated slowdown (AutoChunk Sec. 3.4).  The
    selection stops after `time_limit` seconds with the best regions found (capturing and timing the
    model come first and are not bounded by it)."""
    if isinstance(prof, Graph | Plan) or not hasattr(prof, "model"):
        raise PlanningError(
            "strategy 'autochunk' rewrites the model: pass the profile from "
            "memviz.profile(model, args, mode='inference'), not a bare graph or a plan"
        )
    if prof.mode != "inference":
        raise PlanningError(
            "activation chunking is for inference (it splits the forward pass and keeps no activations "
            "for a backward); profile with mode='inference' to chunk, or fit training with "
            "rematerialization: strategy 'auto', 'rockmate', 'checkmate' or 'rotor'"
        )
    from memviz.plans.chunking import EstimateMissed, unchunked_plan
    from solvers.autochunk import chunked_run

    start = time.perf_counter()
    try:
        unchunked = unchunked_plan(prof)
    except ValueError as exc:
        raise PlanningError(str(exc)) from None
    base = chunked_run(unchunked.graph, (), unchunked.speed)
    persistent = base.graph.persistent_bytes()
    base_peak = simulate(base.graph, base.schedule).check().peak_bytes
    budget_bytes = None if budget is None else parse_budget(budget, base_peak)

    def planned(cp: Any) -> Plan:
        return chunked_plan(cp, budget_bytes, _model_info(prof, prof.graph), _device_info(prof), prof,
                            packing=packing, start=start)

    if budget_bytes is None:
        return planned(unchunked)
    # the regions are chosen on activation bytes: parameters and inputs stay whole
    activations = max(1, budget_bytes - persistent)
    from memviz.hardware.accelerator import autocast_as

    try:
        # the selection's measured check runs as the chunked module will (`chunking.ChunkedModule`)
        with autocast_as(prof.captured.autocast, cache=False):
            chosen = unchunked.select(activations, time_limit=time_limit)
        the_plan = planned(chosen)
    except EstimateMissed as exc:
        raise PlanningError(str(exc)) from None
    lowest_peak, lowest = _lowest_chunking(prof.graph, the_plan)
    if the_plan.peak_bytes > budget_bytes and lowest_peak <= budget_bytes:
        the_plan = planned(dataclasses.replace(lowest, graph=unchunked.graph, speed=unchunked.speed,
                                               gm=unchunked.gm, budget_bytes=activations))
    if the_plan.peak_bytes > budget_bytes:
        raise InfeasibleBudget(budget_bytes, lowest_peak, "autochunk", proven=False)
    return the_plan


#: per profile graph, the lowest-peak autochunk plan any call found: its peak and its (measured) chunk
#: plan without the capture (`_lowest_chunking`)
_LOWEST_CHUNKING: RecentMemo[Graph, tuple[int, Any]] = RecentMemo(8)


def _lowest_chunking(graph: Graph, the_plan: Plan) -> tuple[int, Any]:
    """The lowest-peak chunk plan known for the profile `graph`, `the_plan`'s when it is the lowest
    (then remembered).  The selection is a beam search under a time limit (AutoChunk Sec. 3.4): a later
    call, asked for the minimum a refusal named, searches from another budget, and cut short on a loaded
    machine it can stop before the regions that reached that minimum (the sweep's olmo, phi and vit).
    They are kept, so the minimum stays a budget `plan` meets (as Checkmate keeps its lowest-peak
    schedule per graph).  The plan is kept without its capture: regions name the capture's nodes, which
    the profile's model captures alike (`chunking.unchunked_plan`, once per live profile)."""
    known = _LOWEST_CHUNKING.get(graph)
    if known is not None and known[0] <= the_plan.peak_bytes:
        return known
    lowest = (the_plan.peak_bytes, dataclasses.replace(the_plan.chunking, gm=None))
    _LOWEST_CHUNKING.put(graph, lowest)
    return lowest


def chunked_plan(
    cp: Any,
    budget_bytes: int | None,
    model: dict[str, Any],
    device: dict[str, Any],
    prof: Any,
    *,
    packing: bool = True,
    start: float | None = None,
) -> Plan:
    """A Plan of a `ChunkPlan`: the planned run is the chunked CD-graph (one compute node per op per
    chunk, `solvers.autochunk.chunked_run`: AutoChunk Sec. 3.4's Eq. 2 memory and Eq. 8-10 time made
    explicit), the baseline the unchunked one, both checked and measured by `solvers.simulate`;
    `chunks[i]["memory_bytes"]` is the simulated peak while region i runs."""
    from solvers.autochunk import chunked_run, random_chunked

    start = time.perf_counter() if start is None else start
    name = model.get("name") or "inference"
    base = chunked_run(cp.graph, (), cp.speed, name)
    run = chunked_run(cp.graph, tuple(cp.regions), cp.speed, name)
    baseline = simulate(base.graph, base.schedule).check()
    timeline = simulate(run.graph, run.schedule).check()
    chunks = [
        {**c, "memory_bytes": max(timeline.step_bytes[a : b + 1])}
        for c, (a, b) in zip(cp.chunks, run.spans, strict=True)
    ]
    stats = SolverStats(
        "autochunk",
        "heuristic",
        time.perf_counter() - start,
        objective=timeline.total_time,
        extra={"regions": len(cp.regions), "activation_budget_bytes": cp.budget_bytes},
    )
    from memviz.hardware.accelerator import autocast_json

    cap = getattr(prof, "captured", None)
    # the profile's autocast regions, which the chunked module enters (`chunking.ChunkedModule`)
    meta = run.graph.meta if cap is None else {**run.graph.meta, "autocast": autocast_json(cap.autocast)}
    the_plan = Plan(
        graph=dataclasses.replace(run.graph, meta=meta),
        schedule=run.schedule,
        timeline=timeline,
        baseline_schedule=base.schedule,
        baseline=baseline,
        strategy="autochunk",
        budget_bytes=budget_bytes,
        solver_stats=stats,
        model=model,
        device=device,
        chunks=chunks,
        profile=prof,
        baseline_graph=base.graph,
        chunking=cp,
    )
    random = random_chunked(cp.graph, cp.regions)
    if random:
        warnings.warn(
            f"chunk regions contain random ops ({', '.join(random)}: dropout in training mode?); their "
            "loops draw random numbers chunk by chunk, so outputs match eager in distribution, not bit "
            "for bit: call model.eval() before profiling for deterministic inference",
            stacklevel=3,
        )
    if packing:
        the_plan.packing = packing_of(run.graph, run.schedule, the_plan.device)
    return the_plan
