"""Scale in estimated mode (issue 20 item 6): one rank of a Llama-3-8B-shaped model on 8 FSDP2 ranks and of
a Llama-3-70B-shaped model on 64 ranks (FSDP2 x TP=8), profiled and planned with no hardware.

Run: ``python benchmarks/bench_scale.py [--quick] [--out FILE]``; prints a markdown section and writes
``benchmarks/results/scale.json``.

Each setting runs in a process of its own (``--child NAME --search``), micro-batch 1 first and timed:
transformers' LlamaForCausalLM built on
the meta device from the model's published shape (bf16 weights, AdamW with bf16 state: no fp32 master
copy), ``memviz.profile(model, (ids,), parallel=Parallel(...), device="fake:h100")`` (the sharded copy runs
one step on fake tensors: exact local shapes, no weight allocated), then Rotor's smallest feasible budget
and ``memviz.plan(prof, budget, strategy="rotor")`` at the larger of that minimum and 75% of the eager
peak (checked by ``solvers.simulate`` like every plan).  The child reports those wall times, the CPU
seconds of the process over each (``time.process_time``: on a shared machine the wall time grows with the
load, the CPU time much less), the 1-minute load average, and its own peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) at that point, before the search below.  The timer starts
after the model is built on the meta device (the user's code, with its imports of transformers and of
this benchmark's helpers): it times ``memviz.profile`` and the planning.

Max micro-batch on an 80 GiB device, in the same child (`search`): micro-batch 2 is profiled too, and since
every buffer's size is affine in the micro-batch (a batch dimension or none), `scaled_graph` builds the graph
of any micro-batch from those two, exactly (checked: same operators on the same buffers).  On those
predicted graphs `largest_fitting` finds where the eager peak (without a plan) and Rotor's smallest feasible
budget (with the plan) cross the device's capacity (Rotor's minimum is not affine in the micro-batch at
small sizes: 13.0, 14.1 and 15.9 GiB at 1-3 for the 8B shape, then 2.9 GiB more per sample, so the secant
from 1 and 2 over-promises 3x; each guess is solved on its predicted graph).  Each answer is then
confirmed on real profiles of its own micro-batch, the answer (fits) and the answer + 1 (does not fit), and
at the largest micro-batch that fits with the plan ``memviz.plan(strategy="rotor")`` at the device's
capacity is solved and checked.  No time limit: the search's CPU seconds are reported (it was wall-time
limited, and read ">= 24" on a loaded machine); `MAX_BATCH` is its stated cap.
``--quick`` keeps 2 layers (the smoke size).

Each row also gives the estimated step time and the part of it the collectives take
(`memviz.hardware.collectives`: alpha-beta over the H100's NVLink / InfiniBand).  The step time sums every
operator and collective in order, as if no collective overlapped compute: an upper bound.  FSDP2 prefetches
its all-gathers and runs its reduce-scatters beside the backward, so the row also gives the other end,
every collective hidden behind compute (or compute behind them): max(compute, collectives).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

if TYPE_CHECKING:
    from solvers.ir import Graph

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


#: wall-clock limit of each Rotor minimum-budget search, a safety cap: memviz's default (10 s) ran out at
#: micro-batch 18+ of the 8B shape on the shared 2-core machine at load 8, and 60 s ran out for the 70B shape
#: at load 16 (the 70B minimum simulates ~23 proposals of an 18.6k-op graph: 70 s there); the search is timed
#: in the row, not limited by it
MINIMUM_LIMIT_S = 600.0
#: the largest micro-batch the max-micro-batch search considers (a stated cap: an answer at it reads ">=")
MAX_BATCH = 1024


def _model(name: str, batch: int, layers: int | None) -> tuple[Any, Any, Any]:
    import real_models  # noqa: F401  (torchvision's schema shim before transformers)
    import torch
    import transformers

    from memviz.parallel.distributed import Parallel

    fields, world, tp, _ = SETTINGS[name]
    fields = {**fields, **({"num_hidden_layers": layers} if layers else {})}
    cfg = transformers.LlamaConfig(**fields, max_position_embeddings=8192, use_cache=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model, (torch.zeros(batch, SEQ, dtype=torch.long),), Parallel(world, tp=tp)


def _profile(name: str, batch: int, layers: int | None) -> Any:
    return _profile_of(*_model(name, batch, layers))


def _profile_of(model: Any, args: Any, parallel: Any) -> Any:
    import torch

    import memviz

    return memviz.profile(model, args, loss_fn=lambda out: out.logits.float().sum(),
                          optimizer=torch.optim.AdamW, parallel=parallel, device=DEVICE)


def child(name: str, batch: int, layers: int | None) -> dict:
    """One setting at one micro-batch, in this process: profile, Rotor's minimum, a Rotor plan."""
    return _timed(name, batch, layers)[0]


