"""TIR emission for VTA embeddings: GEMM blocks tensorized by the VTA GEMM TensorIntrin, run for llvm."""

import numpy as np
import pytest

from alt_tvm.vta_mapping.dfg import GemmShape
from alt_tvm.vta_mapping.embedding import static_embedding
from alt_tvm.vta_mapping.polyhedral import conv2d_op, dense_op
from alt_tvm.vta_mapping.slabs import conv2d_reference
from alt_tvm.vta_mapping.tir import (
    DEFAULT_GEMM_FUNC,
    conv2d_tir,
    emit_tir,
    gemm_intrin,
    intrinsic_calls,
    register_numpy_gemm,
)


@pytest.fixture(scope="module")
def counter():
    return register_numpy_gemm()


def _conv_case(rng, n, c, h, w, k, r, s, groups=1):
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    wt = rng.integers(-128, 128, (k, c // groups, r, s), dtype=np.int8)
    return x, wt


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_low_channel_conv_tensorized_bit_exact(counter, layout):
    """CSP embedding (stencil unroll of the 3x3 window into BLOCK_IN), stride 2, padding 1."""
    rng = np.random.default_rng(11)
    x, wt = _conv_case(rng, 1, 3, 8, 8, 16, 3, 3)
    data = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    before = counter["calls"]
    out, kern = conv2d_tir(data=data, weight=wt, stride=(2, 2), padding=(1, 1), data_layout=layout)
    ref = conv2d_reference(data=np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), weight=wt, stride=(2, 2),
                           dilation=(1, 1), groups=1)
    got = out if layout == "NCHW" else out.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, ref)
    assert out.dtype == np.int32
    assert intrinsic_calls(kern.func) == 1  # the GEMM block is one call_packed in the loop nest
    assert counter["calls"] - before == kern.plan.calls  # one intrinsic execution per GEMM call
    assert "rh" in str(kern.embedding)  # not the static template: ic=3 alone cannot fill BLOCK_IN


def test_static_and_depthwise_dilated_bit_exact(counter):
    rng = np.random.default_rng(12)
    x, wt = _conv_case(rng, 1, 16, 7, 7, 16, 3, 3)
    op = conv2d_op(n=1, c=16, h=7, w=7, k=16, r=3, s=3, pad_h=2, pad_w=2, dilation_h=2, dilation_w=2)
    out, kern = conv2d_tir(data=x, weight=wt, padding=(2, 2), dilation=(2, 2),
                           embedding=static_embedding(op, GemmShape()))
    ref = conv2d_reference(data=np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2))), weight=wt, stride=(1, 1),
                           dilation=(2, 2), groups=1)
    np.testing.assert_array_equal(out, ref)
    xd, wd = _conv_case(rng, 1, 16, 6, 6, 16, 3, 3, groups=16)
    out, kern = conv2d_tir(data=xd, weight=wd, padding=(1, 1), groups=16)
    ref = conv2d_reference(data=np.pad(xd, ((0, 0), (0, 0), (1, 1), (1, 1))), weight=wd, stride=(1, 1),
                           dilation=(1, 1), groups=16)
    np.testing.assert_array_equal(out, ref)


def test_dense_8x8x8_intrinsic(counter):
    gemm = GemmShape(8, 8, 8)
    op = dense_op(m=8, n=16, k=24)
    kern = emit_tir(op=op, embedding=static_embedding(op, gemm))
    assert kern.intrin == gemm_intrin(gemm)  # registered once, reused
    rng = np.random.default_rng(13)
    a = rng.integers(-128, 128, (8, 24), dtype=np.int8)
    b = rng.integers(-128, 128, (16, 24), dtype=np.int8)
    c = kern.run(kern.build(), a_pack=kern.pack_operand(index=0, tensor=a), b_pack=kern.pack_operand(index=1, tensor=b))
    np.testing.assert_array_equal(kern.unpack(c), a.astype(np.int64) @ b.astype(np.int64).T)
    assert intrinsic_calls(kern.func, gemm_func="no.such.func") == 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="BLOCK_OUT > 1"):
        gemm_intrin(GemmShape(1, 1, 16))
    with pytest.raises(ValueError, match="func"):
        gemm_intrin(GemmShape(), func="")
    with pytest.raises(ValueError, match="data_layout"):
        conv2d_tir(data=np.zeros((1, 1, 4, 4), np.int8), weight=np.zeros((16, 1, 1, 1), np.int8), data_layout="HWCN")
    with pytest.raises(ValueError, match="int8"):
        conv2d_tir(data=np.zeros((1, 1, 4, 4), np.float32), weight=np.zeros((16, 1, 1, 1), np.int8))
    assert DEFAULT_GEMM_FUNC.startswith("alt_tvm.")
