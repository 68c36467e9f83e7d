"""Untrusted names and plan files (issue 17): nothing a model or a plan file names can run code, crash a
writer, or silently change what an exported module computes."""

from __future__ import annotations

import builtins
import copy
import dataclasses
import json

import pytest
import torch
from torch import nn

import memviz
from examples.models import mlp
from memviz.profiling.profile import profile
from memviz.runtime.export import export, load_source, program_source
from solvers import Graph

# The payload sets a builtin: if any generated line runs it, `builtins.memviz_pwned` exists afterwards.
PAYLOAD = "__import__('builtins').__setattr__('memviz_pwned', 1)"
# Ways out of a comment, a docstring or a string literal, each followed by the payload on its own line.
BREAKOUTS = {
    "newline": "\n{p}\n#",
    "newline-indented": "\n    {p}\n    #",  # comments inside the step functions sit at this depth
    "cr": "\r{p}\r#",
    "crlf": "\r\n{p}\r\n#",
    "u2028": "\u2028{p}\u2028#",
    "nel": "\x85{p}\x85#",
    "formfeed": "\x0c\n{p}\n#",
    "triple-double": '"""\n{p}\n"""',
    "triple-single": "'''\n{p}\n'''",
    "single-quote": "'\n{p}\n'",
    "double-quote": '"\n{p}\n"',
    "backslash": "\\\n{p}\n#\\",
    "nul": "\x00\n{p}\n#",
}
EVERY_BREAKOUT = "".join(b.format(p=PAYLOAD) for b in BREAKOUTS.values())


@pytest.fixture(autouse=True)
def _no_payload_ran():
    """Every test here ends by asserting the payload never ran, whatever the test checked itself."""
    if hasattr(builtins, "memviz_pwned"):
        delattr(builtins, "memviz_pwned")
    yield
    ran = hasattr(builtins, "memviz_pwned")
    if ran:
        delattr(builtins, "memviz_pwned")
    assert not ran, "a name from the model or the plan file ran as code"


@pytest.fixture(scope="module")
def profiled():
    model, args = mlp(batch=4, d_in=8, hidden=16, d_out=4, layers=2, dtype=torch.float64)
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    return model, args, prof


def _step(module: nn.Module, args: tuple) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = module(*args)
    out.sum().backward()
    grads = [p.grad.clone() for p in module.parameters()]
    for p in module.parameters():
        p.grad = None
    return out.detach(), grads


def _hostile_plan(plan: memviz.Plan, fields: dict[str, str]) -> memviz.Plan:
    """`plan` with each named field replaced by hostile text: graph.name, strategy, every compute's op,
    module and source, the names of computes the capture does not run (synthetic loss nodes; the others
    are checked against the FX graph), and every data name."""
    g = plan.graph.to_dict()
    captured = plan.profile.captured
    if "graph.name" in fields:
        g["name"] = fields["graph.name"]
    for c in g["computes"]:
        for key in ("op", "module", "source"):
            if f"compute.{key}" in fields:
                c[key] = fields[f"compute.{key}"]
        synthetic = c["id"] >= len(captured.compute_fx) or captured.compute_fx[c["id"]] is None
        if "compute.name" in fields and synthetic:
            c["name"] = fields["compute.name"]
    if "data.name" in fields:
        for d in g["datas"]:
            if d["kind"] != "input":  # "input<i>" names the flat input a loaded plan re-traces with
                d["name"] = fields["data.name"]
    return dataclasses.replace(plan, graph=Graph.from_dict(g), strategy=fields.get("strategy", plan.strategy))


FIELDS = ("graph.name", "strategy", "compute.op", "compute.module", "compute.source", "compute.name",
          "data.name")


def _run_generated(tmp_path, model, args, plan) -> None:
    """Write the plan's source, import it with load_source and train one step: outputs and gradients
    equal the original model's (so the names changed nothing the code does)."""
    exported = export(plan)
    source = program_source(exported.program, plan)
    assert source.isascii()  # no line separator of any kind can hide in it
    target = tmp_path / "generated.py"
    target.write_text(source, encoding="utf-8")
    loaded = load_source(target, model, plan=plan)
    assert loaded._generated.MODEL == plan.graph.name  # the name survives, as data
    assert loaded._generated.STRATEGY == plan.strategy
    original = copy.deepcopy(model)
    out_a, grads_a = _step(original, args)
    out_b, grads_b = _step(loaded, args)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


