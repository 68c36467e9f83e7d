"""Small CPU models unlike `examples.models`, for `test_zoo.py`: what users bring that memviz has not seen.

Every factory returns a `ZooCase`: the model, its positional and keyword inputs, the loss the user
trains with, and the modes it makes sense in.  Sizes are tiny so one profile/plan/export round takes
about a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from memviz.capture import default_loss


@dataclass
class ZooCase:
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss_fn: Callable[[Any], torch.Tensor] = default_loss
    modes: tuple[str, ...] = ("train", "inference")


# --- sequence models ------------------------------------------------------------------------------------
class RNNLM(nn.Module):
    def __init__(self, cell: type[nn.Module], vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = cell(d, d, num_layers=2, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(tokens))
        return self.head(h)


def lstm_lm(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(RNNLM(nn.LSTM).to(dtype), (torch.randint(0, 32, (3, 6)),))


def gru_lm(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(RNNLM(nn.GRU).to(dtype), (torch.randint(0, 32, (3, 6)),))


class Encoder(nn.Module):
    """nn.TransformerEncoder with a padding mask (batch_first) or a causal mask (sequence first)."""

    def __init__(self, batch_first: bool, d: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.batch_first = batch_first
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=dropout, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        if self.batch_first:
            return self.enc(x, src_key_padding_mask=pad)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[0], dtype=x.dtype)
        return self.enc(x, mask=mask, is_causal=True)


def encoder_batch_first(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    return ZooCase(Encoder(True).to(dtype), (torch.randn(3, 5, 16, dtype=dtype), pad))


def encoder_seq_first(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Encoder(False, dropout=0.1).to(dtype),
                   (torch.randn(5, 3, 16, dtype=dtype), torch.zeros(3, 5, dtype=torch.bool)))


class Decoder(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(d, 2, 32, dropout=0.1, batch_first=True, norm_first=True)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, memory_pad: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=tgt.dtype)
        return self.layer(tgt, memory, tgt_mask=mask, memory_key_padding_mask=memory_pad)


def decoder_layer(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    return ZooCase(Decoder().to(dtype),
                   (torch.randn(2, 4, 16, dtype=dtype), torch.randn(2, 7, 16, dtype=dtype), pad))


class MHAPadding(nn.Module):
    """Returns (output, attention weights): the weights are an output the loss does not use."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn(x, x, x, key_padding_mask=pad, need_weights=True)


