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
from .polyhedral import Access, AffineExpr, TensorOp
from .sim import Gemm, Load, Store, VTAConfig

__all__ = ["Plan", "plan", "layout_rewrites", "lower", "tile_counts"]


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
    def _points(self, kind: str, acc: Access) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Tensor indices ``(tiles, rows, cols)`` of every tile element, and the in-range mask.

        Accesses are affine, so each index is ``e(tile origin)[:, None, None] + e(offset)[None]``:
        no ``(tiles, rows, cols, dims)`` point array is materialised.
        """
        org, off = self.tile_origin[kind], self.offsets[kind]
        valid = None
        for j, d in enumerate(self.dims):
            e = self.op.extents[d]
            if d in acc.dims and e % int(self.factors[j]):  # only padded dims leave the instance set
                m = (org[:, j][:, None, None] + off[..., j][None]) < e
                valid = m if valid is None else valid & m
        idx = []
        for e, size in zip(acc.index, acc.shape):
            v = (e.const + sum(c * org[:, self.dims.index(d)] for d, c in e.coeffs))
            w = sum(c * off[..., self.dims.index(d)] for d, c in e.coeffs)
            v = np.asarray(v, np.int64).reshape(-1, 1, 1) + np.asarray(w, np.int64)[None]
            v = np.broadcast_to(v, (len(org), *off.shape[:2]))
            if valid is not None:  # padded points may index past the tensor: clamp, masked below
                v = np.clip(v, 0, size - 1)
            idx.append(v)
        return idx, valid

    def _gather(self, kind: str, tensor: np.ndarray) -> np.ndarray:
        acc = self.accesses[kind]
        if tuple(tensor.shape) != tuple(acc.shape):
            raise ValueError(f"{acc.tensor} must have shape {acc.shape}, got {tensor.shape}")
        idx, valid = self._points(kind, acc)
        vals = tensor[tuple(idx)]
        return (vals if valid is None else np.where(valid, vals, 0)).astype(tensor.dtype, copy=False)

    def pack(self, a_tensor: np.ndarray, b_tensor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pack the operator's two inputs (canonical layouts) into DRAM tile arrays ``inp``, ``wgt``."""
        if self.embedding.swapped:
            a_tensor, b_tensor = b_tensor, a_tensor
        return self._gather("A", a_tensor), self._gather("B", b_tensor)

    def pack_operand(self, *, index: int, tensor: np.ndarray) -> np.ndarray:
        """Pack one operator input (``index`` 0: data, 1: weight) into its DRAM tile array.

        Lets a caller pack constant weights once, at build time, and only the data per call.
        Any array view with the canonical shape works (e.g. a transposed NHWC buffer).

        Returns
        -------
        np.ndarray
            ``inp`` tiles when the input plays operand A, ``wgt`` tiles when it plays B.
        """
        if index not in (0, 1):
            raise ValueError(f"index must be 0 (data) or 1 (weight), got {index!r}")
        role = "A" if (index == 0) != self.embedding.swapped else "B"
        return self._gather(role, tensor)

    def operand_role(self, index: int) -> str:
        """``"inp"`` or ``"wgt"``: the DRAM array that operator input ``index`` is packed into."""
        if index not in (0, 1):
            raise ValueError(f"index must be 0 (data) or 1 (weight), got {index!r}")
        return "inp" if (index == 0) != self.embedding.swapped else "wgt"

    def unpack(self, out_tiles: np.ndarray, *, into: np.ndarray | None = None) -> np.ndarray:
        """Scatter the DRAM output tiles back into the operator's output tensor (padding dropped).

        ``into`` (any writable array or view of the output's canonical shape, e.g. a transposed
        NHWC buffer) receives the values in place instead of a new array.
        """
        acc = self.op.output
        idx, valid = self._points("C", acc)
        if into is None:
            out = np.zeros(acc.shape, out_tiles.dtype)
        elif tuple(into.shape) != tuple(acc.shape):
            raise ValueError(f"into must have shape {acc.shape}, got {into.shape}")
        else:
            out = into
        if valid is None:
            out[tuple(idx)] = out_tiles
        else:
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


def _flat_key(key: np.ndarray) -> np.ndarray:
    """Rows of ``key`` as one int64 each, order-preserving (1-D unique is much faster than axis=0)."""
    lo = key.min(axis=0)
    span = key.max(axis=0) - lo + 1
    if float(np.prod(span.astype(np.float64))) >= 2.0**62:
        return np.unique(key, axis=0, return_inverse=True)[1].reshape(-1)  # rare: fall back
    flat = np.zeros(len(key), np.int64)
    for j in range(key.shape[1]):
        flat = flat * span[j] + (key[:, j] - lo[j])
    return flat


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
        _, first, inv = np.unique(_flat_key(key), return_index=True, return_inverse=True)
        ids[kind] = inv.reshape(-1)
        tile_origin[kind] = origin[first]
    uops = np.stack([ids["C"], ids["A"], ids["B"]], axis=1)
    uops = uops[np.lexsort((uops[:, 1], uops[:, 2], uops[:, 0]))]
    return Plan(op, emb, tuple(dims), f, uops, tile_origin, offsets)


