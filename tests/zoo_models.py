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
import torch.utils._pytree as pytree
from torch import nn
from torch.nn import functional as F

from memviz.profiling.capture import default_loss


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



# --- second round: constructs users write around their layers -------------------------------------------
class _FFN(nn.Module):
    """Pre-norm residual feed-forward block: the unit the models below reuse, checkpoint or freeze."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Checkpointed(nn.Module):
    """The user's own activation checkpointing: torch.utils.checkpoint on the middle block, non-reentrant
    (saved-tensor hooks) or reentrant (an autograd.Function whose forward runs under no_grad)."""

    def __init__(self, reentrant: bool, d: int = 16) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(d, d)
        self.block = _FFN(d)
        self.out = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.out(h)


def checkpointed(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Checkpointed(False).to(dtype), (torch.randn(4, 6, 16, dtype=dtype),))


def checkpointed_reentrant(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Checkpointed(True).to(dtype), (torch.randn(4, 6, 16, dtype=dtype),))


class FrozenBackbone(nn.Module):
    """Partial fine-tuning: a frozen embedding + two frozen blocks (no parameter gradient, no backward
    through them at all) under a trainable head."""

    def __init__(self, vocab: int = 30, d: int = 16) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Embedding(vocab, d), _FFN(d), _FFN(d))
        self.backbone.requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 3))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(tokens).mean(1))


def frozen_backbone(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(FrozenBackbone().to(dtype), (torch.randint(0, 30, (4, 7)),))


class SharedLayers(nn.Module):
    """ALBERT-style weight sharing: one block applied `depth` times (its gradients accumulate over uses)."""

    def __init__(self, d: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.depth = depth
        self.block = _FFN(d)
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = self.block(x)
        return self.head(x)


def shared_layers(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(SharedLayers().to(dtype), (torch.randn(3, 5, 16, dtype=dtype),))


class SDPAttention(nn.Module):
    """F.scaled_dot_product_attention causal (is_causal=True) and with a float attn_mask, then an einsum
    attention with a boolean mask: three attention kernels on the same projections."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(3 * d, d)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        biased = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / (d // self.heads) ** 0.5
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        mixed = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)
        heads = torch.cat([causal, biased, mixed], dim=-1)
        return self.proj(heads.transpose(1, 2).reshape(b, t, 3 * d))


def sdp_attention(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[1, 3:] = False
    return ZooCase(SDPAttention().to(dtype),
                   (torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 2, 5, 5, dtype=dtype), keep))


class StopGradient(nn.Module):
    """A target network evaluated under torch.no_grad() and a .detach() in the middle of the student:
    gradients stop there (BYOL/DQN-style targets)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.student = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d))
        self.target = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d))
        self.probe = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.student(x)
        with torch.no_grad():
            t = self.target(x)
        return (s - t).pow(2).mean(-1), self.probe(s.detach() * 2)


def stop_gradient(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(StopGradient().to(dtype), (torch.randn(6, 16, dtype=dtype),))


class Autocast(nn.Module):
    """torch.autocast(cpu, bfloat16) around part of forward: float32 parameters, bfloat16 matmuls."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, 2 * d)
        self.b = nn.Linear(2 * d, d)
        self.out = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            h = self.b(F.relu(self.a(x)))
        return self.out(h.float().softmax(-1))


def autocast(dtype: torch.dtype = torch.float32) -> ZooCase:
    """float32 whatever `dtype` says: autocast casts float32 (and only float32) down to bfloat16."""
    torch.manual_seed(0)
    return ZooCase(Autocast(), (torch.randn(5, 16),))


