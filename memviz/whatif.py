"""`memviz.WhatIf`: the transformer what-if panel (issue 8 item 6).

Every number comes from `solvers.analytic.estimate_memory` (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", Sec. 4-5: tensor/sequence parallel, selective and full
recompute, pipeline stages; mixed-precision Adam at 16 bytes per parameter).  The view only draws the
per-device stacked bar against the capacity of the chosen device preset.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import traitlets

from memviz.widget import MemvizWidget
from solvers import analytic

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def config_from(source: Any) -> analytic.TransformerConfig:
    """A `TransformerConfig` from a config, a dict/dataclass with layers, hidden, heads, seq, batch
    (vocab, dtype, dropout optional), or a GPT from examples/models.py (its modules give the sizes;
    seq and batch default to its position table and 1)."""
    if isinstance(source, analytic.TransformerConfig):
        return source
    if dataclasses.is_dataclass(source) and not isinstance(source, type):
        source = dataclasses.asdict(source)
    if not isinstance(source, dict):
        source = _gpt_fields(source)
    d = dict(source)
    dtype = d.pop("dtype", None)
    if dtype is not None:
        key = str(dtype).replace("torch.", "")
        if key not in _DTYPE_BYTES:
            raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPE_BYTES)}")
        d["dtype_bytes"] = _DTYPE_BYTES[key]
    if "dropout" in d and not isinstance(d["dropout"], bool):
        d["dropout"] = float(d["dropout"]) > 0
    names = {f.name for f in dataclasses.fields(analytic.TransformerConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown transformer config keys {unknown}; known: {sorted(names)} and dtype")
    missing = sorted({"layers", "hidden", "heads", "seq", "batch"} - set(d))
    if missing:
        raise ValueError(f"transformer config lacks {missing}: give layers, hidden, heads, seq, batch")
    return analytic.TransformerConfig(**d)


def _gpt_fields(model: Any) -> dict[str, Any]:
    """Sizes of a GPT-like nn.Module with wte/wpe embeddings and `blocks` holding `attn.heads`."""
    try:
        wte, wpe, blocks = model.wte, model.wpe, model.blocks
        heads = blocks[0].attn.heads
    except (AttributeError, IndexError, TypeError) as exc:
        raise TypeError(
            f"WhatIf: cannot read a transformer config from {type(model).__name__}; pass a dict with "
            "layers, hidden, heads, seq, batch (vocab, dtype, dropout optional)"
        ) from exc
    has_dropout = any(type(m).__name__ == "Dropout" and m.p > 0 for m in model.modules())
    return {
        "layers": len(blocks),
        "hidden": wte.embedding_dim,
        "heads": heads,
        "seq": wpe.num_embeddings,
        "batch": 1,
        "vocab": wte.num_embeddings,
        "dtype": str(wte.weight.dtype),
        "dropout": has_dropout,
    }


def device_presets() -> dict[str, int]:
    """Capacity (bytes) of each named device target in memviz.devices."""
    from memviz.devices import TARGETS

    return {name: t.capacity_bytes for name, t in TARGETS.items() if name != "cpu"}


def whatif_estimate(
    cfg: analytic.TransformerConfig, settings: dict[str, Any], capacity: int | None
) -> dict[str, Any]:
    """Memory per device for `settings` (tp, sp, recompute, pp, micro_batch) from solvers.analytic."""
    micro = int(settings.get("micro_batch", cfg.batch))
    run = dataclasses.replace(cfg, batch=micro)
    est = analytic.estimate_memory(
        run,
        tp=int(settings.get("tp", 1)),
        sp=bool(settings.get("sp", False)),
        recompute=settings.get("recompute", "none"),
        pp=int(settings.get("pp", 1)),
        device_capacity_bytes=capacity,
    )
    bars = [
        {"label": "parameters", "bytes": est["parameters"]},
        {"label": "gradients", "bytes": est["gradients"]},
        {"label": "optimizer state", "bytes": est["optimizer"]},
        {"label": "activations", "bytes": est["activations"]},
    ]
    if est["fits"] is None:
        verdict = "no capacity preset chosen"
    elif est["fits"]:
        verdict = f"fits: {est['headroom'] / 2**30:.2f} GiB free per device"
    else:
        verdict = f"does not fit: {-est['headroom'] / 2**30:.2f} GiB over capacity per device"
    return {"bars": bars, "total": est["total"], "capacity": capacity, "fits": est["fits"],
            "verdict": verdict, "estimate": est}


class WhatIf(MemvizWidget):
    """`WhatIf(config_or_gpt, device="h100")`: memory per device of a GPT-like training run under
    tensor parallel degree, sequence parallel, recompute mode, pipeline stages and micro-batch."""

    _model_name = traitlets.Unicode("WhatIfModel").tag(sync=True)
    _view_name = traitlets.Unicode("WhatIfView").tag(sync=True)

    config_json = traitlets.Unicode("").tag(sync=True)
    devices_json = traitlets.Unicode("").tag(sync=True)
    tp = traitlets.Int(1).tag(sync=True)
    sp = traitlets.Bool(False).tag(sync=True)
    recompute = traitlets.Unicode("none").tag(sync=True)
    pp = traitlets.Int(1).tag(sync=True)
    micro_batch = traitlets.Int(1).tag(sync=True)
    device = traitlets.Unicode("h100").tag(sync=True)
    result_json = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)

    def __init__(self, source: Any, *, device: str = "h100", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config_from(source)
        self._devices = device_presets()
        if device not in self._devices:
            raise ValueError(f"device {device!r}: choose one of {sorted(self._devices)}")
        self.config_json = json.dumps(dataclasses.asdict(self.config))
        self.devices_json = json.dumps(self._devices)
        with self.hold_trait_notifications():
            self.micro_batch = self.config.batch
            self.device = device
        self._update()

    def settings(self) -> dict[str, Any]:
        return {"tp": self.tp, "sp": self.sp, "recompute": self.recompute, "pp": self.pp,
                "micro_batch": self.micro_batch}

    @traitlets.observe("tp", "sp", "recompute", "pp", "micro_batch", "device")
    def _on_change(self, change: dict[str, Any]) -> None:
        self._update()

    def _update(self) -> None:
        try:
            result = whatif_estimate(self.config, self.settings(), self._devices.get(self.device))
        except (ValueError, TypeError) as exc:  # e.g. heads not divisible by tp: shown in the view
            self.error = str(exc)
            return
        self.error = ""
        self.result = result
        view = {k: v for k, v in result.items() if k != "estimate"}
        view["device"] = self.device
        self.result_json = json.dumps(view)
