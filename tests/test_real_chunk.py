"""Autochunk on the real-model zoo (tests/real_models.py; issue 16 item 6): Hugging Face decoders at 1024
tokens and a timm ViT at 785 tokens, in eval mode (inference: dropout off, so the chunked loops are
deterministic and equal eager).  For each: outputs equal eager, the measured activation peak of the
chunked module within 5% of the estimate and below the unchunked one, no S x S mask that eager does
not build, attention never chunked along V's head dim.  About a minute on a quiet machine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

from memviz.plans import chunking as ch
from solvers import autochunk as ac
from tests.real_models import LANGUAGE_MODELS, REAL, timm, transformers
from tests.test_chunk_zoo import _measure

SPEED = ac.SpeedModel()  # fixed: deterministic selection on a loaded machine


def _assert_equal(ref, out) -> None:
    refs, outs = tree_flatten(ref)[0], tree_flatten(out)[0]
    assert len(refs) == len(outs)
    for a, b in zip(refs, outs, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def _timm_vit(size: int = 224):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=size,
                              patch_size=8, depth=2, embed_dim=32, num_heads=2)
    return model.eval(), (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0)),), {}


def _lm(name: str):
    case = REAL[name]()
    args, kwargs = case.long
    return case.model.eval(), args, kwargs


def _sdpa_dims(plan: ch.ChunkPlan) -> list[tuple[str, int]]:
    g = plan.graph
    return [(x, d) for r in plan.regions for x, d in r.flow.dims.items()
            if g[x].op == "scaled_dot_product_attention"]


@pytest.mark.parametrize("name", [*LANGUAGE_MODELS, "timm_vit"])
def test_chunked_real_model_equals_eager_and_measures_as_estimated(name):
    model, args, kwargs = _timm_vit() if name == "timm_vit" else _lm(name)
    eager_peak, ref = _measure(model, *args, **kwargs)
    # a narrower search than the default (beam 4, window 24): the same peaks here in a quarter of the time
    plan = ch.plan_chunks(model, args, budget=0.75, kwargs=kwargs, speed=SPEED, beam=2, window=12)
    flat = tree_flatten((args, kwargs))[0]
    base_peak, _ = _measure(plan.gm, *flat)
    # the capture holds what eager holds (no S x S mask eager skips): the unchunked estimate is exact
    assert abs(base_peak - plan.baseline_peak_bytes) <= 0.05 * base_peak
    assert base_peak <= eager_peak
    peak, out = _measure(plan.module(), *flat)
    _assert_equal(ref, out)
    assert abs(peak - plan.peak_bytes) <= 0.05 * peak, (peak, plan.peak_bytes)
    assert plan.regions, plan.refused
    assert peak < base_peak and plan.measured_peak_bytes == peak
    for x, d in _sdpa_dims(plan):
        assert d != len(plan.graph[x].shape) - 1, f"{x} chunked along V's head dim"


@pytest.mark.parametrize("name", ["llama", "gpt2_sdpa"])
def test_causal_capture_has_no_square_mask(name):
    """Eager HF calls SDPA with is_causal=True and never builds the mask; torch.export took the mask
    branch (HF's guard against exporting), and chunks of it cost up to 7.8x the eager peak."""
    model, args, kwargs = _lm(name)
    _, g = ch.capture(model, args, kwargs)
    S = args[0].shape[1]
    square = [n.name for n in g.nodes if len(n.shape) >= 2 and n.shape[-2:] == (S, S)]
    assert not square
    sdpa = [n for n in g.nodes if n.op == "scaled_dot_product_attention"]
    assert sdpa and all(n.kwargs.get("is_causal", n.args[5:6] == (True,)) for n in sdpa)
    assert all(n.backend == "flash" for n in sdpa)  # CPU: the fused kernel, no L x S scores


def test_causal_attention_chunked_along_queries_gets_its_mask_rows():
    model, args, kwargs = _lm("llama")
    with torch.no_grad():
        ref = model(*args)
    plan = ch.plan_chunks(model, args, budget=1.0, speed=SPEED, check=False)
    sdpa = "scaled_dot_product_attention"
    edit = {"start": sdpa, "end": sdpa, "chunks": 4, "outputs": {sdpa: 2}}
    chunked = plan.with_chunks([edit])
    assert ".tril(_lo0)" in chunked.module().code
    peak, out = _measure(chunked.module(), *args)
    _assert_equal(ref, out)
    assert abs(peak - chunked.peak_bytes) <= 0.05 * peak
    # its per-chunk mask (256 x 1024 bool and additive) outweighs the tiny attention output: the
    # estimate says the peak rises, and the measured check refuses the region
    base_peak, _ = _measure(plan.gm, *args)
    assert peak > base_peak
    with pytest.warns(UserWarning, match="did not lower the measured"):
        checked = chunked.checked(list(args))
    assert not checked.regions and [c["start"] for c in checked.refused] == [sdpa]
    assert checked.measured_peak_bytes == checked.measured_baseline_bytes == base_peak
    with pytest.raises(ValueError, match="V's head dim"):
        plan.with_chunks([{**edit, "outputs": {sdpa: 3}}])


class _Attention(torch.nn.Module):
    """Causal SDPA with a float mask, run by the math kernel when the fused ones are disabled."""

    def __init__(self, C: int = 32, H: int = 2, causal: bool = True) -> None:
        super().__init__()
        self.qkv, self.proj, self.H, self.causal = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C), H, causal

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=self.causal and bias is None)
        return x + self.proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("backend,mask", [("math", None), ("math", "bool"), ("flash", "bool"),
                                          ("flash", "float")])
