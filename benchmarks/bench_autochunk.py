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
