"""`memviz.Planner`: the JupyterLab widget.  Python owns every plan; the view only draws the plan
document it is sent (`plan_json`) and reports what the user did (slider index, strategy, export).

The slider walks the budget frontier.  Plans for frontier budgets are solved once and cached, so a
drag that returns to a budget re-renders without solving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from memviz.planning import Plan, plan
from memviz.report import write_report
from solvers.result import InfeasibleBudget

MODULE_NAME = "jupyterlab-memviz"
MODULE_VERSION = "^0.1.0"


def refuse_clobber(paths: tuple[Path, ...], overwrite: bool) -> dict[str, Any] | None:
    """The export reply when some of `paths` exist and the user has not confirmed overwriting them."""
    clashes = [str(p) for p in paths if p.exists()]
    if not clashes or overwrite:
        return None
    message = f"{', '.join(clashes)} already exist: confirm to overwrite"
    return {"ok": False, "exists": clashes, "message": message}


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

    plan_json = traitlets.Unicode("").tag(sync=True)
    budget_index = traitlets.Int(-1).tag(sync=True)
    strategy = traitlets.Unicode("auto").tag(sync=True)
    status = traitlets.Unicode("").tag(sync=True)
    export_path = traitlets.Unicode("memviz_export/model_opt.py").tag(sync=True)
    export_overwrite = traitlets.Bool(False).tag(sync=True)
    export_request = traitlets.Int(0).tag(sync=True)
    export_result = traitlets.Unicode("").tag(sync=True)

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
        self._cache: dict[tuple[str, int], Plan] = {}
        self.strategy = strategy
        self._show(self.plan)

    @staticmethod
    def _profile_of(source: Any, args: tuple | None, mode: str) -> Any:
        if isinstance(source, Plan):
            return source.profile
        if hasattr(source, "graph") and hasattr(source, "baseline"):
            return source
        from memviz.profile import profile

        if args is None:
            raise TypeError("Planner(model, args): pass the model's example inputs")
        return profile(source, args, mode=mode)

    def _show(self, p: Plan) -> None:
        doc = p.to_dict()
        doc["frontier"] = self._frontier
        self.plan = p
        self.plan_json = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        self.status = p.summary()

    def replan(self, budget: Any, strategy: str | None = None) -> Plan:
        source = self.profile if self.profile is not None else self.plan.graph
        key_strategy = strategy or self.strategy
        result = plan(source, budget, strategy=key_strategy, time_limit=self._time_limit, frontier=False)
        self._show(result)
        return result

    @traitlets.observe("budget_index", "strategy")
    def _on_change(self, change: dict[str, Any]) -> None:
        if not self._frontier or not 0 <= self.budget_index < len(self._frontier):
            return
        budget = self._frontier[self.budget_index]["budget_bytes"]
        key = (self.strategy, budget)
        try:
            if key not in self._cache:
                source = self.profile if self.profile is not None else self.plan.graph
                self._cache[key] = plan(
                    source, budget, strategy=self.strategy, time_limit=self._time_limit, frontier=False
                )
            self._show(self._cache[key])
        except (InfeasibleBudget, ValueError) as exc:
            self.status = f"error: {exc}"

    @traitlets.observe("export_request")
    def _on_export(self, change: dict[str, Any]) -> None:
        self.export_result = json.dumps(self.export(self.export_path, overwrite=self.export_overwrite))

    def export(self, path: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
        """Write the optimized module source, the plan JSON and the offline report beside it."""
        target = Path(path)
        plan_path, report_path = target.with_suffix(".plan.json"), target.with_suffix(".html")
        refusal = refuse_clobber((target, plan_path, report_path), overwrite)
        if refusal:
            return refusal
        try:
            if self.profile is not None:
                from memviz.export import export

                export(self.plan, path=target, overwrite=overwrite)
                written = [str(target)]
            else:
                written = []
            if not plan_path.exists() or overwrite:
                self.plan.save(plan_path, overwrite=overwrite)
            write_report(self.plan, report_path, overwrite=overwrite)
        except Exception as exc:  # shown to the user in the view, not swallowed
            return {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "paths": [*written, str(plan_path), str(report_path)]}
