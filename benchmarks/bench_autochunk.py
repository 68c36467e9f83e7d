"""AutoChunk on CPU: activation memory and time of GPT-style prefill, chunked vs unchunked.

    python benchmarks/bench_autochunk.py [--seqs 2048 4096 8192] [--budget 0.2]

For each sequence length: plan chunks at `budget` x the unchunked activation peak, measure the peak of
live storages (dispatch-mode tracker) and the wall time (best of `--reps`) of the exported module and
of the chunked one.  Then the longest sequence that fits a fixed byte budget, unchunked vs chunked
(estimates, checked by measuring the chunked module at that length).  Writes
benchmarks/results/autochunk.json.  Not a test: one run, numbers as measured on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from memviz import chunking as ch  # noqa: E402
from solvers import autochunk as ac  # noqa: E402


class Block(nn.Module):
    """GPT-2 block: fused qkv Linear + split, explicit causal softmax attention, GELU MLP."""

    def __init__(self, C: int, H: int) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.H = H

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, 2)
        )
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 512, C: int = 64, H: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.blocks = nn.Sequential(*(Block(C, H) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(self.wte(idx)))[:, -1])  # prefill: next-token logits


class ViT(nn.Module):
    """ViT: patch-embedding conv, class token, nn.TransformerEncoderLayer stack, head."""

    def __init__(self, C: int = 64, patch: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, C, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, C))
        self.layers = nn.Sequential(
            *(
                nn.TransformerEncoderLayer(C, 2, 4 * C, batch_first=True, activation="gelu")
                for _ in range(layers)
            )
        )
        self.head = nn.Linear(C, 10)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return self.head(self.layers(x)[:, 0])


def best_time(fn, x, reps: int) -> float:
    with torch.no_grad():
        fn(x)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - t0)
    return min(ts)


def run_length(model: nn.Module, T: int, budget: float, reps: int, x: torch.Tensor | None = None) -> dict:
    x = torch.randint(0, 512, (1, T)) if x is None else x
    t0 = time.perf_counter()
    plan = ch.plan_chunks(model, (x,), budget=budget)
    plan_s = time.perf_counter() - t0
    gm, cm = plan.gm, plan.module()
    base_peak, ref = ch.measure_activation_bytes(gm, x)
    peak, out = ch.measure_activation_bytes(cm, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    t_base, t_chunk = best_time(gm, x, reps), best_time(cm, x, reps)
    row = {
        "seq": T,
        "budget_fraction": budget,
        "plan_seconds": round(plan_s, 2),
        "requested_bytes": plan.budget_bytes,
        "estimated_bytes": plan.peak_bytes,
        "met": plan.met,
        "unchunked_measured_bytes": base_peak,
        "chunked_measured_bytes": peak,
        "memory_reduction": 1 - peak / base_peak,
        "unchunked_s": t_base,
        "chunked_s": t_chunk,
        "slowdown": t_chunk / t_base - 1,
        "estimated_slowdown": plan.slowdown,
        "regions": [
            {k: c[k] for k in ("start", "end", "chunks", "chunk_size", "outputs")} for c in plan.chunks
        ],
    }
    print(
        f"T={T}: activations {base_peak / 2**20:.1f} -> {peak / 2**20:.1f} MiB "
        f"(-{100 * row['memory_reduction']:.1f}%, requested {plan.budget_bytes / 2**20:.1f} MiB, "
        f"estimated {plan.peak_bytes / 2**20:.1f}), time {t_base:.3f} -> {t_chunk:.3f} s "
        f"({100 * row['slowdown']:+.1f}%, estimated {100 * plan.slowdown:+.1f}%), "
        f"{len(plan.regions)} regions, "
        f"planned in {plan_s:.1f} s",
        flush=True,
    )
    return row


def max_length(model: nn.Module, budget_bytes: int, lengths: list[int]) -> dict:
    """Longest length in `lengths` whose estimated activation peak fits, unchunked and chunked; the
    chunked winner is measured."""
    speed = ch.calibrate("cpu")
    best_plain = best_chunked = 0
    measured = None
    for T in lengths:
        x = torch.randint(0, 512, (1, T))
        _, g = ch.capture(model, (x,))
        if ac.estimate_memory(g).peak_bytes <= budget_bytes:
            best_plain = T
        plan = ch.plan_chunks(model, (x,), budget=budget_bytes, speed=speed)
        if plan.met:
            best_chunked = T
            measured = (T, plan)
        else:
            break
    row = {
        "budget_bytes": budget_bytes,
        "max_seq_unchunked": best_plain,
        "max_seq_chunked": best_chunked,
        "ratio": best_chunked / best_plain if best_plain else None,
    }
    if measured:
        T, plan = measured
        peak, _ = ch.measure_activation_bytes(plan.module(), torch.randint(0, 512, (1, T)))
        row["chunked_measured_bytes_at_max"] = peak
    print(
        f"budget {budget_bytes / 2**20:.1f} MiB: max seq {best_plain} unchunked, {best_chunked} chunked "
        f"({row['ratio']}x); measured {row.get('chunked_measured_bytes_at_max', 0) / 2**20:.1f} MiB",
        flush=True,
    )
    return row


# --------------------------------------------------------------------------------------------------
# torch.compile's own chunker (torch/_inductor/fx_passes/auto_chunker), where it applies
# --------------------------------------------------------------------------------------------------
class LinearCE(nn.Module):
    """The pattern inductor's auto_chunker targets (its own test model, LinearAndCEL): a projection to
    a large vocabulary followed by cross-entropy, trained."""

    def __init__(self, C: int, V: int) -> None:
        super().__init__()
        self.linear, self.V = nn.Linear(C, V), V

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.linear(x).view(-1, self.V), y.view(-1))


def allocator_peak(fn) -> int:
    """Peak bytes the CPU allocator held above its level when `fn()` started, from torch.profiler's
    memory events: they see the buffers inside inductor's compiled code, which a dispatch-mode
    tracker cannot (the generated wrapper allocates without dispatching)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    if not events:
        return 0
    events.sort(key=lambda e: e["ts"])
    start = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in events) - start


