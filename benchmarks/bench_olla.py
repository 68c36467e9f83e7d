"""OLLA benchmarks: address packing of the MiniMalloc instances and reordering of a training graph.

Run: ``python benchmarks/bench_olla.py`` (about a minute on an idle 2-core machine).  Prints a table
and writes ``benchmarks/results/olla.json``.

1. MiniMalloc's challenging instances A-K (github.com/google/minimalloc, benchmarks/challenging,
   Apache-2.0; A-D with --quick) packed into capacity 1048576 by `solvers.olla.pack` (greedy, then
   the canonical search of `solvers.olla.canonical`, its preorders' searches taking turns in this
   process, then CP-SAT), with the time to fit per instance against issue 21's target (10 s on 2
   cores) and MiniMalloc's published result (its C++ solver fits every one: the set is published as
   instances that fit 1048576), the search's nodes (its work, the same on any machine), and
   greedy-by-size best fit (TFLite): the extra capacity greedy needs.
2. `solvers.olla.reorder` on a synthetic ~400-node transformer training graph (forward, loss,
   autograd-style backward with gradient accumulation, SGD updates): solve time and peak vs eager;
   then `pack_schedule` of the result (fragmentation) against the caching-allocator model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from solvers import DataKind, Graph, GraphBuilder, Phase, eager_schedule, simulate  # noqa: E402
from solvers.allocator import simulate_caching_allocator  # noqa: E402
from solvers.olla import PackingError, max_live, pack, pack_schedule, reorder  # noqa: E402
from solvers.olla.minimalloc import read_csv  # noqa: E402
from solvers.olla.pack import greedy_pack  # noqa: E402

MINIMALLOC = ROOT / "tests" / "fixtures" / "minimalloc"  # MiniMalloc instances (SOURCE.md there)
CAPACITY = 1048576
MiB = 2**20


def training_graph(layers: int = 12, *, seed: int = 0) -> Graph:
    """A synthetic transformer training graph (33 compute nodes per layer, 3 more for the loss).

    Forward per layer: layer norm, q/k/v projections (three branches), attention with workspace,
    output projection, residual add, MLP up, GELU, MLP down, residual add; then a loss.  Backward is
    generated autograd-style: one backward node per forward node that reads the output gradient, the
    saved inputs and its weights and writes the input and weight gradients, and an accumulation node
    where a tensor has several readers.  In-place SGD updates every parameter after its gradient
    (an 8-byte token is the required output), captured after the whole backward as PyTorch runs
    it.  Sizes vary by seed around 1 MiB activations and 4 MiB MLP and
    attention-score tensors; weights are 4 MiB each.
    """
    rng = random.Random(seed)
    b = GraphBuilder(f"train{layers}")

    def jitter(nbytes: int) -> int:
        return int(nbytes * rng.uniform(0.75, 1.25)) // 64 * 64

    act, wide, weight = MiB, 4 * MiB, 4 * MiB
    fwd: list[tuple[str, list[int], int, list[int]]] = []  # (name, tensor inputs, output, params)
    params: list[int] = []

    def param(name: str) -> int:
        params.append(b.data(name, jitter(weight), DataKind.PARAMETER))
        return params[-1]

    def op(name: str, ins: list[int], nbytes: int, ps: tuple[int, ...] = (), temp: int = 0) -> int:
        out = b.data(name, jitter(nbytes))
        b.compute(name, [*ins, *ps], [out], phase=Phase.FORWARD, temp_bytes=temp, time=1e-3)
        fwd.append((name, ins, out, list(ps)))
        return out

    h = b.data("x", act, DataKind.INPUT)
    for i in range(layers):
        n = op(f"l{i}.ln1", [h], act)
        q, k, v = (op(f"l{i}.{w}", [n], act, (param(f"l{i}.W{w}"),)) for w in "qkv")
        a = op(f"l{i}.attn", [q, k, v], act, temp=jitter(wide))
        o = op(f"l{i}.proj", [a], act, (param(f"l{i}.Wo"),))
        h = op(f"l{i}.add1", [h, o], act)
        u = op(f"l{i}.up", [op(f"l{i}.ln2", [h], act)], wide, (param(f"l{i}.W1"),))
        y = op(f"l{i}.down", [op(f"l{i}.gelu", [u], wide)], act, (param(f"l{i}.W2"),))
        h = op(f"l{i}.add2", [h, y], act)
    loss = op("loss", [h], 64)

    grads: dict[int, list[int]] = {loss: []}
    seed_grad = b.data("loss.grad", 64, DataKind.GRADIENT)
    b.compute("loss.grad", [loss], [seed_grad], phase=Phase.BACKWARD)
    grads[loss] = [seed_grad]
    pgrads: dict[int, int] = {}

    def total_grad(t: int) -> int:
        parts = grads.pop(t)
        if len(parts) == 1:
            return parts[0]
        g = b.data(f"{b._datas[t]['name']}.grad", b._datas[t]["bytes"], DataKind.GRADIENT)
        b.compute(f"{b._datas[t]['name']}.grad_acc", parts, [g], phase=Phase.BACKWARD)
        return g

    for name, ins, out, ps in reversed(fwd):
        g_out = total_grad(out)
        g_ins = [
            b.data(f"{name}.igrad{j}", b._datas[t]["bytes"], DataKind.GRADIENT) for j, t in enumerate(ins)
        ]
        g_ps = [b.data(f"{name}.pgrad", b._datas[p]["bytes"], DataKind.PARAMETER_GRADIENT) for p in ps]
        b.compute(f"{name}.bwd", [g_out, *ins, *ps], [*g_ins, *g_ps], phase=Phase.BACKWARD)
        pgrads.update(zip(ps, g_ps, strict=True))
        for t, g in zip(ins, g_ins, strict=True):
            grads.setdefault(t, []).append(g)
    outputs = [loss]
    for p in params:
        # in-place update: the parameter's storage is reused; a tiny token marks the step done
        done = b.data(f"{b._datas[p]['name']}.updated", 8, DataKind.OUTPUT)
        b.compute(f"{b._datas[p]['name']}.sgd_", [p, pgrads[p]], [done], phase=Phase.OPTIMIZER)
        outputs.append(done)
    b.outputs = outputs
    return b.build()


def _cpu_seconds() -> float:
    """CPU time of this process and of its ended children (none unless a portfolio is asked for)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


