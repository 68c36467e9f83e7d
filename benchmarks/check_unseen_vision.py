"""The truth loop on vision models memviz's tests never ran (task zoovis34): does memviz hold on
architectures outsiders bring?

Run: ``nice -n 10 python benchmarks/check_unseen_vision.py [--size deep] [--models a,b] [--timeout S]``.
Each model runs in its own subprocess (``--one NAME``) under a timeout, so a hang or a crash does not stop
the sweep.  Not a test: it prints one row per model and step.

Per model (random init, no downloads; the smallest width / depth the architecture allows, batch 2, 32-75
px, or with ``--size deep`` the `DEEP` table: 112-128 px, batch 8, where activations make most of the
peak; train mode with its dropout / drop-path on and BatchNorm in train mode; a real loss: cross-entropy
over classes or pixels (with label smoothing for some), or MSE; AdamW):

* ``profile``: ``memviz.profile(model, (x,), loss_fn=..., optimizer=torch.optim.AdamW)``;
* ``auto`` / ``sac``: ``memviz.plan(prof, 0.5)`` and ``memviz.plan(prof, 0.5, strategy="sac")`` (at the
  stated minimum when 0.5 is infeasible);
* ``export``: ``memviz.export(plan_auto, verify=True)`` then 3 AdamW steps against the eager original
  with the same seeds: outputs, every gradient, the parameters after each step and every buffer
  (BatchNorm running statistics) equal (float32: 1e-6 relative, `tests/test_zoo.py`'s helpers); the
  measured peak of the last step against the plan's;
* ``apply``: ``memviz.apply(plan_sac, model, verify=True)`` and the same 3-step comparison;
* ``infer`` (models marked so): ``mode="inference"`` profile, plan at 0.5, export, outputs equal under
  no_grad and the measured peak against the plan's.

A row says ``ok`` with the measured peak against the plan's (and the budget), or the exception's type and
first line.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import memviz  # noqa: E402
import tests.real_models  # noqa: E402,F401  (defines torchvision's missing op schemas before its import)
from memviz.profiling.tracker import measure_peak, tensors_of  # noqa: E402
from solvers.result import InfeasibleBudget  # noqa: E402
from tests.test_real_models import _step  # noqa: E402
from tests.test_zoo import Untracked, _assert_same, _assert_tree_same, _fresh  # noqa: E402

STEPS = 3
FRACTION = 0.5
TIME_LIMIT = 30.0  # seconds per plan search: the sweep runs beside other work on a loaded machine
Case = tuple[nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor]]


def _images(size: int, classes: int = 10, seed: int = 0, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g), torch.randint(0, classes, (batch,), generator=g)


def _classifier(model: nn.Module, size: int = 32, loss: str = "ce", classes: int = 10,
                batch: int = 2) -> Case:
    x, labels = _images(size, classes, batch=batch)
    target = torch.randn(batch, classes, generator=torch.Generator().manual_seed(1))

    def ce(out: Any) -> torch.Tensor:
        return F.cross_entropy(out, labels)

    def mse(out: Any) -> torch.Tensor:
        return F.mse_loss(out, target)

    def smooth(out: Any) -> torch.Tensor:
        return F.cross_entropy(out, labels, label_smoothing=0.1)

    return model.train(), (x,), {"ce": ce, "mse": mse, "smooth": smooth}[loss]


def _segmenter(model: nn.Module, size: int = 64, classes: int = 3) -> Case:
    """Pixel-wise cross-entropy over the `"out"` entry of torchvision's dict outputs."""
    x, _ = _images(size, classes)
    mask = torch.randint(0, classes, (2, size, size), generator=torch.Generator().manual_seed(2))
    return model.train(), (x,), lambda out: F.cross_entropy(out["out"], mask)


def _timm(name: str, size: int = 32, loss: str = "ce", batch: int = 2, **kw: Any) -> Case:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, drop_rate=0.1, **kw)
    return _classifier(model, size, loss, batch=batch)


