"""One graph whatever the frontend: rewrite the spellings that importers disagree on.

The same network reaches alt-tvm as a torch module (``torch.export``), as its ONNX export
with BatchNorm kept, and as an ONNX export with BatchNorm folded by the exporter. TVM's two
frontends spell the same computation differently, and a partition's workload key (what
tuning records are keyed by) follows the spelling. Each rule below rewrites one such
difference to a single form, chosen to be the one that fuses best:

* ``fold_affine_epilogues``: an inference BatchNorm after ``DecomposeOpsForInference`` is
  ``((conv - mean) / sqrt(var + eps)) * gamma + beta``. As ``conv(x, W) * s + t`` equals
  ``conv(x, W * s) + t`` when ``s`` and ``t`` vary along the output channels only, the chain
  folds into the weights and one bias ``add`` (what ONNX exporters and ONNX Runtime do).
* ``merge_clamps``: ONNX ``Clip`` arrives as ``minimum(maximum(x, lo), hi)``, torch's
  ``ReLU6``/``hardtanh`` as ``clip(x, lo, hi)``: both become ``clip``.
* ``unflatten_matmuls``: torch's ``Linear`` on a ``(1, S, K)`` input is ``reshape`` to
  ``(S, K)``, ``matmul``, bias, ``reshape`` back; its batched matmuls flatten the batch dims
  the same way. ONNX keeps the original rank. The reshapes are dropped (the matmul on the
  original rank computes the same values in the same order), which also lets an
  activation after the reshape join the matmul's epilogue.
* ``unit_axis_views``: torch's multi-head attention returns its output projection as
  ``(L, 1, E)`` and the caller transposes it to ``(1, L, E)``. A view (``reshape``, then
  possibly a ``permute_dims``) that only puts unit axes before a 2-D matmul's ``(M, N)``
  moves to the matmul's left operand instead, so the residual add after the view joins the
  matmul's epilogue (else ViT-B/16's twelve residual adds are kernels of their own).
* ``merge_gelu``: GELU exported to ONNX opsets without ``Gelu`` is
  ``x * 0.5 * (1 + erf(x / sqrt(2)))``: it becomes ``nn.gelu`` (the erf form) again, and
  GPT-2's ``x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`` ``nn.gelu_tanh``.
* ``global_pools``: a pooling window that covers the whole input from its first element and
  yields one output per channel is a global pool (``mean`` or ``max`` over the spatial
  axes). Hugging Face's EfficientNet writes its final pooling as ``AvgPool2d(1280,
  ceil_mode=True)`` on a 7x7 input: as a window, 1280x1280 mostly padded elements per output
  (1.4 s in TVM's legalization; the mean takes microseconds).
* ``unit_dim_adds``: a constant added to a view of a tensor with leading unit dims (Swin's
  window mask) is added to the tensor itself, so the add stays in its producer's epilogue.
* ``group_norms``: PyTorch's ``GroupNorm`` exported to ONNX is a ``Reshape`` to
  ``(N, groups, -1)``, an ``InstanceNormalization`` (mean, variance, normalize, its own scale
  and bias) and a ``Reshape`` back, then the per-channel scale and bias; ``torch.export``
  keeps ``group_norm``. Both become ``nn.group_norm`` with the scales and biases folded into
  its ``gamma`` and ``beta``: computed in its input's layout, without the two reshapes that
  copy a tiled map to rows and back (PoolFormer's 25 norms).

Every rule rewrites only values with a single consumer, so nothing is computed twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from alt_tvm.strategies.base import const_value, dtype_of, op_name, static_shape

from .partition import consumers

__all__ = ["FOLDABLE_CONVS", "RuleGraph", "RuleMatch", "apply_rule", "canonicalize", "fold_affine_epilogues",
           "global_pools", "group_norms", "merge_clamps", "merge_gelu", "per_channel_vector", "plain_layouts",
           "unflatten_matmuls", "unit_axis_views", "unit_dim_adds"]

#: Convolutions whose weights fold a per-output-channel scale (channel axis 1, kernel axis 0).
FOLDABLE_CONVS = {"relax.nn.conv1d": ("NCW", "OIW"), "relax.nn.conv2d": ("NCHW", "OIHW"),
                  "relax.nn.conv3d": ("NCDHW", "OIDHW")}
_AFFINE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


@dataclass(frozen=True)
class RuleMatch:
    """Rebind ``var`` to what ``make(visit)`` returns; drop the bindings of ``dropped``."""

    var: relax.Var
    make: Callable[[Callable[[relax.Expr], relax.Expr]], relax.Expr]
    dropped: tuple[relax.Var, ...]


class RuleGraph:
    """The bindings of ``main`` and who uses each value."""

    def __init__(self, func: relax.Function) -> None:
        self.users = consumers(func)
        self.values = {b.var: b.value for block in func.body.blocks for b in block.bindings
                       if isinstance(b, relax.VarBinding)}

    def only_user(self, var: relax.Expr) -> relax.Var | None:
        """The single binding that uses ``var`` (None if several, none, or the output)."""
        users = self.users.get(var, [])
        return users[0] if len(users) == 1 and users[0] in self.values else None

    def producer(self, expr: relax.Expr, op: str) -> relax.Call | None:
        """The call of ``op`` bound to ``expr`` (None if ``expr`` is anything else)."""
        value = self.values.get(expr)
        return value if value is not None and op_name(value) == op else None


def canonicalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply every rule of this module to ``main`` (see the module docstring)."""
    for rule in (fold_affine_epilogues, merge_clamps, unflatten_matmuls, unit_axis_views, merge_gelu, global_pools,
                 unit_dim_adds, group_norms):
        mod = rule(mod)
    return mod


