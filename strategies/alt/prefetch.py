"""Software prefetch of the next block of a streamed operand (a TIR rewrite after scheduling).

Inside a model, a conv's or a GEMM's weights were evicted by the kernels before it, so the
first register block to touch each block of them reads it from the last-level cache or
memory, and the FMA units wait: ResNet-50's 512-channel 3x3 conv on a 7x7 map took 0.66 ms in a
chain of two and 1.0 ms in the model. In the conv template's reduction-outer order (one
block of input channels at a time, every spatial tile of the channel tile inside it),
:func:`prefetch_next_block` spreads ``prefetcht1`` hints (to the L2) for block ``b + 1``
over the spatial tiles that use block ``b``, a share per tile and outside the register
block: a prefetch call among the FMAs keeps LLVM from holding the partial sums in
registers (it stored them every step, 2x slower). The GEMM template uses the same rewrite in
its chunked order, a share of the next chunk per row block.

No TIR schedule primitive places a prefetch, so the rewrite maps the scheduled function
with ``tvm_ffi.structural_map`` (a generic IR mapper).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx

__all__ = ["find_realize", "loads_of", "prefetch_next_block", "substitute", "uses_var"]

#: ``llvm.prefetch`` locality: 2 fills the L2 (``prefetcht1`` on x86), leaving the L1 to
#: the block being computed.
L2_LOCALITY = 2
#: Bytes fetched per prefetch (a cache line).
LINE_BYTES = 64


def prefetch_next_block(func: tirx.PrimFunc, *, block: str, buffer: str, outer: tirx.Var,
                        spread: Sequence[tirx.Var], reads: Sequence[tirx.Var], vector: tirx.Var) -> tirx.PrimFunc:
    """Prefetch what block ``block`` reads of ``buffer`` at ``outer + 1``, spread over ``spread``.

    Parameters
    ----------
    func
        The scheduled function (blocks not yet lowered).
    block
        Name of the block whose reads of ``buffer`` are prefetched (a reduction's update block).
    buffer
        Name of the streamed buffer (a function parameter, e.g. the weights).
    outer
        The loop whose next iteration's reads are prefetched: the reduction's outer loop (a
        conv's input channel blocks, a GEMM's ``k`` chunks) or a GEMM's panel loop.
    spread
        The loops, nested in this order inside ``outer``, that revisit one block (the spatial
        tiles). Each of their iterations prefetches its share of the next block's cache lines,
        in the body of the last one, outside the register block (a prefetch call inside it
        keeps LLVM from holding the partial sums in registers).
    reads
        The loops inside ``spread`` that walk one block's reads (the window and the inner
        channel block).
    vector
        The vectorised loop of the read: one prefetch per cache line of its extent.

    Returns
    -------
    tirx.PrimFunc
        ``func`` with the prefetches added.

    Raises
    ------
    ValueError
        When the block, its read of ``buffer``, or one of the loops is missing, when the
        read does not depend on ``outer``, or when a ``spread`` loop indexes ``buffer``.
    """

    if not spread:
        raise ValueError("spread needs at least one loop (the hints go in the body of its last one)")
    realize = find_realize(func.body, block)
    if realize is None:
        raise ValueError(f"no block named {block!r} in the function")
    loads = loads_of(realize.block.body, buffer)
    if not loads:
        raise ValueError(f"block {block!r} reads no buffer named {buffer!r}")
    binding = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
    indices = [substitute(index, binding) for index in loads[0].indices]
    if not any(uses_var(index, outer) for index in indices):
        raise ValueError(f"the read of {buffer!r} in {block!r} does not depend on loop {outer.name}")
    revisiting = [loop.name for loop in spread if any(uses_var(index, loop) for index in indices)]
    if revisiting or any(loop.same_as(outer) for loop in reads):
        raise ValueError(f"spread loops must not index {buffer!r} (got {revisiting}) and reads must not include "
                         f"the outer loop {outer.name}: each spread iteration takes a share of one block")
    extent_of = _loop_extents(func.body, [*spread, *reads, vector])
    lanes = extent_of(vector)
    per_line = max(1, LINE_BYTES * 8 // tvm.DataType(str(loads[0].ty)).bits)
    # Lines of one block, in the order of the read loops, then the spread iterations.
    read_loops = [(loop, extent_of(loop), 1) for loop in reads] + [(vector, lanes, per_line)]
    lines = math.prod(-(-extent // step) for _, extent, step in read_loops)
    iterations = math.prod(extent_of(loop) for loop in spread)
    # Whole shares; the spare lines of the last iterations wrap around to the block's start
    # (unguarded: no condition in the loop body for LLVM to trip on).
    share = -(-lines // iterations)
    index_type = str(outer.ty)
    iteration = tirx.const(0, index_type)
    for loop in spread:
        iteration = iteration * extent_of(loop) + loop
    j = tirx.Var("prefetch_j", index_type)
    line = iteration * share + j
    # In the last block, outer + 1 reads on into the next channel tile's first block (the
    # tiled layouts store them in that order), or past the end for the last tile: a
    # prefetch is a hint and never faults.
    mapping, rest = {outer: outer + 1}, line
    for loop, extent, step in reversed(read_loops):
        count = -(-extent // step)
        mapping[loop] = tirx.floormod(rest, count) * step
        rest = tirx.floordiv(rest, count)
    where = [substitute(index, mapping) for index in indices]
    address = tirx.address_of(tirx.BufferLoad(loads[0].source, where))
    hint = tirx.Evaluate(tirx.call_intrin("void", "tirx.prefetch", address, 0, L2_LOCALITY, 1))
    hints = tirx.For(j, tirx.const(0, index_type), tirx.const(share, index_type), tirx.ForKind.SERIAL, hint)
    at = spread[-1]

    def add_hints(loop: tirx.For) -> tirx.For:
        if not loop.loop_var.same_as(at):
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt([hints, loop.body]),
                        loop.thread_binding, loop.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, add_hints)))


def _loop_extents(body: Any, loops: Sequence[tirx.Var]) -> Any:
    """A function giving the (constant) extent of each of ``loops``."""
    found: list[tuple[tirx.Var, int]] = []

    def visit(loop: tirx.For) -> None:
        if any(loop.loop_var.same_as(var) for var in loops):
            found.append((loop.loop_var, int(loop.extent)))

    tvm_ffi.structural_walk(body, (tirx.For, visit))
    missing = [var.name for var in loops if not any(var.same_as(v) for v, _ in found)]
    if missing:
        raise ValueError(f"loops {missing} are not in the function")
    return lambda var: next(extent for v, extent in found if v.same_as(var))


def find_realize(body: Any, name: str) -> Any:
    """The realize of the block named ``name`` in ``body`` (a statement), or None."""
    found = []

    def visit(node: Any) -> None:
        if isinstance(node, tvm.s_tir.SBlockRealize) and node.block.name_hint == name:
            found.append(node)

    tvm_ffi.structural_walk(body, (tvm.s_tir.SBlockRealize, visit))
    return found[0] if found else None


def loads_of(body: Any, name: str) -> list:
    """The loads of the buffer named ``name`` in ``body``."""
    loads = []
    tvm_ffi.structural_walk(body, (tvm.ir.expr.TensorLoad,
                                   lambda load: loads.append(load) if load.source.name == name else None))
    return loads


def substitute(expr: Any, mapping: dict) -> Any:
    """``expr`` with the variables of ``mapping`` replaced by their values."""
    if not mapping:
        return expr
    return tvm_ffi.structural_map(
        expr, (tvm.ir.expr.Var, lambda var: next((v for k, v in mapping.items() if k.same_as(var)), var)))


def uses_var(expr: Any, var: tirx.Var) -> bool:
    """Whether ``expr`` reads the variable ``var``."""
    used = []
    tvm_ffi.structural_walk(expr, (tvm.ir.expr.Var, lambda v: used.append(True) if v.same_as(var) else None))
    return bool(used)
