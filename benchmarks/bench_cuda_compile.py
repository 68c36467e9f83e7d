"""memviz plans under torch.compile on a GPU, against Inductor's own budgets (issues 19 and 22, on CUDA).

Run on a machine with a CUDA GPU: ``python benchmarks/bench_cuda_compile.py [--quick] [--out FILE]``.
Never in CI (no GPU there).  ``--device cpu --backend aot_eager`` runs the same code path on a CPU (the
allocator's peak from torch.profiler) to check the script, not to report.

On bench_cuda's Hugging Face GPT-2 (6 layers, 512 wide, 4 x 512 tokens, dropout 0.1, AdamW, its own
``labels=`` loss), one process measures training steps (forward, loss, backward, AdamW) of:

1. eager PyTorch (1.000) and per-block full checkpointing (non-reentrant ``checkpoint`` around each
   ``transformer.h.i``, what most users do by hand), eager and compiled;
2. ``torch.compile(model)`` (Inductor) under ``torch._functorch.config.activation_memory_budget`` 1.0,
   0.5 and 0.1: Inductor's own rematerialising min-cut, fused;
3. ``memviz.apply(plan, model)`` of ``strategy="sac"`` plans at 75 % / 50 % / 0 % of [the sac minimum,
   the eager peak] (planned on this device: `memviz.profile(device="cuda")`), eager and under
   ``torch.compile`` at torch's default budget (the plan's regions decide what is recomputed);
4. ``memviz.export(plan, verify=True, backend=...)`` of the ``auto`` plan at 50 %: memviz's own executor
   compiled (`memviz.runtime.compiled`), verified on the compiled step.

Per row: the step's peak allocated bytes (``max_memory_allocated`` over one step after warm-up, counted as
the candidate's own parameters, optimizer state and inputs plus what the step allocates above them, so
candidates that share the process compare), the reserved peak, the median step-time ratio to eager over
interleaved pairs, and the largest relative gradient difference from eager in a step with the same seed
(compiled rows with ``torch._inductor.config.fallback_random``: Inductor's dropout then draws eager's
masks, so a backward that recomputes dropout with a fresh mask shows as an error, and one that replays it
does not).  The equal-memory table gives, for each Inductor budget, the fastest memviz row whose measured
peak is no higher.
"""

from __future__ import annotations

import copy
import functools
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import memviz  # noqa: E402
from solvers.result import InfeasibleBudget  # noqa: E402

if not torch.cuda.is_available():  # torchvision's op schemas on a CPU torch, before transformers imports it
    import tests.real_models  # noqa: F401  (beside a CUDA torchvision they would clash with its own)

MiB = 2**20
INDUCTOR_BUDGETS = (1.0, 0.5, 0.1)
SAC_FRACTIONS = (0.75, 0.5, 0.0)
PAIRS = 8


class Device:
    """Where steps run and how their peak and time are read: CUDA's allocator statistics, or on a CPU
    torch.profiler's allocator events (`memviz.profiling.tracker.allocator_peak`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cuda = name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def step_peak(self, step: Callable[[], None], owned: int) -> tuple[int, int | None]:
        """(peak allocated, peak reserved) of `step`: what it allocates above the level it started at,
        plus `owned` (the candidate's own parameters, optimizer state and inputs, allocated before)."""
        self.free()
        if not self.cuda:
            from memviz.profiling.tracker import allocator_peak

            return allocator_peak(step)[0] + owned, None
        before, reserved_before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before + owned,
                torch.cuda.max_memory_reserved() - reserved_before)

    def timed(self, step: Callable[[], None]) -> float:
        self.sync()
        t0 = time.perf_counter()
        step()
        self.sync()
        return time.perf_counter() - t0


