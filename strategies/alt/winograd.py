"""3x3 convolutions by Winograd's minimal filtering: F(m x m, 3 x 3) (Lavin and Gray 2016, §4).

A stride-1 3x3 conv computes each ``m x m`` output tile from an ``a x a`` input tile
(``a = m + 2``) with ``a^2`` products per channel pair instead of ``9 m^2``: 2.25x fewer
for ``m = 2``, 4x for ``m = 4``. The work moves into three phases of one kernel:

- **input transform** ``V = B^T d B`` per tile and input channel, parallel over tiles;
- **batched GEMM** ``M[xi, nu] = V[xi, nu] U[xi, nu]``, one ``tiles x C x O`` product per
  point ``(xi, nu)`` of the ``a x a`` tile, parallel over the points: each task reads its
  slice of ``U`` once, so the transformed weights (``a^2 / 9`` times the conv's) are
  read once per call, whatever their size;
- **output transform** ``Y = A^T M A`` with the conv's epilogue, written in an output
  layout of ``m x m`` spatial tiles and a vector of channels (the target's float32 lanes:
  16 with AVX-512, 8 with AVX2, 4 with NEON), parallel over tile rows.

``U = G g G^T`` is computed from the constant weights when the model is built. The
transform matrices are TVM's Cook-Toom construction with the interpolation points of
Barabasz et al. 2018 (``tvm.topi.nn.winograd_util``); F(4x4, 3x3) with them keeps float32
results within about 1e-6 of the direct conv's, relative to the output's largest value.

A NaN or an infinity in a tile's input, or an overflow in its transforms, reaches every
output of the tile, where a direct conv keeps the outputs whose windows miss it finite. The
kernel flags the tiles with outputs that are not finite and computes those again directly,
so NaN and infinities land where a direct conv puts them. Finite results carry Winograd's
rounding error, relative to the largest values of their input tile (Barabasz et al. 2018).

Where it pays (:func:`winograd_tile`): the products are a GEMM per point, efficient when
there are enough tiles to fill register blocks (alone on 2 AVX-512 cores, against the
direct template's 0.54-0.70 ms in the model: ResNet's
64-channel conv on 56x56 0.25 ms, 128 channels on 28x28 0.23 ms, 256 on 14x14 with
``m = 2`` 0.36 ms; 512 on 7x7, 16 tiles, 0.70 ms, no gain).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import te, tirx

from alt_tvm.ops.ieee import is_not_finite
from alt_tvm.tir import substitute

from .prefetch import find_realize, loads_of

__all__ = ["MAX_RAGGED_WORK", "MIN_TILES", "schedule_winograd", "stored_in_output_layout", "transform_weight",
           "vector_block", "winograd_conv", "winograd_matrices", "winograd_tile"]

#: Fewest output tiles for which the batched GEMM beats the direct template (7x7 maps,
#: 16 tiles of 2x2, do not; 14x14, 49 tiles, do).
MIN_TILES = 36
#: Output tiles per register block of the batched GEMM, and the most output channel vectors
#: per block (:func:`vector_block`: 6 x 4 accumulators, the weights' 4 vectors and a broadcast
#: take 29 of AVX-512's 32 registers; AVX2's 16 hold 6 x 2).
TILE_BLOCK = 6
VECTOR_BLOCK = 4
#: Most work, relative to the conv's, that whole tiles over a ragged output may take: 55x55 in
#: 4x4 tiles (+4%) and 27x27 (+8%) gain (0.46 -> 0.31 ms and 0.37 -> 0.22 ms alone for
#: SqueezeNet's 16 -> 64 and 32 -> 128 convs on 2 threads); 13x13 in 2x2 tiles (+16%)
#: does not (48 -> 192: 0.26 -> 0.28 ms).
MAX_RAGGED_WORK = 1.1


@functools.cache
def winograd_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A`` (``a x m``), ``B`` (``a x a``) and ``G`` (``a x 3``) of F(m x m, 3 x 3), float64."""
    if m not in (2, 4):
        raise ValueError(f"Winograd output tile m={m}: alt-tvm builds F(2x2, 3x3) and F(4x4, 3x3) only")
    # TVM ships the construction but only as TE constants; its helpers give the NumPy values.
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(m + 1), m, 3)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


