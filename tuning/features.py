"""Fixed-length feature vectors of scheduled TIR programs, for the tuner's cost model (ALT §5.2.3).

A candidate is decoded to layout + loop primitives and scheduled into a
``tvm.tirx.PrimFunc``; :func:`extract_features` turns that program into one float vector
of a fixed length, whatever the layout or schedule, so an XGBoost model can rank
candidates before they are measured.

The vector has two parts:

* **alt** features, computed here by a small visitor over the scheduled (not yet
  lowered) TIR: loop structure and annotations, the loop nest of the *main store* (the
  store doing the most arithmetic, e.g. a conv's update), and for each buffer it reads
  or writes the stride of each inner loop in the buffer's flattened index, cache lines
  and bytes touched by the register block, and reuse. Index expressions are evaluated
  numerically (NumPy over the loop grid), which handles the ``//`` and ``%`` that fused
  and split loops produce.
* **ms** features (``metaschedule=True``): TVM MetaSchedule's own ``PerStoreFeature``
  (Ansor's 164 per-store features), which does run on a plain PrimFunc. We keep the row
  of the store with the most float operations and the column-wise max over all stores.
  Off by default: on 24 measured conv2d variants (3-fold cross-validation, 16 training
  rows, four fold assignments) the model ranked held-out variants with mean Spearman
  0.81 on the alt features, 0.74 on both parts and 0.64 on the ms part alone; with more
  data the ms part may pay off, so it stays one switch away.

TVM 0.27 gives Python no TIR statement visitor (no ``stmt_functor`` /
``post_order_visit``), hence the visitor here. ``meta_schedule.TuneContext(...)``
imports ``tvm.s_tir.tensor_intrin`` in its constructor, which parses every tensor
intrinsic in TVMScript and takes about a minute here; the context is therefore
built through its FFI constructor, which skips that import (the feature extractor does
not need the intrinsics).

Every entry is documented in one line by :func:`feature_descriptions`; ``log`` means
``log2(1 + x)``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import tirx
from tvm.ir import prim
from tvm.ir.expr import Call, TensorLoad, Var

__all__ = ["extract_features", "feature_descriptions", "feature_names"]

#: Inner loop levels of the main store described one by one (0 = innermost).
LEVELS = 8
#: Buffer slots of the main store: the written buffer, then the first distinct reads.
SLOTS = ("write", "read0", "read1", "read2")
#: Bytes per cache line assumed for "lines touched" features.
CACHE_LINE_BYTES = 64
#: Largest loop grid evaluated exactly when counting a register block's footprint.
_GRID_CAP = 1 << 16
#: Length of one MetaSchedule PerStoreFeature row with the default arguments.
MS_ROW = 164

_KIND_CODE = {tirx.ForKind.SERIAL: 0, tirx.ForKind.PARALLEL: 1, tirx.ForKind.VECTORIZED: 2,
              tirx.ForKind.UNROLLED: 3, tirx.ForKind.THREAD_BINDING: 4}
_FLOAT_DTYPE = re.compile(r"^(float|bfloat)")


def _alt_table() -> list[tuple[str, str]]:
    table = [
        ("n_stores", "number of buffer stores (statements writing a buffer) in the function"),
        ("n_loops", "number of loops in the function"),
        ("max_loop_depth", "deepest loop nesting"),
        ("n_parallel_loops", "loops annotated parallel"),
        ("n_vectorized_loops", "loops annotated vectorized"),
        ("n_unrolled_loops", "loops annotated unrolled"),
        ("log_max_parallel_extent", "log of the largest parallel loop extent (parallel task count)"),
        ("log_total_iters", "log of store executions summed over all stores"),
        ("log_other_iters", "log of store executions outside the main store (pad, init, epilogue)"),
        ("log_total_flops", "log of float operations summed over all stores"),
        ("main_flops_fraction", "share of all float operations done by the main store"),
        ("n_allocs", "number of intermediate buffers allocated in the function"),
        ("log_alloc_global_bytes", "log of bytes of intermediate buffers in global scope"),
        ("log_alloc_local_bytes", "log of bytes of intermediate buffers in local/register scopes"),
        ("log_max_alloc_bytes", "log of the largest intermediate buffer in bytes"),
        ("main_depth", "loops enclosing the main store"),
        ("main_log_iters", "log of the main store's executions (product of its loop extents)"),
    ]
    for lvl in range(LEVELS):
        table += [
            (f"lvl{lvl}_log_extent", f"log extent of the main store's loop {lvl} from the inside (0 absent)"),
            (f"lvl{lvl}_kind", "annotation of that loop: 0 serial 1 parallel 2 vector 3 unroll 4 thread, -1 absent"),
            (f"lvl{lvl}_is_reduction", "1 if that loop drives a reduction axis, 0 if not, -1 absent"),
        ]
    table += [
        ("main_log_vector_len", "log of the product of vectorized extents around the main store"),
        ("main_log_unroll", "log of the product of unrolled extents around the main store"),
        ("main_log_register_block", "log of unrolled x vectorized extents (the register block)"),
        ("main_log_parallel", "log of the product of parallel extents around the main store"),
        ("main_log_iters_per_task", "log of main store executions per parallel task"),
        ("main_n_reduction_loops", "loops around the main store that drive reduction axes"),
        ("main_log_reduction_extent", "log of the product of those reduction loop extents"),
        ("main_log_acc_tile", "log of spatial extents inside the innermost reduction loop (accumulators)"),
        ("main_float_mul", "float multiplications per main store execution, fused ones excluded"),
        ("main_float_add", "float additions/subtractions per execution, fused ones excluded"),
        ("main_float_fma", "float multiply-adds (an add or sub of a product) per execution"),
        ("main_float_div", "float divisions per execution"),
        ("main_float_minmax", "float min/max/compare operations per execution"),
        ("main_select", "selects and if_then_else per execution"),
        ("main_int_ops", "integer operations (+ - * / %: index math, bounds checks) per execution"),
        ("main_n_loads", "buffer loads per execution"),
        ("main_log_flops", "log of the main store's float operations (fma = 2)"),
        ("main_has_predicate", "1 if the main store's block has a non-trivial predicate"),
        ("main_has_init", "1 if the reduction init is still inside the main block (not decomposed)"),
        ("main_arith_intensity", "float ops per byte touched in the register block, over all slots"),
    ]
    for slot in SLOTS:
        table += [
            (f"{slot}_present", f"1 if the main store has a {slot} buffer"),
            (f"{slot}_log_stride_l0", "log |stride| of the innermost loop in the flattened index, elements"),
            (f"{slot}_stride_class_l0", "0 broadcast, 1 contiguous, 2 strided for the innermost loop"),
            (f"{slot}_log_stride_l1", "log |stride| of the second innermost loop"),
            (f"{slot}_stride_class_l1", "0 broadcast, 1 contiguous, 2 strided for the second innermost loop"),
            (f"{slot}_log_lines_l0", "log of cache lines touched by one pass of the innermost loop"),
            (f"{slot}_log_bytes_block", "log of distinct bytes touched by the register block"),
            (f"{slot}_log_lines_block", "log of distinct cache lines touched by the register block"),
            (f"{slot}_log_reuse_block", "log of accesses per distinct element in the register block"),
            (f"{slot}_n_invariant_loops", "enclosing loops the access does not depend on (reuse loops)"),
            (f"{slot}_log_invariant_extent", "log of the product of those loops' extents inside the parallel loop"),
            (f"{slot}_log_buffer_bytes", "log of the buffer's size in bytes"),
            (f"{slot}_is_local", "1 if the buffer is in a local/register scope"),
        ]
    return table


def _ms_table() -> list[tuple[str, str]]:
    table = [(f"ms_main_{i}", f"MetaSchedule PerStoreFeature column {i} of the store with most float ops")
             for i in range(MS_ROW)]
    table += [(f"ms_max_{i}", f"MetaSchedule PerStoreFeature column {i}, max over stores")
              for i in range(MS_ROW)]
    return table


@functools.cache
def _table(metaschedule: bool) -> tuple[tuple[str, str], ...]:
    return tuple(_alt_table() + (_ms_table() if metaschedule else []))


def feature_names(*, metaschedule: bool = False) -> list[str]:
    """Names of the entries of :func:`extract_features`'s vector, in order.

    Parameters
    ----------
    metaschedule : bool
        Whether the MetaSchedule ``PerStoreFeature`` part is included (as in
        :func:`extract_features`).

    Returns
    -------
    list of str
    """
    return [name for name, _ in _table(metaschedule)]


def feature_descriptions(*, metaschedule: bool = False) -> dict[str, str]:
    """One-line description of every feature, keyed by name, in vector order."""
    return dict(_table(metaschedule))


def extract_features(func: tvm.tirx.PrimFunc, *, metaschedule: bool = False) -> np.ndarray:
    """The fixed-length feature vector of a scheduled PrimFunc.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A scheduled program, e.g. ``tvm.s_tir.Schedule(...).mod["main"]``. An
        ``IRModule`` with a single function is accepted too.
    metaschedule : bool
        Append MetaSchedule's ``PerStoreFeature`` part (2 x 164 entries); see the module
        docstring for why it is off by default. A model must be fed one setting only.

    Returns
    -------
    numpy.ndarray
        ``float64`` vector of length ``len(feature_names(metaschedule=...))``; all finite.

    Raises
    ------
    ValueError
        If ``func`` is not a PrimFunc (or single-function IRModule), or has no buffer store.
    """
    func = _as_prim_func(func)
    program = _Collector()
    program.visit(func.body)
    if not program.stores:
        raise ValueError("extract_features: the function has no buffer store to describe")
    values = _alt_features(program)
    if metaschedule:
        values = np.concatenate([values, _ms_features(func)])
    values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
    expected = len(_table(metaschedule))
    if values.shape != (expected,):  # a bug here would silently misalign columns
        raise RuntimeError(f"feature vector has {values.shape[0]} entries, table has {expected}")
    return values


def _as_prim_func(func: Any) -> tvm.tirx.PrimFunc:
    if isinstance(func, tvm.IRModule):
        funcs = [f for _, f in func.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise ValueError(f"extract_features: expected an IRModule with one PrimFunc, got {len(funcs)}")
        return funcs[0]
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise ValueError(f"extract_features: expected a tvm.tirx.PrimFunc, got {type(func).__name__}")
    return func


# --------------------------------------------------------------------------------------
# Collecting stores, loops and allocations from the TIR tree
# --------------------------------------------------------------------------------------


@dataclass
class _Loop:
    var: Var
    extent: int
    kind: int


@dataclass
class _Store:
    store: Any  # tirx.BufferStore
    loops: list[_Loop]
    bindings: list[tuple[Var, Any]]  # block var -> expression of loop vars, outer blocks first
    reduction_vars: set = field(default_factory=set)  # block vars of reduction axes
    predicate: bool = False
    has_init: bool = False


class _Collector:
    """Walks a statement tree, recording every store with its loops and block bindings."""

    def __init__(self) -> None:
        self.stores: list[_Store] = []
        self.n_loops = 0
        self.max_depth = 0
        self.kinds: list[int] = []
        self.parallel_extents: list[int] = []
        self.allocs: list[Any] = []
        self._loops: list[_Loop] = []
        self._bindings: list[tuple[Var, Any]] = []
        self._reduction: set = set()
        self._predicate = False
        self._init = False

    def visit(self, node: Any) -> None:
        if node is None:
            return
        if isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                self.visit(child)
        elif isinstance(node, tirx.For):
            self._visit_for(node)
        elif isinstance(node, tvm.s_tir.SBlockRealize):
            self._visit_realize(node)
        elif isinstance(node, tvm.s_tir.SBlock):
            self.allocs.extend(node.alloc_buffers)
            self.visit(node.body)
        elif isinstance(node, tirx.BufferStore):
            self.stores.append(_Store(node, list(self._loops), list(self._bindings), set(self._reduction),
                                      self._predicate, self._init))
        elif isinstance(node, tirx.IfThenElse):
            self.visit(node.then_case)
            self.visit(node.else_case)
        elif isinstance(node, tirx.AllocBuffer):
            self.allocs.append(node.buffer)
        else:
            # LetStmt/Bind, AttrStmt, AssertStmt, While, DeclBuffer, ...: descend if they wrap a body.
            self.visit(getattr(node, "body", None))

    def _visit_for(self, node: Any) -> None:
        extent = _const_int(node.extent)
        kind = _KIND_CODE.get(node.kind, 0)
        self.n_loops += 1
        self.kinds.append(kind)
        if kind == 1:
            self.parallel_extents.append(extent)
        self._loops.append(_Loop(node.loop_var, extent, kind))
        self.max_depth = max(self.max_depth, len(self._loops))
        self.visit(node.body)
        self._loops.pop()

    def _visit_realize(self, node: Any) -> None:
        block = node.block
        pushed = 0
        reduction = set()
        for iter_var, value in zip(block.iter_vars, node.iter_values):
            self._bindings.append((iter_var.var, value))
            pushed += 1
            if int(iter_var.iter_type) == 2:  # CommReduce
                reduction.add(iter_var.var)
        saved = (self._reduction, self._predicate, self._init)
        self._reduction = self._reduction | reduction
        self._predicate = self._predicate or not _is_const_true(node.predicate)
        self.allocs.extend(block.alloc_buffers)
        if block.init is not None:
            self._init = True
            self.visit(block.init)
        self.visit(block.body)
        self._reduction, self._predicate, self._init = saved
        del self._bindings[len(self._bindings) - pushed:]


def _const_int(expr: Any, default: int = 1) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, prim.expr.IntImm):
        return int(expr.value)
    return default  # symbolic extent: count it as 1


def _is_const_true(expr: Any) -> bool:
    return expr is None or expr is True or (isinstance(expr, prim.expr.IntImm) and int(expr.value) != 0)


def _dtype(node: Any) -> str:
    ty = getattr(node, "ty", None)
    return str(ty) if ty is not None else ""


def _dtype_bytes(dtype: str) -> int:
    match = re.match(r"^[a-z]+?(\d+)(?:x(\d+))?$", str(dtype))
    if not match:
        return 4
    bits = int(match.group(1)) * int(match.group(2) or 1)
    return max(1, bits // 8)


def _log(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


# --------------------------------------------------------------------------------------
# Arithmetic counts
# --------------------------------------------------------------------------------------


@dataclass
class _Counts:
    mul: int = 0
    add: int = 0
    fma: int = 0
    div: int = 0
    minmax: int = 0
    select: int = 0
    int_ops: int = 0
    loads: list = field(default_factory=list)

    @property
    def flops(self) -> int:
        return self.mul + self.add + 2 * self.fma + self.div + self.minmax


_INT_ARITH = (prim.expr.Add, prim.expr.Sub, prim.expr.Mul, prim.expr.FloorDiv, prim.expr.FloorMod,
              prim.expr.Div, prim.expr.Mod)


def _count(expr: Any, counts: _Counts) -> None:
    """Count the operations in ``expr`` into ``counts``; loads are collected, their indices counted."""
    if isinstance(expr, TensorLoad):
        counts.loads.append(expr)
        for i in expr.indices:
            _count(i, counts)
        return
    is_float = bool(_FLOAT_DTYPE.match(_dtype(expr)))
    if isinstance(expr, (prim.expr.Add, prim.expr.Sub)) and is_float:
        if isinstance(expr.a, prim.expr.Mul) or isinstance(expr.b, prim.expr.Mul):
            counts.fma += 1
            product = expr.a if isinstance(expr.a, prim.expr.Mul) else expr.b
            other = expr.b if product is expr.a else expr.a
            _count(product.a, counts)
            _count(product.b, counts)
            _count(other, counts)
            return
        counts.add += 1
    elif isinstance(expr, prim.expr.Mul) and is_float:
        counts.mul += 1
    elif isinstance(expr, (prim.expr.Div, prim.expr.FloorDiv)) and is_float:
        counts.div += 1
    elif isinstance(expr, (prim.expr.Min, prim.expr.Max, prim.expr.CmpExpr)) and (
            is_float or bool(_FLOAT_DTYPE.match(_dtype(getattr(expr, "a", None))))):
        counts.minmax += 1
    elif isinstance(expr, prim.expr.Select) or (isinstance(expr, Call) and _call_name(expr) == "if_then_else"):
        counts.select += 1
    elif isinstance(expr, _INT_ARITH):
        counts.int_ops += 1
    for child in _children(expr):
        _count(child, counts)


def _call_name(expr: Call) -> str:
    return str(getattr(expr.op, "name", "")).rsplit(".", 1)[-1]


def _children(expr: Any) -> list:
    if isinstance(expr, prim.expr.BinaryOpExpr) or isinstance(expr, (prim.expr.CmpExpr, prim.expr.LogicalExpr)):
        return [expr.a, expr.b]
    if isinstance(expr, prim.expr.Select):
        return [expr.condition, expr.true_value, expr.false_value]
    if isinstance(expr, Call):
        return list(expr.args)
    if isinstance(expr, prim.expr.Cast):
        return [expr.value]
    if isinstance(expr, prim.expr.Not):
        return [expr.a]
    if isinstance(expr, prim.expr.Let):
        return [expr.value, expr.body]
    children = []
    for name in ("a", "b", "value", "base", "stride"):
        child = getattr(expr, name, None)
        if child is not None and not isinstance(child, (int, float, str)):
            children.append(child)
    return children


# --------------------------------------------------------------------------------------
# Numeric evaluation of index expressions over loop grids
# --------------------------------------------------------------------------------------

_BINARY_NP: dict[type, Callable[[Any, Any], Any]] = {
    prim.expr.Add: np.add,
    prim.expr.Sub: np.subtract,
    prim.expr.Mul: np.multiply,
    prim.expr.FloorDiv: lambda a, b: np.floor_divide(a, np.where(b == 0, 1, b)),
    prim.expr.FloorMod: lambda a, b: np.mod(a, np.where(b == 0, 1, b)),
    prim.expr.Div: lambda a, b: np.trunc(np.true_divide(a, np.where(b == 0, 1, b))).astype(np.int64),
    prim.expr.Mod: lambda a, b: np.fmod(a, np.where(b == 0, 1, b)),
    prim.expr.Min: np.minimum,
    prim.expr.Max: np.maximum,
    prim.expr.LT: np.less,
    prim.expr.LE: np.less_equal,
    prim.expr.GT: np.greater,
    prim.expr.GE: np.greater_equal,
    prim.expr.EQ: np.equal,
    prim.expr.NE: np.not_equal,
    prim.expr.And: np.logical_and,
    prim.expr.Or: np.logical_or,
}


def _evaluate(expr: Any, env: dict) -> Any:
    """Integer value of ``expr`` with variables from ``env`` (NumPy arrays broadcast); unknown vars are 0."""
    if isinstance(expr, int):
        return np.int64(expr)
    if isinstance(expr, Var):
        return env.get(expr, np.int64(0))
    if isinstance(expr, prim.expr.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, prim.expr.FloatImm):
        return np.int64(int(expr.value))
    op = _BINARY_NP.get(type(expr))
    if op is not None:
        return op(np.asarray(_evaluate(expr.a, env), np.int64), np.asarray(_evaluate(expr.b, env), np.int64))
    if isinstance(expr, prim.expr.Cast):
        return _evaluate(expr.value, env)
    if isinstance(expr, prim.expr.Select):
        return np.where(_evaluate(expr.condition, env), _evaluate(expr.true_value, env),
                        _evaluate(expr.false_value, env))
    if isinstance(expr, Call) and _call_name(expr) == "if_then_else":
        cond, yes, no = expr.args
        return np.where(_evaluate(cond, env), _evaluate(yes, env), _evaluate(no, env))
    if isinstance(expr, prim.expr.Ramp):  # lowered vector index: its first lane
        return _evaluate(expr.base, env)
    if isinstance(expr, prim.expr.Broadcast):
        return _evaluate(expr.value, env)
    return np.int64(0)


def _flat_index(buffer: Any, indices: Sequence[Any], env: dict) -> np.ndarray:
    shape = [_const_int(s) for s in buffer.shape]
    strides = [_const_int(s) for s in buffer.strides] if len(buffer.strides) == len(shape) else None
    if strides is None:
        strides, acc = [], 1
        for extent in reversed(shape):
            strides.append(acc)
            acc *= max(1, extent)
        strides.reverse()
    flat = np.int64(0)
    for index, stride in zip(indices, strides):
        flat = flat + np.asarray(_evaluate(index, env), np.int64) * stride
    return np.asarray(flat, np.int64)


def _bind(bindings: list[tuple[Var, Any]], env: dict) -> dict:
    env = dict(env)
    for var, value in bindings:  # outer blocks first, so inner bindings see outer block vars
        env[var] = np.asarray(_evaluate(value, env), np.int64)
    return env


# --------------------------------------------------------------------------------------
# The alt features
# --------------------------------------------------------------------------------------


def _store_iters(store: _Store) -> int:
    return math.prod(loop.extent for loop in store.loops)


def _store_counts(store: _Store) -> _Counts:
    counts = _Counts()
    _count(store.store.value, counts)
    for index in store.store.indices:
        _count(index, counts)
    for _, value in store.bindings:
        _count(value, counts)
    return counts


def _loop_is_reduction(store: _Store) -> list[bool]:
    """Whether each loop of ``store`` feeds a reduction block var."""
    flags = []
    reduction_bindings = [value for var, value in store.bindings if var in store.reduction_vars]
    for loop in store.loops:
        flags.append(any(_uses_var(value, loop.var) for value in reduction_bindings))
    return flags


def _uses_var(expr: Any, var: Var) -> bool:
    if isinstance(expr, Var):
        return expr.same_as(var)
    return any(_uses_var(child, var) for child in _children(expr) if child is not None)


def _register_block(loops: list[_Loop]) -> list[int]:
    """Indices of the innermost run of vectorized/unrolled loops (at least the innermost loop)."""
    if not loops:
        return []
    block = [len(loops) - 1]
    for i in range(len(loops) - 2, -1, -1):
        if loops[i].kind not in (2, 3):
            break
        block.insert(0, i)
    return block


def _access_features(store: _Store, buffer: Any, indices: Sequence[Any], block: list[int]) -> list[float]:
    """The per-slot features of one access (see the table)."""
    loops = store.loops
    base = _bind(store.bindings, {})
    flat0 = int(np.asarray(_flat_index(buffer, indices, base)).reshape(-1)[0])
    elem = _dtype_bytes(str(buffer.dtype))

    def stride_of(i: int) -> tuple[int, bool]:
        loop = loops[i]
        if loop.extent <= 1:
            return 0, True
        probe = np.arange(min(loop.extent, 64), dtype=np.int64)
        flat = np.asarray(_flat_index(buffer, indices, _bind(store.bindings, {loop.var: probe})), np.int64)
        flat = np.broadcast_to(flat, probe.shape)
        return int(flat[1] - flat[0]), bool(np.all(flat == flat0))

    strides, invariant = [], []
    for i in range(len(loops)):
        s, inv = stride_of(i)
        strides.append(s)
        invariant.append(inv)

    def stride_pair(level: int) -> tuple[float, float]:
        i = len(loops) - 1 - level
        if i < 0:
            return 0.0, 0.0
        s = abs(strides[i])
        return _log(s), 0.0 if s == 0 else (1.0 if s == 1 else 2.0)

    log_s0, class_s0 = stride_pair(0)
    log_s1, class_s1 = stride_pair(1)
    lines_l0 = 0.0
    if loops:
        inner = loops[-1]
        s = abs(strides[-1]) * elem
        lines_l0 = 1 if s == 0 else min(inner.extent, math.ceil(inner.extent * s / CACHE_LINE_BYTES))

    # Footprint of the register block: evaluate the index on the block's full loop grid.
    grid_loops = [loops[i] for i in block]
    extents = [loop.extent for loop in grid_loops]
    scale = 1.0
    while math.prod(extents) > _GRID_CAP:  # shrink the outermost axis, then scale counts back
        j = next(k for k, e in enumerate(extents) if e > 1)
        scale *= extents[j] / max(1, extents[j] // 2)
        extents[j] //= 2
    env = {}
    for axis, (loop, extent) in enumerate(zip(grid_loops, extents)):
        shape = [1] * len(extents)
        shape[axis] = extent
        env[loop.var] = np.arange(extent, dtype=np.int64).reshape(shape)
    flat = np.broadcast_to(_flat_index(buffer, indices, _bind(store.bindings, env)), tuple(extents) or ())
    distinct = np.unique(flat).size * scale
    lines = np.unique((flat * elem) // CACHE_LINE_BYTES).size * scale
    accesses = math.prod(loop.extent for loop in grid_loops) if grid_loops else 1

    parallel_at = max((i for i, loop in enumerate(loops) if loop.kind == 1), default=-1)
    invariant_extent = math.prod(loop.extent for i, loop in enumerate(loops)
                                 if invariant[i] and i > parallel_at)
    size = math.prod(_const_int(s) for s in buffer.shape) * elem
    scope = str(buffer.scope())
    return [
        1.0, log_s0, class_s0, log_s1, class_s1, _log(lines_l0),
        _log(distinct * elem), _log(lines), _log(accesses / max(1.0, distinct)),
        float(sum(invariant)), _log(invariant_extent), _log(size),
        0.0 if scope in ("global", "") else 1.0,
    ]


def _alt_features(program: _Collector) -> np.ndarray:
    per_store = [(store, _store_counts(store), _store_iters(store)) for store in program.stores]
    # The main store does the most arithmetic; ties go to the most executed, then the first.
    main_index = max(range(len(per_store)),
                     key=lambda i: (per_store[i][2] * max(1, per_store[i][1].flops), per_store[i][2], -i))
    main, counts, iters = per_store[main_index]
    total_iters = sum(it for _, _, it in per_store)
    total_flops = sum(it * c.flops for _, c, it in per_store)
    alloc_bytes = [(math.prod(_const_int(s) for s in b.shape) * _dtype_bytes(str(b.dtype)), str(b.scope()))
                   for b in program.allocs]

    values = [
        len(program.stores), program.n_loops, program.max_depth,
        program.kinds.count(1), program.kinds.count(2), program.kinds.count(3),
        _log(max(program.parallel_extents, default=0)),
        _log(total_iters), _log(total_iters - iters), _log(total_flops),
        (iters * counts.flops / total_flops) if total_flops else 0.0,
        len(alloc_bytes),
        _log(sum(b for b, scope in alloc_bytes if scope in ("global", ""))),
        _log(sum(b for b, scope in alloc_bytes if scope not in ("global", ""))),
        _log(max((b for b, _ in alloc_bytes), default=0)),
        len(main.loops), _log(iters),
    ]
    loops = main.loops
    reduction = _loop_is_reduction(main)
    for level in range(LEVELS):
        i = len(loops) - 1 - level
        if i >= 0:
            values += [_log(loops[i].extent), float(loops[i].kind), float(reduction[i])]
        else:
            values += [0.0, -1.0, -1.0]
    vector = math.prod(loop.extent for loop in loops if loop.kind == 2)
    unroll = math.prod(loop.extent for loop in loops if loop.kind == 3)
    parallel = math.prod(loop.extent for loop in loops if loop.kind == 1)
    red_positions = [i for i, r in enumerate(reduction) if r]
    innermost_red = max(red_positions, default=-1)
    acc_tile = math.prod(loop.extent for i, loop in enumerate(loops) if i > innermost_red and not reduction[i]) \
        if red_positions else 1
    values += [
        _log(vector), _log(unroll), _log(vector * unroll), _log(parallel), _log(iters / max(1, parallel)),
        float(len(red_positions)), _log(math.prod(loops[i].extent for i in red_positions)), _log(acc_tile),
        float(counts.mul), float(counts.add), float(counts.fma), float(counts.div), float(counts.minmax),
        float(counts.select), float(counts.int_ops), float(len(counts.loads)), _log(iters * counts.flops),
        float(main.predicate), float(main.has_init),
    ]
    block = _register_block(loops)
    write = main.store.buffer
    accesses = [(write, main.store.indices)]
    seen = [write]
    for load in counts.loads:
        if not any(load.source.same_as(b) for b in seen):
            seen.append(load.source)
            accesses.append((load.source, load.indices))
    slot_values: list[list[float]] = []
    block_iters = math.prod(loops[i].extent for i in block) if block else 1
    for slot in range(len(SLOTS)):
        if slot < len(accesses):
            slot_values.append(_access_features(main, *accesses[slot], block))
        else:
            slot_values.append([0.0] * 13)
    # Arithmetic intensity of the register block: its float ops over the distinct bytes it touches.
    touched = sum(2 ** v[6] - 1 for v in slot_values if v[0])
    values.append(block_iters * counts.flops / max(1.0, touched))
    for v in slot_values:
        values += v
    return np.asarray(values, dtype=np.float64)


# --------------------------------------------------------------------------------------
# MetaSchedule's PerStoreFeature
# --------------------------------------------------------------------------------------


@functools.cache
def _ms_objects() -> tuple[Any, Any]:
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

    extractor = PerStoreFeature()
    if int(extractor.feature_vector_length) != MS_ROW:
        raise RuntimeError(f"PerStoreFeature has {extractor.feature_vector_length} columns, expected {MS_ROW}")
    return extractor, tvm.target.Target({"kind": "llvm"})  # target only tells CPU from GPU here


def _ms_features(func: tvm.tirx.PrimFunc) -> np.ndarray:
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    extractor, target = _ms_objects()
    mod = tvm.IRModule({"main": func})
    # The FFI constructor, not TuneContext(...): see the module docstring (a minute saved).
    context = _ffi_api.TuneContext(mod, target, None, None, "main", 1, 0, None)
    try:
        candidate = MeasureCandidate(tvm.s_tir.Schedule(func), ArgInfo.from_prim_func(func))
        rows = _ffi_api.FeatureExtractorExtractFrom(extractor, context, [candidate])[0].numpy()
    except (RuntimeError, ValueError, TypeError) as err:  # TVM errors are RuntimeError subclasses
        raise ValueError(f"extract_features: MetaSchedule PerStoreFeature failed: {err}") from err
    if rows.size == 0:
        return np.zeros(2 * MS_ROW)
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, MS_ROW)
    main = rows[int(np.argmax(rows[:, 0:3].sum(axis=1)))]  # float mad + add/sub + mul, log-scaled
    return np.concatenate([main, rows.max(axis=0)])
