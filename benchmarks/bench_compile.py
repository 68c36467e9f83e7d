"""The executor table: memviz plans exported, compiled and not, vs torch.compile's budgets (issue 22).

Run: ``python benchmarks/bench_compile.py [--quick] [--out FILE] [--models resnet,...]``; prints a markdown
section and writes ``benchmarks/results/compile.json`` (with ``--models``, only those models are measured
and replace their entries in the existing file).

For a GPT-style model (examples/models.py, 4 layers, d 256, seq 128, dropout 0), a ResNet-style one
(bench_remat's ResNet) and a small GPT with dropout 0.1, one process measures training steps (forward,
loss, backward) of:

1. eager PyTorch, the reference (1.000);
2. memviz's eager schedule exported (``strategy="none"``: no recomputation), and memviz plans at 75 / 50
   / 25 / 0 % of the range [rotor minimum, eager peak] (``strategy="auto"``; 0 %: the rotor minimum itself,
   memviz's lowest memory), each run by ``memviz.export``
   as is and under ``torch.compile(..., backend="inductor")`` (`memviz.runtime.compiled`: the plan's step
   functions compiled as forward graphs, cut at random ops), with the plan's predicted overhead beside;
3. ``torch.compile(model, backend="inductor")`` under ``torch._functorch.config.activation_memory_budget``
   1.0 (its default), 0.75, 0.5, 0.25 and 0.0: Inductor's own rematerialising min-cut, fused.

Every row is measured the same way: the median of back-to-back (candidate, eager) step-time ratios (step
time: the calling thread's CPU time, `CLOCK`), the
CPU allocator's peak during one step (`memviz.profiling.tracker.allocator_peak`: torch.profiler's memory
events, which see Inductor's allocations; parameters, gradients and inputs included; it also counts what the
live-storage tracker cannot see, such as the RNG states kept for dropout replay and kernel workspaces),
and the largest relative gradient difference from eager after a step with the same seed.  For memviz's
exports the allocator's excess over the live-storage tracker in the uncompiled step (convolution
workspaces, RNG states: memory no plan models) is measured and shown, and the compiled row's peak less that
excess is set against the plan's peak: what the compiler adds to the plan.  The first
step of a compiled contender compiles it; its wall time is reported apart.  The equal-memory table
gives, for each Inductor budget, memviz's fastest compiled plan whose measured peak is no higher.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from bench_apply import noise_band, verdict  # noqa: E402
from bench_remat import GRAD_TOLERANCE, _step, _timed_step, gradient_error  # noqa: E402

import memviz  # noqa: E402
from examples import models  # noqa: E402
from memviz.plans.planning import minimum_budget  # noqa: E402
from memviz.profiling.tracker import allocator_peak, measure_peak, tensors_of  # noqa: E402

MiB = 2**20
#: step times are the calling thread's CPU time: with one intra-op thread every kernel of a CPU step,
#: eager, autograd's backward and Inductor's, runs on that thread, and on 2 cores shared at load 10-18
#: wall time mostly measures the scheduler (exec27/compile28: Inductor's default compile read 0.77-0.93x
#: eager on wall time within the hour, 0.84x on thread time; an eager copy 0.95-1.07x on wall time)
CLOCK = time.thread_time


@dataclasses.dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    steps: int  # back-to-back (candidate, eager) step pairs per row
    fractions: tuple[float, ...]  # memviz budgets in [rotor minimum, eager peak]
    torch_budgets: tuple[float, ...]  # activation_memory_budget values


FULL = Settings(("gpt-4l", "resnet", "gpt-2l-dropout"), 5, (0.75, 0.5, 0.25, 0.0), (1.0, 0.5, 0.25, 0.0))
#: --quick: the small GPT with dropout, one point each
SMOKE = Settings(("gpt-2l-dropout",), 1, (0.5,), (0.5,))
#: the dropout model shows gradient exactness, not speed: fewer points, no eager-schedule rows
DROPOUT_POINTS = ((0.5, 0.0), (1.0, 0.5))

MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "gpt-4l": lambda: tuple(models.gpt(batch=2, seq=128, d=256, heads=4, layers=4, vocab=256,
                                       dropout=0.0)[:2]),
    "resnet": lambda: tuple(models.resnet(batch=8, image=32, widths=(16, 32, 64), blocks_per_stage=2)[:2]),
    "gpt-2l-dropout": lambda: tuple(models.gpt(layers=2, dropout=0.1)[:2]),
    # the dropout GPT at a 10-50 ms step, where the executor's fixed costs weigh less
    # (benchmarks/check_compiled_gap.py --model gpt-4l-dropout; not in the table)
    "gpt-4l-dropout": lambda: tuple(models.gpt(batch=2, seq=64, d=128, heads=4, layers=4, vocab=256,
                                               dropout=0.1)[:2]),
}


def _log(message: str) -> None:
    print(f"[compile {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(candidate: torch.nn.Module, eager: torch.nn.Module, args: tuple, steps: int) -> dict:
    """Gradient error (its step also compiles a compiled candidate: timed as compile_s), the median
    step-time ratio of `steps` back-to-back pairs, the allocator's peak of one step."""
    start = time.perf_counter()
    error = gradient_error(eager, candidate, args)
    first_s = time.perf_counter() - start
    times, ratios = [], []
    for i in range(steps):
        t = _timed_step(candidate, args, i, CLOCK)
        times.append(t)
        ratios.append(t / _timed_step(eager, args, i, CLOCK))
    candidate.zero_grad(set_to_none=True)
    peak, _ = allocator_peak(lambda: _step(candidate, args, 0), tensors_of(candidate, args))
    return {"first_s": first_s, "step_s": statistics.median(times),
            "measured_overhead": statistics.median(ratios), "measured_peak": peak, "grad_error": error}


