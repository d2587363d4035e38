"""Group a Relax dataflow graph into "complex operator + element-wise epilogue" partitions.

A partition starts at an *anchor* (a call a strategy implements: conv, matmul) and
extends along its single-consumer chain of element-wise ops of the same output shape
(bias add, activation, residual add, batch-norm arithmetic ...). The whole partition
becomes one kernel, and the anchor's output layout is shared by every epilogue tensor —
the paper's layout propagation along element-wise paths (§4.2), which is what lets the
epilogue fuse into the anchor's loop nest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tvm import relax

from alt_tvm.strategies.base import (
    OpInfo,
    Partition,
    Strategy,
    attention_operands,
    attrs_dict,
    const_value,
    dtype_of,
    norm_before,
    norm_of,
    op_name,
    split_block_tail,
    static_shape,
    workload_key,
)
from alt_tvm.strategies.epilogue import UNARY_EPILOGUE, joinable
from alt_tvm.strategies.registry import select, strategy_ops
from alt_tvm.strategies.views import view_source
from alt_tvm.target import HardwareTarget


def consumers(func: relax.Function) -> dict:
    """For every variable, the variables bound from it (or ``"output"`` for the function result)."""
    users: dict = {}
    body = func.body
    for block in body.blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var, []).append(binding.var)
    for var in relax.analysis.free_vars(body.body):
        users.setdefault(var, []).append("output")
    return users


def _joins(binding: relax.VarBinding, region: set, shape: tuple[int, ...]) -> bool:
    """Can ``binding`` join an epilogue region (element-wise, same shape, reads the region)?"""
    name = op_name(binding.value)
    if not joinable(binding.value):
        return False
    if static_shape(binding.var) != shape:
        return False
    args = list(binding.value.args)
    if name in UNARY_EPILOGUE:
        return args[0] in region
    # One operand comes from the region; the other may be a constant or any tensor
    # broadcasting to the output (bias, batch-norm scale, residual, or the region itself).
    return any(a in region for a in args) and all(static_shape(a) is not None for a in args)


def find_partitions(func: relax.Function, *, is_anchor: Callable[[relax.VarBinding], bool],
                    epilogues: bool = True,
                    absorbs_pad: Callable[[relax.VarBinding], bool] | None = None,
                    fuses_attention: Callable[[relax.VarBinding], bool] | None = None,
                    fuses_block: Callable[[relax.VarBinding, list], bool] | None = None,
                    fuses_norm: Callable[[relax.VarBinding, relax.VarBinding], bool] | None = None,
                    absorbs_scale: Callable[[relax.VarBinding], bool] | None = None) -> list[Partition]:
    """Partitions of ``func``'s dataflow blocks, anchored where ``is_anchor`` says.

    The epilogue is the largest run of element-wise ops after the anchor that reads the
    anchor's value (a chain, or a small DAG such as GELU's ``x * (1 + erf(x))``) and whose
    intermediate values are used nowhere else: only the last value leaves the kernel.
    With ``epilogues=False`` every partition is its anchor alone (the ALT-WP ablation).
    Where ``absorbs_pad(anchor)`` holds, a zero ``relax.nn.pad`` feeding the anchor joins it;
    where ``absorbs_scale(anchor)`` holds, so does a per-channel multiply feeding a 1x1 conv
    (:func:`_channel_scale`).
    Where ``fuses_attention(anchor)`` holds, the partition goes on through attention's softmax
    and second matmul (:func:`_attention_tail`). Where a 1x1 conv is followed by a depthwise
    conv and a 1x1 conv, each read only by the next (an inverted-residual block,
    :func:`_block_tail`), and ``fuses_block(anchor, tail)`` holds, the partition goes on
    through both with their epilogues. Where the partition's value is read only by a layer
    norm over its last axis and ``fuses_norm(anchor, norm)`` holds, the norm joins it
    (:func:`_norm_tail`); so does a layer norm over the last axis whose value only the anchor
    reads, as its first operand (:func:`_norms_before`).
    """
    users = consumers(func)
    partitions: list[Partition] = []
    taken: set = set()
    for block in func.body.blocks:
        bindings = list(block.bindings)
        # Norms an anchor after them takes (found first: the norm comes first in the program).
        normed = _norms_before(bindings, users, is_anchor, fuses_norm) if epilogues and fuses_norm else {}
        skipped = {norm.var for norm in normed.values()}
        for pos, binding in enumerate(bindings):
            if binding.var in taken or binding.var in skipped or not isinstance(binding, relax.VarBinding) \
                    or not is_anchor(binding):
                continue
            part = Partition(binding)
            if binding.var in normed:
                part.prologue.append(normed[binding.var])
            if epilogues:
                part.epilogue = _epilogue(binding, bindings[pos + 1:], users, taken, is_anchor)
            if epilogues and fuses_attention is not None and fuses_attention(binding):
                part.tail = _attention_tail(part, bindings[pos + 1:], users, taken)
                if part.tail:
                    part.prologue = _attention_views(part, bindings, users, taken)
            producer = _pad_producer(binding, bindings[:pos], users) if absorbs_pad and absorbs_pad(binding) else None
            if producer is None and absorbs_scale is not None and absorbs_scale(binding):
                producer = _channel_scale(binding, bindings[:pos], users)
            if producer is not None and producer.var not in taken:
                part.prologue.append(producer)
            elif epilogues and fuses_block is not None and not part.tail:
                tail = _block_tail(part, bindings[pos + 1:], users, taken, is_anchor)
                if tail and fuses_block(binding, tail):
                    part.tail = tail
            if epilogues and fuses_norm is not None and not part.tail and not part.prologue:
                norm = _norm_tail(part, bindings[pos + 1:], users, taken | skipped)
                if norm is not None and fuses_norm(binding, norm):
                    part.tail = [norm]
            taken.update(b.var for b in part.bindings)
            partitions.append(part)
    return partitions


def _epilogue(anchor: relax.VarBinding, later: list, users: dict, taken: set,
              is_anchor: Callable[[relax.VarBinding], bool]) -> list[relax.VarBinding]:
    """The epilogue of ``anchor`` among the ``later`` bindings (:func:`find_partitions`)."""
    part = Partition(anchor)
    shape = static_shape(anchor.var)
    region = {anchor.var}
    for binding in later:
        if binding.var in taken or not isinstance(binding, relax.VarBinding):
            continue
        if not any(v in region for v in relax.analysis.free_vars(binding.value)):
            continue
        if is_anchor(binding) or not _joins(binding, region, shape):
            break
        part.epilogue.append(binding)
        region.add(binding.var)
    _trim(part, users)
    return part.epilogue


def _conv2d_attrs(binding: relax.VarBinding | None) -> dict | None:
    """The attributes of an NCHW/OIHW ``conv2d`` with a constant weight, else None."""
    if binding is None or op_name(binding.value) != "relax.nn.conv2d" or const_value(binding.value.args[1]) is None:
        return None
    attrs = attrs_dict(binding.value.attrs)
    if attrs.get("data_layout", "NCHW") != "NCHW" or attrs.get("kernel_layout", "OIHW") != "OIHW":
        return None
    return attrs


def _pointwise(binding: relax.VarBinding | None) -> bool:
    """Is ``binding`` a dense 1x1 conv2d with stride 1 and no padding?"""
    attrs = _conv2d_attrs(binding)
    return (attrs is not None and int(attrs.get("groups", 1)) == 1
            and static_shape(binding.value.args[1])[2:] == (1, 1)
            and all(int(v) == 1 for v in (*attrs.get("strides", [1, 1]), *attrs.get("dilation", [1, 1])))
            and not any(int(p) for p in attrs.get("padding", [0] * 4)))


def _dense(binding: relax.VarBinding | None) -> bool:
    """Is ``binding`` an undilated conv2d of one group (any kernel, stride and padding)?"""
    attrs = _conv2d_attrs(binding)
    return (attrs is not None and int(attrs.get("groups", 1)) == 1
            and all(int(v) == 1 for v in attrs.get("dilation", [1, 1])))


def _block_tail(part: Partition, later: list, users: dict, taken: set,
                is_anchor: Callable[[relax.VarBinding], bool]) -> list[relax.VarBinding]:
    """``[depthwise, *its epilogue, 1x1 conv, *its epilogue]`` when the conv ``part``'s value
    is read only by a depthwise conv2d whose value is read only by a 1x1 conv2d: the expand ->
    depthwise -> project chain of an inverted-residual block (MobileNetV2 §3.3), or a
    network's first conv -> depthwise -> pointwise (MobileNet-V2's and MNASNet's stem and first
    block), where ``part`` is a dense conv of any kernel. ``[depthwise, *its epilogue]`` when
    the depthwise map has other readers (EfficientNet's squeeze-excitation blocks); else ``[]``."""
    if not _dense(part.anchor):
        return []
    by_var = {b.var: b for b in later if isinstance(b, relax.VarBinding)}

    def only_reader(value: relax.Var) -> relax.VarBinding | None:
        readers = users.get(value, [])
        return by_var.get(readers[0]) if len(readers) == 1 else None

    depthwise = only_reader(part.output)
    attrs = _conv2d_attrs(depthwise)
    channels = static_shape(part.anchor.var)[1]
    if (attrs is None or int(attrs.get("groups", 1)) != channels or not depthwise.value.args[0].same_as(part.output)
            or static_shape(depthwise.var)[1] != channels):
        return []
    rest = later[later.index(depthwise) + 1:]
    dw_epilogue = _epilogue(depthwise, rest, users, taken, is_anchor)
    dw_value = (dw_epilogue[-1] if dw_epilogue else depthwise).var
    project = only_reader(dw_value)
    if not _pointwise(project) or not project.value.args[0].same_as(dw_value):
        # The depthwise map is read by more than a 1x1 conv (a squeeze-excitation's mean and
        # scale): the tail ends there, and the fused kernel writes that map.
        tail = [depthwise, *dw_epilogue]
    else:
        project_epilogue = _epilogue(project, later[later.index(project) + 1:], users, taken, is_anchor)
        tail = [depthwise, *dw_epilogue, project, *project_epilogue]
    return [] if any(b.var in taken for b in tail) else tail


def _norm_tail(part: Partition, later: list, users: dict, taken: set) -> relax.VarBinding | None:
    """The layer norm over the last axis that alone reads the partition's value, else None."""
    readers = users.get(part.output, [])
    if len(readers) != 1:
        return None
    norm = {b.var: b for b in later if isinstance(b, relax.VarBinding)}.get(readers[0])
    if norm is None or norm.var in taken or not _last_axis_norm(norm) or not norm.value.args[0].same_as(part.output):
        return None
    return norm


def _last_axis_norm(binding: relax.VarBinding) -> bool:
    """Is ``binding`` a layer norm over its value's last axis alone?"""
    if op_name(binding.value) != "relax.nn.layer_norm":
        return False
    rank = len(static_shape(binding.var) or ())
    return bool(rank) and [int(a) % rank for a in binding.value.attrs.axes] == [rank - 1]


def _norms_before(bindings: list, users: dict, is_anchor: Callable[[relax.VarBinding], bool],
                  fuses_norm: Callable[[relax.VarBinding, relax.VarBinding], bool]) -> dict:
    """anchor var -> the layer norm over the last axis whose value only that anchor reads,
    as its first operand, where ``fuses_norm(anchor, norm)`` holds."""
    norms = {b.var: b for b in bindings if isinstance(b, relax.VarBinding) and _last_axis_norm(b)}
    found = {}
    for binding in bindings:
        if not isinstance(binding, relax.VarBinding) or not isinstance(binding.value, relax.Call) \
                or not binding.value.args:
            continue
        norm = norms.get(binding.value.args[0])
        if norm is None or len(users.get(norm.var, [])) != 1 \
                or any(a.same_as(norm.var) for a in binding.value.args[1:]):
            continue
        # The norm is an anchor too: lowered by its own strategy should the fused kernel fail.
        if is_anchor(norm) and is_anchor(binding) and fuses_norm(binding, norm):
            found[binding.var] = norm
    return found


def tail_pieces(partition: Partition) -> list[Partition]:
    """A partition with a block tail (:func:`_block_tail`) as its three convs' own partitions,
    one with a norm tail as its anchor's and the norm's (for lowering them one by one when
    the fused kernel cannot be built); ``[]`` for others."""
    if norm_of(partition) is not None:
        return [Partition(partition.anchor, list(partition.epilogue), list(partition.prologue)),
                Partition(partition.tail[0])]
    if norm_before(partition) is not None:
        return [Partition(norm_before(partition)), Partition(partition.anchor, list(partition.epilogue))]
    if not partition.tail or op_name(partition.tail[0].value) != "relax.nn.conv2d":
        return []
    depthwise, dw_epilogue, project, project_epilogue = split_block_tail(partition.tail)
    pieces = [Partition(partition.anchor, list(partition.epilogue), list(partition.prologue)),
              Partition(depthwise, dw_epilogue)]
    return pieces if project is None else [*pieces, Partition(project, project_epilogue)]


def _attention_tail(part: Partition, later: list, users: dict, taken: set) -> list[relax.VarBinding]:
    """``[softmax, *guard, matmul]`` if the partition's value is read only by a softmax over its
    last axis (and by the guard), whose result is read only by a matmul as its left operand
    with the same batch dims, or through a guard first (:func:`_softmax_guard`); and the
    transpose after the matmul, if it alone reads it and keeps the last axis last."""
    by_var = {b.var: b for b in later if isinstance(b, relax.VarBinding)}
    shape = static_shape(part.output)
    if shape is None or len(shape) < 3:
        return []
    readers = [by_var.get(u) for u in users.get(part.output, [])]
    softmaxes = [b for b in readers if b is not None and op_name(b.value) == "relax.nn.softmax"]
    if len(softmaxes) != 1 or int(softmaxes[0].value.attrs.axis) % len(shape) != len(shape) - 1:
        return []
    softmax = softmaxes[0]
    guard = _softmax_guard(part.output, softmax, by_var, users)
    reads_scores = 2 if guard and op_name(guard[0].value) == "relax.equal" else 1  # the softmax (and the guard)
    if guard is None or len(readers) != reads_scores:
        return []
    weights = guard[-1].var if guard else softmax.var
    readers = users.get(weights, [])
    if len(readers) != 1 or readers[0] not in by_var:
        return []
    matmul = by_var[readers[0]]
    call = matmul.value
    rhs = static_shape(call.args[1]) if op_name(call) == "relax.matmul" else None
    tail = [softmax, *guard, matmul]
    if (rhs is None or not call.args[0].same_as(weights) or len(rhs) != len(shape) or rhs[:-2] != shape[:-2]
            or rhs[-2] != shape[-1] or any(b.var in taken for b in tail)):
        return []
    # The heads put back (``[b, h, s, d] -> [b, s, h, d]``): the kernel writes its context so.
    readers = users.get(matmul.var, [])
    heads = by_var.get(readers[0]) if len(readers) == 1 else None
    if heads is not None and heads.var not in taken and op_name(heads.value) == "relax.permute_dims" \
            and heads.value.attrs.axes is not None and int(heads.value.attrs.axes[-1]) % len(shape) == len(shape) - 1:
        tail.append(heads)
    return tail


def _attention_views(part: Partition, bindings: list, users: dict, taken: set) -> list[relax.VarBinding]:
    """The views (:mod:`alt_tvm.strategies.views`) through which attention reads Q, K and V:
    every binding on the way back from an operand that only renames or scales elements and
    whose value only the partition reads, in program order. The kernel reads the tensors they
    start from (the projections' outputs) through them, and they run as no kernel of their own.
    """
    producers = {b.var: b for b in bindings if isinstance(b, relax.VarBinding)}
    found: dict = {}  # var -> its binding, for every view reached
    stack = list(attention_operands(part))
    while stack:
        var = stack.pop()
        binding = producers.get(var)
        if binding is None or var in found or var in taken or not isinstance(var, relax.DataflowVar):
            continue
        source = view_source(binding, producers)
        if source is None:
            continue
        found[var] = binding
        if isinstance(binding.value, relax.TupleGetItem):
            split = binding.value.tuple_value
            found[split] = producers[split]
        stack.append(source)
    members = {b.var for b in (part.anchor, *part.epilogue, *part.tail)}
    changed = True
    # Drop views whose value something outside the partition reads, the views before those,
    # and the parts of a split that is dropped.
    while changed:
        changed = False
        for var in list(found):
            value = found[var].value
            orphan = isinstance(value, relax.TupleGetItem) and value.tuple_value not in found
            if orphan or any(isinstance(u, str) or (u not in found and u not in members) for u in users.get(var, [])):
                del found[var]
                changed = True
    order = {b.var: i for i, b in enumerate(bindings)}
    return sorted(found.values(), key=lambda b: order[b.var])


def _softmax_guard(scores: relax.Var, softmax: relax.VarBinding, by_var: dict, users: dict) -> list | None:
    """The bindings with which PyTorch's attention zeroes the weights of a row that has no
    key (all scores ``-inf``, where softmax gives NaN), or ``[]`` when the softmax is used
    as it is, or None when it is used otherwise. Two spellings:

    * ``torch.onnx`` (dynamo): ``where(isnan(p), 0, p)``, which zeroes every NaN weight;
    * ``torch.export``: ``where(not(any(not(scores == -inf), axis=-1)), 0, p)``, which zeroes
      the rows whose scores are all ``-inf``.
    """
    readers = [by_var.get(u) for u in users.get(softmax.var, [])]
    if any(b is None for b in readers):
        return None
    names = sorted(op_name(b.value) for b in readers)
    if names == ["relax.matmul"]:
        return []
    if names == ["relax.isnan", "relax.where"]:
        isnan, where = sorted(readers, key=lambda b: op_name(b.value))
        if _zero_where(where, isnan.var, softmax.var) and users.get(isnan.var, []) == [where.var]:
            return [isnan, where]
        return None
    if names != ["relax.where"]:
        return None
    chain, current = [], scores
    for op in ("relax.equal", "relax.logical_not", "relax.astype", "relax.max", "relax.astype",
               "relax.logical_not"):
        following = [by_var.get(u) for u in users.get(current, [])]
        following = [b for b in following if b is not None and op_name(b.value) == op]
        if len(following) != 1 or (current is not scores and len(users.get(current, [])) != 1):
            return None
        chain.append(following[0])
        current = following[0].var
    equal, reduce = chain[0].value, chain[3].value
    rank = len(static_shape(scores))
    if (_scalar_value(equal.args[1]) != float("-inf") or [int(a) % rank for a in reduce.attrs.axis] != [rank - 1]
            or not _zero_where(readers[0], current, softmax.var)):
        return None
    return [*chain, readers[0]]


def _zero_where(where: relax.VarBinding, condition: relax.Var, value: relax.Var) -> bool:
    """Is ``where`` ``where(condition, 0, value)`` (0 a scalar or a tensor of zeros)?"""
    cond, zero, other = where.value.args
    data = const_value(zero)
    return cond.same_as(condition) and other.same_as(value) and data is not None and not data.any()


def _scalar_value(expr: relax.Expr) -> float | None:
    data = const_value(expr)
    return float(data.reshape(-1)[0]) if data is not None and data.size == 1 else None


def _trim(part: Partition, users: dict) -> None:
    """Drop epilogue ops from the end until only the last value is used outside the partition."""
    while part.epilogue:
        members = {b.var for b in part.bindings}
        leaking = [b.var for b in part.bindings[:-1]
                   if any(isinstance(u, str) or u not in members for u in users.get(b.var, []))]
        if not leaking:
            return
        part.epilogue.pop()


def _pad_producer(anchor: relax.VarBinding, earlier: list, users: dict) -> relax.VarBinding | None:
    """The producer of a convolution's input that can absorb a layout change, if only it reads it.

    A zero pad becomes the partition's pad stage, which writes the convolution's input
    layout directly (the paper's Fig. 5(b)); a transpose becomes a layout through which
    the partition reads the transpose's input. Either way: no separate kernel.
    """
    if not str(op_name(anchor.value)).startswith("relax.nn.conv") or not anchor.value.args:
        return None
    data = anchor.value.args[0]
    for binding in earlier:
        if binding.var.same_as(data):
            call = binding.value
            if op_name(call) == "relax.permute_dims" and len(users.get(binding.var, [])) == 1:
                return binding  # the transpose becomes the layout the conv reads its input in
            if (op_name(call) == "relax.nn.pad" and str(call.attrs.pad_mode) == "constant"
                    and float(call.attrs.pad_value) == 0.0 and len(users.get(binding.var, [])) == 1):
                widths = [int(w) for w in call.attrs.pad_width]
                if widths[:4] == [0, 0, 0, 0]:  # batch and channels unpadded
                    return binding
    return None


def _channel_scale(anchor: relax.VarBinding, earlier: list, users: dict) -> relax.VarBinding | None:
    """The ``multiply(x, s)`` feeding the 1x1 conv ``anchor``, with ``s`` of shape ``(1, C, 1, 1)``
    and batch 1, if only the conv reads it: a squeeze-excitation scaling (EfficientNet,
    MobileNetV3) that the conv computes by scaling its weights' input channels, ``C x O``
    products per call instead of a pass over the ``C x H x W`` map; taken only where that is
    fewer (``H x W > O``)."""
    if not _pointwise(anchor):
        return None
    out = static_shape(anchor.var)
    if out[2] * out[3] <= out[1]:
        return None
    data = anchor.value.args[0]
    shape = static_shape(data)
    for binding in earlier:
        if not binding.var.same_as(data):
            continue
        call = binding.value
        if op_name(call) != "relax.multiply" or len(users.get(binding.var, [])) != 1 or shape[0] != 1:
            return None
        shapes = [static_shape(a) for a in call.args]
        if sorted(shapes, key=str) == sorted([shape, (1, shape[1], 1, 1)], key=str) and shape != (1, shape[1], 1, 1):
            return binding
        return None
    return None


def op_info(binding: relax.VarBinding, target: HardwareTarget, *,
            options: Mapping[str, Any] | None = None) -> OpInfo:
    """What a strategy sees of one Relax call (:class:`~alt_tvm.strategies.base.OpInfo`)."""
    call = binding.value
    tensors = [a for a in call.args if static_shape(a) is not None]
    constants = {i: const_value(a) for i, a in enumerate(call.args) if const_value(a) is not None}
    return OpInfo(
        op=op_name(call), attrs=attrs_dict(call.attrs),
        input_shapes=tuple(static_shape(a) for a in tensors), input_dtypes=tuple(dtype_of(a) for a in tensors),
        output_shape=static_shape(binding.var) or (), output_dtype=dtype_of(binding.var) or "",
        target_kind=target.to_tvm().kind.name, constants=constants, target_name=target.name,
        options=dict(options or {}))


def strategy_named(binding: relax.VarBinding, name: str, target: HardwareTarget, *,
                   options: Mapping[str, Any] | None = None) -> tuple[Strategy | None, list[str]]:
    """The strategy ``name`` if it applies to ``binding`` (opt-in or not), else None and why not."""
    options = dict(options or {})
    return select(op_info(binding, target, options={**options, name: options.get(name, {})}), allowed=[name])


@dataclass
class PartitionPlan:
    """The partitions of a function and the strategy chosen for each (:func:`plan_partitions`)."""

    partitions: list[Partition]
    #: anchor var -> the strategy that lowers its partition
    strategies: dict = field(default_factory=dict)
    #: anchor op -> why no strategy took it (calls of ops some strategy registers for)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)
    #: workload key -> why the strategy ``chosen`` for it could not lower it
    refused: dict[str, str] = field(default_factory=dict)
    #: workload key -> the strategy ``chosen`` for it, where that replaced the priority rule
    overridden: dict[str, str] = field(default_factory=dict)

    def strategy_of(self, partition: Partition) -> Strategy:
        return self.strategies[partition.anchor.var]


def plan_partitions(func: relax.Function, *, target: HardwareTarget, variant: str = "alt",
                    allowed: Sequence[str] | None = None,
                    strategy_options: Mapping[str, Any] | None = None,
                    chosen: Mapping[str, str] | None = None) -> PartitionPlan:
    """Partition ``func`` and select a strategy for every partition: the one rule that the
    build and task extraction both apply, so a task is tuned for exactly the program the
    build makes.

    Parameters
    ----------
    func
        A Relax function after :func:`alt_tvm.graph.prepare.prepare`.
    target
        The hardware the partitions are lowered for.
    variant
        ``"alt-wp"`` partitions have no epilogue (ALT paper §7 ablation); the others do.
    allowed
        Strategy names the user restricted the build to (None: every non-opt-in strategy,
        and the opt-in ones given options).
    strategy_options
        Options per strategy name, handed to ``applicable`` through ``OpInfo.options``.
    chosen
        Workload key -> the strategy measured fastest for it in the model (a tuning log's
        decisions): it replaces the priority rule where it applies and the user allows it;
        where not, the reason is in ``refused``. Workload keys do not depend on the
        strategy, so the partitions are found again with the chosen strategies (which may
        absorb a pad producer or not).
    """
    options = dict(strategy_options or {})
    anchor_ops = strategy_ops()
    plan = PartitionPlan([])
    overrides: dict = {}  # anchor var -> the chosen strategy

    def is_anchor(binding: relax.VarBinding) -> bool:
        name = op_name(binding.value)
        if name not in anchor_ops:
            return False
        if binding.var in overrides:
            plan.strategies[binding.var] = overrides[binding.var]
            return True
        strategy, reasons = select(op_info(binding, target, options=options), allowed=allowed)
        if strategy is None:
            known = plan.fallbacks.setdefault(name, [])
            known.extend(r for r in reasons if r not in known)
            return False
        plan.strategies[binding.var] = strategy
        return True

    def partition() -> list[Partition]:
        return find_partitions(func, is_anchor=is_anchor, epilogues=variant != "alt-wp",
                               absorbs_pad=lambda b: plan.strategies[b.var].absorbs_pad,
                               fuses_attention=lambda b: plan.strategies[b.var].fuses_attention,
                               absorbs_scale=lambda b: plan.strategies[b.var].absorbs_scale,
                               fuses_block=lambda b, tail: plan.strategies[b.var].fuses_block(
                                   b, tail, target, options.get(plan.strategies[b.var].name)),
                               fuses_norm=lambda b, norm: plan.strategies[b.var].fuses_norm(
                                   b, norm, target, options.get(plan.strategies[b.var].name)))

    plan.partitions = partition()
    for part in plan.partitions if chosen else []:
        key = workload_key(part)
        name = chosen.get(key)
        if name is None or name == plan.strategy_of(part).name:
            continue
        if allowed is not None and name not in allowed:
            plan.refused[key] = f"the log chose strategy {name!r}, which this build excludes ({list(allowed)})"
            continue
        strategy, reasons = strategy_named(part.anchor, name, target, options=options)
        if strategy is None:
            plan.refused[key] = f"the log chose strategy {name!r}, which does not apply: {'; '.join(reasons)}"
            continue
        overrides[part.anchor.var] = strategy
        plan.overridden[key] = name
    if overrides:
        plan.partitions = partition()
    return plan
