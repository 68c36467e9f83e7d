"""The command line (issue 8 item 9): `memviz demo` and `memviz plan MODULE.py:FACTORY ...`.

One case runs the real console entry point in a subprocess; the rest call `main(argv)` in-process to
stay fast.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memviz.cli import main

ROOT = Path(__file__).resolve().parents[1]

FACTORY = f'''
import importlib.util

_spec = importlib.util.spec_from_file_location("example_models", {str(ROOT / "examples" / "models.py")!r})
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)


def make():
    return _models.gpt(batch=4, seq=64, layers=2)


def small():
    return _models.gpt(batch=2, seq=16, layers=2)


def not_a_pair():
    return 42
'''


@pytest.fixture
def factory(tmp_path: Path) -> Path:
    path = tmp_path / "my_model.py"
    path.write_text(FACTORY)
    return path


def test_plan_subprocess_writes_report_export_and_plan(factory: Path, tmp_path: Path) -> None:
    report, export, plan_out = tmp_path / "r.html", tmp_path / "opt.py", tmp_path / "p.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "memviz.cli", "plan", f"{factory}:make", "--mode", "train",
         "--budget", "50%", "--strategy", "rotor", "--report", str(report), "--export", str(export),
         "--plan-out", str(plan_out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # one progress line per long step, each closed with its wall time
    for step in ("capturing and profiling (train)", "planning (rotor, budget 50%)", "budget frontier",
                 "writing the offline report", "exporting"):
        assert re.search(rf"\[memviz\] {re.escape(step)}.* done in \d+\.\d s", proc.stderr), proc.stderr
    assert "memviz plan [rotor" in proc.stdout
    doc = json.loads(plan_out.read_text())
    assert doc["schema"] == "memviz.plan/3" and doc["strategy"] == "rotor"
    planned, baseline = doc["planned"]["timeline"]["peak_bytes"], doc["baseline"]["timeline"]["peak_bytes"]
    assert planned <= doc["budget_bytes"] < baseline
    assert doc["frontier"], "training plans carry the budget frontier"
    source = export.read_text()
    assert "def forward_steps" in source and "def backward_steps" in source
    assert export.with_suffix(".plan.json").is_file()  # the plan JSON beside the exported source
    html = report.read_text()
    assert not re.search(r"<script[^>]+src=[\"']?https?:", html)
    # the plan it was written for ("created" is stamped each time a plan is serialized)
    assert {**embedded_plan(html), "created": doc["created"]} == doc


def test_demo_writes_offline_report_and_refuses_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo.html"
    assert main(["demo", "--output", str(out)]) == 0
    html = out.read_text()
    assert not re.search(r"<script[^>]+src=[\"']?https?:", html), "the report must open without network"
    assert not re.search(r"<link[^>]+href=[\"']?https?:", html)
    embedded = embedded_plan(html)
    assert embedded["schema"] == "memviz.plan/3"
    assert any(embedded["planned"]["timeline"]["by_category"]["activations"])
    capsys.readouterr()
    before = out.read_bytes()
    assert main(["demo", "--output", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["demo", "--output", str(out), "--overwrite"]) == 0


def test_report_without_built_views_fails_before_profiling(tmp_path: Path, monkeypatch, capsys) -> None:
    import memviz.views.report

    monkeypatch.setattr(memviz.views.report, "BUNDLE", tmp_path / "static" / "report.js")
    out = tmp_path / "demo.html"
    assert main(["demo", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "memviz: error:" in err and "pip install -e ." in err
    assert "capturing" not in err, "it stops before profiling"
    assert not out.exists()


def embedded_plan(html: str) -> dict:
    """The plan document a report embeds for its views (memviz.views.report.render_html)."""
    match = re.search(r'<script type="application/json" id="memviz-plan">(.*?)</script>', html, re.DOTALL)
    assert match, "the report embeds its plan"
    return json.loads(match.group(1))


def _err(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0, err
    assert "memviz: error:" in err
    return err


def test_missing_file(tmp_path: Path, capsys) -> None:
    err = _err(capsys, ["plan", f"{tmp_path / 'absent.py'}:make"])
    assert "no such file" in err and "absent.py" in err


def test_missing_factory(factory: Path, capsys) -> None:
    err = _err(capsys, ["plan", f"{factory}:nope"])
    assert "'nope'" in err


def test_spec_without_factory_name(factory: Path, capsys) -> None:
    assert "MODULE.py:FACTORY" in _err(capsys, ["plan", str(factory)])


def test_factory_returning_wrong_shape(factory: Path, capsys) -> None:
    assert "(model, args)" in _err(capsys, ["plan", f"{factory}:not_a_pair"])


def test_infeasible_budget_reports_the_minimum_plan_marked(factory: Path, tmp_path: Path, capsys) -> None:
    """An infeasible budget still gives the user something (issue 23 item 4): the minimum stated in bytes,
    MiB and as a share of the eager peak, and the report of the minimum-budget plan, marked; exit 3, and
    no export of a plan that misses the budget asked for."""
    report, export = tmp_path / "r.html", tmp_path / "opt.py"
    assert main(["plan", f"{factory}:make", "--budget", "1%", "--strategy", "rotor", "--report", str(report),
                 "--export", str(export)]) == 3
    err = capsys.readouterr().err
    match = re.search(r"smallest feasible budget (?:is|found is) (\d+) bytes \([\d.]+ [KM]iB, [\d.e-]+ GiB, "
                      r"([\d.]+)% of the eager peak\)", err)
    assert match, err
    assert float(match.group(2)) > 1 and "MINIMUM-BUDGET PLAN" in err
    page = report.read_text()
    assert 'role="alert"><strong>MINIMUM-BUDGET PLAN: the requested budget 1% does not fit' in page
    doc = json.loads(re.search(r'id="memviz-plan">(.*?)</script>', page).group(1))
    assert doc["budget_bytes"] == int(match.group(1)) >= doc["planned"]["timeline"]["peak_bytes"]
    assert not export.exists()


def test_version_and_help_for_every_option(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and re.fullmatch(r"memviz \d+\.\d+\.\d+\n", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    for option in ("--mode", "--budget", "--strategy", "--device", "--time-limit", "--report", "--export",
                   "--plan-out", "--overwrite"):
        assert re.search(rf"{option}\b[^\n]*\n?\s+\S", out), option
    assert "SECONDS" in out and "fake:<target>" in out and "h100" in out
    assert re.search(r"without a unit\s+counts bytes", out), "what a bare number means"
    for strategy in ("checkmate", "rotor", "rockmate", "sqrt", "olla", "autochunk"):
        assert re.search(rf"^  {strategy} +\S", out, re.MULTILINE), strategy


def test_unknown_strategy(factory: Path, capsys) -> None:
    assert main(["plan", f"{factory}:make", "--strategy", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "rotor" in err  # names the choices
    assert err.startswith("usage: memviz plan") and "memviz: error: argument --strategy" in err


def test_existing_output_is_untouched_without_overwrite(factory: Path, tmp_path: Path, capsys) -> None:
    existing = tmp_path / "opt.py"
    existing.write_text("# mine\n")
    err = _err(capsys, ["plan", f"{factory}:make", "--budget", "50%", "--export", str(existing)])
    assert "--overwrite" in err and str(existing) in err
    assert existing.read_text() == "# mine\n"


# --- user mistakes (issue 17 item 6): each one exit status 2, one `memviz: error:` line saying what to do, no
# traceback, and everything that can be checked is checked before the model factory runs (so before profiling)
MISTAKES = """
from pathlib import Path

