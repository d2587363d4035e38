"""A padded window copied per output tile, with its loops split where the input's tiles end.

A depthwise conv pads each output tile's input window right before reading it (the conv
template's ``pad_in_tile``). In a tiled layout the window spans the neighbouring tiles, so
each index into the input is ``(w + c) // T`` and ``(w + c) % T`` of the window position
``w``: a division per vector copied, about ten integer instructions against one load and one
store. Split the window loops at the positions where ``(w + c) // T`` changes, and each
piece has a constant tile index that the simplifier folds (MNASNet's 32-channel 3x3 conv on
112x112: 14% faster alone on one thread). The copy is vectorized over the channel lanes
(:func:`vectorize_lanes`): otherwise ShuffleNet-V2's depthwise conv on 12-lane tiles copies
them one by one, 3x slower in the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym.pattern import detect_linear_equation

from alt_tvm.tir import substitute, uses_var

from .prefetch import find_realize
from .vectors import vectorize_channels

__all__ = ["MAX_PIECES", "partition_at_tile_edges", "tile_edges", "vectorize_lanes"]

#: Most pieces one window loop is split into (each piece duplicates the loops inside it).
MAX_PIECES = 4


def tile_edges(index: Any, var: tirx.Var, extent: int) -> set[int] | None:
    """Positions ``0 < p < extent`` of loop ``var`` where a ``floordiv``/``floormod`` of
    ``index`` by a constant changes its quotient, or None when one's numerator is not
    ``a * var + c`` with constant ``a`` and ``c`` (its edges would move with other loops)."""
    edges: set[int] = set()
    ok = [True]

    def visit(node: Any) -> None:
        if not isinstance(node.b, tirx.IntImm):
            return
        if not uses_var(node.a, var):
            return
        found = detect_linear_equation(node.a, [var])
        if len(found) != 2 or not all(isinstance(f, tirx.IntImm) for f in found):
            ok[0] = False
            return
        a, c, divisor = int(found[0].value), int(found[1].value), int(node.b.value)
        quotients = [(a * p + c) // divisor for p in range(extent)]
        edges.update(p for p in range(1, extent) if quotients[p] != quotients[p - 1])

    tvm_ffi.structural_walk(index, ((tirx.FloorDiv, tirx.FloorMod), visit))
    return edges if ok[0] else None


def partition_at_tile_edges(sch: tvm.s_tir.Schedule, block: Any, *, loops: Sequence[Any]) -> int:
    """Split ``loops`` (serial loops of ``block``'s window, outermost first) where the
    block's reads cross a tile edge; returns how many loops were split. A loop whose edges
    depend on other loops, or that would take more than :data:`MAX_PIECES` pieces, stays.
    The loops the window is computed at (a parallel loop over tiles) are not to be passed:
    their bindings divide too, but splitting them would split the work between threads."""
    name = sch.get(block).name_hint
    realize = find_realize(sch.mod["main"].body, name)
    if realize is None:
        return 0
    bindings = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
    loads = []
    tvm_ffi.structural_walk(realize.block.body, (tvm.ir.expr.TensorLoad, loads.append))
    indices = [substitute(i, bindings) for load in loads for i in load.indices]
    plans = []
    for loop in loops:
        node = sch.get(loop)
        if not isinstance(node.extent, tirx.IntImm) or node.kind != tirx.ForKind.SERIAL or node.annotations:
            continue
        extent, edges = int(node.extent), set()
        for index in indices:
            found = tile_edges(index, node.loop_var, extent)
            if found is None:
                edges = set()
                break
            edges |= found
        if edges and len(edges) < MAX_PIECES:
            cuts = sorted(edges)
            plans.append((loop, [cuts[0], *(b - a for a, b in zip(cuts, cuts[1:])), None]))
    # Innermost first: splitting an outer loop copies the (already split) loops inside it.
    for loop, factors in reversed(plans):
        sch.loop_partition(loop, factors)
    return len(plans)


def vectorize_lanes(sch: tvm.s_tir.Schedule, block: Any, *, lanes: int = 0, most: int = 64) -> bool:
    """Vectorize ``block``'s innermost loop where it is a short lane axis (a channel tile of
    at most ``most`` lanes, not a row of a row-major map), in the pieces of
    :func:`.vectors.vectorize_channels` for the target's ``lanes``; returns whether it did."""
    inner = sch.get_loops(block)[-1]
    extent = sch.get(inner).extent
    if isinstance(extent, tirx.IntImm) and 1 < int(extent) <= most:
        vectorize_channels(sch, inner, lanes=lanes)
        return True
    return False
