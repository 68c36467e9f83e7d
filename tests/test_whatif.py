"""memviz.WhatIf: every number is solvers.analytic's; the capacity comparison follows the preset."""

from __future__ import annotations

import json

import pytest

from memviz.hardware.devices import TARGETS
from memviz.views.whatif import WhatIf, config_from
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
    assert (WhatIf(model, seq=8, batch=3).config.seq, WhatIf(model, batch=3).micro_batch) == (8, 3)


def _hf():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import real_models  # noqa: F401  (torchvision's schema shim before transformers)
    import transformers

    return transformers


def test_from_hugging_face_configs():
    from memviz.views.whatif import config_from_hf

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


def test_hugging_face_config_or_model_directly():
    """`WhatIf(model.config, seq=, batch=)` and `WhatIf(model)` read the same sizes as `from_config`;
    the panel names what the formula does not model for these configs."""
    tf = _hf()
    gpt2 = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, name_or_path="<img src=x>tiny")
    w = WhatIf(gpt2, seq=32, batch=2, dtype="bf16")
    assert w.config == WhatIf.from_config(gpt2, seq=32, batch=2, dtype="bf16").config
    c = w.config
    assert (c.layers, c.hidden, c.heads, c.vocab, c.seq) == (2, 64, 4, 128, 32)
    assert w.config_name == "<img src=x>tiny" and w.notes == []

    llama = tf.LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=8,
                           num_key_value_heads=2, vocab_size=256)
    model = tf.LlamaForCausalLM(llama)  # random init, no download
    w = WhatIf(model, seq=16, batch=1)
    assert w.config == WhatIf(llama, seq=16, batch=1).config
    assert (w.config.heads, w.config.kv_heads, w.config.ffn_size, w.config.dropout) == (8, 2, 172, False)
    assert w.config_name == "llama"
    # Llama's SwiGLU MLP and its untied output layer are counted: the parameters are the model's own
    # but for the O(h) norms and biases Megatron's count has and Llama lacks
    assert w.config.gated_mlp and not w.config.tied_output and w.notes == []
    n_model = sum(p.numel() for p in model.parameters())
    n_est = analytic.parameter_count_per_device(w.config)
    assert 0 <= n_est - n_model <= 8 * 64 * 2 + 172 * 2 + 16 * 64, (n_est, n_model)
    rows = {r["name"]: r["value"] for r in json.loads(w.result_json)["assumptions"]}
    assert "2 key/value heads" in rows["attention"]
    shown = [r["value"] for r in json.loads(w.result_json)["assumptions"] if r["name"] == "not modelled"]
    assert shown == w.notes

    mistral = tf.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    w = WhatIf(mistral, seq=16, batch=1, dtype="bf16", device="a100-80gb")
    assert (w.config.ffn_hidden, w.config.dtype_bytes) == (128, 2)
    want = analytic.estimate_memory(w.config, device_capacity_bytes=TARGETS["a100-80gb"].capacity_bytes)
    assert json.loads(w.result_json)["total"] == want["total"]

    with pytest.raises(ValueError, match=r"needs seq= \(tokens per sequence\) and batch="):
        WhatIf(llama)
    with pytest.raises(ValueError, match=r"needs batch="):
        WhatIf(model, seq=16)
    bare = tf.PretrainedConfig(hidden_size=64)
    with pytest.raises(ValueError, match=r"lacks .*layers \(looked for n_layer or num_hidden_layers\)"):
        WhatIf(bare, seq=16, batch=1)