def mha_padding(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True
    return ZooCase(MHAPadding().to(dtype), (torch.randn(2, 6, 16, dtype=dtype), pad),
                   loss_fn=lambda out: out[0].pow(2).sum())


class KwargsDict(nn.Module):
    """Keyword inputs (a tensor, a float and an optional mask) and a dict output with an unused entry."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, 4)
        self.aux = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0, mask: torch.Tensor | None = None) -> dict:
        h = F.gelu(self.a(x)) * scale
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        return {"logits": self.b(h), "aux": self.aux(h), "hidden": h}


def kwargs_dict(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    mask = (torch.rand(3, 5) > 0.3).to(dtype)
    return ZooCase(KwargsDict().to(dtype), (torch.randn(3, 5, 16, dtype=dtype),),
                   {"scale": 0.5, "mask": mask},
                   loss_fn=lambda out: F.cross_entropy(out["logits"].flatten(0, 1),
                                                       torch.arange(15) % 4))


class TiedLM(nn.Module):
    """The embedding matrix used twice: input lookup and output projection."""

    def __init__(self, vocab: int = 40, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(self.emb(tokens))))


def tied_lm(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(TiedLM().to(dtype), (torch.randint(0, 40, (4, 6)),))


# --- convolution / mixing -------------------------------------------------------------------------------
class ConvGN(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.grouped = nn.Conv2d(c, c, 3, padding=1, groups=2)
        self.depthwise = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.norm = nn.GroupNorm(2, c)
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.conv(x))
        h = F.silu(self.norm(self.depthwise(self.grouped(h))))
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = F.interpolate(h, size=(5, 5), mode="bilinear", align_corners=False)
        return self.head(h)


def conv_gn(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(ConvGN().to(dtype), (torch.randn(2, 3, 6, 6, dtype=dtype),))


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, d: int) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                       nn.Linear(2 * tokens, tokens))
        self.chan_mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.chan_mlp(self.n2(x))


class Mixer(nn.Module):
    def __init__(self, patch: int = 2, d: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, d)
        self.blocks = nn.Sequential(*(MixerBlock(16, d) for _ in range(depth)))
        self.head = nn.Linear(d, 5)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        b, c, h, w = img.shape
        p = self.patch
        x = img.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * p * p)
        x = self.blocks(self.embed(x))
        return self.head(x.mean(dim=1))


def mixer(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Mixer().to(dtype), (torch.randn(2, 3, 8, 8, dtype=dtype),))


# --- in-place ops and indexing --------------------------------------------------------------------------
class TwoLinear(nn.Module):
    """Two d x d layers, `a` then `b`; subclasses say how `forward` threads them."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)


class InplaceViews(TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h[:, :4].mul_(2)
        h.add_(1.0)
        torch.relu_(h[:, 4:10])
        g = self.b(h).transpose(0, 1)
        g[1].sigmoid_()
        return g.t().contiguous()


def inplace_views(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(InplaceViews().to(dtype), (torch.randn(6, 16, dtype=dtype),))


class Indexing(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, idx: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        h = h.masked_fill(~keep.unsqueeze(-1), 0.0)
        h = torch.where(h > 0, h, 0.1 * h)
        g = torch.gather(h, 1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        s = torch.index_select(g, 2, torch.arange(0, h.shape[-1], 2))
        return torch.cumsum(s, dim=1)


def indexing(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    keep = torch.rand(3, 7) > 0.2
    return ZooCase(Indexing().to(dtype), (torch.randn(3, 7, 16, dtype=dtype), torch.randint(0, 7, (3, 5)),
                                          keep))


class Bags(nn.Module):
    def __init__(self, vocab: int = 30, d: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.bag = nn.EmbeddingBag(vocab, d, mode="mean")
        self.head = nn.Linear(2 * d, 3)

    def forward(self, tokens: torch.Tensor, bag_tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.emb(tokens).mean(1), self.bag(bag_tokens, offsets)], dim=-1))


def bags(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Bags().to(dtype), (torch.randint(0, 30, (4, 5)), torch.randint(0, 30, (11,)),
                                      torch.tensor([0, 3, 5, 9])))


# --- state: buffers, BatchNorm, dropout -----------------------------------------------------------------
class RunningMean(nn.Module):
    """Updates its own buffers in forward (an EMA of the input and a step counter)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("ema", torch.zeros(d))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(h.mean(0), alpha=0.1)
            self.steps += 1
        return torch.tanh(h - self.ema)


def running_mean(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(RunningMean().to(dtype), (torch.randn(5, 16, dtype=dtype),))


class BNDrop(nn.Module):
    def __init__(self, p: float, c: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                                 nn.Dropout(p), nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                 nn.Dropout2d(p), nn.Flatten(), nn.Linear(c * 16, 4), nn.Dropout(p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def bn_dropout(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(BNDrop(0.1).to(dtype), (torch.randn(3, 3, 4, 4, dtype=dtype),))


def bn_dropout_p0(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(BNDrop(0.0).to(dtype), (torch.randn(3, 3, 4, 4, dtype=dtype),))


def bn_eval(dtype: torch.dtype = torch.float32) -> ZooCase:
    """BatchNorm frozen in eval mode while training (fine-tuning): running statistics used, not updated."""
    torch.manual_seed(0)
    model = BNDrop(0.0).to(dtype)
    model.eval()
    return ZooCase(model, (torch.randn(3, 3, 4, 4, dtype=dtype),))


# --- inputs and dtypes ----------------------------------------------------------------------------------
class Residual(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, 2 * d)
        self.b = nn.Linear(2 * d, d)
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(F.silu(self.a(self.frozen(x))))


def input_grad(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Residual().to(dtype), (torch.randn(4, 16, dtype=dtype).requires_grad_(True),))


def bf16(dtype: torch.dtype = torch.float32) -> ZooCase:
    """bfloat16 parameters whatever `dtype` says: the half-precision path (summed in float32 by the loss)."""
    torch.manual_seed(0)
    return ZooCase(Residual().to(torch.bfloat16), (torch.randn(4, 16, dtype=torch.bfloat16),))


# --- data-dependent control flow: cannot be traced ------------------------------------------------------
class DataDependent(TwoLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:  # data-dependent branch
            h = self.b(h)
        return h


def data_dependent(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(DataDependent().to(dtype), (torch.randn(4, 16, dtype=dtype),))


ZOO: dict[str, Callable[..., ZooCase]] = {
    "lstm_lm": lstm_lm, "gru_lm": gru_lm, "encoder_batch_first": encoder_batch_first,
    "encoder_seq_first": encoder_seq_first, "decoder_layer": decoder_layer, "mha_padding": mha_padding,
    "kwargs_dict": kwargs_dict, "tied_lm": tied_lm, "conv_gn": conv_gn, "mixer": mixer,
    "inplace_views": inplace_views, "indexing": indexing, "bags": bags, "running_mean": running_mean,
    "bn_dropout": bn_dropout, "bn_dropout_p0": bn_dropout_p0, "bn_eval": bn_eval, "input_grad": input_grad,
    "bf16": bf16,
}
