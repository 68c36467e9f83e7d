"""The built-in model `memviz demo` profiles: a small GPT-style decoder (causal attention, GELU MLP,
dropout, tied embeddings), small enough to capture, plan and export in seconds on a laptop CPU."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = (q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) / (d // self.heads) ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        att = self.drop(att.masked_fill(~mask, float("-inf")).softmax(-1))
        y = (att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, s, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.ln2(x)))))


class TinyGPT(nn.Module):
    def __init__(
        self, vocab: int = 256, d: int = 64, heads: int = 4, layers: int = 4, seq: int = 64, p: float = 0.1
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def demo_model(batch: int = 4, seq: int = 64) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyGPT(seq=seq)
    return model, (torch.randint(0, 256, (batch, seq)),)
