"""The README's code works exactly as written (issue 23 item 3): every ```python block runs, and every
`memviz ...` command line in it succeeds, in a fresh folder."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from memviz.cli import main
from memviz.demo import demo_model

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
# command lines quoted in the README's prose as `memviz plan ...`
COMMANDS = [c for c in re.findall(r"`(memviz [^`]+)`", README) if c.split()[1] in ("plan", "demo")
            and "MODULE.py" not in c]


def test_the_readme_has_code_to_check() -> None:
    assert PYTHON_BLOCKS and any(c.startswith("memviz plan examples/") for c in COMMANDS), COMMANDS


@pytest.mark.parametrize("block", range(len(PYTHON_BLOCKS)))
def test_python_block_runs_as_written(block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`model` and `x` are the user's: the README's snippet names them; here they are memviz demo's GPT."""
    monkeypatch.chdir(tmp_path)
    model, (x,) = demo_model(batch=2, seq=32)
    exec(compile(PYTHON_BLOCKS[block], f"README.md python block {block}", "exec"), {"model": model, "x": x})


@pytest.mark.parametrize("command", COMMANDS)
def test_command_line_runs_as_written(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    # run from a fresh folder: the README's relative paths into the checkout are the checkout's
    argv = [str(ROOT / a) if (ROOT / a.split(":")[0]).is_file() else a for a in argv]
    assert main(argv) == 0, command
    for flag in ("--report", "--export", "--output", "--plan-out"):
        if flag in argv:
            assert (tmp_path / argv[argv.index(flag) + 1]).is_file(), flag
