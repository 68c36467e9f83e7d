"""memviz.WhatIf: every number is solvers.analytic's; the capacity comparison follows the preset."""

from __future__ import annotations

import json

import pytest

from memviz.devices import TARGETS
from memviz.whatif import WhatIf, config_from
from solvers import analytic

CFG = {"layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, "batch": 4, "vocab": 50304, "dtype": "bf16"}


@pytest.mark.parametrize(
    "tp,sp,recompute,pp,micro",
    [(1, False, "none", 1, 4), (2, True, "selective", 1, 4), (4, True, "full", 2, 2),
     (8, False, "none", 4, 1)],
)
def test_numbers_equal_analytic(tp, sp, recompute, pp, micro):
    w = WhatIf(CFG, device="a100-80gb")
    w.tp, w.sp, w.recompute, w.pp, w.micro_batch = tp, sp, recompute, pp, micro
    cfg = analytic.TransformerConfig(layers=24, hidden=2048, heads=16, seq=2048, batch=micro, vocab=50304)
    want = analytic.estimate_memory(cfg, tp=tp, sp=sp, recompute=recompute, pp=pp,
                                    device_capacity_bytes=TARGETS["a100-80gb"].capacity_bytes)
    got = json.loads(w.result_json)
    assert got["total"] == want["total"]
    bars = {b["label"]: b["bytes"] for b in got["bars"]}
    assert bars == {"parameters": want["parameters"], "gradients": want["gradients"],
                    "optimizer state": want["optimizer"], "activations": want["activations"]}
    assert sum(bars.values()) == got["total"]
    assert w.error == ""


def test_tp_changes_memory_and_capacity_verdict_follows_preset():
    w = WhatIf(CFG, device="v100-16gb")
    big = json.loads(w.result_json)
    assert big["fits"] is False and "does not fit" in big["verdict"]
    assert big["capacity"] == TARGETS["v100-16gb"].capacity_bytes
    w.tp, w.sp, w.recompute, w.pp, w.micro_batch = 8, True, "full", 4, 1
    small = json.loads(w.result_json)
    assert small["total"] < big["total"]
    assert small["fits"] is (small["total"] <= small["capacity"])
    w.device = "h200"
    assert json.loads(w.result_json)["capacity"] == TARGETS["h200"].capacity_bytes


def test_bad_settings_give_errors_not_crashes():
    w = WhatIf(CFG)
    before = w.result_json
    w.tp = 3  # 16 heads do not split over 3 devices
    assert "divisible" in w.error and w.result_json == before
    w.tp = 2
    assert w.error == ""
    with pytest.raises(ValueError, match="lacks"):
        config_from({"layers": 2})
    with pytest.raises(ValueError, match="choose one of"):
        WhatIf(CFG, device="nope")


def test_config_from_example_gpt():
    from examples.models import GPT

    model = GPT(vocab=64, seq=16, d=32, heads=4, layers=2, dropout=0.1)
    cfg = config_from(model)
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.seq, cfg.vocab, cfg.dtype_bytes, cfg.dropout) == (
        2, 32, 4, 16, 64, 4, True)


def _hf():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import real_models  # noqa: F401  (torchvision's schema shim before transformers)
    import transformers

    return transformers


def test_from_hugging_face_configs():
    from memviz.whatif import config_from_hf

    tf = _hf()
    gpt2 = config_from_hf(tf.GPT2Config(), seq=1024, batch=4, dtype="bf16")
    assert (gpt2.layers, gpt2.hidden, gpt2.heads, gpt2.vocab, gpt2.ffn_hidden) == (12, 768, 12, 50257, 3072)
    assert gpt2.dropout and gpt2.dtype_bytes == 2
    llama8b = tf.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    w = WhatIf.from_config(llama8b, seq=8192, batch=1, dtype="bf16", device="h100")
    cfg = w.config
    assert (cfg.layers, cfg.hidden, cfg.ffn_hidden, cfg.ffn_size) == (32, 4096, 14336, 14336)
    assert not cfg.dropout
    w.tp, w.sp = 8, True
    want = analytic.estimate_memory(cfg, tp=8, sp=True, device_capacity_bytes=TARGETS["h100"].capacity_bytes)
    assert json.loads(w.result_json)["total"] == want["total"]


def test_formula_next_to_a_captured_tensor_parallel_rank():
    """TinyGPT (no dropout, SDPA) on one of 2 tensor-parallel ranks: each block saves exactly the formula's
    tensors less the attention scores a fused kernel never stores, plus LayerNorm's per-token mean/rstd
    and the kernel's log-sum-exp."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from distributed_worker import loss_of, tiny_gpt, tiny_llama

    from memviz.whatif import compare_captured

    model, args = tiny_gpt()
    cmp = compare_captured(model, args, tp=2, loss_fn=loss_of,
                           config={"layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "dropout": False})
    cfg = cmp.config
    assert (cfg.seq, cfg.batch, cfg.dtype_bytes) == (16, 2, 4)
    assert cmp.formula == analytic.layer_activation_breakdown(cfg, tp=2)
    scores = cmp.formula["attention.softmax_output"]
    stats = sum(t["bytes"] for t in cmp.captured_tensors if t["shape"][-1] == 1)
    # the log-sum-exp: (batch, heads / tp, seq)
    lse = sum(t["bytes"] for t in cmp.captured_tensors if t["shape"] == (2, 2, 16))
    assert stats and lse
    for row in cmp.layers:
        assert row["formula"] == analytic.activation_bytes_per_layer(cfg, tp=2)
        assert row["captured"] == row["formula"] - scores + stats + lse
        assert row["difference"] == row["captured"] - row["formula"]
    assert "fused attention kernel" in repr(cmp) and "blocks.1" in repr(cmp)
    assert list(cmp.to_dataframe()["captured"]) == [r["captured"] for r in cmp.layers]

    llama, largs = tiny_llama(intermediate_size=96)
    cmp = compare_captured(llama, largs, tp=2, loss_fn=loss_of)  # config from llama.config
    assert cmp.config.ffn_hidden == 96
    assert [r["layer"] for r in cmp.layers] == ["model.layers.0", "model.layers.1"]
    # SwiGLU saves four MLP-wide tensors where the formula's GELU MLP saves two: more than the formula
    assert all(r["captured"] > r["formula"] for r in cmp.layers)
    assert any("gated MLP" in n for n in cmp.notes)
