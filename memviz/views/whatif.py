"""`memviz.WhatIf`: the transformer what-if panel (issue 8 item 6), and the formula against a real model
(issue 20 item 5): `WhatIf.from_config(hf_config, seq=, batch=)` reads a Hugging Face config, and
`compare_captured(model, args, tp=, sp=)` puts the formula's per-layer activation bytes next to the
saved tensors of each layer of one recorded tensor-parallel rank (`memviz.profile(..., parallel=)`), or
of the first pipeline stage (``pp=``), whose in-flight micro-batches meet Megatron's PP term;
`compare_config(hf_config, seq=, batch=, tp=, sp=)` gives both sides from a Hugging Face config alone (the
model built on the meta device, its rank recorded on fake tensors).

Issue 18 item 7: `WhatIf(model.config, seq=, batch=)` / `WhatIf(hf_model, ...)`, pinned configurations
compared side by side (the `pinned` trait; the kernel answers every one in `compare_json`), and the
assumptions of the estimate (`solvers.analytic.assumptions`) shown in the panel.

Every number of the panel comes from `solvers.analytic.estimate_memory` (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", Sec. 4-5: tensor/sequence parallel, selective and full
recompute, pipeline stages; Adam's bytes per parameter from the config's dtype,
`solvers.analytic.per_parameter_bytes`: 2 + 2 + 12 in 16-bit mixed precision, 4 + 4 + 8 in fp32).  The view
only draws the per-device stacked bar against the capacity of the chosen device preset.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import traitlets

from memviz.views.widget import MemvizWidget
from solvers import DataKind, analytic

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def _dtype_bytes(dtype: Any) -> int:
    key = str(dtype).replace("torch.", "")
    if key not in _DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[key]


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
        d["dtype_bytes"] = _dtype_bytes(dtype)
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


#: TransformerConfig field -> the Hugging Face config attributes holding it (GPT-2 names, then Llama/BERT)
_HF_NAMES = {"layers": ("n_layer", "num_hidden_layers"), "hidden": ("n_embd", "hidden_size"),
             "heads": ("n_head", "num_attention_heads"), "vocab": ("vocab_size",),
             "kv_heads": ("num_key_value_heads",)}
_HF_OPTIONAL = ("vocab", "kv_heads")
_HF_DROPOUT = ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_dropout",
               "hidden_dropout_prob", "attention_probs_dropout_prob")
#: activations whose MLP is gated in the Hugging Face models that use them (Llama, Mistral, Qwen: SwiGLU)
_GATED_ACTS = ("silu", "swish", "swiglu")


def is_hf_config(obj: Any) -> bool:
    """A transformers `PretrainedConfig` (duck-typed: no transformers import)."""
    return hasattr(obj, "to_dict") and hasattr(obj, "model_type") and not isinstance(obj, (dict, type))


def config_from_hf(hf_config: Any, *, seq: int, batch: int, dtype: Any = None) -> analytic.TransformerConfig:
    """A `TransformerConfig` from a Hugging Face model config (GPT-2, Llama, Mistral, BERT naming) for a
    micro-batch of `batch` sequences of `seq` tokens.  The MLP width is ``intermediate_size`` / ``n_inner``
    (4 x hidden when unset); dropout is on when any of the config's dropout probabilities is positive;
    the activation dtype is `dtype`, else the config's ``dtype`` / ``torch_dtype``, else float32;
    ``num_key_value_heads`` gives grouped-query attention, a gated ``hidden_act`` (SiLU: SwiGLU) a gated
    MLP, ``tie_word_embeddings=False`` an untied output layer."""
    def first(names: tuple[str, ...]) -> Any:
        return next((getattr(hf_config, n) for n in names if getattr(hf_config, n, None) is not None), None)

    fields = {k: first(names) for k, names in _HF_NAMES.items()}
    missing = [k for k, v in fields.items() if v is None and k not in _HF_OPTIONAL]
    if missing:
        wanted = "; ".join(f"{k} (looked for {' or '.join(_HF_NAMES[k])})" for k in missing)
        raise ValueError(f"{type(hf_config).__name__} lacks what the estimate needs: {wanted}")
    ffn = first(("n_inner", "intermediate_size")) or 4 * fields["hidden"]
    dtype = dtype or getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "float32"
    dropout = any(float(getattr(hf_config, n, 0) or 0) > 0 for n in _HF_DROPOUT)
    gated = _hf_act(hf_config).lower() in _GATED_ACTS
    tied = getattr(hf_config, "tie_word_embeddings", True) is not False
    return config_from({**fields, "seq": seq, "batch": batch, "dtype": dtype, "dropout": dropout,
                        "gated_mlp": gated, "tied_output": tied,
                        **({"ffn_mult": ffn // fields["hidden"]} if ffn % fields["hidden"] == 0
                           else {"ffn_size": ffn})})


def _hf_act(hf_config: Any) -> str:
    return str(getattr(hf_config, "hidden_act", getattr(hf_config, "activation_function", "")) or "")


#: Hugging Face config attributes that give a mixture-of-experts MLP (Mixtral, Qwen-MoE, DeepSeek)
_HF_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")


def hf_notes(hf_config: Any) -> list[str]:
    """What a Hugging Face config says that `solvers.analytic` does not model, and which way it errs."""
    notes = []
    experts = next((getattr(hf_config, n) for n in _HF_EXPERTS if getattr(hf_config, n, None)), None)
    if experts:
        notes.append(f"mixture of experts ({experts} experts): one MLP per layer is counted, not every "
                     "expert's weights and the routed tokens' activations (an under-estimate)")
    return notes


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
    """Capacity (bytes) of each named device target in memviz.hardware.devices."""
    from memviz.hardware.devices import TARGETS

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
            "headroom": est["headroom"], "verdict": verdict, "assumptions": est["assumptions"],
            "estimate": est}


#: the settings one configuration of the panel holds (a pinned one, or the controls')
SETTING_KEYS = ("tp", "sp", "recompute", "pp", "micro_batch", "device")
#: the most configurations a user can pin (the chart stays readable)
MAX_PINNED = 6


def clean_settings(raw: Any) -> dict[str, Any]:
    """A pinned configuration from the view (untrusted): exactly `SETTING_KEYS`, with their types."""
    if not isinstance(raw, dict) or set(raw) != set(SETTING_KEYS):
        raise ValueError(f"a pinned configuration holds exactly {list(SETTING_KEYS)}")
    return {"tp": int(raw["tp"]), "sp": bool(raw["sp"]), "recompute": str(raw["recompute"]),
            "pp": int(raw["pp"]), "micro_batch": int(raw["micro_batch"]), "device": str(raw["device"])}


def settings_label(settings: dict[str, Any]) -> str:
    """A configuration named by its settings, ``tp2 sp pp1 mb4 full-recompute`` (``no-recompute`` without;
    the device is shown on its own): the chart's x labels and the table's settings column."""
    recompute = "no-recompute" if settings["recompute"] == "none" else f"{settings['recompute']}-recompute"
    parts = [f"tp{settings['tp']}", *(["sp"] if settings["sp"] else []), f"pp{settings['pp']}",
             f"mb{settings['micro_batch']}", recompute]
    return " ".join(parts)


class WhatIf(MemvizWidget):
    """`WhatIf(source, device="h100")`: memory per device of a GPT-like training run under tensor parallel
    degree, sequence parallel, recompute mode, pipeline stages and micro-batch.

    `source`: a Hugging Face config (``model.config``) or model (its ``.config``), with `seq` and `batch`
    (tokens per sequence, micro-batch); a dict or dataclass of `solvers.analytic.TransformerConfig` fields
    (``dtype`` allowed); or a GPT from examples/models.py.  `seq`, `batch` and `dtype` override the
    source's.  `pin()` keeps the current settings for a side-by-side comparison (`comparison()`), as the
    view's pin button does; `pinned` is the list of pinned settings, synced with the view."""

    _model_name = traitlets.Unicode("WhatIfModel").tag(sync=True)
    _view_name = traitlets.Unicode("WhatIfView").tag(sync=True)

    config_json = traitlets.Unicode("").tag(sync=True)
    config_name = traitlets.Unicode("").tag(sync=True)
    devices_json = traitlets.Unicode("").tag(sync=True)
    tp = traitlets.Int(1).tag(sync=True)
    sp = traitlets.Bool(False).tag(sync=True)
    recompute = traitlets.Unicode("none").tag(sync=True)
    pp = traitlets.Int(1).tag(sync=True)
    micro_batch = traitlets.Int(1).tag(sync=True)
    device = traitlets.Unicode("h100").tag(sync=True)
    result_json = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    #: pinned configurations' settings (`SETTING_KEYS`); the view adds and removes entries
    pinned = traitlets.List(traitlets.Dict()).tag(sync=True)
    #: the kernel's answer: one row per pinned configuration (`comparison()`'s rows, with the bars)
    compare_json = traitlets.Unicode("[]").tag(sync=True)
    max_pinned = traitlets.Int(MAX_PINNED, read_only=True).tag(sync=True)

    def __init__(self, source: Any, *, seq: int | None = None, batch: int | None = None, dtype: Any = None,
                 device: str = "h100", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config, name, self.notes = _resolve(source, seq, batch, dtype)
        self._devices = device_presets()
        if device not in self._devices:
            raise ValueError(f"device {device!r}: choose one of {sorted(self._devices)}")
        self.config_json = json.dumps(dataclasses.asdict(self.config))
        self.config_name = name
        self.devices_json = json.dumps(self._devices)
        with self.hold_trait_notifications():
            self.micro_batch = self.config.batch
            self.device = device
        self._update()

    @classmethod
    def from_config(cls, hf_config: Any, *, seq: int, batch: int, dtype: Any = None, device: str = "h100",
                    **kwargs: Any) -> WhatIf:
        """The panel for a Hugging Face config (`config_from_hf`), e.g. ``LlamaConfig.from_pretrained(...)``
        or ``model.config``, at `seq` tokens and micro-batch `batch` (as ``WhatIf(hf_config, ...)``)."""
        return cls(hf_config, seq=seq, batch=batch, dtype=dtype, device=device, **kwargs)

    def settings(self) -> dict[str, Any]:
        return {"tp": self.tp, "sp": self.sp, "recompute": self.recompute, "pp": self.pp,
                "micro_batch": self.micro_batch}

    def pin(self) -> None:
        """Keep the current settings (and device) next to the ones still to come."""
        if len(self.pinned) >= MAX_PINNED:
            raise ValueError(f"at most {MAX_PINNED} pinned configurations: unpin one first")
        self.pinned = [*self.pinned, {**self.settings(), "device": self.device}]

    def unpin(self, index: int) -> None:
        """Drop pinned configuration `index` (0-based, in pinning order)."""
        self.pinned = [p for i, p in enumerate(self.pinned) if i != index]

    def comparison(self) -> list[dict[str, Any]]:
        """One row per pinned configuration, then the current one: name, settings, device, total,
        capacity, headroom (bytes per device), fits, verdict, error."""
        current = self._row("current", {**self.settings(), "device": self.device})
        rows = [*json.loads(self.compare_json), current]
        return [{k: v for k, v in row.items() if k != "bars"} for row in rows]

    @traitlets.observe("tp", "sp", "recompute", "pp", "micro_batch", "device")
    def _on_change(self, change: dict[str, Any]) -> None:
        self._update()

    @traitlets.observe("pinned")
    def _on_pinned(self, change: dict[str, Any]) -> None:
        self._answer_pinned()

    def _row(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"name": name, "settings": settings, "label": settings_label(settings),
                               "device": settings["device"]}
        try:
            if settings["device"] not in self._devices:
                raise ValueError(f"device {settings['device']!r}: choose one of {sorted(self._devices)}")
            result = whatif_estimate(self.config, settings, self._devices[settings["device"]])
        except (ValueError, TypeError) as exc:
            return {**row, "error": str(exc)}
        return {**row, **{k: result[k] for k in ("bars", "total", "capacity", "headroom", "fits", "verdict")},
                "error": ""}

    def _answer_pinned(self) -> None:
        rows = []
        for i, raw in enumerate(self.pinned):
            try:
                if i >= MAX_PINNED:
                    raise ValueError(f"at most {MAX_PINNED} pinned configurations")
                rows.append(self._row(f"pinned {i + 1}", clean_settings(raw)))
            except (ValueError, TypeError, KeyError) as exc:  # a malformed entry from the view
                rows.append({"name": f"pinned {i + 1}", "label": "", "device": "", "error": str(exc)})
        self.compare_json = json.dumps(rows)

    def _update(self) -> None:
        try:
            result = whatif_estimate(self.config, self.settings(), self._devices.get(self.device))
        except (ValueError, TypeError) as exc:  # e.g. heads not divisible by tp: shown in the view
            self.error = str(exc)
            return
        self.error = ""
        self.result = result
        view = {k: v for k, v in result.items() if k != "estimate"}
        settings = {**self.settings(), "device": self.device}
        view.update(name="current", settings=settings, label=settings_label(settings), device=self.device)
        view["assumptions"] = [*result["assumptions"],
                               *({"name": "not modelled", "value": n} for n in self.notes)]
        self.result_json = json.dumps(view)


def _resolve(source: Any, seq: int | None, batch: int | None,
             dtype: Any) -> tuple[analytic.TransformerConfig, str, list[str]]:
    """The config, a display name and the not-modelled notes of whatever `WhatIf` was given."""
    if not is_hf_config(source) and is_hf_config(getattr(source, "config", None)):
        source = source.config  # a Hugging Face PreTrainedModel
    if is_hf_config(source):
        lacking = [f"{n}= ({what})" for n, v, what in (("seq", seq, "tokens per sequence"),
                                                        ("batch", batch, "micro-batch")) if v is None]
        if lacking:
            raise ValueError(f"WhatIf({type(source).__name__}) needs {' and '.join(lacking)}: a Hugging Face "
                             "config does not hold them")
        name = str(getattr(source, "name_or_path", "") or getattr(source, "model_type", "") or "")
        return (config_from_hf(source, seq=int(seq), batch=int(batch), dtype=dtype),  # type: ignore[arg-type]
                name or type(source).__name__, hf_notes(source))
    cfg = config_from(source)
    overrides = {k: v for k, v in (("seq", seq), ("batch", batch)) if v is not None}
    if dtype is not None:
        overrides["dtype_bytes"] = _dtype_bytes(dtype)
    name = type(source).__name__ if hasattr(source, "modules") else ""  # a model's class; a dict has no name
    return dataclasses.replace(cfg, **overrides), name, []


# --- the formula against a recorded rank (issue 20 item 5) -----------------------------------------------
@dataclass(frozen=True)
class FormulaComparison:
    """Per-layer activation bytes one tensor-parallel rank stores: Korthikanti's formula
    (`solvers.analytic.layer_activation_breakdown`, no recompute) next to the captured rank.

    `layers`: one row per transformer block (``layer``, ``captured``, ``formula``, ``difference`` =
    captured - formula, ``ratio`` = captured / formula); `formula`: the formula's per-tensor terms for one
    layer; `captured_tensors`: the first block's saved tensors (op, module, shape, dtype, bytes); `notes`:
    measured reasons for the difference.  ``captured`` counts the tensors a block's operators create and
    the backward reads (kind ``saved``), so a block input is counted in the block that produced it."""

    config: analytic.TransformerConfig
    tp: int
    sp: bool
    formula: dict[str, int]
    layers: list[dict[str, Any]]
    captured_tensors: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    pp: int = 1
    #: pipeline only: the first stage against Megatron's PP term (`_stage_row`); None without pipeline
    stage: dict[str, Any] | None = None

    @property
    def mean_captured(self) -> float:
        return sum(r["captured"] for r in self.layers) / len(self.layers)

    def to_dataframe(self) -> Any:
        """The per-layer rows as a pandas DataFrame."""
        import pandas

        return pandas.DataFrame(self.layers)

    def __repr__(self) -> str:
        c = self.config
        head = (f"FormulaComparison(layers={c.layers}, hidden={c.hidden}, heads={c.heads}, seq={c.seq}, "
                f"batch={c.batch}, dtype_bytes={c.dtype_bytes}, dropout={c.dropout}, tp={self.tp}, "
                f"sp={self.sp}, pp={self.pp})")
        rows = [f"{'layer':<32} {'captured B':>12} {'formula B':>12} {'diff B':>10} {'ratio':>6}"]
        rows += [f"{r['layer']:<32} {r['captured']:>12} {r['formula']:>12} {r['difference']:>10} "
                 f"{r['ratio']:>6.3f}" for r in self.layers]
        if self.stage is not None:
            st = self.stage
            dp = f", FSDP2 over dp={st['dp']}" if st.get("dp", 1) > 1 else ""
            rows.append(f"first stage of {self.pp} ({st['schedule']}, {st['microbatches']} "
                        f"micro-batches{dp}): "
                        f"saved activations at its peak captured {st['captured']} B, Megatron's PP term "
                        f"{st['formula']} B, difference {st['difference']} B ({st['ratio']:.3f}); "
                        f"per-rank peak {st['peak']} B")
        return "\n".join([head, *rows, *(f"note: {n}" for n in self.notes)])


def compare_captured(model: Any, args: tuple[Any, ...], *, tp: int = 1, sp: bool = False, pp: int = 1,
                     microbatches: int | None = None, schedule: str = "1f1b", config: Any = None,
                     loss_fn: Any = None, device: str | None = None,
                     optimizer: Any = None, dp: int = 1) -> FormulaComparison:
    """Record one training step of `model` on `args` as one rank of ``tp``-way tensor parallelism
    (sequence parallel when `sp`; ``memviz.profile(..., parallel=Parallel(tp, fsdp=False, tp=tp))``, or an
    unsharded FSDP2 rank for ``tp == 1``) and compare each block's saved activation bytes with the
    formula for the same setting.  `config`: anything `config_from` takes, or a Hugging Face config;
    default ``model.config`` (Hugging Face) with seq and batch from the first input's shape and the
    parameters' dtype.

    `pp` > 1: the first of `pp` pipeline stages (`memviz.parallel.pipeline`; with ``tp > 1`` its blocks
    tensor-parallel inside, PP x TP, without `dp`), run by torch's
    `schedule` over `microbatches` (default `pp`) micro-batches of ``batch / microbatches`` sequences: the
    rows are its blocks, each micro-batch's saved bytes (the formula at the micro-batch size), and `stage`
    puts the saved activations the stage holds at its peak next to Megatron's PP term (the first stage
    holds `pp` micro-batches of its ``L / pp`` layers: ``L`` layers' worth, Korthikanti Sec. 4.2.3).
    `device`: ``"fake:<target>"`` records the rank on fake tensors (`compare_config`); `optimizer`:
    `memviz.profile`'s (the step's optimizer, in the stage's per-rank peak; none by default).
    `dp` > 1: the rank is FSDP2-sharded over `dp` ranks besides (``Parallel(dp * tp * pp, fsdp=True, ...)``;
    with `pp`, torchtitan's PP x FSDP2 stage): its parameters, gradients and optimizer state are shards in
    the per-rank peak, and the activations the formula counts are the same as at ``dp == 1`` (ZeRO
    shards states, not activations)."""
    import memviz
    from memviz.parallel.distributed import Parallel, ParallelError, blocks_of

    if pp > 1 and tp > 1 and dp > 1:
        raise ParallelError("pipeline x tensor parallelism x FSDP2 is not recorded: compare pp x tp with "
                            "dp=1")
    microbatches = microbatches or pp
    config = _comparison_config(model, args, config, microbatches)
    formula = analytic.layer_activation_breakdown(config, tp=tp, sp=sp)
    world, fsdp = dp * tp * pp, dp > 1
    if pp > 1:
        parallel = Parallel(world, fsdp=fsdp, pp=pp, tp=tp, sp=sp, microbatches=microbatches,
                            schedule=schedule)
    else:
        parallel = Parallel(world, fsdp=fsdp, tp=tp, sp=sp) if tp > 1 else Parallel(dp)
    prof = memviz.profile(model, args, loss_fn=loss_fn, parallel=parallel, device=device,
                          optimizer=optimizer)
    graph = prof.graph
    rows, tensors = [], []
    for i, (path, _) in enumerate(blocks_of(model)[:config.layers // pp]):
        # module names start with the root's class name, which fully_shard changes (FSDPGPT): skip it
        saved = [d for d in graph.datas if d.kind is DataKind.SAVED and d.producer is not None
                 and (graph.computes[d.producer].module.partition(".")[2] + ".").startswith(path + ".")]
        # a stage runs every micro-batch through the same blocks: one micro-batch's share
        captured, expected = sum(d.bytes for d in saved) // microbatches, sum(formula.values())
        rows.append({"layer": path, "captured": captured, "formula": expected,
                     "difference": captured - expected, "ratio": captured / expected})
        if i == 0:
            tensors = [{"op": graph.computes[d.producer].name, "module": graph.computes[d.producer].module,
                        "shape": d.shape, "dtype": d.dtype, "bytes": d.bytes} for d in saved[:len(saved) //
                                                                                           microbatches]]
    notes = _notes(config, tp, sp, formula, tensors)
    stage = None
    if pp > 1:
        stage = {**_stage_row(config, prof, pp, microbatches, schedule, sum(formula.values())), "dp": dp}
        notes += _stage_notes(pp, microbatches, schedule)
    if fsdp:
        notes.append(f"FSDP2 over dp={dp}: the per-rank peak holds 1/{dp} of the parameters, gradients and "
                     "optimizer state, plus FSDP2's all-gather / reduce-scatter buffers (communication); the "
                     "formula's activations do not depend on dp")
    return FormulaComparison(config, tp, sp, formula, rows, tensors, notes, pp, stage)


def compare_config(hf_config: Any, *, seq: int, batch: int, tp: int = 1, sp: bool = False, dtype: Any = None,
                   device: str = "h100", loss_fn: Any = None) -> FormulaComparison:
    """`compare_captured` from a Hugging Face config alone: transformers' ``AutoModelForCausalLM.from_config``
    builds the random-init model on the meta device (no weight is allocated, so any size works), and its
    rank is recorded in estimated mode (``device="fake:<device>"``: one step on fake tensors, exact local
    shapes) on `batch` sequences of `seq` tokens.  `dtype`: the weights' (default the config's, else
    float32).  Pipeline stages are recorded on real tensors only, so `pp` is not offered here."""
    import torch
    import transformers

    dtype = dtype or getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "float32"
    dtype = getattr(torch, str(dtype).replace("torch.", "")) if not isinstance(dtype, torch.dtype) else dtype
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config).to(dtype)
    ids = torch.zeros(batch, seq, dtype=torch.long)
    return compare_captured(model, (ids,), tp=tp, sp=sp, config=hf_config, loss_fn=loss_fn,
                            device=f"fake:{device}")


def _stage_row(cfg: analytic.TransformerConfig, prof: Any, pp: int, microbatches: int, schedule: str,
               per_layer: int) -> dict[str, Any]:
    """The first stage's saved activations at its peak (`memviz.parallel.pipeline.peak_live_bytes`) against
    Megatron's PP term: the per-layer formula times `solvers.analytic.in_flight_layers` (the first stage
    holds pp micro-batches of its L / pp layers), and the recorded per-rank peak."""
    from memviz.parallel.pipeline import in_flight_microbatches, peak_live_bytes

    captured = peak_live_bytes(prof.graph, prof.baseline_schedule)
    expected = int(per_layer * analytic.in_flight_layers(cfg.layers, pp))
    return {"schedule": schedule, "microbatches": microbatches,
            "in_flight": in_flight_microbatches(schedule, pp, 0, microbatches), "captured": captured,
            "formula": expected, "difference": captured - expected, "ratio": captured / expected,
            "peak": prof.baseline.peak_bytes}


def _stage_notes(pp: int, microbatches: int, schedule: str) -> list[str]:
    """Where the recorded schedule departs from the PP term's 1F1B with at least pp micro-batches."""
    from memviz.parallel.pipeline import in_flight_microbatches

    notes = ["the stage's last block saves no output of its own: the stage sends it, and the next stage "
             "holds it in its receive buffer (communication)"]
    held = in_flight_microbatches(schedule, pp, 0, microbatches)
    if held == pp:
        return notes
    why = "GPipe runs every forward before any backward" if schedule == "gpipe" else \
        f"only {microbatches} micro-batches exist"
    return [*notes, f"the first stage holds {held} micro-batches, not the formula's pp={pp}: {why}"]


def _comparison_config(model: Any, args: tuple[Any, ...], config: Any,
                       microbatches: int = 1) -> analytic.TransformerConfig:
    batch, seq = args[0].shape[:2]
    batch //= microbatches  # the formula counts one micro-batch
    dtype = str(next(model.parameters()).dtype)
    if config is None:
        config = getattr(model, "config", None)
        if config is None:
            raise TypeError(f"{type(model).__name__} has no Hugging Face .config: pass config=")
    if hasattr(config, "to_dict") and not isinstance(config, dict):  # a Hugging Face config
        cfg = config_from_hf(config, seq=seq, batch=batch, dtype=dtype)
    else:
        cfg = config_from({"seq": seq, "batch": batch, "dtype": dtype,
                           **(config if isinstance(config, dict) else dataclasses.asdict(config))})
    # the recorded model holds its own vocabulary, unpadded (Megatron's padding is the formula's alone)
    return dataclasses.replace(cfg, vocab_divisible_by=1)


def _notes(cfg: analytic.TransformerConfig, tp: int, sp: bool, formula: dict[str, int],
           tensors: list[dict[str, Any]]) -> list[str]:
    """Where the captured layer departs from the formula's assumptions, from the tensors themselves."""
    notes = []
    core_names = {t.name for t in analytic.layer_activation_tensors(cfg) if t.attention_core}
    core = sum(v for k, v in formula.items() if k in core_names)
    square = [t for t in tensors if len(t["shape"]) >= 3 and tuple(t["shape"][-2:]) == (cfg.seq, cfg.seq)]
    masks = [t for t in square if t["shape"][-3] == 1]  # broadcast over the heads: a mask, not scores
    scores = [t for t in square if t not in masks]
    if masks:
        notes.append(f"{len(masks)} attention mask(s) of shape {masks[0]['shape']} saved "
                     f"({sum(t['bytes'] for t in masks)} B), which the formula leaves out: the attention "
                     "is given an explicit mask (a padding mask, or a causal mask instead of SDPA's "
                     "is_causal)")
    if core and not scores:
        notes.append(f"no seq x seq attention tensor is saved (a fused attention kernel, e.g. SDPA's flash "
                     f"kernel, saves its output and log-sum-exp instead): the formula's {core} B of scores, "
                     "softmax and dropout are absent")
    ffn_local = cfg.ffn_hidden // tp
    wide = [t for t in tensors if t["shape"] and t["shape"][-1] == ffn_local]
    # the MLP-wide tensors are the MLP's tensor-parallel ones (split with its inner width)
    counted = sum(1 for t in analytic.layer_activation_tensors(cfg) if t.block == "mlp" and t.tensor_parallel)
    if len(wide) != counted and ffn_local not in (cfg.hidden, cfg.hidden // tp):  # else widths are ambiguous
        what = ("gate output, activation output, up output, product" if cfg.gated_mlp
                else "GELU input, second linear's input")
        notes.append(f"{len(wide)} saved tensors of the MLP's width {ffn_local}, where the formula counts "
                     f"{counted} ({what}): an activation made of elementwise ops (GPT-2's gelu_new) "
                     "saves more")
    stats = [t for t in tensors if t["shape"] and t["shape"][-1] == 1]
    if stats:
        notes.append(f"{len(stats)} per-token normalisation statistics ({sum(t['bytes'] for t in stats)} B: "
                     "LayerNorm mean/rstd, RMSNorm rstd), which the formula leaves out")
    return notes
