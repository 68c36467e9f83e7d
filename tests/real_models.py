"""Models users bring, built from the real libraries (transformers, torchvision, timm) from small
random-init configs: no downloads.  `test_real_models.py` and `benchmarks/bench_real.py` run them.

Every factory returns a `RealCase`: the model (dropout on, train mode), its inputs, the losses a user
trains it with (the model's own ``labels=`` loss and user losses: cross-entropy with
``ignore_index=-100``, label smoothing, MSE), and, for language models, a long-sequence inference input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F


def _define_torchvision_ops() -> None:
    """torchvision 0.28 is served only as a CUDA build: its C ops do not load beside the CPU torch, and
    its import fails registering fake kernels for ops that do not exist.  Define their schemas first
    (the classification models never call them).  transformers imports torchvision, so this runs at
    import, before either."""
    if hasattr(torch.ops.torchvision, "nms"):
        return
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # defined already (the real ops loaded)
        return
    _LIBS.append(lib)


_LIBS: list[Any] = []  # a Library unregisters its ops when collected
_define_torchvision_ops()

import timm  # noqa: E402
import torchvision  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()

Loss = Callable[[Any], torch.Tensor]


@dataclass
class RealCase:
    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    losses: dict[str, Loss] = field(default_factory=dict)
    # a long-sequence inference call (args, kwargs) for language models; None otherwise
    long: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    library: str = ""


def _own_loss(out: Any) -> torch.Tensor:
    return out.loss


def _lm_losses(labels: torch.Tensor, vocab: int, *, shift: bool) -> dict[str, Loss]:
    """The model's own `labels=` loss and user cross-entropies over the logits (next-token targets
    when `shift`), with -100 marking ignored positions as in HF's data collators."""
    target = labels[:, 1:] if shift else labels

    def logits(out: Any) -> torch.Tensor:
        lg = out.logits
        return (lg[:, :-1] if shift else lg).reshape(-1, vocab)

    return {
        "own": _own_loss,
        "ce": lambda out: F.cross_entropy(logits(out), target.reshape(-1), ignore_index=-100),
        "ce_smooth": lambda out: F.cross_entropy(logits(out), target.reshape(-1), ignore_index=-100,
                                                 label_smoothing=0.1),
    }


def _tokens(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[:, : seq // 4] = -100  # a masked prompt, as collators produce
    return ids, labels


# --- transformers: decoders ------------------------------------------------------------------------------
VOCAB = 96


def _causal_lm(config: Any, attn: str = "sdpa", seq: int = 16, long_seq: int = 1024,
               batch: int = 2) -> RealCase:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn).train()
    ids, labels = _tokens(batch, seq, VOCAB)
    losses = _lm_losses(labels, VOCAB, shift=True)
    long_ids, _ = _tokens(1, long_seq, VOCAB, seed=1)
    return RealCase(model, (ids,), {"labels": labels}, losses, ((long_ids,), {}), "transformers")


def gpt2(attn: str = "sdpa") -> RealCase:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=4096, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return _causal_lm(cfg, attn)


def llama() -> RealCase:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=2048, attention_dropout=0.1)
    return _causal_lm(cfg)


def mistral() -> RealCase:
    cfg = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=2048, sliding_window=8, attention_dropout=0.1)
    return _causal_lm(cfg)


def qwen2() -> RealCase:
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=2048, attention_dropout=0.1)
    return _causal_lm(cfg)


# --- transformers: encoders ------------------------------------------------------------------------------
def _masked_lm(config: Any, cls: Any, batch: int = 2, seq: int = 16) -> RealCase:
    torch.manual_seed(0)
    model = cls(config).train()
    ids, labels = _tokens(batch, seq, VOCAB)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # a padded second sequence
    return RealCase(model, (ids,), {"attention_mask": mask, "labels": labels},
                    _lm_losses(labels, VOCAB, shift=False), None, "transformers")


