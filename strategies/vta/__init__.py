"""Convolutions and dense layers on a VTA GEMM intrinsic (Rieber et al., "Joint Program and
Layout Transformations to enable Convolutional Operators on Specialized Hardware based on
Constraint Programming", §3-§6): NumPy-level entry points (``gemm``) and the ``vta_gemm``
build strategy for the ``vta`` board (``strategy``); the mapping itself is
:mod:`alt_tvm.vta_mapping`.

Importing the package registers the strategy.
"""

from . import strategy  # noqa: F401  (registration)