def _tv(name: str, size: int = 32, loss: str = "ce", batch: int = 2, **kw: Any) -> Case:
    import torchvision

    torch.manual_seed(0)
    return _classifier(torchvision.models.get_model(name, num_classes=10, **kw), size, loss, batch=batch)


def densenet(size: int = 32, batch: int = 2) -> Case:
    from torchvision.models.densenet import DenseNet

    torch.manual_seed(0)
    return _classifier(DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, drop_rate=0.1,
                                num_classes=10), size, batch=batch)


def regnet(size: int, batch: int) -> Case:
    """A RegNetY of 8 blocks in 3 stages (its rule from depth, w_0, w_a, w_m and the group width): timm's
    and torchvision's smallest (2.3 M and 4.3 M parameters) are parameter-dominated at 128 px, batch 8."""
    from torchvision.models.regnet import BlockParams, RegNet

    torch.manual_seed(0)
    params = BlockParams.from_init_params(depth=8, w_0=24, w_a=12.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return _classifier(RegNet(params, num_classes=10, stem_width=16), size, "mse", batch=batch)


def densenet_memory_efficient() -> Case:
    """DenseNet's own `memory_efficient=True`: torch.utils.checkpoint inside the user's model."""
    from torchvision.models.densenet import DenseNet

    torch.manual_seed(0)
    return _classifier(DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, drop_rate=0.1,
                                num_classes=10, memory_efficient=True), loss="mse")


def resnext() -> Case:
    from torchvision.models.resnet import Bottleneck, ResNet

    torch.manual_seed(0)
    return _classifier(ResNet(Bottleneck, [1, 1, 1, 1], groups=32, width_per_group=4, num_classes=10))


def wide_resnet() -> Case:
    from torchvision.models.resnet import Bottleneck, ResNet

    torch.manual_seed(0)
    return _classifier(ResNet(Bottleneck, [1, 1, 1, 1], width_per_group=128, num_classes=10), loss="mse")


def vgg_bn() -> Case:
    """vgg11_bn's features; the 4096-wide classifier (100 M parameters) narrowed, its dropout kept."""
    from torchvision.models.vgg import cfgs, make_layers

    torch.manual_seed(0)
    model = nn.Sequential(make_layers(cfgs["A"], batch_norm=True), nn.Flatten(), nn.Linear(512, 64),
                          nn.ReLU(True), nn.Dropout(0.5), nn.Linear(64, 10))
    return _classifier(model)


def maxvit() -> Case:
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    model = MaxVit(input_size=(64, 64), stem_channels=16, partition_size=2, block_channels=[16, 32],
                   block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.1, num_classes=10)
    return _classifier(model, 64, "mse")


def raft() -> Case:
    """Optical flow (grid_sample, a correlation pyramid, a GRU), 2 refinement iterations: MSE on the last
    flow of the list it returns."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.optical_flow.raft_small().train()
    g = torch.Generator().manual_seed(0)
    # the correlation pyramid's 4 levels need feature maps of at least 16 px: 128 px images
    a, b = torch.randn(2, 3, 128, 128, generator=g), torch.randn(2, 3, 128, 128, generator=g)
    target = torch.randn(2, 2, 128, 128, generator=g)

    class TwoIterations(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.raft = model

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            return self.raft(x, y, num_flow_updates=2)

    return TwoIterations().train(), (a, b), lambda flows: F.mse_loss(flows[-1], target)


def convmixer() -> Case:
    from timm.models.convmixer import ConvMixer

    torch.manual_seed(0)
    return _classifier(ConvMixer(dim=32, depth=2, kernel_size=3, patch_size=4, num_classes=10, drop_rate=0.1))


def mixer() -> Case:
    from timm.models.mlp_mixer import MlpMixer

    torch.manual_seed(0)
    return _classifier(MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=32,
                                drop_rate=0.1, drop_path_rate=0.1))


def poolformer() -> Case:
    """poolformer_s12's blocks (pooling token mixer, GroupNorm1, layer scale), one per stage, narrow."""
    from timm.models.metaformer import GroupNorm1, MetaFormer

    torch.manual_seed(0)
    return _classifier(MetaFormer(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), downsample_norm=None,
                                  mlp_act=nn.GELU, mlp_bias=True, norm_layers=GroupNorm1,
                                  layer_scale_init_values=1e-5, res_scale_init_values=None,
                                  use_mlp_head=False, num_classes=10, drop_rate=0.1, drop_path_rate=0.1))