def inductor_budget(model: torch.nn.Module, args: tuple, budget: float) -> torch.nn.Module:
    """``torch.compile(model, backend="inductor")`` partitioned under `budget` (compiled at its first
    step, inside the config patch; the AOT autograd cache off so each budget is partitioned anew)."""
    torch._dynamo.reset()  # a fresh cache: recompiles of the same forward would hit Dynamo's limit
    compiled = torch.compile(copy.deepcopy(model), backend="inductor", dynamic=False)
    with torch._functorch.config.patch(activation_memory_budget=budget, enable_autograd_cache=False):
        _step(compiled, args, 0)
    return compiled


def memviz_rows(model: torch.nn.Module, args: tuple, eager: torch.nn.Module, fractions: tuple[float, ...],
                steps: int, eager_schedule: bool) -> tuple[dict, list[dict]]:
    start = time.perf_counter()
    prof = memviz.profile(model, args, mode="train")
    info = {"profile_s": time.perf_counter() - start, "eager_predicted": prof.baseline.peak_bytes}
    low = minimum_budget(prof.graph, "rotor")
    info["minimum"] = low
    plans = [("eager schedule", memviz.plan(prof, strategy="none", frontier=False, packing=False))] \
        if eager_schedule else []
    for f in fractions:
        budget = low + int(f * (prof.baseline.peak_bytes - low))
        plans.append((_setting(f), memviz.plan(prof, budget, strategy="auto", time_limit=10.0,
                                                frontier=False)))
    rows = []
    for setting, plan in plans:
        base = {"contender": "memviz", "setting": setting, "strategy": str(plan.strategy),
                "budget": plan.budget_bytes, "plan_peak": plan.peak_bytes,
                "predicted_overhead": plan.time_overhead, "recomputes": plan.timeline.recomputes}
        uncompiled = memviz.export(plan, model=copy.deepcopy(model))
        rows.append({**base, "compiled": False, **measure(uncompiled, eager, args, steps)})
        r = rows[-1]
        uncompiled.zero_grad(set_to_none=True)
        tracked, _ = measure_peak(functools.partial(_step, uncompiled, args, 0), tensors_of(uncompiled, args))
        base["unmodelled"] = r["unmodelled"] = r["measured_peak"] - tracked
        _log(f"memviz {setting}: {r['measured_overhead']:.3f}x, {r['measured_peak'] / MiB:.2f} MiB")
        torch._dynamo.reset()
        exported = memviz.export(plan, model=copy.deepcopy(model))
        row = measure(torch.compile(exported, backend="inductor"), eager, args, steps)
        if not exported._compiled:  # the module ran its uncompiled code: the row would be mislabelled
            raise RuntimeError("torch.compile did not reach memviz's compiled path")
        code = next(iter(exported._compiled.values()))[1]
        rows.append({**base, "compiled": True, "segments": len(code.graphs), **row})
        _log(f"memviz {setting} compiled: {row['measured_overhead']:.3f}x, "
             f"{row['measured_peak'] / MiB:.2f} MiB ({row['first_s']:.0f} s first step)")
    return info, rows