def test_pinned_configurations_answered_by_the_kernel():
    w = WhatIf(CFG, device="a100-40gb")
    w.pin()
    w.tp = 4
    w.device = "v100-16gb"
    w.pin()
    w.tp, w.recompute = 8, "full"
    rows = w.comparison()
    assert [r["name"] for r in rows] == ["pinned 1", "pinned 2", "current"]
    # each configuration is named by its settings (the chart's x labels)
    assert [r["label"] for r in rows] == ["tp1 pp1 mb4 no-recompute", "tp4 pp1 mb4 no-recompute",
                                          "tp8 pp1 mb4 full-recompute"]
    assert [r["settings"]["tp"] for r in rows] == [1, 4, 8]
    assert [r["device"] for r in rows] == ["a100-40gb", "v100-16gb", "v100-16gb"]
    for row in rows:
        s = row["settings"]
        cfg = analytic.TransformerConfig(layers=24, hidden=2048, heads=16, seq=2048, batch=s["micro_batch"],
                                         vocab=50304)
        cap = TARGETS[s["device"]].capacity_bytes
        want = analytic.estimate_memory(cfg, tp=s["tp"], sp=s["sp"], recompute=s["recompute"], pp=s["pp"],
                                        device_capacity_bytes=cap)
        assert (row["total"], row["capacity"], row["headroom"], row["fits"]) == (
            want["total"], cap, want["headroom"], want["fits"])
    assert rows[0]["fits"] is False and rows[2]["fits"] is True
    # the view's state is the model's: what it draws is what compare_json holds, bars included
    drawn = json.loads(w.compare_json)
    assert len(drawn) == 2 and sum(b["bytes"] for b in drawn[1]["bars"]) == rows[1]["total"]
    w.unpin(0)
    assert [r["settings"]["tp"] for r in w.comparison()] == [4, 8]
    assert repr(w).startswith("WhatIf(")  # what displaying it calls (ipywidgets' own _compare unharmed)
    assert w.pinned == [{"tp": 4, "sp": False, "recompute": "none", "pp": 1, "micro_batch": 4,
                         "device": "v100-16gb"}]


def test_pinned_entries_from_the_view_are_checked():
    w = WhatIf(CFG)
    good = {"tp": 2, "sp": True, "recompute": "selective", "pp": 1, "micro_batch": 2, "device": "h100"}
    w.pinned = [good, {**good, "tp": 3}, {**good, "device": "<script>"}, {**good, "extra": "x"}]
    rows = json.loads(w.compare_json)
    assert rows[0]["error"] == "" and rows[0]["fits"] is True
    assert "divisible" in rows[1]["error"] and "bars" not in rows[1]
    assert "choose one of" in rows[2]["error"]
    assert "holds exactly" in rows[3]["error"]
    w.pinned = [good] * (w.max_pinned + 1)
    assert "at most" in json.loads(w.compare_json)[-1]["error"]
    w.pinned = [good] * w.max_pinned
    with pytest.raises(ValueError, match="at most"):
        w.pin()


def test_assumptions_come_from_analytic():
    w = WhatIf(CFG)
    rows = {r["name"]: r["value"] for r in json.loads(w.result_json)["assumptions"]}
    est = w.result["estimate"]
    # bf16: mixed-precision Adam, 2 + 2 + 12 bytes per parameter
    assert (est["parameters"], est["gradients"], est["optimizer"]) == tuple(
        n * est["parameter_count"] for n in (2, 2, 12))
    assert rows["parameters"] == "2 B per parameter" and rows["gradients"] == "2 B per parameter"
    assert rows["optimizer state"] == ("12 B per parameter = 4 (fp32 master weights) + 4 (fp32 Adam first "
                                       "moment) + 4 (fp32 Adam second moment)")
    assert rows["activation dtype"] == "2 B per value"
    assert rows["activations per layer"].startswith("34sbh + 5as^2b")
    assert "vocab 50304" in rows["vocabulary"] and "tied" in rows["vocabulary"]
    w.tp, w.sp, w.recompute, w.pp = 2, True, "selective", 2
    rows = {r["name"]: r["value"] for r in json.loads(w.result_json)["assumptions"]}
    assert rows["activations per layer"].startswith("34sbh/t ")
    assert "last stage" in rows["vocabulary"]


def test_fp32_weights_are_four_bytes_and_adam_keeps_no_master_copy():
    """Issue 18: an fp32 GPT2Config showed "2 B per parameter" (the mixed-precision default applied to
    fp32 weights)."""
    tf = _hf()
    config = tf.GPT2Config(n_layer=12, n_embd=64, n_head=4, n_positions=1024, vocab_size=256)
    for w in (WhatIf(config, seq=1024, batch=1, device="v100"), WhatIf({**CFG, "dtype": "float32"})):
        assert w.config.dtype_bytes == 4
        rows = {r["name"]: r["value"] for r in json.loads(w.result_json)["assumptions"]}
        assert rows["activation dtype"] == "4 B per value"
        assert rows["parameters"] == "4 B per parameter" and rows["gradients"] == "4 B per parameter"
        assert rows["optimizer state"] == ("8 B per parameter = 4 (fp32 Adam first moment) + 4 (fp32 Adam "
                                           "second moment)")
        est = w.result["estimate"]
        bars = {b["label"]: b["bytes"] for b in json.loads(w.result_json)["bars"]}
        assert bars == {"parameters": 4 * est["parameter_count"], "gradients": 4 * est["parameter_count"],
                        "optimizer state": 8 * est["parameter_count"], "activations": est["activations"]}
    # what the caller gives still wins
    fp32 = analytic.TransformerConfig(layers=2, hidden=64, heads=4, seq=32, batch=1, dtype_bytes=4)
    given = analytic.estimate_memory(fp32, param_bytes=2, grad_bytes=4, optimizer_bytes=12)
    count = given["parameter_count"]
    assert (given["parameters"], given["gradients"], given["optimizer"]) == (2 * count, 4 * count, 12 * count)
    assert {r["name"]: r["value"] for r in given["assumptions"]}["optimizer state"] == (
        "12 B per parameter = given by the caller")


