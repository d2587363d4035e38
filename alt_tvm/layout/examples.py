"""Worked examples from the ALT paper, built with the layout primitives."""

from __future__ import annotations

from tvm import te

from .layout import Layout
from .rewrite import create_prim_func


def fig3_prim_func(*, size: int, channels: int, out_channels: int, ot: int, kernel: int = 3):
    """The Fig. 3 program of the ALT paper.

    ``Conv[n][oh][ow][oo][ih][iw][io] += Inp[n][oh][ow][i][ih+rh][iw+rw] * Ker[oo][i][rh][rw][io]``:
    the output tiled 2x2 in space and split by ``ot`` in channels, the input unfolded into
    overlapping tiles. Returns the PrimFunc and the layouts (keys: Conv, Inp, Ker tensors).
    """
    if size % 2 or out_channels % ot:
        raise ValueError(f"size must be even and out_channels a multiple of ot, "
                         f"got size={size}, out_channels={out_channels}, ot={ot}")
    padded = size + kernel - 1
    inp = te.placeholder((1, channels, padded, padded), name="Inp")
    ker = te.placeholder((out_channels, channels, kernel, kernel), name="Ker")
    i = te.reduce_axis((0, channels), "i")
    rh = te.reduce_axis((0, kernel), "rh")
    rw = te.reduce_axis((0, kernel), "rw")
    conv = te.compute(
        (1, out_channels, size, size),
        lambda n, o, h, w: te.sum(inp[n, i, h + rh, w + rw] * ker[o, i, rh, rw], axis=[i, rh, rw]),
        name="Conv",
    )
    half = size // 2
    layouts = {
        # N O H W -> N 2 2 O/ot H/2 W/2 ot
        conv: Layout(conv.shape).split(2, [2, half]).split(4, [2, half]).split(1, [out_channels // ot, ot])
        .reorder([0, 3, 5, 1, 4, 6, 2]),
        # N I H' W' -> N 2 2 I (H/2+KH-1) (W/2+KW-1): overlapping tiles, stride H/2
        inp: Layout(inp.shape).unfold(2, half + kernel - 1, half).unfold(4, half + kernel - 1, half)
        .reorder([0, 2, 4, 1, 3, 5]),
        # O I KH KW -> O/ot I KH KW ot
        ker: Layout(ker.shape).split(0, [out_channels // ot, ot]).reorder([0, 2, 3, 4, 1]),
    }
    return create_prim_func([inp, ker, conv], layouts=layouts), layouts