@pytest.mark.parametrize("breakout", sorted(BREAKOUTS))
def test_generated_source_escapes_every_field(tmp_path, profiled, breakout):
    """One way out, tried through every field at once."""
    model, args, prof = profiled
    hostile = BREAKOUTS[breakout].format(p=PAYLOAD)
    plan = _hostile_plan(memviz.plan(prof, frontier=False, packing=False), dict.fromkeys(FIELDS, hostile))
    _run_generated(tmp_path, model, args, plan)


@pytest.mark.parametrize("field", FIELDS)
def test_generated_source_escapes_each_field(tmp_path, profiled, field):
    """Every way out at once, through one field."""
    model, args, prof = profiled
    plan = _hostile_plan(memviz.plan(prof, frontier=False, packing=False), {field: EVERY_BREAKOUT})
    _run_generated(tmp_path, model, args, plan)


def test_hostile_model_class_name(tmp_path):
    """The model's class name becomes the graph's name at capture."""
    base, args = mlp(batch=4, d_in=8, hidden=16, d_out=4, layers=2, dtype=torch.float64)
    hostile_cls = type(EVERY_BREAKOUT.replace("\x00", ""), (type(base),), {})
    model = copy.deepcopy(base)
    model.__class__ = hostile_cls
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    plan = memviz.plan(prof, frontier=False, packing=False)
    assert plan.graph.name == hostile_cls.__name__
    target = tmp_path / "sub" / "planned.py"
    export(plan, path=target)
    loaded = load_source(target, model)  # the plan JSON written beside it, loaded back
    out_a, _ = _step(copy.deepcopy(base), args)
    out_b, _ = _step(loaded, args)
    assert torch.equal(out_a, out_b)


def test_hostile_names_from_a_plan_file(tmp_path, profiled):
    """Names that travel through a saved plan file: strategy, graph name, data names, module, source."""
    model, args, prof = profiled
    hostile = EVERY_BREAKOUT.replace("\x00", "")  # a NUL is refused in plan files (below)
    fields = {k: hostile for k in ("graph.name", "strategy", "data.name", "compute.module", "compute.source")}
    plan = _hostile_plan(memviz.plan(prof, frontier=False, packing=False), fields)
    plan.save(tmp_path / "plan.json")
    loaded = memviz.load_plan(tmp_path / "plan.json")
    assert loaded.strategy == hostile and loaded.graph.name == hostile
    export(loaded, tmp_path / "planned.py", model=model)
    run = load_source(tmp_path / "planned.py", model)
    out_a, _ = _step(copy.deepcopy(model), args)
    out_b, _ = _step(run, args)
    assert torch.equal(out_a, out_b)
    assert json.loads((tmp_path / "planned.plan.json").read_text())["strategy"] == hostile


# --- item 6: export(path=) writes like save and report ------------------------------------------------
def test_export_path_creates_folders_and_replaces_symlinks_without_following(tmp_path, profiled):
    model, _, prof = profiled
    plan = memviz.plan(prof, frontier=False, packing=False)
    victim = tmp_path / "victim.py"
    victim.write_text("keep me")
    target = tmp_path / "a" / "b" / "planned.py"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    with pytest.raises(FileExistsError):
        export(plan, target)  # a symlink (even to a file elsewhere) is an existing file
    dangling = tmp_path / "c" / "planned.py"
    dangling.parent.mkdir()
    dangling.symlink_to(tmp_path / "nowhere.py")
    with pytest.raises(FileExistsError):
        export(plan, dangling)
    assert not (tmp_path / "nowhere.py").exists()
    export(plan, target, overwrite=True)
    assert victim.read_text() == "keep me" and not target.is_symlink()
    assert "def forward_steps" in target.read_text()
    fresh = tmp_path / "new" / "deeper" / "planned.py"
    export(plan, fresh)
    assert fresh.is_file() and fresh.with_suffix(".plan.json").is_file()