def tresnet() -> Case:
    """TResNet (task zoovis36): space-to-depth stem, in-place activated BatchNorm, anti-aliased
    downsampling; one block per stage at a quarter of tresnet_m's width."""
    from timm.models.tresnet import TResNet

    torch.manual_seed(0)
    return _classifier(TResNet([1, 1, 1, 1], num_classes=10, width_factor=0.25, drop_rate=0.1,
                               drop_path_rate=0.1), 64, "smooth")


def res2net() -> Case:
    """Res2Net's Bottle2neck (hierarchical split-and-add of channel groups), one block per stage, narrow."""
    from timm.models.res2net import Bottle2neck
    from timm.models.resnet import ResNet

    torch.manual_seed(0)
    return _classifier(ResNet(Bottle2neck, (1, 1, 1, 1), num_classes=10, base_width=14, stem_width=16,
                              channels=(16, 32, 64, 128), block_args={"scale": 4}, drop_rate=0.1,
                              drop_path_rate=0.1), loss="mse")


def volo() -> Case:
    """VOLO's outlook attention (unfold / fold of local windows) and class-attention post layers."""
    from timm.models.volo import VOLO

    torch.manual_seed(0)
    return _classifier(VOLO([1, 1, 1, 1], img_size=32, num_classes=10, patch_size=4, stem_hidden_dim=16,
                            embed_dims=[32, 64, 64, 64], num_heads=[1, 2, 2, 2], drop_rate=0.1,
                            drop_path_rate=0.1))


def focalnet() -> Case:
    """FocalNet's focal modulation (gated depthwise contexts, no attention)."""
    from timm.models.focalnet import FocalNet

    torch.manual_seed(0)
    return _classifier(FocalNet(num_classes=10, embed_dim=16, depths=(1, 1, 1, 1), drop_rate=0.1,
                                drop_path_rate=0.1), loss="smooth")


def tnt() -> Case:
    """Transformer in Transformer: an inner transformer over pixels of each patch feeding the outer one."""
    from timm.models.tnt import TNT

    torch.manual_seed(0)
    return _classifier(TNT(img_size=32, patch_size=8, num_classes=10, embed_dim=32, inner_dim=8, depth=2,
                           num_heads_inner=2, num_heads_outer=2, drop_rate=0.1, drop_path_rate=0.1))


def tv_swin_v2() -> Case:
    """torchvision's swin_v2_t blocks (cosine attention, log-spaced continuous position bias MLP)."""
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    torch.manual_seed(0)
    return _classifier(SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], stochastic_depth_prob=0.1,
                                       num_classes=10, block=SwinTransformerBlockV2,
                                       downsample_layer=PatchMergingV2), loss="mse")


def tv_vit() -> Case:
    """torchvision's VisionTransformer (vit_b_16's code) narrowed: nn.MultiheadAttention, dropout 0.1."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return _classifier(VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                                         dropout=0.1, num_classes=10), loss="smooth")


def tv_convnext(size: int = 32, batch: int = 2) -> Case:
    """torchvision's ConvNeXt (convnext_tiny's code) with stochastic depth 0.1, two narrow stages."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(0)
    return _classifier(ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 2)],
                                stochastic_depth_prob=0.1, num_classes=10), size, batch=batch)


