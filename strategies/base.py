"""The strategy contract: what a strategy sees of one operator, what it is handed to lower a
partition, and what it returns.

A *partition* is an anchor call (a convolution, a matmul) with the element-wise epilogue
fused after it, grown further where a fusion pattern the strategy declares matches
(:mod:`.pattern`: a pad it absorbs, a block's convs, attention's softmax). A strategy
checks an :class:`OpInfo` (:meth:`Strategy.applicable`), then describes the partition as
TE (anchor + epilogue), picks layouts for its tensors and a loop schedule
(:meth:`Strategy.implement`); :class:`PartitionContext` does the common rest: TE
placeholders for the Relax arguments, the layouts the arguments are already stored in (so
reads go through them, and a pad stage converts for free), weight packing at compile time,
the layout rewrite pass and ``te.create_prim_func``. Strategies import this module, never
the model layer (``alt_tvm.graph``).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax, te

from alt_tvm.layout import Layout, rewrite
from alt_tvm.layout.rewrite import TensorMap, padding_reach
from alt_tvm.target import HardwareTarget

from .constants import const_value
from .pattern import FusionPattern
from .wellformed import fresh_block_vars


def op_name(expr: relax.Expr) -> str | None:
    if isinstance(expr, relax.Call) and hasattr(expr.op, "name"):
        return str(expr.op.name)
    return None


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = expr.ty if hasattr(expr, "ty") else None
    shape = getattr(ty, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None


def dtype_of(expr: relax.Expr) -> str | None:
    ty = getattr(expr, "ty", None)
    dtype = getattr(ty, "dtype", None)
    return None if dtype is None else str(dtype)


@dataclass
class Partition:
    """An anchor binding and the epilogue bindings fused after it, in program order; and
    what a fusion pattern (:attr:`pattern`) added before the anchor and after the epilogue."""

    anchor: relax.VarBinding
    epilogue: list[relax.VarBinding] = field(default_factory=list)
    #: bindings before the anchor that :attr:`pattern` took (a producer whose layout change
    #: the kernel absorbs, a layer norm it computes first, the views attention reads through)
    prologue: list[relax.VarBinding] = field(default_factory=list)
    #: bindings after the epilogue that :attr:`pattern` took (attention's softmax and product,
    #: a block's depthwise and 1x1 convs, a layer norm)
    tail: list[relax.VarBinding] = field(default_factory=list)
    #: the fusion pattern that grew the partition beyond its epilogue (None: none did)
    pattern: FusionPattern | None = None

    @property
    def bindings(self) -> list[relax.VarBinding]:
        return [*self.prologue, self.anchor, *self.epilogue, *self.tail]

    @property
    def output(self) -> relax.Var:
        return self.bindings[-1].var

    @property
    def ops(self) -> list[str]:
        """Anchor op first, then a prologue op computed in the kernel
        (:attr:`~.pattern.FusionPattern.claims_anchor`), then the epilogue and tail ops (an
        absorbed pad, scale or view is not listed)."""
        computed = self.prologue if self.pattern is not None and self.pattern.claims_anchor else []
        return [op_name(b.value) for b in (self.anchor, *computed, *self.epilogue, *self.tail)]

    def pieces(self) -> list[Partition]:
        """The partitions to lower one by one in place of this one when its fused kernel
        cannot be built (:attr:`~.pattern.FusionPattern.pieces`); ``[]`` for none."""
        return [] if self.pattern is None else self.pattern.split(self)


def fusion_option(options: Any, key: str, *, strategy: str = "alt") -> bool | str:
    """A switch of one of a strategy's rules (a fusion, Winograd convs) from its build options:
    True (the rule, the default), False (never) or ``"always"``; anything else is a
    ``ValueError`` naming them."""
    fuse = (options or {}).get(key, True)
    if fuse not in (True, False, "always"):
        raise ValueError(f"strategy_options[{strategy!r}][{key!r}] must be True, False or 'always', got {fuse!r}")
    return fuse


@dataclass(frozen=True)
class OpInfo:
    """What a strategy sees of one Relax operator call.

    Attributes
    ----------
    op
        Relax operator name, e.g. ``"relax.nn.conv2d"``.
    attrs
        The call's attributes as plain Python values.
    input_shapes, input_dtypes
        Static shapes and dtypes of the call's tensor arguments.
    constants
        The constant arguments' data by argument position (weights), else absent.
    output_shape, output_dtype
        The call's result.
    target_kind
        ``"llvm"``, ``"cuda"``, ...
    target_name, options
        The hardware description's name, and the per-strategy options of the build.
    """

    op: str
    attrs: dict[str, Any]
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shape: tuple[int, ...]
    output_dtype: str
    target_kind: str
    constants: dict[int, np.ndarray] = field(default_factory=dict, compare=False, hash=False)
    #: ``alt_tvm.target.HardwareTarget.name`` ("host", "kirin990", "vta", ...)
    target_name: str = "host"
    #: per-strategy options given to the build (``strategy_options={name: ...}``)
    options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Strategy(abc.ABC):
    """One way of implementing some Relax operators (subclasses are registered singletons)."""

    #: Name users pass in ``strategies=[...]``.
    name: str = ""
    #: Relax operator names this strategy can implement.
    ops: tuple[str, ...] = ()
    #: Target kinds (``tvm.target.Target.kind.name``) it generates code for.
    target_kinds: tuple[str, ...] = ("llvm",)
    #: Higher wins when several strategies apply.
    priority: int = 0
    #: Opt-in strategies are only considered when the build names them in ``strategies``
    #: or gives them ``strategy_options`` (they stay silent in fallback reports otherwise).
    opt_in: bool = False
    #: The kernel computes the operator as written (up to float rounding). Approximations
    #: (a TT-factorised weight) set False: they are never chosen for a partition by
    #: measured speed, only when the user asks for them.
    exact: bool = True
    #: The fusions beyond the epilogue this strategy lowers (:class:`~.pattern.FusionPattern`),
    #: tried in this order; the first that matches and passes its check grows the partition.
    patterns: tuple[FusionPattern, ...] = ()

    @abc.abstractmethod
    def applicable(self, info: OpInfo) -> str | None:
        """``None`` if this strategy can implement ``info``, else the reason it cannot."""

    @abc.abstractmethod
    def implement(self, anchor: relax.VarBinding, context: PartitionContext) -> LoweredPartition:
        """Lower the partition ``context.partition`` anchored at ``anchor`` to one kernel.

        ``context.params`` holds tuned parameters for the partition's workload, or None
        for the strategy's analytic defaults.
        """

    def space(self, anchor: relax.VarBinding, context: PartitionContext) -> Any:
        """The tuning space (an ``alt_tvm.strategies.space.Space``) of a partition, or None if not tunable."""
        return None

    def preferred_source_layouts(self, partition: Partition) -> dict:
        """Layouts in which this strategy would like the tensors that the partition's
        prologue views start from (``{relax var: Layout}``; ALT paper §4.2 through views).

        The build asks the partition that produces such a tensor to write it so (where
        nothing else reads it); the strategy then reads it through the views and that
        layout. Default: none.
        """
        return {}

    def preferred_input_layout(self, anchor: relax.VarBinding, context: PartitionContext) -> Layout | None:
        """The layout in which :meth:`implement` wants the anchor's data input, without lowering.

        The build propagates it backwards onto element-wise producers (ALT paper §4.2),
        which then compute in that layout instead of a conversion op being inserted.
        None: the canonical layout, or a layout the partition converts to itself (a pad
        stage it absorbs writes any layout for free).
        """
        return None


def equivalent(a: Layout | None, b: Layout | None, shape: Sequence[int]) -> bool:
    """True if two layouts (None = canonical) store ``shape`` identically."""
    a = a or Layout(shape)
    b = b or Layout(shape)
    if a.shape != b.shape:
        return False
    if a.primitives == b.primitives:
        return True
    index = list(np.indices(tuple(shape), sparse=False))
    return all(np.array_equal(x, y) for x, y in zip(a.forward(index), b.forward(index)))


@dataclass
class LoweredPartition:
    """A partition compiled to one PrimFunc, with the Relax arguments to call it on.

    A strategy whose kernel is not TIR (e.g. one run on an accelerator model) sets
    ``packed_func`` to the name of a registered global function called in
    destination-passing style (``relax.call_dps_packed``) and leaves ``func`` None.
    """

    func: tvm.tirx.PrimFunc | None
    args: list[relax.Expr]
    output_shape: tuple[int, ...]
    output_dtype: str
    output_layout: Layout | None
    strategy: str
    packed_func: str | None = None


@dataclass
class PartitionContext:
    """Everything a strategy needs to lower one partition."""

    partition: Partition
    target: HardwareTarget
    variant: str
    input_layouts: dict  # relax Var -> Layout of the value it currently holds
    #: tuned parameters for this partition's workload (None: the strategy's analytic defaults)
    params: dict | None = None
    #: the build's options for the strategy lowering this partition (``strategy_options[name]``)
    options: Any = None
    #: allow max/min/clip forms that drop NaN in the epilogue (``alt_tvm.build(fast_math=...)``)
    fast_math: bool = False
    #: the layout its consumer asked the partition's output to be written in
    #: (:meth:`Strategy.preferred_source_layouts`); a strategy that cannot write it ignores
    #: it, and :attr:`LoweredPartition.output_layout` says what it wrote
    output_layout: Layout | None = None
    #: filled while lowering
    placeholders: list = field(default_factory=list)  # (relax expr, te placeholder)
    conversions: dict = field(default_factory=dict)  # relax Var -> Layout it must be converted to first
    #: placeholders that view another value through a layout (an absorbed transpose)
    views: list = field(default_factory=list)  # (te placeholder, Layout to the source's canonical shape)

    @property
    def workload_key(self) -> str:
        """Identifies the partition's computation: anchor op, shapes, dtypes, attrs, epilogue ops."""
        return workload_key(self.partition)

    def te_input(self, expr: relax.Expr, name: str) -> te.Tensor:
        """A TE placeholder (canonical shape) for a Relax argument, one per distinct argument."""
        for source, tensor in self.placeholders:
            if source.same_as(expr):
                return tensor
        shape = static_shape(expr)
        if shape is None:
            raise ValueError(f"alt-tvm needs static shapes; argument {name!r} of "
                             f"{self.partition.ops[0]} has type {getattr(expr, 'ty', None)}")
        tensor = te.placeholder(shape, dtype=dtype_of(expr), name=name)
        self.placeholders.append((expr, tensor))
        return tensor

    def te_view(self, expr: relax.Expr, *, shape: Sequence[int], layout: Layout, name: str) -> te.Tensor:
        """A placeholder of ``shape`` whose data is ``expr`` stored in ``layout``.

        ``layout`` maps the placeholder's shape to ``expr``'s canonical shape (e.g. the
        reorder of a transpose the partition absorbs); ``expr``'s own current layout is
        applied after it, so the kernel reads the transpose's input directly.
        """
        if tuple(layout.orig_shape) != tuple(shape) or tuple(layout.shape) != tuple(static_shape(expr)):
            raise ValueError(f"te_view: layout {layout} does not map {tuple(shape)} to {static_shape(expr)}")
        tensor = te.placeholder(tuple(shape), dtype=dtype_of(expr), name=name)
        self.placeholders.append((expr, tensor))
        self.views.append((tensor, layout))
        return tensor

    def epilogue_te(self, anchor_out: te.Tensor, *, anchor: relax.VarBinding | None = None,
                    epilogue: Sequence[relax.VarBinding] | None = None, first: int = 0) -> list[te.Tensor]:
        """TE of the partition's epilogue ops applied after ``anchor_out``; returns every stage.

        ``anchor`` and ``epilogue`` name another anchor of the partition and its element-wise
        ops (a conv of a block tail), whose stages are numbered from ``first`` on.
        """
        from .epilogue import epilogue_te

        stages = []
        anchor = self.partition.anchor if anchor is None else anchor
        values = {anchor.var: anchor_out}  # region var -> its TE stage
        for k, binding in enumerate(self.partition.epilogue if epilogue is None else epilogue, start=first):
            operands = []
            for j, arg in enumerate(binding.value.args):
                if arg in values:
                    operands.append(values[arg])
                elif static_shape(arg) is not None:
                    operands.append(self.te_input(arg, f"ep{k}_{j}"))
                else:
                    operands.append(None)
            stage = epilogue_te(binding.value, operands, index=k, fast_math=self.fast_math)
            values[binding.var] = stage
            stages.append(stage)
        return stages

    def source_of(self, tensor: te.Tensor) -> relax.Expr:
        for source, placeholder in self.placeholders:
            if placeholder.same_as(tensor):
                return source
        raise KeyError(tensor.op.name)

    def require_layout(self, tensor: te.Tensor, layout: Layout) -> None:
        """Have the activation behind ``tensor`` arrive in ``layout``.

        If it is stored differently, the build inserts one conversion operator before
        the partition (the paper's Fig. 5(a)); a pad stage inside the partition never
        needs this, as it writes the layout its consumer wants while padding.
        """
        if tensor in TensorMap(self.views):
            return  # an absorbed transpose: the kernel reads its input through the view
        source = self.source_of(tensor)
        if not equivalent(self.input_layouts.get(source), layout, static_shape(source)):
            self.conversions[source] = layout

    def finish(self, *, output: te.Tensor, layouts: dict, schedule: Callable[[tvm.tirx.PrimFunc], tvm.IRModule],
               strategy: str) -> LoweredPartition:
        """Rewrite layouts, create and schedule the PrimFunc, pack constants."""
        layouts = TensorMap((t, lay) for t, lay in layouts.items() if lay is not None)
        views = TensorMap(self.views)
        for source, tensor in self.placeholders:
            if const_value(source) is not None:
                continue
            if tensor in views:
                stored = self.input_layouts.get(source)
                view = views[tensor]
                layouts[tensor] = Layout(view.orig_shape, view.primitives + (stored.primitives if stored else ()))
                continue
            if source in self.conversions:
                layouts[tensor] = self.conversions[source]
            elif tensor not in layouts or self.input_layouts.get(source) is not None:
                current = self.input_layouts.get(source)
                if current is not None:
                    layouts[tensor] = current  # read the producer's layout directly
                else:
                    layouts.pop(tensor, None)
        _pad_constants(self.placeholders, layouts, output)
        result = rewrite([output], layouts=layouts)
        args = []
        relax_args = []
        for source, tensor in self.placeholders:
            data = const_value(source)
            if data is not None and tensor not in result.tensors:
                continue  # a constant no stage reads (an exponent an epilogue spelled as products)
            layout = layouts.get(tensor)
            if data is not None:
                packed = layout.apply(data) if layout is not None else data
                # (ascontiguousarray would turn a 0-d scalar into shape (1,))
                relax_args.append(relax.const(np.array(packed, order="C", copy=True), dtype_of(source)))
            else:
                relax_args.append(source)
            args.append(result[tensor])
        func = te.create_prim_func([*args, result[output]])
        scheduled = fresh_block_vars(schedule(func)["main"])
        out_layout = layouts.get(output)
        return LoweredPartition(scheduled, relax_args, tuple(int(s) for s in result[output].shape),
                                str(output.dtype), out_layout if out_layout and not out_layout.is_identity else None,
                                strategy)


