"""From an embedding to a VTA program: tiling, layout rewrites, host packing, instruction stream.

The mapped dimensions are split by their factors (padded where the factor does not divide them)
and moved innermost (Table 2: pad, split, reorder, fuse); the operator's instance set becomes a
grid of GEMM calls. An operand tile is identified by the tensor element its first point reads
(plus the tile index of padded dimensions), so tiles that read the same data are packed once:
for TVM's static mapping this yields exactly the ``NCHW{x}c`` packed tensor, while mappings onto
stencil dimensions duplicate data (stencil unroll / im2col) and strided ones gather every
``s``-th element (image pack) -- the data-movement overhead of §4.4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .embedding import Embedding
from .polyhedral import Access, TensorOp
from .sim import Gemm, Load, Store, VTAConfig

__all__ = ["Plan", "plan", "layout_rewrites", "lower"]


@dataclass(frozen=True, eq=False)
class Plan:
    """The tiled operator for one embedding (arrays; build with :func:`plan`)."""

    op: TensorOp
    embedding: Embedding
    dims: tuple[str, ...]
    factors: np.ndarray  # per dim
    uops: np.ndarray  # (calls, 3): (C tile, A tile, B tile), sorted by C tile
    tile_origin: dict  # "A"/"B"/"C" -> (ntiles, D) origin of each tile in the instance space
    offsets: dict  # "A" -> (X, Z, D), "B" -> (Y, Z, D), "C" -> (X, Y, D)

    @property
    def accesses(self) -> dict[str, Access]:
        a, b = self.op.inputs[::-1] if self.embedding.swapped else self.op.inputs
        return {"A": a, "B": b, "C": self.op.output}

    @property
    def calls(self) -> int:
        return len(self.uops)

    @property
    def mac_total(self) -> int:
        return self.calls * self.embedding.shape.macs

    @property
    def ntiles(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.tile_origin.items()}

    @property
    def data_total(self) -> int:
        """Elements of the packed A, B and C tensors (the §4.4 data-movement measure)."""
        g = self.embedding.shape
        n = self.ntiles
        return n["A"] * g.batch * g.block_in + n["B"] * g.block_out * g.block_in + n["C"] * g.batch * g.block_out

    @property
    def data_min(self) -> int:
        return sum(int(np.prod(a.shape)) for a in (self.op.output, *self.op.inputs))

    # ------------------------------------------------------------------ host packing
    def _gather(self, kind: str, tensor: np.ndarray) -> np.ndarray:
        acc = self.accesses[kind]
        if tuple(tensor.shape) != tuple(acc.shape):
            raise ValueError(f"{acc.tensor} must have shape {acc.shape}, got {tensor.shape}")
        pts = self.tile_origin[kind][:, None, None, :] + self.offsets[kind][None]
        ext = np.array([self.op.extents[d] for d in self.dims])
        used = np.array([d in acc.dims for d in self.dims])
        valid = np.all((pts < ext) | ~used, axis=-1)
        idx = []
        for e, size in zip(acc.index, acc.shape):
            v = e.const + sum(c * pts[..., self.dims.index(d)] for d, c in e.coeffs)
            v = np.broadcast_to(v, valid.shape)
            valid = valid & (v >= 0) & (v < size)
            idx.append(np.clip(v, 0, size - 1))
        return np.where(valid, tensor[tuple(idx)], 0).astype(tensor.dtype)

    def pack(self, a_tensor: np.ndarray, b_tensor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pack the operator's two inputs (canonical layouts) into DRAM tile arrays ``inp``, ``wgt``."""
        if self.embedding.swapped:
            a_tensor, b_tensor = b_tensor, a_tensor
        return self._gather("A", a_tensor), self._gather("B", b_tensor)

    def unpack(self, out_tiles: np.ndarray) -> np.ndarray:
        """Scatter the DRAM output tiles back into the operator's output tensor (padding dropped)."""
        acc = self.op.output
        pts = self.tile_origin["C"][:, None, None, :] + self.offsets["C"][None]
        ext = np.array([self.op.extents[d] for d in self.dims])
        valid = np.all(pts < ext, axis=-1)
        out = np.zeros(acc.shape, out_tiles.dtype)
        idx = [np.broadcast_to(e.const + sum(c * pts[..., self.dims.index(d)] for d, c in e.coeffs), valid.shape)
               for e in acc.index]
        out[tuple(i[valid] for i in idx)] = out_tiles[valid]
        return out