def segmentation(name: str) -> Callable[[], Case]:
    def make() -> Case:
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=3)
        return _segmenter(model)

    return make


#: name -> factory; the second element: whether the inference step runs too
MODELS: dict[str, tuple[Callable[[], Case], bool]] = {
    # torchvision
    "tv_densenet": (densenet, True),
    "tv_densenet_memory_efficient": (densenet_memory_efficient, False),
    "tv_regnet_y_400mf": (lambda: _tv("regnet_y_400mf"), False),
    "tv_shufflenet_v2": (lambda: _tv("shufflenet_v2_x0_5", loss="mse"), True),
    "tv_squeezenet": (lambda: _tv("squeezenet1_1"), False),
    "tv_googlenet": (lambda: _tv("googlenet", aux_logits=False, init_weights=True), False),
    "tv_inception_v3": (lambda: _tv("inception_v3", size=75, aux_logits=False, init_weights=True), False),
    "tv_mnasnet": (lambda: _tv("mnasnet0_5", loss="mse"), False),
    "tv_maxvit": (maxvit, True),
    "tv_vgg11_bn": (vgg_bn, False),
    "tv_resnext": (resnext, False),
    "tv_wide_resnet": (wide_resnet, False),
    "tv_deeplabv3": (segmentation("deeplabv3_mobilenet_v3_large"), True),
    "tv_lraspp": (segmentation("lraspp_mobilenet_v3_large"), False),
    "tv_raft_small": (raft, False),
    # timm (drop_rate 0.1, drop_path where the family has it)
    "timm_efficientnet_b0": (lambda: _timm("efficientnet_b0", drop_path_rate=0.1), False),
    "timm_mobilenetv3_small": (lambda: _timm("mobilenetv3_small_050", loss="mse"), True),
    "timm_deit_tiny": (lambda: _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2,
                                     drop_path_rate=0.1), False),
    "timm_beit": (lambda: _timm("beit_base_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32,
                                num_heads=2, drop_path_rate=0.1), True),
    "timm_swin": (lambda: _timm("swin_tiny_patch4_window7_224", img_size=32, window_size=4, embed_dim=16,
                                depths=(2, 2), num_heads=(2, 4), drop_path_rate=0.1, loss="mse"), False),
    "timm_regnetx_002": (lambda: _timm("regnetx_002", drop_path_rate=0.1), False),
    "timm_dla": (lambda: _timm("dla46_c"), False),
    "timm_mixer": (mixer, False),
    "timm_levit": (lambda: _timm("levit_128s", img_size=64, size=64, drop_path_rate=0.1, loss="mse"), False),
    "timm_poolformer": (poolformer, False),
    "timm_coatnet": (lambda: _timm("test_coatnet", img_size=64, size=64, drop_path_rate=0.1), False),
    "timm_maxvit": (lambda: _timm("test_maxvit", img_size=64, size=64, drop_path_rate=0.1, loss="mse"),
                    False),
    "timm_ghostnet": (lambda: _timm("ghostnet_050"), False),
    "timm_rexnet": (lambda: _timm("rexnet_100", drop_path_rate=0.1, loss="mse"), False),
    "timm_nfnet": (lambda: _timm("test_nfnet", drop_path_rate=0.1), True),
    "timm_resnest": (lambda: _timm("resnest14d", drop_path_rate=0.1), False),
    "timm_seresnet": (lambda: _timm("seresnet18", drop_path_rate=0.1, loss="mse"), False),
    "timm_convmixer": (convmixer, False),
    "timm_hrnet": (lambda: _timm("hrnet_w18_small"), False),
    "timm_cait": (lambda: _timm("cait_xxs24_224", img_size=32, patch_size=8, depth=2, drop_path_rate=0.1),
                  False),
    "timm_xcit": (lambda: _timm("xcit_nano_12_p16_224", img_size=32, depth=2, drop_path_rate=0.1), False),
    "timm_edgenext": (lambda: _timm("edgenext_xx_small", drop_path_rate=0.1, loss="mse"), False),
    "timm_byobnet": (lambda: _timm("test_byobnet", drop_path_rate=0.1), False),
    "timm_vit_relpos": (lambda: _timm("test_vit_relpos", img_size=32, drop_path_rate=0.1), False),
    # task zoovis36: 12+ more mechanisms (rope, masked-unit attention, reparameterisable branches, LSTMs,
    # outlook attention, focal modulation, registers, windowed + global attention, ...)
    "tv_mobilenet_v2": (lambda: _tv("mobilenet_v2", width_mult=0.25, loss="smooth"), True),
    "tv_regnet_x": (lambda: _tv("regnet_x_400mf", loss="mse"), False),
    "tv_swin_v2": (tv_swin_v2, False),
    "tv_vit": (tv_vit, True),
    "tv_convnext": (tv_convnext, False),
    "timm_eva": (lambda: _timm("eva02_tiny_patch14_224", img_size=32, patch_size=8, depth=2, embed_dim=32,
                               num_heads=2, drop_path_rate=0.1, loss="smooth"), True),
    "timm_hiera": (lambda: _timm("hiera_tiny_224", 64, img_size=64, embed_dim=16, num_heads=1,
                                 stages=(1, 1, 1, 1), drop_path_rate=0.1), False),
    "timm_fastvit": (lambda: _timm("fastvit_t8", drop_path_rate=0.1, loss="mse"), False),
    "timm_efficientformerv2": (lambda: _timm("efficientformerv2_s0", 64, img_size=64, drop_path_rate=0.1),
                               False),
    "timm_mobilevitv2": (lambda: _timm("mobilevitv2_050", 64, drop_path_rate=0.1, loss="smooth"), False),
    "timm_inception_next": (lambda: _timm("inception_next_atto", drop_path_rate=0.1), False),
    "timm_twins": (lambda: _timm("twins_svt_small", img_size=32, embed_dims=(16, 32, 48, 64),
                                 depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), drop_path_rate=0.1, loss="mse"),
                   False),
    "timm_sequencer": (lambda: _timm("sequencer2d_s", img_size=32, layers=(1, 1, 1, 1),
                                     embed_dims=(32, 48, 64, 64), hidden_sizes=(16, 24, 32, 32),
                                     drop_path_rate=0.1), False),
    "timm_hgnetv2": (lambda: _timm("hgnetv2_b0", drop_path_rate=0.1, loss="mse"), False),
    "timm_vovnet": (lambda: _timm("ese_vovnet19b_slim_dw", drop_path_rate=0.1), False),
    "timm_efficientvit": (lambda: _timm("efficientvit_b0", 64, loss="smooth"), False),
    "timm_davit": (lambda: _timm("davit_tiny", embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1),
                                 num_heads=(1, 2, 2, 4), drop_path_rate=0.1), False),
    "timm_vit_reg": (lambda: _timm("vit_betwixt_patch16_reg4_gap_256", img_size=32, patch_size=8, depth=2,
                                   embed_dim=32, num_heads=2, drop_path_rate=0.1, loss="mse"), False),
    "timm_samvit": (lambda: _timm("samvit_base_patch16", img_size=32, patch_size=8, depth=2, embed_dim=32,
                                  num_heads=2, global_attn_indexes=(1,), window_size=2, drop_path_rate=0.1),
                    False),
    "timm_tresnet": (tresnet, False),
    "timm_res2net": (res2net, False),
    "timm_volo": (volo, False),
    "timm_focalnet": (focalnet, False),
    "timm_tnt": (tnt, False),
    "timm_pit": (lambda: _timm("pit_ti_224", img_size=32, drop_path_rate=0.1), False),
}