def _setting(fraction: float) -> str:
    return f"{int(fraction * 100)}%" if fraction else "0% (rotor minimum)"


def torch_rows(model: torch.nn.Module, args: tuple, eager: torch.nn.Module, budgets: tuple[float, ...],
               steps: int) -> list[dict]:
    rows = []
    for b in budgets:
        start = time.perf_counter()
        candidate = inductor_budget(model, args, b)
        compile_s = time.perf_counter() - start
        rows.append({"contender": "torch.compile", "setting": f"activation_memory_budget {b}", "budget": b,
                     "compiled": True, "compile_s": compile_s, **measure(candidate, eager, args, steps)})
        _log(f"inductor {b}: {rows[-1]['measured_overhead']:.3f}x, {rows[-1]['measured_peak'] / MiB:.2f} MiB "
             f"({compile_s:.0f} s compile)")
    return rows


def at_equal_memory(ours: list[dict], peers: list[dict]) -> list[dict]:
    """For each Inductor budget: memviz's fastest compiled row (with eager's gradients) whose measured
    peak is no higher, and the memviz / Inductor step-time ratio (< 1: memviz faster)."""
    good = [r for r in ours if r["compiled"] and r["grad_error"] <= GRAD_TOLERANCE]
    out = []
    for p in peers:
        fits = [r for r in good if r["measured_peak"] <= p["measured_peak"]]
        best = min(fits, key=lambda r: r["measured_overhead"], default=None)
        out.append({"peer": p["setting"], "peer_peak": p["measured_peak"],
                    "peer_overhead": p["measured_overhead"], "peer_grad_error": p["grad_error"],
                    "ours": None if best is None else {k: best[k] for k in ("setting", "measured_peak",
                                                                            "measured_overhead")},
                    "ratio": None if best is None else best["measured_overhead"] / p["measured_overhead"]})
    return out


def bench_model(name: str, settings: Settings) -> dict:
    torch.manual_seed(0)
    model, args = MODELS[name]()
    dropout = name.endswith("dropout")
    fractions, budgets = (DROPOUT_POINTS if dropout and settings is FULL
                          else (settings.fractions, settings.torch_budgets))
    eager = copy.deepcopy(model)
    _step(eager, args, 0)
    eager_s = statistics.median(_timed_step(eager, args, i, CLOCK) for i in range(settings.steps))
    eager.zero_grad(set_to_none=True)
    eager_peak, _ = allocator_peak(lambda: _step(eager, args, 0), tensors_of(eager, args))
    noise = measure(copy.deepcopy(model), eager, args, settings.steps)["measured_overhead"]
    _log(f"{name}: eager {eager_s * 1e3:.1f} ms, {eager_peak / MiB:.2f} MiB, noise {noise:.3f}")
    info, ours = memviz_rows(model, args, eager, fractions, settings.steps, not dropout)
    peers = torch_rows(model, args, eager, budgets, settings.steps)
    return {"model": name, "params": sum(p.numel() for p in model.parameters()), "eager_step_s": eager_s,
            "eager_peak": eager_peak, "eager_vs_eager": noise, "memviz": info, "ours": ours, "peers": peers,
            "equal_memory": at_equal_memory(ours, peers)}


# --- report ----------------------------------------------------------------------------------------------
def _mib(b: int) -> str:
    return f"{b / MiB:.3f}"


