"""NaN and infinities go through alt-tvm as through ONNX Runtime and PyTorch (IEEE 754-2019).

TVM's ``tirx.max(a, b)`` is ``select(a > b, a, b)``: ``max(NaN, 0)`` is 0, so a ReLU built on
it turns NaN into zeros, and inputs that overflow (1e38 through a few convolutions gives
``inf - inf = NaN``) come out finite. These tests check the rule of ``alt_tvm.ops.ieee`` on
its own, in the strategies' epilogues, in the legalization of the ops no strategy takes, and
on the reference models against ONNX Runtime, plus the ``fast_math=True`` opt-out.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import tvm
from conftest import build_and_run, host_target
from tvm import relax, te

from alt_tvm import ops
from alt_tvm.bench import onnxruntime_session
from alt_tvm.graph.build import build
from alt_tvm.graph.ieee import legalize_overrides
from alt_tvm.models import MODELS, export_onnx, get_model
from alt_tvm.ops import ieee

F32 = "float32"


def assert_same_specials(got: np.ndarray, ref: np.ndarray, *, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """NaN, +inf and -inf exactly where ``ref`` has them; the finite values close."""
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg="NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref), err_msg="+inf positions differ")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg="-inf positions differ")
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=rtol, atol=atol)


def special_input(shape, *, seed: int = 0, dtype: str = F32) -> np.ndarray:
    """Random data with NaN, +inf, -inf, +-1e38 and a whole -inf corner (a max-pool window of -inf)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[[1, 17, 40]] = np.nan
    flat[[5, 23]] = np.inf
    flat[[9, 31]] = -np.inf
    flat[[13, 50]] = (1e38, -1e38) if dtype != "float16" else (6e4, -6e4)
    if x.ndim >= 2:
        x[..., :3, :3] = -np.inf
    return x


