"""Shape-computing ONNX subgraphs fold to constants once the input shapes are static.

The models are exported the way users export them (``torch.onnx.export(..., dynamo=False)``),
which writes ``x.view(b, c, h, w)`` with sizes read at run time, and are checked against ONNX
Runtime. A small Hugging Face Swin (a public architecture definition) is the case TVM's own
importer cannot take: its window partition leaves a tensor of unknown shape."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import alt_tvm
from alt_tvm.graph.frontend import ModelImportError, load_model
from alt_tvm.graph.onnx_fold import fold_static_shapes


def _export(module: torch.nn.Module, inputs: tuple, **kwargs) -> onnx.ModelProto:
    buffer = io.BytesIO()
    torch.onnx.export(module.eval(), inputs, buffer, dynamo=False, opset_version=17, **kwargs)
    return onnx.load_from_string(buffer.getvalue())


def _ort(model: onnx.ModelProto, *arrays: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})


def _outputs(result) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, (list, tuple)) else [np.asarray(result)]


class ChannelShuffle(torch.nn.Module):
    """ShuffleNet-V2's channel shuffle (Ma et al., 2018): a reshape whose sizes come from ``x.size()``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv(x)
        b, c, h, w = x.size()
        x = x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, -1, h, w)
        return torch.relu(x)


def test_a_shape_computed_reshape_folds_builds_and_matches_onnx_runtime():
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype("float32")
    # A dynamic batch, as users export for serving: the sizes are then read at run time.
    model = _export(ChannelShuffle(), (torch.from_numpy(x),), input_names=["x"], dynamic_axes={"x": {0: "b"}})
    assert any(n.op_type == "Shape" for n in model.graph.node)
    folded = fold_static_shapes(model, input_shapes={"x": x.shape})
    ops = [n.op_type for n in folded.model.graph.node]
    assert folded.folded_nodes > 0 and "Shape" not in ops and "Gather" not in ops
    assert ops.count("Reshape") == 2
    assert any(n.op_type == "Shape" for n in model.graph.node)  # the caller's model is untouched
    built = alt_tvm.build(model)
    np.testing.assert_allclose(_outputs(built(x))[0], _ort(model, x)[0], rtol=1e-5, atol=1e-5)