#: the activation-dominated size (``--size deep``, task deep35): 112-128 px, batch 8, narrow widths, so that
#: activations, not parameters and AdamW state, make most of the eager peak and a plan at 0.5 recomputes
DEEP_SIZE, DEEP_BATCH = 112, 8
DEEP: dict[str, tuple[Callable[[], Case], bool]] = {
    "resnet": (lambda: _timm("test_resnet", DEEP_SIZE, batch=DEEP_BATCH, drop_path_rate=0.1), False),
    "convnext": (lambda: _timm("test_convnext", DEEP_SIZE, "mse", batch=DEEP_BATCH, drop_path_rate=0.1),
                 False),
    "efficientnet": (lambda: _timm("test_efficientnet", DEEP_SIZE, batch=DEEP_BATCH, drop_path_rate=0.1),
                     False),
    "mobilenetv3": (lambda: _timm("mobilenetv3_small_050", DEEP_SIZE, "mse", batch=DEEP_BATCH), False),
    "swin": (lambda: _timm("swin_tiny_patch4_window7_224", DEEP_SIZE, batch=DEEP_BATCH, img_size=DEEP_SIZE,
                           window_size=7, embed_dim=16, depths=(2, 2), num_heads=(2, 4), drop_path_rate=0.1),
             False),
    "vit": (lambda: _timm("test_vit", DEEP_SIZE, batch=DEEP_BATCH, img_size=DEEP_SIZE, patch_size=8,
                          drop_path_rate=0.1), True),
    "regnet": (lambda: regnet(DEEP_SIZE, DEEP_BATCH), False),
    "densenet": (lambda: densenet(DEEP_SIZE, DEEP_BATCH), True),
    # task zoovis36
    "tv_convnext": (lambda: tv_convnext(DEEP_SIZE, DEEP_BATCH), False),
    "eva": (lambda: _timm("eva02_tiny_patch14_224", DEEP_SIZE, "smooth", batch=DEEP_BATCH, img_size=DEEP_SIZE,
                          patch_size=8, depth=2, embed_dim=32, num_heads=2, drop_path_rate=0.1), True),
    # Hiera's mask units need the token grid (image / 4) divisible by 8: 128 px
    "hiera": (lambda: _timm("hiera_tiny_224", 128, batch=DEEP_BATCH, img_size=128, embed_dim=16, num_heads=1,
                            stages=(1, 1, 1, 1), drop_path_rate=0.1), False),
    "sequencer": (lambda: _timm("sequencer2d_s", DEEP_SIZE, "mse", batch=DEEP_BATCH, img_size=DEEP_SIZE,
                                layers=(1, 1, 1, 1), embed_dims=(32, 48, 64, 64),
                                hidden_sizes=(16, 24, 32, 32), drop_path_rate=0.1), False),
}
SIZES = {"tiny": MODELS, "deep": DEEP}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def activation_share(prof: memviz.Profile, model: nn.Module) -> str:
    """How much of the eager step's predicted peak is neither persistent (parameters, AdamW state, the
    inputs: the graph's data without a producer) nor gradients: what rematerialization can act on."""
    peak = prof.baseline.peak_bytes
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    other = peak - prof.graph.persistent_bytes() - grads
    return f"activations {other / peak:.0%} of the eager peak"


