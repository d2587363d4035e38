"""The layout rewrite pass: rebuild TE computes for new tensor layouts (ALT paper §6).

For each operator ``Y = F(X, ...)`` whose output layout is ``S_Y``:

1. the output's loop nest is rebuilt over the new shape, with loop variables L';
2. the old loop variables are replaced by ``S_Y^-1(L')`` (``Layout.backward``);
3. every read ``X[f(L)]`` becomes ``X'[S_X(f(L))]`` (``Layout.forward``), where an
   ``unfold`` on X turns a sliding-window read ``V*i + r`` into the paper's equation (1).

Index expressions are simplified with TVM's analyzer under the new loop bounds, so
``(ho*4 + hi) // 4`` becomes ``ho``. Where a padded or overlapping output layout makes
the rebuilt nest visit positions that do not exist in the original tensor, and some read
could then leave its buffer, the body is guarded (``if_then_else``, which TVM's vector
code turns into masked loads). When every read stays in bounds (the inputs are padded
as well), an intermediate stage computes a value nobody reads at those positions, and an
output of the graph selects zeros there: the padding of a stored tensor holds zeros, so
a consumer that multiplies it by zero-padded weights never meets a NaN.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.sym import Analyzer, detect_linear_equation

from .expr import rebuild, tensor_loads
from .layout import Layout
from .primitives import Unfold


def _int(value: Any) -> int:
    return int(value.value) if hasattr(value, "value") else int(value)


def _shape(tensor: te.Tensor) -> tuple[int, ...]:
    try:
        return tuple(_int(s) for s in tensor.shape)
    except (TypeError, ValueError) as err:
        raise ValueError(f"tensor {tensor.op.name!r} has a symbolic shape {tensor.shape}; "
                         f"layouts need static shapes") from err


class TensorMap(MutableMapping):
    """A dict keyed by TE tensors.

    ``te.Tensor.__eq__`` builds expressions (and refuses rank-0 tensors), and every
    ``op.output(i)`` is a new object, so tensors are keyed by (operation, output index).
    """

    def __init__(self, items: Any = ()) -> None:
        self._data: dict = {}
        for key, value in (items.items() if hasattr(items, "items") else items):
            self[key] = value

    @staticmethod
    def _key(tensor: te.Tensor) -> tuple[int, int]:
        return tensor.op.__chandle__(), int(tensor.value_index)

    def __getitem__(self, tensor: te.Tensor) -> Any:
        return self._data[self._key(tensor)][1]

    def __setitem__(self, tensor: te.Tensor, value: Any) -> None:
        self._data[self._key(tensor)] = (tensor, value)

    def __delitem__(self, tensor: te.Tensor) -> None:
        del self._data[self._key(tensor)]

    def __contains__(self, tensor: object) -> bool:
        return isinstance(tensor, te.Tensor) and self._key(tensor) in self._data

    def __iter__(self):
        return (tensor for tensor, _ in self._data.values())

    def __len__(self) -> int:
        return len(self._data)


def _bind(analyzer: Analyzer, var: Any, extent: int) -> None:
    analyzer.bind(var, tvm.ir.Range(0, extent))


class _WindowContext:
    """Recognises sliding-window reads ``V*i + r`` for :class:`Unfold` (paper eq. (1))."""

    def __init__(self, analyzer: Analyzer, spatial: list, reduce: list) -> None:
        self.analyzer = analyzer
        self.spatial = spatial
        self.reduce = reduce

    def sliding_window(self, x: Any, unfold: Unfold, extent: int) -> tuple[Any, Any] | None:
        if isinstance(x, int) or not self.spatial:
            return None
        coeffs = detect_linear_equation(x, self.spatial + self.reduce)
        if len(coeffs) == 0:
            return None
        terms = [(v, _int(c)) for v, c in zip(self.spatial, coeffs) if _int(c) != 0]
        if len(terms) != 1 or terms[0][1] <= 0:
            return None
        i, stride = terms[0]
        rest = self.analyzer.simplify(x - i * stride)
        bound = self.analyzer.const_int_bound(rest)
        if bound.min_value < 0:
            return None
        window = bound.max_value + 1
        if unfold.stride % stride:
            return None
        per_tile = unfold.stride // stride  # windows per tile (P)
        if stride * (per_tile - 1) + window > unfold.tile_size:
            return None
        last = unfold.num_tiles(extent) - 1
        if self.analyzer.const_int_bound(i // per_tile).max_value <= last:
            return i // per_tile, (i % per_tile) * stride + rest
        # Tiles longer than P windows end early: the last windows live in the last tile.
        tile = tirx.min(i // per_tile, last)
        return tile, x - tile * unfold.stride


@dataclass
class RewriteResult:
    """Tensors of the rewritten TE graph.

    ``tensors`` maps every original tensor to its rewritten counterpart; a tensor
    attached to another with ``store_at`` maps to its host.
    """

    tensors: TensorMap = field(default_factory=TensorMap)
    layouts: TensorMap = field(default_factory=TensorMap)

    def __getitem__(self, tensor: te.Tensor) -> te.Tensor:
        return self.tensors[tensor]

    def args(self, args: Sequence[te.Tensor]) -> list[te.Tensor]:
        """Rewritten function arguments for original ``args``; attached guests are dropped."""
        out: list[te.Tensor] = []
        for tensor in args:
            if tensor not in self.tensors:
                raise ValueError(f"tensor {tensor.op.name!r} is not part of the rewritten graph")
            new = self.tensors[tensor]
            if not any(new.same_as(o) for o in out):
                out.append(new)
        return out

    def layout_of(self, tensor: te.Tensor) -> Layout:
        """The layout of an original tensor (the identity if none was given)."""
        return self.layouts.get(tensor) or Layout(_shape(tensor))


def rewrite(outputs: Sequence[te.Tensor], *, layouts: Mapping[te.Tensor, Layout]) -> RewriteResult:
    """Rebuild the TE graph ending in ``outputs`` so each tensor in ``layouts`` has its layout.

    Parameters
    ----------
    outputs
        Output tensors of the TE graph.
    layouts
        New layout per tensor (placeholders, intermediate and output tensors alike).
        Tensors absent from the mapping keep their layout. A ``store_at`` guest given as a
        ``te.Tensor`` is read from its host's buffer and disappears from the arguments.

    Returns
    -------
    RewriteResult
        The mapping from original to rewritten tensors.
    """
    return _Rewriter(layouts).run(outputs)


def create_prim_func(args: Sequence[te.Tensor], *, layouts: Mapping[te.Tensor, Layout]) -> tvm.tirx.PrimFunc:
    """``te.create_prim_func`` after :func:`rewrite`; ``args`` are the original tensors."""
    outputs = [t for t in args if not isinstance(t.op, te.PlaceholderOp)]
    result = rewrite(outputs, layouts=layouts)
    return te.create_prim_func(result.args(args))


class _Rewriter:
    def __init__(self, layouts: Mapping[te.Tensor, Layout]) -> None:
        self.layouts = TensorMap()
        self.guests = TensorMap()  # guest tensor -> host tensor
        for tensor, layout in layouts.items():
            if not isinstance(layout, Layout):
                raise ValueError(f"layout for {tensor.op.name!r} must be an alt_tvm.layout.Layout, "
                                 f"got {type(layout).__name__}")
            if layout.orig_shape != _shape(tensor):
                raise ValueError(f"layout for {tensor.op.name!r} starts from shape {layout.orig_shape}, "
                                 f"but the tensor has shape {_shape(tensor)}")
            self.layouts[tensor] = layout
            for step in layout.guests:
                if isinstance(step.key, te.Tensor):
                    self.guests[step.key] = tensor
        self.new = TensorMap()
        self.outputs = TensorMap()

    def run(self, outputs: Sequence[te.Tensor]) -> RewriteResult:
        self.outputs = TensorMap((out, True) for out in outputs)
        order: list = []
        seen = TensorMap()

        def visit(tensor: te.Tensor) -> None:
            if tensor in seen:
                return
            seen[tensor] = True
            for inp in tensor.op.input_tensors:
                visit(inp)
            order.append(tensor)

        for out in outputs:
            visit(out)
        for guest, host in self.guests.items():
            if guest not in seen or host not in seen:
                raise ValueError(f"store_at: {guest.op.name!r} is attached to {host.op.name!r}, "
                                 f"but one of them is not in the graph")
            if not isinstance(guest.op, te.PlaceholderOp) or not isinstance(host.op, te.PlaceholderOp):
                raise ValueError(f"store_at: only constants/placeholders can be attached; "
                                 f"{guest.op.name!r} -> {host.op.name!r}")
        for tensor in order:
            if tensor in self.guests:
                continue
            self.new[tensor] = self._rewrite_tensor(tensor)
        for guest, host in self.guests.items():
            self.new[guest] = self.new[host]
        return RewriteResult(tensors=TensorMap(self.new), layouts=TensorMap(self.layouts))

    # -------------------------------------------------------------- tensors
    def _rewrite_tensor(self, tensor: te.Tensor) -> te.Tensor:
        op = tensor.op
        layout = self.layouts.get(tensor)
        if isinstance(op, te.PlaceholderOp):
            if layout is None or layout.is_identity:
                return tensor
            return te.placeholder(layout.shape, dtype=tensor.dtype, name=op.name)
        if not isinstance(op, te.ComputeOp):
            if layout is not None or any(not self.new[t].same_as(t) for t in op.input_tensors):
                raise ValueError(f"cannot change layouts through {type(op).__name__} {op.name!r}; "
                                 f"only compute and placeholder ops are supported")
            return tensor
        touched = layout is not None or any(not self.new[t].same_as(t) for t in op.input_tensors)
        if not touched:
            return tensor
        if op.num_outputs != 1:
            raise ValueError(f"compute {op.name!r} has {op.num_outputs} outputs; layouts support "
                             f"single-output computes only")
        return self._rebuild_compute(tensor, layout or Layout(_shape(tensor)))

    def _map_read(self, context: _WindowContext):
        def load(tensor: te.Tensor, indices: list) -> Any:
            if tensor in self.guests:
                host = self.guests[tensor]
                return self.new[host](*self.layouts[host].guest_forward(tensor, indices, context))
            layout = self.layouts.get(tensor)
            if layout is not None:
                indices = layout.forward(indices, context)
            return self.new[tensor](*indices)

        return load

    def _rebuild_compute(self, tensor: te.Tensor, layout: Layout) -> te.Tensor:
        op = tensor.op
        body = op.body[0]
        old_vars = [iv.var for iv in op.axis]
        old_extents = [_int(iv.dom.extent) for iv in op.axis]
        reduce_axes = list(body.axis) if isinstance(body, tirx.Reduce) else []

        old_scope = Analyzer()
        for var, extent in zip(old_vars, old_extents):
            _bind(old_scope, var, extent)
        for iv in reduce_axes:
            _bind(old_scope, iv.var, _int(iv.dom.extent))
        context = _WindowContext(old_scope, old_vars, [iv.var for iv in reduce_axes])
        mapped = rebuild(body, load=self._map_read(context))
        output = tensor in self.outputs

        def fcompute(*new_vars):
            scope = Analyzer()
            for var, extent in zip(new_vars, layout.shape):
                _bind(scope, var, extent)
            for iv in reduce_axes:
                _bind(scope, iv.var, _int(iv.dom.extent))
            checks: list = []
            old_vals = [scope.simplify(v) for v in layout.backward(list(new_vars), checks=checks)]
            vmap = dict(zip(old_vars, old_vals))
            new_body = rebuild(mapped, vmap=vmap,
                               load=lambda t, idx: t(*[scope.simplify(i) for i in idx]))
            guard = _out_of_range_guard(scope, checks)
            if guard is None:
                return new_body
            if not _reads_in_bounds(scope, new_body):
                return _guarded(new_body, guard)
            if output and not isinstance(new_body, tirx.Reduce):
                # A select of values already loaded: a vector blend, no masked loads.
                return tirx.Select(guard, new_body, tirx.const(0, new_body.ty))
            return new_body

        names = _unique(layout.dim_names([str(v.name) for v in old_vars]))
        return te.compute(layout.shape, fcompute, name=op.name, tag=op.tag, attrs=op.attrs,
                          varargs_names=names)


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.append(name if count == 0 else f"{name}{count}")
    return out


def _out_of_range_guard(scope: Analyzer, checks: list) -> Any:
    """Condition that a position of a new layout holds a real element, or None if always true."""
    conds = []
    for value, extent in checks:
        value = scope.simplify(value)
        bound = scope.const_int_bound(value)
        if bound.min_value < 0:
            conds.append(value >= 0)
        if bound.max_value >= extent:
            conds.append(value < extent)
    # Each step of a layout checks its own index; after simplifying, several are the same test.
    unique = [c for k, c in enumerate(conds) if not any(tvm_ffi.structural_equal(c, d) for d in conds[:k])]
    return tirx.all(*unique) if unique else None


def padding_reach(layout: Layout) -> list[tuple[int, int]]:
    """Per original dimension, how far ``layout``'s stored positions reach before its first
    and past its last index: ``(0, 8)`` on the channels of 104 stored in 7 vectors of 16.

    A constant read along those dimensions (a per-channel bias) padded by as much is read
    in bounds everywhere, so the layout's padding needs no guarded loads.
    """
    scope = Analyzer()
    stored = [tirx.Var(f"i{d}", "int32") for d in range(len(layout.shape))]
    for var, extent in zip(stored, layout.shape):
        _bind(scope, var, extent)
    reach = []
    for index, extent in zip(layout.backward(stored), layout.orig_shape):
        bound = scope.const_int_bound(scope.simplify(index))
        reach.append((max(0, -int(bound.min_value)), max(0, int(bound.max_value) + 1 - extent)))
    return reach


def _reads_in_bounds(scope: Analyzer, body: Any) -> bool:
    for tensor, indices in tensor_loads(body):
        for index, extent in zip(indices, _shape(tensor)):
            bound = scope.const_int_bound(index)
            if bound.min_value < 0 or bound.max_value >= extent:
                return False
    return True


def _guarded(body: Any, guard: Any) -> Any:
    if isinstance(body, tirx.Reduce):
        # A false reduce condition leaves the combiner's identity (0 for sums).
        return tirx.Reduce(body.combiner, list(body.source), body.axis,
                           tirx.all(guard, body.condition), body.value_index, list(body.init) or None)
    return tirx.if_then_else(guard, body, tirx.const(0, body.ty))


def convert_layout(data: te.Tensor, *, src: Layout, dst: Layout, name: str = "layout_convert") -> te.Tensor:
    """A compute that converts ``data`` stored in layout ``src`` into layout ``dst``.

    This is the conversion operator the paper inserts between two complex operators
    whose layouts were tuned independently.
    """
    if _shape(data) != src.shape:
        raise ValueError(f"convert_layout: {data.op.name!r} has shape {_shape(data)}, "
                         f"but the source layout's shape is {src.shape}")
    if src.orig_shape != dst.orig_shape:
        raise ValueError(f"convert_layout: layouts describe different tensors: "
                         f"{src.orig_shape} vs {dst.orig_shape}")
    canonical = te.placeholder(src.orig_shape, dtype=data.dtype, name=data.op.name)
    identity = te.compute(src.orig_shape, lambda *i: canonical(*i), name=name, tag="layout_convert")
    result = _Rewriter({canonical: src, identity: dst})
    result.new[canonical] = data
    result.outputs[identity] = True
    return result._rebuild_compute(identity, dst)
