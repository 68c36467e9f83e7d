"""Scale in estimated mode (issue 20 item 6): one rank of a Llama-3-8B-shaped model on 8 FSDP2 ranks and of
a Llama-3-70B-shaped model on 64 ranks (FSDP2 x TP=8), profiled and planned with no hardware.

Run: ``python benchmarks/bench_scale.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/scale.json``.

Each (setting, micro-batch) runs in its own process (``--child``): transformers' LlamaForCausalLM built on
the meta device from the model's published shape (bf16 weights, AdamW with bf16 state: no fp32 master
copy), ``memviz.profile(model, (ids,), parallel=Parallel(...), device="fake:h100")`` (the sharded copy runs
one step on fake tensors: exact local shapes, no weight allocated), then Rotor's smallest feasible budget
and ``memviz.plan(prof, budget, strategy="rotor")`` at the larger of that minimum and 75% of the eager
peak (checked by ``solvers.simulate`` like every plan).  The child reports its wall times and its own
peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``).

Max micro-batch on an 80 GiB device: every setting is profiled at micro-batch 1 and 2; the per-rank
eager peak and Rotor's minimum are linear in the micro-batch over that range (activations scale with it,
parameters, gradients, optimizer state and gathered parameters do not), so the largest micro-batch whose
extrapolated eager peak (without a plan) or Rotor minimum (with the plan) fits 80 GiB is reported as an
extrapolation from those two profiles.  ``--quick`` keeps 2 layers (the smoke size).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

GiB = 2**30
SEQ = 4096
DEVICE = "fake:h100"
#: name -> (Llama config fields, world size, tp, budget target in seconds for profile + plan)
SETTINGS = {
    "llama3-8b": ({"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}, 8, 1, 60),
    "llama3-70b": ({"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}, 64, 8, 180),
}


def child(name: str, batch: int, layers: int | None) -> dict:
    """One setting at one micro-batch, in this process: profile, Rotor's minimum, a Rotor plan."""
    import real_models  # noqa: F401  (torchvision's schema shim before transformers)
    import torch
    import transformers

    import memviz
    from memviz.distributed import Parallel
    from memviz.planning import minimum_budget

    fields, world, tp, _ = SETTINGS[name]
    fields = {**fields, **({"num_hidden_layers": layers} if layers else {})}
    cfg = transformers.LlamaConfig(**fields, max_position_embeddings=8192, use_cache=False)
    start = time.perf_counter()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.zeros(batch, SEQ, dtype=torch.long)
    prof = memviz.profile(model, (ids,), loss_fn=lambda out: out.logits.float().sum(),
                          optimizer=torch.optim.AdamW, parallel=Parallel(world, tp=tp), device=DEVICE)
    profile_s = time.perf_counter() - start
    t = time.perf_counter()
    low = minimum_budget(prof.graph, "rotor")
    budget = max(low, int(0.75 * prof.baseline.peak_bytes))
    plan = memviz.plan(prof, budget, strategy="rotor", frontier=False, packing=False)
    plan_s = time.perf_counter() - t
    return {"setting": name, "batch": batch, "layers": fields["num_hidden_layers"], "world_size": world,
            "tp": tp,
            "compute_nodes": len(prof.graph.computes), "eager_peak": prof.baseline.peak_bytes,
            "rotor_minimum": low, "plan_budget": budget, "plan_peak": plan.peak_bytes,
            "plan_recomputes": plan.timeline.recomputes, "eager_step_s": prof.baseline.total_time,
            "plan_step_s": plan.timeline.total_time, "capacity": prof.device.capacity_bytes,
            "profile_s": profile_s, "plan_s": plan_s, "total_s": profile_s + plan_s,
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _run_child(name: str, batch: int, layers: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--batch", str(batch)]
    if layers:
        cmd += ["--layers", str(layers)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    return json.loads(out.strip().splitlines()[-1])


def max_batch(one: int, two: int, capacity: int) -> int:
    """Largest micro-batch b with one + (b - 1) * (two - one) <= capacity (0: not even b = 1)."""
    if one > capacity:
        return 0
    slope = two - one
    return 1 << 20 if slope <= 0 else 1 + (capacity - one) // slope


def run(quick: bool = False) -> dict:
    layers = 2 if quick else None
    rows, fits = [], []
    for name in SETTINGS:
        runs = [_run_child(name, b, layers) for b in (1, 2)]
        rows += runs
        cap = runs[0]["capacity"]
        fits.append({"setting": name, "layers": runs[0]["layers"],
                     "max_batch_eager": max_batch(runs[0]["eager_peak"], runs[1]["eager_peak"], cap),
                     "max_batch_plan": max_batch(runs[0]["rotor_minimum"], runs[1]["rotor_minimum"], cap)})
    result = {"rows": rows, "fits": fits, "seq": SEQ, "device": DEVICE, "quick": quick}
    if not quick:
        first = {r["setting"]: r for r in rows if r["batch"] == 1}
        result["headline"] = [
            {"metric": f"{name}: profile + plan one rank, estimated (fake:h100)",
             "ours": f"{first[name]['total_s']:.0f} s, {first[name]['maxrss_bytes'] / GiB:.2f} GiB RSS",
             "baseline": f"target {SETTINGS[name][3]} s" + (", 4 GiB" if name == "llama3-8b" else ""),
             "ratio": f"{first[name]['total_s'] / SETTINGS[name][3]:.2f}"} for name in SETTINGS]
    result["markdown"] = markdown(result)
    return result


def markdown(result: dict) -> str:
    out = ["## Scale: Llama-3-8B on 8 FSDP2 ranks, Llama-3-70B on 64 ranks (FSDP2 x TP=8), estimated", "",
           f"One rank, {result['device']} (80 GiB), seq {result['seq']}, bf16 weights and AdamW state, "
           "`logits.float().sum()` loss; model built on the meta device, step recorded on fake tensors. "
           "Each row is its own process: wall seconds of `memviz.profile` and of Rotor's minimum-budget "
           "search + `memviz.plan(strategy='rotor')` at max(minimum, 75% of eager), and the process's peak "
           "RSS." + (" **Quick run: 2 layers.**" if result["quick"] else ""), "",
           "| setting | layers | micro-batch | ops | eager peak GiB | Rotor min GiB | "
           "plan peak GiB (recomputes) | profile s | plan s | total s | RSS GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(f"| {r['setting']} (world {r['world_size']}, tp {r['tp']}) | {r['layers']} | "
                   f"{r['batch']} | "
                   f"{r['compute_nodes']} | {r['eager_peak'] / GiB:.2f} | {r['rotor_minimum'] / GiB:.2f} | "
                   f"{r['plan_peak'] / GiB:.2f} ({r['plan_recomputes']}) | {r['profile_s']:.1f} | "
                   f"{r['plan_s']:.1f} | {r['total_s']:.1f} | {r['maxrss_bytes'] / GiB:.2f} |")
    out += ["", "Max micro-batch on an 80 GiB device (extrapolated from micro-batch 1 and 2, linear in "
            "between):",
            "", "| setting | without a plan (eager) | with the plan (Rotor's minimum) |", "|---|---|---|"]
    out += [f"| {f['setting']} ({f['layers']} layers) | {f['max_batch_eager']} | {f['max_batch_plan']} |"
            for f in result["fits"]]
    return "\n".join(out + [""])


if __name__ == "__main__":
    if "--child" in sys.argv:
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("--child", choices=sorted(SETTINGS))
        ap.add_argument("--batch", type=int, default=1)
        ap.add_argument("--layers", type=int, default=None)
        a = ap.parse_args()
        print(json.dumps(child(a.child, a.batch, a.layers)))
        raise SystemExit(0)
    from run import bench_main

    raise SystemExit(bench_main(run, "scale", __doc__))