#: issue 21's target: every challenging instance fits within this many seconds on 2 cores
FIT_TARGET_S = 10.0


def bench_minimalloc(time_limit: float, names: str = "ABCDEFGHIJK") -> list[dict]:
    rows = []
    for name in names:
        path = MINIMALLOC / f"{name}.{CAPACITY}.csv"
        _, buffers = read_csv(path)
        greedy = min(greedy_pack(buffers, order)[1] for order in ("size", "lifetime", "area"))
        by_size = greedy_pack(buffers, "size")[1]
        start, cpu = time.perf_counter(), _cpu_seconds()
        try:
            packing = pack(buffers, CAPACITY, time_limit=time_limit)
            peak, status = packing.peak_bytes, packing.status
        except PackingError as exc:
            peak, status = None, f"no fit: {exc}"
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        rows.append({
            "instance": name, "buffers": len(buffers), "capacity": CAPACITY,
            "fits": peak is not None, "peak_bytes": peak,
            "lower_bound": max_live(buffers), "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 2),
            "within_target": peak is not None and seconds <= FIT_TARGET_S,
            "nodes": packing.extra["fit_nodes"] if peak is not None else None,
            "minimalloc": "fits",  # published: every instance of the set fits its capacity
            "search": ", ".join(packing.extra["segments"]) if peak is not None else "",
            "status": status, "greedy_by_size_peak": by_size,
            "greedy_by_size_extra_pct": round(100 * (by_size - CAPACITY) / CAPACITY, 2),
            "best_greedy_peak": greedy,
        })
    return rows


