"""The ``vta_gemm`` strategy: int8 conv2d/dense of a Relax model on the simulated VTA, bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_messages
from tvm import relax

import alt_tvm
from alt_tvm.graph.report import BuildReport
from alt_tvm.strategies.vta import strategy as vta_strategy
from alt_tvm.target import board

RNG = np.random.default_rng(7)


def _int8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, size=shape, dtype=np.int8)


def conv_ref(x: np.ndarray, w: np.ndarray, *, stride: int = 1, pad: int = 0, groups: int = 1) -> np.ndarray:
    """int32 NCHW/OIHW conv2d in NumPy (int64 accumulation, then int32: no overflow at these sizes)."""
    x = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    oh, ow = (h - r) // stride + 1, (wd - s) // stride + 1
    out = np.zeros((n, k, oh, ow), np.int64)
    kg = k // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(r):
            for j in range(s):
                patch = xs[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch,
                                                         w[g * kg:(g + 1) * kg, :, i, j].astype(np.int64))
    return out.astype(np.int32)


def conv_model(x_shape, w: np.ndarray, *, stride: int = 1, pad: int = 0, groups: int = 1,
               bias: np.ndarray | None = None, relu: bool = False, dense: np.ndarray | None = None):
    """conv2d(int8 -> int32) [+ bias] [+ relu] [-> flatten -> int8 -> matmul(int32)] as a Relax module."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), strides=stride, padding=pad, groups=groups,
                                           out_dtype="int32"))
            if bias is not None:
                y = bb.emit(relax.op.add(y, relax.const(bias)))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
            if dense is not None:
                flat = bb.emit(relax.op.reshape(y, (x_shape[0], -1)))
                q = bb.emit(relax.op.astype(relax.op.right_shift(flat, relax.const(8, "int32")), "int8"))
                y = bb.emit(relax.op.matmul(q, relax.const(dense), out_dtype="int32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _vta_partitions(report: BuildReport) -> list[str]:
    return [anchor for strategy, anchor, _ in report.partitions if strategy == "vta_gemm"]


def test_conv_bias_relu_dense_bit_exact():
    """Conv (+ bias + ReLU in the epilogue) and the dense after it both run on VTA, equal to NumPy."""
    x = _int8(1, 3, 8, 8)
    w = _int8(8, 3, 3, 3)
    bias = RNG.integers(-1000, 1000, size=(1, 8, 1, 1), dtype=np.int32)
    wd = _int8(8 * 8 * 8, 10)
    with build_messages() as messages:
        model = alt_tvm.build(conv_model(x.shape, w, pad=1, bias=bias, relu=True, dense=wd), target=board("vta"),
                              strategies=["vta_gemm"])
    assert any("relax.right_shift" in m for m in messages)  # the requantization stays on the host
    assert _vta_partitions(model.report) == ["relax.nn.conv2d", "relax.matmul"]
    conv_parts = [ops for s, a, ops in model.report.partitions if a == "relax.nn.conv2d"]
    assert conv_parts == [["relax.nn.conv2d", "relax.add", "relax.nn.relu"]]
    (got,) = model(x)
    y = np.maximum(conv_ref(x, w, pad=1) + bias, 0)
    q = (y.reshape(1, -1) >> 8).astype(np.int8)
    expected = q.astype(np.int32) @ wd.astype(np.int32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)

    stats = vta_strategy.model_stats(model)
    assert len(stats) == 2 and all(name.startswith(vta_strategy.PACKED_PREFIX) for name in stats)
    assert all(s.calls == 1 and s.cycles > 0 and s.bytes_moved > 0 and s.gemm_uops > 0 for s in stats.values())
    model(x)
    assert all(s.calls == 2 for s in vta_strategy.model_stats(model).values())
    conv_name = next(n for n in stats if "conv2d" in n)
    assert vta_strategy.kernel(conv_name).candidates >= 1


@pytest.mark.parametrize("stride,pad,groups,cin,cout", [(2, 1, 1, 4, 16), (1, 0, 4, 4, 4)],
                         ids=["stride2-lowchannel", "depthwise"])
def test_conv_variants_bit_exact(stride, pad, groups, cin, cout):
    x = _int8(1, cin, 7, 7)
    w = _int8(cout, cin // groups, 3, 3)
    model = alt_tvm.build(conv_model(x.shape, w, stride=stride, pad=pad, groups=groups), target="vta",
                          strategies=["vta_gemm"])
    assert _vta_partitions(model.report) == ["relax.nn.conv2d"]
    np.testing.assert_array_equal(model(x)[0], conv_ref(x, w, stride=stride, pad=pad, groups=groups))


def _two_branch(x_shape, w1, w2, *, combine, data_layout="NCHW", kernel_layout="OIHW"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = lambda w: relax.op.nn.conv2d(x, relax.const(w), padding=1, data_layout=data_layout,
                                                kernel_layout=kernel_layout, out_dtype="int32")
            y1 = bb.emit(conv(w1))
            y2 = bb.emit(conv(w2))
            out = bb.emit_output(bb.emit(combine(y2, y1)))
        bb.emit_func_output(out)
    return bb.get()


def test_nhwc_hwio_with_residual_operand():
    """NHWC data, HWIO weights; the add's other operand (a second conv) is an extra packed-function input."""
    x = _int8(1, 6, 6, 5)
    w1, w2 = _int8(3, 3, 5, 8), _int8(3, 3, 5, 8)
    model = alt_tvm.build(_two_branch(x.shape, w1, w2, combine=relax.op.add, data_layout="NHWC",
                                      kernel_layout="HWIO"), target="vta", strategies=["vta_gemm"])
    assert sorted(ops for _, _, ops in model.report.partitions) == [["relax.nn.conv2d"],
                                                                    ["relax.nn.conv2d", "relax.add"]]
    nchw = x.transpose(0, 3, 1, 2)
    ref = sum(conv_ref(nchw, w.transpose(3, 2, 0, 1), pad=1) for w in (w1, w2))
    np.testing.assert_array_equal(model(x)[0], ref.transpose(0, 2, 3, 1))


def test_unsupported_epilogue_falls_back_with_the_reason_and_strict_raises():
    x = _int8(1, 4, 5, 5)
    w = _int8(4, 4, 3, 3)
    model = _two_branch(x.shape, w, w, combine=relax.op.divide)
    reason = "epilogue op relax.divide after relax.nn.conv2d is not supported"
    with build_messages() as messages:
        built = alt_tvm.build(model, target="vta", strategies=["vta_gemm"])
    assert any("fell back to TVM's legalization: relax.nn.conv2d" in m for m in messages)
    assert any(reason in why for why in built.report.failed.values())
    with pytest.raises(ValueError, match=reason):
        alt_tvm.build(model, target="vta", strategies=["vta_gemm"], strict=True)


def test_static_mapping_option():
    x = _int8(1, 16, 4, 4)
    w = _int8(16, 16, 1, 1)
    options = {"vta_gemm": vta_strategy.VTAGemmOptions(mapping="static")}
    model = alt_tvm.build(conv_model(x.shape, w), target="vta", strategies=["vta_gemm"], strategy_options=options)
    np.testing.assert_array_equal(model(x)[0], conv_ref(x, w))
    (name,) = vta_strategy.model_stats(model)
    assert vta_strategy.kernel(name).candidates == 1


def test_weights_packed_once_at_build():
    """The constant weight is packed when the model is built; calls pack only the data."""
    x = _int8(1, 16, 6, 6)
    w = _int8(32, 16, 3, 3)
    model = alt_tvm.build(conv_model(x.shape, w, pad=1), target="vta", strategies=["vta_gemm"])
    (name,) = vta_strategy.model_stats(model)
    kern = vta_strategy.kernel(name)
    tiles = kern._weight_tiles
    assert kern.weight_pack_seconds > 0 and tiles.shape[1:] == (16, 16)
    tiles.setflags(write=False)  # a per-call repack would have to replace or write this array
    for _ in range(2):
        np.testing.assert_array_equal(model(x)[0], conv_ref(x, w, pad=1))
    assert kern._weight_tiles is tiles and kern.stats.calls == 2


def test_not_applicable_off_vta_or_for_float():
    x = _int8(1, 3, 6, 6)
    w = _int8(4, 3, 3, 3)
    with build_messages() as messages:
        model = alt_tvm.build(conv_model(x.shape, w), target="host", strategies=["vta_gemm"])
    assert any("vta_gemm" in m for m in messages)
    assert _vta_partitions(model.report) == []
    assert model.report.fallbacks["relax.nn.conv2d"] == ["vta_gemm: target 'host' has no VTA (needs board 'vta')"]
    np.testing.assert_array_equal(model(x)[0], conv_ref(x, w))  # TVM's own legalization

    strategy = vta_strategy.VTAGemmStrategy()
    info = alt_tvm.strategies.base.OpInfo(
        op="relax.nn.conv2d", attrs={}, input_shapes=((1, 3, 6, 6), (4, 3, 3, 3)),
        input_dtypes=("float32", "float32"), output_shape=(1, 4, 4, 4), output_dtype="float32",
        target_kind="llvm", target_name="vta")
    assert strategy.applicable(info) == "input dtypes ('float32', 'float32') (needs int8 data and weight)"


def test_bad_options_and_unknown_kernel():
    with pytest.raises(ValueError, match="mapping must be 'csp' or 'static'"):
        vta_strategy.VTAGemmOptions(mapping="greedy")
    with pytest.raises(ValueError, match="no vta_gemm kernel named 'nope'"):
        vta_strategy.kernel("nope")


def test_vta_board():
    b = board("vta")
    assert b.description == "host CPU + VTA GEMM accelerator model (simulated)"
    assert b.to_tvm().kind.name == "llvm"
