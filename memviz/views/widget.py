"""`memviz.Planner`: the JupyterLab widget.  Python owns every plan; the view only draws the plan
document it is sent (`plan_json`) and reports what the user did (slider index, strategy, export).

What travels per plan is kept small, because the slider's latency is mostly the message: the members
every plan of one Planner shares (`SHARED`: the graph, the eager baseline, the frontier, model and
device) are sent once as `plan_base_json`, and `plan_json` holds the rest of the memviz.plan/3 document
(a member that differs from the base, e.g. an autochunk plan's own graph, is sent and wins).  The
CD-graph DOT (the largest member, drawn only by the Graph tab) is left out unless the view says, in
`view_needs`, that its visible tab draws it.  The view draws `{...base, ...plan}`.

The slider walks the budget frontier.  The frontier was solved when the first plan was made, and its
runs stay in the kernel (`Plan.frontier_points`), so moving the slider shows that budget's frontier
plan at once, named after the strategy that solved it (rotor, or the eager order at the top).  When
the selected strategy is another one, or the shown plan has no address packing yet, a background
thread solves it and sends a second update; `refining` says what is being solved meanwhile.  Every
plan shown has been checked by `solvers.simulate`, and is cached, so a revisit sends it again.
"""

from __future__ import annotations

import dataclasses
import html
import json
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from memviz.budget import format_bytes
from memviz.hardware.devices import TARGETS
from memviz.plans.planning import Plan, fit_reserved, frontier_plan, plan, with_packing
from memviz.views.report import write_report
from solvers import Graph, simulate
from solvers.memo import RecentMemo

MODULE_NAME = "jupyterlab-memviz"

#: plan document members sent once in `plan_base_json` (equal for every plan a Planner shows, unless a
#: plan differs, e.g. an autochunk plan's own graph: then it is sent in `plan_json` and wins)
SHARED = ("model", "device", "graph", "baseline", "frontier")
#: optional members sent only while the view's visible tab draws them (`view_needs`)
ON_DEMAND = ("cdgraph",)
MODULE_VERSION = "^0.1.0"
#: the Planner's output besides its widget view: {"model_id", "plan": the plan document shown}.  The
#: extension renders the live widget while its model exists and this plan, static, when it does not
#: (a saved notebook opened without a kernel); the view keeps it up to date with the plan shown
PLANNER_MIME = "application/vnd.memviz.planner+json"