def gpt2(device: str, quick: bool) -> tuple[torch.nn.Module, tuple, dict, Callable[[Any], torch.Tensor], str]:
    import transformers

    torch.manual_seed(0)
    layers, width, seq = (2, 128, 128) if quick else (6, 512, 512)
    cfg = transformers.GPT2Config(vocab_size=8192, n_positions=seq, n_embd=width, n_layer=layers, n_head=8,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    model = transformers.GPT2LMHeadModel(cfg).to(device).train()
    ids = torch.randint(0, 8192, (4, seq), device=device)
    return model, (ids,), {"labels": ids}, lambda out: out.loss, "transformer.h"


def nbytes(*objs: Any) -> int:
    from memviz.profiling.tracker import tensors_of

    seen, total = set(), 0
    for t in tensors_of(*objs):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


class Candidate:
    """A module with its own AdamW, stepped on the case's inputs."""

    def __init__(self, module: torch.nn.Module, case: tuple) -> None:
        self.module, (_, self.args, self.kwargs, self.loss_fn, _) = module, case
        self.params = module
        while hasattr(self.params, "_orig_mod"):  # torch.compile's wrapper, memviz.export's module
            self.params = self.params._orig_mod
        self.opt = torch.optim.AdamW(self.params.parameters())

    def backward(self) -> None:
        self.loss_fn(self.module(*self.args, **self.kwargs)).backward()

    def step(self) -> None:
        self.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def owned(self) -> int:
        return nbytes(self.params, self.opt, self.args, self.kwargs)


def grad_error(candidate: Candidate, reference: dict[str, torch.Tensor], seed: int) -> float:
    """Largest |g - g_eager| / max|g_eager| over parameters after one backward with `seed` (the candidate's
    parameters equal the reference model's: no optimizer step has run on it yet)."""
    torch.manual_seed(seed)
    candidate.backward()
    worst, compared = 0.0, 0
    for name, p in candidate.params.named_parameters():
        ref = reference.get(name)
        if ref is None or p.grad is None:
            continue
        scale = float(ref.abs().max()) or 1.0
        worst, compared = max(worst, float((p.grad - ref).abs().max()) / scale), compared + 1
    candidate.params.zero_grad(set_to_none=True)
    if compared != len(reference):  # a parameter renamed or without a gradient: never a silent 0.0
        raise AssertionError(f"gradients compared for {compared} of {len(reference)} parameters")
    return worst


def time_ratio(dev: Device, a: Candidate, b: Candidate, pairs: int = PAIRS) -> float:
    """Median a/b step-time ratio over interleaved pairs, the order swapped every pair (warm-up first)."""
    a.step()
    b.step()
    ratios = []
    for i in range(pairs):
        if i % 2:
            tb, ta = dev.timed(b.step), dev.timed(a.step)
        else:
            ta, tb = dev.timed(a.step), dev.timed(b.step)
        ratios.append(ta / tb)
    return statistics.median(ratios)


def block_checkpointed(model: torch.nn.Module, blocks: str) -> torch.nn.Module:
    """A copy of `model` whose blocks (the children of `blocks`) run under non-reentrant checkpointing, its
    KV cache off (as transformers' own gradient checkpointing does: a recomputed block would write it again,
    which under torch.compile failed the backward on a GPU)."""
    target = copy.deepcopy(model)
    target.config.use_cache = False
    for block in target.get_submodule(blocks):
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return target


class Bench:
    def __init__(self, device: str, backend: str, quick: bool, deadline: float,
                 budgets: tuple[float, ...] = INDUCTOR_BUDGETS, fractions: tuple[float, ...] = SAC_FRACTIONS,
                 blocks: bool = True) -> None:
        self.dev, self.backend, self.quick, self.deadline = Device(device), backend, quick, deadline
        self.budgets, self.fractions, self.blocks = budgets, fractions, blocks
        self.case = gpt2(device, quick)
        self.rows: list[dict[str, Any]] = []
        self.seed = 1234
        model, args, kwargs, loss_fn, _ = self.case
        torch.manual_seed(self.seed)
        loss_fn(model(*args, **kwargs)).backward()  # the reference gradients, before any optimizer step
        self.reference = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                          if p.grad is not None}
        model.zero_grad(set_to_none=True)
        self.eager = Candidate(copy.deepcopy(model), self.case)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "trace"}), file=sys.stderr, flush=True)

    def measure(self, contender: str, setting: str, build: Callable[[], torch.nn.Module], compiled: bool,
                memory_budget: float = 1.0, **extra: Any) -> None:
        """One row: build the candidate (a copy of the model), compile it when asked (its first step,
        the gradient check, compiles), then its peak and time against eager."""
        row: dict[str, Any] = {"contender": contender, "setting": setting, "compiled": compiled, **extra}
        if self.left() < 20:
            self.add({**row, "error": "skipped: deadline"})
            return
        try:
            with torch._functorch.config.patch(activation_memory_budget=memory_budget,
                                               enable_autograd_cache=False):
                module = build()
                if compiled:
                    torch._dynamo.reset()
                    module = torch.compile(module, backend=self.backend)
                cand = Candidate(module, self.case)
                t0 = time.perf_counter()
                row["grad_error"] = grad_error(cand, self.reference, self.seed)
                row["first_step_s"] = time.perf_counter() - t0
                cand.step()  # the optimizer state exists from here on
                row["measured_peak"], row["measured_reserved"] = self.dev.step_peak(cand.step, cand.owned())
                row["measured_overhead"] = time_ratio(self.dev, cand, self.eager)
            del cand, module
        except Exception as exc:  # noqa: BLE001 - a row of the table
            row.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                       trace=traceback.format_exc(limit=8))
        self.dev.free()
        self.add(row)

    def run(self) -> dict[str, Any]:
        model, args, kwargs, loss_fn, blocks = self.case
        base = Candidate(self.eager.module, self.case)
        base.opt = self.eager.opt
        base.step()
        peak, reserved = self.dev.step_peak(base.step, base.owned())
        self.add({"contender": "eager", "setting": "-", "compiled": False, "measured_peak": peak,
                  "measured_reserved": reserved, "measured_overhead": 1.0, "grad_error": 0.0,
                  "step_s": statistics.median(self.dev.timed(base.step) for _ in range(8))})
        for b in self.budgets:
            self.measure(f"torch.compile ({self.backend})", f"activation_memory_budget {b}",
                         lambda: copy.deepcopy(model), True, memory_budget=b)
        meta: dict[str, Any] = {"model": "HF GPT-2 (2 layers, 128 wide, 4 x 128 tokens" if self.quick
                                else "HF GPT-2 (6 layers, 512 wide, 4 x 512 tokens",
                                "torch": torch.__version__, "backend": self.backend,
                                "device": torch.cuda.get_device_name(0) if self.dev.cuda else "cpu"}
        try:
            self.memviz_rows(meta)
        except Exception as exc:  # noqa: BLE001 - the peers' rows stand
            self.add({"contender": "memviz", "setting": "profile", "error": f"{type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:300]}", "trace": traceback.format_exc(limit=8)})
        for compiled in (False, True) if self.blocks else ():
            self.measure("per-block checkpoint", "every block", lambda: block_checkpointed(model, blocks),
                         compiled)
        return meta

    def memviz_rows(self, meta: dict[str, Any]) -> None:
        """Profile on the device, then the sac plans applied (eager and compiled) and the auto plan
        exported and compiled."""
        model, args, kwargs, loss_fn, _ = self.case
        t0 = time.perf_counter()
        prof = memviz.profile(model, args, kwargs, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                              device=self.dev.name)
        meta["profile_s"] = time.perf_counter() - t0
        try:
            memviz.plan(prof, 1, strategy="sac")
            raise AssertionError("a 1-byte sac plan was accepted")
        except InfeasibleBudget as exc:
            low = exc.minimum_bytes
        high = prof.baseline.peak_bytes
        meta.update(sac_minimum=low, eager_predicted=high)
        seen: dict[str, str] = {}
        for frac in self.fractions:
            budget = int(low + frac * (high - low))
            setting = f"sac {int(frac * 100)}% ({budget / MiB:.1f} MiB)"
            try:
                t0 = time.perf_counter()
                plan = memviz.plan(prof, budget, strategy="sac")
                extra = {"budget": budget, "plan_peak": plan.peak_bytes, "plan_s": time.perf_counter() - t0,
                         "predicted_overhead": plan.time_overhead, "plan_reserved": plan.reserved_peak_bytes}
            except Exception as exc:  # noqa: BLE001
                self.add({"contender": "memviz.apply", "setting": setting, "error": f"{type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:300]}"})
                continue
            options = repr(plan.solver_stats.extra["sac"]["options"])
            if options in seen:  # the same regions as a higher budget's plan: measured already
                self.add({"contender": "memviz.apply", "setting": setting, **extra,
                          "error": f"the plan of {seen[options]}"})
                continue
            seen[options] = setting
            applied = functools.partial(memviz.apply, plan, model)
            self.measure("memviz.apply", setting, applied, False, **extra)
            self.measure("memviz.apply", setting, applied, True, **extra)
        budget = int(low + 0.5 * (high - low))
        try:
            plan = memviz.plan(prof, budget, strategy="auto", time_limit=20.0, frontier=False)
            extra = {"budget": budget, "plan_peak": plan.peak_bytes, "predicted_overhead": plan.time_overhead,
                     "plan_reserved": plan.reserved_peak_bytes}
            self.measure("memviz.export", f"auto 50% ({budget / MiB:.1f} MiB)",
                         # a copy: the exported module runs the model it is given, and its steps move it
                         lambda: memviz.export(plan, verify=True, backend=self.backend,
                                               model=copy.deepcopy(model)), True,
                         **extra)
        except Exception as exc:  # noqa: BLE001
            self.add({"contender": "memviz.export", "setting": "auto 50%", "error": f"{type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:300]}", "trace": traceback.format_exc(limit=8)})