def apply_rule(mod: tvm.IRModule, find: Callable[[RuleGraph], Iterator[RuleMatch]]) -> tvm.IRModule:
    """Rewrite ``main`` by the matches ``find`` yields (the first of overlapping ones wins)."""
    func = mod["main"]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return mod
    matches, claimed = {}, set()
    for match in find(RuleGraph(func)):
        touched = {match.var, *match.dropped}
        if touched & claimed:
            continue  # overlapping matches: the first wins
        claimed |= touched
        matches[match.var] = match
    if not matches:
        return mod
    mod = mod.clone() if hasattr(mod, "clone") else mod
    dropped = {v for m in matches.values() for v in m.dropped} - set(matches)
    mod["main"] = _Rewrite(mod, matches, dropped).visit_expr(func)
    return relax.transform.DeadCodeElimination()(mod)


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, matches: dict, dropped: set) -> None:
        super().__init__(mod)
        self.matches = matches
        self.dropped = dropped

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var in self.dropped:
            return
        match = self.matches.get(var)
        if match is None:
            super().visit_var_binding_(binding)
            return
        # a block's output var stays an output var (a dataflow var cannot leave the block)
        emit = self.builder_.emit if isinstance(var, relax.DataflowVar) else self.builder_.emit_output
        new_var = emit(match.make(self.visit_expr), var.name)
        self.set_var_remap(var, new_var)


# ------------------------------------------------------------------------------------ affine into conv


