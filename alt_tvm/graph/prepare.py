"""Inference simplifications run before partitioning (:func:`prepare`).

They expose weights and epilogues to the partitioner: importer-emitted TE calls become Relax
ops again, training-mode batch norms get their batch statistics, and an inference batch norm
with constant statistics becomes one per-channel multiply and add whose factors are computed
here in float64, rather than Relax's four-op decomposition folded op by op; a split of a
feature map along its channels becomes one slice per part.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from alt_tvm.strategies.base import dtype_of, op_name, static_shape
from alt_tvm.strategies.constants import const_value
from alt_tvm.strategies.views import split_starts

from .canonical import canonicalize
from .reorder import reorder

#: PrimFuncs that TVM's importers emit directly (``bb.emit_te(topi.maximum, ...)`` for ONNX
#: Clip) and the Relax op with the same broadcasting semantics.
_LIFTABLE_TE = {"maximum": relax.op.maximum, "minimum": relax.op.minimum}


@relax.expr_functor.mutator
class _LiftTECalls(relax.PyExprMutator):
    """Turn importer-emitted ``call_tir(maximum|minimum, (x, c))`` back into Relax ops,
    so that, e.g., ONNX's Clip (ReLU6) joins its convolution's epilogue."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.call_tir":
            return call
        name = call.args[0].name_hint.rstrip("0123456789").rstrip("_")
        args = call.args[1]
        if name in _LIFTABLE_TE and isinstance(args, relax.Tuple) and len(args.fields) == 2:
            return _LIFTABLE_TE[name](*args.fields)
        return call


@relax.expr_functor.mutator
class _TrainingBatchNorms(relax.PyExprMutator):
    """Give every training-mode batch norm (ONNX ``training_mode=1``) its batch statistics.

    ``DecomposeOpsForInference`` decomposes every batch norm with its running statistics,
    whatever its ``training`` attribute says, which makes such a batch norm silently wrong.
    Here it becomes an inference batch norm over the batch's mean and (biased) variance,
    returning the running statistics updated as Relax's legalization does:
    ``(1 - momentum) * running + momentum * batch``.
    """

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.batch_norm" or not bool(call.attrs.training):
            return call
        data, gamma, beta, running_mean, running_var = call.args
        attrs, shape = call.attrs, static_shape(data)
        if shape is None:
            raise ValueError(f"a training-mode batch norm needs data of known rank, got {data.ty} in {call}")
        axis = int(attrs.axis) % len(shape)
        axes = [a for a in range(len(shape)) if a != axis]
        emit = self.builder_.emit
        mean = emit(relax.op.mean(data, axes))
        var = emit(relax.op.variance(data, axes))
        normed = emit(relax.op.nn.batch_norm(data, gamma, beta, mean, var, axis, float(attrs.epsilon),
                                             bool(attrs.center), bool(attrs.scale), training=False))
        momentum, dtype = float(attrs.momentum), dtype_of(running_mean)

        def update(running: relax.Expr, batch: relax.Expr) -> relax.Expr:
            kept = emit(relax.op.multiply(running, relax.const(1.0 - momentum, dtype)))
            return emit(relax.op.add(kept, emit(relax.op.multiply(batch, relax.const(momentum, dtype)))))

        return relax.Tuple([relax.TupleGetItem(normed, 0), update(running_mean, mean), update(running_var, var)])


@relax.expr_functor.mutator
class _ConstantBatchNorms(relax.PyExprMutator):
    """An inference batch norm whose parameters are constants as ``x * scale + shift``.

    ``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale`` are computed in
    float64 and rounded once (ONNX Runtime folds batch norm the same way). Relax's
    ``DecomposeOpsForInference`` writes ``(x - mean) / sqrt(var + eps) * gamma + beta``
    instead: four element-wise passes where the batch norm cannot fold into a convolution
    (DenseNet's pre-activation batch norms), and one constant-folding compile per op.
    """

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.batch_norm" or bool(call.attrs.training):
            return call
        data, *params = call.args
        shape = static_shape(data)
        values = [const_value(p) for p in params]
        if shape is None or any(v is None for v in values):
            return call
        gamma, beta, mean, var = (v.astype(np.float64) for v in values)
        attrs, dtype = call.attrs, dtype_of(data)
        scale = 1.0 / np.sqrt(var + float(attrs.epsilon))
        if bool(attrs.scale):
            scale = gamma * scale
        shift = -mean * scale
        if bool(attrs.center):
            shift = beta + shift
        axis = int(attrs.axis) % len(shape)
        broadcast = [1] * len(shape)
        broadcast[axis] = shape[axis]

        def constant(values: np.ndarray) -> relax.Constant:
            return relax.const(values.reshape(broadcast).astype(dtype))

        scaled = self.builder_.emit(relax.op.multiply(data, constant(scale)))
        out = self.builder_.emit(relax.op.add(scaled, constant(shift)))
        # The statistics pass through unchanged, as in inference mode.
        return relax.Tuple([out, params[2], params[3]])


@relax.expr_functor.mutator
class _SingleConcats(relax.PyExprMutator):
    """A concatenation of one tensor (DenseNet's first in each dense block) is that tensor."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) == "relax.concat" and isinstance(call.args[0], relax.Tuple) \
                and len(call.args[0].fields) == 1:
            return call.args[0].fields[0]
        return call


@relax.expr_functor.mutator
class _ChannelSplits(relax.PyExprMutator):
    """Each part of a feature map's split along channels becomes a strided slice of the map.

    (``torch.chunk`` in ShuffleNet-V2 exports as ONNX Split from the dynamo exporter, as
    Slice ops from TorchScript.) A slice is one op per part, computed in the tiles its
    producer wrote; a split's tuple has no layout, so the map would be converted to row-major
    in front of it.
    """

    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        op = super().visit_tuple_getitem_(op)
        split = self.lookup_binding(op.tuple_value) if isinstance(op.tuple_value, relax.Var) else None
        if split is None or op_name(split) != "relax.split":
            return op
        shape = static_shape(split.args[0])
        if shape is None or len(shape) < 3 or int(split.attrs.axis) % len(shape) != 1:
            return op
        starts = split_starts(split, shape[1])
        part = int(op.index)
        end = starts[part + 1] if part + 1 < len(starts) else shape[1]
        return relax.op.strided_slice(split.args[0], axes=[1], begin=[starts[part]], end=[end])


def prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """Inference simplifications that expose weights and epilogues to the partitioner."""
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = _LiftTECalls(mod).visit_expr(mod["main"])
    mod["main"] = _TrainingBatchNorms(mod).visit_expr(mod["main"])  # before the inference decomposition
    mod["main"] = _ConstantBatchNorms(mod).visit_expr(mod["main"])
    mod["main"] = _SingleConcats(mod).visit_expr(mod["main"])
    mod["main"] = _ChannelSplits(mod).visit_expr(mod["main"])
    seq = tvm.ir.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),  # e.g. batch norm's unused statistics tuple
    ])
    return reorder(canonicalize(seq(mod)))