def _pad_constants(placeholders: Sequence[tuple[relax.Expr, te.Tensor]], layouts: TensorMap,
                   output: te.Tensor) -> None:
    """Give each constant that broadcasts along a padded dimension of ``output``'s layout (a
    per-channel bias of a conv whose channels fill 6.5 vectors) the same padding, with zeros.

    Its reads then stay in bounds at the padding, so the epilogue is computed in whole vectors
    and the padding selected to zero once, instead of every load being masked (ALT paper §4.1,
    the ``pad`` primitive applied to the operand).
    """
    out_layout = layouts.get(output)
    if out_layout is None or out_layout.is_bijective:
        return
    reach = padding_reach(out_layout)
    out_shape = out_layout.orig_shape
    for source, tensor in placeholders:
        shape = tuple(int(d) for d in tensor.shape)
        if tensor in layouts or const_value(source) is None or not 0 < len(shape) <= len(out_shape):
            continue
        layout = Layout(shape)
        for d, extent in enumerate(shape):  # broadcast aligns trailing dimensions
            out_d = len(out_shape) - len(shape) + d
            if extent > 1 and extent == out_shape[out_d] and reach[out_d] != (0, 0):
                layout = layout.pad(d, reach[out_d])
        if not layout.is_identity:
            layouts[tensor] = layout