def fold_affine_epilogues(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold each convolution's leading chain of constant per-channel affine ops into it.

    A chain is folded only when every op in it is the single consumer of the previous value
    and its other operand is a floating-point constant that broadcasts along the output
    channels only. A chain that is already a single bias ``add`` is left as it is.
    """
    return apply_rule(mod, _affine_chains)


def _affine_chains(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        chain = _affine_chain(var, value, graph)
        if chain is None:
            continue
        last, scale, shift, members = chain
        weight = const_value(value.args[1])
        scaled = (weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(weight.dtype)
        bias = shift.astype(weight.dtype).reshape((1, -1) + (1,) * (weight.ndim - 2))

        def make(visit, conv=value, scaled=scaled, bias=bias):
            folded = relax.Call(conv.op, [visit(conv.args[0]), relax.const(scaled)], conv.attrs)
            return relax.op.add(folded, relax.const(bias))

        yield RuleMatch(last, make, tuple(members))


def _affine_chain(var: relax.Var, value: relax.Expr, graph: RuleGraph):
    """``(last var, scale[C], shift[C], folded vars)`` of the chain after conv ``var``, or None."""
    if op_name(value) not in FOLDABLE_CONVS or const_value(value.args[1]) is None:
        return None
    if not plain_layouts(value):
        return None
    shape, dtype = static_shape(var), dtype_of(var)
    if shape is None or not dtype.startswith("float") or dtype != dtype_of(value.args[1]):
        return None
    members = [var]
    scale, shift, current, ops = _affine_run(graph, var, shape, shape[1], members, dtype=dtype)
    if not ops or ops == ["relax.add"]:
        return None
    return current, scale, shift, members[:-1]


def plain_layouts(conv: relax.Call) -> bool:
    """Whether a convolution of :data:`FOLDABLE_CONVS` reads, weighs and writes in the plain
    layouts (channels at axis 1 of its data and output, output channels first in its weight),
    the layouts the rules here read weights and per-channel constants in."""
    data_layout, kernel_layout = FOLDABLE_CONVS[op_name(conv)]
    attrs = conv.attrs
    out_layout = str(attrs.out_layout) if attrs.out_layout else str(attrs.data_layout)
    return (str(attrs.data_layout), str(attrs.kernel_layout), out_layout) == (data_layout, kernel_layout, data_layout)


def per_channel_vector(expr: relax.Expr, rank: int, channels: int) -> np.ndarray | None:
    """A constant broadcasting along axis 1 only, as a float64 vector of ``channels``; else None."""
    data = const_value(expr)
    if data is None or not np.issubdtype(data.dtype, np.floating) or data.ndim > rank:
        return None
    full = data.reshape((1,) * (rank - data.ndim) + data.shape)
    if any(d != 1 for axis, d in enumerate(full.shape) if axis != 1) or full.shape[1] not in (1, channels):
        return None
    vector = np.broadcast_to(full.reshape(-1).astype(np.float64), (channels,)).copy()
    return vector if np.all(np.isfinite(vector)) else None


# ---------------------------------------------------------------------------------------------- clamps


def merge_clamps(mod: tvm.IRModule) -> tvm.IRModule:
    """``minimum(maximum(x, lo), hi)`` with scalar constants ``lo <= hi`` becomes ``clip(x, lo, hi)``."""
    return apply_rule(mod, _clamps)


def _clamps(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        if op_name(value) != "relax.minimum":
            continue
        inner, hi = value.args
        lower = graph.producer(inner, "relax.maximum")
        if lower is None or graph.only_user(inner) is None:
            continue
        x, lo = lower.args
        lo, hi = _scalar(lo), _scalar(hi)
        if lo is None or hi is None or lo > hi or static_shape(x) != static_shape(var):
            continue
        yield RuleMatch(var, lambda visit, x=x, lo=lo, hi=hi: relax.op.clip(visit(x), lo, hi), (inner,))


def unit_dim_adds(mod: tvm.IRModule) -> tvm.IRModule:
    """``reshape(add(reshape(x, (1,) + shape(x)), c), shape(x))`` becomes ``add(x, c')``, ``c'``
    being the constant ``c`` without its leading unit dims.

    Swin adds its shifted-window mask to a view of the attention scores with a leading unit
    dim; the two reshapes around the add ended the scores' epilogue before the softmax.
    """
    return apply_rule(mod, _unit_dim_adds)


def _unit_dim_adds(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        add = graph.producer(value.args[0], "relax.add") if op_name(value) == "relax.reshape" else None
        if add is None or graph.only_user(value.args[0]) is None:
            continue
        view, constant = add.args
        inner = graph.producer(view, "relax.reshape")
        data = const_value(constant)
        if inner is None or data is None or graph.only_user(view) is None:
            continue
        x = inner.args[0]
        shape, wide = static_shape(x), static_shape(view)
        if shape is None or wide is None or static_shape(var) != shape:
            continue
        extra = len(wide) - len(shape)
        if extra < 1 or wide[extra:] != shape or any(d != 1 for d in wide[:extra]) or data.ndim > len(wide):
            continue
        data = data.reshape((1,) * (len(wide) - data.ndim) + data.shape)
        if any(d != 1 for d in data.shape[:extra]):
            continue
        narrow = relax.const(np.ascontiguousarray(data.reshape(data.shape[extra:])), dtype_of(constant))
        yield RuleMatch(var, lambda visit, x=x, narrow=narrow: relax.op.add(visit(x), narrow), (view, value.args[0]))


def _scalar(expr: relax.Expr) -> float | None:
    data = const_value(expr)
    if data is None or data.size != 1 or not np.issubdtype(data.dtype, np.floating):
        return None
    return float(data.reshape(()))


# --------------------------------------------------------------------------------------------- matmuls


def unflatten_matmuls(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop the reshapes around a matmul that only flatten and restore its batch dims.

    ``reshape(f(matmul(reshape(a), b')), shape)`` becomes ``f(matmul(a, b))`` when the inner
    reshapes only merge the leading (batch) dims of ``a`` and ``b`` (``b`` may also be a 2-D
    constant), ``shape`` is the shape of ``matmul(a, b)``, and ``f`` is a chain of element-
    wise ops whose constant operands have rank <= 2 (so they broadcast the same at either rank).
    """
    return apply_rule(mod, _flattened_matmuls)


def _flattened_matmuls(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        if op_name(value) != "relax.matmul":
            continue
        lhs, rhs = (_unflattened(graph, arg) for arg in value.args)
        if lhs is None or rhs is None or (lhs is value.args[0] and rhs is value.args[1]):
            continue
        a_shape, b_shape = static_shape(lhs), static_shape(rhs)
        if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
            continue
        if len(b_shape) > 2 and a_shape[:-2] != b_shape[:-2]:
            continue  # batched operands must pair batch for batch without broadcasting
        target = (*a_shape[:-1], b_shape[-1])
        found = _chain_to_reshape(graph, var)
        if found is None or static_shape(found[1]) != target:
            continue
        chain, nxt = found
        inner = [arg for arg in value.args if graph.producer(arg, "relax.reshape") is not None]
        dropped = (*inner, var, *chain)

        def make(visit, value=value, lhs=lhs, rhs=rhs, chain=tuple(chain), start=var):
            out = relax.op.matmul(visit(lhs), visit(rhs), out_dtype=value.attrs.out_dtype)
            return _replay(graph, chain, start, out, visit)

        yield RuleMatch(nxt, make, dropped)


def unit_axis_views(mod: tvm.IRModule) -> tvm.IRModule:
    """``view(f(matmul(a, b)))`` becomes ``f(matmul(reshape(a, (1, ..., M, K)), b))``.

    ``a`` is ``(M, K)``, ``b`` is 2-D, ``f`` a chain of element-wise ops as in
    :func:`unflatten_matmuls`, and ``view`` a ``reshape`` (possibly followed by a
    ``permute_dims`` that keeps the order of the non-unit axes) whose result is
    ``(1, ..., M, N)``: the same values in the same memory order, so the matmul can produce
    that shape itself and an element-wise op reading the view joins its epilogue.
    """
    return apply_rule(mod, _unit_axis_views)


def _unit_axis_views(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        if op_name(value) != "relax.matmul":
            continue
        a, b = value.args
        a_shape, b_shape, out = static_shape(a), static_shape(b), static_shape(var)
        if a_shape is None or b_shape is None or len(a_shape) != 2 or len(b_shape) != 2:
            continue
        found = _chain_to_reshape(graph, var)
        if found is None:
            continue
        chain, nxt = found
        views = [nxt]
        transpose = graph.only_user(nxt)
        if transpose is not None and _keeps_memory_order(graph.values[transpose]):
            views.append(transpose)
        view_shape = static_shape(views[-1])
        if view_shape is None or len(view_shape) <= 2 or view_shape[-2:] != out \
                or any(d != 1 for d in view_shape[:-2]):
            continue
        source = graph.producer(a, "relax.reshape")
        flat = source.args[0] if source is not None and graph.only_user(a) is not None else a
        shape = (*view_shape[:-2], *a_shape)

        def make(visit, value=value, flat=flat, shape=shape, chain=tuple(chain), start=var):
            lhs = relax.op.reshape(visit(flat), shape)
            out = relax.op.matmul(lhs, visit(value.args[1]), out_dtype=value.attrs.out_dtype)
            return _replay(graph, chain, start, out, visit)

        dropped = (var, *chain, *views[:-1]) + ((a,) if flat is not a else ())
        yield RuleMatch(views[-1], make, dropped)


def _chain_to_reshape(graph: RuleGraph, var: relax.Var) -> tuple[list[relax.Var], relax.Var] | None:
    """The element-wise ops after ``var`` (:func:`_elementwise_step`, each the only user of
    the value before it) and the reshape that ends them; None if anything else comes first."""
    chain, current = [], var
    while (nxt := graph.only_user(current)) is not None:
        if op_name(graph.values[nxt]) == "relax.reshape":
            return chain, nxt
        if not _elementwise_step(graph.values[nxt], current):
            return None
        chain.append(nxt)
        current = nxt
    return None


def _replay(graph: RuleGraph, chain: Sequence[relax.Var], start: relax.Var, out: relax.Expr,
            visit: Callable[[relax.Expr], relax.Expr]) -> relax.Expr:
    """The element-wise ops of ``chain`` applied again, to ``out`` where they read ``start``."""
    current = start
    for step in chain:
        call = graph.values[step]
        args = [out if arg.same_as(current) else visit(arg) for arg in call.args]
        out, current = relax.Call(call.op, args, call.attrs), step
    return out


def _keeps_memory_order(call: relax.Call) -> bool:
    """Is ``call`` a ``permute_dims`` that moves unit axes only (a reshape in disguise)?"""
    if op_name(call) != "relax.permute_dims" or call.attrs.axes is None:
        return False
    shape = static_shape(call.args[0])
    if shape is None:
        return False
    moved = [int(axis) for axis in call.attrs.axes if shape[int(axis)] != 1]
    return moved == sorted(moved)


def _unflattened(graph: RuleGraph, arg: relax.Expr) -> relax.Expr | None:
    """The tensor a matmul operand flattens (the operand itself if it is no such reshape)."""
    reshape = graph.producer(arg, "relax.reshape")
    if reshape is None:
        return arg
    if graph.only_user(arg) is None:
        return None
    source = reshape.args[0]
    broadcast = graph.producer(source, "relax.broadcast_to")
    if broadcast is not None and static_shape(broadcast.args[0]) == static_shape(source):
        source = broadcast.args[0]  # a broadcast to its own shape changes nothing
    before, after = static_shape(source), static_shape(arg)
    if before is None or after is None or len(before) < 2 or len(after) < 2 or before[-2:] != after[-2:]:
        return None
    if math.prod(before[:-2]) != math.prod(after[:-2]):
        return None
    return source


def _elementwise_step(call: relax.Call, current: relax.Var) -> bool:
    """Is ``call`` an element-wise op of ``current`` whose other operands are constants of rank <= 2?"""
    from alt_tvm.strategies.epilogue import joinable

    if not joinable(call):
        return False
    for arg in call.args:
        if arg.same_as(current):
            continue
        data = const_value(arg)
        if isinstance(arg, relax.Expr) and static_shape(arg) is not None and data is None:
            return False  # another tensor: its rank fixes the broadcast
        if data is not None and data.ndim > 2:
            return False
    return True


# ------------------------------------------------------------------------------------------------ GELU


def merge_gelu(mod: tvm.IRModule) -> tvm.IRModule:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` (any association of the products) becomes ``nn.gelu(x)``,
    and the tanh approximation (:func:`_tanh_term`) ``nn.gelu_tanh(x)``."""
    return apply_rule(mod, _gelus)


def _gelus(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        if op_name(value) != "relax.multiply":
            continue
        factors, inner = _factors(graph, value)
        if len(factors) != 3:
            continue
        halves = [f for f in factors if _scalar(f) == 0.5]
        terms = [(f, term, op) for f in factors for term, op in ((_erf_term, relax.op.nn.gelu),
                                                                 (_tanh_term, relax.op.nn.gelu_tanh))
                 if term(graph, f) is not None]
        if len(halves) != 1 or len(terms) != 1:
            continue
        factor, term, gelu = terms[0]
        x, members = term(graph, factor)
        (rest,) = [f for f in factors if f is not halves[0] and f is not factor]
        if not rest.same_as(x) or static_shape(x) != static_shape(var):
            continue
        yield RuleMatch(var, lambda visit, x=x, gelu=gelu: gelu(visit(x)), (*inner, *members))


def _factors(graph: RuleGraph, call: relax.Call) -> tuple[list[relax.Expr], list[relax.Var]]:
    """The operands of a product tree of single-use ``multiply`` ops, and its inner vars."""
    factors, inner = [], []
    for arg in call.args:
        sub = graph.producer(arg, "relax.multiply")
        if sub is not None and graph.only_user(arg) is not None:
            more, deeper = _factors(graph, sub)
            factors += more
            inner += [arg, *deeper]
        else:
            factors.append(arg)
    return factors, inner


def _erf_term(graph: RuleGraph, expr: relax.Expr) -> tuple[relax.Expr, list[relax.Var]] | None:
    """``(x, its vars)`` if ``expr`` is ``1 + erf(x / sqrt(2))`` (or ``x * (1 / sqrt(2))``), else None."""
    add = graph.producer(expr, "relax.add")
    if add is None or graph.only_user(expr) is None:
        return None
    erf_var = next((a for a in add.args if graph.producer(a, "relax.erf") is not None), None)
    one = next((a for a in add.args if erf_var is not None and not a.same_as(erf_var)), None)
    if erf_var is None or one is None or _scalar(one) != 1.0 or graph.only_user(erf_var) is None:
        return None
    scaled = graph.values[erf_var].args[0]
    if graph.only_user(scaled) is None:
        return None
    for op, factor in (("relax.divide", math.sqrt(2.0)), ("relax.multiply", math.sqrt(0.5))):
        call = graph.producer(scaled, op)
        if call is not None and _close(_scalar(call.args[1]), factor):
            return call.args[0], [expr, erf_var, scaled]
    return None


def _tanh_term(graph: RuleGraph, expr: relax.Expr) -> tuple[relax.Expr, list[relax.Var]] | None:
    """``(x, its vars)`` if ``expr`` is ``1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))`` (GPT-2's
    GELU, the cube as ``power(x, 3)``), else None."""
    add = graph.producer(expr, "relax.add")
    if add is None or graph.only_user(expr) is None:
        return None
    tanh_var = next((a for a in add.args if graph.producer(a, "relax.tanh") is not None), None)
    one = next((a for a in add.args if tanh_var is not None and not a.same_as(tanh_var)), None)
    if tanh_var is None or one is None or _scalar(one) != 1.0 or graph.only_user(tanh_var) is None:
        return None
    scaled = graph.values[tanh_var].args[0]
    outer = graph.producer(scaled, "relax.multiply")
    if outer is None or graph.only_user(scaled) is None or not _close(_scalar(outer.args[1]), math.sqrt(2 / math.pi)):
        return None
    inner_sum = graph.producer(outer.args[0], "relax.add")
    if inner_sum is None or graph.only_user(outer.args[0]) is None:
        return None
    for x, cubic in (inner_sum.args, inner_sum.args[::-1]):
        term = graph.producer(cubic, "relax.multiply")
        cube = term.args[0] if term is not None else None
        power = graph.producer(cube, "relax.power") if cube is not None else None
        if (power is not None and graph.only_user(cubic) is not None and graph.only_user(cube) is not None
                and _close(_scalar(term.args[1]), 0.044715) and power.args[0].same_as(x)
                and _scalar(power.args[1]) == 3.0):
            return x, [expr, tanh_var, scaled, outer.args[0], cubic, cube]
    return None


def _close(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= 1e-6 * expected


# ---------------------------------------------------------------------------------------- global pools

_POOLS = {f"relax.nn.{kind}_pool{rank}d": (kind, rank) for kind in ("avg", "max") for rank in (1, 2, 3)}


def global_pools(mod: tvm.IRModule) -> tvm.IRModule:
    """A pooling whose one window per channel covers the whole input becomes a global ``mean``
    or ``max`` (channels-first layouts). An average that counts explicit padding is left alone;
    the part of a window past the input that ``ceil_mode`` adds never counts (PyTorch, ONNX)."""
    return apply_rule(mod, _global_pools)


def _global_pools(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        kind_rank = _POOLS.get(op_name(value))
        if kind_rank is None:
            continue
        kind, rank = kind_rank
        attrs = value.attrs
        x = value.args[0]
        shape, out = static_shape(x), static_shape(var)
        if shape is None or out is None or str(attrs.layout)[:2] != "NC" or str(attrs.out_layout) != str(attrs.layout):
            continue
        spatial = shape[2:]
        pool = [int(p) for p in attrs.pool_size]
        padding = [int(p) for p in attrs.padding]
        if (any(d != 1 for d in out[2:]) or any(padding[:rank]) or any(int(d) != 1 for d in attrs.dilation)
                or any(p < s for p, s in zip(pool, spatial))):
            continue
        if kind == "avg" and bool(attrs.count_include_pad) and any(padding) and pool != list(spatial):
            continue  # explicit padded zeros would count (a ceil-mode overhang never counts)
        axes = list(range(2, 2 + rank))
        reduce = relax.op.mean if kind == "avg" else relax.op.max
        yield RuleMatch(var, lambda visit, x=x, reduce=reduce, axes=axes: reduce(visit(x), axes, keepdims=True), ())


# ----------------------------------------------------------------------------------------- group norms


def group_norms(mod: tvm.IRModule) -> tvm.IRModule:
    """``reshape(x, (N, G, -1))``, normalized over its last axis (mean, population variance,
    ``sqrt(var + eps)``), an optional affine per group, ``reshape`` back to ``x``'s shape and an
    optional affine per channel becomes ``nn.group_norm(x, gamma, beta, G)`` over channel axis 1,
    the affines folded into ``gamma`` and ``beta``. Only constants that vary along the group
    (or channel) axis alone are folded; the intermediate values must have no other use."""
    return apply_rule(mod, _group_norms)


def _group_norms(graph: RuleGraph) -> Iterator[RuleMatch]:
    for var, value in graph.values.items():
        found = _group_norm(var, value, graph)
        if found is None:
            continue
        last, x, groups, eps, gamma, beta, members = found
        axes = list(range(2, len(static_shape(x))))

        def make(visit, x=x, gamma=gamma, beta=beta, groups=groups, axes=axes, eps=eps):
            return relax.op.nn.group_norm(visit(x), relax.const(gamma), relax.const(beta), groups, 1, axes, eps)

        yield RuleMatch(last, make, tuple(members))


def _group_norm(var: relax.Var, value: relax.Expr, graph: RuleGraph):
    """``(last var, x, groups, eps, gamma[C], beta[C], replaced vars)`` of the norm whose first
    reshape is ``var``, or None."""
    if op_name(value) != "relax.reshape":
        return None
    x = value.args[0]
    shape, rows = static_shape(x), static_shape(var)
    dtype = dtype_of(var)
    if shape is None or rows is None or len(shape) < 3 or len(rows) != 3 or not dtype.startswith("float"):
        return None
    channels, groups = shape[1], rows[1]
    if rows[0] != shape[0] or groups < 1 or channels % groups or rows[1] * rows[2] != math.prod(shape[1:]):
        return None
    users = {graph.values[u]: u for u in graph.users.get(var, []) if u in graph.values}
    by_op = {op_name(call): (call, user) for call, user in users.items()}
    if len(users) != 3 or set(by_op) != {"relax.mean", "relax.variance", "relax.subtract"}:
        return None
    (mean, m), (variance, v), (centred, d) = (by_op[k] for k in ("relax.mean", "relax.variance", "relax.subtract"))
    if not (_last_axis(mean, 3) and _last_axis(variance, 3) and centred.args[0].same_as(var)
            and centred.args[1].same_as(m) and graph.only_user(m) == d):
        return None
    e = graph.only_user(v)
    if e is None or op_name(graph.values[e]) != "relax.add" or _scalar(graph.values[e].args[1]) is None:
        return None
    eps = _scalar(graph.values[e].args[1])
    sq = graph.only_user(e)
    q = graph.only_user(sq) if sq is not None and op_name(graph.values[sq]) == "relax.sqrt" else None
    if q is None or graph.only_user(d) != q or op_name(graph.values[q]) != "relax.divide" \
            or not (graph.values[q].args[0].same_as(d) and graph.values[q].args[1].same_as(sq)):
        return None
    members = [var, m, v, d, e, sq, q]
    group_scale, group_shift, current, _ = _affine_run(graph, q, rows, groups, members)
    back = graph.only_user(current)
    if back is None or op_name(graph.values[back]) != "relax.reshape" or static_shape(back) != shape:
        return None
    members.append(back)
    scale, shift, last, _ = _affine_run(graph, back, shape, channels, members)
    members.remove(last)
    per_group = channels // groups
    gamma = np.repeat(group_scale, per_group) * scale
    beta = np.repeat(group_shift, per_group) * scale + shift
    return last, x, groups, eps, gamma.astype(dtype), beta.astype(dtype), members


def _last_axis(call: relax.Call, rank: int) -> bool:
    """A reduction over the last of ``rank`` axes, keeping it."""
    axes = [int(a) % rank for a in call.attrs.axis] if call.attrs.axis is not None else []
    return axes == [rank - 1] and bool(call.attrs.keepdims)


def _affine_run(graph: RuleGraph, start: relax.Var, shape: Sequence[int], channels: int, members: list,
                dtype: str | None = None) -> tuple[np.ndarray, np.ndarray, relax.Var, list[str]]:
    """``(scale, shift, last var, ops)`` of the run of ``x * c`` / ``x + c`` / ``x - c`` /
    ``x / c`` after ``start`` (each the single user of the last, of ``shape`` and, if given,
    ``dtype``) with constants along axis 1 of ``channels``; appends the run's vars to
    ``members``."""
    scale, shift, current, ops = np.ones(channels), np.zeros(channels), start, []
    while (nxt := graph.only_user(current)) is not None:
        call = graph.values[nxt]
        name = op_name(call)
        if name not in _AFFINE or static_shape(nxt) != tuple(shape) or (dtype is not None and dtype_of(nxt) != dtype):
            break
        lhs, rhs = call.args
        if name in ("relax.add", "relax.multiply") and rhs.same_as(current):
            lhs, rhs = rhs, lhs
        per_channel = per_channel_vector(rhs, len(shape), channels) if lhs.same_as(current) else None
        if per_channel is None or (name == "relax.divide" and np.any(per_channel == 0)):
            break
        if name == "relax.add":
            shift = shift + per_channel
        elif name == "relax.subtract":
            shift = shift - per_channel
        elif name == "relax.multiply":
            scale, shift = scale * per_channel, shift * per_channel
        else:
            scale, shift = scale / per_channel, shift / per_channel
        ops.append(name)
        members.append(nxt)
        current = nxt
    return scale, shift, current, ops