def bert() -> RealCase:
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    return _masked_lm(cfg, transformers.BertForMaskedLM)


def roberta() -> RealCase:
    cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                     pad_token_id=1)
    return _masked_lm(cfg, transformers.RobertaForMaskedLM)


def distilbert() -> RealCase:
    cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                        max_position_embeddings=64)
    return _masked_lm(cfg, transformers.DistilBertForMaskedLM)


# --- transformers: encoder-decoders ----------------------------------------------------------------------
def _seq2seq(config: Any, cls: Any, batch: int = 2, source: int = 12, target: int = 8) -> RealCase:
    torch.manual_seed(0)
    model = cls(config).train()
    ids, _ = _tokens(batch, source, VOCAB)
    _, labels = _tokens(batch, target, VOCAB, seed=2)
    return RealCase(model, (ids,), {"labels": labels}, _lm_losses(labels, VOCAB, shift=False), None,
                    "transformers")


def t5() -> RealCase:
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0)
    return _seq2seq(cfg, transformers.T5ForConditionalGeneration)


def bart() -> RealCase:
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64)
    return _seq2seq(cfg, transformers.BartForConditionalGeneration)


def whisper() -> RealCase:
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2,
                                     decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
                                     max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                                     dropout=0.1)
    model = transformers.WhisperForConditionalGeneration(cfg).train()
    feats = torch.randn(2, 8, 32)  # (batch, mel bins, 2 x max_source_positions frames)
    _, labels = _tokens(2, 8, VOCAB, seed=2)
    return RealCase(model, (feats,), {"labels": labels}, _lm_losses(labels, VOCAB, shift=False), None,
                    "transformers")


# --- transformers: audio and vision ----------------------------------------------------------------------
def wav2vec2() -> RealCase:
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(vocab_size=16, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
                                      conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=2, mask_time_prob=0.0,
                                      hidden_dropout=0.1, ctc_loss_reduction="mean", pad_token_id=0,
                                      # LayerDrop off: the zoo's contract exports every model, and
                                      # memviz.export (one fixed graph) refuses a model that skips layers
                                      # on random draws; with it on, apply holds (tests/test_layerdrop.py)
                                      layerdrop=0.0)
    model = transformers.Wav2Vec2ForCTC(cfg).train()
    audio = torch.randn(2, 400)
    labels = torch.randint(1, 16, (2, 6))
    losses: dict[str, Loss] = {"own": _own_loss,
                               "mse": lambda out: F.mse_loss(out.logits, torch.zeros_like(out.logits))}
    return RealCase(model, (audio,), {"labels": labels}, losses, None, "transformers")


def _image_classifier(model: torch.nn.Module, size: int, classes: int, library: str, own: bool,
                      batch: int = 2) -> RealCase:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=g)
    labels = torch.randint(0, classes, (batch,), generator=g)
    target = torch.randn(batch, classes, generator=g)

    def logits(out: Any) -> torch.Tensor:
        return out.logits if hasattr(out, "logits") else out

    losses: dict[str, Loss] = {
        "ce": lambda out: F.cross_entropy(logits(out), labels),
        "ce_smooth": lambda out: F.cross_entropy(logits(out), labels, label_smoothing=0.1),
        "mse": lambda out: F.mse_loss(logits(out), target),
    }
    kwargs: dict[str, Any] = {}
    if own:
        losses = {"own": _own_loss, **losses}
        kwargs = {"labels": labels}
    return RealCase(model.train(), (images,), kwargs, losses, None, library)


def hf_vit() -> RealCase:
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, num_labels=10,
                                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return _image_classifier(transformers.ViTForImageClassification(cfg), 32, 10, "transformers", own=True)


