"""alt_tvm.ops: every operator built with real TVM and checked against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import tvm
from conftest import build_and_run
from tvm import te
from tvm.ir.prim import expr as E

from alt_tvm import ops

RTOL = ATOL = 1e-4
RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def _run_op(fn, arrays: list[np.ndarray], **kwargs) -> np.ndarray:
    """Build ``fn(*placeholders, **kwargs)`` for the arrays' shapes, run it, return the output."""
    phs = [te.placeholder(a.shape, dtype=str(a.dtype), name=f"in{i}") for i, a in enumerate(arrays)]
    out = fn(*phs, **kwargs)
    (res,) = build_and_run(phs, [out], arrays)
    return res


def _check(actual: np.ndarray, expected: torch.Tensor) -> None:
    np.testing.assert_allclose(actual, expected.numpy(), rtol=RTOL, atol=ATOL)


# --- convolution --------------------------------------------------------------------------

CONV2D_CASES = [
    # (data shape, weight shape, stride, padding, dilation, groups)
    pytest.param((1, 4, 8, 8), (6, 4, 3, 3), 1, 1, 1, 1, id="basic"),
    pytest.param((2, 3, 9, 7), (5, 3, 3, 3), 2, 1, 1, 1, id="stride2-odd"),
    pytest.param((1, 4, 9, 9), (4, 4, 3, 3), 1, 2, 2, 1, id="dilation2"),
    pytest.param((1, 4, 7, 7), (6, 2, 3, 3), 2, 1, 1, 2, id="groups2"),
    pytest.param((1, 6, 8, 8), (6, 1, 3, 3), 1, 1, 1, 6, id="depthwise"),
    pytest.param((1, 4, 8, 8), (8, 1, 3, 3), 2, 1, 1, 4, id="depthwise-multiplier2"),
    pytest.param((1, 3, 9, 6), (4, 3, 3, 1), (2, 1), (1, 0), (1, 1), 1, id="rect"),
    pytest.param((1, 8, 5, 5), (4, 8, 1, 1), 1, 0, 1, 1, id="pointwise-nopad"),
    pytest.param((1, 2, 11, 10), (3, 2, 5, 3), (3, 2), (2, 1), (2, 3), 1, id="mixed"),
]


@pytest.mark.parametrize("dshape, wshape, stride, padding, dilation, groups", CONV2D_CASES)
def test_conv2d_matches_torch(dshape, wshape, stride, padding, dilation, groups):
    x, w = _rand(*dshape), _rand(*wshape)
    kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    out = _run_op(ops.conv2d, [x, w], **kw)
    _check(out, F.conv2d(torch.from_numpy(x), torch.from_numpy(w), **kw))


@pytest.mark.parametrize(
    "dshape, wshape, stride, padding, dilation, groups",
    [
        pytest.param((2, 4, 17), (6, 4, 3), 1, 1, 1, 1, id="basic"),
        pytest.param((1, 4, 16), (4, 2, 3), 2, 2, 2, 2, id="s2-d2-g2"),
        pytest.param((1, 3, 10), (3, 1, 5), 1, 2, 1, 3, id="depthwise"),
    ],
)
def test_conv1d_matches_torch(dshape, wshape, stride, padding, dilation, groups):
    x, w = _rand(*dshape), _rand(*wshape)
    kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    out = _run_op(ops.conv1d, [x, w], **kw)
    _check(out, F.conv1d(torch.from_numpy(x), torch.from_numpy(w), **kw))


@pytest.mark.parametrize(
    "dshape, wshape, stride, padding, dilation, groups",
    [
        pytest.param((1, 2, 5, 6, 5), (3, 2, 3, 3, 3), (1, 2, 1), 1, 1, 1, id="basic"),
        pytest.param((1, 4, 7, 7, 6), (4, 2, 3, 3, 3), 2, 2, 2, 2, id="s2-d2-g2"),
    ],
)
def test_conv3d_matches_torch(dshape, wshape, stride, padding, dilation, groups):
    x, w = _rand(*dshape), _rand(*wshape)
    kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    out = _run_op(ops.conv3d, [x, w], **kw)
    _check(out, F.conv3d(torch.from_numpy(x), torch.from_numpy(w), **kw))


def test_conv_core_on_prepadded_input():
    x, w = _rand(1, 4, 10, 9), _rand(6, 2, 3, 3)
    out = _run_op(ops.conv, [x, w], strides=(2, 1), dilation=(1, 2), groups=2)
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=(2, 1), dilation=(1, 2), groups=2)
    _check(out, expected)


