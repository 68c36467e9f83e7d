"""Reading and writing plan documents (`memviz.plan/1`).

Plan files are untrusted input: they are parsed as plain JSON (never pickle, never eval), validated
against the JSON Schema shipped in `memviz/schema/plan.schema.json`, and then checked semantically:
the graph must be well formed and both recorded timelines must equal a fresh `solvers.simulate` of
their schedules, so an edited or corrupted file cannot smuggle in a wrong memory claim.
"""

from __future__ import annotations

import json
import os
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from solvers import Graph, GraphError, simulate
from solvers.schedule import steps_from_json

SCHEMA_ID = "memviz.plan/1"
MIME_TYPE = "application/vnd.memviz.plan+json"
#: A plan of a very large model is tens of MB; anything far beyond is not a plan we wrote.
MAX_FILE_BYTES = 1 << 30


class PlanFileError(ValueError):
    """A plan file or document that memviz cannot accept; the message says why and what to do."""


@cache
def plan_schema() -> dict[str, Any]:
    text = resources.files("memviz").joinpath("schema/plan.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON number {name}")


def parse_document(text: str | bytes, source: str = "plan document") -> dict[str, Any]:
    """Parse and validate a plan document; raise PlanFileError with the reason."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PlanFileError(f"{source} is not valid JSON ({exc}); re-create it with plan.save()") from None
    validate_document(doc, source)
    return doc


def validate_document(doc: Any, source: str = "plan document") -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_ID:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise PlanFileError(
            f"{source} is not a {SCHEMA_ID} document (schema: {found!r}); "
            "only plans written by memviz.Plan.save() can be loaded"
        )
    import jsonschema  # here, not at the top: importing it takes ~2 s, a third of `import memviz`

    validator = jsonschema.Draft202012Validator(plan_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(top level)"
        raise PlanFileError(f"{source} does not match {SCHEMA_ID} at {where}: {error.message}")
    try:
        graph = Graph.from_dict(doc["graph"])
        for run in ("baseline", "planned"):
            steps = steps_from_json(doc[run]["schedule"])
            recorded = doc[run]["timeline"]
            # an autochunk plan's baseline runs on the unchunked graph, stored with the run
            run_graph = Graph.from_dict(doc[run]["graph"]) if "graph" in doc[run] else graph
            fresh = simulate(run_graph, steps)
            if fresh.peak_bytes != recorded["peak_bytes"] or list(fresh.step_bytes) != recorded["step_bytes"]:
                raise PlanFileError(
                    f"{source}: the {run} timeline does not match a simulation of its schedule "
                    f"(recorded peak {recorded['peak_bytes']}, simulated {fresh.peak_bytes}); "
                    "the file was edited or corrupted: re-create it with plan.save()"
                )
            if not fresh.valid:
                raise PlanFileError(f"{source}: the {run} schedule is invalid: {fresh.issues[0]}")
    except (GraphError, ValueError, KeyError, TypeError, IndexError) as exc:
        if isinstance(exc, PlanFileError):
            raise
        raise PlanFileError(f"{source}: malformed plan graph or schedule: {exc}") from None
    return doc


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise PlanFileError(f"no plan file at {p}")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise PlanFileError(f"{p} is larger than {MAX_FILE_BYTES} bytes: not a memviz plan")
    return parse_document(p.read_bytes(), str(p))


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