@pytest.mark.parametrize(
    "tp,sp,recompute,dropout,mask,want",
    [(1, False, "none", True, 1, "34sbh + 5as^2b"), (4, False, "none", True, 1, "sbh(10 + 24/t) + 5as^2b/t"),
     (4, True, "none", True, 1, "34sbh/t + 5as^2b/t"), (4, False, "selective", True, 1, "sbh(10 + 24/t)"),
     (4, True, "selective", True, 1, "34sbh/t"), (1, False, "full", True, 1, "2sbh"),
     (4, True, "full", True, 1, "2sbh/t"), (1, False, "none", True, 2, "36sbh + 6as^2b"),
     (1, False, "none", False, 1, "32sbh + 2as^2b")],
)
def test_activation_formula_is_the_papers_table(tp, sp, recompute, dropout, mask, want):
    """Korthikanti et al.'s table (DESIGN.md), written out from the tensor list the estimate sums."""
    cfg = analytic.TransformerConfig(layers=2, hidden=64, heads=8, seq=32, batch=2, dropout=dropout,
                                     dropout_mask_bytes=mask)
    assert analytic.activation_formula(cfg, tp, sp, recompute) == want


def test_formula_next_to_a_captured_tensor_parallel_rank():
    """TinyGPT (no dropout, SDPA) on one of 2 tensor-parallel ranks: each block saves exactly the formula's
    tensors less the attention scores a fused kernel never stores, plus LayerNorm's per-token mean/rstd
    and the kernel's log-sum-exp."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from distributed_worker import loss_of, tiny_gpt, tiny_llama

    from memviz.views.whatif import compare_captured

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
    # the gated formula counts SwiGLU's four MLP-wide tensors, as the captured layer saves them
    assert cmp.config.gated_mlp and not any("MLP's width" in n for n in cmp.notes), cmp.notes


def test_gpt2_vocabulary_any_tensor_parallel_degree():
    """GPT-2's 50257 tokens are padded as Megatron pads them (a multiple of 128 x tp), not refused."""
    w = WhatIf({**CFG, "vocab": 50257}, device="a100-80gb")
    for tp, padded in ((1, 50304), (2, 50432), (4, 50688), (8, 51200)):
        w.tp = tp
        assert w.error == ""
        rows = {r["name"]: r["value"] for r in json.loads(w.result_json)["assumptions"]}
        assert f"vocab 50257 padded to {padded}" in rows["vocabulary"]
    w.sp = True
    w.pin()
    assert w.comparison()[0]["label"] == "tp8 sp pp1 mb4 no-recompute" and w.comparison()[0]["error"] == ""


