"""The ALT templates (ALT paper §5.1): tiled-layout conv and GEMM strategies, CPU and CUDA.

Importing the package registers its strategies (all named ``alt``).
"""

from . import batch_matmul, conv, conv_cuda, gemm, rows  # noqa: F401  (registration)