def _rows_table(m: dict) -> list[str]:
    default = next((p for p in m["peers"] if p["budget"] == 1.0), None)
    out = ["| contender | setting | compiled | plan peak MiB | measured peak MiB | vs eager peak | "
           "unmodelled MiB | measured - unmodelled vs plan | "
           "predicted | step time vs eager | vs torch.compile default | gradient error | first step s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
           f"| eager | | no | | {_mib(m['eager_peak'])} | 1.00 | | | 1.000 | 1.000 (noise: eager copy "
           f"{m['eager_vs_eager']:.3f}) | | 0 | |"]
    for r in m["ours"] + m["peers"]:
        plan = _mib(r["plan_peak"]) if "plan_peak" in r else ""
        pred = f"{r['predicted_overhead']:.3f}" if "predicted_overhead" in r else ""
        vs = f"{r['measured_overhead'] / default['measured_overhead']:.3f}" if default and r["compiled"] \
            else ""
        how = "inductor" if r["compiled"] else "no"
        extra = r["measured_peak"] - r["unmodelled"] - r["plan_peak"] if "unmodelled" in r else None
        unmodelled = _mib(r["unmodelled"]) if "unmodelled" in r else ""
        net = "" if extra is None else f"{extra / MiB:+.3f}" + (" OVER" if extra > 0 else "")
        out.append(f"| {r['contender']} | {r['setting']} | {how} | {plan} | "
                   f"{_mib(r['measured_peak'])} | {r['measured_peak'] / m['eager_peak']:.2f} | "
                   f"{unmodelled} | {net} | {pred} | "
                   f"{r['measured_overhead']:.3f} | {vs} | {r['grad_error']:.1e} | {r['first_s']:.1f} |")
    return out


def _equal_table(m: dict) -> list[str]:
    out = ["| Inductor budget | its peak MiB | its time | its grad error | memviz compiled point | "
           "memviz peak MiB | memviz time | memviz / Inductor |", "|---|---|---|---|---|---|---|---|"]
    for e in m["equal_memory"]:
        head = (f"| {e['peer']} | {_mib(e['peer_peak'])} | {e['peer_overhead']:.3f} | "
                f"{e['peer_grad_error']:.1e} |")
        o = e["ours"]
        if o is None:
            low = _lowest(m)
            over = None if low is None else low["measured_peak"] - e["peer_peak"]
            by = "" if low is None else (f" (its lowest, {low['setting']}, {_mib(low['measured_peak'])} MiB, "
                                         f"is {over / MiB:.3f} MiB / {over / e['peer_peak']:.1%} higher)")
            out.append(f"{head} none at or below this peak: memviz LOSES{by} | | | |")
            continue
        out.append(f"{head} {o['setting']} | {_mib(o['measured_peak'])} | {o['measured_overhead']:.3f} | "
                   f"{e['ratio']:.2f} ({verdict(e['ratio'], noise_band(m))}) |")
    return out


def _lowest(m: dict) -> dict | None:
    """memviz's compiled row with eager's gradients and the lowest measured peak (None: no such row)."""
    return min((r for r in m["ours"] if r["compiled"] and r["grad_error"] <= GRAD_TOLERANCE),
               key=lambda r: r["measured_peak"], default=None)


def _minimum_line(m: dict) -> list[str]:
    """The minimum point, uncompiled and compiled: whether compiling goes below the plan's lowest."""
    rows = [r for r in m["ours"] if r["setting"] == _setting(0.0)]
    if len(rows) != 2:
        return []
    plain, fused = sorted(rows, key=lambda r: r["compiled"])
    diff = fused["measured_peak"] - plain["measured_peak"]
    how = "lower" if diff < 0 else "higher" if diff > 0 else "the same"
    peer = min(m["peers"], key=lambda p: p["measured_peak"])
    return [f"memviz at its minimum budget ({_mib(plain['budget'])} MiB, plan {_mib(plain['plan_peak'])} "
            f"MiB): {_mib(plain['measured_peak'])} MiB measured uncompiled, {_mib(fused['measured_peak'])} "
            f"compiled ({diff:+,} B: compiled {how}); Inductor's lowest, {peer['setting']}, "
            f"{_mib(peer['measured_peak'])} MiB.", ""]


