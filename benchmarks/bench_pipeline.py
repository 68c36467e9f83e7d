"""One pipeline stage's per-rank peak: memviz's recorded stage against two gloo ranks running torch's own
pipelining, and Megatron's PP term against the recorded first stage (issue 20 item 5).

Run: ``python benchmarks/bench_pipeline.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/pipeline.json``.

Model: the tiny GPT of tests/distributed_worker.py with 4 blocks, batch 4 of 16 tokens, split by
``torch.distributed.pipelining.pipeline`` into 2 stages of 2 blocks, 4 micro-batches, one AdamW step in
the steady state (``logits.sum()`` loss on the last stage), under ``Schedule1F1B`` and ``ScheduleGPipe``.

* measured: 2 gloo processes (tests/pipeline_worker.py) build their stage the way a user does and track the
  second step's live storages (the stage's receive buffers, allocated once, counted from the start);
* PP x FSDP2: 4 more gloo processes on a ("pp", "dp") = (2, 2) mesh, each stage module ``fully_shard``-ed
  over its dp pair as torchtitan does, 1F1B; memviz's ``Parallel(4, pp=2, microbatches=4, rank=r)``;
* PP x TP (and with sequence parallelism): 4 more gloo processes on a ("pp", "tp") = (2, 2) mesh running
  TinyGPT at 4 x 64 tokens in 2 micro-batches split by hand (tests/pipeline_worker.py's ``GPTStage``,
  torchtitan's layout), 1F1B, 3 AdamW steps, unplanned and with memviz's per-stage plan applied first (a
  ``strategy="sac"`` plan at `TP_BUDGET` of each stage's peak, made from rank 0's and rank 3's profiles;
  the other rank of a stage predicted with ``rank_timeline``); memviz's
  ``Parallel(4, fsdp=False, pp=2, tp=2, sp=..., microbatches=2, rank=r)``;
* memviz: ``memviz.profile(model, parallel=Parallel(2, fsdp=False, pp=2, microbatches=4, schedule=s,
  rank=r))`` on the fake process group; rank 0's comes from ``compare_captured(model, args, pp=2, ...)``,
  which also gives the saved activations the first stage holds at its peak next to the formula's PP term
  (`solvers.analytic`: pp micro-batches of its L/pp layers, per-layer bytes at the micro-batch size).
``--quick`` is the same run (it is small).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

SCHEDULES = ("1f1b", "gpipe")
#: PP x FSDP2: 2 stages, each fully_shard-ed over 2 ranks (tests/pipeline_worker.py's "fsdp:" cases), 1F1B
FSDP_CASE = "fsdp:1f1b"
#: PP x TP without and with sequence parallelism (pipeline_worker's "tp:" / "tpsp:" cases), 1F1B, 4 ranks
TP_CASES = ("tp:1f1b", "tpsp:1f1b")
#: each PP x TP stage's plan budget, of its unplanned peak (tests/test_pipeline.py's)
TP_BUDGET = 0.93


def tp_predictions(case: str, plan_dir: Path) -> list[dict]:
    """memviz's unplanned and planned peaks for the 4 ranks of a PP x TP `case`; the plans of stage 0 (from
    rank 0's profile) and stage 1 (rank 3's) saved in `plan_dir` under pipeline_worker's names."""
    import torch
    from distributed_worker import loss_of, tiny_gpt
    from pipeline_worker import LAYERS, TP_MICROBATCHES, TP_SHAPE, plan_file

    import memviz
    from memviz.parallel.distributed_sac import rank_timeline

    kind = case.partition(":")[0]
    plans, rows = {}, []
    for rank in (0, 3, 1, 2):  # the plans' ranks first
        model, args = tiny_gpt(layers=LAYERS, **TP_SHAPE)
        parallel = memviz.Parallel(4, fsdp=False, pp=2, tp=2, sp=kind == "tpsp", microbatches=TP_MICROBATCHES,
                                   rank=rank)
        prof = memviz.profile(model, args, optimizer=torch.optim.AdamW, loss_fn=loss_of, parallel=parallel)
        stage = rank // 2
        if stage not in plans:
            plans[stage] = memviz.plan(prof, TP_BUDGET, strategy="sac")
            plans[stage].save(plan_dir / plan_file(kind, stage))
            planned = plans[stage].peak_bytes
        else:
            planned = rank_timeline(plans[stage], prof).peak_bytes
        rows.append({"schedule": case, "rank": rank, "predicted": prof.baseline.peak_bytes,
                     "planned_predicted": planned,
                     "options": plans[stage].solver_stats.extra["sac"]["options"]})
    return sorted(rows, key=lambda r: r["rank"])