def bench_reorder(layers: int, time_limit: float) -> dict:
    graph = training_graph(layers)
    eager = simulate(graph, eager_schedule(graph)).peak_bytes
    start = time.perf_counter()
    result = reorder(graph, time_limit=time_limit)
    seconds = time.perf_counter() - start
    peak = simulate(graph, result.schedule).check().peak_bytes
    start = time.perf_counter()
    packing = pack_schedule(graph, result.schedule, time_limit=10.0)
    pack_seconds = time.perf_counter() - start
    torch_like = simulate_caching_allocator(graph, result.schedule)
    return {
        "graph": graph.name, "compute_nodes": len(graph.computes), "data_nodes": len(graph.datas),
        "seconds": round(seconds, 3), "eager_peak": eager, "peak": peak,
        "reduction_pct": round(100 * (eager - peak) / eager, 2), "status": result.stats.status,
        "bound": int(result.stats.bound or 0), "gap_pct": round(100 * (result.stats.gap or 0.0), 2),
        "chosen": result.stats.extra["chosen"],
        "packing": {"buffers": len(packing.buffers), "peak": packing.peak_bytes,
                    "lower_bound": packing.lower_bound,
                    "fragmentation_pct": round(100 * packing.fragmentation, 3),
                    "seconds": round(pack_seconds, 3), "status": packing.status},
        "caching_allocator": {"reserved": torch_like.peak_reserved, "allocated": torch_like.peak_allocated,
                              "fragmentation_pct": round(100 * torch_like.fragmentation, 2)},
    }


def bench_pack_time_limit(layers: int, time_limit: float) -> dict:
    """Issue 6: `pack_schedule` of a ~10k-buffer training schedule must return within its time limit
    (it took 82.6 s for a 3 s limit when the greedy incumbent was quadratic in Python)."""
    graph = training_graph(layers)
    schedule = eager_schedule(graph)
    start = time.perf_counter()
    packing = pack_schedule(graph, schedule, time_limit=time_limit)
    seconds = time.perf_counter() - start
    return {"buffers": len(packing.buffers), "time_limit": time_limit, "seconds": round(seconds, 3),
            "status": packing.status, "gap_pct": round(100 * packing.gap, 3),
            "fragmentation_pct": round(100 * packing.fragmentation, 3), "segments": packing.extra["segments"]}


#: the issue-21 promise: a solver returns within its time limit plus this many seconds
OVERRUN_TARGET_S = 0.5


def bench_time_limits(quick: bool) -> list[dict]:
    """How long `reorder` takes against its limit (issue 21: within limit + 0.5 s) on synthetic GPT
    training graphs (tests/gpt_chain.py) that use the whole limit: the exact one-shot CP-SAT model on a
    ~300-op graph at 5 s, and the window search on ~870 and ~2000 ops at 3 s.  These were wall-clock
    asserts in tests/test_reorder.py (<= 5.5 s and <= 4.5 s); on shared machines they are recorded
    here instead.  OR-Tools is imported first: its import (about a second) is not the solver's time."""
    sys.path.insert(0, str(ROOT / "tests"))
    from gpt_chain import gpt_graph
    from ortools.sat.python import cp_model  # noqa: F401

    from solvers.olla.reorder import EXACT_MAX_NODES

    rows = []
    cases = [(4, 1.0), (12, 1.0)] if quick else [(4, 5.0), (12, 3.0), (28, 3.0)]
    for layers, limit in cases:
        graph = gpt_graph(layers)
        start = time.perf_counter()
        result = reorder(graph, time_limit=limit)
        seconds = time.perf_counter() - start
        rows.append({"graph": graph.name, "compute_nodes": len(graph.computes), "time_limit": limit,
                     "seconds": round(seconds, 3), "overrun_s": round(seconds - limit, 3),
                     "within_target": seconds <= limit + OVERRUN_TARGET_S,
                     "search": "windows" if len(graph.computes) > EXACT_MAX_NODES else "exact",
                     "status": result.stats.status})
    return rows


