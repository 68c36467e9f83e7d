"""Reading and writing plan documents (`memviz.plan/3`; `memviz.plan/1` and `/2` files still load).

Plan files are untrusted input: they are parsed as plain JSON (never pickle, never eval), validated
against the JSON Schema shipped in `memviz/schema/plan.schema.json`, and then checked semantically:
the graph must be well formed and both recorded timelines must equal a fresh `solvers.simulate` of
their schedules, so an edited or corrupted file cannot smuggle in a wrong memory claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import tempfile
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from memviz.plans.schema_fast import MAX_INT, ColumnsByPath, bad_text, stripped, values_acceptable
from solvers import Graph, GraphError, Timeline, simulate
from solvers.result import SolverStats
from solvers.schedule import Schedule, steps_from_columns, steps_from_json

#: the version written; 2 added the graph's ``meta.module_classes`` (module path -> class name), 3 its
#: ``meta.autocast`` (the ``torch.autocast`` regions the step was profiled in, which a verifying step enters):
#: a reader of version 2 would drop them and verify in its caller's precision, so the version says it
SCHEMA_ID = "memviz.plan/3"
#: the versions read: a version 1 file is a version 2 file without module classes, a version 2 file one
#: without autocast regions (verified in the caller's autocast state, as before version 3)
READABLE_SCHEMAS = ("memviz.plan/1", "memviz.plan/2", SCHEMA_ID)
MIME_TYPE = "application/vnd.memviz.plan+json"
#: A plan of a very large model is tens of MB; anything far beyond is not a plan we wrote.
MAX_FILE_BYTES = 1 << 30


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: parsing and checking a plan allocates millions of acyclic
    containers, and the collections they trigger cost a third of loading a large plan.

    What survives the block (a loaded plan: 100k-node graph, schedules) is long-lived, so it goes straight
    to the oldest generation: `gc.freeze()` then `gc.unfreeze()` moves every tracked object there at once
    (a list splice), where the first young collection after the block would walk all of it (a tenth of a
    100k-step load) and the middle one again.  Not when the program froze objects itself: unfreezing
    would release its own."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


class PlanFileError(ValueError):
    """A plan file or document that memviz cannot accept; the message says why and what to do."""


@cache
def plan_schema() -> dict[str, Any]:
    text = resources.files("memviz").joinpath("schema/plan.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON number {name}")


def _loads(text: str | bytes) -> Any:
    """`json.loads(text)` refusing NaN and Infinity, through msgspec's decoder where it accepts the
    text: twice as fast on a 40 MB plan, and on text it accepts it builds the same values (integers of
    any size included).  It accepts less than json.loads (no 1e999, no lone surrogate, no BOM, no
    NaN): whatever it refuses is parsed by json.loads, which gives the value or the error as before."""
    if type(text) in (bytes, str):
        try:
            return msgspec.json.decode(text)
        except (ValueError, RecursionError):  # msgspec's DecodeError is a ValueError
            pass
    return json.loads(text, parse_constant=_reject_constant)


def parse_document(text: str | bytes, source: str = "plan document", *,
                   validate: bool = True) -> dict[str, Any]:
    """Parse and (unless `validate=False`: the caller validates, once) validate a plan document; raise
    PlanFileError with the reason."""
    try:
        doc = _loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PlanFileError(f"{source} is not valid JSON ({exc}); re-create it with plan.save()") from None
    if validate:
        validate_document(doc, source)
    return doc


def check_values(doc: Any, source: str = "plan document") -> None:
    """Refuse values valid JSON allows but no writer can take back: integers beyond 64 bits, floats
    that overflowed to infinity (``1e999`` parses as inf), strings with a NUL or a lone surrogate
    (``"\\ud800"`` parses, but cannot be encoded as UTF-8).  The error names the JSON path."""
    if values_acceptable(doc):
        return
    # there is a bad value: walk again, keeping paths, to name the first in document order
    stack: list[tuple[Any, Any]] = [(doc, None)]  # (value, path as a linked list (parent, key))
    while stack:
        value, path = stack.pop()
        t = type(value)
        why = None
        # children pushed in reverse, so the first bad value in document order is the one reported
        if t is dict:
            bad = next((k for k in value if type(k) is str and bad_text(k)), None)
            if bad is not None:
                why = f"key {ascii(bad)}: {bad_text(bad)}"
            stack.extend((v, (path, k)) for k, v in reversed(value.items()))
        elif t is list:
            if set(map(type, value)) == {int} and -MAX_INT <= min(value) and max(value) <= MAX_INT:
                continue  # a list of integers in range (byte counts per step, ids): no item to report
            stack.extend((value[i], (path, i)) for i in range(len(value) - 1, -1, -1))
        elif t is int:
            if not -MAX_INT <= value <= MAX_INT:
                why = "integer out of range (more than 64 bits)"
        elif t is float:
            if not math.isfinite(value):
                why = "number out of range (not finite)"
        elif t is str:
            why = bad_text(value)
        if why is not None:
            raise PlanFileError(f"{source} has a value memviz cannot accept at {_json_path(path)}: {why}; "
                                "re-create it with plan.save()")


def _json_path(path: Any) -> str:
    keys = []
    while path is not None:
        path, key = path
        keys.append(str(key))
    return "/".join(reversed(keys)) or "(top level)"


def _schema_errors(doc: dict[str, Any], source: str, columns: ColumnsByPath | None = None) -> None:
    """Refuse a value `check_values` refuses, then anything the schema refuses (in that order).  The long
    arrays read column by column leave their columns in `columns` (see `stripped`)."""
    import jsonschema  # here, not at the top: importing it takes ~2 s, a third of `import memviz`

    # the long arrays of identical items are checked column by column (schema and values, linear time)
    # and emptied in a copy; the value check and jsonschema see the rest, and every array the fast path
    # does not fully accept, so they find the same first error, at the same path, as on `doc` itself
    light = stripped(doc, plan_schema(), columns=columns)
    check_values(light, source)
    validator = jsonschema.Draft202012Validator(plan_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(light))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(top level)"
        raise PlanFileError(f"{source} does not match {SCHEMA_ID} at {where}: {error.message}")


def validate_document(doc: Any, source: str = "plan document") -> dict[str, Any]:
    """Check `doc` (schema, values, graph, re-simulated timelines); return it, or raise PlanFileError."""
    checked_runs(doc, source)
    return doc


def checked_runs(doc: Any, source: str = "plan document") -> dict[str, tuple[Graph, Schedule, Timeline]]:
    """Validate `doc` once and return what validating built: per run ("baseline", "planned") the graph
    it runs on, its schedule and its fresh simulation -- so loading a plan need not rebuild them."""
    if not isinstance(doc, dict) or doc.get("schema") not in READABLE_SCHEMAS:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise PlanFileError(
            f"{source} is not a {SCHEMA_ID} document (schema: {ascii(found)}); "
            "only plans written by memviz.Plan.save() can be loaded"
        )
    columns: ColumnsByPath = {}  # the graphs' and schedules' columns, as the schema check read them
    _schema_errors(doc, source, columns)
    unknown = sorted(set(doc["solver_stats"]) - {f.name for f in dataclasses.fields(SolverStats)})
    if unknown:
        raise PlanFileError(f"{source} has an unknown key at solver_stats/{ascii(unknown[0])[1:-1]}: "
                            f"known keys are {[f.name for f in dataclasses.fields(SolverStats)]}")
    runs: dict[str, tuple[Graph, Schedule, Timeline]] = {}
    try:
        graph = _graph(doc["graph"], columns, "graph")
        for run in ("baseline", "planned"):
            read = columns.get((run, "schedule"))  # (ops, node ids)
            steps = (steps_from_json(doc[run]["schedule"]) if read is None
                     else steps_from_columns(read[0], read[1]))
            recorded = doc[run]["timeline"]
            # an autochunk plan's baseline runs on the unchunked graph, stored with the run
            run_graph = _graph(doc[run]["graph"], columns, run, "graph") if "graph" in doc[run] else graph
            fresh = simulate(run_graph, steps)
            if fresh.peak_bytes != recorded["peak_bytes"] or list(fresh.step_bytes) != recorded["step_bytes"]:
                raise PlanFileError(
                    f"{source}: the {run} timeline does not match a simulation of its schedule "
                    f"(recorded peak {recorded['peak_bytes']}, simulated {fresh.peak_bytes}); "
                    "the file was edited or corrupted: re-create it with plan.save()"
                )
            if not fresh.valid:
                raise PlanFileError(f"{source}: the {run} schedule is invalid: {fresh.issues[0]}")
            runs[run] = (run_graph, steps, fresh)
    except (GraphError, ValueError, KeyError, TypeError, IndexError, OverflowError) as exc:
        if isinstance(exc, PlanFileError):
            raise
        raise PlanFileError(f"{source}: malformed plan graph or schedule: {exc}") from None
    return runs


def _graph(obj: dict[str, Any], columns: ColumnsByPath, *path: str) -> Graph:
    """The graph of `obj`, at `path` in its document, from the node columns the schema check read."""
    read = {key: columns[(*path, key)] for key in ("computes", "datas") if (*path, key) in columns}
    return Graph.from_dict(obj, columns=read)


def read_document(path: str | os.PathLike[str], *, validate: bool = True) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise PlanFileError(f"no plan file at {p}")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise PlanFileError(f"{p} is larger than {MAX_FILE_BYTES} bytes: not a memviz plan")
    return parse_document(p.read_bytes(), str(p), validate=validate)


def write_document(doc: dict[str, Any], path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write atomically.  Without `overwrite`, an existing file is never replaced (FileExistsError)."""
    return write_text_safely(Path(path), document_text(doc, "plan to save"), overwrite=overwrite)


def document_text(doc: dict[str, Any], source: str = "plan document") -> str:
    """The validated document as standard JSON text (no NaN or Infinity)."""
    validate_document(doc, source)
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_safely(target: Path, text: str, *, overwrite: bool = False) -> Path:
    """Write through a temporary file in the same folder; link it into place so that, unless asked
    to overwrite, an existing user file can never be clobbered (even by a concurrent writer)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the user's usual mode
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise FileExistsError(f"{target} exists; pass overwrite=True to replace it") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
