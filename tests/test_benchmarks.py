"""The benchmark runner end to end at --quick sizes, into a temporary directory (never the committed
benchmarks/RESULTS.md)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a benchmark subprocess, like the two above
def test_runner_quick_writes_results(tmp_path):
    _run("--only", "olla", "--out", str(tmp_path))
    by_hand = "## A check script's table\n\n| model | peak |\n|---|---|\n| gpt | 1 |\n"
    (tmp_path / "RESULTS.md").write_text((tmp_path / "RESULTS.md").read_text() + "\n" + by_hand)
    _run("--only", "autochunk", "--keep", "--out", str(tmp_path))  # olla's saved section is kept
    text = (tmp_path / "RESULTS.md").read_text()
    assert by_hand in text and text.count("## Address packing and reordering") == 1  # not kept twice
    assert "FAILED" not in text
    assert text.index("## Headline") < text.index("## Address packing and reordering")
    assert "| OLLA reordering" in text  # the headline row read from olla's result
    assert "_olla: not re-run; kept from results/olla.json" in text and "## Activation chunking" in text
    assert "Load average (1/5/15 min) before" in text
    assert "| A | 154 |" in text  # MiniMalloc instance A was read and packed
    for name in ("olla", "autochunk"):
        assert json.loads((tmp_path / "results" / f"{name}.json").read_text())["wall_s"] > 0


def test_a_rebuild_keeps_the_sections_no_benchmark_writes():
    """`run.py --keep --only export` rebuilt RESULTS.md from the saved results and dropped the gradient
    accumulation section a check script's run had added by hand; a rebuild now keeps every section whose
    title no benchmark renders, after the generated ones."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run

    previous = ("# memviz benchmarks\n\n## Headline\n\n| a |\n\n## Exported module\n\nold rows\n\n"
                "## Gradient accumulation\n\nby hand\n")
    assert run.hand_written(previous, {"## Exported module"}) == ["## Gradient accumulation\n\nby hand\n"]