def markdown(result: dict) -> str:
    """The RESULTS.md section (benchmarks/run.py)."""
    rows = result["minimalloc"]
    met = sum(r.get("within_target", False) for r in rows)
    out = ["## Address packing and reordering (OLLA, MiniMalloc instances)", "",
           f"MiniMalloc's challenging set, capacity {CAPACITY} bytes, {result['machine']['cpus']} cores "
           f"(load average {result['machine']['load_average_1min']} at the end of the run). Target (issue "
           f"21): each fits within {FIT_TARGET_S:.0f} s on 2 cores, as MiniMalloc's C++ solver does; before "
           "the canonical search of `solvers.olla.canonical`, A-D took 4-16 s and E-K did not fit "
           f"within 60 s. Met by {met} of {len(rows)} (wall time on this shared machine). CPU s: all "
           "processes of the call (the three preorders race in three processes), so CPU s / 2 is about "
           "the wall time 2 idle cores would need. MiniMalloc: its published result (the C++ solver fits "
           "every instance of the set). Nodes: canonical search nodes of the preorder that settled it; "
           "the race is deterministic (the fewest-nodes preorder's answer, whichever process finishes "
           "first), so nodes and offsets are the same on any machine. Search: how the fit was found "
           "(canonical = canonical search). Greedy = TFLite's greedy-by-size best fit.", "",
           "| instance | buffers | fits | MiniMalloc | peak | lower bound | time s | CPU s | within target "
           "| nodes | search | greedy-by-size needs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['instance']} | {r['buffers']} | {r['fits']} | {r.get('minimalloc', '-')} | "
                   f"{r['peak_bytes'] or '-'} | {r['lower_bound']} | {r['seconds']} | "
                   f"{r.get('cpu_seconds', '-')} | {'yes' if r.get('within_target') else 'no'} | "
                   f"{r.get('nodes') if r.get('nodes') is not None else '-'} | "
                   f"{r.get('search') or 'none found in the limit'} | +{r['greedy_by_size_extra_pct']}% |")
    o = result["reorder"]
    pk, ca = o["packing"], o["caching_allocator"]
    out += ["", "| reordering | ours | baseline | ratio |", "|---|---|---|---|",
            f"| peak of {o['graph']} ({o['compute_nodes']} ops), solved in {o['seconds']} s ({o['status']}, "
            f"gap {o['gap_pct']}%) | {o['peak'] / MiB:.1f} MiB | eager {o['eager_peak'] / MiB:.1f} MiB | "
            f"{o['peak'] / o['eager_peak']:.3f} |",
            f"| fragmentation of its packing ({pk['seconds']} s) | {pk['fragmentation_pct']}% | "
            f"PyTorch caching allocator model {ca['fragmentation_pct']}% | |", ""]
    lim = result.get("pack_time_limit")
    if lim:
        out += [f"Time limit: `pack_schedule` of a {lim['buffers']}-buffer training schedule with a "
                f"{lim['time_limit']} s limit returned in {lim['seconds']} s ({lim['status']}, gap to the "
                f"max-live bound {lim['gap_pct']}%; before the fix: 82.6 s for a 3 s limit).", ""]
    rows = result.get("time_limits")
    if rows:
        out += [f"Reordering against its time limit (target: limit + {OVERRUN_TARGET_S} s; load average "
                f"{result['machine']['load_average_1min']}):", "",
                "| graph | ops | search | limit s | took s | overrun s | within target |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r['graph']} | {r['compute_nodes']} | {r['search']} | {r['time_limit']} | {r['seconds']} "
                f"| {r['overrun_s']} | {'yes' if r['within_target'] else 'no'} |" for r in rows]
        out.append("")
    return "\n".join(out)


