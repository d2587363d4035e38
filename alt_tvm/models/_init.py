"""Deterministic weight initialisation shared by the reference models.

Every parameter and buffer is drawn from one ``torch.Generator`` seeded explicitly, so a model
is a pure function of its architecture and its seed (nothing depends on torch's global RNG).
BatchNorm running statistics are *calibrated*: one forward pass in training mode with
cumulative averaging on a seeded random input. This gives non-trivial means and variances
(so BN folding is really exercised) that still keep activations of order one through a deep
network, which keeps absolute tolerances like 1e-4 meaningful when outputs are compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def init_weights(module: nn.Module, generator: torch.Generator) -> None:
    """Fill every parameter of ``module`` from ``generator``, in module registration order.

    Convolutions get He-normal weights (the networks use ReLU), linear layers and embeddings
    ``N(0, 1/fan_in)`` resp. ``N(0, 1)``, biases small uniform values, and normalisation layers
    scales in ``[0.5, 1.5]`` and shifts in ``[-0.2, 0.2]`` (so neither folds to the identity).
    """
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, _CONV):
                fan_in = sub.weight[0].numel()
                sub.weight.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)
                if sub.bias is not None:
                    sub.bias.uniform_(-0.1, 0.1, generator=generator)
            elif isinstance(sub, nn.Linear):
                sub.weight.normal_(0.0, 1.0 / math.sqrt(sub.in_features), generator=generator)
                if sub.bias is not None:
                    sub.bias.uniform_(-0.1, 0.1, generator=generator)
            elif isinstance(sub, nn.Embedding):
                sub.weight.normal_(0.0, 1.0, generator=generator)
            elif isinstance(sub, (*_BN, nn.LayerNorm)):
                if sub.weight is not None:
                    sub.weight.uniform_(0.5, 1.5, generator=generator)
                if sub.bias is not None:
                    sub.bias.uniform_(-0.2, 0.2, generator=generator)
                if isinstance(sub, _BN):
                    # Placeholder statistics, replaced by calibrate_batchnorm when it runs.
                    sub.running_mean.normal_(0.0, 0.1, generator=generator)
                    sub.running_var.uniform_(0.5, 1.5, generator=generator)


def calibrate_batchnorm(module: nn.Module, input_shape: Sequence[int], generator: torch.Generator) -> None:
    """Set BatchNorm running statistics from one training-mode pass on ``N(0, 1)`` input.

    ``momentum=None`` makes the running statistics the exact batch statistics of that pass.
    The module is left in eval mode.
    """
    bns = [m for m in module.modules() if isinstance(m, _BN)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    module.train()
    with torch.no_grad():
        module(torch.randn(*input_shape, generator=generator))
    for m, momentum in zip(bns, saved):
        m.momentum = momentum
    module.eval()


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (validated: a non-negative int)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return torch.Generator().manual_seed(seed)


def check_positive(name: str, value: int) -> int:
    """Return ``value`` if it is a positive int, else raise ``ValueError`` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value
