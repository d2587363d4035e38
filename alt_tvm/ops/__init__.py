"""Complex and element-wise operators written once in TE, in canonical (PyTorch) layouts.

Every function returns a ``te.Tensor`` whose producing compute carries a ``tag`` (``"conv2d"``,
``"dense"``, ``"elemwise"``, ``"broadcast"``, ``"pad"`` ...) and, for complex operators, attrs
describing the workload. Layout primitives (:mod:`alt_tvm.layout`) rewrite these computes
before ``te.create_prim_func``.
"""

# The layout-conversion operator lives with the layout machinery it is built from.
from alt_tvm.layout.rewrite import convert_layout  # noqa: E402

from .conv import conv, conv1d, conv2d, conv3d, window_index
from .conv_transpose import (
    conv_transpose,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
)
from .elementwise import (
    add,
    bias_add,
    clip,
    divide,
    erf_expr,
    erf_gelu,
    exp_expr,
    identity,
    maximum,
    minimum,
    multiply,
    relu,
    sigmoid,
    sigmoid_expr,
    subtract,
    tanh,
    tanh_expr,
    tanh_gelu,
)
from .gemm import batch_matmul, dense, matmul
from .pad import pad, reached_padding_after
from .reduce import max_pool, reduce_max, reduce_min

__all__ = [
    "tanh_gelu",
    "erf_gelu",
    "erf_expr",
    "exp_expr",
    "sigmoid_expr",
    "tanh_expr",
    "tanh",
    "minimum",
    "maximum",
    "divide",
    "add",
    "batch_matmul",
    "bias_add",
    "clip",
    "conv",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convert_layout",
    "dense",
    "identity",
    "matmul",
    "max_pool",
    "multiply",
    "pad",
    "reached_padding_after",
    "reduce_max",
    "reduce_min",
    "relu",
    "sigmoid",
    "subtract",
    "window_index",
]
