"""The arithmetic a model's convolutions and matrix products must do: one rule for every report.

A kernel's rate is read against the FMA peak, so its FLOPs are the multiply-adds of the
operators it covers (2 FLOPs each, as a direct convolution computes them), not the
instructions it executes. TVM's ``estimate_tir_flops`` counts the latter: a polynomial
``exp`` in a SiLU epilogue (about 180 operations per element) makes EfficientNet-B0's first
expand conv read 485% of the peak, and the transforms and NaN guard of a Winograd conv read
as work. Element-wise epilogues are left out (they are memory work); Winograd and other fast
algorithms do fewer multiplications than counted here, so they can read above 100%.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["conv_flops", "matmul_flops", "relax_flops"]


def conv_flops(*, output_shape: Sequence[int], weight_shape: Sequence[int], out_channels_axis: int = 0) -> int:
    """FLOPs of a convolution: every output element times its window (input channels per
    group times kernel taps), two per multiply-add.

    ``weight_shape`` is the kernel in any layout; ``out_channels_axis`` is where its output
    channels are (0 for ``OIHW``), so the window is the weight's size over that extent.
    """
    out_channels = int(weight_shape[out_channels_axis])
    if out_channels < 1:
        raise ValueError(f"a conv weight needs output channels, got weight shape {tuple(weight_shape)}")
    return 2 * math.prod(int(d) for d in output_shape) * (math.prod(int(d) for d in weight_shape) // out_channels)


def matmul_flops(*, output_shape: Sequence[int], reduction: int) -> int:
    """FLOPs of a (batched) matrix product: every output element is a ``reduction``-long dot product."""
    return 2 * math.prod(int(d) for d in output_shape) * int(reduction)


def relax_flops(bindings: Iterable[Any]) -> int | None:
    """FLOPs of the ``relax.nn.conv2d`` and ``relax.matmul`` calls among Relax ``bindings``
    (static shapes), or None when there are none (or a shape is not static)."""
    import tvm
    from tvm import relax

    from alt_tvm.strategies.base import static_shape

    total, counted = 0, False
    for binding in bindings:
        call = binding.value
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            continue
        name = call.op.name
        if name not in ("relax.nn.conv2d", "relax.matmul"):
            continue
        out, data, weight = (static_shape(x) for x in (call, call.args[0], call.args[1]))
        if out is None or data is None or weight is None:
            return None
        if name == "relax.nn.conv2d":
            layout = str(call.attrs.kernel_layout)
            total += conv_flops(output_shape=out, weight_shape=weight, out_channels_axis=layout.index("O"))
        else:
            total += matmul_flops(output_shape=out, reduction=data[-1])
        counted = True
    return total if counted else None