import torch
from torch import nn


def make():
    Path(__file__).with_name("factory-called").touch()
    return nn.Linear(4, 4), (torch.randn(2, 4),)


def not_a_module():
    return 42, (torch.randn(2, 4),)
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(MISTAKES)
    return path


def _mistake(capsys, tiny: Path, argv: list[str], *, factory_runs: bool = False) -> str:
    """Run a mistaken command; its one error line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("memviz: error: ")]
    assert len(lines) == 1, err
    assert (tiny.parent / "factory-called").exists() == factory_runs, "checked before the model is built"
    assert "capturing" not in err, "nothing was profiled"
    return lines[0]


@pytest.mark.parametrize("device, says", [
    ("foo", "use 'cpu', 'cuda', 'neuron', 'xla' or 'fake:<target>'"),
    ("fake:zz", "known targets: a100"),
    ("cuda", "CUDA is not available in this process; use device='cpu'"),
])
def test_unknown_or_unavailable_device(tiny: Path, capsys, device: str, says: str) -> None:
    if device == "cuda" and __import__("torch").cuda.is_available():
        pytest.skip("CUDA is available here")
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--device", device])
    assert f"--device {device}" in line and says in line


@pytest.mark.parametrize("budget, says", [
    ("1e400", "is not a finite number: use bytes as an int, '1.5GiB', '800MB', or '50%'"),
    ("0.5", "is 0.5 bytes: a number without a unit counts bytes; for a fraction of the eager peak "
            "write '50%'"),
    ("0.25B", "is 0.25 bytes: a budget is at least one byte"),
    ("0", "must be positive"),
    ("150%", "must be in (0, 100]"),
    ("5 parsecs", "unknown unit 'parsecs'"),
])
def test_budget_mistakes(tiny: Path, capsys, budget: str, says: str) -> None:
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--budget", budget])
    assert line.startswith("memviz: error: --budget: ") and says in line


def test_demo_checks_its_budget_and_output_first(tmp_path: Path, capsys, monkeypatch) -> None:
    import memviz.demo

    monkeypatch.setattr(memviz.demo, "demo_model", lambda: pytest.fail("the demo model was built"))
    assert main(["demo", "--budget", "1e400", "--output", str(tmp_path / "d.html")]) == 2
    assert "memviz: error: --budget: budget '1e400' is not a finite number" in capsys.readouterr().err
    assert main(["demo", "--output", str(tmp_path)]) == 2
    assert f"memviz: error: --output {tmp_path} is a folder: give a file path" in capsys.readouterr().err


def test_factory_returning_a_non_module(tiny: Path, capsys) -> None:
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:not_a_module"])
    assert "returned a model of type int: the first item must be a torch.nn.Module" in line


@pytest.mark.parametrize("option", ["--report", "--export", "--plan-out"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_output_path_that_is_a_folder(tiny: Path, tmp_path: Path, capsys, option: str,
                                      overwrite: bool) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    argv = ["plan", f"{tiny}:make", option, str(folder), *(["--overwrite"] if overwrite else [])]
    line = _mistake(capsys, tiny, argv)
    assert f"{option} {folder} is a folder: give a file path, e.g. {folder / 'memviz-plan'}" in line
    assert list(folder.iterdir()) == []


def test_output_in_a_read_only_folder(tiny: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user (root?) can write in a read-only folder; see test_output_under_a_file")
        line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--plan-out", str(folder / "sub" / "p.json")])
        assert f"cannot write in {folder} (permission denied); choose a writable folder" in line
    finally:
        folder.chmod(0o755)


def test_output_under_a_file(tiny: Path, tmp_path: Path, capsys) -> None:
    """A folder no user can create files in, whatever the permissions: a path through a regular file."""
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--report", str(tiny / "r.html")])
    assert f"{tiny} is not a folder; choose a path inside a folder" in line


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf", "soon"])
def test_time_limit_must_be_positive_seconds(tiny: Path, capsys, limit: str) -> None:
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--time-limit", limit])
    assert line.startswith("memviz: error: argument --time-limit: must be a positive number of seconds")
    assert f"got '{limit}'" in line


@pytest.mark.parametrize("dangling", [False, True])
def test_report_at_a_symlink_is_not_followed_or_replaced(tiny: Path, tmp_path: Path, capsys,
                                                         dangling: bool) -> None:
    target, link = tmp_path / "theirs.html", tmp_path / "r.html"
    if not dangling:
        target.write_text("theirs")
    link.symlink_to(target)
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--report", str(link)])
    assert f"--report {link} is a symlink; pass --overwrite to replace it" in line
    assert os.readlink(link) == str(target)
    assert target.read_text() == "theirs" if not dangling else not target.exists()


def test_existing_report_is_kept(tiny: Path, tmp_path: Path, capsys) -> None:
    report = tmp_path / "r.html"
    report.write_text("mine")
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--report", str(report)])
    assert f"--report {report} exists; pass --overwrite to replace it" in line
    assert report.read_text() == "mine"


def test_export_plan_json_beside_it_is_checked_too(tiny: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "opt.plan.json").write_text("{}")
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--export", str(tmp_path / "opt.py")])
    assert f"--export {tmp_path / 'opt.plan.json'} exists" in line
    line = _mistake(capsys, tiny, ["plan", f"{tiny}:make", "--export", str(tmp_path / "o.py"),
                                   "--plan-out", str(tmp_path / "o.plan.json")])
    assert "--plan-out and --export would both write" in line


def test_mistake_in_a_real_process_has_no_traceback(tiny: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "memviz.cli", "plan", f"{tiny}:make", "--budget", "0.5"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("memviz: error: --budget: budget '0.5' is 0.5 bytes"), proc.stderr
    assert not (tmp_path / "factory-called").exists()


def _load_snippet(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("applied_snippet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sac_plan_exports_apply_by_default(factory: Path, tmp_path: Path, capsys) -> None:
    """A plan checkpointing runs as it is exports as `memviz.apply` (the plan JSON and a snippet loading
    it), verified by one measured step; --export-as module still writes the scheduled module."""
    import torch

    target = tmp_path / "out" / "opt.py"
    argv = ["plan", f"{factory}:small", "--strategy", "sac", "--budget", "90%", "--export", str(target)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert f"applied plan (memviz.apply): {target}" in out
    assert re.search(r"\[memviz\] applying and verifying \(one measured step\) .*done", err), err
    assert "verified: one step measured" in err
    doc = json.loads(target.with_suffix(".plan.json").read_text())
    assert doc["strategy"] == "sac" and doc["planned"]["timeline"]["recomputes"] > 0
    assert doc["planned"]["timeline"]["peak_bytes"] <= doc["budget_bytes"]
    snippet = _load_snippet(target)
    model, args, kwargs = snippet.load()  # the factory's model, checkpointed as the plan says
    assert kwargs == {} and any("_memviz_sac" in m.__dict__ for m in model.modules())
    reference, ref_args = _load_snippet(factory).small()
    assert list(model.state_dict()) == list(reference.state_dict())
    for m, a in ((model, args), (reference, ref_args)):
        torch.manual_seed(0)
        m(*a).sum().backward()
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=0, msg=name)
    # the same plan as the scheduled module, on request
    module_target = tmp_path / "module.py"
    assert main(["plan", f"{factory}:small", "--strategy", "sac", "--budget", "90%", "--export",
                 str(module_target), "--export-as", "module", "--no-verify"]) == 0
    assert "def forward_steps" in module_target.read_text()
    assert f"exported module: {module_target}" in capsys.readouterr().out


def test_grads_accumulate_reaches_the_plan_file_and_both_exports(factory: Path, tmp_path: Path,
                                                                 capsys) -> None:
    """--grads accumulate profiles a step that holds .grad from its start: the plan JSON carries it and
    its gradients, the apply export verifies it, and so does the scheduled module, whose step adds into
    .grad (before: refused); an auto plan exports as a module by default."""
    target = tmp_path / "opt.py"
    argv = ["plan", f"{factory}:small", "--grads", "accumulate", "--budget", "90%"]
    assert main([*argv, "--strategy", "sac", "--export", str(target)]) == 0
    doc = json.loads(target.with_suffix(".plan.json").read_text())
    assert doc["graph"]["meta"]["grads"] == "accumulate"
    assert any(d["kind"] == "parameter_gradient" and d.get("producer") is None for d in doc["graph"]["datas"])
    assert f"applied plan (memviz.apply): {target}" in capsys.readouterr().out
    module = tmp_path / "m.py"
    assert main([*argv, "--strategy", "sac", "--export", str(module), "--export-as", "module"]) == 0
    assert f"exported module: {module}" in capsys.readouterr().out
    assert "into_grad(" in module.read_text()
    auto = tmp_path / "auto.py"
    assert main([*argv, "--export", str(auto)]) == 0
    assert f"exported module: {auto}" in capsys.readouterr().out
    assert json.loads(auto.with_suffix(".plan.json").read_text())["graph"]["meta"]["grads"] == "accumulate"


def test_apply_export_that_cannot_fit_is_refused(factory: Path, tmp_path: Path, capsys) -> None:
    """--export-as apply on a rotor plan converts it to checkpointing; at 80% of this GPT's eager peak no
    checkpointing plan fits (the smallest "sac" budget is about 87%), so nothing is written."""
    target = tmp_path / "opt.py"
    argv = ["plan", f"{factory}:small", "--strategy", "rotor", "--budget", "80%", "--export", str(target)]
    assert main([*argv, "--export-as", "apply"]) == 2
    err = capsys.readouterr().err
    assert "as PyTorch checkpointing peaks at" in err and "--strategy sac" in err
    assert not target.exists() and not target.with_suffix(".plan.json").exists()
