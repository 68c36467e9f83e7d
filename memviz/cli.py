"""Command line: `memviz demo` and `memviz plan MODULE.py:FACTORY ...` (DESIGN.md)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from memviz.budget import budget_spec, format_bytes
from memviz.plans.planning import STRATEGIES, budget_frontier, is_training
from solvers.result import InfeasibleBudget


class CliError(Exception):
    pass


class UsageError(CliError):
    """A command line argparse rejects (unknown option, bad choice, bad --time-limit): printed after the
    usage line, exit status 2, like every other mistake."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


class BudgetInfeasible(CliError):
    """The budget does not fit: the minimum-budget plan was reported instead (exit status 3)."""


EXIT_INFEASIBLE = 3
STRATEGY_HELP = {
    "auto": "pick for the graph: reordering when it fits, else the best rematerialization (inference: "
            "then chunking)",
    "none": "PyTorch's own eager order, no plan (the baseline)",
    "checkmate": "Checkmate MILP (HiGHS): optimal recomputation for small graphs, time-limited",
    "checkmate-lp": "Checkmate's LP relaxation with two-phase rounding (faster, near-optimal)",
    "rotor": "Rotor dynamic program over the chain of blocks",
    "rockmate": "Rockmate: per-block MILP option menus + Rotor over the chain (large models)",
    "sqrt": "sqrt(n) checkpointing baseline (Chen et al.)",
    "olla": "OLLA: reorder operators (CP-SAT) and pack addresses, no recomputation",
    "autochunk": "AutoChunk: chunk long-sequence inference activations (inference only)",
}


@contextmanager
def stage(name: str) -> Iterator[None]:
    """One progress line per long step, with its wall time (long steps: capture, solve, export)."""
    print(f"[memviz] {name} ...", end="", flush=True, file=sys.stderr)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        print(" failed", file=sys.stderr)
        raise
    print(f" done in {time.perf_counter() - start:.1f} s", file=sys.stderr)


def load_factory(spec: str) -> Callable[[], Any]:
    """`path/to/file.py:function` -> the function (which returns (model, args) or (model, args, kwargs))."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise CliError(f"expected MODULE.py:FACTORY, got {spec!r}")
    file = Path(path)
    if not file.is_file():
        raise CliError(f"no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"cannot import {file}")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CliError(f"{file} has no callable {name!r}")
    return factory


def model_call(spec: str, made: Any) -> tuple[Any, tuple, dict | None]:
    """The factory's (model, args[, kwargs]) checked: a module, positional args (one non-tuple value is
    the only argument, as `memviz.profile` takes it) and keyword args as a dict."""
    from torch import nn

    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise CliError(f"{spec} must return (model, args) or (model, args, kwargs), got "
                       f"{type(made).__name__}")
    model, args, kwargs = (*made, None) if len(made) == 2 else made
    if not isinstance(model, nn.Module):
        raise CliError(f"{spec} returned a model of type {type(model).__name__}: the first item must be a "
                       "torch.nn.Module, as in (model, args)")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise CliError(f"{spec} returned kwargs of type {type(kwargs).__name__}: the third item must be a "
                       "dict of keyword arguments")
    return model, tuple(args) if isinstance(args, (tuple, list)) else (args,), kwargs


def seconds(text: str) -> float:
    """--time-limit: a positive, finite number of seconds (0, -1 or nan would leave a solver no time or no
    limit at all)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, like 60 or 0.5, got "
                                         f"{text!r}")
    return value


def check_budget(budget: str | None) -> None:
    """Everything about the budget that does not need the eager peak, before any profiling."""
    if budget is not None:
        try:
            budget_spec(budget)
        except ValueError as exc:
            raise CliError(f"--budget: {exc}") from None


def check_device(device: str | None) -> None:
    """A device this process cannot use is refused before the model is even built."""
    if device is not None:
        from memviz.hardware.devices import DeviceUnavailable, named_device

        try:
            named_device(device)
        except DeviceUnavailable as exc:
            raise CliError(f"--device {device}: {exc}") from None


#: a file name to suggest for an output option given a folder
SUFFIX = {"--output": ".html", "--report": ".html", "--export": ".py", "--plan-out": ".json"}