def tile_counts(op: TensorOp, emb: Embedding) -> dict[str, int]:
    """Number of GEMM calls and of distinct A, B and C tiles, without building the plan.

    Same tile identity as :func:`plan` (tensor element of the tile origin plus the grid index of
    padded dimensions), counted per group of key columns that share operator dimensions: the grid
    is a box, so the key set is the product of the groups' sets. Cheap enough to rank every
    candidate of a full-size layer.
    """
    dims = [d.name for d in op.dims]
    fac = emb.factors
    f = {d: fac.get(d, 1) for d in dims}
    grid = {d: -(-op.extents[d] // f[d]) for d in dims}
    padded = {d for d in dims if op.extents[d] % f[d]}
    a_acc, b_acc = op.inputs[::-1] if emb.swapped else op.inputs
    out = {"calls": int(np.prod([grid[d] for d in dims], dtype=np.int64))}
    for kind, acc in (("A", a_acc), ("B", b_acc), ("C", op.output)):
        cols = [(set(e.dims), e) for e in acc.index] + [({d}, d) for d in dims if d in padded and d in acc.dims]
        groups: list[tuple[set, list]] = []
        for ds, col in cols:  # merge columns into connected groups by shared dims
            hit = [g for g in groups if g[0] & ds]
            merged = (set(ds).union(*[g[0] for g in hit]), [col] + [c for g in hit for c in g[1]])
            groups = [g for g in groups if not any(g is h for h in hit)] + [merged]
        count = 1
        for ds, gcols in groups:
            names = sorted(ds)
            if not names:
                continue
            pts = np.indices([grid[d] for d in names], dtype=np.int64).reshape(len(names), -1)
            pt = {d: pts[j] * f[d] for j, d in enumerate(names)}
            key = [c.eval(pt) * np.ones(pts.shape[1], np.int64) if isinstance(c, AffineExpr)
                   else pts[names.index(c)] for c in gcols]
            count *= len(np.unique(np.stack(key, axis=1), axis=0))
        out[kind] = count
    return out


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
    return list(zip(dram[starts].tolist(), sram[starts].tolist(), (ends - starts).tolist()))


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
    """Resident tiles of one SRAM buffer as sorted id -> slot arrays (vectorised lookups)."""

    def __init__(self, name: str, cap: int) -> None:
        self.name, self.cap = name, cap
        self.ids = np.empty(0, np.int64)
        self.slots = np.empty(0, np.int64)

    def ensure(self, needed: np.ndarray, prog: list) -> None:
        need = np.unique(needed)
        keep = np.isin(self.ids, need, assume_unique=True)
        kid, ksl = self.ids[keep], self.slots[keep]
        missing = np.setdiff1d(need, kid, assume_unique=True)
        free = np.setdiff1d(np.arange(self.cap, dtype=np.int64), ksl, assume_unique=True)[: len(missing)]
        ids, slots = np.concatenate([kid, missing]), np.concatenate([ksl, free])
        order = np.argsort(ids, kind="stable")
        self.ids, self.slots = ids[order], slots[order]
        prog += _dma(_runs(missing, free), lambda d, y, x, st, s: Load(self.name, d, y, x, st, s))

    def lookup(self, tiles: np.ndarray) -> np.ndarray:
        return self.slots[np.searchsorted(self.ids, tiles)]


def _fit_prefix(u: np.ndarray, start: int, stop: int, inp_cap: int, wgt_cap: int) -> int:
    """Length of the longest prefix of ``u[start:stop]`` whose distinct A and B tiles fit the buffers.

    Grows the examined window geometrically so long reductions are not re-scanned per chunk.
    """
    width = 1024
    while True:
        end = min(stop, start + width)
        seg = u[start:end]
        over = None
        for col, cap in ((1, inp_cap), (2, wgt_cap)):
            first = np.zeros(len(seg), bool)
            first[np.unique(seg[:, col], return_index=True)[1]] = True
            bad = np.flatnonzero(np.cumsum(first) > cap)
            if len(bad):
                over = int(bad[0]) if over is None else min(over, int(bad[0]))
        if over is not None:
            return over
        if end == stop:
            return end - start
        width *= 4


def lower(p: Plan, config: VTAConfig) -> list:
    """Schedule the plan's GEMM calls into a VTA instruction stream that fits the buffers.

    Output tiles are taken in order in chunks that fit the accumulator and whose operand tiles
    fit the input and weight buffers; tiles already resident are not reloaded. A single output
    tile whose reduction does not fit is split into several accumulate passes. Vectorised with
    NumPy per chunk (no per-micro-op Python), so full-size layers lower in seconds.
    """
    if p.embedding.shape != config.gemm:
        raise ValueError(f"plan is for {p.embedding.shape}, config for {config.gemm}")
    prog: list = []
    inp, wgt = _Buffer("inp", config.inp_cap), _Buffer("wgt", config.wgt_cap)
    u = p.uops
    # uops are sorted by C tile and every C tile 0..nC-1 has at least one call
    c_start = np.concatenate([[0], np.flatnonzero(np.diff(u[:, 0])) + 1, [len(u)]])
    n_c = len(c_start) - 1
    i = 0
    while i < n_c:
        j_max = min(n_c, i + config.acc_cap)
        fit = _fit_prefix(u, int(c_start[i]), int(c_start[j_max]), config.inp_cap, config.wgt_cap)
        j = int(np.searchsorted(c_start, c_start[i] + fit, side="right")) - 1
        j = max(j, i + 1)  # one output tile alone may exceed the buffers: split into passes below
        lo, hi = int(c_start[i]), int(c_start[j])
        allu = u[lo:hi]
        prog.append(Gemm(np.stack([np.arange(j - i, dtype=np.int64), np.zeros(j - i, np.int64),
                                   np.zeros(j - i, np.int64)], axis=1), reset=True))
        start = 0
        while start < len(allu):
            end = start + max(1, _fit_prefix(allu, start, len(allu), config.inp_cap, config.wgt_cap))
            seg = allu[start:end]
            inp.ensure(seg[:, 1], prog)
            wgt.ensure(seg[:, 2], prog)
            prog.append(Gemm(np.stack([seg[:, 0] - i, inp.lookup(seg[:, 1]), wgt.lookup(seg[:, 2])], axis=1)))
            start = end
        prog.append(Store(0, i, 1, j - i, j - i))
        i = j
    return prog