# ----------------------------------------------------------------------------- the TE rule
UNARY = {
    "relu": (lambda t, fm: ops.relu(t, fast_math=fm), torch.relu),
    "relu6": (lambda t, fm: ops.clip(t, a_min=0.0, a_max=6.0, fast_math=fm), lambda t: torch.clamp(t, 0, 6)),
    "clip": (lambda t, fm: ops.clip(t, a_min=-1.5, a_max=2.0, fast_math=fm), lambda t: torch.clamp(t, -1.5, 2.0)),
    "clip_one_sided": (lambda t, fm: ops.clip(t, a_min=-np.inf, a_max=0.5, fast_math=fm),
                       lambda t: torch.clamp(t, max=0.5)),
    "maximum_const": (lambda t, fm: ops.maximum(t, 0.25, fast_math=fm), lambda t: torch.clamp(t, min=0.25)),
    "minimum_const": (lambda t, fm: ops.minimum(0.25, t, fast_math=fm), lambda t: torch.clamp(t, max=0.25)),
    "max_pool": (lambda t, fm: ops.max_pool(t, pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1),
                                            fast_math=fm),
                 lambda t: torch.nn.functional.max_pool2d(t, 3, 2, 1)),
    "max_pool_ceil": (lambda t, fm: ops.max_pool(t, pool_size=(2, 2), strides=(2, 2), ceil_mode=True, fast_math=fm),
                      lambda t: torch.nn.functional.max_pool2d(t, 2, 2, ceil_mode=True)),
    "reduce_max": (lambda t, fm: ops.reduce_max(t, axis=(2, 3), fast_math=fm), lambda t: torch.amax(t, (2, 3))),
    "reduce_min": (lambda t, fm: ops.reduce_min(t, axis=1, keepdims=True, fast_math=fm),
                   lambda t: torch.amin(t, 1, keepdim=True)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_ops_propagate_nan_and_inf(name):
    x = special_input((2, 3, 9, 9))
    fn, reference = UNARY[name]
    data = te.placeholder(x.shape, F32, name="x")
    (got,) = build_and_run([data], [fn(data, False)], [x])
    assert_same_specials(got, reference(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype", ["float16", F32, "float64"])
def test_binary_extremum_propagates_nan_from_either_operand(op, dtype):
    x, y = special_input((4, 32), dtype=dtype), special_input((4, 32), seed=1, dtype=dtype)
    y.reshape(-1)[[2, 3, 60]] = np.nan  # NaN only in the right operand too
    lhs, rhs = te.placeholder(x.shape, dtype, name="x"), te.placeholder(y.shape, dtype, name="y")
    (got,) = build_and_run([lhs, rhs], [getattr(ops, op)(lhs, rhs)], [x, y])
    assert_same_specials(got, getattr(np, op)(x, y))


def test_a_max_pool_window_of_minus_inf_stays_minus_inf():
    # TOPI starts the window at the lowest finite value: -3.4e38 instead of -inf.
    x = np.full((1, 1, 4, 4), -np.inf, F32)
    data = te.placeholder(x.shape, F32, name="x")
    (got,) = build_and_run([data], [ops.max_pool(data, pool_size=(2, 2), strides=(2, 2))], [x])
    assert np.isneginf(got).all()


@pytest.mark.parametrize("size, kernel, stride, pad", [(2, 1, 2, 0), (5, 2, 2, 1), (6, 3, 2, 1), (7, 3, 3, 0)])
def test_max_pool_ceil_mode_has_no_window_starting_in_the_right_padding(size, kernel, stride, pad):
    # ONNX's test_maxpool_2d_ceil_output_size_reduce_by_one (2x2, 1x1 window, stride 2) is 1x1, not 2x2:
    # rounding up adds a window only if it starts inside the input or the left padding (as Relax infers).
    x = np.random.default_rng(0).standard_normal((1, 2, size, size)).astype(F32)
    data = te.placeholder(x.shape, F32, name="x")
    pooled = ops.max_pool(data, pool_size=(kernel, kernel), strides=(stride, stride), padding=(pad,) * 4,
                          ceil_mode=True)
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(x), kernel, stride, pad, ceil_mode=True).numpy()
    (got,) = build_and_run([data], [pooled], [x])
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_fast_math_is_exact_on_finite_inputs(name):
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 9)).astype(F32) * 4
    fn, reference = UNARY[name]
    data = te.placeholder(x.shape, F32, name="x")
    (got,) = build_and_run([data], [fn(data, True)], [x])
    np.testing.assert_allclose(got, reference(torch.from_numpy(x)).numpy(), rtol=0, atol=0)


def test_fast_math_selects_tvm_max_and_the_default_does_not():
    data = te.placeholder((8,), F32, name="x")
    ieee = te.create_prim_func([data, ops.relu(data)]).script()
    fast = te.create_prim_func([data, ops.relu(data, fast_math=True)]).script()
    assert "T.max(" in fast and "T.max(" not in ieee and "T.Select(" in ieee


def test_nan_propagating_maximum_stays_vectorized():
    """``tirx.isnan`` would scalarise the loop (TVM cannot vectorize it); the bit test does not."""
    n = 256
    lhs, rhs = te.placeholder((n,), F32, name="x"), te.placeholder((n,), F32, name="y")
    out = ops.maximum(lhs, rhs)
    sch = tvm.s_tir.Schedule(te.create_prim_func([lhs, rhs, out]))
    (loop,) = sch.get_loops(sch.get_sblock(out.op.name))
    sch.vectorize(sch.split(loop, [None, 8])[1])
    lib = tvm.compile(sch.mod, target=host_target())
    llvm_ir = lib.mod.inspect_source("ll")
    assert re.search(r"select <\d+ x i1> .*<\d+ x float>", llvm_ir), "the max is no longer vectorized"
    x, y = special_input((n,)), special_input((n,), seed=2)
    z = tvm.runtime.tensor(np.zeros(n, F32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(y), z)
    assert_same_specials(z.numpy(), np.maximum(x, y))


# --------------------------------------------------- epilogues (strategy path) and fallbacks
class ConvThen(torch.nn.Module):
    """A convolution (taken by a strategy) followed by ``activation``."""

    def __init__(self, activation: str):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 16, 3, padding=1)
        self.activation = activation

    def forward(self, x, y):
        z = self.conv(x)
        if self.activation == "relu":
            return torch.relu(z)
        if self.activation == "relu6":
            return torch.nn.functional.relu6(z)
        if self.activation == "clamp":
            return torch.clamp(z, -0.5, 0.75)
        if self.activation == "maximum":
            return torch.maximum(z, y)
        return torch.minimum(torch.relu(z), y)