def test_conv_int8_accumulates_in_int32():
    x = RNG.integers(-128, 128, (1, 3, 6, 6)).astype("int8")
    w = RNG.integers(-128, 128, (4, 3, 3, 3)).astype("int8")
    out = _run_op(ops.conv2d, [x, w], padding=1, out_dtype="int32")
    expected = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, expected.numpy().astype("int32"))


def test_conv_with_int64_shapes():
    # Relax call_te hands over int64 shapes; loop and reduce variables must agree.
    def i64(*dims: int) -> list:
        return [tvm.tirx.IntImm("int64", d) for d in dims]

    data = te.placeholder(i64(1, 4, 7, 7), name="data")
    weight = te.placeholder(i64(4, 2, 3, 3), name="weight")
    out = ops.conv2d(data, weight, stride=2, padding=1, groups=2)
    x, w = _rand(1, 4, 7, 7), _rand(4, 2, 3, 3)
    (res,) = build_and_run([data, weight], [out], [x, w])
    _check(res, F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1, groups=2))


def _is_window(index, stride: int, out_var, dilation: int, red_var) -> bool:
    """``index`` is exactly Add(Mul(stride, out_var), Mul(dilation, red_var))."""
    if not isinstance(index, E.Add):
        return False
    lhs, rhs = index.a, index.b
    return (
        isinstance(lhs, E.Mul)
        and isinstance(rhs, E.Mul)
        and isinstance(lhs.a, tvm.tirx.IntImm)
        and int(lhs.a.value) == stride
        and lhs.b.same_as(out_var)
        and isinstance(rhs.a, tvm.tirx.IntImm)
        and int(rhs.a.value) == dilation
        and rhs.b.same_as(red_var)
    )


def _loads(expr) -> list:
    """All te.tensor_load calls in ``expr``, in visit order."""
    found = []

    def visit(node):
        if isinstance(node, tvm.ir.expr.Call) and node.op.name == "te.tensor_load":
            found.append(node)

    _walk(expr, visit)
    return found


def _walk(node, visit):
    # TVM 0.27 has no Python expression visitor for TE bodies; walk the node kinds ops emit.
    visit(node)
    for field in ("a", "b", "value", "condition", "true_value", "false_value"):
        child = getattr(node, field, None)
        if isinstance(child, tvm.ir.Expr):
            _walk(child, visit)
    if isinstance(node, tvm.ir.expr.Call):
        for arg in node.args[1:] if node.op.name == "te.tensor_load" else node.args:
            if isinstance(arg, tvm.ir.Expr):
                _walk(arg, visit)
    if isinstance(node, tvm.tirx.Reduce):
        for src in node.source:
            _walk(src, visit)