def test_runner_lists_every_bench_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run

    on_disk = sorted(p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert sorted(run.BENCHMARKS) == on_disk and "remat" in on_disk
    assert sum(run.BUDGET_S.get(n, 300.0) for n in on_disk) <= run.TARGET_S  # the full run's target


def _bench_remat():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_remat

    return bench_remat


def test_torch_min_cut_baseline_really_trades_memory():
    """The min-cut baseline must change what is measured (a torch.compile'd model under the dispatch
    mode tracker silently ran eager) and still compute eager's gradients.  Budget 0.5, not 0.0: at
    0.0 torch saves only the inputs and recomputes the whole forward inside backward, where all of
    it is alive at once, so its peak equals the 1.0 peak."""
    bench = _bench_remat()
    from examples import models

    model, args = models.gpt(layers=2, dropout=0.0)[:2]
    eager = copy.deepcopy(model)
    peaks = {}
    for budget in (1.0, 0.5):
        candidate = bench.TorchMinCut(copy.deepcopy(model), args, budget)
        assert bench.gradient_error(eager, candidate, args) <= bench.GRAD_TOLERANCE
        peaks[budget] = bench.measured_peak(candidate, args)
    assert peaks[0.5] < 0.9 * peaks[1.0], peaks


def test_torch_min_cut_keeps_batchnorm_statistics():
    """Buffers mutated in forward (BatchNorm running stats) are updated as in eager, also when the
    partitioner recomputes BatchNorm in backward (budget < 1)."""
    bench = _bench_remat()
    from examples import models

    model, args = models.resnet()[:2]
    eager = copy.deepcopy(model)
    candidate = bench.TorchMinCut(copy.deepcopy(model), args, 0.0)  # one step while tracing
    bench._step(eager, args, 0)
    assert bench.gradient_error(eager, candidate, args) <= bench.GRAD_TOLERANCE  # a second step each
    for (name, a), b in zip(eager.named_buffers(), candidate.module.buffers(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


def test_equal_memory_picks_our_fastest_plan_within_torch_peak():
    bench = _bench_remat()
    def row(strategy: str, peak: int, overhead: float, grad_error: float = 0.0) -> dict:
        return {"strategy": strategy, "fraction": 0.5, "measured_peak": peak, "measured_overhead": overhead,
                "grad_error": grad_error}

    ours = [row("rotor", 90, 1.3), row("rockmate", 95, 1.1), row("sqrt", 99, 1.0, grad_error=1.0),
            {"strategy": "checkmate", "fraction": 0.75, "not_run": "predicted overhead above 4x"}]
    torch_points = [{"activation_memory_budget": 0.5, "measured_peak": 100, "measured_overhead": 1.2},
                    {"activation_memory_budget": 0.0, "measured_peak": 80, "measured_overhead": 2.0}]
    first, second = bench.at_equal_memory(ours, torch_points)
    assert first["ours"]["strategy"] == "rockmate"  # sqrt is faster but its gradients are wrong
    assert second["ours"] is None


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 66 s quiet; past 300 s at load 10-20 (busy rehearsal ci26)
def test_runner_quick_remat_section(tmp_path):
    _run("--only", "remat", "--out", str(tmp_path))
    text = (tmp_path / "RESULTS.md").read_text()
    assert "FAILED" not in text and "## Rematerialization" in text
    assert "PyTorch's min-cut partitioner" in text and "At equal measured memory" in text
    result = json.loads((tmp_path / "results" / "remat.json").read_text())
    for m in result["models"]:
        assert [t["activation_memory_budget"] for t in m["torch"]] == [1.0, 0.75, 0.5, 0.25, 0.0]
        run = [r for r in m["rows"] if "measured_peak" in r]
        assert run and all(r["grad_error"] <= 1e-4 for r in run)
        assert all(abs(r["peak_error"]) < 0.05 for r in run)  # the tracker agrees with the simulator


def _bench_apply():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_apply

    return bench_apply


def test_apply_sac_ilp_decisions_follow_the_dispatched_ops():
    """SACEstimator's ops (FakeTensorMode) lack the two the real CPU SDPA dispatches: the decisions after
    them must stay on their own ops, and an op only the real step has is recomputed."""
    bench = _bench_apply()
    estimated = ["mm", "view", "mul", "empty_like", "bernoulli_", "add"]
    decisions = [1, 0, 1, 1, 1, 0]
    dispatched = ["mm", "view", "ones", "tril", "mul", "empty_like", "bernoulli_", "add"]
    assert bench.align(estimated, decisions, dispatched) == [1, 0, 0, 0, 1, 1, 1, 0]


def test_apply_equal_memory_picks_memviz_fastest_point_within_each_peer_peak():
    bench = _bench_apply()

    def row(setting: str, peak: int, overhead: float, grad_error: float = 0.0) -> dict:
        return {"contender": "memviz", "setting": setting, "measured_peak": peak,
                "measured_overhead": overhead, "grad_error": grad_error}

    ours = [row("75%", 95, 1.1), row("min", 80, 1.5), row("50%", 90, 1.0, grad_error=1.0)]
    peers = [{"contender": "checkpoint", "setting": "every block", "measured_peak": 100,
              "measured_overhead": 1.2, "grad_error": 0.0},
             {"contender": "sac_ilp", "setting": "memory_budget 0.0", "not_run": "the MILP is infeasible"},
             {"contender": "torch min-cut", "setting": "0.0", "measured_peak": 70, "measured_overhead": 2.0,
              "grad_error": 0.3}]
    first, second = bench.at_equal_memory(ours, peers)
    assert first["ours"]["setting"] == "75%"  # 50% is faster but its gradients are wrong
    assert first["ratio"] == pytest.approx(1.1 / 1.2)
    assert second["ours"] is None and second["ratio"] is None  # below memviz's lowest peak: a loss, shown


def test_apply_peer_budgets_plan_memviz_at_each_peer_peak_it_can_reach():
    """memviz is planned at each peer's own peak: not below its minimum, not at or above eager's, once per
    peak (a fraction's budget or an earlier peer's)."""
    bench = _bench_apply()
    peers = [{"contender": "checkpoint", "setting": "every block", "measured_peak": 50},
             {"contender": "torch min-cut", "setting": "activation_memory_budget 1.0", "measured_peak": 80},
             {"contender": "torch.compile min-cut", "setting": "activation_memory_budget 1.0",
              "alloc_peak": 80},
             {"contender": "sac_ilp", "setting": "memory_budget 0.75", "measured_peak": 120},
             {"contender": "sac_ilp", "setting": "memory_budget 0.0", "measured_peak": 40},
             {"contender": "torch min-cut", "setting": "activation_memory_budget 0.5", "measured_peak": 70},
             {"contender": "torch min-cut", "setting": "activation_memory_budget 0.0", "measured_peak": 80},
             {"contender": "sac_ilp", "setting": "memory_budget 0.0", "not_run": "infeasible"}]
    every = {p["contender"] for p in peers}
    assert bench.peer_budgets([70], peers, every, "measured_peak", 45, 100) == [
        ("at checkpoint every block", 50), ("at torch min-cut 1.0", 80)]
    assert bench.peer_budgets([], peers, bench.MIN_CUT, "alloc_peak", 45) == [
        ("at torch.compile min-cut 1.0", 80)]


def test_apply_verdicts_read_ratios_against_the_eager_copys_pair_spread():
    """The noise band is the larger of the eager copy's median distance from 1.0 and half the
    interquartile range of its pair ratios: one outlier pair does not widen it to its own distance, a
    spread the median hides does widen it; a saved result without pairs keeps its median's distance."""
    bench = _bench_apply()
    pairs = [0.776, 0.956, 1.01, 1.292]  # bench_apply's ResNet eager copy, 2026-11-27: median 0.983
    # inclusive quartiles 0.911 and 1.0805
    assert bench.band_of(0.983, pairs) == pytest.approx((1.0805 - 0.911) / 2)
    assert bench.band_of(1.1, pairs) == pytest.approx(0.1)  # the median's, where it is wider
    assert bench.band_of(1.02, [1.02]) == pytest.approx(0.02)  # one pair: no spread to read
    m = {"eager_vs_eager": 0.983, "eager_vs_eager_pairs": pairs}
    assert bench.verdict(1.05, bench.noise_band(m)) == "within noise"
    assert bench.verdict(1.05, bench.noise_band({"eager_vs_eager": 0.983})) == "SLOWER"
    assert bench.verdict(0.75, bench.noise_band(m)) == "faster"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # past 300 s at load 10-20 (busy rehearsal ci26)
def test_apply_bench_smoke(tmp_path):
    """bench_apply's --quick run (a tiny GPT-2, one point per contender) end to end: every contender
    measured, the checkpointing ones with eager's gradients, memviz's run within its budget and plan."""
    out = tmp_path / "apply.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_apply.py"), "--quick", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = json.loads(out.read_text())["models"]
    rows = m["peers"] + m["ours"]
    compiled = {"torch.compile min-cut", "memviz+compile"}
    assert {r["contender"] for r in rows} == {"checkpoint", "sac_ilp", "torch min-cut", "memviz"} | compiled
    for r in rows:
        # a compiled model has only the allocator's peak (dynamo runs it eagerly under the tracker)
        assert "alloc_peak" in r and ("measured_peak" in r) == (r["contender"] not in compiled), r
        # min-cut recomputes dropout with a fresh mask; sac_ilp's policy (PyTorch's) once gave a gradient
        # error of 4e27 at memory_budget 0.25 on a loaded machine, not reproduced: reported, not asserted
        if r["contender"] in ("checkpoint", "memviz", "memviz+compile"):
            assert r["grad_error"] <= 1e-4, r
    ours, with_compile = m["ours"]
    assert ours["measured_peak"] <= ours["budget"] and abs(ours["measured_peak"] - ours["plan_peak"]) <= \
        0.02 * ours["plan_peak"]
    assert ours["measured_peak"] < m["eager_peak"]
    # compiled, the same plan holds no more than it does eager (the allocator measures both)
    assert with_compile["setting"] == ours["setting"]
    assert with_compile["alloc_peak"] <= 1.02 * ours["alloc_peak"]
    assert len(m["equal_memory"]) == len(m["peers"]) - sum(r["contender"] in compiled for r in m["peers"])
    assert len(m["equal_alloc"]) == len(m["peers"])
    assert "At equal or lower measured memory" in proc.stdout and "sac_ilp" in proc.stdout
    assert "At equal or lower allocator peak" in proc.stdout


def test_ui_latency_summary_reports_percentiles_and_plans_never_drawn():
    """bench_ui (issue 18 item 10): p50/p95 per interaction, and a plan never drawn (-1) fails the target."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_ui

    assert bench_ui.percentile([10.0, 20.0, 30.0, 40.0], 50) == 25.0
    assert bench_ui.percentile([10.0, 20.0, 30.0, 40.0], 95) == pytest.approx(38.5)
    rows = {r["interaction"]: r for r in bench_ui.summarize({"fast": [50.0, 60.0, 70.0], "lost": [50.0, -1.0],
                                                             "slow": [900.0, 1000.0]})}
    assert rows["fast"]["p50_ms"] == 60.0 and rows["fast"]["meets_target"]
    assert rows["lost"]["not_drawn"] == 1 and not rows["lost"]["meets_target"]
    assert not rows["slow"]["meets_target"]
    text = bench_ui.markdown({"target_ms": bench_ui.TARGET_MS, "not_run": "no Chromium"})
    assert "Not run: no Chromium" in text


def test_cuda_bench_runs_only_with_cuda_and_its_saved_section_renders():
    """bench_cuda needs a GPU: a run elsewhere leaves it out (its saved result stays, `--keep`), and the
    saved result's section is what its `markdown` makes of the saved rows."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_cuda
    import run

    assert ("cuda" in run.runnable_here()) == torch.cuda.is_available()
    saved = json.loads((ROOT / "benchmarks" / "results" / "cuda.json").read_text())
    assert bench_cuda.markdown(saved["rows"], saved["meta"]) == saved["markdown"]
    assert bench_cuda.headline(saved["rows"], saved["meta"]["device"]) == saved["headline"]


def test_ui_graph_open_rows_use_their_own_target():
    """bench_ui (issue 18 item 2): the Graph view's first open is held to 2 s, not the Planner's 150 ms,
    and gets its own table."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_ui

    graph = bench_ui.summarize({"600 ops": [900.0, 1900.0], "5k ops": [1500.0, 2500.0]},
                               bench_ui.GRAPH_TARGET_MS)
    assert [r["meets_target"] for r in graph] == [True, False]
    text = bench_ui.markdown({"target_ms": bench_ui.TARGET_MS, "graph_target_ms": bench_ui.GRAPH_TARGET_MS,
                              "rounds": 1, "frontier_points": 3, "wall_s": 1.0, "rows": [],
                              "graph_rows": graph})
    assert "### Graph view open" in text and "| 600 ops | 2 | 1400 |" in text and "| NO |" in text



def test_issue21_items_each_have_a_headline_row_against_their_anchor():
    """Issue 21's "done when": one run (`python benchmarks/run.py --only papers olla scaling`) puts each
    item in the headline against its anchor: items 1 and 5 from papers' rows (the Rockmate and OLLA
    papers), 2 from olla (MiniMalloc's published result, the 10 s target), 3 and 4 from scaling (the
    limit + 0.5 s promise, the 15 s / 60 s plan targets).  The saved results' headlines are what the
    benches make of them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_olla
    import bench_scaling
    import run

    saved = {n: json.loads((ROOT / "benchmarks" / "results" / f"{n}.json").read_text())
             for n in ("papers", "olla", "scaling")}
    assert bench_olla.headline(saved["olla"]) == saved["olla"]["headline"]
    assert bench_scaling.headline(saved["scaling"]) == saved["scaling"]["headline"]
    rows = {n: [" | ".join(r) for r in run.headline(n, saved[n])] for n in saved}
    expected = [("rockmate minimum activation budget", "papers", "paper 440"),
                ("rockmate time overhead at 0.85 GiB", "papers", "paper 1.234"),
                ("item 2: MiniMalloc challenging set A-K", "olla", "MiniMalloc C++: all 11 fit"),
                ("item 3: time limits 1/3/10 s", "scaling", "target <= +0.5 s"),
                ("item 4: default memviz.plan at 4041 ops", "scaling", "target <= 15 s"),
                ("item 4: default memviz.plan at 10017 ops", "scaling", "target <= 60 s"),
                ("batch 1, SGD step in graph (mean %)", "papers", "paper 22.5"),
                ("batch 32, SGD step in graph (mean %)", "papers", "paper 10.1")]
    for item, name, anchor in expected:
        assert any(item in r and anchor in r for r in rows[name]), (item, rows[name])