def _run(module: torch.nn.Module, inputs: list[np.ndarray], **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback report
        compiled = build(module.eval(), example_inputs=[torch.from_numpy(a) for a in inputs], **options)
    with torch.no_grad():
        reference = module(*[torch.from_numpy(a) for a in inputs]).numpy()
    return compiled, compiled(*inputs)[0], reference


def _conv_inputs() -> list[np.ndarray]:
    x = np.random.default_rng(0).standard_normal((1, 4, 12, 12)).astype(F32)
    x[0, 0, 2, 2], x[0, 1, 6, 6], x[0, 2, 9, 3] = np.nan, np.inf, -np.inf
    x[0, 3, 10, 10] = 1e38  # with a 3x3 conv: products overflow to +-inf, and inf - inf is NaN
    return [x, special_input((1, 16, 12, 12), seed=4)]


@pytest.mark.parametrize("activation", ["relu", "relu6", "clamp", "maximum", "relu_minimum"])
def test_epilogue_propagates_nan_and_inf(activation):
    compiled, got, reference = _run(ConvThen(activation), _conv_inputs())
    (_, anchor, fused), = compiled.report.partitions
    assert anchor == "relax.nn.conv2d" and len(fused) > 2, "the activation is not in the conv's epilogue"
    assert np.isnan(reference).any()
    assert_same_specials(got, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["relu", "relu6", "clamp", "maximum", "relu_minimum"])
def test_unfused_epilogue_ops_propagate_nan_through_the_fallback(activation):
    # ALT-WP fuses no epilogue: the activations go through lower_fallbacks' legalization.
    compiled, got, reference = _run(ConvThen(activation), _conv_inputs(), variant="alt-wp")
    assert compiled.report.fallbacks, "no op went through the fallback legalization"
    assert_same_specials(got, reference, rtol=1e-4, atol=1e-4)


class NoStrategy(torch.nn.Module):
    """Ops no strategy implements: all legalized by ``lower_fallbacks``."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, x, y):
        f = torch.nn.functional
        return {
            "relu": lambda: torch.relu(x),
            "relu6": lambda: f.relu6(x),
            "clamp": lambda: torch.clamp(x, min=-0.5),
            "maximum": lambda: torch.maximum(x, y),
            "minimum": lambda: torch.minimum(x, y),
            "max_pool": lambda: f.max_pool2d(x, 3, 2, 1),
            "max_pool_ceil": lambda: f.max_pool2d(x, 2, 2, ceil_mode=True),
            "max_pool_dilated": lambda: f.max_pool2d(x, 2, 1, dilation=2),
            "max_pool1d": lambda: f.max_pool1d(x.flatten(2), 4, 3, 1),
            "max_pool3d": lambda: f.max_pool3d(x.unsqueeze(2), (1, 3, 3), 2, (0, 1, 1)),
        }[self.op]()


@pytest.mark.parametrize("op", ["relu", "relu6", "clamp", "maximum", "minimum", "max_pool", "max_pool_ceil",
                                "max_pool_dilated", "max_pool1d", "max_pool3d"])
def test_fallback_legalization_propagates_nan_and_inf(op):
    inputs = [special_input((1, 3, 9, 9)), special_input((1, 3, 9, 9), seed=5)]
    compiled, got, reference = _run(NoStrategy(op), inputs)
    assert not compiled.report.partitions and compiled.report.fallbacks
    assert np.isnan(reference).any()
    assert_same_specials(got, reference)


@pytest.mark.parametrize(("op", "axis", "keepdims"), [("max", [2, 3], False), ("min", [1], True),
                                                      ("max", None, False)])
def test_fallback_reductions_propagate_nan_and_inf(op, axis, keepdims):
    # TVM's PyTorch frontend does not import amax/amin: the Relax ops directly (ONNX ReduceMax).
    x = special_input((2, 3, 9, 9))
    x[1, 2] = -np.inf
    bb = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType(x.shape, F32))
    with bb.function("main", [data]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, op)(data, axis=axis, keepdims=keepdims))
        bb.emit_func_output(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = build(bb.get())
    assert f"relax.{op}" in compiled.report.fallbacks
    reference = getattr(np, op)(x, axis=None if axis is None else tuple(axis), keepdims=keepdims)
    assert_same_specials(compiled(x)[0], np.asarray(reference))


def test_fast_math_drops_the_nan_overrides_and_keeps_the_vectorised_gelu():
    assert set(legalize_overrides(fast_math=True)) == {"relax.nn.gelu", "relax.nn.gelu_tanh"}
    assert {"relax.nn.relu", "relax.clip", "relax.maximum", "relax.nn.max_pool2d", "relax.max"} <= set(
        legalize_overrides())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_a_standalone_gelu_is_a_polynomial_not_a_libm_call_per_element(approximate):
    """TVM legalizes GELU with ``erf`` (libm's erff per element, not vectorised); the
    fallback uses the epilogues' TE instead, within float32 rounding of PyTorch's."""
    x = torch.randn(1, 4, 64) * 3
    compiled = build(_GeluOnly(approximate).eval(), example_inputs=[x])
    scripts = [compiled.mod[g].script() for g in compiled.mod.get_global_vars()
               if isinstance(compiled.mod[g], tvm.tirx.PrimFunc)]
    assert scripts and not any("T.erf(" in s or "T.tanh(" in s for s in scripts), scripts
    reference = torch.nn.functional.gelu(x, approximate=approximate).numpy()
    np.testing.assert_allclose(compiled(x.numpy())[0], reference, rtol=1e-5, atol=1e-6)


class _GeluOnly(torch.nn.Module):
    def __init__(self, approximate: str):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate=self.approximate)


@pytest.mark.parametrize("module", [ConvThen("relu6"), NoStrategy("max_pool")], ids=["epilogue", "fallback"])
def test_fast_math_build_is_accepted_and_correct_on_finite_inputs(module):
    inputs = [np.random.default_rng(7).standard_normal(shape).astype(F32) * 3
              for shape in ([(1, 4, 12, 12), (1, 16, 12, 12)] if isinstance(module, ConvThen)
                            else [(1, 3, 9, 9), (1, 3, 9, 9)])]
    _, got, reference = _run(module, inputs, fast_math=True)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------ reference models vs ONNX Runtime
# Build time per model on 2 cores: small_cnn about 5 s, the others 15-45 s (so only small_cnn is fast).
MODEL_OPTIONS = {"small_cnn": {}, "resnet18": {"size": 32}, "mobilenet_v2": {"size": 32},
                 "resnet3d_18": {"frames": 2, "size": 16}}
FAST_MODELS = ("small_cnn",)
INPUTS = ("one_nan", "1e38", "-1e38", "inf", "some_huge")


def _model_input(x: np.ndarray, kind: str) -> np.ndarray:
    x = x.copy()
    flat = x.reshape(-1)
    if kind == "one_nan":
        flat[flat.size // 3] = np.nan
    elif kind == "some_huge":
        flat[:: max(1, flat.size // 7)] = 1e38
    else:
        flat[:] = float(kind)
    return x


@pytest.fixture(scope="module")
def built_models(tmp_path_factory):
    cache = {}

    def get(name: str, fast_math: bool = False):
        if (name, fast_math) not in cache:
            options = MODEL_OPTIONS[name]
            path = export_onnx(name, tmp_path_factory.mktemp("onnx") / f"{name}.onnx", **options)
            _, inputs = get_model(name, **options)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled = build(str(path), fast_math=fast_math)
            cache[name, fast_math] = (compiled, onnxruntime_session(str(path), threads=1), inputs[0].numpy())
        return cache[name, fast_math]

    return get


def _check_model(name: str, kind: str, built_models) -> None:
    compiled, ort, x = built_models(name)
    data = _model_input(x, kind)
    reference = ort(data)[0]
    # Outputs of 1e38-scaled inputs reach 1e37: absolute rounding differences scale with them.
    scale = max(1.0, float(np.abs(reference[np.isfinite(reference)]).max(initial=0.0)))
    assert_same_specials(compiled(data)[0], reference, rtol=MODELS[name].rtol, atol=MODELS[name].atol * scale)


@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("name", FAST_MODELS)
def test_reference_model_keeps_nan_and_inf_where_onnxruntime_does(name, kind, built_models):
    _check_model(name, kind, built_models)


@pytest.mark.slow
@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("name", sorted(set(MODEL_OPTIONS) - set(FAST_MODELS)))
def test_larger_reference_model_keeps_nan_and_inf_where_onnxruntime_does(name, kind, built_models):
    _check_model(name, kind, built_models)


def test_small_cnn_with_fast_math_matches_onnxruntime_on_finite_inputs(built_models):
    compiled, ort, x = built_models("small_cnn", fast_math=True)
    np.testing.assert_allclose(compiled(x)[0], ort(x)[0], rtol=MODELS["small_cnn"].rtol,
                               atol=MODELS["small_cnn"].atol)


@pytest.mark.parametrize("kernel,stride,dilation,ceil", [((2, 2), 2, 1, True), ((3, 3), 1, 2, False),
                                                          ((3, 3), 2, 1, True), ((7, 7), 1, 1, False)],
                         ids=["2x2_ceil", "3x3_dilated", "3x3_s2_ceil", "7x7_reduction"])
def test_max_pool_unrolled_and_reduced_windows_match_pytorch_with_nan_and_inf(kernel, stride, dilation, ceil):
    """Windows up to UNROLLED_TAPS taps are one expression (max and a NaN test over the taps),
    larger ones a reduction: both give PyTorch's result on NaN, +inf and -inf."""
    from alt_tvm.ops.reduce import UNROLLED_TAPS

    unrolled = kernel[0] * kernel[1] <= UNROLLED_TAPS
    x = np.random.default_rng(3).standard_normal((1, 3, 13, 13)).astype("float32")
    x[0, 0, 4, 4], x[0, 1, 0, 0], x[0, 2, 6:9, 6:9], x[0, 2, 12, 12] = np.nan, np.inf, -np.inf, np.nan
    pad = (kernel[0] // 2) * dilation // 2
    data = te.placeholder(x.shape, F32, name="x")
    out = ops.max_pool(data, pool_size=kernel, strides=stride, dilation=dilation, padding=pad, ceil_mode=ceil)
    assert (len(out.op.reduce_axis) == 0) == unrolled
    (got,) = build_and_run([data], [out], [x])
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), kernel, stride, pad, dilation, ceil).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got).any() and np.isinf(got).any()


def test_max_of_is_nan_if_any_value_is_and_linear_in_the_values():
    """Each value appears twice in the expression (a chain of select steps repeats each partial
    max, doubling per value: 27 chained taps did not compile in 10 minutes)."""
    values = [te.placeholder((16,), F32, name=f"v{k}") for k in range(27)]
    out = te.compute((16,), lambda i: ieee.max_of([v(i) for v in values]), name="m")
    body = te.create_prim_func([*values, out]).script().split("m[v_i] = ")[-1]
    assert body.count("v13[v_i]") == 2, body
    arrays = [np.full(16, k, F32) for k in range(27)]
    arrays[5][3], arrays[20][7], arrays[0][9] = np.nan, np.inf, -np.inf
    (got,) = build_and_run(values, [out], arrays)
    want = np.max(np.stack(arrays), axis=0)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="at least one"):
        ieee.max_of([])