@pytest.mark.parametrize("stride, dilation, groups", [(1, 1, 1), (2, 3, 2), (3, 1, 4)])
def test_conv_input_access_form(stride, dilation, groups):
    data = te.placeholder((1, 4, 12, 12), name="data")
    weight = te.placeholder((8, 4 // groups, 3, 3), name="weight")
    out = ops.conv(data, weight, strides=stride, dilation=dilation, groups=groups)
    op = out.op
    assert op.tag == "conv2d"
    assert [int(v) for v in op.attrs["strides"]] == [stride, stride]
    assert [int(v) for v in op.attrs["dilation"]] == [dilation, dilation]
    assert int(op.attrs["groups"]) == groups
    assert [int(v) for v in op.attrs["kernel_size"]] == [3, 3]
    n, o, h, w = (iv.var for iv in op.axis)
    rc, rh, rw = (iv.var for iv in op.reduce_axis)
    loads = _loads(op.body[0])
    (x_load,) = [ld for ld in loads if ld.args[0].same_as(data)]
    (w_load,) = [ld for ld in loads if ld.args[0].same_as(weight)]
    _, xn, xc, xh, xw = x_load.args
    assert xn.same_as(n)
    if groups == 1:
        assert xc.same_as(rc)
    else:
        in_per_group, out_per_group = 4 // groups, 8 // groups
        expected = tvm.tirx.floordiv(o, out_per_group) * in_per_group + rc
        tvm.ir.assert_structural_equal(xc, expected)
    assert _is_window(xh, stride, h, dilation, rh)
    assert _is_window(xw, stride, w, dilation, rw)
    assert [a.same_as(v) for a, v in zip(w_load.args[1:], (o, rc, rh, rw), strict=True)] == [True] * 4


def test_conv2d_wrapper_stages():
    data = te.placeholder((1, 3, 8, 8), name="data")
    weight = te.placeholder((4, 3, 3, 3), name="weight")
    out = ops.conv2d(data, weight, padding=1)
    padded = out.op.input_tensors[0]
    assert padded.op.name == "pad" and padded.op.tag == "pad"
    assert [int(d) for d in padded.shape] == [1, 3, 10, 10]
    # No padding: no pad stage at all.
    out = ops.conv2d(data, weight, padding=0)
    assert any(t.same_as(data) for t in out.op.input_tensors)


# --- transposed convolution ----------------------------------------------------------------


@pytest.mark.parametrize(
    "dshape, wshape, stride, padding, output_padding, dilation, groups",
    [
        pytest.param((1, 4, 5, 5), (4, 3, 3, 3), 1, 0, 0, 1, 1, id="basic"),
        pytest.param((1, 4, 5, 6), (4, 3, 3, 3), 2, 1, 1, 1, 1, id="s2-p1-op1"),
        pytest.param((2, 4, 5, 4), (4, 2, 3, 3), 2, 1, 1, 2, 2, id="groups2-dil2"),
        pytest.param((1, 2, 4, 5), (2, 3, 3, 2), (2, 3), (1, 0), (0, 2), 1, 1, id="rect"),
        pytest.param((1, 3, 5, 5), (3, 2, 3, 3), 2, 3, 1, 1, 1, id="crop-padding>K-1"),
        pytest.param((1, 3, 4, 4), (3, 2, 1, 1), 2, 0, 1, 1, 1, id="1x1-s2"),
        pytest.param((1, 4, 4, 4), (4, 1, 3, 3), 2, 1, 1, 1, 4, id="depthwise"),
    ],
)
def test_conv_transpose2d_matches_torch(dshape, wshape, stride, padding, output_padding, dilation, groups):
    x, w = _rand(*dshape), _rand(*wshape)
    kw = {
        "stride": stride,
        "padding": padding,
        "output_padding": output_padding,
        "dilation": dilation,
        "groups": groups,
    }
    out = _run_op(ops.conv_transpose2d, [x, w], **kw)
    _check(out, F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), **kw))


def test_conv_transpose3d_matches_torch():
    x, w = _rand(1, 4, 3, 4, 3), _rand(4, 2, 3, 3, 3)
    kw = {"stride": (2, 1, 2), "padding": 1, "output_padding": (1, 0, 0), "groups": 2}
    out = _run_op(ops.conv_transpose3d, [x, w], **kw)
    _check(out, F.conv_transpose3d(torch.from_numpy(x), torch.from_numpy(w), **kw))


def test_conv_transpose1d_matches_torch():
    x, w = _rand(1, 2, 7), _rand(2, 3, 4)
    kw = {"stride": 3, "padding": 2, "output_padding": 1, "dilation": 2}
    out = _run_op(ops.conv_transpose1d, [x, w], **kw)
    _check(out, F.conv_transpose1d(torch.from_numpy(x), torch.from_numpy(w), **kw))


def test_conv_transpose_structure():
    data = te.placeholder((1, 4, 5, 5), name="data")
    weight = te.placeholder((4, 3, 3, 3), name="weight")
    out = ops.conv_transpose(data, weight, stride=2, padding=1, output_padding=1, dilation=2, groups=2)
    assert out.op.tag == "conv2d_transpose"
    assert [int(v) for v in out.op.attrs["strides"]] == [1, 1]
    assert [int(v) for v in out.op.attrs["transpose_strides"]] == [2, 2]
    (dp,) = [t for t in out.op.input_tensors if t.op.name == "dilate_pad"]
    assert dp.op.tag == "dilate_pad"
    # (5-1)*2+1 + 2*(2*2-1) + 1 = 16
    assert [int(d) for d in dp.shape] == [1, 4, 16, 16]
    h, w = (iv.var for iv in out.op.axis[2:])
    _, rh, rw = (iv.var for iv in out.op.reduce_axis)
    (x_load,) = [ld for ld in _loads(out.op.body[0]) if ld.args[0].same_as(dp)]
    assert _is_window(x_load.args[3], 1, h, 2, rh)
    assert _is_window(x_load.args[4], 1, w, 2, rw)


# --- GEMM -----------------------------------------------------------------------------------


def test_dense_matches_linear():
    x, w = _rand(3, 17), _rand(5, 17)
    out = _run_op(ops.dense, [x, w])
    _check(out, F.linear(torch.from_numpy(x), torch.from_numpy(w)))