def _timed(name: str, batch: int, layers: int | None) -> tuple[dict, Any]:
    """`child`'s row and the profile it made."""
    import memviz
    from memviz.hardware.collectives import collective_time
    from memviz.plans.planning import minimum_budget

    built = _model(name, batch, layers)
    waits = _waits()
    start, cpu = time.perf_counter(), time.process_time()
    prof = _profile_of(*built)
    profile_s, profile_cpu = time.perf_counter() - start, time.process_time() - cpu
    t, cpu = time.perf_counter(), time.process_time()
    low = minimum_budget(prof.graph, "rotor", MINIMUM_LIMIT_S)
    budget = max(low, int(0.75 * prof.baseline.peak_bytes))
    plan = memviz.plan(prof, budget, strategy="rotor", frontier=False, packing=False)
    plan_s, plan_cpu = time.perf_counter() - t, time.process_time() - cpu
    after = _waits()
    _, world, tp, _ = SETTINGS[name]
    return {"setting": name, "batch": batch, "layers": layers or SETTINGS[name][0]["num_hidden_layers"],
            "world_size": world, "tp": tp,
            "compute_nodes": len(prof.graph.computes), "eager_peak": prof.baseline.peak_bytes,
            "rotor_minimum": low, "plan_budget": budget, "plan_peak": plan.peak_bytes,
            "plan_recomputes": plan.timeline.recomputes, "eager_step_s": prof.baseline.total_time,
            "plan_step_s": plan.timeline.total_time,
            "eager_comm_s": collective_time(prof.graph, prof.baseline_schedule),
            "plan_comm_s": plan.collective_seconds, "time_overhead": plan.time_overhead,
            "capacity": prof.device.capacity_bytes,
            "profile_s": profile_s, "plan_s": plan_s, "total_s": profile_s + plan_s,
            "profile_cpu_s": profile_cpu, "plan_cpu_s": plan_cpu, "load": os.getloadavg()[0],
            **({"runqueue_s": after[0] - waits[0], "blocked_switches": after[1] - waits[1]}
               if waits and after else {}),
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, prof


def largest_fitting(value: Callable[[int], int], cap: int, most: int = MAX_BATCH) -> tuple[int, int | None]:
    """(lo, hi): value(lo) <= cap < value(hi) with hi == lo + 1 (the largest micro-batch that fits is lo;
    lo = 0: not even 1), `value` increasing; (most, None) when value(most) still fits.  Each probe is the
    secant guess through the last two probed points, kept strictly inside (lo, hi): a linear value is found
    in two probes."""
    if value(1) > cap:
        return 0, 1
    lo, hi = 1, None
    a, b = 1, min(2, most)
    while hi is None or hi - lo > 1:
        if b > lo and (hi is None or b < hi):
            if value(b) <= cap:
                lo = b
            else:
                hi = b
        if hi is None and lo == most:
            break
        slope = (value(b) - value(a)) / (b - a) if b != a else 0
        guess = b + int((cap - value(b)) // slope) if slope > 0 else 2 * b
        guess = min(max(guess, lo + 1), most) if hi is None else min(max(guess, lo + 1), hi - 1)
        a, b = b, guess
    return lo, hi


def confirmed(value: Callable[[int], int], guess: int, cap: int,
              most: int = MAX_BATCH) -> tuple[int, int | None]:
    """`largest_fitting`'s (lo, hi) on an increasing `value` whose answer is near `guess`: value(guess) and
    value(guess + 1) when the guess is right (it fits, the next does not), else one step at a time from it
    until the fit's edge is probed on both sides."""
    b = min(max(guess, 1), most)
    if value(b) > cap:
        while b > 1 and value(b - 1) > cap:
            b -= 1
        return b - 1, b
    while b < most and value(b + 1) <= cap:
        b += 1
    return b, (b + 1 if b < most else None)


def scaled_graph(one: Graph, two: Graph, batch: int) -> Graph:
    """The graph of micro-batch `batch` from the recorded graphs of micro-batch 1 and 2 of the same step.
    Every buffer and workspace holds a batch dimension or none, so its size is affine in the micro-batch:
    size(b) = size(1) + (b - 1) * (size(2) - size(1)), exact when the two steps recorded the same operators
    on the same buffers (checked; ValueError otherwise).  Roofline op times are extrapolated the same way,
    an estimate (Rotor's proposals read them, one per time level): hence each answer is confirmed on a real
    profile."""
    from solvers.ir import Graph

    k = batch - 1
    same = (len(one.computes) == len(two.computes) and len(one.datas) == len(two.datas)
            and all(x.op == y.op and x.phase == y.phase and set(x.inputs) == set(y.inputs)
                    and x.outputs == y.outputs for x, y in zip(one.computes, two.computes, strict=True))
            and all(x.name == y.name and x.kind == y.kind and x.producer == y.producer
                    for x, y in zip(one.datas, two.datas, strict=True)))
    if not same:
        raise ValueError(f"micro-batch 1 and 2 recorded different steps ({len(one.computes)} and "
                         f"{len(two.computes)} operators): no affine prediction")
    datas = tuple(replace(x, bytes=x.bytes + k * (y.bytes - x.bytes),
                          shape=tuple(d + k * (e - d) for d, e in zip(x.shape, y.shape, strict=True)))
                  for x, y in zip(one.datas, two.datas, strict=True))
    computes = tuple(replace(x, temp_bytes=x.temp_bytes + k * (y.temp_bytes - x.temp_bytes),
                             time=max(0.0, x.time + k * (y.time - x.time)))
                     for x, y in zip(one.computes, two.computes, strict=True))
    return Graph(computes, datas, one.outputs, name=one.name, meta=one.meta)


def search(name: str, layers: int | None) -> dict:
    """Max micro-batch with and without the plan: predicted, then confirmed on real (estimated) profiles.

    Micro-batch 1 (the timed row, first in a fresh process for its RSS) and 2 are profiled; `scaled_graph`
    predicts every other micro-batch's graph from them, on which `largest_fitting` finds where the eager
    peak and Rotor's smallest feasible budget cross the device's capacity.  Each answer is then `confirmed`
    on profiles of its own micro-batch: the answer fits and the next does not (a wrong prediction walks on
    from there, probing for real).  At the largest micro-batch that fits with the plan, `memviz.plan(
    strategy="rotor")` at the device's capacity is solved and checked.  No time limit: the search's cost is
    its probes, reported with the CPU seconds they took."""
    import memviz
    from memviz.hardware.devices import resolve_device
    from memviz.plans.planning import minimum_budget
    from solvers.simulate import simulate

    cap = resolve_device(DEVICE, None, ()).capacity_bytes
    row, first = _timed(name, 1, layers)
    cpu = time.process_time()  # the search's own CPU seconds, after the timed row
    profiles = {1: first}
    minima = {1: row["rotor_minimum"]}

    def real(b: int) -> Any:
        if b not in profiles:
            profiles[b] = _profile(name, b, layers)
        return profiles[b]

    def real_minimum(b: int) -> int:
        if b not in minima:
            minima[b] = minimum_budget(real(b).graph, "rotor", MINIMUM_LIMIT_S)
        return minima[b]

    guessed_peaks: dict[int, int] = {}
    guessed_minima: dict[int, int] = {}

    def guess_eager(b: int) -> int:  # micro-batch 1 and 2: the profiles the prediction comes from
        if b <= 2:
            return real(b).baseline.peak_bytes
        if b not in guessed_peaks:
            g = scaled_graph(first.graph, real(2).graph, b)
            guessed_peaks[b] = simulate(g, first.baseline_schedule).peak_bytes
        return guessed_peaks[b]

    def guess_minimum(b: int) -> int:
        if b <= 2:
            return real_minimum(b)
        if b not in guessed_minima:
            guessed_minima[b] = minimum_budget(scaled_graph(first.graph, real(2).graph, b), "rotor",
                                               MINIMUM_LIMIT_S)
        return guessed_minima[b]

    eager_guess, _ = largest_fitting(guess_eager, cap)
    plan_guess, _ = largest_fitting(guess_minimum, cap)
    predict_cpu = time.process_time() - cpu
    eager, eager_hi = confirmed(lambda b: real(b).baseline.peak_bytes, eager_guess, cap)
    planned, planned_hi = confirmed(real_minimum, plan_guess, cap)
    plan_peak = None
    if planned:
        plan = memviz.plan(real(planned), cap, strategy="rotor", frontier=False, packing=False)
        plan_peak = plan.peak_bytes
    probes = {str(b): {"eager_peak": p.baseline.peak_bytes, "rotor_minimum": minima.get(b),
                       "predicted_eager_peak": guessed_peaks.get(b), "predicted_rotor_minimum":
                           guessed_minima.get(b)} for b, p in sorted(profiles.items())}
    predicted = {str(b): {"eager_peak": guessed_peaks.get(b), "rotor_minimum": guessed_minima.get(b)}
                 for b in sorted({*guessed_peaks, *guessed_minima})}
    return {"row": row, "setting": name, "max_batch_eager": eager, "max_batch_plan": planned,
            "eager_misfit": eager_hi, "plan_misfit": planned_hi, "guess_eager": eager_guess,
            "guess_plan": plan_guess, "plan_peak": plan_peak, "capacity": cap, "max_batch_cap": MAX_BATCH,
            "probes": probes, "predicted": predicted,
            "predict_cpu_s": predict_cpu, "search_cpu_s": time.process_time() - cpu,
            "load": os.getloadavg()[0]}


def _waits() -> tuple[float, int] | None:
    """(seconds this process's threads have waited on the run queue, runnable but not running; times they
    blocked: voluntary context switches, I/O, locks, a child process), from Linux's per-thread
    ``/proc/self/task/*/schedstat`` (its second field) and ``getrusage``; None elsewhere.  Over a span,
    wall = CPU + run-queue wait + blocked time: the 8B row at load 16 waited 38 of its 50 s on the run queue
    and never blocked, so its wall time beyond CPU is the machine's load."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    waited = 0
    for task in tasks.iterdir():
        try:
            waited += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile, or no schedstats
            continue
    return waited / 1e9, resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _run_child(name: str, batch: int | None, layers: int | None) -> dict:
    """`child` (a micro-batch) or `search` (None) in a process of its own."""
    cmd = [sys.executable, __file__, "--child", name]
    cmd += ["--batch", str(batch)] if batch else ["--search"]
    if layers:
        cmd += ["--layers", str(layers)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    return json.loads(out.strip().splitlines()[-1])


def run(quick: bool = False) -> dict:
    layers = 2 if quick else None
    rows, fits = [], []
    for name in SETTINGS:
        found = _run_child(name, None, layers)
        rows.append(found.pop("row"))
        fits.append({**found, "layers": rows[-1]["layers"]})
    result = {"rows": rows, "fits": fits, "seq": SEQ, "device": DEVICE, "quick": quick}
    if not quick:
        result["headline"] = headline(rows)
    result["markdown"] = markdown(result)
    return result


def headline(rows: list[dict]) -> list[dict]:
    """The RESULTS headline rows: CPU seconds against the target (the wall time on the shared 2-core machine
    is the CPU time stretched by the load: 10.6 CPU s took 132 s wall at load 12), the wall time and load
    beside them."""
    first = {r["setting"]: r for r in rows if r["batch"] == 1}
    out = []
    for name in SETTINGS:
        r = first[name]
        cpu = r["profile_cpu_s"] + r["plan_cpu_s"]
        out.append({"metric": f"{name}: profile + plan one rank, estimated (fake:h100)",
                    "ours": f"{cpu:.0f} CPU s ({r['total_s']:.0f} s wall at load {r['load']:.0f}), "
                            f"{r['maxrss_bytes'] / GiB:.2f} GiB RSS",
                    "baseline": f"target {SETTINGS[name][3]} s" + (", 4 GiB" if name == "llama3-8b" else ""),
                    "ratio": f"{cpu / SETTINGS[name][3]:.2f}"})
    return out


def _found(lo: int, hi: int | None, most: int) -> str:
    """The max micro-batch, with the search's cap when even that fitted."""
    return str(lo) if hi == lo + 1 else f">= {lo} (the search's cap {most})"


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def markdown(result: dict) -> str:
    from memviz.hardware.collectives import overlapped_time

    out = ["## Scale: Llama-3-8B on 8 FSDP2 ranks, Llama-3-70B on 64 ranks (FSDP2 x TP=8), estimated", "",
           f"One rank, {result['device']} (80 GiB), seq {result['seq']}, bf16 weights and AdamW state, "
           "`logits.float().sum()` loss; model built on the meta device, step recorded on fake tensors. "
           "Each row is its own process: wall seconds of `memviz.profile` and of Rotor's minimum-budget "
           "search + `memviz.plan(strategy='rotor')` at max(minimum, 75% of eager) (the model built on the "
           "meta device before the timer starts), the process's CPU seconds over the same span (the wall "
           "time on this shared 2-core machine grows with the load, given at the row's end), the seconds "
           "its threads waited on the run queue, runnable but not running, and how often they blocked "
           "(`_waits`: wall = CPU + run-queue wait + blocked time), and the process's peak RSS."
           + (" **Quick run: 2 layers.**" if result["quick"] else ""), "",
           "| setting | layers | micro-batch | ops | eager peak GiB | Rotor min GiB | "
           "plan peak GiB (recomputes) | profile s | plan s | total s | total CPU s | run-queue wait s "
           "(blocked) | load | RSS GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cpu = f"{r['profile_cpu_s'] + r['plan_cpu_s']:.1f}" if "plan_cpu_s" in r else "n/a"
        wait = f"{r['runqueue_s']:.1f} ({r['blocked_switches']})" if "runqueue_s" in r else "n/a"
        load = f"{r['load']:.1f}" if "load" in r else "n/a"
        out.append(f"| {r['setting']} (world {r['world_size']}, tp {r['tp']}) | {r['layers']} | "
                   f"{r['batch']} | "
                   f"{r['compute_nodes']} | {r['eager_peak'] / GiB:.2f} | {r['rotor_minimum'] / GiB:.2f} | "
                   f"{r['plan_peak'] / GiB:.2f} ({r['plan_recomputes']}) | {r['profile_s']:.1f} | "
                   f"{r['plan_s']:.1f} | {r['total_s']:.1f} | {cpu} | {wait} | {load} | "
                   f"{r['maxrss_bytes'] / GiB:.2f} |")
    out += ["", "Estimated step time of the same rows (roofline op times plus `memviz.hardware.collectives`' "
            "alpha-beta time of every FSDP2 / TP collective over NVLink or InfiniBand as its group spans "
            "nodes). Serial: summed in order, as if no collective overlapped compute (an upper bound). "
            "Overlapped: every collective hidden behind compute or the reverse, max(compute, collectives) "
            "(a lower bound: FSDP2 prefetches its all-gathers and reduce-scatters beside the backward, "
            "while the tensor-parallel all-reduces / all-gathers sit on the critical path):", "",
            "| setting | micro-batch | eager step ms, serial / overlapped | collectives ms (share) | "
            "plan step ms, serial / overlapped | plan collectives ms | time overhead (serial) |",
            "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "eager_comm_s" not in r:  # a result kept from before the collective model
            continue
        eager = overlapped_time(r["eager_step_s"], r["eager_comm_s"])
        planned = overlapped_time(r["plan_step_s"], r["plan_comm_s"])
        out.append(f"| {r['setting']} (world {r['world_size']}, tp {r['tp']}) | {r['batch']} | "
                   f"{r['eager_step_s'] * 1e3:.1f} / {eager * 1e3:.1f} | {r['eager_comm_s'] * 1e3:.1f} "
                   f"({r['eager_comm_s'] / r['eager_step_s']:.0%}) | {r['plan_step_s'] * 1e3:.1f} / "
                   f"{planned * 1e3:.1f} | {r['plan_comm_s'] * 1e3:.1f} | x{r['time_overhead']:.3f} |")
    out += ["", "Max micro-batch on an 80 GiB device: the eager peak (without a plan) and Rotor's smallest "
            "feasible budget (with the plan) predicted for every micro-batch from the profiles of "
            "micro-batch 1 and 2 (each buffer's size is affine in the micro-batch: `scaled_graph`), then "
            "confirmed on profiles of the answer (fits) and the answer + 1 (does not), and a checked Rotor "
            "plan at 80 GiB for the answer with the plan. Profiled: GiB measured on that micro-batch's own "
            "profile (predicted before it in brackets). CPU s: the search after the timed row.", "",
            "| setting | without a plan (eager) | with the plan (Rotor) | predicted (eager / Rotor) | "
            "plan peak GiB at 80 GiB | profiled micro-batches: eager peak / Rotor min GiB (predicted) | "
            "search CPU s (load) |", "|---|---|---|---|---|---|---|"]
    for f in result["fits"]:
        most = f.get("max_batch_cap", 0)
        probes = ", ".join(
            f"{b}: {_gib(p['eager_peak'])}"
            + (f" ({_gib(p['predicted_eager_peak'])})" if p.get("predicted_eager_peak") else "")
            + f" / {_gib(p['rotor_minimum'])}"
            + (f" ({_gib(p['predicted_rotor_minimum'])})" if p.get("predicted_rotor_minimum") else "")
            for b, p in f["probes"].items())
        peak = "n/a" if f["plan_peak"] is None else f"{f['plan_peak'] / GiB:.2f}"
        eager = _found(f["max_batch_eager"], f["eager_misfit"], most)
        planned = _found(f["max_batch_plan"], f["plan_misfit"], most)
        out.append(f"| {f['setting']} ({f['layers']} layers) | {eager} | {planned} | "
                   f"{f.get('guess_eager')} / {f.get('guess_plan')} | {peak} | {probes} | "
                   f"{f.get('search_cpu_s', 0):.0f} ({f.get('load', 0):.1f}) |")
    return "\n".join(out + [""])


if __name__ == "__main__":
    if "--child" in sys.argv:
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("--child", choices=sorted(SETTINGS))
        ap.add_argument("--batch", type=int, default=1)
        ap.add_argument("--layers", type=int, default=None)
        ap.add_argument("--search", action="store_true")
        a = ap.parse_args()
        found = search(a.child, a.layers) if a.search else child(a.child, a.batch, a.layers)
        print(json.dumps(found))
        raise SystemExit(0)
    from run import bench_main

    raise SystemExit(bench_main(run, "scale", __doc__))
