"""A tiny tensor-parallel-friendly GPT, a tiny Hugging Face Llama, and the per-rank worker the
multi-process tests of tests/test_distributed.py and benchmarks/bench_fsdp.py spawn (gloo on CPU): each
rank wraps the model itself, the way a user would (``parallelize_module`` / ``fully_shard``, not through
memviz), and measures one training step's live-storage peak with
`memviz.parallel.distributed.ShardedStorageTracker`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # heads and the width come from the (possibly tensor-parallel) weights, as in Megatron and HF models;
        # the fused projection is laid out head by head (Megatron's query_key_value), so a column-wise shard
        # holds whole heads' q, k and v, and the sharded model computes the unsharded one's function
        q, k, v = self.qkv(x).view(b, t, self.heads, 3, -1).permute(3, 0, 2, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self.attn(self.ln1(x)))
        return x + self._drop(self.fc_proj(F.gelu(self.fc(self.ln2(x)))))

    def _drop(self, y: torch.Tensor) -> torch.Tensor:
        # GPT-2's residual dropout; none at all (not p=0) by default, so the default model's ops are unchanged
        return F.dropout(y, self.dropout, self.training) if self.dropout else y


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def tiny_gpt(batch: int = 2, seq: int = 16, **kw: Any) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyGPT(**kw)
    return model, (torch.randint(0, 64, (batch, seq)),)


def tiny_llama(batch: int = 2, seq: int = 16, **config: Any) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """transformers' LlamaForCausalLM from a small random-init config (grouped-query attention, SwiGLU,
    RMSNorm; `config` overrides its fields); no KV cache, so its output is the logits alone."""
    import real_models  # noqa: F401  (torchvision's schema shim, before transformers imports it)
    import transformers

    torch.manual_seed(0)
    fields = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "use_cache": False}
    cfg = transformers.LlamaConfig(**{**fields, **config})
    return transformers.LlamaForCausalLM(cfg), (torch.randint(0, 64, (batch, seq)),)


MODELS = {"gpt": tiny_gpt, "llama": tiny_llama}
#: the Megatron plan a user writes for each model's block
TP_PLANS = {"gpt": {"attn.qkv": "col", "attn.proj": "row", "fc": "col", "fc_proj": "row"},
            "llama": {"self_attn.q_proj": "col", "self_attn.k_proj": "col", "self_attn.v_proj": "col",
                      "self_attn.o_proj": "row", "mlp.gate_proj": "col", "mlp.up_proj": "col",
                      "mlp.down_proj": "row"}}


def loss_of(out: Any) -> torch.Tensor:
    """The loss every rank, memviz and FSDPMemTracker train with: the sum of the logits."""
    return (out if isinstance(out, torch.Tensor) else out.logits).sum()


def cross_entropy_of(out: Any) -> torch.Tensor:
    """A language model's own loss: next-token cross-entropy of the logits against labels made in the step
    (on whatever device and mode the logits are, fake tensors included), so every tool counts them alike."""
    logits = out if isinstance(out, torch.Tensor) else out.logits
    labels = torch.arange(logits.shape[0] * logits.shape[1], device=logits.device) % logits.shape[-1]
    return F.cross_entropy(logits.flatten(0, 1), labels)


#: FSDP2 steps users run besides bench_fsdp's plain one ("model:fsdp+<setting>" cases): setting -> (model
#: factory keywords, loss, fully_shard keywords for the blocks).  "bf16": FSDP2's mixed precision (bf16
#: parameters in the forward and backward, fp32 gradient reduction); "noreshard": the blocks' gathered
#: parameters kept from forward to backward (ZeRO-2); "ce": cross-entropy loss; "dropout": p=0.1 (GPT-2's
#: residual dropout, Llama's attention dropout)
SETTINGS: dict[str, tuple[dict[str, Any], Callable[[Any], torch.Tensor], Callable[[], dict[str, Any]]]] = {
    "": ({}, loss_of, dict),
    "bf16": ({}, loss_of, lambda: {"mp_policy": _bf16_policy()}),
    "noreshard": ({}, loss_of, lambda: {"reshard_after_forward": False}),
    "ce": ({}, cross_entropy_of, dict),
    "dropout": ({"dropout": 0.1}, loss_of, dict),
}


def _bf16_policy() -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def setting_of(kind: str) -> tuple[str, str]:
    """"fsdp+bf16" -> ("fsdp", "bf16"); "fsdp" -> ("fsdp", "")."""
    base, _, setting = kind.partition("+")
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r} in {kind!r}: one of {sorted(SETTINGS)}")
    return base, setting


def model_of(name: str, setting: str = "") -> tuple[nn.Module, tuple[torch.Tensor]]:
    """`MODELS[name]` as `setting` builds it (Llama's dropout is its config's attention_dropout)."""
    kw = SETTINGS[setting][0]
    if name == "llama" and "dropout" in kw:
        kw = {"attention_dropout": kw["dropout"]}
    return MODELS[name](**kw)


def blocks(model: nn.Module) -> nn.ModuleList:
    return model.blocks if hasattr(model, "blocks") else model.model.layers


def user_wrap(model: nn.Module, kind: str, world: int, mesh: Any = None) -> nn.Module:
    """What a user writes: FSDP2 per block then the root, or a Megatron tensor-parallel plan per block
    (`mesh`: one made beforehand, e.g. outside a FakeTensorMode, which cannot build one); "fsdp_tp" is
    rank_plan_worker's FSDP2 x TP on a (world/2) x 2 mesh; "fsdp+<setting>": FSDP2 with `SETTINGS`'
    fully_shard keywords (mixed precision on the root too, as torchtitan does; reshard_after_forward on
    the blocks alone, as `memviz.Parallel` applies it)."""
    from torch.distributed.device_mesh import init_device_mesh

    if kind == "fsdp_tp":
        from rank_plan_worker import user_wrap as wrap_2d

        return wrap_2d(model, "gpt" if hasattr(model, "blocks") else "llama", kind, world)

    mesh = mesh if mesh is not None else init_device_mesh("cpu", (world,))
    kind, setting = setting_of(kind)
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        block_kw = SETTINGS[setting][2]()
        for block in blocks(model):
            fully_shard(block, mesh=mesh, **block_kw)
        return fully_shard(model, mesh=mesh, **{k: v for k, v in block_kw.items() if k == "mp_policy"})
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    name = "gpt" if hasattr(model, "blocks") else "llama"
    for block in blocks(model):
        if name == "gpt":
            block.attn.heads //= world  # HF Llama takes its local head count from the weights
        parallelize_module(block, mesh, {k: ColwiseParallel() if v == "col" else RowwiseParallel()
                                         for k, v in TP_PLANS[name].items()})
    return model


#: steps measured after the first (which creates AdamW's state); the measured peak is their smallest
MEASURED_STEPS = 3


def measure(name: str, kind: str, world: int, profile: bool = True) -> dict[str, int]:
    """One rank's measured AdamW training step of the user-wrapped model, and (`profile`) memviz's profile
    of it.

    The measured peak is the smallest of `MEASURED_STEPS` steps, which run the same program: gloo's worker
    thread drops a finished collective, and the buffers it holds, only after waking the op that waits on
    it, so now and then one of them is released after the step's next allocation (traced on 2 ranks of the
    bf16 GPT step: gloo's reduce-scatter copy, 50,816 B, freed off the main thread, 1 step in 24 at load
    12, measured 407,860 B against every other step's 382,516 B); rank_plan_worker.train does the same."""
    import memviz
    from memviz.hardware.collectives import collective_time
    from memviz.parallel.distributed import ShardedStorageTracker, local_tensors

    model, args = model_of(name, setting_of(kind)[1])
    loss_fn = SETTINGS[setting_of(kind)[1]][1]
    model = user_wrap(model, kind, world)
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        out = model(*args)  # held to the step's end, as memviz's recorded step holds it
        loss = loss_fn(out)
        loss.backward()
        opt.step()

    step()  # the optimizer state exists from the second step on
    opt.zero_grad(set_to_none=True)
    peaks = []
    for _ in range(MEASURED_STEPS):
        tracker = ShardedStorageTracker(local_tensors(model, opt, args))
        with tracker:
            step()
        opt.zero_grad(set_to_none=True)
        peaks.append(tracker.peak_bytes)
    if not profile:
        return {"measured": min(peaks)}
    # memviz on the model the user wrapped, on the real gloo group
    prof = memviz.profile(model, args, optimizer=opt, loss_fn=loss_fn)
    return {"measured": min(peaks), "wrapped_predicted": prof.baseline.peak_bytes,
            "collective_s": collective_time(prof.graph, prof.baseline_schedule)}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a gloo group's rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, world: int, port: int, out_dir: str, results: Callable[[], dict]) -> None:
    """Join the gloo group as `rank` of `world`, write what `results` returns to ``rank<rank>.json`` in
    `out_dir`, and leave the group (this file's worker and tests/pipeline_worker.py's)."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # world processes share the machine's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = results()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def worker(rank: int, world: int, cases: list[str], port: int, out_dir: str, profile: bool = True) -> None:
    """`cases`: "model:kind" items, e.g. "gpt:fsdp", "llama:tp"; the JSON is keyed by them.  Without
    `profile`, the measured peaks alone (bench_fsdp predicts each rank on the fake group)."""
    run_rank(rank, world, port, out_dir,
             lambda: {case: measure(*case.split(":"), world, profile) for case in cases})


if __name__ == "__main__":
    import torch.multiprocessing as mp

    cases, world, port, out_dir = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    profile = sys.argv[5:] != ["--measure-only"]
    mp.spawn(worker, args=(world, cases, port, out_dir, profile), nprocs=world, join=True)