def test_dense_int8_out_dtype():
    x = RNG.integers(-128, 128, (2, 33)).astype("int8")
    w = RNG.integers(-128, 128, (3, 33)).astype("int8")
    out = _run_op(ops.dense, [x, w], out_dtype="int32")
    np.testing.assert_array_equal(out, x.astype("int32") @ w.astype("int32").T)


def test_matmul_matches_torch():
    a, b = _rand(7, 9), _rand(9, 5)
    out = _run_op(ops.matmul, [a, b])
    _check(out, torch.matmul(torch.from_numpy(a), torch.from_numpy(b)))


@pytest.mark.parametrize("transpose_b", [False, True])
def test_batch_matmul_matches_bmm(transpose_b):
    a = _rand(3, 4, 6)
    b = _rand(3, 5, 6) if transpose_b else _rand(3, 6, 5)
    out = _run_op(ops.batch_matmul, [a, b], transpose_b=transpose_b)
    tb = torch.from_numpy(b)
    _check(out, torch.bmm(torch.from_numpy(a), tb.transpose(1, 2) if transpose_b else tb))


def test_gemm_tags():
    a, b = te.placeholder((4, 8)), te.placeholder((8, 4))
    assert ops.dense(a, te.placeholder((3, 8))).op.tag == "dense"
    assert ops.matmul(a, b).op.tag == "matmul"
    assert ops.batch_matmul(te.placeholder((2, 4, 8)), te.placeholder((2, 8, 3))).op.tag == ("batch_matmul")


# --- element-wise and pad ---------------------------------------------------------------------


def test_bias_add():
    x, b = _rand(2, 3, 4, 5), _rand(3)
    out = _run_op(ops.bias_add, [x, b])
    np.testing.assert_allclose(out, x + b[None, :, None, None], rtol=RTOL, atol=ATOL)
    out = _run_op(ops.bias_add, [x, _rand(5)], axis=-1)
    assert out.shape == x.shape


def test_unary_ops():
    x = _rand(2, 3, 5)
    xt = torch.from_numpy(x)
    _check(_run_op(ops.relu, [x]), F.relu(xt))
    _check(_run_op(ops.sigmoid, [x]), torch.sigmoid(xt))
    _check(_run_op(ops.clip, [x], a_min=-0.5, a_max=0.7), torch.clamp(xt, -0.5, 0.7))
    _check(_run_op(ops.identity, [x]), xt)


@pytest.mark.parametrize("fn, ref", [(ops.add, np.add), (ops.subtract, np.subtract), (ops.multiply, np.multiply)])
@pytest.mark.parametrize(
    "lshape, rshape, tag",
    [
        ((2, 3, 4), (2, 3, 4), "elemwise"),
        ((2, 3, 4, 4), (3, 1, 1), "broadcast"),
        ((4,), (2, 3, 4), "broadcast"),
        ((2, 1, 4), (2, 3, 1), "broadcast"),
    ],
)
def test_binary_ops(fn, ref, lshape, rshape, tag):
    a, b = _rand(*lshape), _rand(*rshape)
    pa, pb = te.placeholder(lshape, name="a"), te.placeholder(rshape, name="b")
    out = fn(pa, pb)
    assert out.op.tag == tag
    (res,) = build_and_run([pa, pb], [out], [a, b])
    np.testing.assert_allclose(res, ref(a, b), rtol=RTOL, atol=ATOL)


def test_binary_with_scalar():
    x = _rand(3, 4)
    np.testing.assert_allclose(_run_op(lambda t: ops.multiply(t, 2.5), [x]), x * 2.5, rtol=RTOL)
    np.testing.assert_allclose(_run_op(lambda t: ops.subtract(1.0, t), [x]), 1.0 - x, rtol=RTOL)


def test_unary_tags():
    x = te.placeholder((2, 3))
    for fn in (ops.relu, ops.sigmoid, ops.identity):
        assert fn(x).op.tag == "elemwise"
    assert ops.clip(x, a_min=0.0, a_max=6.0).op.tag == "elemwise"
    assert ops.bias_add(x, te.placeholder((3,))).op.tag == "broadcast"


