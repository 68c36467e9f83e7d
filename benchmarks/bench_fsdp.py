"""Per-rank peak of an FSDP2 / tensor-parallel training step: memviz against torch's FSDPMemTracker and
a real 2-process gloo run (issue 20 item 4).

Run: ``python benchmarks/bench_fsdp.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/fsdp.json``.

Models: the tiny GPT of tests/distributed_worker.py and transformers' LlamaForCausalLM from a small
random-init config, one AdamW step (forward, ``logits.sum()``, backward, optimizer step) in the steady
state (the optimizer's state exists).  Per rank of 2:

* measured: two gloo processes (tests/distributed_worker.py) wrap the model themselves (``fully_shard``
  per block then the root, or a Megatron ``parallelize_module`` plan) and track the second step's live
  storages (including FSDP2's storage resizes);
* memviz: ``memviz.profile(model, parallel=Parallel(2, rank=r))`` on the fake process group;
* FSDPMemTracker (``torch.distributed._tools.fsdp2_mem_tracker``): the usage its docs and tests show,
  under FakeTensorMode on the fake process group, two iterations, peak of the run.  It needs an
  ``FSDPModule`` root, so the tensor-parallel rows have no anchor.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from distributed_worker import MODELS, loss_of, user_wrap  # noqa: E402

import memviz  # noqa: E402
from memviz.parallel.distributed import Parallel  # noqa: E402

WORLD = 2
#: (model, kind): FSDP2 for both models, tensor parallel for both (no anchor)
CASES = [("gpt", "fsdp"), ("llama", "fsdp"), ("gpt", "tp"), ("llama", "tp")]


def fsdp_mem_tracker_peak(name: str, rank: int) -> int:
    """FSDPMemTracker's peak for `rank`: the model built and wrapped under FakeTensorMode on the fake
    group (the mesh is made first: a DeviceMesh cannot be built under FakeTensorMode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        with FakeTensorMode():
            model, args = MODELS[name]()
            model = user_wrap(model, "fsdp", WORLD, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters())
            tracker = FSDPMemTracker(model, opt)
            tracker.track_inputs(args)
            with tracker:
                for i in range(2):
                    out = model(*args)  # held to the step's end, as in the measured step
                    loss_of(out).backward()
                    opt.step()
                    opt.zero_grad()
                    del out
                    if i == 0:
                        tracker.reset_mod_stats()
            snapshot = tracker.get_tracker_snapshot("peak")
        return int(snapshot[torch.device("cpu")]["Total"])
    finally:
        dist.destroy_process_group()


def memviz_peak(name: str, kind: str, rank: int) -> tuple[int, float]:
    model, args = MODELS[name]()
    parallel = (Parallel(WORLD, rank=rank) if kind == "fsdp"
                else Parallel(WORLD, fsdp=False, tp=WORLD, rank=rank))
    t = time.perf_counter()
    prof = memviz.profile(model, args, optimizer=torch.optim.AdamW, loss_fn=loss_of, parallel=parallel)
    return prof.baseline.peak_bytes, time.perf_counter() - t


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_measured(cases: list[tuple[str, str]]) -> list[dict]:
    """Each rank's measured peak per case, from two real gloo processes."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        subprocess.run([sys.executable, str(ROOT / "tests" / "distributed_worker.py"),
                        ",".join(f"{m}:{k}" for m, k in cases), str(WORLD), str(_free_port()), out],
                       env=env, check=True, timeout=600)
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _err(x: int | None, real: int) -> float | None:
    return None if x is None else 100.0 * (x - real) / real


def run(quick: bool = False) -> dict:
    cases = CASES[:2] if quick else CASES
    measured = gloo_measured(cases)
    rows = []
    for name, kind in cases:
        for rank in range(WORLD):
            real = measured[rank][f"{name}:{kind}"]["measured"]
            ours, seconds = memviz_peak(name, kind, rank)
            anchor = fsdp_mem_tracker_peak(name, rank) if kind == "fsdp" else None
            rows.append({"model": name, "parallel": kind, "rank": rank, "measured": real, "memviz": ours,
                         "memviz_s": round(seconds, 2), "fsdp_mem_tracker": anchor,
                         "memviz_err_pct": _err(ours, real), "anchor_err_pct": _err(anchor, real)})
    anchored = [r for r in rows if r["fsdp_mem_tracker"] is not None]
    ours = max(abs(r["memviz_err_pct"]) for r in anchored)
    theirs = max(abs(r["anchor_err_pct"]) for r in anchored)
    result = {"rows": rows, "world_size": WORLD,
              "headline": [{"metric": "FSDP2 per-rank peak error vs 2 gloo ranks (GPT, Llama), worst row",
                            "ours": f"{ours:.2f}%", "baseline": f"FSDPMemTracker {theirs:.2f}%",
                            "ratio": ""}]}
    result["markdown"] = markdown(result)
    return result


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}%"


def markdown(result: dict) -> str:
    out = ["## FSDP2 / TP per-rank peak: memviz vs torch's FSDPMemTracker vs 2 gloo ranks", "",
           "One steady-state AdamW step (`logits.sum()` loss) per rank of 2. Measured: two gloo processes "
           "that wrap the model themselves and track live storages (FSDP2's storage resizes included). "
           "memviz: `profile(..., parallel=Parallel(2, ...))` on the fake process group. FSDPMemTracker: "
           "torch.distributed._tools, under FakeTensorMode on the fake group (FSDP2 roots only: no anchor "
           "for tensor parallelism). Bytes; error relative to the measured peak.", "",
           "| model | parallel | rank | measured | memviz (err) | FSDPMemTracker (err) | memviz profile s |",
           "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        anchor = ("n/a" if r["fsdp_mem_tracker"] is None
                  else f"{r['fsdp_mem_tracker']} ({_pct(r['anchor_err_pct'])})")
        out.append(f"| {r['model']} | {r['parallel']} | {r['rank']} | {r['measured']} | {r['memviz']} "
                   f"({_pct(r['memviz_err_pct'])}) | {anchor} | {r['memviz_s']:.1f} |")
    return "\n".join(out + [""])


if __name__ == "__main__":
    from run import bench_main

    raise SystemExit(bench_main(run, "fsdp", __doc__))