def _plan(prof: memviz.Profile, strategy: str) -> memviz.Plan:
    budget = int(prof.baseline.peak_bytes * FRACTION)
    try:
        return memviz.plan(prof, budget, strategy=strategy, time_limit=TIME_LIMIT)
    except InfeasibleBudget as err:
        if err.minimum_bytes is None:
            raise
        return memviz.plan(prof, err.minimum_bytes, strategy=strategy, time_limit=TIME_LIMIT)


def trains_as_eager(original: nn.Module, candidate: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    loss_fn: Any, unwritten: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """`STEPS` AdamW steps of both from the same seeds: outputs, every gradient, the parameters after each
    step and every buffer (BatchNorm's running statistics) equal.  Returns each step's measured peaks
    (forward, loss, backward and the AdamW step, as the profile planned it; the state exists from the
    second step on) of the original and the candidate.  `unwritten`: output fields left out of the
    comparison (a dataclass output's): the KV cache a layer `memviz.apply` checkpoints does not write, by
    design (`memviz.runtime.apply._without_cache`)."""
    opt_a = torch.optim.AdamW(original.parameters())
    opt_b = torch.optim.AdamW(candidate.parameters())
    peaks = []
    for i in range(STEPS):
        in_a, in_b = _fresh((args, kwargs)), _fresh((args, kwargs))
        eager, out_a = measure_peak(functools.partial(_step, original, loss_fn, opt_a, in_a, i),
                                    tensors_of(original, opt_a, in_a))
        peak, out_b = measure_peak(functools.partial(_step, candidate, loss_fn, opt_b, in_b, i),
                                   tensors_of(candidate, opt_b, in_b))
        peaks.append((eager, peak))
        _assert_tree_same(*(_without(o, unwritten) for o in (out_a, out_b)), f"output, step {i}")
        for (name, pa), pb in zip(original.named_parameters(), candidate.parameters(), strict=True):
            _assert_same(pa.grad, pb.grad, f"grad of {name}, step {i}")
        for (name, ba), bb in zip(original.named_buffers(), candidate.buffers(), strict=True):
            _assert_same(ba, bb, f"buffer {name}, step {i}")
        for opt in (opt_a, opt_b):
            opt.zero_grad()
        for (name, pa), pb in zip(original.named_parameters(), candidate.parameters(), strict=True):
            _assert_same(pa.detach(), pb.detach(), f"{name} after step {i}")
    return peaks


def _without(out: Any, fields: tuple[str, ...]) -> Any:
    """`out` (a step's kept outputs) with `fields` of its dataclass (HF's ``ModelOutput``) set to None."""
    out = Untracked.restored(out)
    if not dataclasses.is_dataclass(out):
        return out
    present = {f.name: None for f in dataclasses.fields(out) if f.name in fields}
    return dataclasses.replace(out, **present) if present else out


def _peak_row(peak: int, plan: memviz.Plan, eager: int | None = None) -> str:
    """The measured peak against the plan's and its budget; with `eager`, the eager AdamW step's
    measured peak against the profile's prediction (the plan's baseline)."""
    mib = 2**20
    over = "" if plan.budget_bytes is None or peak <= plan.budget_bytes else " OVER BUDGET"
    predicted = plan.baseline.peak_bytes
    baseline = ("" if eager is None else f"; eager step measured {eager / mib:.3f} MiB, predicted "
                f"{predicted / mib:.3f} MiB ({(predicted - eager) / eager:+.1%})")
    return (f"ok: measured {peak / mib:.3f} MiB, plan {plan.peak_bytes / mib:.3f} MiB "
            f"({(peak - plan.peak_bytes) / plan.peak_bytes:+.1%}), budget "
            f"{(plan.budget_bytes or 0) / mib:.3f} MiB{over}{baseline}")


def run_one(name: str, emit: Callable[[str, str], None], size: str = "tiny") -> None:
    """Every step of the sweep for model `name` of the `size` table, each row through `emit(step,
    result)`; a step that needs an earlier one's result is skipped when that one failed."""
    factory, inference = SIZES[size][name]
    model, args, loss_fn = factory()
    reference = copy.deepcopy(model)  # the state every step starts from
    try:
        t0 = time.perf_counter()
        prof = memviz.profile(model, args, loss_fn=loss_fn, optimizer=torch.optim.AdamW, repeats=1, warmup=0)
        emit("profile", f"ok: eager peak predicted {prof.baseline.peak_bytes / 2**20:.3f} MiB, "
                        f"{activation_share(prof, model)}, {len(prof.graph.computes)} ops, "
                        f"{time.perf_counter() - t0:.0f} s")
    except Exception as err:  # noqa: BLE001 -- a sweep row reports every failure
        emit("profile", _first_line(err))
        return
    plans: dict[str, memviz.Plan] = {}
    for strategy in ("auto", "sac"):
        try:
            plans[strategy] = _plan(prof, strategy)
            p = plans[strategy]
            emit(strategy, f"ok: {p.strategy}, budget {(p.budget_bytes or 0) / prof.baseline.peak_bytes:.2f} "
                           f"of eager, peak {p.peak_bytes / 2**20:.3f} of eager "
                           f"{prof.baseline.peak_bytes / 2**20:.3f} MiB, {p.recomputations} recomputed ops")
        except Exception as err:  # noqa: BLE001
            emit(strategy, _first_line(err))
    if "auto" in plans:
        try:
            original = copy.deepcopy(reference)
            exported = memviz.export(plans["auto"], verify=True)
            eager, peak = trains_as_eager(original, exported, args, {}, loss_fn)[-1]
            emit("export", _peak_row(peak, exported.plan, eager))
        except Exception as err:  # noqa: BLE001
            emit("export", _first_line(err))
        model.load_state_dict(reference.state_dict())  # the exported module trained the profiled model
    if "sac" in plans:
        try:
            original = copy.deepcopy(reference)
            applied = memviz.apply(plans["sac"], copy.deepcopy(reference), verify=True)
            peak = trains_as_eager(original, applied, args, {}, loss_fn)[-1][1]
            emit("apply", _peak_row(peak, applied.plan))
        except Exception as err:  # noqa: BLE001
            emit("apply", _first_line(err))
    if inference:
        try:
            emit("infer", _inference(reference, args))
        except Exception as err:  # noqa: BLE001
            emit("infer", _first_line(err))


def _inference(reference: nn.Module, args: tuple[Any, ...]) -> str:
    model = copy.deepcopy(reference)
    prof = memviz.profile(model, args, mode="inference", repeats=1, warmup=0)
    plan = _plan(prof, "auto")
    original = copy.deepcopy(reference)
    exported = memviz.export(plan)
    with torch.no_grad():
        torch.manual_seed(0)
        out_a = original(*args)
        torch.manual_seed(0)
        peak, out_b = measure_peak(lambda: exported(*args), tensors_of(exported, args))
    _assert_tree_same(out_a, out_b, "output")
    for (name, ba), bb in zip(original.named_buffers(), exported.buffers(), strict=True):
        _assert_same(ba, bb, f"buffer {name}")
    return _peak_row(peak, plan)


def sweep(names: list[str], timeout: float, size: str = "tiny") -> None:
    print("| model | step | result |\n|---|---|---|", flush=True)
    for name in names:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--size", size, "--one", name],
                                  capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
                rows.append({"step": "process", "result": f"exit {proc.returncode}: {tail[:300]}"})
        except subprocess.TimeoutExpired as err:
            out = (err.stdout or b"").decode()
            rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            rows.append({"step": "process", "result": f"timeout after {timeout:.0f} s"})
        for row in rows:
            print(f"| {name} | {row['step']} | {row['result']} |", flush=True)
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f} s -->", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="tiny",
                        help="tiny: the smallest sizes (parameters dominate); deep: " + ", ".join(DEEP)
                        + f" at {DEEP_SIZE} px and more, batch {DEEP_BATCH} (activations dominate)")
    parser.add_argument("--models", help="comma-separated names (default: all of the size's table): "
                        + ", ".join(MODELS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the per-model subprocess
    opts = parser.parse_args()
    table = SIZES[opts.size]
    if opts.one:
        torch.set_num_threads(1)
        run_one(opts.one, lambda step, result: print(json.dumps({"step": step, "result": result}),
                                                     flush=True), opts.size)
        return
    names = opts.models.split(",") if opts.models else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown models {unknown}; known at --size {opts.size}: {', '.join(table)}")
    sweep(names, opts.timeout, opts.size)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
