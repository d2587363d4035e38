"""TIR for an embedding: the GEMM calls as a loop nest whose blocks are ``tensorize``d by a VTA GEMM intrinsic.

:func:`gemm_intrin` registers (once per GEMM shape and callee) a ``tvm.s_tir.TensorIntrin`` whose
description is the int8 x int8 -> int32 block ``C[x, y] += A[x, z] * B[y, z]`` of shape
``(BATCH, BLOCK_OUT, BLOCK_IN)`` and whose implementation is one ``T.call_packed`` of a global
function -- the stand-in for VTA's GEMM instruction (VTA's runtime is gone from TVM, so the
accelerator is whatever that function does; :func:`register_numpy_gemm` installs a NumPy one).

:func:`emit_tir` builds, for an operator and a dense embedding, the packed operand tensors (one
tile per distinct tile key of :func:`~.rewrite.plan`, laid out on an affine grid of those keys)
and a TE compute over the embedding's tile grid: one GEMM call per grid point, reading
``A[key_A(g), x, z]`` and ``B[key_B(g), y, z]`` and accumulating ``C[g_spatial, x, y]``. The
schedule moves the reduction grid outside the tile loops, splits off the initialisation and
tensorizes the tile loops with the intrinsic. Host packing and unpacking reuse the plan's
gathers, so NCHW and NHWC data are read in place (:func:`conv2d_tir`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dfg import GemmShape
from .embedding import Embedding
from .polyhedral import TensorOp, conv2d_op
from .rewrite import Plan, plan

__all__ = ["DEFAULT_GEMM_FUNC", "TIRKernel", "conv2d_tir", "emit_tir", "gemm_intrin", "intrinsic_calls",
           "register_numpy_gemm"]

#: Global function the intrinsic's implementation calls (one VTA GEMM instruction on one block).
DEFAULT_GEMM_FUNC = "alt_tvm.vta.gemm_block"


def _check_shape(shape: GemmShape) -> None:
    if shape.block_out == 1 or shape.block_in == 1:
        raise ValueError(f"tensorize needs BLOCK_OUT > 1 and BLOCK_IN > 1, got {shape}")


@functools.cache
def gemm_intrin(shape: GemmShape, *, func: str = DEFAULT_GEMM_FUNC) -> str:
    """Register the VTA GEMM ``TensorIntrin`` for ``shape`` calling packed function ``func``; return its name.

    Parameters
    ----------
    shape : GemmShape
        ``(BATCH, BLOCK_OUT, BLOCK_IN)``; BLOCK_OUT and BLOCK_IN must exceed 1 (unit tile loops
        would be folded away by the TVMScript parser and no longer match the workload).
    func : str
        Global function called as ``func(A, B, C)`` with the ``BATCH x BLOCK_IN`` int8,
        ``BLOCK_OUT x BLOCK_IN`` int8 and ``BATCH x BLOCK_OUT`` int32 blocks (tensor views); it
        must add ``A @ B.T`` into ``C``.

    Returns
    -------
    str
        The intrinsic's name for ``Schedule.tensorize``.
    """
    import tvm

    _check_shape(shape)
    if not func or not isinstance(func, str):
        raise ValueError(f"func must be a non-empty string, got {func!r}")
    x, y, z = shape.batch, shape.block_out, shape.block_in
    name = f"alt_vta_gemm_{x}x{y}x{z}_{func.replace('.', '_')}"
    head = (
        "@T.prim_func(private=True, s_tir=True)\n"
        "def func(a: T.handle, b: T.handle, c: T.handle):\n"
        f"    A = T.match_buffer(a, ({x}, {z}), 'int8', offset_factor=1)\n"
        f"    B = T.match_buffer(b, ({y}, {z}), 'int8', offset_factor=1)\n"
        f"    C = T.match_buffer(c, ({x}, {y}), 'int32', offset_factor=1)\n"
        "    with T.sblock('root'):\n"
        f"        T.reads(C[0:{x}, 0:{y}], A[0:{x}, 0:{z}], B[0:{y}, 0:{z}])\n"
        f"        T.writes(C[0:{x}, 0:{y}])\n"
    )
    if x > 1:
        body = (f"        for i, j, k in T.grid({x}, {y}, {z}):\n"
                "            with T.sblock('update'):\n"
                "                vi, vj, vk = T.axis.remap('SSR', [i, j, k])\n")
        ci, ai = "vi", "vi"
    else:  # a unit batch loop is folded by the parser: describe the block without it
        body = (f"        for j, k in T.grid({y}, {z}):\n"
                "            with T.sblock('update'):\n"
                "                vj, vk = T.axis.remap('SR', [j, k])\n")
        ci, ai = "0", "0"
    desc = head + body + (f"                C[{ci}, vj] = C[{ci}, vj] + T.Cast('int32', A[{ai}, vk]) * "
                          "T.Cast('int32', B[vj, vk])\n")

    # tvm_stack_make_array by hand: the parser does not pack match_buffers for call_packed
    def arr(buf: str, rows: int, cols: int, dtype: str) -> str:
        return (f"T.tvm_stack_make_array({buf}.data, T.tvm_stack_make_shape({rows}, {cols}), 0, 2, "
                f"T.{dtype}(0), {buf}.elem_offset)")

    impl = head + (f"        T.evaluate(T.call_packed('{func}', {arr('A', x, z, 'int8')}, "
                   f"{arr('B', y, z, 'int8')}, {arr('C', x, y, 'int32')}))\n")
    tvm.s_tir.TensorIntrin.register(name, tvm.script.from_source(desc), tvm.script.from_source(impl),
                                    override=True)
    return name


def register_numpy_gemm(*, name: str = DEFAULT_GEMM_FUNC) -> dict:
    """Register a NumPy implementation of the GEMM block under global function ``name``.

    Returns
    -------
    dict
        ``{"calls": n}``, incremented on every call (a check that the intrinsic really ran).
    """
    import tvm_ffi

    counter = {"calls": 0}

    def gemm_block(a: Any, b: Any, c: Any) -> None:
        # .numpy() / copyfrom honour the views' element offsets into the packed tensors
        acc = c.numpy() + a.numpy().astype(np.int32) @ b.numpy().astype(np.int32).T
        c.copyfrom(acc)
        counter["calls"] += 1

    tvm_ffi.register_global_func(name, gemm_block, override=True)
    return counter


@dataclass(frozen=True)
class _KeyCol:
    coeffs: tuple[tuple[str, int], ...]  # grid dim -> coefficient
    extent: int


def _key_columns(p: Plan, kind: str) -> list[_KeyCol]:
    """Affine columns over the tile grid that identify a tile of ``kind`` (the plan's keys, compacted)."""
    op = p.op
    f = {d: int(v) for d, v in zip(p.dims, p.factors)}
    grid = {d: -(-op.extents[d] // f[d]) for d in p.dims}
    acc = p.accesses[kind]
    cols: list[_KeyCol] = []
    for e in acc.index:
        terms = {d: c * f[d] for d, c in e.coeffs if grid[d] > 1}
        if not terms:
            continue  # constant over the grid
        if any(v < 0 for v in terms.values()):
            raise ValueError(f"negative access coefficients in {acc.tensor}[{e}] are not supported")
        q = math.gcd(*terms.values())
        coeffs = tuple((d, v // q) for d, v in terms.items())
        cols.append(_KeyCol(coeffs, sum(v * (grid[d] - 1) for d, v in coeffs) + 1))
    for d in p.dims:
        padded = op.extents[d] % f[d] != 0
        if padded and d in acc.dims and grid[d] > 1 and not any(c.coeffs == ((d, 1),) for c in cols):
            cols.append(_KeyCol(((d, 1),), grid[d]))
    return cols


def _eval_cols(cols: list[_KeyCol], point: dict) -> list:
    return [sum(c * point[d] for d, c in col.coeffs) for col in cols]


@dataclass(frozen=True, eq=False)
class TIRKernel:
    """A tensorized TIR kernel for one operator and embedding, with host packing around it.

    Attributes
    ----------
    func : tvm.tirx.PrimFunc
        ``main(A_pack, B_pack, C_pack)`` after ``tensorize``.
    intrin : str
        Name of the GEMM ``TensorIntrin`` it uses.
    gemm_func : str
        Global function the intrinsic calls.
    """

    op: TensorOp
    embedding: Embedding
    plan: Plan
    func: Any
    intrin: str
    gemm_func: str
    cols: dict
    shapes: dict

    def pack_operand(self, *, index: int, tensor: np.ndarray) -> np.ndarray:
        """Operator input ``index`` (0: data, 1: weight; canonical shape, any view) as its packed tensor."""
        kind = "A" if self.plan.operand_role(index) == "inp" else "B"
        tiles = self.plan.pack_operand(index=index, tensor=tensor)
        out = np.zeros(self.shapes[kind], np.int8)
        grid = self.plan.tile_origin[kind] // self.plan.factors
        key = _eval_cols(self.cols[kind], {d: grid[:, j] for j, d in enumerate(self.plan.dims)})
        out[tuple(key)] = tiles
        return out

    def unpack(self, c_pack: np.ndarray, *, into: np.ndarray | None = None) -> np.ndarray:
        """The operator's output (canonical shape, or written into the view ``into``)."""
        grid = self.plan.tile_origin["C"] // self.plan.factors
        key = _eval_cols(self.cols["C"], {d: grid[:, j] for j, d in enumerate(self.plan.dims)})
        return self.plan.unpack(c_pack[tuple(key)], into=into)

    def build(self, *, target: str = "llvm") -> Any:
        """Compile with ``tvm.compile``; the result's ``["main"]`` takes the packed A, B, C tensors."""
        import tvm

        return tvm.compile(tvm.IRModule({"main": self.func}), target=target)

    def run(self, module: Any, *, a_pack: np.ndarray, b_pack: np.ndarray) -> np.ndarray:
        """Run a built module on packed operands; returns the packed int32 output."""
        import tvm

        dev = tvm.cpu()
        args = [tvm.runtime.tensor(np.ascontiguousarray(a_pack), dev),
                tvm.runtime.tensor(np.ascontiguousarray(b_pack), dev),
                tvm.runtime.tensor(np.zeros(self.shapes["C"], np.int32), dev)]
        module["main"](*args)
        return args[2].numpy()


def emit_tir(*, op: TensorOp, embedding: Embedding, gemm_func: str = DEFAULT_GEMM_FUNC) -> TIRKernel:
    """Emit the tensorized TIR of ``op`` under a dense ``embedding``.

    Parameters
    ----------
    op : TensorOp
    embedding : Embedding
        Dense; its GEMM shape needs BLOCK_OUT > 1 and BLOCK_IN > 1.
    gemm_func : str
        Global function the GEMM intrinsic calls.

    Returns
    -------
    TIRKernel

    Raises
    ------
    ValueError
        For a non-dense embedding, unsupported GEMM shape or an output access that is not one
        grid dimension per index (not the case for conv2d, dense, batch_matmul).
    """
    import tvm
    from tvm import te

    shape = embedding.shape
    _check_shape(shape)
    p = plan(op, embedding)
    X, Y, Z = shape.batch, shape.block_out, shape.block_in
    cols = {k: _key_columns(p, k) for k in ("A", "B", "C")}
    f = {d: int(v) for d, v in zip(p.dims, p.factors)}
    grid = {d: -(-op.extents[d] // f[d]) for d in p.dims}
    out_dims = []
    for col in cols["C"]:
        if len(col.coeffs) != 1 or col.coeffs[0][1] != 1:
            raise ValueError(f"output key column {col} is not a single grid dimension")
        out_dims.append(col.coeffs[0][0])
    red_dims = [d for d in p.dims if d not in out_dims]
    shapes = {"A": [c.extent for c in cols["A"]] + [X, Z], "B": [c.extent for c in cols["B"]] + [Y, Z],
              "C": [grid[d] for d in out_dims] + [X, Y]}
    a_t = te.placeholder(shapes["A"], "int8", name="A_pack")
    b_t = te.placeholder(shapes["B"], "int8", name="B_pack")
    raxes = [te.reduce_axis((0, grid[d]), f"{d}_o") for d in red_dims]
    zax = te.reduce_axis((0, Z), "z")

    def body(*idx):
        pt = dict(zip(out_dims, idx[:-2]))
        pt.update({d: ax.var for d, ax in zip(red_dims, raxes)})
        for d in p.dims:
            pt.setdefault(d, 0)
        x, y = idx[-2:]
        ka, kb = _eval_cols(cols["A"], pt), _eval_cols(cols["B"], pt)
        return te.sum(a_t[(*ka, x, zax)].astype("int32") * b_t[(*kb, y, zax)].astype("int32"), axis=[*raxes, zax])

    c_t = te.compute(shapes["C"], body, name="C_pack")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a_t, b_t, c_t]))
    block = sch.get_sblock("C_pack")
    loops = sch.get_loops(block)
    n_out = len(out_dims)
    spatial, (lx, ly), reds, lz = loops[:n_out], loops[n_out:n_out + 2], loops[n_out + 2:-1], loops[-1]
    sch.reorder(*spatial, *reds, lx, ly, lz)  # tile loops innermost: one GEMM call per grid point
    sch.decompose_reduction(block, reds[0] if reds else lx)
    name = gemm_intrin(shape, func=gemm_func)
    sch.tensorize(lx if X > 1 else ly, name)
    return TIRKernel(op, embedding, p, sch.mod["main"], name, gemm_func, cols, {k: tuple(v) for k, v in shapes.items()})


def intrinsic_calls(func: Any, *, gemm_func: str = DEFAULT_GEMM_FUNC) -> int:
    """Number of ``call_packed(gemm_func, ...)`` sites in a PrimFunc (static count, not executions)."""
    import tvm
    import tvm_ffi

    found = []

    # TVM 0.27 exposes no TIR post-order visitor to Python: walk the statement fields that can
    # hold statements or expressions
    def walk(node: Any) -> None:
        if node is None or isinstance(node, (int, float, str)):
            return
        if isinstance(node, (list, tuple)) or type(node).__name__ == "Array":
            for item in node:
                walk(item)
            return
        if isinstance(node, tvm.ir.expr.Call):
            if getattr(node.op, "name", "") == "tirx.tvm_call_packed":
                first = node.args[0]
                if isinstance(first, tvm.ir.expr.StringImm) and first.value == gemm_func:
                    found.append(node)
            walk(list(node.args))
            return
        for attr in ("body", "block", "init", "seq", "value", "then_case", "else_case", "condition"):
            child = getattr(node, attr, None)
            if isinstance(child, (tvm_ffi.core.Object, list, tuple)):
                walk(child)

    walk(func.body)
    return len(found)


def conv2d_tir(*, data: np.ndarray, weight: np.ndarray, embedding: Embedding | None = None,
               stride: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0),
               dilation: tuple[int, int] = (1, 1), groups: int = 1, data_layout: str = "NCHW",
               gemm: GemmShape | None = None, gemm_func: str = DEFAULT_GEMM_FUNC) -> tuple[np.ndarray, TIRKernel]:
    """int8 conv2d through the tensorized TIR kernel (built for llvm), with host packing for NCHW / NHWC.

    Parameters
    ----------
    data : np.ndarray
        int8 ``N C H W`` or ``N H W C`` (``data_layout``).
    weight : np.ndarray
        int8 ``O C/groups R S``; packed once, before the call.
    embedding : Embedding, optional
        Default: the best-ranked CSP embedding (``DEFAULT_CONSTRAINTS`` of the ``vta_gemm`` strategy).
    stride, padding, dilation : (int, int)
    groups : int
    data_layout : {"NCHW", "NHWC"}
    gemm : GemmShape, optional
    gemm_func : str
        Global function implementing the GEMM block (must be registered before the call).

    Returns
    -------
    (np.ndarray, TIRKernel)
        int32 output in ``data_layout``, and the kernel.
    """
    from .csp import Constraints, enumerate_embeddings
    from .select import rank

    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}")
    if data.dtype != np.int8 or weight.dtype != np.int8 or data.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"data and weight must be 4-D int8, got {data.dtype}{data.shape} and "
                         f"{weight.dtype}{weight.shape}")
    n, c, h, w = data.shape if data_layout == "NCHW" else (data.shape[0], data.shape[3], *data.shape[1:3])
    k, cg, r, s = weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    op = conv2d_op(n=n, c=c, h=h, w=w, k=k, r=r, s=s, pad_h=ph, pad_w=pw, stride_h=sh, stride_w=sw,
                   dilation_h=dh, dilation_w=dw, groups=groups)
    if embedding is None:
        cons = Constraints(linear_access=False, padding=True, swap_operands=False)
        ranked = rank(op, enumerate_embeddings(op, shape=gemm or GemmShape(), constraints=cons).embeddings)
        if not ranked:
            raise ValueError(f"no dense embedding of {gemm or GemmShape()} into {op.name}")
        embedding = ranked[0].embedding
    kern = emit_tir(op=op, embedding=embedding, gemm_func=gemm_func)
    wt = weight.reshape(groups, k // groups, cg, r, s) if groups > 1 else weight
    w_pack = kern.pack_operand(index=1, tensor=wt)  # constant: once
    # pad in the host layout and view it as N C H W: the gather reads NHWC memory in place
    if data_layout == "NHWC":
        xp = np.pad(data, ((0, 0), (ph, ph), (pw, pw), (0, 0))).transpose(0, 3, 1, 2)
    else:
        xp = np.pad(data, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    if groups > 1:
        xp = xp.reshape(n, groups, c // groups, *xp.shape[2:])
    d_pack = kern.pack_operand(index=0, tensor=xp)
    a_pack, b_pack = (d_pack, w_pack) if kern.plan.operand_role(0) == "inp" else (w_pack, d_pack)
    c_pack = kern.run(kern.build(), a_pack=a_pack, b_pack=b_pack)
    oh, ow = op.extents["h"], op.extents["w"]
    if data_layout == "NHWC":
        out = np.zeros((n, oh, ow, k), np.int32)
        view = out.transpose(0, 3, 1, 2)
    else:
        out = np.zeros((n, k, oh, ow), np.int32)
        view = out
    kern.unpack(c_pack, into=view.reshape(n, groups, k // groups, oh, ow) if groups > 1 else view)
    return out, kern
