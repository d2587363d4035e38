"""Full-size conv2d on the VTA model, one slab of output rows at a time.

A layer is cut into slabs of ``slab_rows`` output rows (a loop split of the output height outside
the GEMM embedding; each slab reads its rows of the zero-padded input plus the stencil halo). Every
slab is the same operator up to the last, shorter one, so at most two plans and two programs are
built and lowered; their cycle and byte counts (:func:`~.sim.program_stats`, data independent) are
multiplied by the number of slabs of that shape. Each slab program starts with empty buffers, so
operands resident across a slab boundary are reloaded (counted; the same rule for every mapping).

Numerics: the simulator executes the programs of the checked slabs on real data and compares them
bit-exactly with a NumPy reference for those rows. ``check_uops=None`` checks every slab; a budget
checks a deterministic, evenly spaced subset that always includes the first and the last slab
(at least the first slab for any positive budget; ``0`` checks none; :attr:`SlabRun.checked_slabs`
says how many). Host packing is timed over every slab: the weight
once per plan (build time), the data and the output scatter per slab (run time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .embedding import Embedding
from .polyhedral import conv2d_op
from .rewrite import Plan, lower, plan, tile_counts
from .sim import Simulator, Stats, VTAConfig, program_stats

__all__ = ["SlabRun", "conv2d_reference", "count_conv2d", "run_conv2d"]

_GEOMETRY_KEYS = ("n", "c", "h", "w", "k", "r", "s", "pad_h", "pad_w", "stride_h", "stride_w", "dilation_h",
                  "dilation_w", "groups")


@dataclass
class SlabRun:
    """Result of :func:`run_conv2d` (counts are for the whole layer)."""

    stats: Stats
    slabs: int
    slab_rows: int
    checked_slabs: int
    checked_rows: int
    matched: bool | None  # None when nothing was checked
    weight_pack_seconds: float  # once per plan, at build time
    pack_seconds: float  # data packing + output unpacking over every slab
    mac_total: int
    data_total: int  # elements of the packed A, B, C tensors of the whole layer (Rieber et al., §4.4)
    footprint_bytes: int  # bytes of the packed A (int8), B (int8) and C (int32) tensors
    output: np.ndarray | None = field(default=None, repr=False)  # int32, in data_layout


def conv2d_reference(*, data: np.ndarray, weight: np.ndarray, stride: tuple[int, int],
                     dilation: tuple[int, int], groups: int) -> np.ndarray:
    """Direct conv2d of already zero-padded canonical data ``N C H W`` with ``O C/g R S`` weights.

    Computed in float64 (exact: every partial sum of int8 products is far below 2**53) so NumPy
    uses BLAS; returned as int64.

    Parameters
    ----------
    data : np.ndarray
        ``N C Hp Wp`` (any integer dtype or view).
    weight : np.ndarray
        ``O C/groups R S``.
    stride, dilation : (int, int)
    groups : int

    Returns
    -------
    np.ndarray
        int64 ``N O OH OW``.
    """
    n, c, hp, wp = data.shape
    k, cg, r, s = weight.shape
    if cg * groups != c or k % groups:
        raise ValueError(f"weight {weight.shape} does not fit data {data.shape} with groups={groups}")
    (sh, sw), (dh, dw) = stride, dilation
    oh = (hp - dh * (r - 1) - 1) // sh + 1
    ow = (wp - dw * (s - 1) - 1) // sw + 1
    x = data.astype(np.float64).reshape(n, groups, cg, hp, wp)
    wt = weight.astype(np.float64).reshape(groups, k // groups, cg, r, s)
    out = np.zeros((n, groups, k // groups, oh, ow))
    for i in range(r):
        for j in range(s):
            win = x[:, :, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            out += np.einsum("ngchw,gkc->ngkhw", win, wt[..., i, j], optimize=True)
    return out.reshape(n, k, oh, ow).astype(np.int64)


def _check(geometry: dict) -> dict:
    unknown = set(geometry) - set(_GEOMETRY_KEYS)
    if unknown:
        raise ValueError(f"unknown conv2d geometry keys {sorted(unknown)}; expected a subset of {_GEOMETRY_KEYS}")
    g = {"pad_h": 0, "pad_w": 0, "stride_h": 1, "stride_w": 1, "dilation_h": 1, "dilation_w": 1, "groups": 1,
         **geometry}
    missing = [k for k in _GEOMETRY_KEYS if k not in g]
    if missing:
        raise ValueError(f"conv2d geometry lacks {missing}")
    conv2d_op(**g)  # validates values with clear messages
    return g


def count_conv2d(*, geometry: dict, embedding: Embedding, config: VTAConfig, slab_rows: int) -> Stats:
    """Whole-layer cycles and bytes of :func:`run_conv2d` without data, packing or numerics.

    Lowers at most two slab programs (the regular and the last slab); used to compare several
    candidate embeddings by simulated cycles (the paper's top-k candidates measured after ranking).

    Parameters
    ----------
    geometry : dict
        As for :func:`run_conv2d`.
    embedding : Embedding
    config : VTAConfig
    slab_rows : int
        Output rows per slab (>= 1).

    Returns
    -------
    Stats
    """
    if slab_rows < 1:
        raise ValueError(f"slab_rows must be >= 1, got {slab_rows}")
    g = _check(geometry)
    oh = conv2d_op(**g).extents["h"]
    rows = min(slab_rows, oh)
    total = Stats()
    for r, times in ((rows, oh // rows), (oh % rows, 1 if oh % rows else 0)):
        if not times:
            continue
        op = conv2d_op(**{**g, "h": (r - 1) * g["stride_h"] + g["dilation_h"] * (g["r"] - 1) + 1,
                          "w": g["w"] + 2 * g["pad_w"], "pad_h": 0, "pad_w": 0})
        st = program_stats(lower(plan(op, embedding), config), config)
        for name in vars(total):
            setattr(total, name, getattr(total, name) + times * getattr(st, name))
    return total


def run_conv2d(*, data: np.ndarray, weight: np.ndarray, geometry: dict, embedding: Embedding,
               config: VTAConfig, data_layout: str = "NCHW", slab_rows: int | None = None,
               slab_macs: int = 1 << 23, check_uops: int | None = None) -> SlabRun:
    """Run an int8 conv2d layer of any size on the VTA model, slab by slab.

    Parameters
    ----------
    data : np.ndarray
        int8 ``N C H W`` (``data_layout="NCHW"``) or ``N H W C`` (``"NHWC"``), unpadded.
    weight : np.ndarray
        int8 ``O C/groups R S``.
    geometry : dict
        ``n, c, h, w, k, r, s`` and optional ``pad_h, pad_w, stride_h, stride_w, dilation_h,
        dilation_w, groups`` (as :func:`~.polyhedral.conv2d_op`).
    embedding : Embedding
        A dense embedding of the layer's operator (from the CSP or :func:`~.embedding.static_embedding`).
    config : VTAConfig
    data_layout : {"NCHW", "NHWC"}
        Host layout of data and output; packing reads it in place (no layout copy).
    slab_rows : int, optional
        Output rows per slab; by default about ``slab_macs`` MACs per slab, a multiple of the
        embedding's factor on the output height.
    slab_macs : int
    check_uops : int, optional
        Budget of simulated GEMM micro-ops for the numeric check (None: check every slab).

    Returns
    -------
    SlabRun
    """
    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}")
    if data.dtype != np.int8 or weight.dtype != np.int8:
        raise ValueError(f"data and weight must be int8, got {data.dtype} and {weight.dtype}")
    if embedding.shape != config.gemm:
        raise ValueError(f"embedding is for {embedding.shape}, config for {config.gemm}")
    if check_uops is not None and check_uops < 0:
        raise ValueError(f"check_uops must be >= 0 or None, got {check_uops}")
    g = _check(geometry)
    n, c, h, w, k, r, s = (g[x] for x in "nchwkrs")
    ph, pw, sh, sw = g["pad_h"], g["pad_w"], g["stride_h"], g["stride_w"]
    dh, dw, groups = g["dilation_h"], g["dilation_w"], g["groups"]
    want = (n, c, h, w) if data_layout == "NCHW" else (n, h, w, c)
    if data.shape != want or weight.shape != (k, c // groups, r, s):
        raise ValueError(f"expected data {want} and weight {(k, c // groups, r, s)}, got {data.shape} and "
                         f"{weight.shape}")
    full = conv2d_op(**g)
    oh, ow = full.extents["h"], full.extents["w"]
    # pad in the host layout, then view it as canonical N C H W without copying
    if data_layout == "NHWC":
        xp = np.pad(data, ((0, 0), (ph, ph), (pw, pw), (0, 0))).transpose(0, 3, 1, 2)
        out_buf = np.zeros((n, oh, ow, k), np.int32)
        out_view = out_buf.transpose(0, 3, 1, 2)
    else:
        xp = np.pad(data, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        out_buf = np.zeros((n, k, oh, ow), np.int32)
        out_view = out_buf
    fh = embedding.factors.get("h", 1)
    if slab_rows is None:
        per_row = n * k * ow * (c // groups) * r * s
        slab_rows = max(fh, (max(1, slab_macs // per_row) // fh) * fh)
    if slab_rows < 1:
        raise ValueError(f"slab_rows must be >= 1, got {slab_rows}")
    slab_rows = min(slab_rows, oh)
    starts = list(range(0, oh, slab_rows))
    wt = weight.reshape(groups, k // groups, c // groups, r, s) if groups > 1 else weight

    cache: dict[int, tuple[Plan, list, Stats, np.ndarray, str]] = {}
    weight_s = 0.0

    def prepared(rows: int):
        nonlocal weight_s
        if rows not in cache:
            op = conv2d_op(**{**g, "h": (rows - 1) * sh + dh * (r - 1) + 1, "w": w + 2 * pw, "pad_h": 0, "pad_w": 0})
            p = plan(op, embedding)
            prog = lower(p, config)
            t0 = time.perf_counter()
            wpack = p.pack_operand(index=1, tensor=wt)  # constant: packed once per plan
            weight_s += time.perf_counter() - t0
            cache[rows] = (p, prog, program_stats(prog, config), wpack, p.operand_role(0))
        return cache[rows]

    # which slabs run numerically: evenly spaced, first and last included
    calls = prepared(min(slab_rows, oh))[0].calls
    if check_uops is None:
        checked = set(range(len(starts)))
    else:
        # a positive budget always checks at least the first slab, even when one slab exceeds it
        m = min(len(starts), max(1 if check_uops > 0 else 0, check_uops // max(1, calls)))
        checked = set(np.unique(np.round(np.linspace(0, len(starts) - 1, m)).astype(int)).tolist()) if m else set()
    total, pack_s, matched, checked_rows = Stats(), 0.0, None, 0
    gshape = config.gemm
    for idx, o0 in enumerate(starts):
        rows = min(slab_rows, oh - o0)
        p, prog, st, wpack, data_role = prepared(rows)
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(st, name))
        i0 = o0 * sh
        x_slab = xp[:, :, i0:i0 + (rows - 1) * sh + dh * (r - 1) + 1]
        if groups > 1:
            x_slab = x_slab.reshape(n, groups, c // groups, *x_slab.shape[2:])
        t0 = time.perf_counter()
        dpack = p.pack_operand(index=0, tensor=x_slab)
        pack_s += time.perf_counter() - t0
        out_tiles = np.zeros((p.ntiles["C"], gshape.batch, gshape.block_out), np.int32)
        if idx in checked:
            dram = {data_role: dpack, ("wgt" if data_role == "inp" else "inp"): wpack, "out": out_tiles}
            Simulator(config).run(prog, dram)
        target = out_view[:, :, o0:o0 + rows]
        if groups > 1:
            target = target.reshape(n, groups, k // groups, rows, ow)
        t0 = time.perf_counter()
        p.unpack(out_tiles, into=target)
        pack_s += time.perf_counter() - t0
        if idx in checked:
            ref = conv2d_reference(data=np.asarray(x_slab).reshape(n, c, *x_slab.shape[-2:]), weight=weight,
                                   stride=(sh, sw), dilation=(dh, dw), groups=groups)
            ok = bool(np.array_equal(out_view[:, :, o0:o0 + rows], ref))
            matched = ok if matched is None else matched and ok
            checked_rows += rows
    counts = tile_counts(full, embedding)
    data_total = (counts["A"] * gshape.batch * gshape.block_in + counts["B"] * gshape.block_out * gshape.block_in
                  + counts["C"] * gshape.batch * gshape.block_out)
    footprint = counts["A"] * config.inp_tile + counts["B"] * config.wgt_tile + counts["C"] * config.acc_tile
    return SlabRun(stats=total, slabs=len(starts), slab_rows=slab_rows, checked_slabs=len(checked),
                   checked_rows=checked_rows, matched=matched, weight_pack_seconds=weight_s, pack_seconds=pack_s,
                   mac_total=counts["calls"] * gshape.macs, data_total=data_total, footprint_bytes=footprint,
                   output=out_buf if len(checked) == len(starts) else None)
