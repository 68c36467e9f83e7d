"""memviz: see where a PyTorch model's memory goes, plan it under a budget, export the plan.

`profile`, `export`, `apply`, `backend` and `Planner` import torch and JupyterLab machinery, so they load on
first use; `plan`, `load_plan` and `Plan` are torch-free.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

from memviz.planning import Plan, load_plan, plan

__version__ = "0.1.0"

_LAZY = {
    "profile": ("memviz.profile", "profile"),
    "Profile": ("memviz.profile", "Profile"),
    "export": ("memviz.export", "export"),
    "apply": ("memviz.apply", "apply"),
    "backend": ("memviz.export", "backend"),
    "Planner": ("memviz.widget", "Planner"),
    "ChunkEditor": ("memviz.chunk_editor", "ChunkEditor"),
    "WhatIf": ("memviz.whatif", "WhatIf"),
    "Parallel": ("memviz.distributed", "Parallel"),
}

__all__ = [
    "ChunkEditor", "Parallel", "Plan", "Planner", "Profile", "WhatIf",
    "apply", "backend", "export", "load_plan", "losses", "plan", "profile",
]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the prebuilt extension in a development (editable) install; a wheel
    installs it under share/jupyter/labextensions instead."""
    return [{"src": "labextension", "dest": "jupyterlab-memviz"}]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"memviz.{name}") is not None:
        # `memviz.chunking.plan_chunks(...)` works without importing memviz.chunking first
        return importlib.import_module(f"memviz.{name}")
    raise AttributeError(f"module 'memviz' has no attribute {name!r}")


class _Package(types.ModuleType):
    """`memviz.apply` stays the function when its module is imported first (``from memviz.apply import
    ApplyWarning``): Python's import system sets the package attribute named after a submodule once it
    has loaded it, which would shadow the function of the same name.  (`profile` and `export` are also
    used as modules, ``memviz.export.StalePlanError``, so they are left to Python's rule.)"""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "apply" and isinstance(value, types.ModuleType) and value.__name__ == "memviz.apply":
            value = value.apply
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
