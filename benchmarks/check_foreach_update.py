"""Does an FSDP2 rank's prediction count the optimizer's foreach temporaries?  (issue 20, dist26 item 3)

Run: ``python benchmarks/check_foreach_update.py``; prints one table (about 3 minutes on a quiet 2-core
machine; not a registered benchmark).

Model: tests/distributed_worker.py's TinyGPT made wide and short (width 128, 8 blocks, 1 sequence of 4
tokens), so that the AdamW step, not the backward, sets each rank's peak.  Two gloo processes wrap it with
``fully_shard`` per block and the root, run two steps of ``AdamW(foreach=True)`` and of
``AdamW(foreach=False)``, and track the second step's live storages; each rank also profiles its wrapped
model with memviz on the real group.  In this process memviz estimates rank 0 for an H100
(``device="fake:h100"``, ``Parallel(2)``) with ``AdamW`` left at torch's default (foreach on CUDA) and with
``foreach=False``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(p))

SHAPE = {"batch": 1, "seq": 4, "d": 128, "layers": 8}


def measure(world: int, foreach: bool) -> dict[str, int]:
    """One gloo rank: the tracked peak of the second step and memviz's recorded profile of the same step."""
    import torch
    from distributed_worker import loss_of, tiny_gpt, user_wrap

    import memviz
    from memviz.parallel.distributed import ShardedStorageTracker, local_tensors

    model, args = tiny_gpt(**SHAPE)
    model = user_wrap(model, "fsdp", world)
    opt = torch.optim.AdamW(model.parameters(), foreach=foreach)

    def step() -> None:
        out = model(*args)
        loss_of(out).backward()
        opt.step()

    step()
    opt.zero_grad(set_to_none=True)
    tracker = ShardedStorageTracker(local_tensors(model, opt, args))
    with tracker:
        step()
    opt.zero_grad(set_to_none=True)
    prof = memviz.profile(model, args, optimizer=opt, loss_fn=loss_of)
    return {"measured": tracker.peak_bytes, "recorded": prof.baseline.peak_bytes}


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from distributed_worker import run_rank

    run_rank(rank, world, port, out_dir, lambda: {str(f): measure(world, f) for f in (True, False)})


def estimated() -> dict[str, int]:
    """Rank 0 of 2 estimated for an H100: AdamW at torch's default, and with foreach=False."""
    import torch
    from distributed_worker import loss_of, tiny_gpt

    import memviz
    from memviz.parallel.distributed import Parallel

    model, args = tiny_gpt(**SHAPE)
    return {name: memviz.profile(model, args, optimizer=opt, loss_fn=loss_of, parallel=Parallel(2),
                                 device="fake:h100").baseline.peak_bytes
            for name, opt in (("default", torch.optim.AdamW),
                              ("False", torch.optim.AdamW(model.parameters(), foreach=False)))}


def main() -> None:
    import torch.multiprocessing as mp
    from distributed_worker import free_port

    out = Path(tempfile.mkdtemp(prefix="memviz-foreach-"))
    mp.spawn(worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    est = estimated()
    print("| AdamW | rank | gloo measured B | memviz on the gloo rank B | memviz fake:h100, rank 0 B |")
    print("|---|---|---|---|---|")
    for foreach, label, key in (("True", "foreach=True", "default"), ("False", "foreach=False", "False")):
        for r, res in enumerate(ranks):
            est_col = f"{est[key]} ({'default: foreach on CUDA' if key == 'default' else 'foreach=False'})" \
                if r == 0 else ""
            print(f"| {label} | {r} | {res[foreach]['measured']} | {res[foreach]['recorded']} | {est_col} |")


if __name__ == "__main__":
    main()
