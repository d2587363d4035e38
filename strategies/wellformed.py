"""Scheduled kernels made well-formed for TVM's verifier before they leave a strategy.

``Schedule.loop_partition`` copies the blocks under the partitioned loop into each piece
with the same block iteration variables, and TVM's well-formedness check (run by
``tvm.s_tir.Schedule(func)`` and by passes after a strategy) rejects a variable defined
twice. The code is right, only the naming is not: :func:`fresh_block_vars` gives every
block after the first that defines a variable new ones.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

__all__ = ["fresh_block_vars"]


def fresh_block_vars(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with no block iteration variable defined by two blocks (module doc).

    A block's iteration variables are bound by the block alone (their values are the
    enclosing realize's), so renaming them inside one block changes nothing else; ``func``
    itself is returned when no variable is defined twice.
    """
    seen: set[int] = set()
    renamed = [False]

    def visit(block: s_tir.SBlock) -> s_tir.SBlock:
        clash = [iv.var for iv in block.iter_vars if hash(iv.var) in seen]
        fresh = [(var, tirx.Var(var.name, var.ty)) for var in clash]
        seen.update(hash(iv.var) for iv in block.iter_vars)
        seen.update(hash(new) for _, new in fresh)
        if not fresh:
            return block
        renamed[0] = True
        return tvm_ffi.structural_map(
            block, (tvm.ir.expr.Var, lambda var: next((new for old, new in fresh if old.same_as(var)), var)))

    body = tvm_ffi.structural_map(func.body, (s_tir.SBlock, visit))
    return func.with_body(body) if renamed[0] else func
