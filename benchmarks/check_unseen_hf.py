"""The truth loop on Hugging Face architectures the real-model zoo (`tests/real_models.py`) does not hold.

Run: ``nice -n 10 python benchmarks/check_unseen_hf.py [--size deep] [--models gpt_neox,opt] [--timeout 900]``
(CPU).
Not a test: each model runs in its own subprocess with a timeout, so one hang or crash does not stop the
sweep, and prints one row per step: ``ok``, the exception's type and first line, and the peaks.

Per model: a random-init transformers config (2 layers, hidden 64, sequence 16, batch 2, vocabulary 96;
``--size deep``: sequence 256, batch 4, 112 px images, where activations make most of the peak (`SIZES`);
dropout 0.1 wherever the config has a dropout probability; no downloads), train mode, a real loss (the
zoo's rotation: the model's own ``labels=`` loss or a user cross-entropy / MSE, `rotating_loss`) and AdamW:

* ``profile``: ``memviz.profile(model, args, kwargs, loss_fn=..., optimizer=torch.optim.AdamW)``;
* ``plan_auto`` / ``plan_sac``: ``memviz.plan(prof, 0.5)`` and ``strategy="sac"`` (at the refusal's
  minimum when 0.5 is infeasible; the row says so);
* ``export``: ``memviz.export(plan_auto, verify=True)``, then 3 AdamW steps against an eager copy with
  the same seeds: outputs, every gradient and every parameter after the step equal
  (`tests.test_real_models`' step and `tests.test_zoo`'s comparisons), measured peak vs the plan's;
* ``apply``: ``memviz.apply(plan_sac, model, verify=True)``, then the same 3 AdamW steps against eager;
* decoders only, ``chunk``: inference at `LONG` tokens (``mode="inference"``, eval mode),
  ``memviz.plan(prof, 0.5, strategy="autochunk")``, exported, outputs equal to eager's under no_grad
  (within chunking's 1e-5, `tests.test_real_chunk`: a chunk may run another SDPA kernel than the whole),
  the measured activation peak vs the plan's (at the refusal's minimum when 0.5 is infeasible).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.real_models import (  # noqa: E402
    VOCAB,
    RealCase,
    _causal_lm,
    _image_classifier,
    _lm_losses,
    _masked_lm,
    _own_loss,
    _seq2seq,
    _tokens,
    rotating_loss,
    transformers,
)

#: tokens of the decoders' long-sequence inference that autochunk plans
LONG = 256


@dataclass(frozen=True)
class Size:
    """The example inputs' shapes at one sweep size (a seq2seq model: source 3/4 and target 1/2 of `seq`)."""

    batch: int
    seq: int
    image: int

    @property
    def positions(self) -> int:
        """Position embeddings the encoders need (RoBERTa's offset of the padding id included)."""
        return max(64, 2 * self.seq)


#: tiny: parameters and AdamW state make most of the peak (the sweep of task unseen34); deep: activations do
#: (task deep35), so a plan at 0.5 has to recompute
SIZES = {"tiny": Size(batch=2, seq=16, image=32), "deep": Size(batch=4, seq=256, image=112)}
FRACTION = 0.5
STEPS = 3
TIME_LIMIT = 20.0
#: ids every tiny vocabulary holds (the configs' defaults point past VOCAB)
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def with_dropout(config: Any, p: float = 0.1) -> Any:
    """`config` with every dropout probability it has set to `p` (LayerDrop and drop-path left alone:
    they skip whole layers, which is not what this sweep asks of dropout)."""
    for key, value in list(config.to_dict().items()):
        if isinstance(value, float) and key.endswith(("dropout", "dropout_prob", "pdrop", "dropout_rate")) \
                and "layerdrop" not in key:
            setattr(config, key, p)
    return config


#: LayerDrop keys set to 0 under ``--no-layerdrop`` (the environment carries it to each model's process)
LAYERDROP_KEYS = ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")