def output_files(outputs: dict[str, Path | None]) -> list[tuple[str, Path]]:
    """(option, file) for every file the output options write (--export also writes its plan JSON beside
    it); two options writing one file are refused."""
    owner: dict[str, str] = {}
    files: list[tuple[str, Path]] = []
    for flag, path in outputs.items():
        if path is None:
            continue
        for target in (path, path.with_suffix(".plan.json")) if flag == "--export" else (path,):
            key = os.path.abspath(target)
            if key in owner:
                raise CliError(f"{flag} and {owner[key]} would both write {target}: give them different "
                               "files")
            owner[key] = flag
            files.append((flag, target))
    return files


def check_output(flag: str, target: Path, overwrite: bool) -> None:
    """`target` can be written as a file: not a folder, not already there (a dangling symlink included)
    unless --overwrite, and its nearest existing folder is a writable folder (missing ones are made)."""
    if target.is_dir() and not target.is_symlink():
        raise CliError(f"{flag} {target} is a folder: give a file path, e.g. "
                       f"{target / ('memviz-plan' + SUFFIX.get(flag, ''))}")
    if os.path.lexists(target) and not overwrite:
        what = "is a symlink" if target.is_symlink() else "exists"
        raise CliError(f"{flag} {target} {what}; pass --overwrite to replace it (a symlink itself is "
                       "replaced, never followed) or choose another path")
    folder = target.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise CliError(f"{flag} {target}: {folder} is not a folder; choose a path inside a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {target}: cannot write in {folder} (permission denied); choose a writable "
                       "folder")


def preflight(*, budget: str | None, device: str | None, outputs: dict[str, Path | None],
              overwrite: bool) -> None:
    """What can be wrong before any work: the budget, the device, every output path.  Checked before the
    model factory runs, so a mistake costs nothing."""
    check_budget(budget)
    check_device(device)
    for flag, target in output_files(outputs):
        check_output(flag, target, overwrite)
    if outputs.get("--report") or outputs.get("--output"):
        from memviz.views.report import require_bundle

        require_bundle()  # an unbuilt checkout fails now, not after minutes of profiling


def run_plan(
    model: Any,
    args: tuple,
    kwargs: dict | None,
    *,
    mode: str,
    budget: str | None,
    strategy: str,
    device: str | None,
    time_limit: float,
    report: Path | None,
    export: Path | None,
    plan_out: Path | None,
    overwrite: bool,
    verify: bool = True,
    export_as: str | None = None,
    factory: str | None = None,
    grads: str = "none",
) -> Any:
    """Profile, plan and write what was asked.  `export_as`: "apply" (the plan JSON and a snippet running
    `memviz.apply` on the user's model: PyTorch's own checkpointing, which composes with torch.compile,
    DDP and FSDP2) or "module" (`memviz.export`'s module source); None picks "apply" when the plan runs
    as checkpointing as it is (`memviz.runtime.apply.applies_as_is`), else "module".  `factory`
    (MODULE.py:NAME) is what the apply snippet's ``load()`` builds."""
    import memviz

    with stage(f"capturing and profiling ({mode})"):
        prof = memviz.profile(model, args, kwargs, mode=mode, device=device, grads=grads)
    print(
        f"[memviz] baseline peak {format_bytes(prof.baseline.peak_bytes)} "
        f"({len(prof.graph.computes)} ops, {len(prof.graph.datas)} tensors)",
        file=sys.stderr,
    )
    notice = None
    try:
        with stage(f"planning ({strategy}, budget {budget or 'none'})"):
            plan = memviz.plan(prof, budget, strategy=strategy, time_limit=time_limit, frontier=False)
    except InfeasibleBudget as exc:
        if exc.minimum_bytes is None:
            raise
        # still give the user something: the plan at the smallest feasible budget, marked as such
        notice = (f"MINIMUM-BUDGET PLAN: the requested budget {budget} does not fit ({exc}). This report "
                  f"shows the plan at the smallest feasible budget instead; nothing was exported.")
        print(f"memviz: {notice}", file=sys.stderr)
        with stage(f"planning ({strategy}, at the minimum {format_bytes(exc.minimum_bytes)})"):
            plan = memviz.plan(prof, exc.minimum_bytes, strategy=strategy, time_limit=time_limit,
                               frontier=False)
        export = None
    if is_training(plan.graph):
        # the frontier re-solves at several budgets: its own progress line so a slow one is visible
        with stage("budget frontier (peak vs time overhead)"):
            plan.frontier = budget_frontier(plan.graph, plan.baseline, time_limit=min(30.0, time_limit))
    applied = export is not None and (export_as or _default_export(plan)) == "apply"
    if applied:
        plan = export_applied(plan, export, factory=factory, overwrite=overwrite, verify=verify)
    elif export is not None:
        # verify: one measured step first; a step over the budget is re-planned, never written.  First,
        # so that the plan file and the report describe the plan the exported module runs
        with stage("exporting and verifying (one measured step)" if verify else "exporting"):
            module = memviz.export(plan, path=export, overwrite=overwrite, verify=verify)
        if verify:
            budget_text = "none" if plan.budget_bytes is None else format_bytes(plan.budget_bytes)
            frontier, plan = plan.frontier, module.plan
            plan.frontier = plan.frontier or frontier
            print(f"verified: one step measured {format_bytes(module.verified_peak_bytes)} "
                  f"(plan {format_bytes(plan.peak_bytes)}, budget {budget_text})", file=sys.stderr)
    print(plan.summary())
    if plan_out is not None:
        plan.save(plan_out, overwrite=overwrite)
        print(f"plan: {plan_out}")
    if report is not None:
        from memviz.views.report import write_report

        with stage("writing the offline report"):
            write_report(plan, report, overwrite=overwrite, command=" ".join(["memviz", *sys.argv[1:]]),
                         notice=notice)
        print(f"report: {report}")
    if export is not None:
        print(f"{'applied plan (memviz.apply)' if applied else 'exported module'}: {export}")
    if notice is not None:
        raise BudgetInfeasible(notice)
    return plan