def markdown(result: dict) -> str:
    method = (
        "Training steps on CPU, one intra-op thread. Step time: the step's CPU time on that thread (every "
        "kernel runs there; wall time on the shared cores mostly measured the scheduler), median of "
        f"{result['steps']} back-to-back (candidate, eager) pair ratios; the eager copy's ratio is the "
        "noise floor. Peak: the CPU allocator's high-water mark during one step (torch.profiler memory "
        "events, `memviz.profiling.tracker.allocator_peak`), the same for every row; it counts the RNG "
        "states the "
        "export keeps for dropout replay and kernel workspaces, which plans do not. Predicted: the plan's "
        "time overhead against eager (the cost model knows neither the executor's fixed cost nor fusion). "
        "memviz budgets are fractions of [rotor minimum, eager peak]. Compiled memviz: "
        "`torch.compile(memviz.export(plan), backend=\"inductor\")`, the plan's step functions compiled as "
        "forward graphs, one segment per phase, memviz's CPU dropout saving and replaying its RNG state "
        "inside the graph (other random ops cut a phase into segments; `memviz.runtime.compiled`; "
        "Inductor fuses inside a segment, its "
        "reordering passes are off: they moved kernels against the plan's order, and a value several "
        "kernels read is stored once, as the plan holds it). torch.compile: "
        "`activation_memory_budget` "
        "set while it compiles. Gradient error: max |g - g_eager| / max |g_eager| after a step with the "
        f"same seed (tolerance {GRAD_TOLERANCE:.0e}); with dropout, Inductor's recomputation draws fresh "
        "masks. First step: the step that compiles (seconds, loaded machine).")
    out = ["## The executor table: memviz exported and compiled vs torch.compile's budgets", "", method, ""]
    for m in result["models"]:
        mv = m["memviz"]
        out += [f"### {m['model']} ({m['params'] / 1e6:.2f} M parameters)", "",
                f"Eager {m['eager_step_s'] * 1e3:.1f} ms per step, {_mib(m['eager_peak'])} MiB measured "
                f"({_mib(mv['eager_predicted'])} predicted by the profile, which counts no RNG states or "
                f"workspaces); rotor minimum {_mib(mv['minimum'])} MiB.", ""]
        out += _rows_table(m) + [""] + _minimum_line(m)
        out += ["At equal or lower measured memory, memviz compiled against each Inductor budget:", ""]
        out += _equal_table(m) + [""]
    return "\n".join(out + [NOTES, ""])


#: what `check_compiled_gap.py` found about this table's gaps (separate runs: one fixed plan, every contender
#: in one process), printed under the table so a re-run keeps it; its numbers are those runs', cited as such
NOTES = (
    "Where the gaps go (`python benchmarks/check_compiled_gap.py --model M --fraction F --pairs N`: one plan "
    "on fixed V100-roofline op times, every contender in one process, CPU-time pairs). ResNet, eager schedule"
    " (compile28, 15 pairs, load 15-19): Inductor's default runs every CPU convolution channels-last (its "
    "layout optimisation), which memviz's segments turn off because the segment then holds a channels-last "
    "copy beside the contiguous value the plan keeps; Inductor with it off runs 1.138x its default, memviz "
    "compiled 1.120x, so that is the whole gap. Letting segments return channels-last values (layout "
    "optimisation on, `keep_output_stride` off) runs 1.017x but measured +0.172 MiB over the plan in the last"
    " backward segment; against the uncompiled export's measured peak (which holds oneDNN's convolution "
    "workspace, a weight-sized buffer no plan counts) the same setting measured +0.172 / -0.055 / +0.129 MiB "
    "at the eager schedule / 50 % / 25 %, and with the convolution weights also stored channels-last outside "
    "the step +0.031 / -0.196 / -0.652 MiB (cl30, one fixed plan each, one process per fraction): the "
    "channels-last convolution backward's scratch is two weight-sized buffers (294,912 B) where the "
    "contiguous one's is 262,144 B, so the eager schedule still measures 32 KiB over, and its gradient error "
    "is 8.3e-05 against 3.8e-06 shipped (tolerance 1e-04): not shipped. `realize_reads_threshold` 0 (every "
    "value several kernels read stored once, as the plan holds it) costs no measurable speed. GPT-4l has no "
    "convolutions: its compiled plans run at Inductor's default speed where both reach; at the rotor minimum "
    "its compiled plan measured 789,504 B over its plan (cmin32, three runs): Inductor fused the plan's "
    "three recomputations of one LayerNorm side by side into one kernel at the first (3 x (256 KiB output + "
    "1 KiB statistics) held across what the plan put between them); memviz's segments now refuse horizontal "
    "fusion across operators (cmin33, `memviz.runtime.compiled._plan_order_choices`), and 526,336 B remain, "
    "about 2 KiB over the budget: a recomputed LayerNorm fused vertically with the LayerNorm backward that "
    "reads its statistics, which so runs before the matmul the plan put between them. It is the one compiled "
    "point over its plan; `memviz.export(plan, verify=True, backend=\"inductor\")` measures such a step and "
    "re-plans (here once, then under the budget; before cmin33 it refused). Dropout "
    "GPTs (compile29, 50 % plan): the RNG states saved and replayed inside the graph make 3 segments where "
    "cutting at every random op made 11-18. On the 2-layer model (3.4-4.3 ms step) the exported module's "
    "forward was marked `disable(recursive=False)`, which ran Dynamo's Python frame callback at every step: "
    "0.17-0.23 of an eager step, the compiled 50 % plan 1.50-1.59x Inductor's step against 1.29x once marked "
    "by `skip` (cmin32, `python benchmarks/check_compiled_fixed_cost.py`, 30 pairs, load 8-10); of that "
    "step 2.5 ms runs inside the compiled segments (the plan recomputes 10 ops) and 2.2 ms outside (the "
    "driver, autograd's two Function nodes, loss and seed), against Inductor's whole step of 3.3 ms. On a "
    "4-layer one (18.8 ms) it ran 0.97-1.01x eager, 0.87-0.91x Inductor's default, at 8.52 MiB against "
    "9.27, with eager's masks (Inductor's recomputation draws fresh ones).")


