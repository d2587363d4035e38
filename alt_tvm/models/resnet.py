"""ResNet-18 and ResNet3D-18 in plain PyTorch, following torchvision's architectures.

* ``resnet18`` is torchvision's ``resnet18``: a 7x7/2 stem, 3x3/2 max pool, four stages of two
  ``BasicBlock`` each (64, 128, 256, 512 channels; stride 2 from the second stage on, with a
  1x1 conv + BN shortcut where the shape changes), global average pool, a 1000-way classifier.
* ``resnet3d_18`` is torchvision's ``video.r3d_18``: the same stages with 3x3x3 convolutions,
  a 3x7x7 stem with stride (1, 2, 2) and no max pool, and a 400-way (Kinetics-400) classifier.

Convolutions have no bias; every one is followed by BatchNorm (eval mode, calibrated running
statistics), which a compiler is expected to fold.
"""

from __future__ import annotations

import torch
from torch import nn

from ._init import calibrate_batchnorm, check_positive, init_weights, seeded_generator

__all__ = ["BasicBlock", "ResNet", "resnet18", "resnet3d_18"]


class BasicBlock(nn.Module):
    """Two 3x3 (or 3x3x3) conv + BN layers with an identity or conv + BN shortcut."""

    def __init__(self, in_channels: int, channels: int, stride: int, *, dims: int = 2) -> None:
        super().__init__()
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        bn = nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d
        self.conv1 = conv(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = bn(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = bn(channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(conv(in_channels, channels, 1, stride=stride, bias=False), bn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with ``BasicBlock`` stages ``[2, 2, 2, 2]`` in 2-D (images) or 3-D (video clips)."""

    def __init__(self, *, dims: int = 2, num_classes: int = 1000, blocks: tuple[int, ...] = (2, 2, 2, 2)) -> None:
        super().__init__()
        if dims not in (2, 3):
            raise ValueError(f"dims must be 2 or 3, got {dims!r}")
        self.dims = dims
        if dims == 2:
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
            self.avgpool: nn.Module = nn.AdaptiveAvgPool2d((1, 1))
        else:
            # r3d_18's BasicStem: no temporal stride and no max pool.
            self.stem = nn.Sequential(
                nn.Conv3d(3, 64, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
                nn.BatchNorm3d(64),
                nn.ReLU(inplace=True),
            )
            self.avgpool = nn.AdaptiveAvgPool3d((1, 1, 1))
        layers = []
        in_channels = 64
        for i, (channels, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(in_channels, channels, stride, dims=dims)]
            stage += [BasicBlock(channels, channels, 1, dims=dims) for _ in range(count - 1)]
            layers.append(nn.Sequential(*stage))
            in_channels = channels
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(*, batch: int = 1, seed: int = 0, size: int = 224,
             num_classes: int = 1000) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet-18 in eval mode with seeded weights, and an example ``batch x 3 x size x size`` input.

    Parameters
    ----------
    batch : int
        Batch size of the example input.
    seed : int
        Seed of the weights, the BatchNorm calibration input and the example input.
    size : int
        Image height and width (224 in torchvision; at least 32 so the last stage is non-empty).
    num_classes : int
        Width of the classifier.

    Returns
    -------
    tuple
        ``(module, (image,))``.
    """
    check_positive("batch", batch)
    if check_positive("size", size) < 32:
        raise ValueError(f"size must be >= 32 for ResNet-18 (five stride-2 stages), got {size}")
    gen = seeded_generator(seed)
    model = ResNet(dims=2, num_classes=check_positive("num_classes", num_classes))
    init_weights(model, gen)
    # Calibrated at a fixed shape, so the weights do not depend on the requested batch/size.
    calibrate_batchnorm(model, (2, 3, 112, 112), gen)
    return model, (torch.randn(batch, 3, size, size, generator=gen),)


def resnet3d_18(*, batch: int = 1, seed: int = 0, frames: int = 16, size: int = 112,
                num_classes: int = 400) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet3D-18 (torchvision ``r3d_18``) in eval mode, and a ``batch x 3 x frames x size x size`` clip.

    Parameters
    ----------
    batch : int
        Batch size of the example input.
    seed : int
        Seed of the weights, the BatchNorm calibration input and the example input.
    frames : int
        Clip length (16 in torchvision's reference setup; any positive value works).
    size : int
        Frame height and width (112 in torchvision; at least 16).
    num_classes : int
        Width of the classifier (400 for Kinetics-400).

    Returns
    -------
    tuple
        ``(module, (clip,))``.
    """
    check_positive("batch", batch)
    check_positive("frames", frames)
    if check_positive("size", size) < 16:
        raise ValueError(f"size must be >= 16 for ResNet3D-18 (four stride-2 stages), got {size}")
    gen = seeded_generator(seed)
    model = ResNet(dims=3, num_classes=check_positive("num_classes", num_classes))
    init_weights(model, gen)
    calibrate_batchnorm(model, (1, 3, 16, 112, 112), gen)
    return model, (torch.randn(batch, 3, frames, size, size, generator=gen),)