def test_export_path_leaves_nothing_when_the_plan_json_fails(tmp_path, profiled):
    _, _, prof = profiled
    plan = memviz.plan(prof, frontier=False, packing=False)
    target = tmp_path / "planned.py"
    target.with_suffix(".plan.json").mkdir()  # the second file cannot be written
    with pytest.raises(OSError):
        export(plan, target, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["planned.plan.json"]  # no source, no temporary


# --- item 2: DOT from a document is never shown ---------------------------------------------------------
def test_report_rebuilds_the_cdgraph_from_the_validated_graph(tmp_path, monkeypatch, profiled):
    from memviz.views import report

    fake = tmp_path / "report.js"
    fake.write_text("var memvizReport = {};")
    monkeypatch.setattr(report, "BUNDLE", fake)
    _, _, prof = profiled
    doc = memviz.plan(prof, frontier=False, packing=False).to_dict()
    honest = doc["cdgraph"]
    hostile = 'digraph g { n [URL="javascript:alert(1)", href="javascript:alert(2)", image="/etc/passwd"] }'
    doc["cdgraph"] = {"dot": hostile, "collapsed_dot": hostile, "nodes": 1}
    page = report.write_report(doc, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "javascript:" not in page and "passwd" not in page
    assert report.trusted_document(doc)["cdgraph"] == honest


# --- item 3: an edited but self-consistent plan file is refused on export -------------------------------
def _edited(plan: memviz.Plan, g: dict) -> memviz.Plan:
    """`plan` on the edited graph `g`, its timelines simulated again: the file it saves validates."""
    from solvers import simulate

    graph = Graph.from_dict(g)
    return dataclasses.replace(plan, graph=graph, timeline=simulate(graph, plan.schedule),
                               baseline=simulate(graph, plan.baseline_schedule))


def _refused(tmp_path, model, plan: memviz.Plan, match: str) -> None:
    path = plan.save(tmp_path / "edited.json", overwrite=True)
    loaded = memviz.load_plan(path)  # self-consistent: the file itself is accepted
    with pytest.raises(memviz.runtime.export.StalePlanError, match=match):
        export(loaded, model=model)


def test_dropped_parameter_gradient_is_refused(tmp_path, profiled):
    model, _, prof = profiled
    plan = memviz.plan(prof, frontier=False, packing=False)
    g = plan.graph.to_dict()
    grad = next(d for d in g["datas"] if d["kind"] == "parameter_gradient")
    g["outputs"] = [d for d in g["outputs"] if d != grad["id"]]
    match = rf"parameter gradient data node {grad['id']} .* not a plan output"
    _refused(tmp_path, model, _edited(plan, g), match)


def test_shrunk_activations_are_refused(tmp_path, profiled):
    model, _, prof = profiled
    plan = memviz.plan(prof, frontier=False, packing=False)
    g = plan.graph.to_dict()
    for d in g["datas"]:
        if d["kind"] not in ("parameter", "buffer", "input", "parameter_gradient"):
            d["bytes"] = 1
    edited = _edited(plan, g)
    assert edited.peak_bytes < plan.peak_bytes
    _refused(tmp_path, model, edited, r"has bytes 1 in the plan but \d+ in the capture")


@pytest.mark.parametrize(("what", "edit", "match"), [
    ("op", lambda g: g["computes"][0].update(op="aten.relu"), "has op 'aten.relu'"),
    ("dtype", lambda g: g["datas"][-1].update(dtype="float16"), "has dtype 'float16'"),
    ("shape", lambda g: g["datas"][-1].update(shape=[1]), r"has shape \(1,\)"),
])
def test_other_edits_are_refused(tmp_path, profiled, what, edit, match):
    model, _, prof = profiled
    plan = memviz.plan(prof, frontier=False, packing=False)
    g = plan.graph.to_dict()
    edit(g)
    _refused(tmp_path, model, _edited(plan, g), match)


def test_untouched_plan_file_still_exports(tmp_path, profiled):
    model, args, prof = profiled
    plan = memviz.plan(prof, frontier=False, packing=False)
    loaded = memviz.load_plan(plan.save(tmp_path / "plan.json"))
    out_a, grads_a = _step(copy.deepcopy(model), args)
    out_b, grads_b = _step(export(loaded, model=copy.deepcopy(model)), args)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


# --- item 4: values JSON allows but no writer can take back ----------------------------------------------
@pytest.fixture()
def tiny_doc():
    from solvers import GraphBuilder, Phase

    b = GraphBuilder("tiny")
    w, x = b.data("w", 64, "parameter"), b.data("x", 32, "input")
    a, loss = b.data("a", 128, "activation"), b.data("loss", 4, "output")
    gw = b.data("gw", 64, "parameter_gradient")
    b.compute("f", [x, w], [a], time=1.0)
    b.compute("loss", [a], [loss], time=0.1)
    b.compute("bw", [a, loss, x], [gw], time=1.0, phase=Phase.BACKWARD)
    b.outputs = [loss, gw]
    return memviz.plan(b.build(), frontier=False, packing=False).to_dict()


def _load_text(tmp_path, text: str) -> memviz.Plan:
    path = tmp_path / "edited.json"
    path.write_text(text, encoding="utf-8")
    return memviz.load_plan(path)


@pytest.mark.parametrize(("where", "edit", "raw"), [
    ("solver_stats/bogus", lambda d: d["solver_stats"].update(bogus=1), None),
    ("budget_bytes", lambda d: d.update(budget_bytes=10**400), None),
    ("graph/computes/0/time", lambda d: d["graph"]["computes"][0].update(time=1.5), ("1.5", "1e999")),
    ("model/name", lambda d: d["model"].update(name="m\ud800"), None),
    ("graph/datas/2/name", lambda d: d["graph"]["datas"][2].update(name="a\x00b"), None),
    ("device/name", lambda d: d["device"].update(name="\udfff"), None),
])
def test_edge_values_are_plan_file_errors_naming_the_path(tmp_path, tiny_doc, where, edit, raw):
    from memviz.plans.planfile import PlanFileError

    edit(tiny_doc)
    text = json.dumps(tiny_doc)  # ensure_ascii: the surrogate and NUL travel as \\u escapes
    if raw is not None:
        text = text.replace(f'"time": {raw[0]}', f'"time": {raw[1]}', 1)
    with pytest.raises(PlanFileError, match=f"at {where}"):
        _load_text(tmp_path, text)
    with pytest.raises(PlanFileError, match=f"at {where}"):
        memviz.Plan.from_dict(json.loads(text))


def test_save_and_report_refuse_what_they_cannot_write(tmp_path, monkeypatch, tiny_doc):
    from memviz.plans.planfile import PlanFileError
    from memviz.views import report

    fake = tmp_path / "report.js"
    fake.write_text("var memvizReport = {};")
    monkeypatch.setattr(report, "BUNDLE", fake)
    plan = memviz.Plan.from_dict(tiny_doc)
    inf = dataclasses.replace(plan, budget_bytes=float("inf"))
    with pytest.raises(PlanFileError, match="at budget_bytes"):
        inf.save(tmp_path / "inf.json")
    odd = dataclasses.replace(plan, model={**plan.model, "name": "x\ud800"})
    with pytest.raises(PlanFileError, match="at model/name"):
        report.write_report(odd, tmp_path / "odd.html")
    with pytest.raises(PlanFileError, match="at model/name"):
        odd.save(tmp_path / "odd.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.js"]
    plan.save(tmp_path / "ok.json")
    text = (tmp_path / "ok.json").read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text


# --- item 5: a plan is validated once on load ---------------------------------------------------------------
def test_loading_validates_and_simulates_once(tmp_path, monkeypatch):
    from memviz.plans import planfile, planning
    from solvers import GraphBuilder

    b = GraphBuilder("chain")
    prev = b.data("x", 32, "input")
    for i in range(1500):
        a = b.data(f"a{i}", 64, "activation")
        b.compute(f"f{i}", [prev], [a], time=1.0)
        prev = a
    b.outputs = [prev]
    plan = memviz.plan(b.build(), frontier=False, packing=False, strategy="none")
    path = plan.save(tmp_path / "big.json")
    calls = {"schema": 0, "simulate": 0}

    def counted(name, real):
        def run(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return run

    monkeypatch.setattr(planfile, "_schema_errors", counted("schema", planfile._schema_errors))
    monkeypatch.setattr(planfile, "simulate", counted("simulate", planfile.simulate))
    monkeypatch.setattr(planning, "simulate", counted("simulate", planning.simulate))
    loaded = memviz.load_plan(path)
    assert len(loaded.schedule) == len(plan.schedule) > 2900
    assert calls == {"schema": 1, "simulate": 2}  # once per document; once per run (baseline, planned)
    assert loaded.peak_bytes == plan.peak_bytes and loaded.baseline.peak_bytes == plan.baseline.peak_bytes


# --- fuzzing: any mutation of a plan file is either a plan or a clean PlanFileError -------------------------
_ODD = ["", "\x00", "\ud800", "\u2028", "'''", '"""\n', 10**400, -1, 2**63, 1e308, -0.0, None, True, [], {},
        [["compute", 0]], {"x": 1}, "free", "compute", 0, 1, 3.5]


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*path, i))


@pytest.mark.slow
def test_fuzzed_plan_files_load_or_fail_cleanly(tiny_doc, tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from memviz.plans.planfile import PlanFileError, parse_document
    from memviz.views import report

    base = json.dumps(tiny_doc)
    paths = [p for p in _paths(tiny_doc) if p and p[0] != "cdgraph"]
    values = st.one_of(st.sampled_from(_ODD), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
    edit = st.tuples(st.sampled_from(paths), st.sampled_from(["set", "delete", "extra"]), values)

    @settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(edit, min_size=1, max_size=3))
    def check(edits):
        doc = json.loads(base)
        for path, how, value in edits:
            parent = doc
            try:
                for key in path[:-1]:
                    parent = parent[key]
                if how == "set":
                    parent[path[-1]] = value
                elif how == "delete":
                    del parent[path[-1]]
                elif isinstance(parent, dict):
                    parent[f"extra{len(parent)}"] = value
                else:
                    parent.append(value)
            except (KeyError, IndexError, TypeError, AttributeError):
                continue  # an earlier edit removed or replaced this path
        text = json.dumps(doc)  # ensure_ascii: NUL and surrogates as \\u escapes, as in a real file
        try:
            plan = memviz.Plan.from_dict(parse_document(text, validate=False))
        except PlanFileError:
            return
        # whatever loads can be summarised, saved and reported
        plan.summary()
        new = plan.to_dict()
        memviz.plans.planfile.document_text(new)
        report.trusted_document(new)
        report.report_header(new)
        report.timeline_csv(new)

    check()


@pytest.mark.parametrize("breakout", [*sorted(BREAKOUTS), "every"])
def test_apply_snippet_holds_names_as_literals(tmp_path, breakout):
    """The "apply" export's snippet: the plan file's name and the factory (a path and a function name, from
    the command line) reach it only as string literals; running it runs none of them."""
    from memviz.runtime.apply import applied_source

    hostile = EVERY_BREAKOUT if breakout == "every" else BREAKOUTS[breakout].format(p=PAYLOAD)
    plan_name, factory = f"{hostile}.plan.json", f"/models/{hostile}.py:{hostile}"
    source = applied_source(plan_name, factory)
    assert source.isascii()  # no line separator of any kind can hide in it
    namespace = {"__file__": str(tmp_path / "opt.py"), "__name__": "snippet"}
    exec(compile(source, "opt.py", "exec"), namespace)  # defines PLAN, FACTORY, applied, load
    assert namespace["PLAN"].name == plan_name and namespace["PLAN"].parent == tmp_path
    assert namespace["FACTORY"] == factory
