"""Models of the published memory-planning tables, defined here so the benchmarks need no torchvision.

* `VGG19`: Simonyan & Zisserman, ICLR 2015, configuration "E" (16 conv 3x3 layers in five stages of
  2, 2, 4, 4, 4 with 64..512 channels, 2x2 max pooling, three fully connected layers 4096-4096-1000),
  the network of Checkmate's batch-size evaluation (Jain et al., MLSys 2020) at 224x224.  As in
  torchvision: ReLU in place, dropout 0.5 between the classifier layers, adaptive 7x7 average pool.
* `MegatronLayer` (defined in examples/models.py, where the analytic tests use it too): the pre-LN
  GPT layer of Korthikanti et al. (MLSys 2023) Fig. 2, whose stored activations Sec. 4.1 counts.
"""

from __future__ import annotations

import torch
from torch import nn

#: VGG19's conv channels per stage ("E" in Table 1 of the VGG paper); "M" is a 2x2 max pool.
VGG19_CFG: tuple[int | str, ...] = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    512,
    "M",
)


class VGG19(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for v in VGG19_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c_in, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                c_in = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg19(batch: int, image: int = 224, device: str = "meta") -> tuple[nn.Module, tuple[torch.Tensor]]:
    """VGG19 and an image batch; on the meta device by default (for ``device="fake:<target>"``
    profiles: no real memory, so paper-sized batches cost nothing)."""
    with torch.device(device):
        model = VGG19()
        return model, (torch.randn(batch, 3, image, image),)
