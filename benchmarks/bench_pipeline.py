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
    for row in rows:
        folder = fsdp_out if row["schedule"] == FSDP_CASE else out
        row["measured"] = json.loads((folder / f"rank{row['rank']}.json").read_text())[row["schedule"]]
        row["error"] = (row["predicted"] - row["measured"]) / row["measured"]
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
        fsdp = r["schedule"] == FSDP_CASE
        where = f"{r['rank'] // 2}/2, dp rank {r['rank'] % 2}/2" if fsdp else f"{r['rank']}/2"
        name = "1f1b, PP x FSDP2 (4 ranks)" if fsdp else r["schedule"]
        out.append(f"| {name} | {where} | {r['measured']} | {r['predicted']} ({r['error']:+.2%}) |")
    out += ["", "The first stage's saved activations at its peak (recorded) against Megatron's PP term (the "
            "first stage holds pp micro-batches of its L/pp layers; per-layer formula at micro-batch 1):", "",
            "| schedule | micro-batches in flight | recorded B | formula B | difference B (ratio) |",
            "|---|---|---|---|---|"]
    for s in result["stages"]:
        out.append(f"| {s['schedule']} | {s['in_flight']} | {s['captured']} | {s['formula']} | "
                   f"{s['difference']:+d} ({s['ratio']:.3f}) |")
    return "\n".join(out + [""])


if __name__ == "__main__":
    from run import bench_main

    raise SystemExit(bench_main(run, "pipeline", __doc__))