def test_formula_against_a_recorded_pipeline_stage():
    """TinyGPT's first of 2 pipeline stages under torch's Schedule1F1B over 4 micro-batches: each of its 2
    blocks per micro-batch next to the formula at the micro-batch size, and the saved activations at the
    stage's peak (2 micro-batches in flight) next to Megatron's PP term (L layers' worth)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    from distributed_worker import loss_of, tiny_gpt

    from memviz.views.whatif import compare_captured

    model, args = tiny_gpt(batch=4, layers=4)
    cfg = {"layers": 4, "hidden": 32, "heads": 4, "vocab": 64, "dropout": False}
    cmp = compare_captured(model, args, pp=2, microbatches=4, loss_fn=loss_of, config=cfg,
                           optimizer=torch.optim.AdamW)
    assert cmp.config.batch == 1 and cmp.pp == 2
    assert [r["layer"] for r in cmp.layers] == ["blocks.0", "blocks.1"]
    per_layer = analytic.activation_bytes_per_layer(cmp.config)
    hidden_state = 1 * 16 * 32 * 4  # the stage's output: sent, saved by the next stage's receive buffer
    assert cmp.layers[1]["captured"] == cmp.layers[0]["captured"] - hidden_state
    stage = cmp.stage
    assert stage["in_flight"] == 2 and stage["formula"] == per_layer * 4  # pp micro-batches x L/pp layers
    # per micro-batch: the blocks' saved tensors and the embedding's output (block 0's input, saved by it)
    assert stage["captured"] == 2 * (sum(r["captured"] for r in cmp.layers) + hidden_state)
    assert stage["difference"] == stage["captured"] - stage["formula"] and stage["peak"] > stage["captured"]
    assert "first stage of 2 (1f1b" in repr(cmp)
    # the stage's step holds its parameters, their gradients and AdamW's two states besides the activations
    held = [model.wte, *model.blocks[:2]]
    param_bytes = sum(p.numel() * p.element_size() for m in held for p in m.parameters())
    assert stage["peak"] >= 4 * param_bytes + stage["captured"]
    # PP x TP (tp=2 inside the stage's blocks): the first block's micro-batch saves what a tp=2 rank's block
    # saves per sequence, the stage's last block all but its (sent) output; the formula is tp=2's at the
    # micro-batch size
    both = compare_captured(model, args, pp=2, tp=2, microbatches=4, loss_fn=loss_of, config=cfg)
    tp_only = compare_captured(model, args, tp=2, loss_fn=loss_of, config={**cfg, "batch": 4})
    assert 4 * both.layers[0]["captured"] == tp_only.layers[0]["captured"]
    assert both.layers[1]["captured"] == both.layers[0]["captured"] - hidden_state
    assert [4 * r["formula"] for r in both.layers] == [r["formula"] for r in tp_only.layers[:2]]
    assert both.stage["in_flight"] == 2 and both.stage["formula"] == both.layers[0]["formula"] * 4
    with pytest.raises(ValueError, match="pipeline x tensor parallelism x FSDP2"):
        compare_captured(model, args, pp=2, tp=2, dp=2, loss_fn=loss_of, config=cfg)
    # PP x FSDP2 (dp=2): the same activations against the same PP term, the states halved in the peak
    sharded = compare_captured(model, args, pp=2, dp=2, microbatches=4, loss_fn=loss_of, config=cfg,
                               optimizer=torch.optim.AdamW)
    assert sharded.stage["dp"] == 2 and "FSDP2 over dp=2" in repr(sharded)
    assert [r["captured"] for r in sharded.layers] == [r["captured"] for r in cmp.layers]
    assert (sharded.stage["captured"], sharded.stage["formula"]) == (stage["captured"], stage["formula"])
    assert sharded.stage["peak"] < stage["peak"]


def test_a_hugging_face_config_alone_gives_both_sides():
    """compare_config builds the tiny Llama from its config on the meta device and records tensor-parallel
    rank 0 on fake tensors: per layer it saves what the real recorded rank saves (no explicit causal mask:
    on fake tensors Hugging Face takes eager's is_causal branch too), against the same formula."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from distributed_worker import loss_of, tiny_llama

    from memviz.views.whatif import compare_captured, compare_config

    llama, args = tiny_llama(intermediate_size=96)
    real = compare_captured(llama, args, tp=2, loss_fn=loss_of)
    est = compare_config(llama.config, seq=16, batch=2, tp=2, loss_fn=loss_of)
    assert est.formula == real.formula and est.config == real.config
    assert [r["captured"] for r in est.layers] == [r["captured"] for r in real.layers]
    assert not any("attention mask" in n for n in est.notes)
    assert any("fused attention" in n for n in est.notes)


def test_an_explicit_attention_mask_is_noted():
    """A padding mask with a padded position makes Hugging Face build the explicit (batch, 1, S, S) mask on
    real tensors too: the comparison notes the saved masks the formula leaves out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    from distributed_worker import loss_of, tiny_llama

    from memviz.views.whatif import compare_captured

    llama, (ids,) = tiny_llama(intermediate_size=96)

    class Padded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = llama

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(ids)
            mask[:, 0] = 0  # the first position of every row is padding
            return self.llama(ids, attention_mask=mask).logits

    cmp = compare_captured(Padded(), (ids,), loss_fn=loss_of, config=llama.config)
    assert any("attention mask(s) of shape" in n and "explicit mask" in n for n in cmp.notes)