def tiles_for(extent: int, preferred: int) -> int:
    """The largest divisor of ``extent`` not above ``preferred`` (tiles that need no padding)."""
    for tile in range(min(preferred, extent), 0, -1):
        if extent % tile == 0:
            return tile
    return 1


#: Fields every FFI object has (identity, printing): not attributes of the operator.
_OBJECT_FIELDS = {"id_", "handle", "span", "ty"}


def attrs_dict(attrs: Any) -> dict[str, Any]:
    """Relax call attributes as plain Python values."""
    out = {}
    if attrs is None:
        return out
    for key in attrs.keys() if hasattr(attrs, "keys") else dir(attrs):
        if key.startswith("_") or key in _OBJECT_FIELDS:
            continue
        try:
            value = getattr(attrs, key) if not hasattr(attrs, "keys") else attrs[key]
        except (AttributeError, KeyError):
            continue
        if callable(value):
            continue
        out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return _float32(value)
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if type(value).__name__ == "dtype":  # tvm_ffi's dtype (and NumPy's): its name, e.g. "float32"
        return str(value)
    if hasattr(value, "value") and isinstance(value.value, (int, float, str)):
        return _float32(value.value) if isinstance(value.value, float) else value.value
    try:
        return [_plain(v) for v in value]
    except TypeError:
        return str(value)


