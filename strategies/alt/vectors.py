"""A channel tile as vector instructions: the width its loop is vectorized in, and the
registers one position of a register block holds.

LLVM splits a vector whose width is not a power of two into power-of-two pieces (12 lanes:
8 + 4). A tile of an odd number of half vectors (24 or 40 of 16 lanes) is vectorized in half
vectors instead: as one 24-lane vector, MobileNet-V3-Large's 24 -> 72 1x1 conv and its fused
blocks run 4.6-15x slower in the model; as three 8-lane pieces, 0.79x the time of the 12-lane
tiles they replace (where an 8- and a 16-lane FMA issue at the same rate of lanes, as on Zen 4).
"""

from __future__ import annotations

from typing import Any

import tvm

__all__ = ["vector_piece", "vector_registers", "vectorize_channels", "whole_llvm_pieces"]


def vector_piece(tile: int, lanes: int) -> int:
    """The lanes of one vector operation over a channel tile of ``tile`` lanes: where the tile
    is not a power of two and the largest power of two that divides it (at most ``lanes``)
    is at least half a vector, that power (24 of 16 lanes: three 8-lane pieces; 48: three
    vectors); otherwise the tile itself (12 of 16: LLVM's 8 + 4)."""
    piece = min(tile & -tile, lanes)
    if tile & (tile - 1) and 2 * piece >= lanes > 1:
        return piece
    return tile


def whole_llvm_pieces(tile: int, lanes: int) -> bool:
    """Whether every power-of-two piece of a ``tile``-lane vector (what LLVM splits a vector
    of another width into: 12 = 8 + 4, 15 = 8 + 4 + 2 + 1) is at least a quarter vector."""
    return all(piece * 4 >= lanes for piece in (1 << b for b in range(tile.bit_length()) if tile >> b & 1))


def vector_registers(tile: int, lanes: int) -> int:
    """The vector registers one position of a ``tile``-lane channel tile takes in a register
    block: ``ceil(tile / lanes)``, or one per piece (:func:`vector_piece`)."""
    return -(-tile // min(vector_piece(tile, lanes), lanes))


def vectorize_channels(sch: tvm.s_tir.Schedule, loop: Any, *, lanes: int) -> tuple[Any, Any]:
    """Vectorize ``loop`` (a channel tile), in pieces of :func:`vector_piece` lanes with the
    loop over the pieces unrolled. ``lanes`` 0: the whole loop as one vector. Returns the
    loop over the pieces (None when there is one) and the vectorized loop."""
    extent = int(sch.get(loop).extent)
    piece = vector_piece(extent, lanes) if lanes else extent
    if piece == extent:
        sch.vectorize(loop)
        return None, loop
    pieces, inner = sch.split(loop, [None, piece])
    sch.unroll(pieces)
    sch.vectorize(inner)
    return pieces, inner