def _config(model_type: str, **kw: Any) -> Any:
    """A random-init config of `model_type`; a keyword given as None is left at the config's default.
    With ``--no-layerdrop``, LayerDrop off (before layerdrop38 the capture took each layer's draw as the
    example drew it; now it plans the step no draw skips a layer in, and export refuses LayerDrop on)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    config = with_dropout(transformers.AutoConfig.for_model(model_type, **kw))
    if os.environ.get("MEMVIZ_SWEEP_NO_LAYERDROP"):
        for key in LAYERDROP_KEYS:
            if hasattr(config, key):
                setattr(config, key, 0.0)
    return config


_LM = {"vocab_size": VOCAB, "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
       "intermediate_size": 128, "num_key_value_heads": 4, "max_position_embeddings": 2 * LONG, **TOKENS}


Factory = Callable[[Size], RealCase]


def decoder(model_type: str, attn: str = "sdpa", max_seq: int = LONG, **kw: Any) -> Factory:
    """`attn`: "eager" for the architectures transformers gives no SDPA attention; `max_seq`: the longest
    training sequence (Mamba's slow path scans one token at a time: its graph grows with the sequence)."""
    return lambda size: _causal_lm(_config(model_type, **{**_LM, **kw}), attn, seq=min(size.seq, max_seq),
                                   long_seq=LONG, batch=size.batch)


_ENC = {"vocab_size": VOCAB, "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
        "intermediate_size": 128, **TOKENS}


def encoder(model_type: str, mask: bool = True, **kw: Any) -> Factory:
    """`mask`: False for the encoders whose forward takes no attention mask (FNet mixes every token)."""
    auto = transformers.AutoModelForMaskedLM

    def make(size: Size) -> RealCase:
        case = _masked_lm(_config(model_type, **{**_ENC, "max_position_embeddings": size.positions, **kw}),
                          auto.from_config, size.batch, size.seq)
        if not mask:
            del case.kwargs["attention_mask"]
        return case
    return make


_S2S = {"vocab_size": VOCAB, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128, "decoder_start_token_id": 2, **TOKENS}


def seq2seq(model_type: str, mask: bool = False, **kw: Any) -> Factory:
    """`mask`: pass the source's attention mask (all ones), for the models that build none under
    torch.export (Switch Transformers: ``if attention_mask is None and not is_torchdynamo_compiling()``,
    then indexes the None)."""
    auto = transformers.AutoModelForSeq2SeqLM

    def make(size: Size) -> RealCase:
        case = _seq2seq(_config(model_type, **{**_S2S, "max_position_embeddings": size.positions, **kw}),
                        auto.from_config, size.batch, size.seq * 3 // 4, size.seq // 2)
        if mask:
            case.kwargs["attention_mask"] = torch.ones_like(case.args[0])
        return case
    return make


def vision(model_type: str, cls: Any = None, **kw: Any) -> Factory:
    """`cls`: the classifier where the Auto class maps `model_type` to several (DeiT)."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        cfg = _config(model_type, num_labels=10, image_size=size.image, **kw)
        model = cls(cfg) if cls else transformers.AutoModelForImageClassification.from_config(cfg)
        return _image_classifier(model, size.image, 10, "transformers", own=True, batch=size.batch)
    return make


def masked_autoencoder(model_type: str, **kw: Any) -> Factory:
    """A masked-image pretraining model (ViT-MAE): its own reconstruction loss over the patches its
    forward masks at random (``torch.rand`` + ``argsort`` inside the forward), or MSE of its logits."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        cfg = _config(model_type, image_size=size.image, **kw)
        model = transformers.AutoModelForPreTraining.from_config(cfg).train()
        g = torch.Generator().manual_seed(0)
        images = torch.randn(size.batch, 3, size.image, size.image, generator=g)
        losses = {"own": lambda out: out.loss, "mse": lambda out: out.logits.pow(2).mean()}
        return RealCase(model, (images,), {}, losses, None, "transformers")
    return make


_VIT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "patch_size": 8}


def _mse(field: str) -> Any:
    """A user loss on one output field: the mean square of it (every such model's second loss)."""
    return lambda out: getattr(out, field).pow(2).mean()


def ctc(model_type: str, *, own_only: bool = False, **kw: Any) -> Factory:
    """A speech encoder with a CTC head (`labels=`: CTC loss): a strided conv feature extractor over
    `25 * seq` raw samples, SpecAugment on (time masks drawn by numpy inside the forward, and the
    config's default LayerDrop: a `torch.rand` per layer deciding whether to run it).  `own_only`: the CTC
    loss whatever the rotation picks (else it may pick the user MSE on the logits)."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        cfg = _config(model_type, vocab_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.3,
                      mask_time_length=2, ctc_loss_reduction="mean", pad_token_id=0, **kw)
        model = transformers.AutoModelForCTC.from_config(cfg).train()
        g = torch.Generator().manual_seed(0)
        audio = torch.randn(size.batch, 25 * size.seq, generator=g)
        labels = torch.randint(1, 16, (size.batch, max(2, size.seq // 4)), generator=g)
        losses = {"own": _own_loss} if own_only else {"own": _own_loss, "mse": _mse("logits")}
        return RealCase(model, (audio,), {"labels": labels}, losses, None, "transformers")
    return make


def speech_seq2seq(model_type: str, **kw: Any) -> Factory:
    """A speech-to-text encoder-decoder over filterbank features (Speech2Text: a conv subsampler, then
    a transformer): `labels=` its cross-entropy."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        cfg = _config(model_type, **{**_S2S, "max_source_positions": size.positions,
                                     "max_target_positions": size.positions, **kw})
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(cfg).train()
        g = torch.Generator().manual_seed(0)
        feats = torch.randn(size.batch, 2 * size.seq, cfg.input_feat_per_channel * cfg.input_channels,
                            generator=g)
        _, labels = _tokens(size.batch, size.seq // 2, VOCAB, seed=2)
        return RealCase(model, (feats,), {"labels": labels}, _lm_losses(labels, VOCAB, shift=False), None,
                        "transformers")
    return make


def contrastive(model_type: str, text: dict[str, Any], vision_kw: dict[str, Any], **kw: Any) -> Factory:
    """A text-image dual encoder with its own contrastive loss (``return_loss=True``: CLIP's softmax,
    SigLIP's sigmoid), or a user cross-entropy over the image-text logits."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        text_cfg = {"vocab_size": VOCAB, "max_position_embeddings": size.seq, **text, **TOKENS}
        cfg = transformers.AutoConfig.for_model(model_type, text_config=text_cfg,
                                                vision_config={"image_size": size.image, **vision_kw}, **kw)
        for sub in (cfg, cfg.text_config, cfg.vision_config):
            with_dropout(sub)
        model = transformers.AutoModel.from_config(cfg).train()
        ids, _ = _tokens(size.batch, size.seq, VOCAB)
        g = torch.Generator().manual_seed(0)
        images = torch.randn(size.batch, 3, size.image, size.image, generator=g)
        diag = torch.arange(size.batch)
        return RealCase(model, (), {"input_ids": ids, "pixel_values": images, "return_loss": True},
                        {"own": _own_loss,
                         "ce": lambda out: F.cross_entropy(out.logits_per_image, diag, label_smoothing=0.1)},
                        None, "transformers")
    return make


_TS = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
       "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "d_model": 64, "lags_sequence": [1, 2, 3],
       "num_time_features": 1, "input_size": 1}


def forecaster(model_type: str, cls: Any, **kw: Any) -> Factory:
    """A probabilistic forecaster (`past_values`, time features, an observed mask; `future_values=`: the
    negative log-likelihood of its distribution head), context `seq`, horizon `seq // 2`; or MSE of the
    distribution's location."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        horizon = size.seq // 2
        cfg = _config(model_type, **{**_TS, "context_length": size.seq, "prediction_length": horizon, **kw})
        model = cls(cfg)
        past = size.seq + max(cfg.lags_sequence)
        g = torch.Generator().manual_seed(0)
        kwargs = {"past_values": torch.randn(size.batch, past, generator=g).abs() + 1,
                  "past_time_features": torch.linspace(0, 1, past)[None, :, None].repeat(size.batch, 1, 1),
                  "past_observed_mask": torch.ones(size.batch, past),
                  "future_values": torch.randn(size.batch, horizon, generator=g).abs() + 1,
                  "future_time_features": torch.linspace(1, 1.5, horizon)[None, :, None]
                  .repeat(size.batch, 1, 1)}
        losses = {"own": _own_loss, "mse": lambda out: out.params[1].pow(2).mean()}
        return RealCase(model.train(), (), kwargs, losses, None, "transformers")
    return make


def patchtst(**kw: Any) -> Factory:
    """PatchTST pretraining: random patch masking (`torch.rand` + `argsort` inside the forward), its own
    masked reconstruction MSE, over 3 channels of `2 * seq` steps."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        cfg = _config("patchtst", num_input_channels=3, context_length=2 * size.seq, patch_length=4,
                      patch_stride=4, d_model=64, num_attention_heads=4, num_hidden_layers=2, ffn_dim=128,
                      mask_type="random", random_mask_ratio=0.4, do_mask_input=True, **kw)
        model = transformers.PatchTSTForPretraining(cfg).train()
        values = torch.randn(size.batch, 2 * size.seq, 3, generator=torch.Generator().manual_seed(0))
        return RealCase(model, (values,), {}, {"own": _own_loss, "mse": _mse("prediction_output")}, None,
                        "transformers")
    return make


def perceiver(**kw: Any) -> Factory:
    """Perceiver IO masked LM: cross-attention of the bytes into a few latents, self-attention there,
    a decoder cross-attending back to every position (`labels=`: its cross-entropy)."""
    def make(size: Size) -> RealCase:
        cfg = _config("perceiver", vocab_size=VOCAB, num_latents=8, d_latents=32, d_model=64, num_blocks=1,
                      num_self_attends_per_block=2, num_self_attention_heads=4, num_cross_attention_heads=4,
                      qk_channels=32, v_channels=32, max_position_embeddings=size.seq, **kw)
        return _masked_lm(cfg, transformers.PerceiverForMaskedLM, size.batch, size.seq)
    return make


def canine(**kw: Any) -> Factory:
    """CANINE: characters hashed into several embedding tables, a local transformer, a strided conv
    downsampling, a deep transformer over the downsampled sequence, an upsampling conv; a sequence
    classifier (`labels=`: cross-entropy)."""
    def make(size: Size) -> RealCase:
        torch.manual_seed(0)
        cfg = _config("canine", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, num_hash_functions=4, num_hash_buckets=64, downsampling_rate=4,
                      local_transformer_stride=4, max_position_embeddings=size.positions, num_labels=3, **kw)
        model = transformers.CanineForSequenceClassification(cfg).train()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(32, 0x3000, (size.batch, size.seq), generator=g)
        labels = torch.randint(0, 3, (size.batch,), generator=g)
        return RealCase(model, (ids,), {"labels": labels},
                        {"own": _own_loss, "ce": lambda out: F.cross_entropy(out.logits, labels),
                         "mse": _mse("logits")}, None, "transformers")
    return make

MODELS: dict[str, Factory] = {
    # decoders: rotary / ALiBi / learned positions, parallel attention+MLP, GQA / MQA, gated MLPs, MoE, SSM
    "gpt_neox": decoder("gpt_neox", rotary_pct=0.25),
    "opt": decoder("opt", ffn_dim=128, word_embed_proj_dim=64, pad_token_id=1),
    "bloom": decoder("bloom", "eager", n_layer=2, n_head=4),
    "falcon": decoder("falcon"),
    "phi": decoder("phi"),
    "phi3": decoder("phi3"),
    "gemma": decoder("gemma", num_key_value_heads=2, head_dim=16),
    "gemma2": decoder("gemma2", "eager", num_key_value_heads=2, head_dim=16, sliding_window=8),
    "stablelm": decoder("stablelm"),
    "olmo": decoder("olmo"),
    "gptj": decoder("gptj", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=2 * LONG),
    "codegen": decoder("codegen", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=2 * LONG,
                       n_ctx=2 * LONG),
    "mixtral": decoder("mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": decoder("qwen2_moe", num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, shared_expert_intermediate_size=64),
    "mamba": decoder("mamba", "eager", max_seq=64, state_size=8, use_cache=False),
    # encoders: disentangled / relative attention, factorised embeddings, bottlenecks, pooling, sparse
    "deberta_v2": encoder("deberta-v2", relative_attention=True, pos_att_type=["p2c", "c2p"],
                          max_relative_positions=16),
    "electra": encoder("electra", embedding_size=32),
    "albert": encoder("albert", embedding_size=32),
    "mobilebert": encoder("mobilebert", embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                          num_feedforward_networks=2, intermediate_size=64),
    "xlm_roberta": encoder("xlm-roberta", pad_token_id=1),
    "funnel": encoder("funnel", num_hidden_layers=None, block_sizes=[1, 1], d_model=64, n_head=4, d_head=16,
                      d_inner=128),
    "mpnet": encoder("mpnet"),
    "big_bird": encoder("big_bird"),
    "longformer": encoder("longformer", attention_window=[8, 8], pad_token_id=1),
    # encoder-decoders
    "mbart": seq2seq("mbart"),
    "pegasus": seq2seq("pegasus"),
    "marian": seq2seq("marian"),
    # vision: windowed attention, convolutions, distillation tokens, relative bias, efficient attention
    "swin": vision("swin", patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
                   drop_path_rate=0.1),
    "convnext": vision("convnext", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, drop_path_rate=0.1),
    "deit": vision("deit", transformers.DeiTForImageClassification, **_VIT),
    "beit": vision("beit", **_VIT, use_relative_position_bias=True, drop_path_rate=0.1),
    "segformer": vision("segformer", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                        hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                        mlp_ratios=[2, 2], decoder_hidden_size=32, drop_path_rate=0.1),
    # task zoohf36: recurrences (RWKV, Mamba2's chunked scan, Griffin's RG-LRU), hybrid attention+SSM+MoE,
    # reversible layers and LSH attention, two-stream relative attention, partial rotary, QK norm, MoE
    "rwkv": decoder("rwkv", "eager", max_seq=64, attention_hidden_size=64, context_length=2 * LONG,
                    use_cache=False),
    "mamba2": decoder("mamba2", "eager", max_seq=64, num_heads=8, head_dim=16, state_size=8, n_groups=1,
                      chunk_size=8, use_cache=False),
    "jamba": decoder("jamba", "eager", max_seq=64, num_key_value_heads=2, num_experts=4,
                     num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                     expert_layer_offset=1, mamba_d_state=8, mamba_expand=2, use_mamba_kernels=False,
                     use_cache=False),
    "recurrent_gemma": decoder("recurrent_gemma", "eager", lru_width=64, attention_window_size=8,
                               block_types=["recurrent", "attention"], num_key_value_heads=1, head_dim=16,
                               use_cache=False),
    "granite": decoder("granite", embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0),
    "cohere": decoder("cohere", use_qk_norm=True),
    "starcoder2": decoder("starcoder2", num_key_value_heads=2, sliding_window=8),
    "qwen3": decoder("qwen3", num_key_value_heads=2, head_dim=16),
    "persimmon": decoder("persimmon", "eager", partial_rotary_factor=0.5, qk_layernorm=True),
    "dbrx": decoder("dbrx", d_model=64,
                    attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
                    ffn_config={"hidden_size": 64, "ffn_hidden_size": 64, "moe_num_experts": 4,
                                "moe_top_k": 2}),
    "olmoe": decoder("olmoe", num_experts=4, num_experts_per_tok=2),
    "xlnet": decoder("xlnet", "eager", d_model=64, n_layer=2, n_head=4, d_inner=128,
                     max_position_embeddings=None),
    # reversible layers (a custom autograd Function recomputing each layer in its backward) and LSH
    # attention; training needs the axial position shape to multiply to the sequence: no chunk check
    "reformer": lambda size: decoder("reformer", "eager", attn_layers=["local", "lsh"],
                                     axial_pos_shape=[4, size.seq // 4], axial_pos_embds_dim=[32, 32],
                                     attention_head_size=16, feed_forward_size=128, local_attn_chunk_length=4,
                                     lsh_attn_chunk_length=4, num_buckets=2, is_decoder=True,
                                     max_position_embeddings=None)(size),
    "fnet": encoder("fnet", mask=False),
    "squeezebert": encoder("squeezebert", embedding_size=64),
    "convbert": encoder("convbert", embedding_size=32, head_ratio=2, conv_kernel_size=3),
    "rembert": encoder("rembert", input_embedding_size=32, output_embedding_size=32),
    # the Nystrom path (landmarks < sequence) adds a 4-d mask to (landmarks, sequence) scores in transformers
    # 5.24: unmasked; its segment means need the sequence length
    "nystromformer": lambda size: encoder("nystromformer", mask=False, num_landmarks=4,
                                          segment_means_seq_len=size.seq)(size),
    "roformer": encoder("roformer", embedding_size=32),
    "prophetnet": seq2seq("prophetnet", encoder_layers=None, decoder_layers=None, hidden_size=64,
                          encoder_ffn_dim=128, decoder_ffn_dim=128,
                          num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4,
                          num_decoder_attention_heads=4, ngram=2, num_buckets=8, relative_max_distance=16),
    "umt5": seq2seq("umt5", d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8),
    "switch_transformers": seq2seq("switch_transformers", mask=True, d_kv=16, d_ff=128, num_layers=2,
                                   num_decoder_layers=2, num_sparse_encoder_layers=1,
                                   num_sparse_decoder_layers=1, num_heads=4, num_experts=4,
                                   expert_capacity=16, router_jitter_noise=0.01,
                                   relative_attention_num_buckets=8),
    "led": seq2seq("led", attention_window=[8, 8], max_encoder_position_embeddings=512,
                   max_decoder_position_embeddings=512),
    "vit_mae": masked_autoencoder("vit_mae", **_VIT, decoder_hidden_size=32, decoder_num_hidden_layers=1,
                                  decoder_num_attention_heads=2, decoder_intermediate_size=64,
                                  mask_ratio=0.5),
    "dinov2": vision("dinov2", **_VIT, drop_path_rate=0.1, layerscale_value=0.1),
    "data2vec_vision": vision("data2vec-vision", **_VIT, use_relative_position_bias=True, drop_path_rate=0.1),
    "swinv2": vision("swinv2", patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
                     drop_path_rate=0.1),
    "mobilevit": vision("mobilevit", hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                        patch_size=2, num_attention_heads=2),
    # LeViT's patch embedding is 4 stride-2 convolutions: patch_size 16 is what its attention biases assume
    "levit": vision("levit", transformers.LevitForImageClassification, patch_size=16, hidden_sizes=[32, 48],
                    num_attention_heads=[2, 3], depths=[1, 1], key_dim=[8, 8], mlp_ratio=[2, 2],
                    attention_ratio=[2, 2],
                    down_ops=[["Subsample", 8, 2, 4, 2, 2]]),
    # task zoohf37: audio (conv feature extractors, CTC, SpecAugment and LayerDrop randomness, gated
    # relative position bias), vision-language contrastive losses, time series (distribution heads' NLL,
    # lags, ProbSparse attention, series decomposition and autocorrelation, random patch masking), and
    # rotary protein MLM with token dropout, ALiBi, multi-query attention, Perceiver latents, CANINE's
    # hashed characters, ConvNeXtV2's global response norm
    "hubert": ctc("hubert"),
    "wavlm": ctc("wavlm", num_buckets=32, max_bucket_distance=64),
    "speech_to_text": speech_seq2seq("speech_to_text", input_feat_per_channel=16, num_conv_layers=2,
                                     conv_channels=32, conv_kernel_sizes=[5, 5]),
    "siglip": contrastive("siglip", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                     "num_attention_heads": 4}, {**_VIT}),
    "groupvit": contrastive("groupvit", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                         "num_attention_heads": 4},
                            {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                             "patch_size": 8, "depths": [1, 1], "num_group_tokens": [4, 0],
                             "num_output_groups": [4, 4]}, projection_dim=32, projection_intermediate_dim=64),
    "time_series_transformer": forecaster("time_series_transformer",
                                          transformers.TimeSeriesTransformerForPrediction),
    "informer": forecaster("informer", transformers.InformerForPrediction, attention_type="prob",
                           sampling_factor=2, distil=True),
    "autoformer": forecaster("autoformer", transformers.AutoformerForPrediction, moving_average=3,
                             autocorrelation_factor=2),
    "patchtst": patchtst(),
    "esm": encoder("esm", position_embedding_type="rotary", token_dropout=True, mask_token_id=3),
    "biogpt": decoder("biogpt"),
    "mpt": decoder("mpt", "eager", d_model=64, n_heads=4, n_layers=2, expansion_ratio=2,
                   max_seq_len=2 * LONG),
    "gpt_bigcode": decoder("gpt_bigcode", n_embd=64, n_layer=2, n_head=4, n_positions=2 * LONG,
                           multi_query=True),
    "perceiver": perceiver(),
    "canine": canine(),
    "convnextv2": vision("convnextv2", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                         drop_path_rate=0.1),
    # task layerdrop38: the standard HF ASR fine-tuning model, CTC (`labels=`) with its default LayerDrop 0.1
    "wav2vec2": ctc("wav2vec2", own_only=True),
}
#: what ``--size deep`` runs by default: decoders (rotary, parallel attention, MoE, SSM), encoders, seq2seq,
#: a ViT
DEEP = ("gpt_neox", "olmo", "falcon", "mixtral", "qwen2_moe", "mamba", "deberta_v2", "electra", "xlm_roberta",
        "marian", "deit")
DECODERS = ("gpt_neox", "opt", "bloom", "falcon", "phi", "phi3", "gemma", "gemma2", "stablelm", "olmo",
            "gptj", "codegen", "mixtral", "qwen2_moe", "mamba", "rwkv", "mamba2", "jamba", "recurrent_gemma",
            "granite", "cohere", "starcoder2", "qwen3", "persimmon", "dbrx", "olmoe", "xlnet", "biogpt",
            "mpt", "gpt_bigcode")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def plan_at(prof: Any, strategy: str) -> tuple[Any, str]:
    """memviz.plan at `FRACTION`, or at the smallest budget the refusal names (said in the note)."""
    import memviz
    from solvers.result import InfeasibleBudget

    try:
        plan = memviz.plan(prof, FRACTION, strategy=strategy, time_limit=TIME_LIMIT, frontier=False)
        note = ""
    except InfeasibleBudget as err:
        if err.minimum_bytes is None:
            raise
        plan = memviz.plan(prof, err.minimum_bytes, strategy=strategy, time_limit=TIME_LIMIT, frontier=False)
        note = f"0.5 infeasible, at the minimum {err.minimum_bytes / prof.baseline.peak_bytes:.2f}; "
    return plan, f"{note}{plan.strategy}, peak {plan.peak_bytes}, {plan.recomputations} recomputed ops"


def trains_as_eager(original: torch.nn.Module, planned: torch.nn.Module, case: RealCase,
                    loss_fn: Any, unwritten: tuple[str, ...] = ()) -> list[int]:
    """`STEPS` AdamW steps of `planned` against `original` with the same seeds, as the vision sweep checks
    them (`check_unseen_vision.trains_as_eager`: outputs, gradients, parameters and buffers equal, but for
    the output fields `unwritten`); each step's measured peak of `planned` (forward, loss, backward,
    optimizer step: what the plan holds)."""
    from check_unseen_vision import trains_as_eager as checked

    return [peak for _, peak in checked(original, planned, case.args, case.kwargs, loss_fn, unwritten)]


def peak_note(verified: torch.nn.Module, peaks: list[int]) -> str:
    """The measured peaks against the plan the module runs: steps after the first (AdamW's state exists
    from the second step on, as the plan holds it); OVER where a step exceeds the budget."""
    ran = verified.plan
    worst = max(peaks[1:])
    over = " OVER" if ran.budget_bytes is not None and worst > ran.budget_bytes else ""
    return (f"verified {verified.verified_peak_bytes}, steps 2-{STEPS} measured {worst} vs plan "
            f"{ran.peak_bytes} ({(worst - ran.peak_bytes) / ran.peak_bytes:+.2%}, budget {ran.budget_bytes}"
            f"{over})")


@contextlib.contextmanager
def keeping(plan: Any) -> Any:
    """On a failure, the plan written to a temporary file (`tests.test_real_models.reproduction`): plans
    follow measured op times, so a failing one may not come back on the next run."""
    from tests.test_real_models import reproduction

    try:
        yield
    except Exception as exc:
        exc.add_note(reproduction(plan))
        raise


def verified_call(run: Callable[..., torch.nn.Module], case: RealCase) -> tuple[torch.nn.Module, str]:
    """`run()` as a user calls it; where its verifying step cannot run on zeros of the input shapes
    (`VerifyError`), again with the example inputs, as the error asks (the note says so)."""
    from memviz.runtime.verify import VerifyError

    try:
        return run(), ""
    except VerifyError as exc:
        return run(inputs=(case.args, case.kwargs)), f"VerifyError on zeros, verified with inputs= ({exc}); "


def check_exported(case: RealCase, loss_fn: Any, plan: Any) -> str:
    """`memviz.export(plan, verify=True)` against an eager copy (the profiled model itself trains under
    the exported module; its weights are restored after)."""
    import memviz

    saved = copy.deepcopy(case.model.state_dict())
    original = copy.deepcopy(case.model)
    try:
        with keeping(plan):
            exported, note = verified_call(lambda **kw: memviz.export(plan, verify=True, **kw), case)
            peaks = trains_as_eager(original, exported, case, loss_fn)
    finally:
        case.model.load_state_dict(saved)
        for p in case.model.parameters():
            p.grad = None
    return note + peak_note(exported, peaks)


def check_apply(case: RealCase, loss_fn: Any, plan: Any) -> str:
    """`memviz.apply(plan, model, verify=True)` (a checkpointed copy) against an eager copy."""
    import memviz

    with keeping(plan):
        applied, note = verified_call(lambda **kw: memviz.apply(plan, case.model, verify=True, **kw), case)
        # a checkpointed decoder layer writes no KV cache (apply turns it off, as transformers' own
        # gradient checkpointing does): the applied step returns the cache its layers left empty (the
        # field is "cache" or "past_key_values", by transformers version)
        peaks = trains_as_eager(copy.deepcopy(case.model), applied, case, loss_fn,
                                ("cache", "past_key_values"))
    regions = len(applied.plan.solver_stats.extra["sac"]["regions"])
    return f"{note}{regions} regions; {peak_note(applied, peaks)}"


def check_chunk(case: RealCase) -> str:
    import memviz
    from memviz.plans.chunking import MEASURED_SLACK
    from tests.test_chunk_zoo import _measure  # the activations: the peak above the step's start
    from tests.test_real_chunk import _assert_equal  # chunking's contract: 1e-5 (kernels see other shapes)

    assert case.long is not None
    model = case.model.eval()
    args, kwargs = case.long
    try:
        with torch.no_grad():
            ref = model(*args, **kwargs)
        prof = memviz.profile(model, args, kwargs, mode="inference", fallback=False)
        plan, note = plan_at(prof, "autochunk")
        if not plan.chunks:
            return f"no chunk offered {note}"
        chunked = memviz.export(plan)
        peak, out = _measure(chunked, *args, **kwargs)
        _assert_equal(ref, out)
    finally:
        model.train()
    persistent = plan.baseline_graph.persistent_bytes()
    planned = plan.peak_bytes - persistent
    eager = plan.chunking.measured_baseline_bytes
    said = (f"{len(plan.chunks)} chunk regions{', ' + note if note else ''}; activations measured {peak} vs "
            f"plan {planned} ({(peak - planned) / planned:+.2%}; eager {eager})")
    if peak > planned * (1 + MEASURED_SLACK):  # the plan's truth rule: a fail row, not "ok"
        raise AssertionError(f"activations measured OVER the plan by more than {MEASURED_SLACK:.0%}: {said}")
    return said


def run_one(name: str, size: Size) -> None:
    """Every step on `name` at `size`, one JSON row per step on stdout."""
    from check_unseen_vision import activation_share

    import memviz

    def row(step: str, status: str, note: str = "", seconds: float = 0.0) -> None:
        print(json.dumps({"model": name, "step": step, "status": status, "note": note,
                          "seconds": round(seconds, 1)}), flush=True)

    def attempt(step: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - a failing step is a row; later steps may still run
            notes = " ".join(getattr(exc, "__notes__", []))
            row(step, "fail", first_line(exc) + (f" [{notes}]" if notes else ""), time.perf_counter() - t0)
            if os.environ.get("MEMVIZ_SWEEP_TRACE"):
                traceback.print_exc(file=sys.stderr)
            return None
        note = out[1] if isinstance(out, tuple) else out if isinstance(out, str) else ""
        row(step, "ok", note, time.perf_counter() - t0)
        return out

    case = attempt("build", lambda: MODELS[name](size))
    if case is None:
        return
    loss = rotating_loss(case, list(MODELS).index(name))
    loss_fn = case.losses[loss]

    def profiled() -> tuple[Any, str]:
        prof = memviz.profile(case.model, case.args, case.kwargs, loss_fn=loss_fn,
                              optimizer=torch.optim.AdamW, fallback=False)
        return prof, (f"loss {loss}; eager predicted {prof.baseline.peak_bytes}, measured "
                      f"{prof.measured_peak_bytes}; {activation_share(prof, case.model)}")

    prof = attempt("profile", profiled)
    if prof is not None:
        auto = attempt("plan_auto", lambda: plan_at(prof[0], "auto"))
        sac = attempt("plan_sac", lambda: plan_at(prof[0], "sac"))
        if auto is not None:
            attempt("export", lambda: check_exported(case, loss_fn, auto[0]))
        if sac is not None:
            attempt("apply", lambda: check_apply(case, loss_fn, sac[0]))
    if name in DECODERS:
        attempt("chunk", lambda: check_chunk(case))


def sweep(names: list[str], timeout: float, size: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in names:
        cmd = [sys.executable, __file__, "--size", size, "--one", name]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            out, err, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err, code = f"timed out after {timeout:.0f} s", None
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if code != 0:
            last = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
            got.append({"model": name, "step": "process", "status": "fail", "note": last[:200], "seconds": 0})
        for r in got:
            print(f"{r['model']:12} {r['step']:10} {r['status']:4} {r['seconds']:6.1f}s  {r['note']}",
                  flush=True)
        rows.extend(got)
    return rows


STEP_NAMES = ("profile", "plan_auto", "plan_sac", "export", "apply", "chunk")


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per model, one column per step: ok, or the failure's first words; then each note."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    cell = {(r["model"], r["step"]): r for r in rows}
    lines = ["| model | " + " | ".join(STEP_NAMES) + " |", "|---" * (len(STEP_NAMES) + 1) + "|"]
    for m in models:
        failed = cell.get((m, "process"))
        marks = []
        for step in STEP_NAMES:
            r = cell.get((m, step))
            marks.append("-" if r is None and failed is None else "killed" if r is None
                         else "ok" if r["status"] == "ok" else r["note"].split(":")[0])
        lines.append(f"| {m} | " + " | ".join(marks) + " |")
    lines += ["", "Notes per step (peaks in bytes; `plan` is the plan the verified module runs):", ""]
    lines += [f"- {r['model']} {r['step']} ({r['status']}, {r['seconds']} s): {r['note']}"
              for r in rows if r["note"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="tiny",
                        help=f"the inputs' shapes: {SIZES}; deep's default models: {','.join(DEEP)}")
    parser.add_argument("--models", help="comma-separated (default: all at tiny, DEEP at deep), from: "
                        + ",".join(MODELS))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    parser.add_argument("--json", help="write the rows there too")
    parser.add_argument("--markdown", help="write the table there (benchmarks/NOTES_unseen_hf.md)")
    parser.add_argument("--from-json", help="only render --markdown from rows a previous --json wrote")
    parser.add_argument("--no-layerdrop", action="store_true", help="every config's LayerDrop 0 (" +
                        ", ".join(LAYERDROP_KEYS) + ")")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.no_layerdrop:
        os.environ["MEMVIZ_SWEEP_NO_LAYERDROP"] = "1"
    if args.one:
        run_one(args.one, SIZES[args.size])
        return
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())
        Path(args.markdown).write_text(markdown(rows))
        return
    names = [n for n in args.models.split(",") if n] if args.models else \
        list(DEEP if args.size == "deep" else MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    rows = sweep(names, args.timeout, args.size)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))


if __name__ == "__main__":
    main()