def headline(result: dict) -> list[dict]:
    rows = []
    for m in result["models"]:
        eq = m["equal_memory"]
        won = sum(e["ratio"] is not None and verdict(e["ratio"], noise_band(m)) == "faster" for e in eq)
        lost = sum(e["ours"] is None for e in eq)
        worst = max((e for e in eq if e["ratio"] is not None), key=lambda e: e["ratio"], default=None)
        rows.append({"metric": f"compile {m['model']}: memviz compiled vs Inductor's budgets at equal or "
                               f"lower measured memory ({len(eq)} budgets)",
                     "ours": f"{won} faster, {lost} below memviz's lowest peak",
                     "baseline": "" if worst is None else f"worst: {worst['peer']}",
                     "ratio": "" if worst is None else f"{worst['ratio']:.2f}"})
    return rows


def run(quick: bool = False, only: tuple[str, ...] = (), merge_into: Path | None = None) -> dict:
    """Every model of the settings, or `only` those, their entries replacing those of the result at
    `merge_into` (when it exists and was not a --quick run)."""
    torch.set_num_threads(1)  # as bench_remat: contended OpenMP threads make step times erratic
    settings = SMOKE if quick else FULL
    found = []
    for name in only or settings.models:
        start = time.perf_counter()
        found.append(bench_model(name, settings))
        _log(f"{name} done in {time.perf_counter() - start:.0f} s")
    if only and merge_into is not None and merge_into.exists():
        import json

        kept = json.loads(merge_into.read_text())
        if not kept.get("quick"):
            found = [next((m for m in found if m["model"] == k["model"]), k) for k in kept["models"]] + \
                [m for m in found if m["model"] not in {k["model"] for k in kept["models"]}]
    result = {"name": "compile", "title": "The executor table: memviz exported and compiled vs torch.compile",
              "steps": settings.steps, "quick": quick, "models": found}
    result["headline"] = headline(result)
    result["markdown"] = markdown(result)
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from run import HERE, bench_main

    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--models", default="", help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    known, rest = pick.parse_known_args(argv)
    only = tuple(m for m in known.models.split(",") if m)
    if unknown := [m for m in only if m not in MODELS]:
        raise SystemExit(f"unknown models {unknown}: choose from {list(MODELS)}")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--out", type=Path, default=HERE / "results" / "compile.json")
    out = where.parse_known_args(rest)[0].out  # bench_main parses it again and writes there
    return bench_main(lambda quick: run(quick, only, out), "compile", __doc__, rest,
                      "the small dropout GPT, one point per contender")


if __name__ == "__main__":
    raise SystemExit(main())
