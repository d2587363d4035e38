"""Polyhedral operator representation (Rieber et al., §3.2): instance sets and access relations.

An operator is a rectangular instance set ``S = {[e0, ..., en] : 0 <= e_j < E_j}`` over named
iteration dimensions, one output access and two input accesses, each an affine map from ``S``
to a tensor's index space. The multiply/add statements of the paper's extra ``t`` dimension are
implicit: every instance is one multiply feeding one commutative add (the reduction self-edge).

Operators are built either from their TE definition (:func:`from_te`, for ``alt_tvm.ops.conv2d``,
``dense`` and ``batch_matmul``) or explicitly (:func:`conv2d_op`, :func:`dense_op`,
:func:`batch_matmul_op`) when no TE is at hand. Grouped convolutions read the input channel as
``(o // Og) * Ig + c``, which is not affine: :func:`from_te` splits ``o`` into ``(g, o)`` and the
channel dimensions of the tensors into ``(G, Ig)`` / ``(G, Og)`` views so that every access is
affine again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "AffineExpr",
    "IterDim",
    "Access",
    "TensorOp",
    "from_te",
    "conv2d_op",
    "dense_op",
    "batch_matmul_op",
]


@dataclass(frozen=True)
class AffineExpr:
    """``sum(coeff * dim) + const`` over named iteration dimensions (zero coefficients dropped)."""

    coeffs: tuple[tuple[str, int], ...]
    const: int = 0

    @staticmethod
    def of(terms: Mapping[str, int], const: int = 0) -> AffineExpr:
        return AffineExpr(tuple((k, int(v)) for k, v in terms.items() if v != 0), int(const))

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.coeffs)

    def coeff(self, dim: str) -> int:
        return dict(self.coeffs).get(dim, 0)

    def eval(self, point: Mapping[str, object]):
        """Evaluate on ints, NumPy arrays or CP-SAT linear expressions."""
        out = self.const
        for k, c in self.coeffs:
            out = out + c * point[k]
        return out

    def __str__(self) -> str:
        parts = [(k if c == 1 else f"{c}*{k}") for k, c in self.coeffs]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class IterDim:
    """One dimension of the instance set: ``0 <= name < extent``; ``kind`` is spatial or reduce."""

    name: str
    extent: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in ("spatial", "reduce"):
            raise ValueError(f"IterDim kind must be 'spatial' or 'reduce', got {self.kind!r}")
        if self.extent < 1:
            raise ValueError(f"IterDim {self.name!r} extent must be >= 1, got {self.extent}")


@dataclass(frozen=True)
class Access:
    """Access relation ``S -> tensor``: ``tensor[index[0](s), ..., index[k](s)]``."""

    tensor: str
    shape: tuple[int, ...]
    index: tuple[AffineExpr, ...]

    @property
    def dims(self) -> frozenset[str]:
        return frozenset(d for e in self.index for d in e.dims)

    def is_linear_in(self, dim: str) -> bool:
        """True when ``dim`` only occurs as a lone iterator with coefficient 1 (§4.2.3)."""
        for e in self.index:
            c = e.coeff(dim)
            if c and (c != 1 or len(e.coeffs) != 1):
                return False
        return True

    def relation(self, dims: Sequence[IterDim]) -> str:
        """The relation in the paper's notation, e.g. ``{[n,o,..] -> [n', ...] : n' = n ∧ ...}``."""
        src = ",".join(d.name for d in dims)
        tgt = ",".join(f"i{j}'" for j in range(len(self.index)))
        cond = " ∧ ".join(f"i{j}' = {e}" for j, e in enumerate(self.index))
        return f"{{[{src}] -> {self.tensor}[{tgt}] : {cond}}}"