def vector_block(*, vectors: int, registers: int) -> int:
    """Output channel vectors per register block of the batched GEMM: the most, up to
    ``VECTOR_BLOCK``, dividing ``vectors`` whose accumulators (``TILE_BLOCK`` per vector), weight
    vectors and one broadcast fit the ``registers`` (at least 1)."""
    fits = [v for v in range(1, VECTOR_BLOCK + 1) if vectors % v == 0 and TILE_BLOCK * v + v + 1 <= registers]
    return max(fits, default=1)


def winograd_tile(*, out_hw: Sequence[int], batch: int, in_channels: int, out_channels: int, lanes: int,
                  min_tiles: int = MIN_TILES) -> tuple[int, str]:
    """The output tile ``m`` for a stride-1 3x3 conv with this output, and why (``m = 0``: the
    direct template is faster, fewer than ``min_tiles`` tiles, or the shape does not fit the
    kernel).

    An output that is not a whole number of tiles (SqueezeNet's 55x55, 27x27 and 13x13 maps)
    is computed in whole tiles, the last row and column of tiles partly past its edge, when
    that adds at most ``MAX_RAGGED_WORK`` to the work: 56x56 for 55x55 and 28x28 for 27x27
    (``m = 4``), not 14x14 for 13x13. Channels must fill whole vectors of ``lanes``.
    """
    if in_channels % lanes or out_channels % lanes:
        return 0, f"channels {in_channels} -> {out_channels} are not multiples of {lanes}"
    for m in (4, 2):
        covered = [-(-extent // m) * m for extent in out_hw]
        if math.prod(covered) > MAX_RAGGED_WORK * math.prod(out_hw):
            continue
        if m == 4 and min(out_hw) < 24:
            continue  # 4x4 tiles on 14x14 maps leave too few tiles; 2x2 ones do better
        tiles = batch * math.prod(e // m for e in covered)
        if tiles < min_tiles:
            return 0, f"{tiles} output tiles of {m}x{m} (the batched GEMM needs {min_tiles})"
        return m, f"{tiles} output tiles of {m}x{m}"
    return 0, f"output {list(out_hw)} is too far from a whole number of 2x2 or 4x4 tiles"


def transform_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """``U[xi, nu, c, o] = (G g[o, c] G^T)[xi, nu]`` of an ``O x C x 3 x 3`` weight, float32."""
    if weight.ndim != 4 or weight.shape[2:] != (3, 3):
        raise ValueError(f"transform_weight needs an O x C x 3 x 3 weight, got shape {weight.shape}")
    _, _, g = winograd_matrices(m)
    u = np.einsum("ar,ocrs,bs->abco", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u, dtype=np.float32)


def _const(values: np.ndarray, name: str) -> te.Tensor:
    from tvm.topi.utils import const_matrix

    return const_matrix(values.astype("float32"), name)


def winograd_conv(data: te.Tensor, u: te.Tensor, weight: te.Tensor, *, m: int, pads: Sequence[int],
                  out_hw: Sequence[int], lanes: int) -> te.Tensor:
    """TE of the conv ``N x O x OH x OW`` from ``data`` (``N x C x H x W``, padded by ``pads``:
    top, left, bottom, right), the transformed weight ``u`` (``a x a x C x O``) and the
    weight itself (``O x C x 3 x 3``, for the direct fallback); output channels in vectors
    of ``lanes``.

    Stages (names are what :func:`schedule_winograd` looks up): ``winograd_rows`` (``B^T d``
    per tile), ``winograd_input`` (``V``), ``winograd_product`` (``M``), ``winograd_columns``
    (``M A`` per tile), ``winograd_output`` (``A^T (M A)``), ``winograd_flag`` (per tile and
    output channel: how many of its outputs are not finite), ``winograd_direct`` (the direct
    conv, computed only for flagged tiles) and the returned ``winograd_conv`` (Winograd's
    value where the flag is clear, else the direct one).
    """
    n, c, h, w = (int(s) for s in data.shape)
    alpha, _, _, o = (int(s) for s in u.shape)
    oh, ow = out_hw
    if alpha != m + 2:
        raise ValueError(f"winograd_conv: {m}x{m} output tiles need a {m + 2}x{m + 2} transform, got {alpha}x{alpha}")
    ph, pw = -(-oh // m), -(-ow // m)  # whole tiles: a ragged output's last ones reach past it
    tiles = n * ph * pw
    padded_tiles = -(-tiles // TILE_BLOCK) * TILE_BLOCK  # whole register blocks; the rest read zeros
    top, left = pads[0], pads[1]
    a_np, b_np, _ = winograd_matrices(m)
    a_mat, b_mat = _const(a_np, "winograd_A"), _const(b_np, "winograd_B")
    zero = tirx.const(0.0, data.dtype)

    def padded(b, ch, row, col):
        inside = tirx.all(row >= 0, row < h, col >= 0, col < w)
        return tirx.if_then_else(inside, data[b, ch, row, col], zero)

    def tile_input(p, ch, y, x):
        inside = p < tiles
        return tirx.if_then_else(inside, padded(p // (ph * pw), ch, (p // pw) % ph * m + y - top,
                                                p % pw * m + x - left), zero)

    r1 = te.reduce_axis((0, alpha), "r1")
    rows = te.compute((padded_tiles, alpha, alpha, c), lambda p, xi, x, ch: te.sum(
        b_mat[r1, xi] * tile_input(p, ch, r1, x), axis=r1), name="winograd_rows")
    r2 = te.reduce_axis((0, alpha), "r2")
    v = te.compute((alpha, alpha, padded_tiles, c), lambda xi, nu, p, ch: te.sum(
        b_mat[r2, nu] * rows[p, xi, r2, ch], axis=r2), name="winograd_input")
    rc = te.reduce_axis((0, c), "rc")
    product = te.compute((alpha, alpha, padded_tiles, o // lanes, lanes), lambda xi, nu, p, oo, oi: te.sum(
        v[xi, nu, p, rc] * u[xi, nu, rc, oo * lanes + oi], axis=rc), name="winograd_product")
    columns = te.compute((n, ph, pw, o // lanes, alpha, m, lanes), lambda b, th, tw, oo, i, wi, oi: sum(
        a_mat[j, wi] * product[i, j, (b * ph + th) * pw + tw, oo, oi] for j in range(alpha)),
        name="winograd_columns")
    wino = te.compute((n, o, ph * m, pw * m), lambda b, oc, y, x: sum(
        a_mat[i, y % m] * columns[b, y // m, x // m, oc // lanes, i, x % m, oc % lanes] for i in range(alpha)),
        name="winograd_output")
    # A NaN, an infinity or an overflow in a tile's transforms reaches every output of the
    # tile: those tiles are computed again directly, which gives what a direct conv gives.
    flag = te.compute((n, ph, pw, o // lanes, lanes), lambda b, th, tw, oo, oi: sum(
        is_not_finite(wino(b, oo * lanes + oi, th * m + y, tw * m + x)).astype("int32")
        for y in range(m) for x in range(m)), name="winograd_flag")
    dc, dy, dx = te.reduce_axis((0, c), "dc"), te.reduce_axis((0, 3), "dy"), te.reduce_axis((0, 3), "dx")
    direct = te.compute((n, o, ph * m, pw * m), lambda b, oc, y, x: te.sum(
        padded(b, dc, y + dy - top, x + dx - left) * weight[oc, dc, dy, dx], axis=[dc, dy, dx]),
        name="winograd_direct")
    return te.compute((n, o, oh, ow), lambda b, oc, y, x: tirx.Select(
        flag[b, y // m, x // m, oc // lanes, oc % lanes] == 0, wino[b, oc, y, x], direct[b, oc, y, x]),
        name="winograd_conv")


def stored_in_output_layout(conv: te.Tensor) -> list[te.Tensor]:
    """The stages of :func:`winograd_conv`'s ``conv`` that :func:`schedule_winograd` expects in
    the output's tiling (the Winograd and the direct values, over whole tiles), besides ``conv``
    itself."""
    return [t for t in conv.op.input_tensors if t.op.name in ("winograd_output", "winograd_direct")]


def schedule_winograd(func: tvm.tirx.PrimFunc, *, stages: Sequence[te.Tensor], lanes: int,
                      vectors_per_block: int) -> tvm.IRModule:
    """Schedule :func:`winograd_conv`'s stages; ``stages`` are its output then the epilogue's
    stages, the last the partition's output; the output, ``winograd_output`` and
    ``winograd_direct`` are stored ``N . OH/m . OW/m . O/lanes . m . m . lanes``.

    ``vectors_per_block`` output channel vectors per register block of the GEMM (it divides
    ``O/lanes``; :func:`vector_block`).
    """
    sch = tvm.s_tir.Schedule(func)
    for name in ("winograd_A", "winograd_B", *(s.op.name for s in stages[:-1])):
        sch.compute_inline(sch.get_sblock(name))
    # Output transform and epilogue: parallel over rows of tiles, a vector of channels at a time.
    final = sch.get_sblock(stages[-1].op.name)
    n, th, _, tile_channels, hi, wi, oi = sch.get_loops(final)
    sch.parallel(sch.fuse(n, th))
    sch.unroll(hi)
    sch.unroll(wi)
    sch.vectorize(oi)
    for name in ("winograd_flag", "winograd_direct", "winograd_output", "winograd_columns"):
        sch.compute_at(sch.get_sblock(name), tile_channels)
    wino = sch.get_sblock("winograd_output")
    *_, hi, wi, oi = sch.get_loops(wino)
    sch.unroll(hi)
    sch.unroll(wi)
    sch.vectorize(oi)
    sch.vectorize(sch.get_loops(sch.get_sblock("winograd_flag"))[-1])
    columns = sch.get_sblock("winograd_columns")
    *_, i, wj, lane = sch.get_loops(columns)
    sch.unroll(i)
    sch.unroll(wj)
    sch.vectorize(lane)
    # Batched GEMM: one task per point of the transformed tile.
    product = sch.get_sblock("winograd_product")
    xi, nu, p, oo, oi, rc = sch.get_loops(product)
    p_out, p_in = sch.split(p, [None, TILE_BLOCK])
    oo_out, oo_in = sch.split(oo, [None, vectors_per_block])
    sch.reorder(xi, nu, p_out, oo_out, rc, p_in, oo_in, oi)
    sch.parallel(sch.fuse(xi, nu))
    write = sch.cache_write(product, 0, "local")
    sch.reverse_compute_at(write, oo_out)
    sch.unroll(p_in)
    sch.unroll(oo_in)
    sch.vectorize(oi)
    sch.decompose_reduction(product, rc)
    sch.vectorize(sch.get_loops(write)[-1])
    # Input transform: per tile and vector of input channels, rows then columns.
    v = sch.get_sblock("winograd_input")
    xi, nu, p, ch, r2 = sch.get_loops(v)
    ch_out, ch_in = sch.split(ch, [None, lanes])
    sch.reorder(p, ch_out, xi, nu, r2, ch_in)
    sch.parallel(p)
    for loop in (xi, nu, r2):
        sch.unroll(loop)
    sch.vectorize(ch_in)
    sch.decompose_reduction(v, r2)
    rows = sch.get_sblock("winograd_rows")
    sch.compute_at(rows, ch_out)
    *_, xi, x, ch, r1 = sch.get_loops(rows)
    sch.reorder(xi, x, r1, ch)
    for loop in (xi, x, r1):
        sch.unroll(loop)
    sch.vectorize(ch)
    sch.decompose_reduction(rows, r1)
    return tvm.IRModule({"main": _direct_only_where_flagged(sch.mod["main"], final=stages[-1].op.name,
                                                            at=sch.get(tile_channels).loop_var, lanes=lanes)})


def _direct_only_where_flagged(func: tirx.PrimFunc, *, final: str, at: tirx.Var, lanes: int) -> tirx.PrimFunc:
    """``func`` with the direct conv under loop ``at`` run only when a flag of the tile is set.

    No schedule primitive makes a block conditional, so the scheduled function is mapped with
    ``tvm_ffi.structural_map`` (as :mod:`.prefetch` does): the flags the final block reads
    for its tile (one per output channel of the vector) guard the direct conv's loop nest.
    """
    realize = find_realize(func.body, final)
    (load, *_) = loads_of(realize.block.body, "winograd_flag")
    binding = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
    *tile, lane = [substitute(index, binding) for index in load.indices]
    flags = [tirx.BufferLoad(load.source, [*tile, tirx.const(k, str(lane.ty))]) > 0 for k in range(lanes)]
    flagged = functools.reduce(tirx.Or, flags)

    def guard(loop: tirx.For) -> tirx.For:
        if not loop.loop_var.same_as(at):
            return loop
        body = loop.body.seq if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
        guarded = [tirx.IfThenElse(flagged, stmt, None) if find_realize(stmt, "winograd_direct") is not None else stmt
                   for stmt in body]
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt(guarded),
                        loop.thread_binding, loop.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, guard)))
