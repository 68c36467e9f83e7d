"""The example notebooks run headless (issue 8 item 10).

Each notebook executes with nbclient in a temporary copy of examples/ (outputs never land in the
repository); a run passes when no cell errors and the notebook's final check printed its OK line.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from memviz.plans.planfile import MIME_TYPE

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

#: notebook -> the line its last self-check prints (each asserts equality / fit before printing it)
NOTEBOOKS = {
    "quickstart.ipynb": "QUICKSTART OK",
    "gpt2_training_budget.ipynb": "GPT2 OK",
    "packing.ipynb": "PACKING OK",
    "long_sequence_chunking.ipynb": "CHUNKING OK",
    "neuron_whatif.ipynb": "NEURON OK",
    "hf_apply_compile.ipynb": "HF APPLY OK",
    "distributed_ranks.ipynb": "DISTRIBUTED OK",
}
#: notebook -> rich outputs it must display: the plan MIME bundle and/or a widget view
DISPLAYS = {
    "quickstart.ipynb": {MIME_TYPE, "application/vnd.jupyter.widget-view+json"},
    "gpt2_training_budget.ipynb": {MIME_TYPE},
    "packing.ipynb": {MIME_TYPE},
    "long_sequence_chunking.ipynb": {"application/vnd.jupyter.widget-view+json"},
    "neuron_whatif.ipynb": {"application/vnd.jupyter.widget-view+json"},
    "hf_apply_compile.ipynb": {MIME_TYPE},
    "distributed_ranks.ipynb": {MIME_TYPE, "application/vnd.jupyter.widget-view+json"},
}
TIMEOUT_S = 180  # per cell; each notebook takes <= 60 s unloaded


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")


def test_every_notebook_is_listed_and_stored_without_outputs() -> None:
    assert {p.name for p in EXAMPLES.glob("*.ipynb")} == set(NOTEBOOKS)
    for name in NOTEBOOKS:
        book = nbformat.read(EXAMPLES / name, as_version=4)
        for cell in book.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{name}: clear outputs first"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "examples"
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    book = nbformat.read(work / name, as_version=4)
    env_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", env_path)  # the kernel imports memviz/solvers from this checkout
    client = NotebookClient(
        book, timeout=TIMEOUT_S, kernel_name="python3", store_widget_state=False,
        resources={"metadata": {"path": str(work)}},
    )
    client.execute()
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    assert NOTEBOOKS[name] in _stdout(book.cells[-1]), _stdout(book.cells[-1])
    shown = {mime for c in book.cells for o in c.get("outputs", []) for mime in o.get("data", {})}
    assert DISPLAYS[name] <= shown, DISPLAYS[name] - shown
