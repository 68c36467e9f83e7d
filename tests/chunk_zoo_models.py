"""Inference models unlike examples/models.py, for the chunking zoo (tests/test_chunk_zoo.py).

Each factory returns (model in eval mode, args, kwargs) at a sequence long enough that the attention
scores or the MLP dominate the activation peak, small enough for a few seconds on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

Factory = Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]


def _seed() -> None:
    torch.manual_seed(0)


class RMSNorm(nn.Module):
    """Hand-written RMSNorm: x * rsqrt(mean(x^2) + eps) * w."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Rotary(nn.Module):
    def __init__(self, dim: int, seq: int) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        t = torch.arange(seq).float()
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = q.shape[-2]
        cos, sin = self.cos[:T][None, None], self.sin[:T][None, None]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaLayer(nn.Module):
    """HF-style decoder layer: RMSNorm, rotary q/k, grouped-query attention (kv heads repeated with
    expand+reshape or repeat_interleave), additive attention_mask from a kwarg, SwiGLU MLP."""

    def __init__(self, C: int, H: int, KV: int, T: int, repeat: str = "expand") -> None:
        super().__init__()
        self.H, self.KV, self.D, self.repeat = H, KV, C // H, repeat
        self.q = nn.Linear(C, C, bias=False)
        self.k = nn.Linear(C, KV * self.D, bias=False)
        self.v = nn.Linear(C, KV * self.D, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.n1, self.n2 = RMSNorm(C), RMSNorm(C)
        self.gate, self.up = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, 3 * C, bias=False)
        self.down = nn.Linear(3 * C, C, bias=False)
        self.rope = Rotary(self.D, T)

    def _rep(self, x: torch.Tensor) -> torch.Tensor:
        n = self.H // self.KV
        if self.repeat == "interleave":
            return x.repeat_interleave(n, dim=1)
        B, KV, T, D = x.shape
        return x[:, :, None].expand(B, KV, n, T, D).reshape(B, KV * n, T, D)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, T, self.KV, self.D).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.D).transpose(1, 2)
        q, k = self.rope(q, k)
        k, v = self._rep(k), self._rep(v)
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.D)
        if attention_mask is not None:
            s = s + attention_mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        y = torch.matmul(p, v).transpose(1, 2).contiguous().reshape(B, T, C)
        x = x + self.o(y)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(
        self, C: int = 64, H: int = 4, KV: int = 2, T: int = 256, repeat: str = "expand", layers: int = 2
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaLayer(C, H, KV, T, repeat) for _ in range(layers))
        self.norm = RMSNorm(C)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask)
        return self.norm(x)


def llama_gqa_expand(T: int = 256, layers: int = 2) -> tuple[nn.Module, tuple, dict]:
    _seed()
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(2, 1, T, T).contiguous()
    return Llama(T=T, layers=layers).eval(), (torch.randn(2, T, 64),), {"attention_mask": mask}


def llama_mqa_interleave(T: int = 256, layers: int = 2) -> tuple[nn.Module, tuple, dict]:
    _seed()
    model = Llama(KV=1, T=T, repeat="interleave", layers=layers)
    return model.eval(), (torch.randn(1, T, 64),), {}


def encoder_batch_first(T: int = 256, layers: int = 2) -> tuple[nn.Module, tuple, dict]:
    _seed()
    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True, norm_first=False)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return model.eval(), (torch.randn(2, T, 64),), {}


def encoder_seq_first_norm_first(T: int = 256, layers: int = 2) -> tuple[nn.Module, tuple, dict]:
    _seed()
    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=False, norm_first=True)
    model = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(64), enable_nested_tensor=False)
    return model.eval(), (torch.randn(T, 2, 64),), {}


class CausalDecoder(nn.Module):
    """nn.MultiheadAttention with a causal mask passed as attn_mask, log_softmax over a large vocab."""

    def __init__(self, V: int = 2048, C: int = 64, T: int = 256) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(V, C), nn.Parameter(0.02 * torch.randn(T, C))
        self.attn = nn.MultiheadAttention(C, 4, batch_first=True)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(C), nn.LayerNorm(C), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(approximate="tanh"), nn.Linear(4 * C, C))
        self.head = nn.Linear(C, V, bias=False)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        x = x + self.mlp(self.ln2(x))
        return F.log_softmax(self.head(self.lnf(x)), dim=-1)


def causal_decoder_logsoftmax() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return CausalDecoder().eval(), (torch.randint(0, 2048, (2, 256)),), {}


