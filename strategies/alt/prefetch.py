"""Software prefetch of the next block or tile of a streamed operand (a TIR rewrite after scheduling).

Inside a model, a conv's or a GEMM's weights were evicted by the kernels before it, so the
first register block to touch each block of them reads it from the last-level cache or
memory, and the FMA units wait: ResNet-50's 512-channel 3x3 conv on a 7x7 map takes 0.66 ms in a
chain of two and 1.0 ms in the model. In the conv template's reduction-outer order (one
block of input channels at a time, every spatial tile of the channel tile inside it),
:func:`prefetch_next_block` spreads ``prefetcht1`` hints (to the L2) for block ``b + 1``
over the spatial tiles that use block ``b``, a share per tile and outside the register
block: a prefetch call among the FMAs keeps LLVM from holding the partial sums in
registers (it stores them every step, 2x slower). The GEMM template uses the same rewrite in
its chunked order, a share of the next chunk per row block.

A dense conv's input tile is the other streamed operand: :func:`prefetch_next_tile` fetches
the next parallel task's tile while the current one computes.

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
from tvm.sym import Analyzer, detect_linear_equation

from alt_tvm.tir import substitute, uses_var

__all__ = ["find_realize", "loads_of", "prefetch_next_block", "prefetch_next_tile"]

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

    load, indices = _read(func, block=block, buffer=buffer, spread=spread)
    if not any(uses_var(index, outer) for index in indices):
        raise ValueError(f"the read of {buffer!r} in {block!r} does not depend on loop {outer.name}")
    revisiting = [loop.name for loop in spread if any(uses_var(index, loop) for index in indices)]
    if revisiting or any(loop.same_as(outer) for loop in reads):
        raise ValueError(f"spread loops must not index {buffer!r} (got {revisiting}) and reads must not include "
                         f"the outer loop {outer.name}: each spread iteration takes a share of one block")
    extent_of = _loop_extents(func.body, [*spread, *reads, vector])
    per_line = _per_line(load)
    # A vector shorter than a line that the innermost read loop continues contiguously (a GEMM
    # panel row of two AVX2 vectors) is one run: one hint per line of it, not per vector. The
    # merged loop then stays at 0 and the vector's index walks the run.
    reads, run, merged = list(reads), extent_of(vector), {}
    while reads and run < per_line and _continues(indices, reads[-1], vector, run, extent_of(reads[-1])):
        merged[reads[-1]] = tirx.const(0, str(reads[-1].ty))
        run *= extent_of(reads.pop())
    # Lines of one block, in the order of the read loops, then the spread iterations.
    read_loops = [(loop, extent_of(loop), 1) for loop in reads] + [(vector, run, per_line)]
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
    mapping, rest = {outer: outer + 1, **merged}, line
    for loop, extent, step in reversed(read_loops):
        count = -(-extent // step)
        mapping[loop] = tirx.floormod(rest, count) * step
        rest = tirx.floordiv(rest, count)
    where = [substitute(index, mapping) for index in indices]
    address = tirx.address_of(tirx.BufferLoad(load.source, where))
    hints = tirx.For(j, tirx.const(0, index_type), tirx.const(share, index_type), tirx.ForKind.SERIAL, _hint(address))
    return _insert_at(func, spread[-1], hints)


def prefetch_next_tile(func: tirx.PrimFunc, *, block: str, buffer: str, outer: tirx.Var,
                       spread: Sequence[tirx.Var]) -> tirx.PrimFunc:
    """Prefetch the tile of ``buffer`` that ``block`` reads at ``outer + 1``, spread over ``spread``.

    For an operand stored in tiles whose tile per iteration of ``outer`` (a parallel task) is
    one contiguous run: a conv's input in the conv template's tiled layouts (ALT paper §5.1),
    whose tasks are the output's spatial tiles. Inside a model a task's input tile comes from the
    L3 cache or memory, read a few positions at a time across channel blocks, an order the
    hardware prefetchers do not follow. The run of the next task, from its first element
    (every loop inside ``outer`` at 0) on for one task's step (measured between the middle two
    tasks: at the map's edges a clamped read steps less), is fetched to the L2, a share of its
    cache lines in the body of each iteration of ``spread``. The last task's hints point past
    the buffer: a prefetch is a hint and never faults.

    Parameters
    ----------
    func
        The scheduled function (blocks not yet lowered).
    block
        Name of the block that reads the tile (a reduction's update block).
    buffer
        Name of the tiled buffer (a parameter or a buffer the function fills first).
    outer
        The parallel task loop.
    spread
        Loops nested in this order inside ``outer`` (outside the register block); each
        iteration of the last one takes its share of the lines.

    Returns
    -------
    tirx.PrimFunc
        ``func`` with the prefetches added.

    Raises
    ------
    ValueError
        When the block, its read of ``buffer`` or a loop is missing, or when the middle two
        tasks' tiles do not start a positive constant step apart (the tasks share a tile).
    """
    load, indices = _read(func, block=block, buffer=buffer, spread=spread)
    outer_loop = []
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda loop: outer_loop.append(loop)
                                        if loop.loop_var.same_as(outer) else None))
    if not outer_loop:
        raise ValueError(f"loop {outer.name} is not in the function")
    inner: list[tirx.Var] = []
    tvm_ffi.structural_walk(outer_loop[0].body, (tirx.For, lambda loop: inner.append(loop.loop_var)))
    tile_start = {var: tirx.const(0, str(var.ty)) for var in inner}
    shape = [int(extent) for extent in load.source.shape]
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    index_type = str(outer.ty)

    def first_element(task: Any) -> Any:  # the flat offset of a task's tile
        where = [substitute(substitute(index, tile_start), {outer: task}) for index in indices]
        return sum((tirx.Cast(index_type, index) * stride for index, stride in zip(where, strides)),
                   tirx.const(0, index_type))

    analyzer = Analyzer()
    # The step between the middle two tasks: at the edges a clamped or padded read may step less.
    middle = tirx.const(int(outer_loop[0].extent) // 2, index_type)
    step = analyzer.simplify(first_element(middle + 1) - first_element(middle))
    if not isinstance(step, tirx.IntImm) or int(step) <= 0:
        raise ValueError(f"the tiles of {buffer!r} that consecutive iterations of {outer.name} read are not a "
                         f"step apart (step {step}): no run to prefetch")
    per_line = _per_line(load)
    extent_of = _loop_extents(func.body, spread)
    lines_per_tile = -(-int(step) // per_line)
    share = -(-lines_per_tile // math.prod(extent_of(loop) for loop in spread))
    iteration = tirx.const(0, index_type)
    for loop in spread:
        iteration = iteration * extent_of(loop) + loop
    j = tirx.Var("prefetch_j", index_type)
    # The lines through a flat view of the same memory: one multiply-add per line, where the
    # tiled indices would divide by every dimension.
    lines = tirx.decl_buffer((math.prod(shape),), load.source.dtype, name=f"{buffer}_lines", data=load.source.data)
    offset = analyzer.simplify(first_element(outer + 1)) + (iteration * share + j) * per_line
    hints = tirx.For(j, tirx.const(0, index_type), tirx.const(share, index_type), tirx.ForKind.SERIAL,
                     _hint(tirx.address_of(tirx.BufferLoad(lines, [offset]))))
    return _insert_at(func, spread[-1], tirx.DeclBuffer(lines, data=load.source.data, body=hints))


def _read(func: tirx.PrimFunc, *, block: str, buffer: str, spread: Sequence[tirx.Var]) -> tuple[Any, list]:
    """``block``'s first read of ``buffer`` and its indices in terms of the loop variables."""
    if not spread:
        raise ValueError("spread needs at least one loop (the hints go in the body of its last one)")
    realize = find_realize(func.body, block)
    if realize is None:
        raise ValueError(f"no block named {block!r} in the function")
    loads = loads_of(realize.block.body, buffer)
    if not loads:
        raise ValueError(f"block {block!r} reads no buffer named {buffer!r}")
    binding = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
    return loads[0], [substitute(index, binding) for index in loads[0].indices]


def _continues(indices: Sequence[Any], loop: tirx.Var, vector: tirx.Var, run: int, extent: int) -> bool:
    """Whether ``loop`` (of ``extent``) steps the innermost index by exactly ``run`` elements
    where ``vector`` steps it by one, and indexes nothing else: its iterations continue the
    vector's run (a tile index ``(p * 16 + loop * 8 + vector) % 16`` does, within its range)."""
    analyzer = Analyzer()
    analyzer.bind(loop, tvm.ir.Range(0, extent))
    analyzer.bind(vector, tvm.ir.Range(0, run))
    *outer, inner = (analyzer.simplify(index) for index in indices)
    if any(uses_var(index, loop) for index in outer):
        return False
    coefficients = detect_linear_equation(inner, [loop, vector])
    return len(coefficients) == 3 and all(isinstance(c, tirx.IntImm) for c in coefficients[:2]) \
        and (int(coefficients[0]), int(coefficients[1])) == (run, 1)


def _per_line(load: Any) -> int:
    """Elements of ``load``'s type per cache line."""
    return max(1, LINE_BYTES * 8 // tvm.DataType(str(load.ty)).bits)


def _hint(address: Any) -> tirx.Stmt:
    """A read prefetch of ``address`` to the L2."""
    return tirx.Evaluate(tirx.call_intrin("void", "tirx.prefetch", address, 0, L2_LOCALITY, 1))


def _insert_at(func: tirx.PrimFunc, at: tirx.Var, stmt: tirx.Stmt) -> tirx.PrimFunc:
    """``func`` with ``stmt`` first in the body of the loop over ``at``."""

    def add(loop: tirx.For) -> tirx.For:
        if not loop.loop_var.same_as(at):
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt([stmt, loop.body]),
                        loop.thread_binding, loop.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, add)))


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