class ChannelsLast(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                 nn.Conv2d(c, c, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def channels_last(dtype: torch.dtype = torch.float32) -> ZooCase:
    """Model and input in torch.channels_last: NHWC strides through conv, BatchNorm and pooling."""
    torch.manual_seed(0)
    model = ChannelsLast().to(dtype).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 6, 6, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return ZooCase(model, (x,))


class OddOutputs(TwoLinear):
    """Outputs that are not one tensor: an int, None and a nested tuple/list of tensors."""

    def forward(self, x: torch.Tensor) -> tuple[Any, ...]:
        h = torch.relu(self.a(x))
        g = self.b(h)
        return g, x.shape[0], None, [h.sum(-1), (g.tanh(), [g[:, :3] * 2])]


class OutputView(TwoLinear):
    """Returns a view of another output (last-position logits beside all logits): AOTAutograd gives it no
    gradient of its own; memviz rebuilds it from the full output, so its gradient reaches that one's."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.b(torch.relu(self.a(x)))
        return g, g[:, -3:]  # a view of output 0


def _weighted(out: Any) -> torch.Tensor:
    """A loss that weights each output differently (a plain sum hands every output ones)."""
    return sum((i + 1.5) * (o.float() ** 2).sum() for i, o in enumerate(pytree.tree_leaves(out))
               if isinstance(o, torch.Tensor) and o.requires_grad)


def _view_only(out: Any) -> torch.Tensor:
    """The loss reads only the view (output 1), not the output it views."""
    return (out[1] ** 2).sum()


def output_view(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(OutputView().to(dtype), (torch.randn(4, 16, dtype=dtype),), loss_fn=_weighted)


def output_view_only(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(OutputView().to(dtype), (torch.randn(4, 16, dtype=dtype),), loss_fn=_view_only)


class IntermediateView(TwoLinear):
    """Returns a hidden state and its flattened view next to the head's output."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.tanh(self.a(x))
        return self.b(h), h, h.view(-1)  # h and a view of it


def intermediate_view(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(IntermediateView().to(dtype), (torch.randn(4, 16, dtype=dtype),), loss_fn=_weighted)


class InputView(TwoLinear):
    """Returns a transposed view of its (grad-requiring) input beside the prediction."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.b(torch.relu(self.a(x))), x.transpose(0, 1)


def input_view(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(InputView().to(dtype), (torch.randn(4, 16, dtype=dtype).requires_grad_(True),),
                   loss_fn=_weighted)


class ParamView(TwoLinear):
    """Returns a view of a parameter (the first rows of `b`'s weight, transposed) beside the prediction."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.b(torch.relu(self.a(x))), self.b.weight[:4].t()


def param_view(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(ParamView().to(dtype), (torch.randn(4, 16, dtype=dtype),), loss_fn=_weighted)


class SharedIntermediateViews(TwoLinear):
    """Two views of one intermediate that is not itself an output (not in ZOO: refused in training)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.a(x))
        return h[:, :8], h[:, 8:]  # two views of h


def odd_outputs(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(OddOutputs().to(dtype), (torch.randn(4, 16, dtype=dtype),))


class BiLSTMMasked(nn.Module):
    """A bidirectional 2-layer LSTM over padded sequences (no packing): padded steps masked out of a
    masked mean; the lengths arrive as a mask."""

    def __init__(self, vocab: int = 20, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * d, 2)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(tokens) * mask.unsqueeze(-1))
        m = mask.unsqueeze(-1)
        return self.head((h * m).sum(1) / m.sum(1))


def bilstm_masked(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    lengths = torch.tensor([5, 3, 1])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).to(dtype)
    return ZooCase(BiLSTMMasked().to(dtype), (torch.randint(0, 20, (3, 5)), mask))


class Conv1dPool(nn.Module):
    """Sequences through Conv1d (dilated, strided), MaxPool1d with indices and AdaptiveMaxPool1d."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, c, 3, padding=2, dilation=2)
        self.pool = nn.MaxPool1d(2)
        self.conv2 = nn.Conv1d(c, c, 3, stride=2)
        self.head = nn.Linear(2 * c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(F.elu(self.conv(x)))
        h = F.relu(self.conv2(h))
        return self.head(torch.cat([F.adaptive_max_pool1d(h, 1), F.avg_pool1d(h, h.shape[-1])], 1).flatten(1))


def conv1d_pool(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Conv1dPool().to(dtype), (torch.randn(3, 4, 20, dtype=dtype),))


class RawParams(nn.Module):
    """An nn.ParameterList of matrices and a raw nn.Parameter used directly in matmuls (no nn.Linear)."""

    def __init__(self, d: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(d, d) / d**0.5) for _ in range(depth))
        self.scale = nn.Parameter(torch.ones(d))
        self.out = nn.Parameter(torch.randn(d, 3) / d**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = torch.tanh(x @ w) * self.scale
        return torch.matmul(x, self.out)


def raw_params(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(RawParams().to(dtype), (torch.randn(5, 16, dtype=dtype),))


class _ScaledTanh(torch.autograd.Function):
    """tanh whose backward the user wrote: the true derivative, scaled, plus a straight-through term, so
    a gradient taken from autograd's own tanh would differ."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return grad * (ctx.scale * (1 - y * y) + 0.5), None


class CustomFunction(TwoLinear):
    """A user-written torch.autograd.Function between two layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(_ScaledTanh.apply(self.a(x), 0.5))


def custom_function(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(CustomFunction().to(dtype), (torch.randn(4, 16, dtype=dtype),))


class Ranking(nn.Module):
    """Inference only: scores, then sort/topk/cumsum and an argmax (integer outputs)."""

    def __init__(self, d: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.score = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probs = self.score(x).softmax(-1)
        top, idx = probs.topk(3, dim=-1)
        ordered, order = probs.sort(dim=-1, descending=True)
        covered = (ordered.cumsum(-1) < 0.9).sum(-1)
        return probs.argmax(-1), idx, top, order[:, :2], covered


def ranking(dtype: torch.dtype = torch.float32) -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(Ranking().to(dtype), (torch.randn(6, 16, dtype=dtype),), modes=("inference",))


ZOO: dict[str, Callable[..., ZooCase]] = {
    "lstm_lm": lstm_lm, "gru_lm": gru_lm, "encoder_batch_first": encoder_batch_first,
    "encoder_seq_first": encoder_seq_first, "decoder_layer": decoder_layer, "mha_padding": mha_padding,
    "kwargs_dict": kwargs_dict, "tied_lm": tied_lm, "conv_gn": conv_gn, "mixer": mixer,
    "inplace_views": inplace_views, "indexing": indexing, "bags": bags, "running_mean": running_mean,
    "bn_dropout": bn_dropout, "bn_dropout_p0": bn_dropout_p0, "bn_eval": bn_eval, "input_grad": input_grad,
    "bf16": bf16, "checkpointed": checkpointed, "checkpointed_reentrant": checkpointed_reentrant,
    "frozen_backbone": frozen_backbone, "shared_layers": shared_layers, "sdp_attention": sdp_attention,
    "stop_gradient": stop_gradient, "autocast": autocast, "channels_last": channels_last,
    "odd_outputs": odd_outputs, "bilstm_masked": bilstm_masked, "conv1d_pool": conv1d_pool,
    "raw_params": raw_params, "custom_function": custom_function, "ranking": ranking,
    "output_view": output_view, "output_view_only": output_view_only, "intermediate_view": intermediate_view,
    "input_view": input_view, "param_view": param_view,
}