def _absolute_factory(spec: str) -> str:
    """MODULE.py:NAME with the file's absolute path, so the apply snippet loads it from anywhere."""
    path, _, name = spec.rpartition(":")
    return f"{Path(path).resolve()}:{name}"


def _default_export(plan: Any) -> str:
    from memviz.runtime.apply import applies_as_is

    return "apply" if applies_as_is(plan) else "module"


def export_applied(plan: Any, path: Path, *, factory: str | None, overwrite: bool, verify: bool) -> Any:
    """The "apply" export of `plan` (`memviz.runtime.apply.write_applied`) once it is known to fit: another
    strategy's plan is converted to checkpointing first (`memviz.plans.sac.to_sac`), and refused when that no
    longer fits the budget; with `verify`, one measured step of the applied model (`memviz.runtime.verify`).
    Returns the plan written."""
    import warnings

    from memviz.plans.sac import EXPRESSIBLE, to_sac
    from memviz.runtime.apply import write_applied

    budget_text = "none" if plan.budget_bytes is None else format_bytes(plan.budget_bytes)
    if plan.strategy not in EXPRESSIBLE:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its over-budget warning is this refusal
            converted = to_sac(plan)
        if plan.budget_bytes is not None and converted.peak_bytes > plan.budget_bytes:
            raise CliError(f"the {plan.strategy} plan as PyTorch checkpointing peaks at "
                           f"{format_bytes(converted.peak_bytes)}, over the budget {budget_text}: plan with "
                           "--strategy sac, or export it with --export-as module")
        plan = dataclasses.replace(converted, frontier=plan.frontier)
    with stage("applying and verifying (one measured step)" if verify else "applying"):
        if verify:
            from memviz.runtime.verify import verified_apply

            module = verified_apply(plan)
            frontier, plan = plan.frontier, module.plan
            plan.frontier = plan.frontier or frontier
        write_applied(plan, path, factory=factory, overwrite=overwrite)
    if verify:
        print(f"verified: one step measured {format_bytes(module.verified_peak_bytes)} "
              f"(plan {format_bytes(plan.peak_bytes)}, budget {budget_text})", file=sys.stderr)
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    from memviz import __version__
    from memviz.hardware.devices import TARGETS, DeviceUnavailable

    parser = _Parser(prog="memviz", description="Plan a PyTorch model's memory.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"memviz {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="profile, plan and report a small built-in GPT")
    demo.add_argument("--output", type=Path, default=Path("memviz-demo.html"),
                      help="the offline HTML report to write (default: %(default)s)")
    demo.add_argument("--budget", default="60%", help="budget as in `memviz plan` (default: %(default)s)")
    demo.add_argument("--overwrite", action="store_true", help="replace the report if it exists")
    strategies = "\n".join(f"  {name:13s} {STRATEGY_HELP.get(name, '')}" for name in STRATEGIES)
    p = sub.add_parser("plan", help="plan MODULE.py:FACTORY under a budget",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=f"strategies:\n{strategies}\n\nexit status: 0 planned, 2 error, "
                              f"{EXIT_INFEASIBLE} budget infeasible (the minimum-budget plan is reported)")
    p.add_argument("factory", help="MODULE.py:FACTORY returning (model, args[, kwargs])")
    p.add_argument("--mode", choices=("train", "inference"), default="train",
                   help="train: forward + loss (the outputs' sum) + backward; inference: forward under "
                        "no_grad (default: %(default)s)")
    p.add_argument("--grads", choices=("none", "accumulate"), default="none",
                   help="train: each .grad when the step starts: none (after zero_grad()) or accumulate "
                        "(held all step, backward adds into it: gradient accumulation over micro-batches, or "
                        "zero_grad(set_to_none=False)); exported as apply (default: %(default)s)")
    p.add_argument("--budget", default=None,
                   help="total device bytes: an int, '1.5GiB', '800MB', or '50%%' of the eager peak; a "
                        "number without a unit counts bytes (0.5 is refused: write 50%%) (default: none, the "
                        "eager order)")
    p.add_argument("--strategy", choices=STRATEGIES, default="auto", metavar="STRATEGY",
                   help="how to fit the budget, one of the strategies below (default: %(default)s)")
    p.add_argument("--device", default=None,
                   help="where to profile: cpu, cuda, neuron, xla, or fake:<target> to estimate with no "
                        f"hardware, targets: {', '.join(sorted(TARGETS))} (default: where the model lives)")
    p.add_argument("--time-limit", type=seconds, default=60.0, metavar="SECONDS",
                   help="wall-clock limit for each solver call, a positive number of seconds (default: "
                        "%(default)s)")
    p.add_argument("--report", type=Path, help="write an offline HTML report of the plan (opens from disk)")
    p.add_argument("--export", type=Path,
                   help="write the plan as code (which: --export-as), its JSON beside it (PATH.plan.json)")
    p.add_argument("--export-as", choices=("apply", "module"), default=None,
                   help="apply: a snippet running memviz.apply on your model (PyTorch's own selective "
                        "checkpointing: composes with torch.compile, DDP, FSDP2); module: the scheduled "
                        "module's source (memviz.export: any plan). Default: apply when the plan runs as "
                        "checkpointing as it is (strategy sac or none, training), else module")
    p.add_argument("--no-verify", action="store_true",
                   help="export without running one measured step first (by default a step over the budget "
                        "is re-planned with the measured excess as margin, or refused)")
    p.add_argument("--plan-out", type=Path, help="write the plan JSON")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    try:
        ns = parser.parse_args(argv)
        if ns.command == "demo":
            from memviz.demo import demo_model

            preflight(budget=ns.budget, device=None, outputs={"--output": ns.output}, overwrite=ns.overwrite)
            model, args = demo_model()
            run_plan(
                model,
                args,
                None,
                mode="train",
                budget=ns.budget,
                strategy="auto",
                device="cpu",
                time_limit=30.0,
                report=ns.output,
                export=None,
                plan_out=None,
                overwrite=ns.overwrite,
            )
            return 0
        preflight(budget=ns.budget, device=ns.device, overwrite=ns.overwrite,
                  outputs={"--report": ns.report, "--export": ns.export, "--plan-out": ns.plan_out})
        model, args, kwargs = model_call(ns.factory, load_factory(ns.factory)())
        run_plan(
            model,
            args,
            kwargs,
            mode=ns.mode,
            budget=ns.budget,
            strategy=ns.strategy,
            device=ns.device,
            time_limit=ns.time_limit,
            report=ns.report,
            export=ns.export,
            plan_out=ns.plan_out,
            overwrite=ns.overwrite,
            verify=not ns.no_verify,
            export_as=ns.export_as,
            factory=_absolute_factory(ns.factory),
            grads=ns.grads,
        )
        return 0
    except BudgetInfeasible:
        return EXIT_INFEASIBLE  # what and why is printed already, the report written
    except UsageError as exc:
        print(f"{exc.usage}memviz: error: {exc}", file=sys.stderr)
        return 2
    except (CliError, DeviceUnavailable, OSError, ValueError, TypeError) as exc:
        print(f"memviz: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
