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