@dataclass(frozen=True)
class TensorOp:
    """``out[f_o(s)] += a[f_a(s)] * b[f_b(s)]`` for ``s`` in the instance set.

    ``static`` names the dimensions TVM's old static template maps onto the GEMM axes
    (``x``: batch, ``y``: output channels, ``z``: input channels) -- the reference strategy.
    """

    name: str
    dims: tuple[IterDim, ...]
    output: Access
    inputs: tuple[Access, Access]
    static: Mapping[str, str] = field(default_factory=dict)
    in_dtype: str = "int8"
    acc_dtype: str = "int32"

    def __post_init__(self) -> None:
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate iteration dimension names in {names}")
        for acc in (self.output, *self.inputs):
            unknown = acc.dims - set(names)
            if unknown:
                raise ValueError(f"access to {acc.tensor!r} uses unknown dimensions {sorted(unknown)}")
            if len(acc.shape) != len(acc.index):
                raise ValueError(f"access to {acc.tensor!r} has {len(acc.index)} indices for rank {len(acc.shape)}")

    def dim(self, name: str) -> IterDim:
        for d in self.dims:
            if d.name == name:
                return d
        raise ValueError(f"{self.name} has no dimension {name!r}; dimensions are {[d.name for d in self.dims]}")

    @property
    def extents(self) -> dict[str, int]:
        return {d.name: d.extent for d in self.dims}

    @property
    def macs(self) -> int:
        return int(np.prod([d.extent for d in self.dims], dtype=np.int64))

    def instance_set(self) -> str:
        """The instance set in the notation of the paper's equation (1)."""
        vs = ",".join(d.name for d in self.dims)
        cond = " ∧ ".join(f"0 <= {d.name} < {d.extent}" for d in self.dims)
        return f"{{[{vs}] : {cond}}}"

    def describe(self) -> str:
        lines = [f"{self.name}: S = {self.instance_set()}"]
        for role, acc in (("out", self.output), ("A", self.inputs[0]), ("B", self.inputs[1])):
            lines.append(f"  {role}: {acc.relation(self.dims)}")
        return "\n".join(lines)


def _aff(**terms: int) -> AffineExpr:
    return AffineExpr.of(terms)


def conv2d_op(
    *,
    n: int,
    c: int,
    h: int,
    w: int,
    k: int,
    r: int,
    s: int,
    pad_h: int = 0,
    pad_w: int = 0,
    stride_h: int = 1,
    stride_w: int = 1,
    dilation_h: int = 1,
    dilation_w: int = 1,
    groups: int = 1,
) -> TensorOp:
    """Explicit conv2d (NCHW / OIHW) on the zero-padded input, named as :func:`from_te` names it.

    Parameters
    ----------
    n, c, h, w : int
        Batch, input channels, input height and width (before padding).
    k, r, s : int
        Output channels, filter height and width.
    pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, groups : int
        As in ``torch.nn.functional.conv2d``.

    Returns
    -------
    TensorOp
    """
    vals = dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride_h=stride_h, stride_w=stride_w,
                dilation_h=dilation_h, dilation_w=dilation_w, groups=groups)
    for key, v in vals.items():
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"conv2d_op {key} must be a positive int, got {v!r}")
    if pad_h < 0 or pad_w < 0:
        raise ValueError(f"conv2d_op padding must be >= 0, got pad_h={pad_h}, pad_w={pad_w}")
    if c % groups or k % groups:
        raise ValueError(f"conv2d_op channels c={c} and k={k} must be divisible by groups={groups}")
    hp, wp = h + 2 * pad_h, w + 2 * pad_w
    oh = (hp - dilation_h * (r - 1) - 1) // stride_h + 1
    ow = (wp - dilation_w * (s - 1) - 1) // stride_w + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"conv2d_op output would be empty: {oh}x{ow}")
    ig, og = c // groups, k // groups
    hi = AffineExpr.of({"h": stride_h, "rh": dilation_h})
    wi = AffineExpr.of({"w": stride_w, "rw": dilation_w})
    if groups == 1:
        dims = (IterDim("n", n, "spatial"), IterDim("o", k, "spatial"), IterDim("h", oh, "spatial"),
                IterDim("w", ow, "spatial"), IterDim("rc", c, "reduce"), IterDim("rh", r, "reduce"),
                IterDim("rw", s, "reduce"))
        out = Access("out", (n, k, oh, ow), (_aff(n=1), _aff(o=1), _aff(h=1), _aff(w=1)))
        data = Access("data", (n, c, hp, wp), (_aff(n=1), _aff(rc=1), hi, wi))
        weight = Access("weight", (k, c, r, s), (_aff(o=1), _aff(rc=1), _aff(rh=1), _aff(rw=1)))
    else:
        dims = (IterDim("n", n, "spatial"), IterDim("g", groups, "spatial"), IterDim("o", og, "spatial"),
                IterDim("h", oh, "spatial"), IterDim("w", ow, "spatial"), IterDim("rc", ig, "reduce"),
                IterDim("rh", r, "reduce"), IterDim("rw", s, "reduce"))
        out = Access("out", (n, groups, og, oh, ow), (_aff(n=1), _aff(g=1), _aff(o=1), _aff(h=1), _aff(w=1)))
        data = Access("data", (n, groups, ig, hp, wp), (_aff(n=1), _aff(g=1), _aff(rc=1), hi, wi))
        weight = Access("weight", (groups, og, ig, r, s),
                        (_aff(g=1), _aff(o=1), _aff(rc=1), _aff(rh=1), _aff(rw=1)))
    return TensorOp("conv2d", dims, out, (data, weight), static={"x": "n", "y": "o", "z": "rc"})


