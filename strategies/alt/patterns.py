"""The fusions the ``alt`` family lowers with a partition's anchor (:mod:`alt_tvm.strategies.pattern`).

Each pattern is declared once here, by its shape (what it matches, its workload-key part,
its pieces); each strategy lists the ones it lowers with its own check
(:meth:`~alt_tvm.strategies.pattern.FusionPattern.where`):

* :data:`ABSORBED_INPUT`: a zero pad or a transpose feeding a conv, written or read in the
  conv's input layout (the paper's Fig. 5(b));
* :data:`CHANNEL_SCALE`: a squeeze-excitation scale feeding a 1x1 conv, folded into its weights;
* :data:`BLOCK`: an inverted-residual block's depthwise and 1x1 convs after a conv;
* :data:`ATTENTION`: attention's softmax and product with ``V`` after the scores' matmul, read
  through views of the projections;
* :data:`NORM_BEFORE` / :data:`NORM_AFTER`: a layer norm over the last axis before or after a GEMM.

The parsers of these parts (:func:`split_block_tail`, :func:`split_attention_tail`,
:func:`norm_of`, ...) are the one place that reads their structure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tvm import relax

from alt_tvm.strategies.base import Partition, attrs_dict, const_value, dtype_of, op_name, static_shape
from alt_tvm.strategies.pattern import FusionPattern, MatchContext
from alt_tvm.strategies.views import view_source

__all__ = [
    "ABSORBED_INPUT", "ATTENTION", "BLOCK", "CHANNEL_SCALE", "CONV_OPS", "NORM_AFTER", "NORM_BEFORE",
    "attention_operands", "block_output_conv", "norm_before", "norm_of", "split_attention_tail",
    "split_block_tail",
]

#: Every Relax convolution (the ops a pad or transpose producer is absorbed into).
CONV_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv1d_transpose",
            "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose")


def _is(partition: Partition, pattern: FusionPattern) -> bool:
    return partition.pattern is not None and partition.pattern.name == pattern.name


def _attrs_key(binding: relax.VarBinding) -> str:
    return json.dumps(attrs_dict(binding.value.attrs), sort_keys=True, separators=(",", ":"), default=str)


# --------------------------------------------------------------------------------------
# A producer the conv absorbs: a zero pad or a transpose.
# --------------------------------------------------------------------------------------

def _absorbed_input(partition: Partition, context: MatchContext) -> list | None:
    """The producer of a convolution's input that can absorb a layout change, if only it reads it.

    A zero pad becomes the partition's pad stage, which writes the convolution's input
    layout directly (the paper's Fig. 5(b)); a transpose becomes a layout through which
    the partition reads the transpose's input. Either way: no separate kernel.
    """
    anchor = partition.anchor
    if not anchor.value.args:
        return None
    binding = context.producers.get(anchor.value.args[0])
    if binding is None:
        return None
    call = binding.value
    if op_name(call) == "relax.permute_dims" and len(context.users.get(binding.var, [])) == 1:
        return [binding]  # the transpose becomes the layout the conv reads its input in
    if (op_name(call) == "relax.nn.pad" and str(call.attrs.pad_mode) == "constant"
            and float(call.attrs.pad_value) == 0.0 and len(context.users.get(binding.var, [])) == 1):
        widths = [int(w) for w in call.attrs.pad_width]
        if widths[:4] == [0, 0, 0, 0]:  # batch and channels unpadded
            return [binding]
    return None


ABSORBED_INPUT = FusionPattern(name="alt.absorbed_input", anchor=CONV_OPS, prologue=_absorbed_input, absorbs=True)


# --------------------------------------------------------------------------------------
# A squeeze-excitation scale folded into a 1x1 conv's weights.
# --------------------------------------------------------------------------------------

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


def _channel_scale(partition: Partition, context: MatchContext) -> list | None:
    """The ``multiply(x, s)`` feeding the 1x1 conv anchor, with ``s`` of shape ``(1, C, 1, 1)``
    and batch 1, if only the conv reads it: a squeeze-excitation scaling (EfficientNet,
    MobileNetV3) that the conv computes by scaling its weights' input channels, ``C x O``
    products per call instead of a pass over the ``C x H x W`` map; taken only where that is
    fewer (``H x W > O``)."""
    anchor = partition.anchor
    if not _pointwise(anchor):
        return None
    out = static_shape(anchor.var)
    if out[2] * out[3] <= out[1]:
        return None
    data = anchor.value.args[0]
    shape = static_shape(data)
    binding = context.producers.get(data)
    if binding is None:
        return None
    call = binding.value
    if op_name(call) != "relax.multiply" or len(context.users.get(binding.var, [])) != 1 or shape[0] != 1:
        return None
    shapes = [static_shape(a) for a in call.args]
    if sorted(shapes, key=str) == sorted([shape, (1, shape[1], 1, 1)], key=str) and shape != (1, shape[1], 1, 1):
        return [binding]
    return None


CHANNEL_SCALE = FusionPattern(name="alt.channel_scale", anchor=("relax.nn.conv2d",), prologue=_channel_scale,
                              key=lambda partition: "|prologue=multiply", absorbs=True)


# --------------------------------------------------------------------------------------
# An inverted-residual block: conv -> depthwise -> 1x1 conv.
# --------------------------------------------------------------------------------------

def _block_tail(partition: Partition, context: MatchContext) -> list:
    """``[depthwise, *its epilogue, 1x1 conv, *its epilogue]`` when the conv ``partition``'s
    value is read only by a depthwise conv2d whose value is read only by a 1x1 conv2d: the
    expand -> depthwise -> project chain of an inverted-residual block (MobileNetV2 §3.3), or a
    network's first conv -> depthwise -> pointwise (MobileNet-V2's and MNASNet's stem and first
    block), where the anchor is a dense conv of any kernel. ``[depthwise, *its epilogue]`` when
    the depthwise map has other readers (EfficientNet's squeeze-excitation blocks); else ``[]``."""
    if not _dense(partition.anchor):
        return []
    later = context.later
    by_var = {b.var: b for b in later if isinstance(b, relax.VarBinding)}

    def only_reader(value: relax.Var) -> relax.VarBinding | None:
        readers = context.users.get(value, [])
        return by_var.get(readers[0]) if len(readers) == 1 else None

    depthwise = only_reader(partition.output)
    attrs = _conv2d_attrs(depthwise)
    channels = static_shape(partition.anchor.var)[1]
    if (attrs is None or int(attrs.get("groups", 1)) != channels
            or not depthwise.value.args[0].same_as(partition.output) or static_shape(depthwise.var)[1] != channels):
        return []
    dw_epilogue = context.epilogue(depthwise, later[later.index(depthwise) + 1:])
    dw_value = (dw_epilogue[-1] if dw_epilogue else depthwise).var
    project = only_reader(dw_value)
    if not _pointwise(project) or not project.value.args[0].same_as(dw_value):
        # The depthwise map is read by more than a 1x1 conv (a squeeze-excitation's mean and
        # scale): the tail ends there, and the fused kernel writes that map.
        tail = [depthwise, *dw_epilogue]
    else:
        project_epilogue = context.epilogue(project, later[later.index(project) + 1:])
        tail = [depthwise, *dw_epilogue, project, *project_epilogue]
    return [] if any(b.var in context.taken for b in tail) else tail


def split_block_tail(tail: Sequence[relax.VarBinding]) -> tuple[relax.VarBinding, list, relax.VarBinding | None,
                                                                   list]:
    """``(depthwise, its epilogue, project, its epilogue)`` of a :data:`BLOCK` tail, with
    ``project`` None and ``[]`` for a tail that ends at the depthwise conv."""
    convs = [i for i, b in enumerate(tail) if op_name(b.value) == "relax.nn.conv2d"]
    if len(convs) not in (1, 2) or convs[0] != 0:
        raise ValueError(f"a block tail is [depthwise, *epilogue, (conv1x1, *epilogue)], got "
                         f"{[op_name(b.value) for b in tail]}")
    if len(convs) == 1:
        return tail[0], list(tail[1:]), None, []
    k = convs[1]
    return tail[0], list(tail[1:k]), tail[k], list(tail[k + 1:])


def block_output_conv(tail: Sequence[relax.VarBinding]) -> relax.VarBinding:
    """The conv whose map a fused block writes: the project conv, or the depthwise conv of a
    tail that ends there (:func:`split_block_tail`)."""
    depthwise, _, project, _ = split_block_tail(tail)
    return depthwise if project is None else project


def _block_key(partition: Partition) -> str:
    """Every op of the tail, and each conv's weight shape and attributes."""
    parts = []
    for binding in partition.tail:
        call = binding.value
        name = str(call.op.name).removeprefix("relax.")
        if name.startswith("nn.conv"):
            name = f"{name}:{static_shape(call.args[1])}:{_attrs_key(binding)}"
        parts.append(name)
    return f"|then={'+'.join(parts)}:out={static_shape(partition.output)}"


def _block_pieces(partition: Partition) -> list[Partition]:
    """The three convs' (or two, for a tail ending at the depthwise conv) own partitions."""
    depthwise, dw_epilogue, project, project_epilogue = split_block_tail(partition.tail)
    pieces = [Partition(partition.anchor, list(partition.epilogue), list(partition.prologue)),
              Partition(depthwise, dw_epilogue)]
    return pieces if project is None else [*pieces, Partition(project, project_epilogue)]


BLOCK = FusionPattern(name="alt.block", anchor=("relax.nn.conv2d",), tail=_block_tail, key=_block_key,
                      pieces=_block_pieces)


# --------------------------------------------------------------------------------------
# Attention: scores -> softmax -> product with V (-> heads put back), read through views.
# --------------------------------------------------------------------------------------

def _attention_tail(partition: Partition, context: MatchContext) -> list:
    """``[softmax, *guard, matmul]`` if the partition's value is read only by a softmax over its
    last axis (and by the guard), whose result is read only by a matmul as its left operand
    with the same batch dims, or through a guard first (:func:`_softmax_guard`); and the
    transpose after the matmul, if it alone reads it and keeps the last axis last."""
    users, taken = context.users, context.taken
    by_var = {b.var: b for b in context.later if isinstance(b, relax.VarBinding)}
    shape = static_shape(partition.output)
    if shape is None or len(shape) < 3:
        return []
    readers = [by_var.get(u) for u in users.get(partition.output, [])]
    softmaxes = [b for b in readers if b is not None and op_name(b.value) == "relax.nn.softmax"]
    if len(softmaxes) != 1 or int(softmaxes[0].value.attrs.axis) % len(shape) != len(shape) - 1:
        return []
    softmax = softmaxes[0]
    guard = _softmax_guard(partition.output, softmax, by_var, users)
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


def _attention_views(partition: Partition, context: MatchContext) -> list:
    """The views (:mod:`alt_tvm.strategies.views`) through which attention reads Q, K and V:
    every binding on the way back from an operand that only renames or scales elements and
    whose value only the partition reads, in program order. The kernel reads the tensors they
    start from (the projections' outputs) through them, and they run as no kernel of their own.
    """
    bindings, users, taken = context.bindings, context.users, context.taken
    producers = context.producers
    found: dict = {}  # var -> its binding, for every view reached
    stack = list(attention_operands(partition))
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
    members = {b.var for b in (partition.anchor, *partition.epilogue, *partition.tail)}
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


def split_attention_tail(tail: Sequence[relax.VarBinding]) -> tuple[relax.VarBinding, list, relax.VarBinding,
                                                                       relax.VarBinding | None]:
    """``(softmax, guard, product, heads)`` of an :data:`ATTENTION` tail: the softmax, the
    bindings guarding rows without a key, the product with ``V``, and the transpose that puts
    the heads back (None when the partition ends at the product)."""
    heads = tail[-1] if op_name(tail[-1].value) == "relax.permute_dims" else None
    body = list(tail[:-1]) if heads is not None else list(tail)
    if len(body) < 2 or op_name(body[0].value) != "relax.nn.softmax" or op_name(body[-1].value) != "relax.matmul":
        raise ValueError(f"an attention tail is [softmax, *guard, matmul, (permute_dims)], got "
                         f"{[op_name(b.value) for b in tail]}")
    return body[0], body[1:-1], body[-1], heads


def attention_operands(partition: Partition) -> tuple[relax.Expr, relax.Expr, relax.Expr]:
    """``(Q, K^T, V)`` as an attention partition's anchor and product read them."""
    return (partition.anchor.value.args[0], partition.anchor.value.args[1],
            split_attention_tail(partition.tail)[2].value.args[1])


def _attention_key(partition: Partition) -> str:
    """The tail's ops (the heads' transpose with its axes) and ``V``'s shape and dtype; and
    ``|prologue=view`` where the operands are read through views."""
    _, _, product, heads = split_attention_tail(partition.tail)
    ops = "+".join(str(b.value.op.name).removeprefix("relax.") for b in partition.tail if b is not heads)
    if heads is not None:
        ops += f"+permute_dims({','.join(str(int(a)) for a in heads.value.attrs.axes)})"
    rhs = product.value.args[1]
    return f"|then={ops}:{static_shape(rhs)}:{dtype_of(rhs)}" + ("|prologue=view" if partition.prologue else "")


ATTENTION = FusionPattern(name="alt.attention", anchor=("relax.matmul",), tail=_attention_tail,
                          prologue=_attention_views, key=_attention_key)


# --------------------------------------------------------------------------------------
# A layer norm over the last axis before (pre-norm) or after (post-norm) a GEMM.
# --------------------------------------------------------------------------------------

def _last_axis_norm(binding: relax.VarBinding | None) -> bool:
    """Is ``binding`` a layer norm over its value's last axis alone?"""
    if binding is None or op_name(binding.value) != "relax.nn.layer_norm":
        return False
    rank = len(static_shape(binding.var) or ())
    return bool(rank) and [int(a) % rank for a in binding.value.attrs.axes] == [rank - 1]


def _norm_before(partition: Partition, context: MatchContext) -> list | None:
    """The layer norm over the last axis whose value only the anchor reads, as its first
    operand. The norm is an anchor too: lowered by its own strategy should the fused kernel fail."""
    binding = partition.anchor
    if not isinstance(binding.value, relax.Call) or not binding.value.args:
        return None
    norm = context.producers.get(binding.value.args[0])
    if not _last_axis_norm(norm) or len(context.users.get(norm.var, [])) != 1 \
            or any(a.same_as(norm.var) for a in binding.value.args[1:]):
        return None
    return [norm] if context.is_anchor(norm) else None


def _norm_after(partition: Partition, context: MatchContext) -> list:
    """The layer norm over the last axis that alone reads the partition's value, else ``[]``."""
    readers = context.users.get(partition.output, [])
    if len(readers) != 1:
        return []
    norm = {b.var: b for b in context.later if isinstance(b, relax.VarBinding)}.get(readers[0])
    if norm is None or norm.var in context.taken or not _last_axis_norm(norm) \
            or not norm.value.args[0].same_as(partition.output):
        return []
    return [norm]


def norm_of(partition: Partition) -> relax.VarBinding | None:
    """The layer norm a :data:`NORM_AFTER` partition's tail is, else None."""
    return partition.tail[0] if _is(partition, NORM_AFTER) else None


def norm_before(partition: Partition) -> relax.VarBinding | None:
    """The layer norm a :data:`NORM_BEFORE` partition's anchor reads first, else None."""
    return partition.prologue[0] if _is(partition, NORM_BEFORE) else None


NORM_BEFORE = FusionPattern(
    name="alt.norm_before", anchor=("relax.matmul",), prologue=_norm_before, claims_anchor=True,
    key=lambda partition: f"|prologue=nn.layer_norm:{_attrs_key(partition.prologue[0])}",
    pieces=lambda partition: [Partition(partition.prologue[0]), Partition(partition.anchor, list(partition.epilogue))])
NORM_AFTER = FusionPattern(
    name="alt.norm_after", anchor=("relax.matmul",), tail=_norm_after,
    key=lambda partition: f"|then=nn.layer_norm:{_attrs_key(partition.tail[0])}",
    pieces=lambda partition: [Partition(partition.anchor, list(partition.epilogue), list(partition.prologue)),
                              Partition(partition.tail[0])])