def encode(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def join_members(members: dict[str, str]) -> str:
    """A JSON object from already encoded member values (no member is encoded twice)."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members.items()) + "}"


def split_document(members: dict[str, str], base: dict[str, str], needs: frozenset[str]) -> str:
    """`plan_json` for a plan given as encoded members: the members not equal to `base`'s, without
    the on-demand ones the view does not need now."""
    return join_members({
        k: v for k, v in members.items()
        if base.get(k) != v and (k not in ON_DEMAND or k in needs)
    })


def refuse_clobber(paths: tuple[Path, ...], overwrite: bool) -> dict[str, Any] | None:
    """The export reply when some of `paths` exist and the user has not confirmed overwriting them."""
    clashes = [str(p) for p in paths if p.exists()]
    if not clashes or overwrite:
        return None
    message = f"{', '.join(clashes)} already exist: confirm to overwrite"
    return {"ok": False, "exists": clashes, "message": message}


#: the op times first measured for each graph structure (the graph with its times zeroed) on each device,
#: by the Planners of this kernel (`steady_costs`)
_FIRST_TIMES: RecentMemo[tuple[Graph, str], tuple[float, ...]] = RecentMemo(8)


def steady_costs(prof: Any) -> Any:
    """`prof` with the op times first measured in this kernel for the same graph structure on the same
    device.  Measured CPU op times vary from run to run (a tiny op by 2x), and the solvers choose what
    to recompute by time, so re-running a Planner cell re-planned with other times and showed another
    plan (issue 18: 35 vs 15 recomputations).  With the first times, the same model and inputs give the
    same graph, and the solvers' per-graph memory (`solvers.memo`) the same plan."""
    graph = prof.graph
    key = (_with_times(graph, [0.0] * len(graph.computes)), str(prof.device.name))
    measured = tuple(c.time for c in graph.computes)
    first = _FIRST_TIMES.get(key)
    if first is None:
        _FIRST_TIMES.put(key, measured)
        return prof
    if first == measured:
        return prof
    steady = _with_times(graph, first)
    base_graph = getattr(prof, "baseline_graph", None)
    eager = steady if base_graph is None else _with_times(base_graph, first)
    return dataclasses.replace(prof, graph=steady, baseline=simulate(eager, prof.baseline_schedule).check(),
                               baseline_graph=None if base_graph is None else eager)


def _with_times(graph: Graph, times: Any) -> Graph:
    computes = tuple(dataclasses.replace(c, time=t) for c, t in zip(graph.computes, times, strict=True))
    return dataclasses.replace(graph, computes=computes)


def capacity_presets(device: dict[str, Any]) -> list[dict[str, Any]]:
    """Budgets the Planner offers besides the slider: the plan's own device capacity when known, then
    each named target's (`memviz.hardware.devices.TARGETS`, aliases once), smallest first."""
    presets: list[dict[str, Any]] = []
    if device.get("capacity_bytes"):
        own = f"this device ({device.get('name', '')})"
        presets.append({"label": own, "bytes": int(device["capacity_bytes"])})
    seen: set[str] = set()
    for target in sorted(TARGETS.values(), key=lambda t: (t.capacity_bytes, t.name)):
        if target.name in seen or target.name == "cpu":
            continue
        seen.add(target.name)
        presets.append({"label": target.description or target.name, "bytes": target.capacity_bytes})
    return presets


def plan_html(p: Plan) -> str:
    """A static summary of the plan for viewers that run no extension (GitHub, nbviewer): a table of
    plain text, every value escaped."""
    rows = [
        ("model", f"{p.model.get('name', '')} ({p.model.get('mode', '')})"),
        ("device", str(p.device.get("name", ""))),
        ("strategy", f"{p.strategy} ({p.solver_stats.status})"),
        ("budget", "none" if p.budget_bytes is None else format_bytes(p.budget_bytes)),
        ("planned peak", format_bytes(p.peak_bytes)),
        ("eager peak", format_bytes(p.baseline.peak_bytes)),
        ("time", f"x{p.time_overhead:.3f}, {p.timeline.recomputes} recomputations"),
        *([("time limit", f"stopped the planning ({', '.join(p.time_cuts)}): may differ between runs")]
          if p.time_cuts else []),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table><caption>memviz plan (static: run the cell to re-plan)</caption>{body}</table>"


class MemvizWidget(widgets.DOMWidget):
    """A DOMWidget whose model and view live in this package's labextension; subclasses name them."""

    _model_module = traitlets.Unicode(MODULE_NAME).tag(sync=True)
    _view_module = traitlets.Unicode(MODULE_NAME).tag(sync=True)
    _model_module_version = traitlets.Unicode(MODULE_VERSION).tag(sync=True)
    _view_module_version = traitlets.Unicode(MODULE_VERSION).tag(sync=True)


class Planner(MemvizWidget):
    """Interactive memory planner: `Planner(model, args, mode="train")`, `Planner(profile)` or
    `Planner(plan)`.  Dragging the budget slider re-plans; Export writes the module source and the
    plan JSON next to the notebook (never overwriting without `export_overwrite`)."""

    _model_name = traitlets.Unicode("PlannerModel").tag(sync=True)
    _view_name = traitlets.Unicode("PlannerView").tag(sync=True)

    #: the plan shown, as a memviz.plan/3 document less the members equal to `plan_base_json`'s and
    #: less the `ON_DEMAND` ones the view does not need (see the module docstring)
    plan_json = traitlets.Unicode("").tag(sync=True)
    #: the `SHARED` members of the first plan, a JSON object sent once
    plan_base_json = traitlets.Unicode("").tag(sync=True)
    #: the `ON_DEMAND` members the view's visible tab draws (the view writes it)
    view_needs = traitlets.List(traitlets.Unicode()).tag(sync=True)
    budget_index = traitlets.Int(-1).tag(sync=True)
    strategy = traitlets.Unicode("auto").tag(sync=True)
    status = traitlets.Unicode("").tag(sync=True)
    #: what the kernel is solving for the shown budget ('' when the shown plan is final)
    refining = traitlets.Unicode("").tag(sync=True)
    #: the most seconds a solve may take (the view's progress bar runs against it while `refining`)
    solve_limit_s = traitlets.Float(0.0).tag(sync=True)
    #: the view increments it to cancel the solve in progress (`refining`)
    cancel_request = traitlets.Int(0).tag(sync=True)
    #: a budget the user typed (bytes), solved when the view increments `budget_request`
    budget_bytes = traitlets.Int(0).tag(sync=True)
    budget_request = traitlets.Int(0).tag(sync=True)
    #: device-capacity presets for the typed budget: [{"label", "bytes"}], the plan's device first
    presets = traitlets.List(traitlets.Dict()).tag(sync=True)
    export_path = traitlets.Unicode("memviz_export/model_opt.py").tag(sync=True)
    export_overwrite = traitlets.Bool(False).tag(sync=True)
    export_request = traitlets.Int(0).tag(sync=True)
    export_result = traitlets.Unicode("").tag(sync=True)
    #: Export runs one measured step first and never writes a module over the budget (`memviz.runtime.verify`)
    verify = traitlets.Bool(True).tag(sync=True)
    #: what Export writes: "apply" (a `memviz.apply` snippet), "module" (`memviz.export`'s source), or ""
    #: for `default_export` (apply when the plan runs as checkpointing as it is)
    export_as = traitlets.Unicode("").tag(sync=True)

    #: seconds a refinement waits before it starts: a drag sends every index it crosses, and only the
    #: one the slider stops at is worth a solve (the frontier's plan is on screen meanwhile)
    settle_s = 0.25

    def __init__(
        self,
        source: Any,
        args: tuple | None = None,
        *,
        mode: str = "train",
        budget: Any = None,
        strategy: str = "auto",
        time_limit: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._time_limit = time_limit
        self.profile = self._profile_of(source, args, mode)
        self.plan: Plan = (
            source
            if isinstance(source, Plan)
            else plan(self.profile, budget, strategy=strategy, time_limit=time_limit)
        )
        self._frontier = self.plan.frontier
        self._first = self.plan  # the plan the frontier was solved with: frontier plans are built on it
        self._points = self.plan.frontier_points
        self._cache: dict[tuple[str, int], Plan] = {}
        self._frontier_plans: dict[int, Plan] = {}
        # id(plan) -> (plan, its encoded members): a revisit re-sends them instead of re-encoding
        self._documents: dict[int, tuple[Plan, dict[str, str]]] = {}
        self._base: dict[str, str] = {}
        # One worker: solves run one at a time, and a request superseded before it starts is skipped.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memviz-planner")
        self._lock = threading.RLock()  # the worker and the kernel's thread both update the shown plan
        self._request = 0
        self._closed = False
        self._ready = False  # the constructor's own trait assignments are not user requests
        self.strategy = strategy
        self.solve_limit_s = float(time_limit)
        self.presets = capacity_presets(self.plan.device)
        members = self._members(self.plan)
        self._base = {k: members[k] for k in SHARED if k in members}
        self.plan_base_json = join_members(self._base)
        self._show(self.plan)
        for index in range(len(self._points)):
            self._worker.submit(self._warm, index)
        self._ready = True

    @staticmethod
    def _profile_of(source: Any, args: tuple | None, mode: str) -> Any:
        if isinstance(source, Plan):
            return source.profile
        if hasattr(source, "graph") and hasattr(source, "baseline"):
            return source
        from memviz.profiling.profile import profile

        if args is None:
            raise TypeError("Planner(model, args): pass the model's example inputs")
        return steady_costs(profile(source, args, mode=mode))

    def _members(self, p: Plan) -> dict[str, str]:
        """The plan's document members, each encoded once per plan (two threads may both encode a
        plan: harmless, they produce the same text)."""
        kept, members = self._documents.get(id(p), (None, {}))
        if kept is not p:
            doc = p.to_dict()
            doc["frontier"] = self._frontier
            members = {k: encode(v) for k, v in doc.items()}
            self._documents[id(p)] = (p, members)
        return members

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, and the plan shown for when its model is gone (`PLANNER_MIME`, and a static
        HTML summary for viewers without the extension)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        with self._lock:
            bundle[PLANNER_MIME] = {"model_id": self.model_id, "plan": self.document()}
            bundle["text/html"] = plan_html(self.plan)
        return bundle

    def _document(self, p: Plan) -> str:
        """`plan_json` for plan `p`: what the view does not have yet, and needs."""
        return split_document(self._members(p), self._base, frozenset(self.view_needs))

    def document(self) -> dict[str, Any]:
        """The plan document the view draws now: `plan_base_json` overlaid with `plan_json`."""
        return {**json.loads(self.plan_base_json or "{}"), **json.loads(self.plan_json or "{}")}

    def _warm(self, index: int) -> None:
        """Worker thread: encode a frontier point's plan ahead of the slider, so that its first visit
        only sends a ready document (the encoding is most of the kernel's share of the latency)."""
        shown = self._frontier_plan(index)
        if shown is not None:
            self._members(shown)

    def _show(self, p: Plan) -> None:
        self._members(p)
        # one message for the plan and its status (and the `refining` note of the callers, which
        # hold the lock around this): the view redraws once per plan
        with self._lock, self.hold_sync():
            self.plan = p
            self.plan_json = self._document(p)
            # the view describes the plan once, from the document; the status line is for errors and notes
            self.status = ""

    @traitlets.observe("view_needs")
    def _on_needs(self, change: dict[str, Any]) -> None:
        """The view switched tabs: send the shown plan again if its document now differs (the Graph
        tab needs the CD-graph the memory chart does not)."""
        with self._lock:
            if self.plan_json and self._document(self.plan) != self.plan_json:
                self._show(self.plan)

    def replan(self, budget: Any, strategy: str | None = None) -> Plan:
        result = self._solve(budget, strategy or self.strategy)
        self._show(result)
        return result

    def _solve(self, budget: Any, strategy: str) -> Plan:
        source = self.profile if self.profile is not None else self.plan.graph
        return plan(source, budget, strategy=strategy, time_limit=self._time_limit, frontier=False)

    @traitlets.observe("budget_index", "strategy")
    def _on_change(self, change: dict[str, Any]) -> None:
        if self._closed or not self._ready or not self._frontier:
            return
        if change["name"] == "strategy" and self.budget_index < 0 and self.plan.budget_bytes is not None:
            # a typed budget (or the plan as first made): the new strategy solves that budget
            self._ask(self.plan.budget_bytes, self._fitting_frontier_plan(self.plan.budget_bytes), exact=True)
            return
        if not 0 <= self.budget_index < len(self._frontier):
            return
        index = self.budget_index
        self._ask(self._frontier[index]["budget_bytes"], self._frontier_plan(index), exact=False)

    @traitlets.observe("budget_request")
    def _on_budget_request(self, change: dict[str, Any]) -> None:
        """A typed budget (or a device preset): the cheapest frontier plan that fits it is shown at once,
        then the selected strategy's plan for exactly that budget."""
        if self._closed or not self._ready:
            return
        budget = self.budget_bytes
        if budget <= 0:
            self.status = f"error: a budget must be a positive number of bytes, not {budget}"
            return
        with self.hold_sync():
            self.budget_index = -1  # off the frontier's grid: the view places the slider by the plan's budget
            self._ask(budget, self._fitting_frontier_plan(budget), exact=True)

    def _fitting_frontier_plan(self, budget: int) -> Plan | None:
        """The frontier plan of the largest frontier budget at or below `budget` (it fits, and a larger
        budget's plan is never slower), relabelled with `budget`; None when every frontier budget is
        larger."""
        fitting = [i for i, row in enumerate(self._frontier) if row["budget_bytes"] <= budget]
        if not fitting:
            return None
        best = max(fitting, key=lambda i: self._frontier[i]["budget_bytes"])
        shown = self._frontier_plan(best)
        return None if shown is None else dataclasses.replace(shown, budget_bytes=budget)

    def _ask(self, budget: int, shown: Plan | None, *, exact: bool) -> None:
        """Show `shown` (a frontier plan, or None) for `budget` now and solve the selected strategy's plan
        for it in the worker, unless it is cached.  `exact`: solve even when `shown` is that strategy's
        (a typed budget between frontier points deserves its own plan, not a smaller budget's)."""
        strategy = self.strategy
        key = (strategy, budget)
        with self._lock:
            self._request += 1
            request = self._request
            done = self._cache.get(key)
            shown = done or shown
            if shown is not None:
                # in the same message as the plan, so the view never draws it as final while it is not
                with self.hold_sync():
                    self.refining = "" if done else self._refinement(shown, strategy, exact)
                    self._show(shown)
        if done is None:
            if shown is None:
                self.refining = f"solving with {strategy} for {format_bytes(budget)}"
            self._worker.submit(self._refine, request, key, None if exact else shown)

    @traitlets.observe("cancel_request")
    def _on_cancel(self, change: dict[str, Any]) -> None:
        """Stop waiting for the solve in progress: the plan shown stays, the solve's result is never shown
        (it still lands in the cache), and later requests go to a fresh worker at once.  A solver cannot be
        interrupted mid-call: the abandoned one ends by its own time limit."""
        with self._lock:
            if not self.refining or self._closed:
                return
            self._request += 1
            abandoned, self._worker = self._worker, ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="memviz-planner")
            abandoned.shutdown(wait=False, cancel_futures=True)
            with self.hold_sync():
                self.refining = ""
                self.status = (f"cancelled: showing the {self.plan.strategy} plan for "
                               f"{format_bytes(self.plan.budget_bytes or 0)}")

    def _frontier_plan(self, index: int) -> Plan | None:
        """The plan the frontier already solved for this index, built once (no solver runs here)."""
        if index >= len(self._points):
            return None  # a plan loaded from a file: its frontier rows have no runs behind them
        with self._lock:  # one Plan object per index, whichever thread asks first
            if index not in self._frontier_plans:
                self._frontier_plans[index] = frontier_plan(self._first, self._points[index])
            return self._frontier_plans[index]

    @staticmethod
    def _refinement(shown: Plan, strategy: str, exact: bool) -> str:
        if shown.strategy != strategy or exact:
            return f"showing the frontier's {shown.strategy} plan; solving with {strategy}"
        return "packing addresses"

    def _refine(self, request: int, key: tuple[str, int], shown: Plan | None) -> None:
        """Worker thread: the selected strategy's plan for this budget (or the frontier plan `shown` with
        its packing, when that strategy made it); shown if no newer request came meanwhile."""
        time.sleep(self.settle_s)
        if request != self._request:
            return  # the slider moved on before this solve started
        strategy, budget = key
        try:
            if shown is not None and shown.strategy == strategy:
                packed = with_packing(shown, time_limit=min(10.0, self._time_limit))
                # on a device with a caching allocator the frontier's plan must fit its reserved peak too
                result = fit_reserved(packed, lambda at: self._solve(at, strategy))
            else:
                result = self._solve(budget, strategy)
        except Exception as exc:  # a worker thread would swallow it: report it in the view
            with self._lock:
                if request == self._request:
                    self.refining = ""
                    held = self.plan.strategy, format_bytes(self.plan.budget_bytes or 0)
                    self.status = f"error: {strategy}: {exc} (showing the {held[0]} plan for {held[1]})"
            return
        self._members(result)  # encoded outside the lock: the kernel's thread may want it meanwhile
        with self._lock:
            self._cache[key] = result
            if request == self._request:
                with self.hold_sync():
                    self._show(result)
                    self.refining = ""

    def close(self) -> None:
        """Close the widget and stop its worker (a solve already running finishes, unseen)."""
        self._closed = True
        worker = getattr(self, "_worker", None)  # absent when __init__ failed (close runs from __del__)
        if worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)
        super().close()

    def wait(self, timeout: float | None = None) -> None:
        """Block until every solve asked for so far has finished (tests, scripts)."""
        self._worker.submit(lambda: None).result(timeout)

    @traitlets.observe("export_request")
    def _on_export(self, change: dict[str, Any]) -> None:
        self.export_result = json.dumps(self.export(self.export_path, overwrite=self.export_overwrite))

    def export(self, path: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
        """Write the plan as code, the plan JSON and the offline report beside it.

        What code (`export_as`, or when empty `default_export`): "apply", a snippet whose
        ``applied(model)`` runs `memviz.apply` with the plan JSON (PyTorch's own checkpointing, composing
        with torch.compile, DDP and FSDP2), or "module", the scheduled module's source (`memviz.export`).
        With `verify` (the default) the code first runs one measured step (`memviz.runtime.verify`): a plan
        whose step measured over the budget is re-planned, and the files describe the plan that passed
        (the reply's ``verified_peak_bytes`` and ``message`` say what was measured)."""
        target = Path(path)
        plan_path, report_path = target.with_suffix(".plan.json"), target.with_suffix(".html")
        refusal = refuse_clobber((target, plan_path, report_path), overwrite)
        if refusal:
            return refusal
        kind = self.export_as or self.default_export()
        if kind not in ("apply", "module"):
            return {"ok": False, "message": f"export_as must be 'apply', 'module' or '', not {kind!r}"}
        extra: dict[str, Any] = {"export_as": kind}
        try:
            from memviz.runtime.verify import VerifyWarning

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", VerifyWarning)
                if kind == "apply":
                    final, written, measured = self._export_applied(target, overwrite)
                else:
                    final, written, measured = self._export_module(target, overwrite)
            if measured is not None:
                extra["verified_peak_bytes"] = measured
            notes = [str(w.message) for w in caught if issubclass(w.category, VerifyWarning)]
            if notes:
                extra["message"] = " ".join(notes)
            if not plan_path.exists() or overwrite:
                final.save(plan_path, overwrite=overwrite)
            write_report(final, report_path, overwrite=overwrite)
        except Exception as exc:  # shown to the user in the view, not swallowed
            return {"ok": False, "message": f"{type(exc).__name__}: {exc}", **extra}
        return {"ok": True, "paths": [*written, str(plan_path), str(report_path)], **extra}

    def default_export(self) -> str:
        """"apply" when the shown plan runs as PyTorch checkpointing as it is and its model is at hand,
        else "module"."""
        from memviz.runtime.apply import applies_as_is

        has_model = getattr(self.profile, "model", None) is not None
        return "apply" if has_model and applies_as_is(self.plan) else "module"

    def _export_module(self, target: Path, overwrite: bool) -> tuple[Plan, list[str], int | None]:
        if self.profile is None:
            return self.plan, [], None  # a loaded plan without its model: the JSON and the report
        from memviz.runtime.export import export

        module = export(self.plan, path=target, overwrite=overwrite, verify=self.verify)
        final = getattr(module, "plan", None) or self.plan
        return final, [str(target)], module.verified_peak_bytes if self.verify else None

    def _export_applied(self, target: Path, overwrite: bool) -> tuple[Plan, list[str], int | None]:
        """The "apply" export: another strategy's plan converted to checkpointing first and refused when
        that no longer fits the budget; with `verify`, one measured step of the applied model."""
        from memviz.plans.sac import EXPRESSIBLE, to_sac
        from memviz.runtime.apply import write_applied

        final, measured = self.plan, None
        if final.strategy not in EXPRESSIBLE:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its over-budget warning is the refusal below
                final = to_sac(final)
            if final.budget_bytes is not None and final.peak_bytes > final.budget_bytes:
                raise ValueError(f"the {self.plan.strategy} plan as PyTorch checkpointing peaks at "
                                 f"{final.peak_bytes} bytes, over the budget of {final.budget_bytes}: choose "
                                 "strategy sac, or export it as a module")
        if self.verify:
            from memviz.runtime.verify import verified_apply

            module = verified_apply(final)
            final, measured = module.plan, module.verified_peak_bytes
        write_applied(final, target, overwrite=overwrite)
        return final, [str(target)], measured