def headline(result: dict) -> list[dict]:
    """The RESULTS.md headline rows (benchmarks/run.py): the reordering and its packing, and issue 21
    item 2 against its anchors (MiniMalloc's C++ solver fits every instance; the 10 s target)."""
    o, rows = result["reorder"], result["minimalloc"]
    out = [{"metric": f"OLLA reordering, {o['compute_nodes']}-op training graph: peak vs eager order",
            "ours": f"-{o['reduction_pct']:.1f}% ({o['seconds']:.2f} s)", "baseline": "paper -22.5% / -10.1%",
            "ratio": f"{o['peak'] / o['eager_peak']:.2f}"},
           {"metric": "address packing fragmentation", "ours": f"{o['packing']['fragmentation_pct']:.2f}%",
            "baseline": f"caching allocator model {o['caching_allocator']['fragmentation_pct']:.1f}%",
            "ratio": ""}]
    slowest = max(rows, key=lambda r: r["seconds"])
    fits = sum(r["fits"] for r in rows)
    met = sum(r.get("within_target", False) for r in rows)
    names = f"{rows[0]['instance']}-{rows[-1]['instance']}"
    out.append({"metric": f"issue 21 item 2: MiniMalloc challenging set {names}, fits within "
                          f"{FIT_TARGET_S:.0f} s wall on {result['machine']['cpus']} cores",
                "ours": f"{fits} of {len(rows)} fit, {met} within target (slowest {slowest['instance']}: "
                        f"{slowest['seconds']:.1f} s wall, {slowest['cpu_seconds']} CPU s; load "
                        f"{result['machine']['load_average_1min']})",
                "baseline": f"MiniMalloc C++: all {len(rows)} fit; target {FIT_TARGET_S:.0f} s each",
                "ratio": f"{slowest['seconds'] / FIT_TARGET_S:.2f}"})
    lim = result.get("pack_time_limit")
    if lim:
        out.append({"metric": f"issue 21 item 2: pack_schedule of {lim['buffers']} buffers, "
                              f"{lim['time_limit']:.0f} s limit",
                    "ours": f"{lim['seconds']:.2f} s, gap to max-live {lim['gap_pct']}% ({lim['status']})",
                    "baseline": f"target: the max-live bound within the {lim['time_limit']:g} s",
                    "ratio": f"{lim['seconds'] / lim['time_limit']:.2f}"})
    return out


def run(quick: bool = False, *, pack_time_limit: float | None = None, reorder_time_limit: float = 5.0,
        layers: int | None = None) -> dict:
    """MiniMalloc packing + OLLA reordering of the training graph; `quick`: 2 layers, 5 s packing limit."""
    pack_limit = pack_time_limit if pack_time_limit is not None else (5.0 if quick else 120.0)
    packing = bench_minimalloc(pack_limit, "ABCD" if quick else "ABCDEFGHIJK")
    order = bench_reorder(layers if layers is not None else (2 if quick else 12), reorder_time_limit)
    limit = bench_pack_time_limit(30 if quick else 210, 3.0)
    limits = bench_time_limits(quick)
    machine = {"cpus": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 2)}
    result = {"name": "olla", "title": "Address packing and reordering", "machine": machine,
              "minimalloc": packing, "reorder": order, "pack_time_limit": limit, "time_limits": limits}
    result["markdown"] = markdown(result)
    result["headline"] = headline(result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, 5 s packing limit")
    ap.add_argument("--pack-time-limit", type=float, default=None, help="default 120 s (5 s with --quick)")
    ap.add_argument("--reorder-time-limit", type=float, default=5.0)
    ap.add_argument("--layers", type=int, default=None, help="training graph layers (12 -> ~400 nodes)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "olla.json")
    args = ap.parse_args(argv)
    result = run(args.quick, pack_time_limit=args.pack_time_limit, reorder_time_limit=args.reorder_time_limit,
                 layers=args.layers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["markdown"])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