def dense_op(*, m: int, n: int, k: int) -> TensorOp:
    """Explicit dense ``out[i, j] = sum_k data[i, k] * weight[j, k]`` (``data`` M×K, ``weight`` N×K)."""
    for key, v in dict(m=m, n=n, k=k).items():
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"dense_op {key} must be a positive int, got {v!r}")
    dims = (IterDim("i", m, "spatial"), IterDim("j", n, "spatial"), IterDim("k", k, "reduce"))
    out = Access("out", (m, n), (_aff(i=1), _aff(j=1)))
    data = Access("data", (m, k), (_aff(i=1), _aff(k=1)))
    weight = Access("weight", (n, k), (_aff(j=1), _aff(k=1)))
    return TensorOp("dense", dims, out, (data, weight), static={"x": "i", "y": "j", "z": "k"})


def batch_matmul_op(*, b: int, m: int, n: int, k: int, transpose_b: bool = True) -> TensorOp:
    """Explicit ``out[z, i, j] = sum_k a[z, i, k] * b[z, j, k]`` (``b[z, k, j]`` if not ``transpose_b``)."""
    for key, v in dict(b=b, m=m, n=n, k=k).items():
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"batch_matmul_op {key} must be a positive int, got {v!r}")
    dims = (IterDim("z", b, "spatial"), IterDim("i", m, "spatial"), IterDim("j", n, "spatial"),
            IterDim("k", k, "reduce"))
    out = Access("out", (b, m, n), (_aff(z=1), _aff(i=1), _aff(j=1)))
    a = Access("a", (b, m, k), (_aff(z=1), _aff(i=1), _aff(k=1)))
    if transpose_b:
        bb = Access("b", (b, n, k), (_aff(z=1), _aff(j=1), _aff(k=1)))
    else:
        bb = Access("b", (b, k, n), (_aff(z=1), _aff(k=1), _aff(j=1)))
    return TensorOp("batch_matmul", dims, out, (a, bb), static={"x": "i", "y": "j", "z": "k"})


# ----------------------------------------------------------------------------- from TE


def _te_mul_operands(body):
    """Return the two ``te.tensor_load`` calls of ``sum(cast(a[..]) * cast(b[..]))``."""
    from tvm.ir.prim import expr as pexpr

    from alt_tvm.layout.expr import is_tensor_load

    src = body.source[0] if hasattr(body, "source") else body
    while isinstance(src, pexpr.Cast):
        src = src.value
    if not isinstance(src, pexpr.Mul):
        raise ValueError(f"expected a sum of products, got {type(src).__name__}: {src}")
    loads = []
    for side in (src.a, src.b):
        while isinstance(side, pexpr.Cast):
            side = side.value
        if not is_tensor_load(side):
            raise ValueError(f"expected a tensor read under the product, got {side}")
        loads.append((side.args[0], list(side.args[1:])))
    return loads


def _split_groups(indices, axis_vars, extents):
    """Find ``floordiv(v, og)`` on an axis var (grouped conv); return ``(var name, og)`` or None."""
    import tvm

    found = []

    def visit(node):
        if isinstance(node, tvm.tirx.FloorDiv) and isinstance(node.a, tvm.tirx.Var) and isinstance(
            node.b, tvm.tirx.IntImm
        ):
            found.append((node.a.name, int(node.b.value)))
        for child in ("a", "b", "value"):
            if hasattr(node, child) and not isinstance(getattr(node, child), (int, float, str)):
                visit(getattr(node, child))

    for e in indices:
        visit(e)
    names = {v.name for v in axis_vars}
    found = [f for f in found if f[0] in names]
    if len({f for f in found}) > 1:
        raise ValueError(f"cannot represent more than one floordiv split: {found}")
    return found[0] if found else None


