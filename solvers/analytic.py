"""Closed-form activation and device memory of a GPT-style transformer: the "what-if" estimator.

Implements Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*
(MLSys 2023), Sec. 4 (as restated in AWS Neuron's "Activation Memory Reduction" page, the table in
DESIGN.md): with ``s`` sequence length, ``b`` micro-batch, ``h`` hidden size, ``a`` heads, ``t``
tensor-parallel degree, 16-bit activations and 1-byte dropout masks, one transformer layer stores

=====================================  ==============================
no parallelism                          ``sbh(34 + 5as/h)``
tensor parallel                         ``sbh(10 + 24/t + 5as/(ht))``
tensor + sequence parallel              ``sbh/t (34 + 5as/h)``
tensor parallel + selective recompute   ``sbh(10 + 24/t)``
tensor + sequence + selective           ``34sbh/t``
full recompute                          ``2sbh`` (``2sbh/t`` with sequence parallel)
=====================================  ==============================

The constants are not hard-coded: they are the sum of a per-tensor breakdown (Sec. 4.1,
`layer_activation_tensors`) parameterised by the activation dtype size ``d`` and the dropout-mask
size ``m``.  Summed, one layer holds ``sbh(16d + 2m) + as^2b(2d + m)`` bytes:

* attention ``sbh(5d + m) + as^2b(2d + m)``: QKV input ``d``, Q and K ``2d``, softmax output
  ``d as^2b``, its dropout mask ``m as^2b`` and output ``d as^2b``, V ``d``, output-projection input
  ``d``, its dropout mask ``m``;
* MLP ``sbh(9d + m)`` with a ``4h`` inner size: first linear input ``d``, GELU input ``4d``,
  second linear input ``4d``, dropout mask ``m``;
* two LayerNorm inputs ``2d``.

With ``d = 2, m = 1`` this is the paper's ``34sbh + 5as^2b``.  With ``d = 2, m = 2`` -- PyTorch on
CPU, whose dropout multiplies by a noise tensor of the input's dtype and saves that bf16 tensor as
the mask -- it is ``36sbh + 6as^2b``: the three masks add ``sbh + sbh + as^2b``.  Without dropout the
masks vanish and the attention-over-V matmul reads the softmax output itself, so the layer holds
``sbh(16d) + as^2b d`` (``32sbh + 2as^2b`` in 16-bit).

Tensor parallelism splits the tensors between the column- and row-parallel linears by ``t``
(``24sbh`` + the ``as^2b`` terms in 16-bit); the LayerNorm inputs, the inputs of the QKV and first MLP
linears and the two sbh dropout masks stay replicated (``4d + 2m = 10``) unless sequence parallelism
splits them along ``s``.  Selective recompute (Sec. 5) recomputes QK^T, softmax, dropout and
attention over V, dropping every ``as^2b`` term; full recompute keeps only the layer input.

Everything here is pure arithmetic over ints (exact bytes; no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from math import ceil
from typing import Any, Literal

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")

#: Adam's state per parameter (Kingma & Ba 2015: first and second moments), kept in fp32.
ADAM_STATE_BYTES: dict[str, int] = {"fp32 Adam first moment": 4, "fp32 Adam second moment": 4}
#: the fp32 copy of the weights mixed-precision training keeps beside 16-bit ones (Micikevicius et al. 2018)
MASTER_WEIGHT_BYTES: dict[str, int] = {"fp32 master weights": 4}


def optimizer_state_bytes(param_bytes: int) -> dict[str, int]:
    """Adam's bytes per parameter by what they hold, for weights of `param_bytes` bytes: with 16-bit
    weights mixed-precision Adam (Korthikanti et al. Sec. 1, ZeRO's "16 bytes": 2 + 2 + 12) also keeps
    fp32 master weights; fp32 weights are their own master copy (4 + 4 + 8, plain fp32 Adam)."""
    return {**(MASTER_WEIGHT_BYTES if param_bytes < 4 else {}), **ADAM_STATE_BYTES}


@dataclass(frozen=True)
class TransformerConfig:
    """One GPT-style model and its micro-batch.

    ``batch`` is the micro-batch size ``b`` (activations scale with it); ``ffn_mult`` the MLP's inner
    size over ``hidden``, or ``ffn_size`` that size itself where it is no multiple (Llama-3-8B: 14336
    for 4096); ``dtype_bytes`` the model's dtype, its activations' and (by default, `per_parameter_bytes`) its
    weights' and gradients' (2 for bf16/fp16);
    ``dropout_mask_bytes`` what one dropout-mask element costs (1 in Megatron, 2 for PyTorch's bf16
    dropout on CPU); ``dropout=False`` models dropout-free layers (no masks stored);
    ``logits_bytes`` the dtype of the cross-entropy logits (fp32 in the paper); ``vocab`` enables
    the embedding and output-layer terms; ``kv_heads`` the key/value heads of grouped-query attention
    (Ainslie et al. 2023; Megatron's ``num_query_groups``: K and V are ``kv_heads/heads`` as wide as Q),
    None for one per query head; ``gated_mlp`` a gated MLP (SwiGLU, Shazeer 2020: Llama, Mistral, Qwen)
    with three ``h x f`` matrices, ``down(act(gate(x)) * up(x))``; ``tied_output=False`` an output layer
    with its own ``v x h`` weights instead of the embedding's (Megatron's default is tied);
    ``vocab_divisible_by`` Megatron's ``--make-vocab-size-divisible-by`` (default 128): the embedding,
    output layer and logits are ``padded_vocab`` wide, ``vocab`` rounded up to a multiple of
    ``vocab_divisible_by * t`` (1 and ``t = 1`` count ``vocab`` as given).
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int
    vocab: int | None = None
    ffn_mult: int = 4
    dtype_bytes: int = 2
    dropout_mask_bytes: int = 1
    dropout: bool = True
    logits_bytes: int = 4
    ffn_size: int | None = None
    kv_heads: int | None = None
    gated_mlp: bool = False
    tied_output: bool = True
    vocab_divisible_by: int = 128

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "batch", "ffn_mult", "dtype_bytes", "logits_bytes",
                     "vocab_divisible_by"):
            _check_positive_int(name, getattr(self, name))
        _check_int("dropout_mask_bytes", self.dropout_mask_bytes)
        if self.dropout_mask_bytes < 0:
            raise ValueError(f"dropout_mask_bytes must be >= 0, got {self.dropout_mask_bytes}")
        if self.vocab is not None:
            _check_positive_int("vocab", self.vocab)
        if self.ffn_size is not None:
            _check_positive_int("ffn_size", self.ffn_size)
        if self.hidden % self.heads:
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}): each head gets "
                "hidden/heads channels"
            )
        if self.kv_heads is not None:
            _check_positive_int("kv_heads", self.kv_heads)
            if self.heads % self.kv_heads:
                raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads}): "
                                 "each key/value head serves a group of query heads")

    @property
    def ffn_hidden(self) -> int:
        return self.ffn_size if self.ffn_size is not None else self.ffn_mult * self.hidden

    @property
    def kv_width(self) -> int:
        """Channels of K (and of V): ``hidden`` without grouped-query attention."""
        return self.hidden if self.kv_heads is None else self.kv_heads * (self.hidden // self.heads)


def padded_vocab(cfg: TransformerConfig, tp: int = 1) -> int | None:
    """The vocabulary the embedding, output layer and logits hold on ``tp`` ranks: ``cfg.vocab`` rounded
    up to a multiple of ``vocab_divisible_by * tp``, as Megatron-LM's ``_vocab_size_with_padding`` does so
    that every rank holds an equal vocabulary slice (GPT-2's 50257 is 50304 at ``tp = 1``, 50432 at 4).
    None without a vocabulary."""
    if cfg.vocab is None:
        return None
    multiple = cfg.vocab_divisible_by * tp
    return -(-cfg.vocab // multiple) * multiple


@dataclass(frozen=True)
class ActivationTensor:
    """One tensor a transformer layer keeps for its backward pass (Korthikanti Sec. 4.1).

    ``tensor_parallel``: it lives between the column- and row-parallel linears, so tensor
    parallelism splits it by ``t``; otherwise it is replicated and only sequence parallelism splits
    it.  ``attention_core``: QK^T/softmax/dropout/attention-over-V state that selective recompute
    regenerates in the backward pass instead of storing.
    """

    name: str
    block: Literal["attention", "mlp", "layernorm"]
    elements: int
    element_bytes: int
    tensor_parallel: bool
    attention_core: bool = False

    @property
    def bytes(self) -> int:
        return self.elements * self.element_bytes


def layer_activation_tensors(cfg: TransformerConfig) -> tuple[ActivationTensor, ...]:
    """The per-tensor breakdown of one layer's stored activations without parallelism or recompute.

    Korthikanti et al. Sec. 4.1 (attention, MLP, LayerNorm paragraphs); sizes in elements with the
    dtype each one is stored in.  Summing ``.bytes`` gives ``sbh(16d + 2m) + as^2b(2d + m)``; a gated
    MLP keeps two more MLP-wide tensors (``2 sbf d`` more).
    """
    s, b, h, a = cfg.seq, cfg.batch, cfg.hidden, cfg.heads
    sbh, scores, ffn = s * b * h, a * s * s * b, s * b * cfg.ffn_hidden
    sbg = s * b * cfg.kv_width  # K and V: narrower than Q under grouped-query attention
    d, m = cfg.dtype_bytes, cfg.dropout_mask_bytes
    T = ActivationTensor
    tensors = [
        T("ln1.input", "layernorm", sbh, d, False),
        T("qkv.input", "attention", sbh, d, False),
        T("attention.q", "attention", sbh, d, True),
        T("attention.k", "attention", sbg, d, True),
        T("attention.softmax_output", "attention", scores, d, True, attention_core=True),
    ]
    if cfg.dropout:
        # With dropout, attention over V reads the dropout output, a second as^2b tensor; without it,
        # it reads the softmax output already counted above.
        tensors += [
            T("attention.dropout_mask", "attention", scores, m, True, attention_core=True),
            T("attention.dropout_output", "attention", scores, d, True, attention_core=True),
        ]
    tensors += [
        T("attention.v", "attention", sbg, d, True),
        T("proj.input", "attention", sbh, d, True),
    ]
    if cfg.dropout:
        tensors.append(T("proj.dropout_mask", "attention", sbh, m, False))
    tensors += [
        T("ln2.input", "layernorm", sbh, d, False),
        T("fc1.input", "mlp", sbh, d, False),
    ]
    if cfg.gated_mlp:
        # autograd keeps, for down(act(gate(x)) * up(x)): the activation's input (gate's output), both
        # operands of the product (the activation's output, up's output) and down's input (the product);
        # gate and up share their input x, counted once as fc1.input.
        tensors += [
            T("mlp.gate_output", "mlp", ffn, d, True),
            T("mlp.activation_output", "mlp", ffn, d, True),
            T("mlp.up_output", "mlp", ffn, d, True),
            T("fc2.input", "mlp", ffn, d, True),
        ]
    else:
        tensors += [
            T("gelu.input", "mlp", ffn, d, True),
            T("fc2.input", "mlp", ffn, d, True),
        ]
    if cfg.dropout:
        tensors.append(T("mlp.dropout_mask", "mlp", sbh, m, False))
    return tuple(tensors)


def layer_activation_breakdown(
    cfg: TransformerConfig, tp: int = 1, sp: bool = False, recompute: Recompute = "none"
) -> dict[str, int]:
    """Bytes one device stores per layer, by tensor name (the terms `activation_bytes_per_layer` sums).

    Full recompute (Korthikanti Sec. 5, "full activation recomputation") keeps only the layer input:
    ``d sbh``, split by ``t`` only under sequence parallelism.
    """
    _check_parallel(cfg, tp, sp)
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    tensors = layer_activation_tensors(cfg)
    if recompute == "full":
        tensors = tuple(t for t in tensors if t.name == "ln1.input")
    elif recompute == "selective":
        tensors = tuple(t for t in tensors if not t.attention_core)
    return {t.name: _shard(t.bytes, tp if (t.tensor_parallel or sp) else 1, t.name) for t in tensors}


def activation_bytes_per_layer(
    cfg: TransformerConfig, tp: int = 1, sp: bool = False, recompute: Recompute = "none"
) -> int:
    """Activation bytes one transformer layer keeps on one device (Korthikanti Sec. 4.1, 4.2.1-4.2.2, 5).

    ``tp`` is the tensor-parallel degree ``t``; ``sp`` turns on sequence parallelism (requires
    ``seq % tp == 0``); ``recompute`` is "none", "selective" or "full".
    """
    return sum(layer_activation_breakdown(cfg, tp, sp, recompute).values())


def in_flight_layers(layers: int, pp: int, interleave: int = 1) -> Fraction:
    """Layers' worth of activations the first pipeline stage holds at its peak (Korthikanti Sec. 4.2.3).

    With the 1F1B schedule the first of ``pp`` stages owns ``L/pp`` layers and keeps ``pp``
    micro-batches in flight: ``L`` layers' worth, independent of ``pp``.  The interleaved schedule
    with ``interleave`` model chunks per device needs ``L (1 + (pp - 1)/(pp * interleave))``.
    """
    _check_positive_int("pp", pp)
    _check_positive_int("interleave", interleave)
    if layers % pp:
        raise ValueError(f"layers ({layers}) must be divisible by the pipeline degree pp ({pp})")
    if interleave > 1 and (layers // pp) % interleave:
        raise ValueError(
            f"with interleave={interleave} each stage's {layers // pp} layers must split into "
            f"{interleave} equal chunks"
        )
    extra = Fraction(pp - 1, pp * interleave) if interleave > 1 else Fraction(0)
    return layers * (1 + extra)


def embedding_activation_bytes(cfg: TransformerConfig, tp: int = 1, sp: bool = False, pp: int = 1) -> int:
    """The input-embedding dropout mask on the first stage, ``p`` micro-batches of it (Sec. 4.3).

    ``sbhp/t`` with sequence parallelism; replicated (``sbhp``) without.
    """
    _check_parallel(cfg, tp, sp)
    if not cfg.dropout:
        return 0
    mask = cfg.seq * cfg.batch * cfg.hidden * cfg.dropout_mask_bytes * pp
    return _shard(mask, tp if sp else 1, "embedding.dropout_mask")


def output_activation_bytes(cfg: TransformerConfig, tp: int = 1, sp: bool = False) -> dict[str, int]:
    """Final LayerNorm input, output-projection input and fp32 logits (Korthikanti Sec. 4.3).

    ``2sbh/t + 2sbh/t + 4sbv/t`` = ``4sbh/t (1 + v/h)`` with sequence parallelism; the logits are
    always vocabulary-parallel (split by ``t``), ``v`` the `padded_vocab`.  Empty when ``cfg.vocab`` is None.
    """
    _check_parallel(cfg, tp, sp)
    vocab = padded_vocab(cfg, tp)
    if vocab is None:
        return {}
    sbh = cfg.seq * cfg.batch * cfg.hidden * cfg.dtype_bytes
    logits = cfg.seq * cfg.batch * vocab * cfg.logits_bytes
    split = tp if sp else 1
    return {
        "final_ln.input": _shard(sbh, split, "final_ln.input"),
        "output_proj.input": _shard(sbh, split, "output_proj.input"),
        "logits": logits // tp,
    }


def parameter_count_per_device(cfg: TransformerConfig, tp: int = 1, pp: int = 1) -> int:
    """Parameters held by one device of the first pipeline stage (Megatron's split).

    Per layer ``4h^2 + 2hf + 3h + f`` parameters are tensor-parallel (QKV weight and bias, output
    projection weight, both MLP weights, first MLP bias) and ``6h`` replicated (two LayerNorms, the
    two row-parallel biases): ``12h^2 + 13h`` in total for ``f = 4h``.  The first stage also holds the
    vocabulary-parallel word embedding ``vh/t`` and learned positions ``sh``; with ``pp == 1`` it is
    also the last stage and holds the final LayerNorm (the output layer is tied to the embedding).
    With grouped-query attention (K and V ``g`` = `kv_width` channels wide) the QKV weight and bias are
    ``h(h + 2g)`` and ``h + 2g``.  A gated MLP adds its third ``h x f`` matrix (tensor-parallel); an
    untied output layer its ``v h / t`` weights on the last stage.  ``v`` is the `padded_vocab`
    (Megatron pads the vocabulary so every rank holds ``v/t`` rows).
    """
    _check_parallel(cfg, tp, False)
    in_flight_layers(cfg.layers, pp)  # validates pp
    h, f, g = cfg.hidden, cfg.ffn_hidden, cfg.kv_width
    # h, f and g are multiples of tp (checked), so the sharded count divides exactly.
    mlp_matrices = 3 if cfg.gated_mlp else 2
    sharded, replicated = h * (h + 2 * g) + h * h + mlp_matrices * h * f + h + 2 * g + f, 6 * h
    per_layer = sharded // tp + replicated
    count = (cfg.layers // pp) * per_layer
    vocab = padded_vocab(cfg, tp)
    if vocab is not None:  # padded to a multiple of tp: each rank holds an equal slice
        count += vocab * h // tp + cfg.seq * h
        if pp == 1:
            count += 2 * h + (0 if cfg.tied_output else vocab * h // tp)
    return count


def per_parameter_bytes(
    cfg: TransformerConfig,
    param_bytes: int | None = None,
    grad_bytes: int | None = None,
    optimizer_bytes: int | None = None,
) -> tuple[int, int, int, dict[str, int] | None]:
    """Bytes per parameter of the weights, their gradients and the optimizer state, and that state by
    what it holds (None when the caller gave `optimizer_bytes`).  Unset, weights and gradients are in
    the config's dtype (``cfg.dtype_bytes``: an fp32 model trains fp32 weights, not the 16-bit ones of
    mixed precision) and the state is Adam's for such weights (`optimizer_state_bytes`)."""
    param_bytes = cfg.dtype_bytes if param_bytes is None else param_bytes
    grad_bytes = param_bytes if grad_bytes is None else grad_bytes
    states = optimizer_state_bytes(param_bytes) if optimizer_bytes is None else None
    optimizer_bytes = sum(states.values()) if states is not None else optimizer_bytes
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes),
                        ("optimizer_bytes", optimizer_bytes)):
        _check_int(name, value)
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return param_bytes, grad_bytes, optimizer_bytes, states


def estimate_memory(
    cfg: TransformerConfig,
    tp: int = 1,
    sp: bool = False,
    recompute: Recompute = "none",
    pp: int = 1,
    device_capacity_bytes: int | None = None,
    *,
    interleave: int = 1,
    param_bytes: int | None = None,
    grad_bytes: int | None = None,
    optimizer_bytes: int | None = None,
) -> dict[str, Any]:
    """Per-device memory of the first pipeline stage of an Adam training run (the what-if panel).

    Activations follow Korthikanti et al. Sec. 4-5 (`activation_bytes_per_layer` times
    `in_flight_layers`, plus the Sec. 4.3 embedding term and, when ``pp == 1``, the output-layer
    terms).  Static memory is ``param_bytes + grad_bytes + optimizer_bytes`` per parameter over
    `parameter_count_per_device`; unset, they follow the config's dtype (`per_parameter_bytes`): 2 + 2 + 12
    = 16 for mixed-precision Adam in 16-bit (fp32 master weights, first and second moments), 4 + 4 + 8
    for fp32.  Everything is estimated.

    Returns a dict of ints (bytes unless named otherwise):
    ``activations_per_layer``, ``layer_breakdown`` (tensor -> bytes per layer), ``layers_per_stage``,
    ``in_flight_layers`` (float), ``layer_activations``, ``embedding_activations``,
    ``output_activations``, ``activations`` (their sum), ``parameter_count``, ``parameters``,
    ``gradients``, ``optimizer``, ``total``, ``by_category`` (the same split under the timeline
    category names of `solvers.CATEGORIES`), ``capacity`` (None when not given), ``fits`` (None when
    no capacity), ``headroom`` (capacity - total, or None), ``assumptions`` (`assumptions`) and the
    echoed settings.
    """
    weight_b, grad_b, optimizer_b, _ = per_parameter_bytes(cfg, param_bytes, grad_bytes, optimizer_bytes)
    breakdown = layer_activation_breakdown(cfg, tp, sp, recompute)
    per_layer = sum(breakdown.values())
    layers_held = in_flight_layers(cfg.layers, pp, interleave)
    layer_acts = ceil(per_layer * layers_held)
    embed = embedding_activation_bytes(cfg, tp, sp, pp)
    # The output layer lives on the last stage; the first stage (reported here) holds it only when pp == 1.
    output = sum(output_activation_bytes(cfg, tp, sp).values()) if pp == 1 else 0
    n_params = parameter_count_per_device(cfg, tp, pp)
    parameters, gradients, optimizer = n_params * weight_b, n_params * grad_b, n_params * optimizer_b
    activations = layer_acts + embed + output
    total = activations + parameters + gradients + optimizer
    if device_capacity_bytes is not None:
        _check_positive_int("device_capacity_bytes", device_capacity_bytes)
    return {
        "estimated": True,
        "tp": tp, "sp": sp, "recompute": recompute, "pp": pp, "interleave": interleave,
        "activations_per_layer": per_layer,
        "layer_breakdown": breakdown,
        "layers_per_stage": cfg.layers // pp,
        "in_flight_layers": float(layers_held),
        "layer_activations": layer_acts,
        "embedding_activations": embed,
        "output_activations": output,
        "activations": activations,
        "parameter_count": n_params,
        "parameters": parameters,
        "gradients": gradients,
        "optimizer": optimizer,
        "total": total,
        "by_category": {
            "parameters": parameters, "parameter_gradients": gradients, "optimizer_state": optimizer,
            "activations": activations,
        },
        "capacity": device_capacity_bytes,
        "fits": None if device_capacity_bytes is None else total <= device_capacity_bytes,
        "headroom": None if device_capacity_bytes is None else device_capacity_bytes - total,
        "assumptions": assumptions(cfg, tp, sp, recompute, pp, interleave=interleave, param_bytes=param_bytes,
                                   grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes),
    }


def activation_formula(
    cfg: TransformerConfig, tp: int = 1, sp: bool = False, recompute: Recompute = "none"
) -> str:
    """The per-layer formula `layer_activation_breakdown` sums, written out from its own tensors
    (Korthikanti et al. Sec. 4.1-4.2, Sec. 5), e.g. ``sbh(10 + 24/t) + 5as^2b/t`` for tensor parallelism
    in 16-bit with 1-byte masks, or ``34sbh + 5as^2b`` unsharded: coefficients of ``sbh`` and ``as^2b``
    in bytes, ``/t`` on the terms one device holds a 1/t share of."""
    _check_parallel(cfg, tp, sp)
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    kept = set(layer_activation_breakdown(cfg, tp, sp, recompute))
    sbh, scores = cfg.seq * cfg.batch * cfg.hidden, cfg.heads * cfg.seq * cfg.seq * cfg.batch
    # (unit, split over t) -> coefficient in bytes; gelu/fc2 inputs are s*b*ffn elements: f/h of sbh
    coef: dict[tuple[str, bool], Fraction] = {}
    for t in layer_activation_tensors(cfg):
        if t.name not in kept:
            continue
        unit = "as^2b" if t.attention_core else "sbh"
        key = (unit, tp > 1 and (t.tensor_parallel or sp))
        coef[key] = coef.get(key, Fraction(0)) + Fraction(t.bytes, scores if t.attention_core else sbh)

    def num(f: Fraction) -> str:
        return str(f.numerator) if f.denominator == 1 else f"{float(f):g}"

    def unit_term(unit: str) -> str:
        whole, split = coef.get((unit, False)), coef.get((unit, True))
        if whole and split:
            return f"{unit}({num(whole)} + {num(split)}/t)"
        if split:
            return f"{num(split)}{unit}/t"
        return f"{num(whole)}{unit}" if whole else ""

    return " + ".join(term for term in (unit_term("sbh"), unit_term("as^2b")) if term)


def assumptions(
    cfg: TransformerConfig,
    tp: int = 1,
    sp: bool = False,
    recompute: Recompute = "none",
    pp: int = 1,
    *,
    interleave: int = 1,
    param_bytes: int | None = None,
    grad_bytes: int | None = None,
    optimizer_bytes: int | None = None,
) -> list[dict[str, str]]:
    """What `estimate_memory` assumes, as ``{"name", "value"}`` rows for a reader (the what-if panel
    shows them as text): bytes per value and per parameter, the activation formula (`activation_formula`)
    and how the vocabulary is counted (Korthikanti et al. Sec. 4.3; the output layer tied to the
    embedding, Megatron's default)."""
    param_bytes, grad_bytes, optimizer_bytes, states = per_parameter_bytes(cfg, param_bytes, grad_bytes,
                                                                            optimizer_bytes)
    optimizer = " + ".join(f"{v} ({k})" for k, v in states.items()) if states else "given by the caller"
    masks = (f"{cfg.dropout_mask_bytes} B per element" if cfg.dropout else "none (no dropout)")
    if cfg.vocab is None:
        vocab = "no vocabulary given: embedding, output layer and logits are not counted"
    else:
        where = ("this stage is also the last one: final norm input, output-layer input and logits counted"
                 if pp == 1 else "the output layer and logits live on the last stage, not on this first one")
        output = ("tied to the output layer" if cfg.tied_output else
                  "and an untied output layer (v h / t more, on the last stage)")
        padded = padded_vocab(cfg, tp)
        size = (f"vocab {cfg.vocab}" if padded == cfg.vocab else
                f"vocab {cfg.vocab} padded to {padded} (Megatron: a multiple of {cfg.vocab_divisible_by} x t "
                f"= {cfg.vocab_divisible_by * tp})")
        vocab = (f"{size}: vocabulary-parallel word embedding (v h / t parameters) {output}, "
                 f"learned positions (s h); logits {cfg.logits_bytes} B per value, split over t; {where}")
    if pp == 1:
        in_flight = "L layers"
    elif interleave == 1:
        in_flight = "L layers (1F1B: L/p layers x p micro-batches in flight)"
    else:
        in_flight = f"L (1 + (p - 1)/(p m)) layers (interleaved 1F1B, m = {interleave} chunks per device)"
    return [
        {"name": "activation dtype", "value": f"{cfg.dtype_bytes} B per value"},
        {"name": "parameters", "value": f"{param_bytes} B per parameter"},
        {"name": "gradients", "value": f"{grad_bytes} B per parameter"},
        {"name": "optimizer state", "value": f"{optimizer_bytes} B per parameter = {optimizer}"},
        {"name": "dropout masks", "value": masks},
        {"name": "activations per layer",
         "value": f"{activation_formula(cfg, tp, sp, recompute)} (Korthikanti et al. Sec. 4-5; "
                  f"recompute {recompute}), times {in_flight}"},
        {"name": "attention", "value": f"{cfg.heads} query heads, "
         + ("K and V as wide as Q" if cfg.kv_heads is None else
            f"{cfg.kv_heads} key/value heads (grouped-query: K, V and their weights {cfg.kv_width} wide)")},
        {"name": "MLP", "value": f"inner size {cfg.ffn_hidden}, "
         + ("three matrices (gated: gate, up, down; four MLP-wide tensors saved)" if cfg.gated_mlp
            else "two matrices")},
        {"name": "vocabulary", "value": vocab},
    ]


def fits(
    cfg: TransformerConfig,
    device_capacity_bytes: int,
    tp: int = 1,
    sp: bool = False,
    recompute: Recompute = "none",
    pp: int = 1,
    **kw: Any,
) -> bool:
    """Whether `estimate_memory`'s total for the first pipeline stage fits in ``device_capacity_bytes``."""
    return bool(estimate_memory(cfg, tp, sp, recompute, pp, device_capacity_bytes, **kw)["fits"])


def max_micro_batch(
    cfg: TransformerConfig,
    device_capacity_bytes: int,
    tp: int = 1,
    sp: bool = False,
    recompute: Recompute = "none",
    pp: int = 1,
    **kw: Any,
) -> int:
    """Largest micro-batch ``b`` whose `estimate_memory` fits in ``device_capacity_bytes`` (0: none does).

    The total grows strictly with ``b`` (activations are proportional to it, the rest is fixed), so a
    doubling search followed by bisection finds the boundary exactly.
    """

    def fits_b(b: int) -> bool:
        return fits(replace(cfg, batch=b), device_capacity_bytes, tp, sp, recompute, pp, **kw)

    if not fits_b(1):
        return 0
    lo, hi = 1, 2
    while fits_b(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_b(mid) else (lo, mid)
    return lo


# --- validation helpers ----------------------------------------------------------------------------
def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")


def _check_positive_int(name: str, value: object) -> None:
    _check_int(name, value)
    if value <= 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be positive, got {value}")


def _check_parallel(cfg: TransformerConfig, tp: int, sp: bool) -> None:
    _check_positive_int("tp", tp)
    if not isinstance(sp, bool):
        raise TypeError(f"sp must be a bool, got {sp!r}")
    if cfg.heads % tp:
        raise ValueError(f"heads ({cfg.heads}) must be divisible by the tensor-parallel degree tp ({tp})")
    if cfg.kv_heads is not None and cfg.kv_heads % tp:
        raise ValueError(f"kv_heads ({cfg.kv_heads}) must be divisible by the tensor-parallel degree tp "
                         f"({tp})")
    if cfg.ffn_hidden % tp:
        raise ValueError(f"the MLP inner size ({cfg.ffn_hidden}) must be divisible by tp ({tp})")
    if sp and cfg.seq % tp:
        raise ValueError(f"sequence parallelism splits seq ({cfg.seq}) over tp ({tp}): it must divide evenly")


def _shard(nbytes: int, parts: int, name: str) -> int:
    # Callers validated the dims, so a remainder here means an inconsistent config, never rounding.
    if nbytes % parts:
        raise ValueError(f"{name}: {nbytes} bytes do not split evenly over {parts} devices")
    return nbytes // parts