def test_pad():
    x = _rand(2, 3, 4)
    out = _run_op(lambda t: ops.pad(t, (0, 1, 2), (1, 0, 3), value=-1.5, name="mypad"), [x])
    np.testing.assert_array_equal(out, np.pad(x, ((0, 1), (1, 0), (2, 3)), constant_values=-1.5))
    t = te.placeholder((2, 3))
    padded = ops.pad(t, (1, 0), (0, 0), name="mypad")
    assert padded.op.name == "mypad" and padded.op.tag == "pad"
    assert ops.pad(t, (0, 0), (0, 0)) is t


# --- bad input --------------------------------------------------------------------------------


def _ph(*shape: int, dtype: str = "float32") -> te.Tensor:
    return te.placeholder(shape, dtype=dtype)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3), groups=3), r"divisible by groups \(3\)"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 3, 3, 3), groups=2), r"got 3"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3)), r"weight .* rank 4, got rank 3"),
        (lambda: ops.conv2d(_ph(1, 4, 8), _ph(6, 4, 3, 3)), r"rank 4, got rank 3"),
        (lambda: ops.conv2d(_ph(1, 4, 4, 4), _ph(6, 4, 5, 5)), r"extent 5 .* input size 4"),
        (lambda: ops.conv2d(_ph(1, 4, 5, 5), _ph(6, 4, 3, 3), dilation=3), r"extent 7 .*dilation 3.* size 5"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3), stride=0), r"stride entries must be >= 1, got 0"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3), padding=-1), r"padding .*got -1"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3), stride=(1, 2, 1)), r"stride must have 2 entries"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3), groups=0), r"groups .* got 0"),
        (lambda: ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3, dtype="float16")), r"float16"),
        (
            lambda: ops.conv(_ph(1, 4, 8, 8, 8, 8), _ph(6, 4, 3, 3, 3, 3), strides=1, dilation=1),
            r"rank 3, 4 or 5 .* got rank 6",
        ),
        (lambda: ops.conv_transpose2d(_ph(1, 4, 5, 5), _ph(3, 2, 3, 3)), r"input channels 4 .* got 3"),
        (
            lambda: ops.conv_transpose2d(_ph(1, 4, 5, 5), _ph(4, 2, 3, 3), stride=2, output_padding=2),
            r"output_padding \[2, 2\]",
        ),
        (lambda: ops.conv_transpose2d(_ph(1, 4, 1, 1), _ph(4, 2, 1, 1), padding=1), r"padding \[1, 1\] is too large"),
        (
            lambda: ops.conv_transpose2d(_ph(1, 4, 5, 5), _ph(4, 2, 3, 3), groups=3),
            r"input channels \(4\) .* groups \(3\)",
        ),
        (lambda: ops.dense(_ph(2, 8), _ph(3, 7)), r"8 != 7"),
        (lambda: ops.dense(_ph(2, 8, 1), _ph(3, 8)), r"data must have rank 2"),
        (lambda: ops.matmul(_ph(2, 8), _ph(7, 3)), r"8 != 7"),
        (lambda: ops.batch_matmul(_ph(2, 4, 8), _ph(3, 8, 5)), r"batch sizes differ.*2 != 3"),
        (lambda: ops.batch_matmul(_ph(2, 4, 8), _ph(2, 5, 7), transpose_b=True), r"8 != 7"),
        (lambda: ops.bias_add(_ph(2, 3, 4), _ph(4)), r"bias length 4 .* size 3"),
        (lambda: ops.bias_add(_ph(2, 3, 4), _ph(3), axis=3), r"axis 3 is out of range"),
        (lambda: ops.add(_ph(2, 3), _ph(2, 4)), r"not broadcastable .*3 vs 4"),
        (lambda: ops.add(_ph(2, 3), _ph(2, 3, dtype="int32")), r"int32"),
        (lambda: ops.clip(_ph(2, 3), a_min=1.0, a_max=0.0), r"a_min=1.0 > a_max=0.0"),
        (lambda: ops.sigmoid(_ph(2, 3, dtype="int32")), r"dtype int32"),
        (lambda: ops.pad(_ph(2, 3), (0,), (0, 0)), r"pad_before must have 2 entries"),
        (lambda: ops.pad(_ph(2, 3), (0, -1), (0, 0)), r"pad_before .*-1"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_types_raise_type_error():
    with pytest.raises(TypeError, match="stride entries must be ints"):
        ops.conv2d(_ph(1, 4, 8, 8), _ph(6, 4, 3, 3), stride=(1.5, 1))
    with pytest.raises(TypeError, match="weight must be a tvm.te.Tensor"):
        ops.conv2d(_ph(1, 4, 8, 8), np.zeros((6, 4, 3, 3)))