def from_te(out) -> TensorOp:
    """Derive the instance set and access relations from a TE conv2d / dense / batch_matmul.

    Parameters
    ----------
    out : te.Tensor
        Output of ``alt_tvm.ops.conv2d`` (its ``pad`` stage is taken as part of the input:
        the operator reads the padded tensor), ``alt_tvm.ops.dense`` or ``batch_matmul``.

    Returns
    -------
    TensorOp

    Raises
    ------
    ValueError
        When the body is not ``sum(a[affine] * b[affine])`` up to the grouped-channel floordiv.
    """
    import tvm

    from alt_tvm.layout.expr import rebuild

    op = out.op
    if not hasattr(op, "reduce_axis") or len(op.reduce_axis) == 0:
        raise ValueError(f"{op.name}: expected a reduction compute, got {type(op).__name__}")
    tag = op.tag
    axes = list(op.axis) + list(op.reduce_axis)
    extents = {a.var.name: int(a.dom.extent) for a in axes}
    kinds = {a.var.name: "spatial" for a in op.axis} | {a.var.name: "reduce" for a in op.reduce_axis}
    (ta, ia), (tb, ib) = _te_mul_operands(op.body[0])
    out_idx = [a.var for a in op.axis]
    split = _split_groups(ia + ib, [a.var for a in op.axis], extents)

    vmap = {}
    order = [a.var.name for a in axes]
    if split is not None:
        vname, og = split
        groups = extents[vname] // og
        gvar = tvm.tirx.Var("g", str(axes[0].var.ty))
        ivar = tvm.tirx.Var(vname, str(axes[0].var.ty))
        old = next(a.var for a in op.axis if a.var.name == vname)
        vmap[old] = gvar * og + ivar
        extents["g"], extents[vname] = groups, og
        kinds["g"] = "spatial"
        order.insert(order.index(vname), "g")
    ana = tvm.sym.Analyzer()
    all_vars = {}
    for a in axes:
        v = a.var
        if split is not None and v.name == split[0]:
            continue
        all_vars[v.name] = v
    if split is not None:
        all_vars["g"], all_vars[split[0]] = gvar, ivar
    for name, v in all_vars.items():
        if extents[name] > 1:  # binding [0, 1) would fold the var to 0 and drop it from accesses
            ana.bind(v, tvm.ir.Range(0, extents[name]))

    def affine(e) -> AffineExpr:
        e = ana.simplify(rebuild(e, vmap=vmap) if vmap else e)
        vs = [all_vars[n] for n in order]
        co = tvm.sym.detect_linear_equation(e, vs)
        if len(co) == 0:
            raise ValueError(f"{op.name}: index {e} is not affine in {order}")
        return AffineExpr.of({n: int(c) for n, c in zip(order, co[:-1])}, int(co[-1]))

    def access(name, shape, idx) -> Access:
        exprs = [affine(e) for e in idx]
        shape = [int(x) for x in shape]
        if split is not None:
            # channel dim ``g*size + c`` -> two dims (G, size): a reshape of the tensor
            new_e, new_s = [], []
            for e, sz in zip(exprs, shape):
                cg = e.coeff("g")
                if cg and len(e.coeffs) == 2 and sz == cg * (sz // cg) and e.const == 0:
                    rest = [(k, c) for k, c in e.coeffs if k != "g"]
                    new_e += [AffineExpr((("g", 1),)), AffineExpr(tuple(rest))]
                    new_s += [sz // cg, cg]
                elif cg and len(e.coeffs) == 1 and e.const == 0 and cg == sz // (sz // cg):
                    new_e += [AffineExpr((("g", 1),)), AffineExpr((), 0)]
                    new_s += [sz // cg, cg]
                else:
                    new_e.append(e)
                    new_s.append(sz)
            exprs, shape = new_e, new_s
        return Access(name, tuple(shape), tuple(exprs))

    o_acc = access("out", out.shape, out_idx)
    a_acc = access("data" if tag == "conv2d" or tag == "dense" else "a", ta.shape, ia)
    b_acc = access("weight" if tag in ("conv2d", "dense") else "b", tb.shape, ib)
    dims = tuple(IterDim(n, extents[n], kinds[n]) for n in order)
    if tag == "conv2d":
        red = next(n for n in order if kinds[n] == "reduce")
        static = {"x": order[0], "y": order[2] if split else order[1], "z": red}
    else:
        sp = [n for n in order if kinds[n] == "spatial"]
        static = {"x": sp[-2], "y": sp[-1], "z": next(n for n in order if kinds[n] == "reduce")}
    return TensorOp(tag or op.name, dims, o_acc, (a_acc, b_acc), static=static,
                    in_dtype=str(ta.dtype), acc_dtype=str(out.dtype))
