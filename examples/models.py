"""Example models for memviz: small sizes for tests, realistic sizes through arguments.

Every factory returns ``(model, example_args)`` where ``example_args`` is a tuple of tensors suitable
for ``memviz.profile(model, example_args)``.  The models cover what the capture has to get right:
tied weights and dropout (GPT), BatchNorm running statistics and in-place ReLU (ResNet), skip
concatenations (UNet), multi-output ops and views (fused qkv + unbind in GPT and ViT).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


# --- MLP ---------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int, layers: int) -> None:
        super().__init__()
        dims = [d_in] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=False))
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def mlp(batch: int = 8, d_in: int = 32, hidden: int = 64, d_out: int = 10, layers: int = 3,
        dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    model = MLP(d_in, hidden, d_out, layers).to(dtype)
    return model, (torch.randn(batch, d_in, dtype=dtype),)


# --- GPT-2 style ---------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)  # fused q, k, v projection, split by unbind below
        self.proj = nn.Linear(d, d)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc_proj(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(batch: int = 2, seq: int = 16, d: int = 32, heads: int = 4, layers: int = 2, vocab: int = 64,
        dropout: float = 0.1, dtype: torch.dtype = torch.float32,
        seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-2 style decoder; GPT-2 small is ``gpt(seq=1024, d=768, heads=12, layers=12, vocab=50257)``."""
    torch.manual_seed(seed)
    model = GPT(vocab, seq, d, heads, layers, dropout).to(dtype)
    return model, (torch.randint(0, vocab, (batch, seq)),)


# --- ResNet --------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], blocks_per_stage: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True))
        stages = []
        c = widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks_per_stage):
                stages.append(BasicBlock(c, w, 2 if (i > 0 and j == 0) else 1))
                c = w
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def resnet(batch: int = 2, image: int = 16, widths: tuple[int, ...] = (8, 16), blocks_per_stage: int = 1,
           classes: int = 10, dtype: torch.dtype = torch.float32,
           seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet with BatchNorm and in-place ReLU.

    ResNet-18-like: ``widths=(64, 128, 256, 512), blocks_per_stage=2``."""
    torch.manual_seed(seed)
    model = ResNet(widths, blocks_per_stage, classes).to(dtype)
    return model, (torch.randn(batch, 3, image, image, dtype=dtype),)


# --- UNet ----------------------------------------------------------------------------------------
def _double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(1, c_out), nn.SiLU(),
                         nn.Conv2d(c_out, c_out, 3, padding=1), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, channels: int, base: int, depth: int) -> None:
        super().__init__()
        self.downs = nn.ModuleList()
        c = channels
        widths = [base * 2**i for i in range(depth)]
        for w in widths:
            self.downs.append(_double_conv(c, w))
            c = w
        self.mid = _double_conv(c, 2 * c)
        c = 2 * c
        self.ups = nn.ModuleList()
        self.up_convs = nn.ModuleList()
        for w in reversed(widths):
            self.ups.append(nn.ConvTranspose2d(c, w, 2, stride=2))
            self.up_convs.append(_double_conv(2 * w, w))  # input: upsampled ++ skip
            c = w
        self.out = nn.Conv2d(c, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for down in self.downs:
            x = down(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, conv, skip in zip(self.ups, self.up_convs, reversed(skips), strict=False):
            x = conv(torch.cat([up(x), skip], dim=1))
        return self.out(x)


def unet(batch: int = 2, image: int = 16, channels: int = 3, base: int = 8, depth: int = 2,
         dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """UNet with skip concatenations; ``image`` must be divisible by ``2**depth``."""
    torch.manual_seed(seed)
    model = UNet(channels, base, depth).to(dtype)
    return model, (torch.randn(batch, channels, image, image, dtype=dtype),)


# --- ViT -----------------------------------------------------------------------------------------
class ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, d: int, heads: int, layers: int, classes: int,
                 dropout: float) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, d, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock(d, heads, dropout) for _ in range(layers)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.ln(self.blocks(x))
        return self.head(x[:, 0])


def vit(batch: int = 2, image: int = 16, patch: int = 4, d: int = 32, heads: int = 4, layers: int = 2,
        classes: int = 10, dropout: float = 0.1, dtype: torch.dtype = torch.float32,
        seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Vision transformer; ViT-B/16: ``image=224, patch=16, d=768, heads=12, layers=12``."""
    torch.manual_seed(seed)
    model = ViT(image, patch, d, heads, layers, classes, dropout).to(dtype)
    return model, (torch.randn(batch, 3, image, image, dtype=dtype),)


#: name -> factory, used by tests and benchmarks.
EXAMPLES = {"mlp": mlp, "gpt": gpt, "resnet": resnet, "unet": unet, "vit": vit}


# --- Megatron GPT layer (Korthikanti et al., MLSys 2023, Fig. 2) ---------------------------------
class MegatronLayer(nn.Module):
    """Pre-LN GPT layer as in Korthikanti Fig. 2: LN, QKV, explicit softmax attention with dropout,
    output projection + dropout + residual, LN, 4h MLP with GELU + dropout + residual."""

    def __init__(self, hidden: int, heads: int, p: float = 0.1) -> None:
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        a, dh = self.heads, h // self.heads
        q, k, v = (t.view(b, s, a, dh).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(h, dim=-1))
        scores = torch.matmul(q, k.transpose(-2, -1)) * dh**-0.5
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, True)
        context = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.proj(context), self.p, True)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, True)