def test_sdpa_workspace_per_kernel_matches_measurement(backend, mask):
    """The math kernel holds the B x H x L x S scores and their softmax (and the causal mask it
    builds); the fused one only a boolean mask's additive copy and the log-sum-exp."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    T = 256
    model = _Attention().eval()
    args: tuple = (torch.randn(1, T, 32),)
    if mask == "bool":
        args += (torch.rand(1, 1, T, T) > 0.3,)
    elif mask == "float":
        args += (torch.randn(1, 1, T, T),)
    kernel = SDPBackend.MATH if backend == "math" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel([kernel]):
        gm, g = ch.capture(model, args)
        (node,) = [n for n in g.nodes if n.op == "scaled_dot_product_attention"]
        assert node.backend == backend
        peak, _ = _measure(gm, *args)
        est = ac.estimate_memory(g)
        assert abs(peak - est.peak_bytes) <= 0.05 * peak, (peak, est.peak_bytes, node.temps)
        scores = 2 * T * T * 4
        assert (sum(node.temps) >= scores) == (backend == "math")
        plan = ch.ChunkPlan(g, [], SPEED, None, est.peak_bytes, est.peak_bytes, gm)
        edit = {"start": node.name, "end": node.name, "chunks": 4, "outputs": {node.name: 2}}
        chunked = plan.with_chunks([edit])
        cpeak, out = _measure(chunked.module(), *args)
        with torch.no_grad():
            _assert_equal(model(*args), out)
        assert abs(cpeak - chunked.peak_bytes) <= 0.05 * cpeak, (cpeak, chunked.peak_bytes)


def test_longest_fitting_length_is_found_by_doubling_then_bisection():
    seen: list[int] = []

    def fits(n: int) -> bool:
        seen.append(n)
        return n <= 1500

    assert ch._longest(fits, 256, 8192, 64) == (1472, False)
    assert seen[:3] == [512, 1024, 2048] and len(seen) <= 9
    assert ch._longest(lambda n: True, 256, 1000, 64) == (1000, True)


def test_max_length_gain_runs_both_sides():
    """A causal attention block with a wide MLP: chunking the MLP lets a longer input fit the
    unchunked peak of the base length, measured on both sides."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = _Attention()
            nn = torch.nn
            self.mlp = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.attn(x)
            return x + self.mlp(x)

    torch.manual_seed(0)
    model = Block().eval()

    def factory(n: int):
        return model, (torch.randn(1, n, 32),), {}

    gain = ch.max_length_gain(factory, 128, max_length=1024, step=32, exported=True)
    assert gain.unchunked_length >= 128
    assert gain.chunked_length > gain.unchunked_length and gain.gain > 1.5
    assert gain.unchunked_length <= gain.exported_length < gain.chunked_length
    assert all(peak <= gain.budget_bytes for n, peak, _ in gain.probes if n <= gain.chunked_length)


