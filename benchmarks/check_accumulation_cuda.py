"""Gradient accumulation on CUDA: ``memviz.export`` of a ``grads="accumulate"`` plan in the user's loop.

Run on a machine with a CUDA GPU: ``python benchmarks/check_accumulation_cuda.py`` (a minute or two on an
H200; never in CI).  A Hugging Face GPT-2 (random-init, 4 layers of width 256, dropout on, 4 x 512 tokens,
a user cross-entropy, AdamW) is profiled on the device with ``grads="accumulate"``, planned with
``strategy="auto"`` at 75 % and 50 % of [auto's minimum, eager peak] and exported with ``verify=True``
(its step measured with every ``.grad`` held, its 2 accumulated micro-batches compared with eager's).
Then the exported module and an eager copy each run 2 rounds of 3 micro-batches (forward, ``loss / 3``,
backward) and ``opt.step(); opt.zero_grad()``; the second round's peak is the caching allocator's
``max_memory_allocated`` less the eager copy's parameters and AdamW state (resident beside it, rounded
to the allocator's 512-byte blocks).  Columns (MiB): plan, budget, the verify step's measured peak, the
loop's peak and its excess over the plan, and the largest relative difference of the accumulated
gradients from eager's (the verify comparison's measure).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB, SEQ, BATCH, MICRO = 8192, 512, 4, 3


def _block_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum((n + 511) // 512 * 512 for n in storages.values())


def _round(model: Any, opt: torch.optim.Optimizer, ids: torch.Tensor, loss_fn: Any, seed: int) -> list[Any]:
    for k in range(MICRO):
        torch.manual_seed(seed + k)
        loss = loss_fn(model(ids)) / MICRO
        loss.backward()
        del loss
    grads = [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]
    opt.step()
    opt.zero_grad()
    return grads


def main() -> None:
    import transformers

    import memviz
    from memviz.profiling.tracker import tensors_of
    from solvers.result import InfeasibleBudget

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=256, n_layer=4, n_head=4,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    model = transformers.GPT2LMHeadModel(cfg).cuda().train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")

    def loss_fn(out: Any) -> torch.Tensor:
        return F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    prof = memviz.profile(model, (ids,), loss_fn=loss_fn, optimizer=torch.optim.AdamW, device="cuda",
                          grads="accumulate")
    try:
        memviz.plan(prof, prof.graph.persistent_bytes() + 1, strategy="auto", frontier=False)
        low = prof.graph.persistent_bytes() + 1
    except InfeasibleBudget as refused:
        low = refused.minimum_bytes
    mib = 2**20
    print(f"eager peak {prof.baseline.peak_bytes / mib:.2f} MiB, minimum {low / mib:.2f} MiB", flush=True)
    print("| point | strategy | plan | budget | verify measured | loop (round 2) | over plan | grad diff |")
    print("|---|---|---|---|---|---|---|---|")
    # host copies: the allocator counts everything on the device, which the plan does not hold
    saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    for point in (0.75, 0.5):
        budget = low + int(point * (prof.baseline.peak_bytes - low))
        try:
            plan = memviz.plan(prof, budget, strategy="auto", frontier=False)
            model.load_state_dict(saved)
            module = memviz.export(plan, verify=True, inputs=((ids,), {}), loss_fn=loss_fn)
            plan = module.plan
            original = copy.deepcopy(model)
            opt_a, opt_b = torch.optim.AdamW(original.parameters()), torch.optim.AdamW(module.parameters())
            for step in range(2):
                eager = _round(original, opt_a, ids, loss_fn, 10 * step)
                beside = _block_bytes(tensors_of(original, opt_a))
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                mine = _round(module, opt_b, ids, loss_fn, 10 * step)
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - beside
            scale = max(float(g.abs().max()) for g in eager)
            diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(eager, mine, strict=True))
            print(f"| {point} | {plan.strategy} | {plan.peak_bytes / mib:.3f} | {budget / mib:.3f} | "
                  f"{module.verified_peak_bytes / mib:.3f} ({module.verified_equal.describe()}) | "
                  f"{peak / mib:.3f} | {(peak - plan.peak_bytes) / 2**10:+.1f} KiB | {diff / scale:.1e} |",
                  flush=True)
            del module, original, opt_a, opt_b
        except Exception as exc:  # noqa: BLE001 - a row per point, whatever fails
            print(f"| {point} | error | {type(exc).__name__}: {str(exc)[:300]} |", flush=True)


if __name__ == "__main__":
    main()
