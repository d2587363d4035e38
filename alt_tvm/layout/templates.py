"""Layout templates of the ALT paper §5.1, as ``Layout`` builders.

Convolutions use the canonical N C [D] H W data layout, O I K... weights and
N O [D] H W outputs (PyTorch's). Tile sizes that do not divide an extent pad it first,
so every tile size is legal.

* output ``N·H/ht·W/wt·O/ot·ht·wt·ot`` (:func:`conv_output_tiled`);
* input ``N·H/ht·W/wt·I/it·(ht'·V + M - V)·(wt'...)·it`` — the spatial dims unfolded
  into the overlapping windows the output tiles read (:func:`conv_input_unfolded`);
* weight ``O/ot'·I/it'·KH·KW·it'·ot'`` (:func:`conv_weight_tiled`);
* channels-last (``NHWC``/``NHWO``) for data and outputs, ``KH·KW·I·O`` for weights;
* GEMM ``M/mt·N/nt·mt·nt`` style splits (:func:`matrix_tiled`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .layout import Layout
from .primitives import _int_tuple, _positive_int


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _shape(shape: Sequence[int], min_rank: int, what: str, layout: str) -> tuple[int, ...]:
    """``shape`` as ints, checked to have at least ``min_rank`` dims (``layout`` names them)."""
    shape = _int_tuple(shape, f"{what}: shape", "(1, 64, 56, 56)")
    if len(shape) < min_rank:
        raise ValueError(f"{what}: needs a rank >= {min_rank} shape ({layout}), got {shape}")
    return shape


def _positive_ints(values: Sequence[int], what: str) -> tuple[int, ...]:
    """``values`` as a tuple of positive ints (``what`` names the argument)."""
    values = _int_tuple(values, what, "[2, 2]")
    for v in values:
        _positive_int(v, f"{what}: entry {v!r} in {list(values)}")
    return values


def _tile(layout: Layout, dim: int, tile: int) -> tuple[Layout, int]:
    """Pad ``dim`` to a multiple of ``tile`` and split it in two; return the tile actually used."""
    extent = layout.shape[dim]
    if isinstance(tile, (int, np.integer)) and not isinstance(tile, bool) and tile < 1:
        raise ValueError(f"tile size must be positive, got {tile} for dimension {dim}")
    tile = _positive_int(tile, f"tile size for dimension {dim}")
    tile = min(tile, extent)
    padded = _ceil_to(extent, tile)
    if padded != extent:
        layout = layout.pad(dim, padded - extent)
    return layout.split(dim, [padded // tile, tile]), tile


def channels_last(shape: Sequence[int]) -> Layout:
    """``N C S...`` -> ``N S... C``."""
    shape = _shape(shape, 2, "channels_last", "N C ...")
    rank = len(shape)
    return Layout(shape).reorder([0, *range(2, rank), 1])


def weight_channels_last(shape: Sequence[int]) -> Layout:
    """``O I K...`` -> ``K... I O`` (e.g. HWIO)."""
    shape = _shape(shape, 2, "weight_channels_last", "O I ...")
    rank = len(shape)
    return Layout(shape).reorder([*range(2, rank), 1, 0])


def conv_output_tiled(shape: Sequence[int], *, spatial_tiles: Sequence[int], channel_tile: int) -> Layout:
    """Output ``N O S1..Sk`` -> ``N S1/t1..Sk/tk O/ot t1..tk ot``."""
    shape = _shape(shape, 2, "conv_output_tiled", "N O S...")
    k = len(shape) - 2
    spatial_tiles = _positive_ints(spatial_tiles, "conv_output_tiled: spatial_tiles")
    if len(spatial_tiles) != k:
        raise ValueError(f"conv_output_tiled: {k} spatial dims need {k} tiles, got {list(spatial_tiles)}")
    layout = Layout(shape)
    # Dims after each split: tile spatial dims from the last so earlier indices stay valid.
    for d in reversed(range(k)):
        layout, _ = _tile(layout, 2 + d, spatial_tiles[d])
    layout, _ = _tile(layout, 1, channel_tile)
    # Now: N, O/ot, ot, S1/t1, t1, ..., Sk/tk, tk
    outer = [3 + 2 * d for d in range(k)]
    inner = [4 + 2 * d for d in range(k)]
    return layout.reorder([0, *outer, 1, *inner, 2])


def conv_output_two_level(shape: Sequence[int], *, spatial_tiles: Sequence[int], channel_tile: int,
                          outer_spatial_tiles: Sequence[int], outer_channel_tile: int) -> Layout:
    """The paper's two-level output template (§5.1).

    ``N O S1..Sk`` -> ``N S1/(t1't1)..Sk/(tk'tk) O/(ot'ot) t1'..tk' ot' t1..tk ot``: the
    inner tiles ``t, ot`` are the register/vector level, the outer ``t', ot'`` group inner
    tiles into a cache-sized block stored contiguously.
    """
    shape = _shape(shape, 2, "conv_output_two_level", "N O S...")
    k = len(shape) - 2
    spatial_tiles = _positive_ints(spatial_tiles, "conv_output_two_level: spatial_tiles")
    outer_spatial_tiles = _positive_ints(outer_spatial_tiles, "conv_output_two_level: outer_spatial_tiles")
    if len(spatial_tiles) != k or len(outer_spatial_tiles) != k:
        raise ValueError(f"conv_output_two_level: {k} spatial dims need {k} inner and {k} outer tiles, got "
                         f"{list(spatial_tiles)} and {list(outer_spatial_tiles)}")
    layout = Layout(shape)
    for d in reversed(range(k)):
        layout, _ = _tile(layout, 2 + d, spatial_tiles[d])
    layout, _ = _tile(layout, 1, channel_tile)
    # Now: N, O/ot, ot, S1/t1, t1, ...: split every outer part again (last dims first).
    for d in reversed(range(k)):
        layout, _ = _tile(layout, 3 + 2 * d, outer_spatial_tiles[d])
    layout, _ = _tile(layout, 1, outer_channel_tile)
    # Now: N, O2, ot', ot, [S2_d, t'_d, t_d] for each d
    outer = [4 + 3 * d for d in range(k)]
    middle = [5 + 3 * d for d in range(k)]
    inner = [6 + 3 * d for d in range(k)]
    return layout.reorder([0, *outer, 1, *middle, 2, *inner, 3])


def conv_input_unfolded(
    shape: Sequence[int],
    *,
    spatial_tiles: Sequence[int],
    channel_tile: int,
    kernel: Sequence[int],
    strides: Sequence[int] | None = None,
    dilation: Sequence[int] | None = None,
) -> Layout:
    """Padded input ``N I S1'..Sk'`` -> ``N T1..Tk I/it B1..Bk it`` (overlapping tiles).

    Each spatial dim is unfolded into the window an output tile of ``t`` rows reads:
    tile size ``B = (t-1)*V + (K-1)*D + 1`` and stride ``t*V``, which the rewrite pass
    matches to the convolution's ``V*i + D*r`` reads (paper eq. (1)).
    """
    shape = _shape(shape, 2, "conv_input_unfolded", "N I S...")
    k = len(shape) - 2
    spatial_tiles = _positive_ints(spatial_tiles, "conv_input_unfolded: spatial_tiles")
    kernel = _positive_ints(kernel, "conv_input_unfolded: kernel")
    # None or empty: all ones.
    strides = _positive_ints(() if strides is None else strides, "conv_input_unfolded: strides") or (1,) * k
    dilation = _positive_ints(() if dilation is None else dilation, "conv_input_unfolded: dilation") or (1,) * k
    for name, seq in (("spatial_tiles", spatial_tiles), ("kernel", kernel), ("strides", strides),
                      ("dilation", dilation)):
        if len(seq) != k:
            raise ValueError(f"conv_input_unfolded: {k} spatial dims need {k} {name}, got {list(seq)}")
    layout = Layout(shape)
    for d in reversed(range(k)):
        extent = shape[2 + d]
        window = (kernel[d] - 1) * dilation[d] + 1
        outputs = (extent - window) // strides[d] + 1
        if outputs < 1:
            raise ValueError(f"conv_input_unfolded: window {window} is larger than input extent {extent}")
        tile = min(spatial_tiles[d], outputs)
        size = (tile - 1) * strides[d] + window
        layout = layout.unfold(2 + d, size, tile * strides[d])
    layout, _ = _tile(layout, 1, channel_tile)
    # Now: N, I/it, it, T1, B1, ..., Tk, Bk
    tiles = [3 + 2 * d for d in range(k)]
    windows = [4 + 2 * d for d in range(k)]
    return layout.reorder([0, *tiles, 1, *windows, 2])


def conv_weight_tiled(shape: Sequence[int], *, out_tile: int, in_tile: int) -> Layout:
    """Weight ``O I K...`` -> ``O/ot I/it K... it ot``."""
    shape = _shape(shape, 2, "conv_weight_tiled", "O I K...")
    k = len(shape) - 2
    layout, _ = _tile(Layout(shape), 1, in_tile)
    layout, _ = _tile(layout, 0, out_tile)
    # Now: O/ot, ot, I/it, it, K...
    return layout.reorder([0, 2, *range(4, 4 + k), 3, 1])


def matrix_tiled(shape: Sequence[int], *, tiles: Sequence[int], inner_last: bool = True) -> Layout:
    """Tile every dim of a (batched) matrix: ``A B`` -> ``A/at B/bt at bt``.

    Leading batch dims (beyond the last two) are kept outermost and untiled.
    """
    shape = _int_tuple(shape, "matrix_tiled: shape", "(64, 64)")
    tiles = _int_tuple(tiles, "matrix_tiled: tiles", "[4, 4]")
    rank = len(shape)
    if len(tiles) != 2 or rank < 2:
        raise ValueError(f"matrix_tiled: need a rank >= 2 shape and 2 tiles, got {list(shape)}, {list(tiles)}")
    batch = rank - 2
    layout, _ = _tile(Layout(shape), batch + 1, tiles[1])
    layout, _ = _tile(layout, batch, tiles[0])
    # Now: batch..., A/at, at, B/bt, bt
    outer = [batch, batch + 2]
    inner = [batch + 1, batch + 3]
    return layout.reorder([*range(batch), *outer, *inner] if inner_last else list(range(rank + 2)))
