"""The transformer what-if estimator (solvers.analytic) against hand-computed values and a real layer.

Part 1 checks the closed forms of Korthikanti et al. (the per-layer table of Sec. 4-5, restated by
the Neuron "Activation Memory Reduction" page) on GPT-3 175B's shapes, computed by hand below.
Part 2 builds a Megatron-style GPT layer in PyTorch and checks that what autograd saves for backward
is exactly the formula: 36sbh + 6as^2b in eager bf16 on CPU (2-byte masks), 34sbh + 5as^2b in the
captured AOT joint graph (bool masks).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.analytic import (
    TransformerConfig,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    estimate_memory,
    fits,
    in_flight_layers,
    layer_activation_breakdown,
    layer_activation_tensors,
    max_micro_batch,
    output_activation_bytes,
    parameter_count_per_device,
)

# GPT-3 175B as configured in Korthikanti et al.: a=96, h=12288, L=96, s=2048, v=51200, t=8, p=8, b=1.
GPT3 = TransformerConfig(layers=96, hidden=12288, heads=96, seq=2048, batch=1, vocab=51200)
SBH = 2048 * 1 * 12288  # = 25_165_824 ; as/h = 96 * 2048 / 12288 = 16, so 5as/h = 80


# --- Part 1: closed forms ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "expected"),
    [
        (1, False, "none", 2_868_903_936),     # sbh(34 + 80)           = 114 sbh
        (8, False, "none", 578_813_952),       # sbh(10 + 24/8 + 80/8)  = 23 sbh
        (8, True, "none", 358_612_992),        # sbh/8 (34 + 80)        = 14.25 sbh
        (8, False, "selective", 327_155_712),  # sbh(10 + 24/8)         = 13 sbh
        (8, True, "selective", 106_954_752),   # 34 sbh / 8             = 4.25 sbh
        (1, False, "full", 50_331_648),        # 2 sbh
        (8, False, "full", 50_331_648),        # 2 sbh: the layer input is replicated without SP
        (8, True, "full", 6_291_456),          # 2 sbh / 8
    ],
)
def test_korthikanti_table_gpt3(tp, sp, recompute, expected):
    assert activation_bytes_per_layer(GPT3, tp=tp, sp=sp, recompute=recompute) == expected


@pytest.mark.parametrize(
    ("hidden", "heads", "tp_only"),  # Korthikanti et al.'s 22B, 175B, 530B and 1T models, s = 2048, t = 8
    [(6144, 64, 10 + 3 + 5 * 64 * 2048 / 6144 / 8), (12288, 96, 23), (20480, 128, 21), (25600, 160, 21)],
)
def test_about_5x_less_than_tensor_parallelism_alone(hidden, heads, tp_only):
    # The abstract's "reduces activation memory by 5x": tensor parallelism alone keeps
    # sbh(10 + 24/8 + 5as/(8h)); with sequence parallelism and selective recompute 34sbh/8 = 4.25 sbh.
    cfg = TransformerConfig(layers=8, hidden=hidden, heads=heads, seq=2048, batch=1)
    sbh = 2048 * hidden
    assert activation_bytes_per_layer(cfg, tp=8) == pytest.approx(tp_only * sbh, rel=1e-12)
    assert activation_bytes_per_layer(cfg, tp=8, sp=True, recompute="selective") == 4.25 * sbh
    assert 4.9 < tp_only / 4.25 < 6.3


def test_small_config_by_hand():
    # s=4, b=3, h=8, a=2: sbh = 96, as^2b = 96.  34*96 + 5*96 = 3744 ; tp=2: 10*96 + 12*96 + 2.5*96 = 2352.
    cfg = TransformerConfig(layers=2, hidden=8, heads=2, seq=4, batch=3)
    assert activation_bytes_per_layer(cfg) == 3744
    assert activation_bytes_per_layer(cfg, tp=2) == 2352
    assert activation_bytes_per_layer(cfg, tp=2, sp=True) == 3744 // 2
    assert activation_bytes_per_layer(cfg, tp=2, recompute="selective") == 10 * 96 + 12 * 96


def test_cpu_bf16_variant_is_36sbh_plus_6as2b():
    # Two-byte dropout masks: the three masks add sbh + sbh + as^2b to 34sbh + 5as^2b.
    for s, b, h, a in [(2048, 1, 12288, 96), (16, 2, 64, 4), (7, 3, 12, 3)]:
        cfg = TransformerConfig(layers=1, hidden=h, heads=a, seq=s, batch=b, dropout_mask_bytes=2)
        assert activation_bytes_per_layer(cfg) == 36 * s * b * h + 6 * a * s * s * b


def test_dropout_free_layer():
    # No masks, and attention over V reads the softmax output itself: 32sbh + 2as^2b in 16-bit.
    cfg = TransformerConfig(layers=1, hidden=64, heads=4, seq=16, batch=2, dropout=False)
    assert activation_bytes_per_layer(cfg) == 32 * 16 * 2 * 64 + 2 * 4 * 16 * 16 * 2


@settings(max_examples=60, deadline=None)
@given(
    d=st.integers(1, 8), m=st.integers(0, 8), s=st.integers(1, 64), b=st.integers(1, 8),
    a=st.integers(1, 8), hd=st.integers(1, 16), f=st.integers(1, 8),
)
def test_breakdown_sums_to_general_formula(d, m, s, b, a, hd, f):
    h = a * hd
    cfg = TransformerConfig(layers=1, hidden=h, heads=a, seq=s, batch=b, ffn_mult=f, dtype_bytes=d,
                            dropout_mask_bytes=m)
    sbh, scores = s * b * h, a * s * s * b
    tensors = layer_activation_tensors(cfg)
    # attention 5d+m, MLP d + 2fd + m, LayerNorms 2d (f = 4 gives 16d + 2m)
    total = sbh * (8 * d + 2 * m) + 2 * f * d * s * b * h + scores * (2 * d + m)
    assert sum(t.bytes for t in tensors) == total
    replicated = sum(t.bytes for t in tensors if not t.tensor_parallel)
    assert replicated == sbh * (4 * d + 2 * m)  # the "10sbh" at d=2, m=1
    assert sum(t.bytes for t in tensors if t.attention_core) == scores * (2 * d + m)


@settings(max_examples=60, deadline=None)
@given(
    s_mult=st.integers(1, 8), b=st.integers(1, 4), hd=st.integers(1, 8), a_mult=st.integers(1, 4),
    mask=st.integers(0, 2), dropout=st.booleans(),
)
def test_monotone_in_parallelism_and_recompute(s_mult, b, hd, a_mult, mask, dropout):
    a, s = 8 * a_mult, 8 * s_mult  # divisible by every tp below
    cfg = TransformerConfig(layers=4, hidden=a * hd, heads=a, seq=s, batch=b, dropout_mask_bytes=mask,
                            dropout=dropout)
    for sp in (False, True):
        for mode in ("none", "selective", "full"):
            values = [activation_bytes_per_layer(cfg, tp, sp, mode) for tp in (1, 2, 4, 8)]
            assert values == sorted(values, reverse=True), (sp, mode, values)
            if sp and mode != "full":
                assert values[-1] < values[0]
    for tp in (1, 2, 4, 8):
        for sp in (False, True):
            full, sel, none = (activation_bytes_per_layer(cfg, tp, sp, r)
                               for r in ("full", "selective", "none"))
            assert full <= sel <= none
        assert activation_bytes_per_layer(cfg, tp, True) <= activation_bytes_per_layer(cfg, tp, False)


def test_pipeline_first_stage_holds_p_microbatches():
    assert in_flight_layers(96, 8) == 96       # L/p layers x p micro-batches
    assert in_flight_layers(96, 1) == 96
    assert in_flight_layers(96, 8, interleave=2) == 138  # 96 (1 + 7/16)
    est = estimate_memory(GPT3, tp=8, sp=True, recompute="selective", pp=8)
    assert est["layers_per_stage"] == 12
    assert est["layer_activations"] == 96 * 106_954_752
    assert est["embedding_activations"] == SBH * 8 // 8   # sbh p / t with 1-byte masks
    assert est["output_activations"] == 0                  # lives on the last stage when p > 1
    with pytest.raises(ValueError, match="divisible by the pipeline degree"):
        in_flight_layers(96, 7)


def test_embedding_and_output_terms():
    # Sec. 4.3: 4sbh/t (1 + v/h) = 2sbh/t + 2sbh/t + 4sbv/t with t = 8 and sequence parallelism.
    out = output_activation_bytes(GPT3, tp=8, sp=True)
    assert out == {"final_ln.input": 6_291_456, "output_proj.input": 6_291_456, "logits": 52_428_800}
    assert embedding_activation_bytes(GPT3, tp=8, sp=True, pp=1) == SBH // 8
    assert embedding_activation_bytes(GPT3, tp=8, sp=False, pp=2) == 2 * SBH
    est = estimate_memory(GPT3, tp=8, sp=True, recompute="selective", pp=1)
    assert est["output_activations"] == 65_011_712
    assert est["activations"] == 96 * 106_954_752 + SBH // 8 + 65_011_712


def test_parameters_and_adam_state():
    h, v, s = 12288, 51200, 2048
    assert parameter_count_per_device(GPT3) == 96 * (12 * h * h + 13 * h) + v * h + s * h + 2 * h  # 174.6e9
    per_dev = 12 * ((12 * h * h + 7 * h) // 8 + 6 * h) + v * h // 8 + s * h
    assert parameter_count_per_device(GPT3, tp=8, pp=8) == per_dev
    est = estimate_memory(GPT3, tp=8, sp=True, recompute="selective", pp=8, device_capacity_bytes=80 * 2**30)
    assert (est["parameters"], est["gradients"], est["optimizer"]) == (2 * per_dev, 2 * per_dev, 12 * per_dev)
    assert est["total"] == est["activations"] + 16 * per_dev
    assert est["headroom"] == 80 * 2**30 - est["total"]
    assert est["fits"] is (est["total"] <= 80 * 2**30)


def test_fits_boundary():
    cfg = TransformerConfig(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=128)
    total = estimate_memory(cfg)["total"]
    assert fits(cfg, total)
    assert not fits(cfg, total - 1)
    assert fits(cfg, total - 1, recompute="full")


def test_max_micro_batch_is_the_boundary():
    cfg = TransformerConfig(layers=4, hidden=64, heads=4, seq=128, batch=1, vocab=256)
    fixed = estimate_memory(cfg)["total"] - estimate_memory(cfg)["activations"]
    per_sample = estimate_memory(cfg)["activations"]  # every activation term is proportional to b
    for capacity in (fixed + per_sample - 1, fixed + per_sample, fixed + 37 * per_sample + 5):
        b = max_micro_batch(cfg, capacity)
        assert b == (capacity - fixed) // per_sample
        if b:
            assert estimate_memory(replace(cfg, batch=b), device_capacity_bytes=capacity)["fits"]
        assert not estimate_memory(replace(cfg, batch=b + 1), device_capacity_bytes=capacity)["fits"]
    assert max_micro_batch(cfg, fixed + 37 * per_sample, recompute="full") > 37


def test_by_category_uses_timeline_names():
    from solvers.simulate import CATEGORIES

    est = estimate_memory(GPT3, tp=8, sp=True, recompute="selective", pp=8)
    assert set(est["by_category"]) <= set(CATEGORIES)
    assert sum(est["by_category"].values()) == est["total"]


def test_bad_input_errors():
    with pytest.raises(ValueError, match="divisible by heads"):
        TransformerConfig(layers=1, hidden=10, heads=3, seq=4, batch=1)
    with pytest.raises(ValueError, match="must be positive"):
        TransformerConfig(layers=0, hidden=8, heads=2, seq=4, batch=1)
    with pytest.raises(TypeError, match="must be an int"):
        TransformerConfig(layers=1, hidden=8.0, heads=2, seq=4, batch=1)
    cfg = TransformerConfig(layers=1, hidden=12, heads=3, seq=5, batch=1)
    with pytest.raises(ValueError, match=r"heads \(3\) must be divisible"):
        activation_bytes_per_layer(cfg, tp=2)
    with pytest.raises(ValueError, match="sequence parallelism"):
        activation_bytes_per_layer(cfg, tp=3, sp=True)
    with pytest.raises(ValueError, match="recompute must be one of"):
        activation_bytes_per_layer(cfg, recompute="some")
    with pytest.raises(ValueError, match="device_capacity_bytes"):
        estimate_memory(cfg, device_capacity_bytes=0)


def test_breakdown_names_every_term():
    bd = layer_activation_breakdown(GPT3, tp=8, sp=False, recompute="selective")
    assert "attention.softmax_output" not in bd and bd["attention.q"] == 2 * SBH // 8
    assert bd["ln1.input"] == 2 * SBH and bd["mlp.dropout_mask"] == SBH
    assert layer_activation_breakdown(GPT3, recompute="full") == {"ln1.input": 2 * SBH}


# --- Part 2: a real GPT layer's saved-for-backward tensors ------------------------------------------
torch = pytest.importorskip("torch")
from examples.models import MegatronLayer  # noqa: E402  (after the torch importorskip)


def saved_activation_storages(layer, x):
    """Bytes of every distinct storage autograd saves for backward, minus parameters and LayerNorm
    statistics.

    Measured with torch.autograd.graph.saved_tensors_hooks, deduplicated by storage (views of one
    storage count once, as a storage is what occupies memory).  The paper neglects LayerNorm's
    per-token mean and rstd (2 values per token per LayerNorm, ~1/h of the rest); we identify them by
    walking the autograd graph (NativeLayerNormBackward0's saved results 1 and 2) and leave them out.
    """
    saved: dict[int, int] = {}

    def pack(t):
        saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    ln_stats, seen, stack = set(), set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name() == "NativeLayerNormBackward0":
            ln_stats |= {getattr(node, f"_saved_result{i}").untyped_storage().data_ptr() for i in (1, 2)}
        stack.extend(fn for fn, _ in node.next_functions)
    assert len(ln_stats) == 4, "expected mean and rstd of two LayerNorms"
    return sorted(n for ptr, n in saved.items() if ptr not in params | ln_stats), out


@pytest.mark.parametrize(
    ("s", "b", "h", "a", "dtype", "p"),
    [
        (8, 2, 16, 4, torch.bfloat16, 0.1),
        (32, 3, 64, 8, torch.bfloat16, 0.1),
        (16, 1, 48, 3, torch.bfloat16, 0.0),   # p = 0: F.dropout returns its input, nothing saved
        (8, 2, 32, 2, torch.float32, 0.2),
    ],
)
def test_gpt_layer_saves_exactly_the_formula(s, b, h, a, dtype, p):
    """On CPU, F.dropout multiplies by a noise tensor of the input's dtype and MulBackward0 saves it:
    a bf16 mask costs 2 bytes per element (4 in fp32).  GELU saves its input, the next linear its
    output; matmul over non-contiguous head views saves contiguous copies of Q, K and V (sbh each).
    Under these conventions the layer stores sbh(16d + 2m) + as^2b(2d + m) bytes: 36sbh + 6as^2b for
    bf16 with dropout."""
    torch.manual_seed(0)
    layer = MegatronLayer(h, a, p).to(dtype)
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    measured, out = saved_activation_storages(layer, x)
    d = dtype.itemsize
    cfg = TransformerConfig(layers=1, hidden=h, heads=a, seq=s, batch=b, dtype_bytes=d,
                            dropout_mask_bytes=d, dropout=p > 0)
    expected = activation_bytes_per_layer(cfg)
    assert sum(measured) == expected
    if dtype == torch.bfloat16 and p > 0:
        assert expected == 36 * s * b * h + 6 * a * s * s * b
    # Tensor by tensor, not only in total: the same multiset of sizes as the paper's breakdown.  With
    # b = 1 matmul folds the head views without copying, so Q, K and V are saved as views of the fused
    # QKV output: one 3sbh storage instead of three sbh copies (the same bytes).
    tensors = layer_activation_tensors(cfg)
    qkv = [t.bytes for t in tensors if t.name in ("attention.q", "attention.k", "attention.v")]
    rest = [t.bytes for t in tensors if t.name not in ("attention.q", "attention.k", "attention.v")]
    assert measured in (sorted(rest + qkv), sorted([*rest, sum(qkv)]))
    out.sum().backward()  # the saved set is really what backward consumes
    assert x.grad is not None and x.grad.shape == x.shape


def joint_graph_saved_storages(layer, x):
    """Bytes of the forward storages the backward half of the AOT joint graph reads (torch.export ->
    aot_export_joint_with_descriptors, the capture path of TOOLCHAIN.md), without parameters and
    LayerNorm statistics.  View ops and split outputs are followed to the storage they alias."""
    import contextlib
    import operator

    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    aten = torch.ops.aten
    views = {aten.view.default, aten.t.default, aten.transpose.int, aten.expand.default,
             aten._unsafe_view.default, aten.detach.default, aten.permute.default, aten.alias.default}
    splits = {aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int}
    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(stack, torch.export.export(layer, (x,)).module(), (x,))
    nodes = list(joint.graph_module.graph.nodes)
    backward: set = set()
    for n in nodes:  # a node is backward when it depends on a tangent (the incoming gradient)
        if n.op == "output":
            continue
        if n.name.startswith("tangents") or any(i in backward for i in n.all_input_nodes):
            backward.add(n)

    def storage(n):
        while n.op == "call_function":
            if n.target in views:
                n = n.args[0]
            elif n.target is operator.getitem and getattr(n.args[0], "target", None) in splits:
                n = n.args[0].args[0]
            else:
                break
        return n

    primals = [n for n in nodes if n.op == "placeholder" and n.name.startswith("primals")]
    params = set(primals[: len(list(layer.parameters()))])  # AOT orders parameters before user inputs
    ln_stats = {n for n in nodes if n.target is operator.getitem and n.args[1] in (1, 2)
                and n.args[0].target is aten.native_layer_norm.default}
    saved = {}
    for n in nodes:
        if n.op != "output" and n not in backward and any(u in backward for u in n.users):
            root = storage(n)
            if root not in params and root not in ln_stats:
                saved[root] = root.meta["val"].numel() * root.meta["val"].element_size()
    return sorted(saved.values())


@pytest.mark.parametrize(("s", "b", "h", "a"), [(8, 2, 16, 4), (16, 3, 48, 3)])
def test_gpt_layer_joint_graph_is_megatron_exact(s, b, h, a):
    """Under torch.export + AOT autograd, dropout is aten.native_dropout, whose mask is a bool tensor
    (1 byte): the captured graph saves exactly the paper's 34sbh + 5as^2b, tensor by tensor -- while
    eager autograd on CPU (test above) saves 2-byte bf16 masks, 36sbh + 6as^2b."""
    torch.manual_seed(0)
    layer = MegatronLayer(h, a, 0.1).to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    measured = joint_graph_saved_storages(layer, x)
    cfg = TransformerConfig(layers=1, hidden=h, heads=a, seq=s, batch=b)  # bf16, 1-byte masks
    assert sum(measured) == activation_bytes_per_layer(cfg) == 34 * s * b * h + 5 * a * s * s * b
    assert measured == sorted(t.bytes for t in layer_activation_tensors(cfg))


@pytest.mark.parametrize("device", [None, "fake:trn1"])
def test_gpt_layer_profile_graph_matches_cpu_formula(device):
    """The same check through memviz.profile's CD-graph.  Its capture runs CPU's eager dropout kernel
    (a noise tensor of the input's dtype), so on CPU the masks are 2 bytes: 36sbh + 6as^2b.

    Conventions, as in the paper: the layer's own input counts (LayerNorm 1 saves it; in the graph it
    is an "input" node read by the backward pass, not a "saved" one), LayerNorm's per-token mean and
    rstd are left out, views are merged into their storage by the capture itself."""
    from memviz import profile
    from solvers import DataKind, Phase

    s, b, h, a = 16, 2, 32, 4
    torch.manual_seed(0)
    layer = MegatronLayer(h, a, 0.1).to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    g = profile(layer, (x,), mode="train", device=device).graph

    def read_by_backward(d):
        return any(g.computes[c].phase is Phase.BACKWARD for c in g.consumers(d.id))

    def layernorm_stat(d):
        return "native_layer_norm" in g.computes[d.producer].op and d.shape[-1:] == (1,)

    # the layer's activations, not what the loss (here a sum: nothing) keeps for its backward
    saved = [d for d in g.datas if d.kind is DataKind.SAVED and d.name != "loss_saved"]
    stats = [d for d in saved if layernorm_stat(d)]
    assert len(stats) == 4 and all(read_by_backward(d) for d in saved)
    inputs = [d for d in g.datas if d.kind is DataKind.INPUT and read_by_backward(d)]
    measured = sorted(d.bytes for d in [*saved, *inputs] if d not in stats)
    cfg = TransformerConfig(layers=1, hidden=h, heads=a, seq=s, batch=b, dropout_mask_bytes=2)
    assert sum(measured) == 36 * s * b * h + 6 * a * s * s * b == activation_bytes_per_layer(cfg)
    assert measured == sorted(t.bytes for t in layer_activation_tensors(cfg))


def test_grouped_query_attention_narrows_k_v_and_their_weights():
    """K and V are kv_heads/heads as wide as Q (activations and QKV weights); kv_heads=heads is plain MHA."""
    from solvers import analytic

    base = analytic.TransformerConfig(layers=4, hidden=64, heads=8, seq=32, batch=2, vocab=128)
    gqa = replace(base, kv_heads=2)
    assert replace(base, kv_heads=8).kv_width == base.kv_width == 64
    mha = replace(base, kv_heads=8)
    assert analytic.estimate_memory(mha)["total"] == analytic.estimate_memory(base)["total"]
    s, b, h, g, d = 32, 2, 64, 16, 2
    full, narrow = analytic.layer_activation_breakdown(base), analytic.layer_activation_breakdown(gqa)
    assert (narrow["attention.k"], narrow["attention.v"]) == (s * b * g * d, s * b * g * d)
    assert {k: v for k, v in narrow.items() if k not in ("attention.k", "attention.v")} == {
        k: v for k, v in full.items() if k not in ("attention.k", "attention.v")}
    # QKV weight h(h + 2g) and bias h + 2g instead of 3h^2 and 3h, per layer
    per_layer_saving = (3 * h * h + 3 * h) - (h * (h + 2 * g) + h + 2 * g)
    assert (analytic.parameter_count_per_device(base) - analytic.parameter_count_per_device(gqa)
            == 4 * per_layer_saving)
    assert (analytic.parameter_count_per_device(base, tp=2) - analytic.parameter_count_per_device(gqa, tp=2)
            == 4 * per_layer_saving // 2)
    assert analytic.activation_formula(replace(gqa, dropout=False)) == "29sbh + 2as^2b"
    with pytest.raises(ValueError, match="kv_heads"):
        analytic.estimate_memory(gqa, tp=4)
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        replace(base, kv_heads=3)


def test_vocabulary_padded_as_megatron_for_any_tp():
    """GPT-2's 50257 tokens: Megatron pads the vocabulary to a multiple of 128 x t
    (`_vocab_size_with_padding`), so every tensor-parallel degree has an estimate, at the padded size."""
    from solvers.analytic import assumptions, padded_vocab

    gpt2 = TransformerConfig(layers=12, hidden=768, heads=12, seq=1024, batch=1, vocab=50257)
    assert [padded_vocab(gpt2, t) for t in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    no_vocab = replace(gpt2, vocab=None)
    for tp in (1, 2, 4):  # (12 heads: 8 ranks cannot split them)
        v = padded_vocab(gpt2, tp)
        logits = output_activation_bytes(gpt2, tp=tp)["logits"]
        assert logits == 1024 * v * 4 // tp
        params = parameter_count_per_device(gpt2, tp=tp) - parameter_count_per_device(no_vocab, tp=tp)
        assert params == v * 768 // tp + 1024 * 768 + 2 * 768
        rows = {r["name"]: r["value"] for r in assumptions(gpt2, tp=tp)}
        want = f"vocab 50257 padded to {v} (Megatron: a multiple of 128 x t = {128 * tp})"
        assert want in rows["vocabulary"]
    # divisible-by 1 at t = 1 counts the vocabulary as given
    exact = replace(gpt2, vocab_divisible_by=1)
    assert padded_vocab(exact) == 50257 and padded_vocab(exact, 2) == 50258
    assert "padded" not in {r["name"]: r["value"] for r in assumptions(exact)}["vocabulary"]
    with pytest.raises(ValueError, match="vocab_divisible_by"):
        replace(gpt2, vocab_divisible_by=0)