def _offsets(emb: Embedding, dims: list[str], a1: str, a2: str) -> np.ndarray:
    sizes = emb.shape.axes
    out = np.zeros((sizes[a1], sizes[a2], len(dims)), np.int64)
    for i in range(sizes[a1]):
        for j in range(sizes[a2]):
            for ax, k in ((a1, i), (a2, j)):
                for d, v in emb.offset(ax, k).items():
                    out[i, j, dims.index(d)] += v
    return out


def plan(op: TensorOp, emb: Embedding) -> Plan:
    """Tile ``op`` by the embedding's rectangles.

    Raises
    ------
    ValueError
        For a non-dense embedding (strided rectangles interleave tiles; not generated).
    """
    if not emb.is_dense:
        raise ValueError(f"only dense embeddings can be lowered, got strides {emb.strides}")
    dims = [d.name for d in op.dims]
    fac = emb.factors
    for d in fac:
        op.dim(d)
    f = np.array([fac.get(d, 1) for d in dims], np.int64)
    ext = np.array([op.extents[d] for d in dims], np.int64)
    grid_shape = -(-ext // f)
    padded = {d for d, fd, e in zip(dims, f, ext) if e % fd}
    offsets = {"A": _offsets(emb, dims, "x", "z"), "B": _offsets(emb, dims, "y", "z"),
               "C": _offsets(emb, dims, "x", "y")}
    a_acc, b_acc = op.inputs[::-1] if emb.swapped else op.inputs
    accs = {"A": a_acc, "B": b_acc, "C": op.output}
    # tile keys: the access of the tile origin, plus the grid index of padded dims it reads
    grid = np.indices(grid_shape, dtype=np.int64).reshape(len(dims), -1).T
    origin = grid * f
    ids, tile_origin = {}, {}
    for kind, acc in accs.items():
        cols = [e.const + sum(c * origin[:, dims.index(d)] for d, c in e.coeffs) * np.ones(len(origin), np.int64)
                for e in acc.index]
        cols += [grid[:, dims.index(d)] for d in dims if d in padded and d in acc.dims]
        key = np.stack(cols, axis=1) if cols else np.zeros((len(origin), 1), np.int64)
        _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
        ids[kind] = inv.reshape(-1)
        tile_origin[kind] = origin[first]
    uops = np.stack([ids["C"], ids["A"], ids["B"]], axis=1)
    uops = uops[np.lexsort((uops[:, 1], uops[:, 2], uops[:, 0]))]
    return Plan(op, emb, tuple(dims), f, uops, tile_origin, offsets)


def layout_rewrites(op: TensorOp, emb: Embedding) -> list[str]:
    """The Table 2 rewrites implied by the embedding, in order (descriptive strings)."""
    out = []
    a_acc, b_acc = op.inputs[::-1] if emb.swapped else op.inputs
    for axis, levels in emb.axes:
        for d, f, _ in levels:
            e = op.extents[d]
            for acc in (a_acc, b_acc):
                for ex in acc.index:
                    c = ex.coeff(d)
                    if c and len(ex.coeffs) > 1:
                        others = [k for k, _ in ex.coeffs if k != d]
                        if c == 1 or any(ex.coeff(k) == 1 for k in others):
                            out.append(f"stencil unroll {acc.tensor}[{ex}] -> [{', '.join([*others, d])}]")
                        else:
                            out.append(f"image pack {acc.tensor}[{ex}] (stride {c})")
            if e % f:
                out.append(f"pad {d}: {e} -> {-(-e // f) * f}")
            if f < e or e % f:
                out.append(f"split {d} by {f}")
        if len(levels) > 1:
            out.append(f"fuse ({', '.join(d for d, _, _ in reversed(levels))}) -> {axis}")
    mapped = [d for _, lv in emb.axes for d, _, _ in lv]
    if mapped:
        out.append(f"reorder: {', '.join(mapped)} innermost")
    return out


def _runs(dram: np.ndarray, sram: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal runs where DRAM tile ids and SRAM slots both increase by one: (dram, sram, length)."""
    if len(dram) == 0:
        return []
    br = np.flatnonzero((np.diff(dram) != 1) | (np.diff(sram) != 1)) + 1
    starts = np.concatenate([[0], br])
    ends = np.concatenate([br, [len(dram)]])
    return [(int(dram[s]), int(sram[s]), int(e - s)) for s, e in zip(starts, ends)]


def _dma(runs, make) -> list:
    """Merge equal-length runs with a constant DRAM stride and contiguous SRAM into 2-D transfers."""
    out, i = [], 0
    while i < len(runs):
        d0, s0, n = runs[i]
        j = i + 1
        stride = runs[j][0] - d0 if j < len(runs) else 0
        while (j < len(runs) and runs[j][2] == n and runs[j][0] - runs[j - 1][0] == stride and stride >= n
               and runs[j][1] == runs[j - 1][1] + n):
            j += 1
        rows = j - i
        out.append(make(d0, rows, n, stride if rows > 1 else n, s0))
        i = j
    return out


class _Buffer:
    def __init__(self, name: str, cap: int) -> None:
        self.name, self.cap, self.slot = name, cap, {}

    def ensure(self, needed: np.ndarray, prog: list) -> None:
        needed_set = set(needed.tolist())
        keep = {t: s for t, s in self.slot.items() if t in needed_set}
        used = set(keep.values())
        free = [s for s in range(self.cap) if s not in used]
        missing = np.array(sorted(needed_set - keep.keys()), np.int64)
        slots = np.array(free[: len(missing)], np.int64)
        for t, s in zip(missing.tolist(), slots.tolist()):
            keep[t] = s
        self.slot = keep
        prog += _dma(_runs(missing, slots), lambda d, y, x, st, s: Load(self.name, d, y, x, st, s))


def lower(p: Plan, config: VTAConfig) -> list:
    """Schedule the plan's GEMM calls into a VTA instruction stream that fits the buffers.

    Output tiles are taken in order in chunks that fit the accumulator and whose operand tiles
    fit the input and weight buffers; tiles already resident are not reloaded. A single output
    tile whose reduction does not fit is split into several accumulate passes.
    """
    if p.embedding.shape != config.gemm:
        raise ValueError(f"plan is for {p.embedding.shape}, config for {config.gemm}")
    prog: list = []
    inp, wgt = _Buffer("inp", config.inp_cap), _Buffer("wgt", config.wgt_cap)
    u = p.uops
    bounds = np.flatnonzero(np.diff(u[:, 0])) + 1
    per_c = np.split(u, bounds)

    def flush(chunk: list[np.ndarray]) -> None:
        if not chunk:
            return
        cs = np.array([c[0, 0] for c in chunk], np.int64)
        slot = {int(c): i for i, c in enumerate(cs)}
        allu = np.concatenate(chunk)
        acc_slots = np.array([slot[int(c)] for c in allu[:, 0]], np.int64)
        prog.append(Gemm(np.stack([np.arange(len(cs)), np.zeros(len(cs), np.int64), np.zeros(len(cs), np.int64)],
                                  axis=1), reset=True))
        # passes over the reduction that fit the operand buffers
        start = 0
        while start < len(allu):
            a_seen, b_seen, end = set(), set(), start
            while end < len(allu):
                a, b = int(allu[end, 1]), int(allu[end, 2])
                na, nb = len(a_seen | {a}), len(b_seen | {b})
                if na > config.inp_cap or nb > config.wgt_cap:
                    break
                a_seen.add(a)
                b_seen.add(b)
                end += 1
            seg = allu[start:end]
            inp.ensure(seg[:, 1], prog)
            wgt.ensure(seg[:, 2], prog)
            prog.append(Gemm(np.stack([acc_slots[start:end], [inp.slot[int(a)] for a in seg[:, 1]],
                                       [wgt.slot[int(b)] for b in seg[:, 2]]], axis=1).astype(np.int64)))
            start = end
        prog.extend(_dma(_runs(cs, np.arange(len(cs))), lambda d, y, x, st, s: Store(s, d, y, x, st)))

    chunk: list[np.ndarray] = []
    a_set: set = set()
    b_set: set = set()
    for cu in per_c:
        na, nb = a_set | set(cu[:, 1].tolist()), b_set | set(cu[:, 2].tolist())
        if chunk and (len(chunk) >= config.acc_cap or len(na) > config.inp_cap or len(nb) > config.wgt_cap):
            flush(chunk)
            chunk, na, nb = [], set(cu[:, 1].tolist()), set(cu[:, 2].tolist())
        chunk.append(cu)
        a_set, b_set = na, nb
    flush(chunk)
    return prog
