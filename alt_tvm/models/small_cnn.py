"""The small CNN of the quick start: a 1x3x64x64 input through six convolutions.

Architecture (VGG-like; every conv is 3x3 with padding 1, followed by BatchNorm and ReLU)::

    conv  3 -> 16, stride 1    64x64
    conv 16 -> 32, stride 2    32x32
    conv 32 -> 32, stride 1    32x32
    conv 32 -> 64, stride 2    16x16
    conv 64 -> 64, stride 1    16x16
    conv 64 -> 128, stride 2    8x8
    global average pool, linear 128 -> 10

About 35 M multiply-adds (70 MFLOP) per image. Small enough that per-operator call overhead
and untuned kernels dominate, which is where ONNX Runtime and TVM differ most.
BatchNorm is kept as a separate layer (eval mode, calibrated statistics) so that importing
and building the model exercises BN folding.
"""

from __future__ import annotations

import torch
from torch import nn

from ._init import calibrate_batchnorm, check_positive, init_weights, seeded_generator

__all__ = ["SMALL_CNN_LAYERS", "SmallCNN", "small_cnn"]

# (input channels, output channels, stride) of the six convolutions.
SMALL_CNN_LAYERS = ((3, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2))


class SmallCNN(nn.Module):
    """Six conv3x3 + BN + ReLU layers, global average pool, a linear classifier."""

    def __init__(self, *, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for cin, cout, stride in SMALL_CNN_LAYERS:
            layers += [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                       nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(SMALL_CNN_LAYERS[-1][1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1)), 1))


def small_cnn(*, batch: int = 1, seed: int = 0, size: int = 64,
              num_classes: int = 10) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The small CNN in eval mode with seeded weights, and an example ``batch x 3 x size x size`` input.

    Parameters
    ----------
    batch : int
        Batch size of the example input.
    seed : int
        Seed of the weights, the BatchNorm calibration input and the example input.
    size : int
        Image height and width (64 by default; at least 8).
    num_classes : int
        Width of the classifier.

    Returns
    -------
    tuple
        ``(module, (image,))``.
    """
    check_positive("batch", batch)
    if check_positive("size", size) < 8:
        raise ValueError(f"size must be >= 8 for the small CNN (three stride-2 convs), got {size}")
    gen = seeded_generator(seed)
    model = SmallCNN(num_classes=check_positive("num_classes", num_classes))
    init_weights(model, gen)
    calibrate_batchnorm(model, (2, 3, 64, 64), gen)
    return model, (torch.randn(batch, 3, size, size, generator=gen),)