def _float32(value: float) -> float:
    """A float attribute as its float32 value's shortest spelling: an ONNX file stores a layer
    norm's epsilon as float32 (9.999999960041972e-13 widened) and torch.export as float64
    (1e-12); both key as 1e-12."""
    return float(str(np.float32(value)))


def workload_key(partition: Partition) -> str:
    """A stable string for a partition's computation (what tuning records are keyed by).

    Canonical whatever the frontend: attributes are plain JSON values with sorted keys,
    dtypes are their names, and an ``out_dtype`` left unset (ONNX imports ``None``) is the
    output dtype it defaults to, so the same convolution from a torch module and from its
    ONNX export gets the same key. Format::

        <anchor op>|<shape>:<dtype>,...|<attrs as JSON>|out=<shape>:<dtype>|epilogue=<op>+<op>

    followed by the part of the partition's fusion pattern
    (:attr:`~.pattern.FusionPattern.key`): ``|then=...`` for a tail, ``|prologue=...`` for a
    prologue that changes the computation.
    """
    anchor = partition.anchor
    call = anchor.value
    out_dtype = dtype_of(anchor.var)
    args = [f"{static_shape(a)}:{dtype_of(a)}" for a in call.args if static_shape(a) is not None]
    attrs = attrs_dict(call.attrs)
    if "out_dtype" in attrs and attrs["out_dtype"] in (None, ""):
        attrs["out_dtype"] = out_dtype
    ops = [str(b.value.op.name).removeprefix("relax.") for b in partition.epilogue]
    fused = "" if partition.pattern is None else partition.pattern.workload_part(partition)
    return (f"{str(call.op.name).removeprefix('relax.')}|{','.join(args)}|"
            f"{json.dumps(attrs, sort_keys=True, separators=(',', ':'), default=str)}|"
            f"out={static_shape(anchor.var)}:{out_dtype}|epilogue={'+'.join(ops)}{fused}")
