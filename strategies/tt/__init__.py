"""Tensor-train factorised dense layers (Anthimopoulos et al., "Optimizing Tensor Train
Decomposition in DNNs for RISC-V Architectures Using Design Space Exploration and Compiler
Optimizations", §2, §4): design-space exploration (``dse``), TT-SVD (``decompose``), the
einsum-chain kernels (``einsum``) and the opt-in ``tt_einsum`` build strategy (``strategy``).

Importing the package registers the strategy.
"""

from . import strategy  # noqa: F401  (registration)