def clip() -> RealCase:
    torch.manual_seed(0)
    text = transformers.CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=16,
                                       dropout=0.1)
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=32, patch_size=8, dropout=0.1)
    cfg = transformers.CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                  projection_dim=16)
    model = transformers.CLIPModel(cfg).train()
    ids, _ = _tokens(2, 12, VOCAB)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    diag = torch.arange(2)
    return RealCase(model, (), {"input_ids": ids, "pixel_values": images, "return_loss": True},
                    {"own": _own_loss,
                     "ce": lambda out: F.cross_entropy(out.logits_per_image, diag, label_smoothing=0.1)},
                    None, "transformers")


# --- torchvision -----------------------------------------------------------------------------------------
def tv_resnet() -> RealCase:
    torch.manual_seed(0)
    from torchvision.models.resnet import BasicBlock, ResNet

    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    return _image_classifier(model, 32, 10, "torchvision", own=False)


def tv_mobilenet_v3() -> RealCase:
    torch.manual_seed(0)
    return _image_classifier(torchvision.models.mobilenet_v3_small(num_classes=10, width_mult=0.25), 32, 10,
                             "torchvision", own=False)


def tv_efficientnet() -> RealCase:
    torch.manual_seed(0)
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    model = EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=10, last_channel=last)
    return _image_classifier(model, 32, 10, "torchvision", own=False)


def tv_vit() -> RealCase:
    torch.manual_seed(0)
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                              mlp_dim=64, dropout=0.1, attention_dropout=0.1, num_classes=10)
    return _image_classifier(model, 32, 10, "torchvision", own=False)


def tv_swin() -> RealCase:
    torch.manual_seed(0)
    from torchvision.models.swin_transformer import SwinTransformer

    model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                            window_size=[4, 4], stochastic_depth_prob=0.1, dropout=0.1, num_classes=10)
    return _image_classifier(model, 32, 10, "torchvision", own=False)


def tv_convnext() -> RealCase:
    torch.manual_seed(0)
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    model = ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], stochastic_depth_prob=0.1,
                     num_classes=10)
    return _image_classifier(model, 32, 10, "torchvision", own=False)


# --- timm (drop_path on) ---------------------------------------------------------------------------------
def _timm(name: str, **kw: Any) -> RealCase:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, drop_rate=0.1, drop_path_rate=0.1, **kw)
    return _image_classifier(model, 32, 10, "timm", own=False)


def timm_vit() -> RealCase:
    return _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2)


def timm_convnext() -> RealCase:
    return _timm("convnext_atto", depths=(1, 1, 1, 1), dims=(16, 24, 32, 48))


def timm_resnet() -> RealCase:
    return _timm("resnet10t")


REAL: dict[str, Callable[[], RealCase]] = {
    "gpt2_eager": lambda: gpt2("eager"), "gpt2_sdpa": lambda: gpt2("sdpa"),
    "bert": bert, "roberta": roberta, "distilbert": distilbert,
    "llama": llama, "mistral": mistral, "qwen2": qwen2,
    "t5": t5, "bart": bart, "whisper": whisper, "wav2vec2": wav2vec2, "hf_vit": hf_vit, "clip": clip,
    "tv_resnet": tv_resnet, "tv_mobilenet_v3": tv_mobilenet_v3, "tv_efficientnet": tv_efficientnet,
    "tv_vit": tv_vit, "tv_swin": tv_swin, "tv_convnext": tv_convnext,
    "timm_vit": timm_vit, "timm_convnext": timm_convnext, "timm_resnet": timm_resnet,
}
#: the losses the real-model tests and benchmark rotate through, one per model
LOSSES = ("own", "ce", "ce_smooth", "mse")


def rotating_loss(case: RealCase, index: int) -> str:
    """The loss for the zoo's model at `index`: the rotation's pick, or the next one the model offers."""
    for k in range(len(LOSSES)):
        name = LOSSES[(index + k) % len(LOSSES)]
        if name in case.losses:
            return name
    raise ValueError(f"no loss among {LOSSES}: {sorted(case.losses)}")


# the decoders whose long-sequence inference autochunk plans
LANGUAGE_MODELS = ("gpt2_sdpa", "llama", "mistral", "qwen2")