def run(quick: bool = False) -> dict:
    import torch
    from distributed_worker import free_port, loss_of, tiny_gpt
    from pipeline_worker import BATCH, LAYERS, MICROBATCHES

    import memviz
    from memviz.views.whatif import compare_captured

    start, load = time.perf_counter(), os.getloadavg()[0]
    out = Path(tempfile.mkdtemp(prefix="memviz-pipeline-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    worker = str(ROOT / "tests" / "pipeline_worker.py")
    cmd = [sys.executable, worker, ",".join(SCHEDULES), "2", str(free_port()), str(out)]
    workers = subprocess.Popen(cmd, env=env)
    # PP x FSDP2 (pp=2 x dp=2) on 4 more gloo processes, in a folder of its own (same rank file names)
    fsdp_out = Path(tempfile.mkdtemp(prefix="memviz-pipeline-fsdp-"))
    fsdp_cmd = [sys.executable, worker, FSDP_CASE, "4", str(free_port()), str(fsdp_out)]
    fsdp_workers = subprocess.Popen(fsdp_cmd, env=env)
    cfg = {"layers": LAYERS, "hidden": 32, "heads": 4, "vocab": 64, "dropout": False}
    rows, stages = [], []
    for schedule in SCHEDULES:  # predictions while the gloo ranks run
        model, args = tiny_gpt(batch=BATCH, layers=LAYERS)
        cmp = compare_captured(model, args, pp=2, microbatches=MICROBATCHES, schedule=schedule,
                               loss_fn=loss_of, config=cfg, optimizer=torch.optim.AdamW)
        stages.append(cmp.stage)
        rows.append({"schedule": schedule, "rank": 0, "predicted": cmp.stage["peak"]})
        prof = memviz.profile(*tiny_gpt(batch=BATCH, layers=LAYERS), optimizer=torch.optim.AdamW,
                              loss_fn=loss_of, parallel=memviz.Parallel(2, fsdp=False, pp=2, rank=1,
                                                                        microbatches=MICROBATCHES,
                                                                        schedule=schedule))
        rows.append({"schedule": schedule, "rank": 1, "predicted": prof.baseline.peak_bytes})
    for rank in range(4):
        prof = memviz.profile(*tiny_gpt(batch=BATCH, layers=LAYERS), optimizer=torch.optim.AdamW,
                              loss_fn=loss_of, parallel=memviz.Parallel(4, pp=2, microbatches=MICROBATCHES,
                                                                        rank=rank))
        rows.append({"schedule": FSDP_CASE, "rank": rank, "predicted": prof.baseline.peak_bytes})
    if workers.wait(timeout=600) != 0 or fsdp_workers.wait(timeout=600) != 0:
        raise RuntimeError("the gloo pipeline ranks failed")
    # PP x TP: the plans first (the gloo ranks apply them), then 4 gloo processes run both cases
    tp_out = Path(tempfile.mkdtemp(prefix="memviz-pipeline-tp-"))
    tp_rows = [row for case in TP_CASES for row in tp_predictions(case, tp_out)]
    tp_cmd = [sys.executable, worker, ",".join(TP_CASES), "4", str(free_port()), str(tp_out)]
    if subprocess.run(tp_cmd, env=env, timeout=900).returncode != 0:
        raise RuntimeError("the gloo PP x TP ranks failed")
    for row in rows:
        folder = fsdp_out if row["schedule"] == FSDP_CASE else out
        row["measured"] = json.loads((folder / f"rank{row['rank']}.json").read_text())[row["schedule"]]
        row["error"] = (row["predicted"] - row["measured"]) / row["measured"]
    for row in tp_rows:
        got = json.loads((tp_out / f"rank{row['rank']}.json").read_text())[row["schedule"]]
        planned = got["planned_measured"]
        row.update(got, error=(row["predicted"] - got["measured"]) / got["measured"],
                   planned_error=(row["planned_predicted"] - planned) / planned)
    rows += tp_rows
    result = {"rows": rows, "stages": stages, "load_before": load, "load_after": os.getloadavg()[0],
              "wall_s": time.perf_counter() - start, "quick": quick}
    result["markdown"] = markdown(result)
    return result


def markdown(result: dict) -> str:
    out = ["## Pipeline stages: memviz vs 2 gloo ranks running torch.distributed.pipelining", "",
           "TinyGPT, 4 blocks in 2 stages (torch's `pipeline()` split at `blocks.2`), batch 4 x 16 tokens in "
           "4 micro-batches, one steady-state AdamW step per rank. Measured: gloo processes building their "
           "stage themselves (tests/pipeline_worker.py). memviz: `profile(..., parallel=Parallel(2, "
           "fsdp=False, pp=2, microbatches=4, schedule=...))` on the fake process group. PP x FSDP2 rows: "
           "4 gloo ranks on a (pp=2, dp=2) mesh, each stage module fully_shard-ed over its dp pair "
           "(torchtitan's layout); memviz: `Parallel(4, pp=2, microbatches=4, rank=r)`. "
           f"{result['wall_s']:.0f} s wall, "
           f"load {result['load_before']:.1f} before, {result['load_after']:.1f} after.", "",
           "| schedule | stage | measured B | memviz B (err) |", "|---|---|---|---|"]
    for r in result["rows"]:
        if r["schedule"] in TP_CASES:
            continue
        fsdp = r["schedule"] == FSDP_CASE
        where = f"{r['rank'] // 2}/2, dp rank {r['rank'] % 2}/2" if fsdp else f"{r['rank']}/2"
        name = "1f1b, PP x FSDP2 (4 ranks)" if fsdp else r["schedule"]
        out.append(f"| {name} | {where} | {r['measured']} | {r['predicted']} ({r['error']:+.2%}) |")
    out += tp_markdown([r for r in result["rows"] if r["schedule"] in TP_CASES])
    out += ["", "The first stage's saved activations at its peak (recorded) against Megatron's PP term (the "
            "first stage holds pp micro-batches of its L/pp layers; per-layer formula at micro-batch 1):", "",
            "| schedule | micro-batches in flight | recorded B | formula B | difference B (ratio) |",
            "|---|---|---|---|---|"]
    for s in result["stages"]:
        out.append(f"| {s['schedule']} | {s['in_flight']} | {s['captured']} | {s['formula']} | "
                   f"{s['difference']:+d} ({s['ratio']:.3f}) |")
    return "\n".join(out + [""])


def tp_markdown(rows: list[dict]) -> list[str]:
    """The PP x TP (and sequence-parallel) rows: per rank, unplanned and planned, predicted vs measured."""
    if not rows:
        return []
    out = ["", "PP x TP on 4 gloo ranks ((pp=2, tp=2) mesh; TinyGPT 4 x 64 tokens, 2 micro-batches, 1F1B; "
           "stages split by hand, tests/pipeline_worker.py's `GPTStage`), unplanned and with memviz's "
           f"per-stage `strategy=\"sac\"` plan at {TP_BUDGET:.0%} of the stage's peak applied before the "
           "split "
           "(plans from ranks 0 and 3; the other rank of a stage predicted by `rank_timeline`); `tpsp`: with "
           "sequence parallelism. Gradient difference: planned vs unplanned run, largest relative, over 3 "
           "steps.", "",
           "| case | rank (stage, tp rank) | measured B | memviz B (err) | planned measured B | planned "
           "memviz "
           "B (err) | plan (per block) | grad difference |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        options = ", ".join(f"{k}: {v}" for k, v in r["options"].items())
        out.append(f"| {r['schedule']} | {r['rank']} ({r['rank'] // 2}, {r['rank'] % 2}) | {r['measured']} | "
                   f"{r['predicted']} ({r['error']:+.2%}) | {r['planned_measured']} | "
                   f"{r['planned_predicted']} ({r['planned_error']:+.2%}) | {options} | "
                   f"{r['max_relative_grad_difference']:.1e} |")
    return out


if __name__ == "__main__":
    from run import bench_main

    raise SystemExit(bench_main(run, "pipeline", __doc__))