def _compiled(model: nn.Module, chunker: bool | None):
    """(callable, count of graphs the auto_chunker rewrote so far): eager for None, else inductor with
    the chunker off/on.  The FX and autograd caches are off so the pass really runs and is counted."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics

    if chunker is None:
        return model, lambda: 0
    torch._dynamo.reset()
    metrics.reset()
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    return torch.compile(model, options={"auto_chunker.enable": chunker}), lambda: metrics.num_auto_chunking


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def inductor_training(BT: int, C: int, V: int, reps: int) -> dict:
    """Linear + cross-entropy training step: eager, inductor, inductor + auto_chunker.  Peak bytes of
    one forward+backward (gradients included), median time, and gradients against eager."""
    torch.manual_seed(0)
    model = LinearCE(C, V)
    x, y = torch.randn(BT, C, requires_grad=True), torch.randint(0, V, (BT,))
    rows, ref = [], None
    for name, chunker in (("eager", None), ("inductor", False), ("inductor + auto_chunker", True)):
        fn, rewritten = _compiled(model, chunker)

        def step(fn=fn) -> torch.Tensor:
            x.grad = None
            model.zero_grad(set_to_none=True)
            loss = fn(x, y)
            loss.backward()
            return loss

        t0 = time.perf_counter()
        step()  # compiles
        compile_s = time.perf_counter() - t0
        x.grad = None
        model.zero_grad(set_to_none=True)
        peak = allocator_peak(lambda fn=fn: fn(x, y).backward())
        t = _median_time(step, reps)
        grads = (x.grad.clone(), model.linear.weight.grad.clone())
        ref = ref or grads
        rows.append(
            {
                "config": name,
                "chunked_graphs": rewritten(),
                "peak_bytes": peak,
                "median_s": t,
                "compile_s": round(compile_s, 1),
                "max_grad_diff": max((a - b).abs().max().item() for a, b in zip(grads, ref, strict=True)),
            }
        )
        print(f"Linear+CE train {name}: peak {peak / 2**20:.1f} MiB, {t:.3f} s", flush=True)
    return {"model": f"Linear({C}, {V}) + cross_entropy, {BT} tokens, training step", "rows": rows}


def inductor_inference(model: nn.Module, T: int, budget: float, reps: int) -> dict:
    """The GPT prefill (inference): eager, inductor + auto_chunker, memviz chunks, all measured with
    the same allocator counter.  The chunker needs a backward: an inference graph has no tangents
    and `auto_chunker.chunk` returns it unchanged (torch/_inductor/fx_passes/auto_chunker/__init__.py)."""
    x = torch.randint(0, 512, (1, T))
    plan = ch.plan_chunks(model, (x,), budget=budget)
    chunked = plan.module()
    rows = []
    with torch.no_grad():
        ref = model(x)
        for name, chunker in (("eager", None), ("inductor + auto_chunker", True), ("memviz autochunk", None)):
            memviz = name.startswith("memviz")
            fn, rewritten = (chunked, lambda: 0) if memviz else _compiled(model, chunker)
            fn(x)  # compiles
            peak = allocator_peak(lambda fn=fn: fn(x))
            t = _median_time(lambda fn=fn: fn(x), reps)
            torch.testing.assert_close(fn(x), ref, rtol=1e-4, atol=1e-4)
            rows.append(
                {
                    "config": name,
                    "chunked_graphs": rewritten(),
                    "regions": len(plan.regions) if memviz else 0,
                    "peak_bytes": peak,
                    "median_s": t,
                }
            )
            print(f"GPT prefill T={T} {name}: peak {peak / 2**20:.1f} MiB, {t:.3f} s", flush=True)
    return {"model": f"GPT prefill (bench model), {T} tokens, inference", "rows": rows}


def inductor_markdown(ind: dict) -> list[str]:
    out = [
        "",
        "### torch.compile's auto_chunker (`torch._inductor.config.auto_chunker.enable`)",
        "",
        "Inductor's pass chunks one amplifying `mm`/`addmm` (output > 1 MiB and > 8x its inputs) and the "
        "ops after it along the batch dim, forward and backward, in *training* graphs only (it needs "
        "tangents). Peak = CPU allocator bytes above the start (torch.profiler memory events), median "
        "wall time; 'graphs' = graphs the pass rewrote (memviz: chunk regions in brackets).",
        "",
        "| workload | config | graphs | peak MiB | median s | vs first row |",
        "|---|---|---|---|---|---|",
    ]
    for part in ("training", "inference"):
        rows = ind[part]["rows"]
        for r in rows:
            regions = f" ({r['regions']})" if r.get("regions") else ""
            out.append(
                f"| {ind[part]['model']} | {r['config']} | {r['chunked_graphs']}{regions} | "
                f"{r['peak_bytes'] / 2**20:.1f} | {r['median_s']:.3f} | "
                f"{r['peak_bytes'] / max(rows[0]['peak_bytes'], 1):.2f}x memory, "
                f"{r['median_s'] / rows[0]['median_s']:.2f}x time |"
            )
    out += [
        "",
        "memviz autochunk plans inference only (a training profile gets an error pointing to "
        "rematerialization), so it has no row on the training workload; the auto_chunker does not "
        "touch the inference one (0 graphs rewritten).",
    ]
    return out


def markdown(result: dict) -> str:
    """The RESULTS.md section (benchmarks/run.py): measured activation memory and time, chunked vs not."""
    out = ["## Activation chunking (AutoChunk) for long-sequence inference", "",
           f"{result['benchmark']}; {result['threads']} thread(s). Paper: >80% less activation memory at "
           "<10% slowdown; issue target: >=80% less at <=15% slower on CPU.", "",
           "| model | seq | activations unchunked MiB | chunked MiB | reduction | slowdown (measured) | "
           "slowdown (estimated) |", "|---|---|---|---|---|---|---|"]
    rows = [("GPT", r) for r in result["lengths"]] + [("ViT", r) for r in result["vit"]["rows"]]
    for name, r in rows:
        out.append(f"| {name} | {r['seq']} | {r['unchunked_measured_bytes'] / 2**20:.1f} | "
                   f"{r['chunked_measured_bytes'] / 2**20:.1f} | {100 * r['memory_reduction']:.1f}% | "
                   f"{100 * r['slowdown']:+.1f}% | {100 * r['estimated_slowdown']:+.1f}% |")
    m = result.get("max_length")
    if m:
        out += ["", f"Maximum sequence length under a {m['budget_bytes'] / 2**20:.0f} MiB activation budget: "
                f"{m['max_seq_unchunked']} unchunked, {m['max_seq_chunked']} chunked ({m['ratio']}x; "
                "paper 3.2x-11.7x; the search stops at the longest length tried)."]
    if result.get("inductor"):
        out += inductor_markdown(result["inductor"])
    return "\n".join(out) + "\n"


def run(quick: bool = False, *, seqs: list[int] | None = None, budget: float = 0.2, reps: int | None = None,
        threads: int = 1, max_len_budget_mib: float = 64.0) -> dict:
    """GPT prefill lengths (+ max-length search and ViT unless `quick`: one 512-token length, one rep)."""
    seqs = seqs or ([512] if quick else [2048, 4096, 8192])
    reps = reps or (1 if quick else 3)
    torch.manual_seed(0)
    # one thread: on a shared machine, idle-spinning OpenMP workers make every small op (many in
    # a chunk loop) pay for other processes' load, which would say more about the load than the plan
    torch.set_num_threads(threads)
    model = GPT().eval()
    rows = [run_length(model, T, budget, reps) for T in seqs]
    lengths = [1024 * k for k in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)]
    maxlen = None if quick else max_length(model, int(max_len_budget_mib * 2**20), lengths)
    vit = ViT().eval()
    vit_rows = [] if quick else [
        run_length(vit, (side // 4) ** 2 + 1, budget, reps, torch.randn(1, 3, side, side))
        for side in (128, 256)
    ]
    inductor = None if quick else {
        "training": inductor_training(4096, 64, 8192, max(reps, 3)),
        "inference": inductor_inference(model, seqs[0], budget, max(reps, 3)),
    }
    result = {
        "name": "autochunk",
        "title": "Activation chunking",
        "benchmark": "autochunk GPT prefill (2 layers, C=64, H=2, vocab 512), CPU",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "speed_model": ch.calibrate("cpu").to_dict(),
        "lengths": rows,
        "max_length": maxlen,
        "vit": {"model": "ViT (2 TransformerEncoderLayer, C=64, patch 4); seq = tokens", "rows": vit_rows},
        "inductor": inductor,
    }
    result["markdown"] = markdown(result)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=None, help="default 2048 4096 8192 (512 quick)")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=None, help="default 3 (1 quick)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-len-budget-mib", type=float, default=64.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "autochunk.json"))
    ap.add_argument("--quick", action="store_true", help="lengths only: no max-length search, no ViT")
    a = ap.parse_args()
    result = run(a.quick, seqs=a.seqs, budget=a.budget, reps=a.reps, threads=a.threads,
                 max_len_budget_mib=a.max_len_budget_mib)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(result["markdown"])
    print("wrote", a.out)


if __name__ == "__main__":
    main()