def test_shape_of_an_inferred_tensor_folds_and_large_results_stay_nodes():
    # Shape(MatMul(x, W)) needs shape inference; Expand to 64x4096 would grow the file: it stays.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    big = helper.make_tensor_value_info("big", TensorProto.FLOAT, None)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 6], np.ones(48, "float32"))
    target = helper.make_tensor("target", TensorProto.INT64, [2], [64, 4096])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Shape", ["h"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
        helper.make_node("Reshape", ["h", "n"], ["y"]),
        helper.make_node("ConstantOfShape", ["target"], ["filled"]),
        helper.make_node("Add", ["filled", "filled"], ["big"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [out, big], [weight, target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = fold_static_shapes(model, input_shapes={"x": (3, 8)})
    ops = [n.op_type for n in folded.model.graph.node]
    assert ops == ["MatMul", "Reshape", "ConstantOfShape", "Add"]
    (n,) = [t for t in folded.model.graph.initializer if t.name == "n"]
    assert onnx.numpy_helper.to_array(n).tolist() == [18]
    assert [d.dim_value for d in folded.model.graph.input[0].type.tensor_type.shape.dim] == [3, 8]


def test_public_swin_builds_where_tvms_importer_alone_fails():
    hf = pytest.importorskip("transformers")
    from tvm.relax.frontend.onnx import from_onnx

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            return self.inner(pixel_values=pixel_values).logits

    torch.manual_seed(0)
    config = hf.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                           window_size=4, num_labels=10)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    model = _export(Logits(hf.SwinForImageClassification(config)), (torch.from_numpy(x),))
    with pytest.raises(Exception, match="Reshape expects the input tensor to have known shape"):
        from_onnx(model)
    built = alt_tvm.build(model)
    np.testing.assert_allclose(_outputs(built(x))[0], _ort(model, x)[0], rtol=1e-4, atol=1e-5)


class Encoder(torch.nn.Module):
    """A post-norm transformer encoder layer (PyTorch's definition)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)

    def forward(self, x):
        return self.layer(x)


def test_a_symbolic_sequence_length_is_a_clear_error_and_builds_with_input_shapes():
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((1, 12, 32)).astype("float32")
    model = _export(Encoder(), (torch.from_numpy(x),), input_names=["tokens"],
                    dynamic_axes={"tokens": {0: "batch", 1: "seq"}})
    with pytest.raises(ModelImportError, match=r"input 'tokens' has a dynamic dim 1 \('seq'\).*"
                                               r"input_shapes=\{'tokens': \(1, <seq>, 32\)\}"):
        load_model(model)
    built = alt_tvm.build(model, input_shapes={"tokens": (1, 12, 32)})
    np.testing.assert_allclose(_outputs(built(x))[0], _ort(model, x)[0], rtol=1e-4, atol=1e-5)


class SamePadConv(torch.nn.Module):
    """TensorFlow-style "same" padding (asymmetric, as Hugging Face's MobileNets pad), then a
    channel pad that is not a convolution's padding."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, stride=2)
        self.second = torch.nn.Conv2d(10, 8, 1)

    def forward(self, x):
        x = self.conv(torch.nn.functional.pad(x, (0, 1, 0, 1)))
        return self.second(torch.nn.functional.pad(x, (0, 0, 0, 0, 1, 1)))


def test_spatial_zero_pads_merge_into_the_conv_and_channel_pads_stay():
    from alt_tvm.graph.onnx_fold import merge_pads_into_convs

    x = np.random.default_rng(0).standard_normal((1, 4, 15, 15)).astype("float32")
    model = _export(SamePadConv(), (torch.from_numpy(x),), input_names=["x"])
    folded = fold_static_shapes(model, input_shapes={"x": x.shape}).model
    assert merge_pads_into_convs(folded) == 1
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["Conv", "Pad", "Conv"]
    (conv, *_) = [n for n in folded.graph.node if n.op_type == "Conv"]
    assert list(helper.get_attribute_value(next(a for a in conv.attribute if a.name == "pads"))) == [0, 0, 1, 1]
    built = alt_tvm.build(model)
    np.testing.assert_allclose(_outputs(built(x))[0], _ort(model, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_output_shape_becomes_pads_and_matches_the_onnx_reference(auto_pad):
    from onnx.reference import ReferenceEvaluator

    from alt_tvm.graph.onnx_fold import resolve_conv_transpose_output_shapes

    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 2, 3, 3)).astype("float32")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2], output_shape=[10, 8],
                            auto_pad=auto_pad)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 10, 8])],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 1, 3, 3)).astype("float32")
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert want.shape == (1, 2, 10, 8)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    if auto_pad == "SAME_UPPER":  # 10 = 3 * 3 + 1: the extra row would be at the start
        with pytest.raises(ModelImportError, match=r"output_shape \[10, 8\] with auto_pad SAME_UPPER needs the "
                                                   r"padding \[-1, -1\] at the start"):
            alt_tvm.build(model)
        return
    assert resolve_conv_transpose_output_shapes(rewritten) == 1
    attrs = {a.name for a in rewritten.graph.node[0].attribute}
    assert "output_shape" not in attrs and {"pads", "output_padding"} <= attrs
    np.testing.assert_allclose(ReferenceEvaluator(rewritten).run(None, {"x": x})[0], want, rtol=1e-6)
    np.testing.assert_allclose(_outputs(alt_tvm.build(model)(x))[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad_becomes_pads_and_matches_the_onnx_reference(auto_pad):
    from onnx.reference import ReferenceEvaluator

    from alt_tvm.graph.onnx_fold import resolve_conv_auto_pads

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], auto_pad=auto_pad)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 10, 9)).astype("float32")
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert resolve_conv_auto_pads(rewritten) == 1
    attrs = {a.name: helper.get_attribute_value(a) for a in rewritten.graph.node[0].attribute}
    assert "auto_pad" not in attrs
    assert attrs["pads"] == {"SAME_UPPER": [0, 1, 1, 1], "SAME_LOWER": [1, 1, 0, 1], "VALID": [0, 0, 0, 0]}[auto_pad]
    np.testing.assert_allclose(ReferenceEvaluator(rewritten).run(None, {"x": x})[0], want, rtol=1e-6)