class CrossAttention(nn.Module):
    """Queries from x (long), keys and values from a memory of another length; explicit softmax."""

    def __init__(self, C: int = 64, H: int = 4) -> None:
        super().__init__()
        self.H, self.D = H, C // H
        self.q, self.kv, self.o = nn.Linear(C, C), nn.Linear(C, 2 * C), nn.Linear(C, C)
        self.ln = nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.ReLU(), nn.Linear(4 * C, C))

    def forward(self, x: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        S = mem.shape[1]
        q = self.q(self.ln(x)).view(B, T, self.H, self.D).transpose(1, 2)
        k, v = self.kv(mem).view(B, S, 2, self.H, self.D).permute(2, 0, 3, 1, 4).unbind(0)
        p = (q @ k.transpose(-1, -2) * self.D**-0.5).softmax(-1)
        x = x + self.o((p @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(x)


def cross_attention() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return CrossAttention().eval(), (torch.randn(2, 384, 64), torch.randn(2, 200, 64)), {}


class ConvFormer(nn.Module):
    """Conformer-ish: a depthwise Conv1d over the sequence between an MLP and attention."""

    def __init__(self, C: int = 64) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.SiLU(), nn.Linear(4 * C, C))
        self.pw = nn.Conv1d(C, 2 * C, 1)
        self.dw = nn.Conv1d(C, C, 15, padding=7, groups=C)
        self.gn = nn.GroupNorm(8, C)
        self.attn = nn.MultiheadAttention(C, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ff(x)
        h = F.glu(self.pw(x.transpose(1, 2)), dim=1)
        h = self.dw(h)
        x = x + F.silu(self.gn(h)).transpose(1, 2)
        return x + self.attn(x, x, x, need_weights=False)[0]


def conv_former() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return ConvFormer().eval(), (torch.randn(2, 384, 64),), {}


class TupleDictOut(nn.Module):
    """Returns a dict with a tuple inside: hidden states and per-token scores."""

    def __init__(self, C: int = 64) -> None:
        super().__init__()
        self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.cls = nn.Linear(C, 16)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, 4, C // 4).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        h = x + self.o(y)
        return {"hidden": h, "heads": (self.cls(h).sigmoid(), h.mean(-1))}


def tuple_dict_out() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return TupleDictOut().eval(), (torch.randn(2, 512, 64),), {}


class ALiBiEinsum(nn.Module):
    """einsum attention with an ALiBi bias (per-head slope times the query-key distance)."""

    def __init__(self, C: int = 64, H: int = 4, T: int = 256) -> None:
        super().__init__()
        self.H, self.D = H, C // H
        self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))
        slopes = torch.tensor([2 ** (-8 * (i + 1) / H) for i in range(H)])
        pos = torch.arange(T)
        self.register_buffer("alibi", slopes[:, None, None] * (pos[None, :] - pos[:, None]).float()[None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, self.D).unbind(2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.D**-0.5 + self.alibi
        p = s.softmax(-1)
        y = torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, T, C)
        x = x + self.o(y)
        return x + self.mlp(x)


def alibi_einsum() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return ALiBiEinsum().eval(), (torch.randn(2, 256, 64),), {}


class DtypeBlock(nn.Module):
    """Explicit attention and a GELU MLP in the parameters' dtype."""

    def __init__(self, C: int = 64, H: int = 4) -> None:
        super().__init__()
        self.H = H
        self.qkv, self.o, self.ln = nn.Linear(C, 3 * C), nn.Linear(C, C), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C // self.H), dim=-1)
        x = x + self.o((p @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(x)


def bf16_block() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return DtypeBlock().to(torch.bfloat16).eval(), (torch.randn(2, 256, 64, dtype=torch.bfloat16),), {}


def f64_block() -> tuple[nn.Module, tuple, dict]:
    _seed()
    return DtypeBlock().to(torch.float64).eval(), (torch.randn(2, 256, 64, dtype=torch.float64),), {}


ZOO: dict[str, Factory] = {
    "encoder_batch_first": encoder_batch_first,
    "encoder_seq_first_norm_first": encoder_seq_first_norm_first,
    "causal_decoder_logsoftmax": causal_decoder_logsoftmax,
    "llama_gqa_expand": llama_gqa_expand,
    "llama_mqa_interleave": llama_mqa_interleave,
    "cross_attention": cross_attention,
    "conv_former": conv_former,
    "tuple_dict_out": tuple_dict_out,
    "alibi_einsum": alibi_einsum,
    "bf16_block": bf16_block,
    "f64_block": f64_block,
}
