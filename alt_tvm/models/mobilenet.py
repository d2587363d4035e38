"""MobileNet-V2 (width 1.0) in plain PyTorch, following torchvision's ``mobilenet_v2``.

A 3x3/2 stem (32 channels), seventeen inverted-residual blocks (1x1 expansion conv, 3x3
depthwise conv, 1x1 linear projection; a residual connection when stride is 1 and the
channel count is unchanged), a 1x1 conv to 1280 channels, global average pool and a
1000-way classifier. Every conv is followed by BatchNorm; all activations are ReLU6.
The classifier's dropout is an identity in eval mode and is kept for fidelity.
"""

from __future__ import annotations

import torch
from torch import nn

from ._init import calibrate_batchnorm, check_positive, init_weights, seeded_generator

__all__ = ["InvertedResidual", "MobileNetV2", "mobilenet_v2"]

# torchvision's settings: expansion t, output channels c, repeats n, first stride s.
_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
             (6, 320, 1, 1))


def _conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int, *, groups: int = 1,
             relu6: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups,
                  bias=False),
        nn.BatchNorm2d(out_channels),
    ]
    if relu6:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand (1x1, unless t = 1), depthwise 3x3, project (1x1, linear); residual if shapes allow."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = in_channels * expand_ratio
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn(in_channels, hidden, 1, 1))
        layers.append(_conv_bn(hidden, hidden, 3, stride, groups=hidden))
        layers.append(_conv_bn(hidden, out_channels, 1, 1, relu6=False))
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_residual else out


class MobileNetV2(nn.Module):
    """MobileNet-V2, width multiplier 1.0 (channel counts are then already multiples of 8)."""

    def __init__(self, *, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2)]
        in_channels = 32
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(in_channels, c, s if i == 0 else 1, t))
                in_channels = c
        layers.append(_conv_bn(in_channels, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(*, batch: int = 1, seed: int = 0, size: int = 224,
                 num_classes: int = 1000) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MobileNet-V2 in eval mode with seeded weights, and an example ``batch x 3 x size x size`` input.

    Parameters
    ----------
    batch : int
        Batch size of the example input.
    seed : int
        Seed of the weights, the BatchNorm calibration input and the example input.
    size : int
        Image height and width (224 in torchvision; at least 32).
    num_classes : int
        Width of the classifier.

    Returns
    -------
    tuple
        ``(module, (image,))``.
    """
    check_positive("batch", batch)
    if check_positive("size", size) < 32:
        raise ValueError(f"size must be >= 32 for MobileNet-V2 (five stride-2 stages), got {size}")
    gen = seeded_generator(seed)
    model = MobileNetV2(num_classes=check_positive("num_classes", num_classes))
    init_weights(model, gen)
    calibrate_batchnorm(model, (2, 3, 112, 112), gen)
    return model, (torch.randn(batch, 3, size, size, generator=gen),)
