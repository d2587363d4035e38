"""Fold an ONNX graph's shape computations to constants once its input shapes are static.

PyTorch's TorchScript exporter writes ``x.view(b, c, h, w)`` with ``b, c, h, w`` read at run
time (``Shape`` -> ``Gather`` -> ``Unsqueeze`` -> ``Concat`` -> ``Reshape``). TVM's ONNX importer
folds some of these chains but not all: where it cannot, a tensor leaves the importer without a
known shape and later ops fail (Swin's window partition, ShuffleNet's channel shuffle). With
every input shape fixed, such chains are plain constants. This pass finds them:

1. ONNX shape inference (with data propagation) gives the static shape of each tensor it can;
2. ``Shape`` and ``Size`` of a tensor of static shape become constants;
3. any deterministic node whose inputs are all constants is evaluated with ONNX's reference
   implementation (``onnx.reference``) and replaced by initializers;

repeated until nothing more folds, since each round's constants give shape inference more to
work with. Weights are never copied for shape inference (it sees only their types), and a node
whose result would be much larger than its inputs (``Expand``, ``ConstantOfShape``, ``Tile``)
is left to run, so the file does not grow.

Once pads are constants, :func:`merge_pads_into_convs` moves a zero ``Pad`` of the spatial
axes into the ``Conv`` that reads it (TensorFlow-style "same" padding, as Hugging Face's
MobileNets write it), as PyTorch's dynamo exporter already does: the two exports of one model
then reach TVM as one graph, and no padded copy of the activation is materialised.
:func:`resolve_conv_auto_pads` writes a ``Conv``'s ``auto_pad`` (the TorchScript exporter's
spelling of ``padding="same"``) as explicit ``pads``, the dynamo exporter's spelling, before
pads are merged. :func:`resolve_conv_transpose_output_shapes` writes a ``ConvTranspose``'s ``output_shape`` as
the ``pads`` and ``output_padding`` the ONNX operator definition derives from it (TVM's
importer ignores ``output_shape``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FoldResult", "fold_static_shapes", "merge_pads_into_convs", "resolve_conv_auto_pads",
           "resolve_conv_transpose_output_shapes"]

_LOG = logging.getLogger(__name__)

# Nodes whose value is not a function of their inputs, or that hold subgraphs.
_NOT_FOLDABLE = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
    "If", "Loop", "Scan", "SequenceMap",
})
# Initializers up to this many elements are shown to shape inference with their values, so
# that its data propagation can read small shape constants; larger ones only by their type.
_SMALL = 64
_MAX_ROUNDS = 64  # each round can unlock one more block of a deep model (Swin-T: about 20)


@dataclass(frozen=True)
class FoldResult:
    """The folded model and what was folded.

    Attributes
    ----------
    model : onnx.ModelProto
        The model with static input shapes and its constant subgraphs replaced by initializers.
    folded_nodes : int
        How many nodes were evaluated away.
    rounds : int
        Rounds of shape inference and folding that ran.
    """

    model: object
    folded_nodes: int
    rounds: int


def fold_static_shapes(model, *, input_shapes: Mapping[str, Sequence[int]],
                       max_growth_elements: int = 1 << 16) -> FoldResult:
    """Fix the inputs' shapes of ``model`` and fold its shape-computing subgraphs to constants.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; it is not modified.
    input_shapes : mapping of str to sequence of int
        The static shape of every graph input that is not an initializer.
    max_growth_elements : int
        A constant node is folded only if its outputs have at most
        ``max(max_growth_elements, elements of its inputs)`` elements.

    Returns
    -------
    FoldResult
    """
    import onnx

    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    graph = folded.graph
    for inp in graph.input:
        shape = input_shapes.get(inp.name)
        if shape is None:
            continue
        dims = inp.type.tensor_type.shape.dim
        for dim, value in zip(dims, shape):
            dim.Clear()
            dim.dim_value = int(value)
    total, rounds = 0, 0
    while rounds < _MAX_ROUNDS:
        rounds += 1
        count = _fold_round(folded, _static_shapes(folded), max_growth_elements)
        total += count
        if count == 0:
            break
    if total:
        _LOG.info("folded %d constant nodes of the ONNX graph in %d rounds", total, rounds)
    return FoldResult(folded, total, rounds)


def _static_shapes(model) -> dict[str, tuple[int, ...]]:
    """Static shapes ONNX shape inference finds, run on a copy that carries no large weights."""
    import onnx
    from onnx import helper, shape_inference

    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    keep, moved = [], []
    for tensor in graph.initializer:
        if int(np.prod(tensor.dims, dtype=np.int64)) <= _SMALL:
            keep.append(tensor)
        else:
            moved.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del graph.initializer[:]
    graph.initializer.extend(keep)
    listed = {i.name for i in graph.input}
    graph.input.extend(v for v in moved if v.name not in listed)
    try:
        inferred = shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception as err:  # noqa: BLE001 - inference is a help: without it only Shape-of-input folds
        _LOG.debug("ONNX shape inference failed (%s); folding with the declared shapes", err)
        inferred = skeleton
    out = {}
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
            continue
        dims = info.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[info.name] = tuple(int(d.dim_value) for d in dims)
    for tensor in model.graph.initializer:
        out[tensor.name] = tuple(int(d) for d in tensor.dims)
    return out


def _fold_round(model, shapes: Mapping[str, tuple[int, ...]], max_growth: int) -> int:
    """Fold what can be folded with ``shapes``; rewrite ``model`` in place; the count folded."""
    from onnx import numpy_helper

    graph = model.graph
    opsets = {o.domain: o.version for o in model.opset_import}
    initializers = {t.name: t for t in graph.initializer}
    values: dict[str, np.ndarray] = {}

    def constant(name: str) -> np.ndarray | None:
        if name in values:
            return values[name]
        if name in initializers:
            values[name] = numpy_helper.to_array(initializers[name])
            return values[name]
        return None

    graph_outputs = {o.name for o in graph.output}
    kept, folded = [], 0
    for node in graph.node:
        results = None
        if node.domain in ("", "ai.onnx") and not set(node.output) & graph_outputs:
            results = _evaluate(node, constant, shapes, opsets, max_growth)
        if results is None:
            kept.append(node)
            continue
        folded += 1
        values.update(zip(node.output, results))
    if not folded:
        return 0
    used = {name for node in kept for name in node.input} | graph_outputs
    new_initializers = [numpy_helper.from_array(np.asarray(values[name]), name)
                        for name in values if name not in initializers and name in used]
    remaining = [t for t in graph.initializer if t.name in used]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend([*remaining, *new_initializers])
    # Old exporters also list initializers as graph inputs; drop the ones no longer used.
    listed = [i for i in graph.input if i.name not in initializers or i.name in used]
    del graph.input[:]
    graph.input.extend(listed)
    return folded


def _evaluate(node, constant, shapes, opsets, max_growth) -> list[np.ndarray] | None:
    """``node``'s outputs if they are constants under ``shapes``; None otherwise."""
    if node.op_type in ("Shape", "Size"):
        shape = shapes.get(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return [np.array(shape[start:end], dtype=np.int64)]
    if node.op_type in _NOT_FOLDABLE or any(a.g.node or a.graphs for a in node.attribute):
        return None
    if (not node.input and node.op_type != "Constant") or not all(node.output):
        return None
    inputs = [constant(name) if name else None for name in node.input]
    if any(x is None for name, x in zip(node.input, inputs) if name):
        return None
    try:
        outputs = _run_node(node, inputs, opsets)
    except Exception as err:  # noqa: BLE001 - an op the reference cannot run is left to TVM
        _LOG.debug("not folding %s %r: %s", node.op_type, node.name, err)
        return None
    limit = max(max_growth, sum(int(x.size) for x in inputs if x is not None))
    if sum(int(np.asarray(x).size) for x in outputs) > limit:
        return None
    return [np.asarray(x) for x in outputs]


def _run_node(node, inputs: list[np.ndarray | None], opsets: Mapping[str, int]) -> list[np.ndarray]:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    feeds = {name: x for name, x in zip(node.input, inputs) if name}
    graph = helper.make_graph(
        [node], "fold",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for name, x in feeds.items()],
        [helper.make_empty_tensor_value_info(name) for name in node.output if name],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    return list(ReferenceEvaluator(model).run(None, feeds))


def merge_pads_into_convs(model) -> int:
    """Merge each zero, spatial-only, constant ``Pad`` into the ``Conv`` that alone reads it.

    Parameters
    ----------
    model : onnx.ModelProto
        Rewritten in place.

    Returns
    -------
    int
        The number of pads merged.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer
                    if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    merged, dropped = 0, set()
    for pad in graph.node:
        users = readers.get(pad.output[0], []) if pad.op_type == "Pad" and pad.domain in ("", "ai.onnx") else []
        if len(users) != 1 or users[0].op_type != "Conv" or pad.output[0] in graph_outputs:
            continue
        conv = users[0]
        if conv.input[0] != pad.output[0] or pad.output[0] in conv.input[1:]:
            continue
        amounts = _spatial_zero_pads(pad, initializers)
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        if amounts is None or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        before, after = amounts
        old = list(attrs.get("pads", [0] * (2 * len(before))))
        if len(old) != 2 * len(before):
            continue
        new = [o + p for o, p in zip(old, [*before, *after])]
        kept = [a for a in conv.attribute if a.name != "pads"]
        del conv.attribute[:]
        conv.attribute.extend([*kept, helper.make_attribute("pads", new)])
        conv.input[0] = pad.input[0]
        dropped.add(id(pad))
        merged += 1
    if merged:
        kept_nodes = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(kept_nodes)
    return merged


def _spatial_zero_pads(pad, constants) -> tuple[list[int], list[int]] | None:
    """The spatial ``(before, after)`` amounts of a zero constant-mode ``Pad``, or None."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in pad.attribute}
    if attrs.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    if "pads" in attrs:  # opset < 11
        pads, value = list(attrs["pads"]), float(attrs.get("value", 0.0))
        axes = None
    else:
        inputs = list(pad.input) + [""] * (4 - len(pad.input))
        if inputs[1] not in constants or (inputs[2] and inputs[2] not in constants):
            return None
        pads = [int(v) for v in constants[inputs[1]].reshape(-1)]
        value = float(constants[inputs[2]].reshape(-1)[0]) if inputs[2] and constants[inputs[2]].size else 0.0
        if inputs[3] and inputs[3] not in constants:
            return None
        axes = [int(v) for v in constants[inputs[3]].reshape(-1)] if inputs[3] else None
    if value != 0.0 or len(pads) % 2 or any(p < 0 for p in pads):
        return None
    count = len(pads) // 2
    axes = list(range(count)) if axes is None else axes
    if any(a < 0 for a in axes):  # negative axes need the rank; rare, left alone
        return None
    rank = max(max(axes) + 1, count)
    before, after = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        before[axis], after[axis] = pads[i], pads[count + i]
    if rank < 3 or before[0] or before[1] or after[0] or after[1]:
        return None  # batch or channel padding is not a convolution's padding
    return before[2:], after[2:]


def _window(attrs: Mapping, data: tuple[int, ...], weight: tuple[int, ...]) -> tuple[int, list, list, list]:
    """A (transposed) convolution's spatial rank, kernel, strides and dilations, defaults filled in."""
    rank = len(data) - 2
    return (rank, list(attrs.get("kernel_shape", weight[2:])), list(attrs.get("strides", [1] * rank)),
            list(attrs.get("dilations", [1] * rank)))


def _nodes_with(model, op_type: str, attribute_test) -> list:
    """The default-domain ``op_type`` nodes with an attribute passing ``attribute_test``."""
    return [n for n in model.graph.node if n.op_type == op_type and n.domain in ("", "ai.onnx")
            and any(attribute_test(a) for a in n.attribute)]


def _replace_attributes(node, dropped: tuple[str, ...], **new) -> None:
    """Drop ``node``'s attributes named in ``dropped`` and add ``new`` ones."""
    from onnx import helper

    kept = [a for a in node.attribute if a.name not in dropped]
    del node.attribute[:]
    node.attribute.extend([*kept, *(helper.make_attribute(name, value) for name, value in new.items())])


def resolve_conv_auto_pads(model) -> int:
    """Replace each ``Conv``'s ``auto_pad`` (``SAME_UPPER``, ``SAME_LOWER``, ``VALID``) by ``pads``.

    ONNX's definition: with ``SAME_*`` the output has ``ceil(in / stride)`` elements and the
    total padding ``max((out - 1) * stride + (kernel - 1) * dilation + 1 - in, 0)`` is split in
    half, the odd element at the end (``SAME_UPPER``) or the start (``SAME_LOWER``); ``VALID``
    pads nothing. Nodes whose input shape is unknown are left as they are.

    Parameters
    ----------
    model : onnx.ModelProto
        With static input shapes; rewritten in place.

    Returns
    -------
    int
        The number of nodes rewritten.
    """
    from onnx import helper

    nodes = _nodes_with(model, "Conv", lambda a: a.name == "auto_pad"
                        and helper.get_attribute_value(a) not in (b"NOTSET", "NOTSET"))
    if not nodes:
        return 0
    shapes = _static_shapes(model)
    rewritten = 0
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        data, weight = shapes.get(node.input[0]), shapes.get(node.input[1])
        if data is None or weight is None:
            continue
        rank, kernel, strides, dilations = _window(attrs, data, weight)
        mode = attrs["auto_pad"].decode() if isinstance(attrs["auto_pad"], bytes) else attrs["auto_pad"]
        before, after = [0] * rank, [0] * rank
        if mode != "VALID":
            for i in range(rank):
                out = -(-data[i + 2] // strides[i])
                total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - data[i + 2], 0)
                small, large = total // 2, total - total // 2
                before[i], after[i] = (small, large) if mode == "SAME_UPPER" else (large, small)
        _replace_attributes(node, ("auto_pad", "pads"), pads=[*before, *after])
        rewritten += 1
    return rewritten


def resolve_conv_transpose_output_shapes(model) -> int:
    """Replace each ``ConvTranspose``'s ``output_shape`` by its ``pads`` and ``output_padding``.

    The padding follows the ONNX operator definition: ``total = stride * (in - 1) +
    output_padding + (kernel - 1) * dilation + 1 - out``, split in half (the odd element at the
    start, or at the end with ``auto_pad="SAME_UPPER"``); a negative padding at the end is an
    ``output_padding``. Nodes that also give ``pads`` are left as they are (the reference
    implementation then ignores ``output_shape``, and so does TVM).

    Parameters
    ----------
    model : onnx.ModelProto
        With static input shapes; rewritten in place.

    Returns
    -------
    int
        The number of nodes rewritten.

    Raises
    ------
    ValueError
        A node whose input or weight shape is unknown, or whose ``output_shape`` would need a
        negative padding at the start of an axis (an output row no input reaches): TVM would
        ignore ``output_shape`` and give another shape.
    """
    from onnx import helper

    nodes = _nodes_with(model, "ConvTranspose", lambda a: a.name == "output_shape")
    if not nodes:
        return 0
    shapes = _static_shapes(model)
    rewritten = 0
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        data, weight = shapes.get(node.input[0]), shapes.get(node.input[1])
        if "pads" in attrs:
            continue
        if data is None or weight is None:
            raise ValueError(f"ConvTranspose {node.name!r}: output_shape needs the static shapes of "
                             f"{node.input[0]!r} and {node.input[1]!r}, which shape inference did not find")
        rank, kernel, strides, dilations = _window(attrs, data, weight)
        out = list(attrs["output_shape"])[-rank:]
        extra = list(attrs.get("output_padding", [0] * rank))
        upper = attrs.get("auto_pad", b"NOTSET") in (b"SAME_UPPER", "SAME_UPPER")
        before, after = [], []
        for i in range(rank):
            total = strides[i] * (data[i + 2] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 - out[i]
            small, large = total // 2, total - total // 2
            start, end = (small, large) if upper else (large, small)
            if end < 0:  # the output is longer than the padding-free result: pad the end
                extra[i] -= end
                end = 0
            before.append(start)
            after.append(end)
        if any(p < 0 for p in before):
            raise ValueError(f"ConvTranspose {node.name!r}: output_shape {list(attrs['output_shape'])} with "
                             f"auto_pad {attrs.get('auto_pad', b'NOTSET').decode()} needs the padding {before} at "
                             "the start of the spatial axes; only non-negative start padding is supported")
        _replace_attributes(node, ("output_shape", "auto_pad", "output_padding"), pads=[*before, *after],
                            output_padding=extra)
        rewritten += 1
    return rewritten