def at_equal_memory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each compiled Inductor row, the fastest memviz row measured at or under its peak."""
    ours = [r for r in rows if r["contender"].startswith("memviz") and "measured_peak" in r]
    out = []
    for peer in (r for r in rows if r["contender"].startswith("torch.compile") and "measured_peak" in r):
        fits = [r for r in ours if r["measured_peak"] <= peer["measured_peak"]]
        best = min(fits, key=lambda r: r["measured_overhead"], default=None)
        out.append({"peer": peer["setting"], "peer_peak": peer["measured_peak"],
                    "peer_overhead": peer["measured_overhead"],
                    "ours": None if best is None else f"{best['contender']} {best['setting']}"
                                                      f"{' compiled' if best['compiled'] else ''}",
                    "ours_peak": None if best is None else best["measured_peak"],
                    "ratio": None if best is None else best["measured_overhead"] / peer["measured_overhead"]})
    return out


def _mib(x: Any) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


def _f(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], equal: list[dict[str, Any]]) -> str:
    out = ["## CUDA: memviz plans under torch.compile vs Inductor's budgets", "",
           f"{meta.get('device')}, torch {meta.get('torch')}, backend {meta.get('backend')} "
           f"(`python benchmarks/bench_cuda_compile.py`). {meta.get('model')}, dropout "
           "0.1), AdamW. Peaks in MiB (the candidate's parameters, optimizer state and inputs plus what its "
           f"step allocates); overheads: median step-time ratio to eager over {PAIRS} interleaved pairs; "
           "gradient error: largest relative difference from eager after one backward with the same seed "
           "(compiled: `fallback_random`, eager's dropout masks). memviz profile "
           f"{_f(meta.get('profile_s'), '.0f')} s, sac minimum {_mib(meta.get('sac_minimum'))} MiB.", "",
           "| contender | setting | compiled | plan MiB | measured MiB | reserved MiB | predicted | measured "
           "overhead | gradient error | first step s | note |", "|---" * 11 + "|"]
    for r in rows:
        note = r.get("error", "")[:140].replace("|", "/")
        if r.get("budget") is not None and r.get("measured_peak", 0) > r["budget"]:
            note = f"over the budget {_mib(r['budget'])} MiB " + note
        out.append(f"| {r['contender']} | {r['setting']} | {'yes' if r.get('compiled') else 'no'} | "
                   f"{_mib(r.get('plan_peak'))} | {_mib(r.get('measured_peak'))} | "
                   f"{_mib(r.get('measured_reserved'))} | {_f(r.get('predicted_overhead'))} | "
                   f"{_f(r.get('measured_overhead'))} | {_f(r.get('grad_error'), '.1e')} | "
                   f"{_f(r.get('first_step_s'), '.1f')} | {note} |")
    out += ["", "At equal or lower measured memory (the fastest memviz row at or under each Inductor "
            "point):", "", "| Inductor setting | its MiB | its overhead | memviz | memviz MiB | time ratio "
            "memviz / Inductor |", "|---|---|---|---|---|---|"]
    for e in equal:
        out.append(f"| {e['peer']} | {_mib(e['peer_peak'])} | {_f(e['peer_overhead'])} | "
                   f"{e['ours'] or 'none fits'} | {_mib(e['ours_peak'])} | {_f(e['ratio'])} |")
    # what the person who ran it on the device adds afterwards (meta["notes"]), as bench_cuda's
    out += ["", *(f"- {n}" for n in meta.get("notes", []))] if meta.get("notes") else []
    return "\n".join(out)


def headline(rows: list[dict[str, Any]], equal: list[dict[str, Any]], meta: dict[str, Any]) -> list[dict]:
    """The README's row: at how many Inductor points a memviz row is as fast or faster at no more memory,
    and the lowest measured peak of each side."""
    ratios = [e["ratio"] for e in equal if e["ratio"] is not None]
    lowest = {side: min((r["measured_peak"] for r in rows if "measured_peak" in r and pick(r)), default=None)
              for side, pick in (("memviz", lambda r: r["contender"].startswith("memviz")),
                                 ("inductor", lambda r: r["contender"].startswith("torch.compile")))}
    return [{"metric": f"CUDA ({meta.get('device')}): memviz plans vs torch.compile's "
                       f"activation_memory_budget ({meta.get('backend')}), GPT-2, at equal measured memory",
             "ours": f"faster or equal at {sum(r <= 1.0 for r in ratios)} of {len(equal)} Inductor points "
                     f"(time ratios {', '.join(f'{r:.2f}' for r in ratios) or 'none'}); lowest peak "
                     f"{_mib(lowest['memviz'])} MiB",
             "baseline": f"Inductor's lowest {_mib(lowest['inductor'])} MiB",
             "ratio": f"{max(ratios):.2f}" if ratios else ""}]


def run(quick: bool = False, device: str = "cuda", backend: str = "inductor", deadline: float = 330.0,
        **only: Any) -> dict:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_cuda_compile: no CUDA device here (pass --device cpu --backend aot_eager to "
                         "check the script on a CPU)")
    torch._inductor.config.fallback_random = True
    start = time.monotonic()
    bench = Bench(device, backend, quick, start + deadline, **only)
    meta = bench.run()
    meta["wall_s"] = time.monotonic() - start
    equal = at_equal_memory(bench.rows)
    return {"name": "cuda_compile", "title": "CUDA compile", "meta": meta, "rows": bench.rows,
            "equal_memory": equal, "headline": headline(bench.rows, equal, meta),
            "markdown": markdown(bench.rows, meta, equal), "notes": []}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 2-layer GPT-2 on 128 tokens")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--deadline", type=float, default=330.0, help="seconds; later rows are skipped")
    ap.add_argument("--budgets", type=float, nargs="+", default=INDUCTOR_BUDGETS,
                    help="Inductor's activation_memory_budget values")
    ap.add_argument("--fractions", type=float, nargs="+", default=SAC_FRACTIONS,
                    help="memviz sac budgets, fractions of [sac minimum, eager peak]")
    ap.add_argument("--no-blocks", action="store_true", help="skip the per-block checkpointing rows")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cuda_compile.json")
    a = ap.parse_args(argv)
    result = run(a.quick, a.device, a.backend, a.deadline, budgets=tuple(a.budgets),
                 fractions=tuple(a.fractions), blocks=not a.no_blocks)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
