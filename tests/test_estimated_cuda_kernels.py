"""A profile estimated for a CUDA target on this CPU host (``device="fake:h100"``) holds the kernels CUDA
runs, not the CPU's (`memviz.profiling.capture.kernel_family`): dropout as ``native_dropout`` (a bool
mask) and ``scaled_dot_product_attention`` as the fused kernel CUDA selects, which saves the output and its
logsumexp where the CPU's math path saves the T x T weights and their dropout noise.  Such a plan says what
fits on the target; it is not exported (the export needs a profile taken on the device)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memviz
from memviz.profiling.capture import capture


class Attention(nn.Module):
    """One attention layer with attention dropout and a residual dropout (GPT-2's block, reduced)."""

    def __init__(self, dim: int = 32, heads: int = 4, p: float = 0.1, kv_heads: int | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.p = heads, kv_heads or heads, p
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim * self.kv_heads // heads)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, -1).transpose(1, 2)
        k, v = (y.view(b, t, self.kv_heads, -1).transpose(1, 2) for y in self.kv(x).chunk(2, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p, is_causal=mask is None,
                                           enable_gqa=self.kv_heads != self.heads)
        return x + self.drop(y.transpose(1, 2).reshape(b, t, d))


def _ops(graph) -> set[str]:
    return {c.op for c in graph.computes}


def _x(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 64, 32, dtype=dtype)


def test_a_cuda_target_traces_efficient_attention_and_bool_dropout_masks():
    model = Attention().train()
    graph, cap = capture(model, (_x(),), kernels="cuda")
    assert cap.kernels == "cuda"
    ops = _ops(graph)
    assert {"aten._scaled_dot_product_efficient_attention.default", "aten.native_dropout.default"} <= ops
    assert not {"memviz.cpu_dropout.default", "aten._safe_softmax.default"} & ops
    # the attention's dropout is inside the fused kernel: only the residual dropout keeps a mask, of bools
    masks = [d for d in graph.datas if d.dtype == "bool"]
    assert [d.shape for d in masks] == [(2, 64, 32)]


def test_the_cpu_keeps_its_own_kernels():
    model = Attention().train()
    graph, cap = capture(model, (_x(),))
    assert cap.kernels == "cpu"
    ops = _ops(graph)
    assert {"memviz.cpu_dropout.default", "aten._safe_softmax.default"} <= ops
    assert not any("efficient_attention" in op or op.startswith("aten.native_dropout") for op in ops)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_without_a_mask_traces_flash_attention(dtype):
    model = Attention().to(dtype).train()
    ops = _ops(capture(model, (_x(dtype),), kernels="cuda")[0])
    assert "aten._scaled_dot_product_flash_attention.default" in ops
    assert "aten._scaled_dot_product_efficient_attention.default" not in ops


def test_a_mask_takes_efficient_attention_and_grouped_heads_the_math_path():
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    model = Attention().to(torch.bfloat16).train()
    ops = _ops(capture(model, (_x(torch.bfloat16), mask), kernels="cuda")[0])
    assert "aten._scaled_dot_product_efficient_attention.default" in ops
    assert "aten._scaled_dot_product_flash_attention.default" not in ops
    gqa = _ops(capture(Attention(kv_heads=2).train(), (_x(),), kernels="cuda")[0])
    assert "aten._safe_softmax.default" in gqa and "aten.native_dropout.default" in gqa
    assert not any("efficient_attention" in op or "cpu_dropout" in op for op in gqa)
    # fp32 rows of 6 floats are not 16-byte aligned: no memory-efficient kernel for them either
    odd = _ops(capture(Attention(dim=24).train(), (torch.randn(2, 64, 24),), kernels="cuda")[0])
    assert "aten._safe_softmax.default" in odd and "aten.native_dropout.default" in odd


def test_the_override_is_restored():
    """After a CUDA-family capture the same model captures the CPU's kernels again (nothing leaks)."""
    model = Attention().train()
    capture(model, (_x(),), kernels="cuda")
    assert "memviz.cpu_dropout.default" in _ops(capture(model, (_x(),))[0])


def _gpt2(attn_pdrop: float):
    from tests.real_models import transformers  # after torchvision's schema shim

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=1, n_head=4,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=attn_pdrop, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).train(), torch.randint(0, 256, (2, 128))


def test_gpt2_on_an_estimated_h100_holds_no_attention_weights():
    """Attention dropout on an estimated H100 costs what the fused kernel costs (its RNG state), not the
    CPU's B x H x T x T softmax weights and float noise: the predicted peak is the one without it."""
    peaks = {}
    for p in (0.1, 0.0):
        model, ids = _gpt2(p)
        prof = memviz.profile(model, (ids,), {"labels": ids}, device="fake:h100").with_costs("fake:h100")
        assert prof.captured.kernels == "cuda"
        assert "aten._scaled_dot_product_efficient_attention.default" in _ops(prof.graph)
        peaks[p] = prof.baseline.peak_bytes
    weights = 2 * 4 * 128 * 128 * 4  # one layer's attention weights, fp32
    assert abs(peaks[0.1] - peaks[0.0]) < weights // 4
    model, ids = _gpt2(0.1)
    cpu = memviz.profile(model, (ids,), {"labels": ids}, device="fake:cpu")
    assert cpu.captured.kernels == "cpu" and "memviz.cpu_dropout.default" in _ops(cpu.graph)
    assert cpu.baseline.peak_bytes > peaks[0.1] + weights


def test_a_cuda_estimated_plan_is_not_exported():
    model = Attention().train()
    prof = memviz.profile(model, (_x(),), device="fake:h100")
    plan = memviz.plan(prof, None, strategy="none", frontier=False)
    with pytest.raises(ValueError, match=r"estimated for a CUDA target \(fake:h100\).*model\.to\('cuda'\)"):
        memviz.export(plan)
    # a plan without its profile (from JSON) is refused the same way, before any re-capture
    from memviz.plans.planning import Plan

    with pytest.raises(ValueError, match="estimated for a CUDA target"):
        memviz.export(Plan.from_dict(plan.to_dict()), model=model, inputs=(_x(),))
