"""alt_tvm.strategies: operator strategies, one folder per family.

``base`` is the contract a strategy implements (what it sees of an operator, the context
it lowers a partition in, what it returns), ``registry`` registers and selects them,
``space`` is the tuning-space contract, ``epilogue`` the TE of fusable element-wise ops.
Every sub-package is a family that registers its strategies when imported; the registry
imports them all on first use. See ARCHITECTURE.md.
"""