def test_memviz_plan_autochunk_on_a_decoder_exports_as_estimated():
    """profile -> plan(strategy="autochunk") -> export on llama at 1024 tokens (the profile's capture
    needs capture.py's tensor constants, from HF's masking_utils)."""
    import memviz

    model, args, kwargs = _lm("llama")
    with torch.no_grad():
        ref = model(*args, **kwargs)
    prof = memviz.profile(model, args, kwargs, mode="inference", fallback=False)
    plan = memviz.plan(prof, 0.8, strategy="autochunk")
    assert plan.chunks and plan.peak_bytes <= plan.budget_bytes
    opt = memviz.export(plan)
    peak, out = _measure(opt, *args, **kwargs)
    _assert_equal(ref, out)
    persistent = plan.baseline_graph.persistent_bytes()
    assert abs(peak - (plan.peak_bytes - persistent)) <= 0.05 * peak
    assert peak < plan.chunking.measured_baseline_bytes


def test_grouped_query_attention_is_not_chunked_along_heads():
    """llama's SDPA reads 2 key/value heads for 4 query heads (enable_gqa): a chunk of query heads
    does not read the same chunk of key heads."""
    model, args, kwargs = _lm("llama")
    plan = ch.plan_chunks(model, args, budget=1.0, speed=SPEED, check=False)
    sdpa = "scaled_dot_product_attention"
    with pytest.raises(ValueError, match="grouped key/value heads"):
        plan.with_chunks([{"start": sdpa, "end": sdpa, "chunks": 2, "outputs": {sdpa: 1}}])


def test_capture_answers_transformers_mask_guards_as_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.17 asks ``is_tracing(padding_mask)`` (true under export with no padding mask), 5.24
    ``is_torchdynamo_exporting()``: inside the capture both answer as eager does for no mask, and a mask
    tensor (or a bare call) still gets the library's own answer."""
    import sys
    import types

    from memviz.profiling.capture import eager_attention_masks

    mu = types.ModuleType("transformers.masking_utils")
    mu.is_tracing = lambda tensor=None: True  # as under torch.export
    mu.is_torchdynamo_exporting = lambda: True
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", mu)
    with eager_attention_masks():
        assert mu.is_tracing(None) is False
        assert mu.is_tracing(torch.ones(1)) is True
        assert mu.is_tracing() is True
        assert mu.is_torchdynamo_exporting() is False
    assert mu.is_tracing(None) is True and mu.is_torchdynamo_exporting() is True


def test_capture_answers_packed_sequence_check_as_eager() -> None:
    """Without a key/value cache (``use_cache=False``, as training runs) transformers looks for packed
    sequences in the position ids, a value read that under export always says "packed" and builds the
    S x S mask eager never builds (an H100 measured Llama's eager step 1233 MiB against a 889 MiB capture):
    the capture answers from the example, so a mask appears only for position ids that really pack."""
    from memviz.profiling.capture import trace_joint

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).train()
    model.config.use_cache = False
    ids = torch.randint(0, 64, (2, 16))

    def masks(kwargs: dict) -> int:
        gm, *_ = trace_joint(model, (ids,), kwargs, "train", lambda out: out.logits.sum())
        return sum(isinstance(v := n.meta.get("val"), torch.Tensor) and v.dtype == torch.bool
                   and tuple(v.shape[-2:]) == (16, 16) for n in gm.graph.nodes)

    assert masks({}) == 0
    assert masks({"position_ids": torch.arange(16).repeat(2, 1)}) == 0
    assert masks({"position_ids": torch.tensor([list(range(8)) * 2] * 2)}) > 0  # two sequences per row
