"""memviz: see where a PyTorch model's memory goes, plan it under a budget, export the plan.

`profile`, `export`, `apply`, `backend` and `Planner` import torch and JupyterLab machinery, so they load on
first use; `plan`, `load_plan` and `Plan` are torch-free.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from memviz.plans.planning import Plan, load_plan, plan

__version__ = "0.1.0"

_LAZY = {
    "profile": ("memviz.profiling.profile", "profile"),
    "Profile": ("memviz.profiling.profile", "Profile"),
    "export": ("memviz.runtime.export", "export"),
    "apply": ("memviz.runtime.apply", "apply"),
    "backend": ("memviz.runtime.export", "backend"),
    "Planner": ("memviz.views.widget", "Planner"),
    "ChunkEditor": ("memviz.views.chunk_editor", "ChunkEditor"),
    "WhatIf": ("memviz.views.whatif", "WhatIf"),
    "Parallel": ("memviz.parallel.distributed", "Parallel"),
}

# modules README documents by their path before the regroup: `memviz.chunking.plan_chunks(...)`
_MODULES = {
    "chunking": "memviz.plans.chunking",
    "verify": "memviz.runtime.verify",
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
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if importlib.util.find_spec(f"memviz.{name}") is not None:
        # `memviz.views.widget` works without importing memviz.views first
        return importlib.import_module(f"memviz.{name}")
    raise AttributeError(f"module 'memviz' has no attribute {name!r}")
