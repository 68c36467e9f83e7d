"""The package layout (ARCHITECTURE.md, "Package layout"): modules grouped by role, public names intact."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
#: the groups in import order (ARCHITECTURE.md, "Package layout"); the other top-level modules (the package
#: API, the command line) may import any of them
ORDER = ["memviz.budget", "memviz.hardware", "memviz.profiling", "memviz.plans", "memviz.runtime",
         "memviz.parallel", "memviz.views"]


def _run_on_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of `body` that run when the module is imported: not function bodies, not
    ``if TYPE_CHECKING:``."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
            out += _run_on_import(stmt.orelse)
            continue
        out.append(stmt)
        for field in ("body", "orelse", "finalbody"):
            out += _run_on_import(getattr(stmt, field, []))
        for handler in getattr(stmt, "handlers", []):
            out += _run_on_import(handler.body)
    return out


def _top_level_imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """memviz modules `name` imports when it is imported (not inside functions, not under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _run_on_import(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from . import x` in package a.b: a.b; `from .. import x`: a
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + [base]).strip(".")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (ROOT / "memviz").rglob("*.py") if "labextension" not in p.parts}


def test_no_import_cycle_at_import_time() -> None:
    paths = _modules()
    graph = nx.DiGraph()
    for name, path in paths.items():
        graph.add_node(name)
        # a package importing its own child is how a package loads, not a cycle
        graph.add_edges_from((name, t) for t in _top_level_imports(path, name, set(paths))
                             if not (path.name == "__init__.py" and t.startswith(name + ".")) and
                             not name.startswith(t + "."))
    assert list(nx.simple_cycles(graph)) == []


def test_groups_import_only_groups_before_them() -> None:
    """At import time a group's modules import only their own group and the groups before it in `ORDER`."""
    paths = _modules()
    upward = []
    for name, path in paths.items():
        group = ".".join(name.split(".")[:2])
        for target in _top_level_imports(path, name, set(paths)) if group in ORDER else ():
            to = ".".join(target.split(".")[:2])
            if to in ORDER and ORDER.index(to) > ORDER.index(group):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_only_entry_points_stay_flat() -> None:
    flat = sorted(p.stem for p in (ROOT / "memviz").glob("*.py"))
    assert flat == ["__init__", "budget", "cli", "demo", "losses"]


def test_public_names_survive_importing_their_modules() -> None:
    """Importing `memviz.runtime.export` etc. first leaves `memviz.export` the function (a fresh
    interpreter, so the order is real); the documented module paths are the regrouped modules."""
    code = ("import memviz.runtime.export, memviz.runtime.apply, memviz.profiling.profile\n"
            "import memviz\n"
            "assert [f.__module__ for f in (memviz.export, memviz.apply, memviz.profile)] == "
            "['memviz.runtime.export', 'memviz.runtime.apply', 'memviz.profiling.profile']\n"
            "import memviz.plans.chunking, memviz.runtime.verify\n"
            "assert memviz.chunking is memviz.plans.chunking and memviz.verify is memviz.runtime.verify\n"
            "assert callable(memviz.chunking.plan_chunks)\n"
            "assert callable(memviz.losses.chunked_cross_entropy)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr


def test_no_file_holds_merge_conflict_markers() -> None:
    """A merge left ARCHITECTURE.md with both sides of a conflict for two sessions: no tracked text file
    may hold a conflict marker line."""
    patterns = ["*.md", "*.py", "*.ts", "*.tsx", "*.json", "*.toml", "*.yml"]
    tracked = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    markers = ("<<<<<<< ", ">>>>>>> ")
    found = [f"{name}:{i}" for name in tracked if (ROOT / name).is_file()
             for i, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
             if line.startswith(markers)]
    assert not found, found
