"""Vectorisable exp / sigmoid / tanh / erf (and the GELUs built on them) against PyTorch."""

import numpy as np
import pytest
import torch
import tvm
from conftest import host_target
from tvm import te

from alt_tvm.ops import elementwise

X = np.concatenate([np.linspace(-100, 100, 20001), np.random.default_rng(0).standard_normal(4096) * 4,
                    [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7, 88.73, -87.3, -87.4, 1e-6]]).astype("float32")

CASES = {
    "exp": (lambda a: elementwise._unary(a, elementwise.exp_expr, "exp"), torch.exp),
    "sigmoid": (elementwise.sigmoid, torch.sigmoid),
    "tanh": (elementwise.tanh, torch.tanh),
    "erf": (lambda a: elementwise._unary(a, elementwise.erf_expr, "erf"), torch.erf),
    # float64: PyTorch's float32 AVX-512 GELU returns NaN for +inf (its scalar path and the
    # definition x * Phi(x) give +inf), so the reference is taken from the double path.
    "gelu": (elementwise.erf_gelu, lambda t: torch.nn.functional.gelu(t.double()).float()),
    "gelu_tanh": (elementwise.tanh_gelu, lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_math_matches_torch_with_nan_and_inf(name):
    make, reference = CASES[name]
    a = te.placeholder(X.shape, name="a")
    out = make(a)
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, out]))
    loop = sch.get_loops(sch.get_sblock(out.op.name))[0]
    sch.vectorize(sch.split(loop, [None, 8])[1])
    script = sch.mod.script()
    assert "T.exp(" not in script and "T.erf(" not in script and "T.tanh(" not in script  # no libm call per lane
    module = tvm.compile(sch.mod, target=host_target()).jit()
    got = tvm.runtime.tensor(np.zeros_like(X))
    module["main"](tvm.runtime.tensor(X), got)
    got, ref = got.numpy(), reference(torch.from_numpy(X)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-6, atol=2e-6)


def test_exp_rounds_by_an_addition_not_a_floor_and_conversion():
    """``n = round(x / ln2)`` comes from adding 1.5 * 2^23, whose bits also give ``2^n``: no
    ``floor``, and no float-to-int conversion (undefined in LLVM for the NaN that the clamp
    lets through). Two vector instructions fewer per exponential."""
    a = te.placeholder((16,), name="a")
    for make in (elementwise.sigmoid, elementwise.tanh, lambda t: elementwise._unary(t, elementwise.exp_expr, "exp")):
        script = te.create_prim_func([a, make(a)]).script()
        assert "T.floor" not in script and 'T.Cast("int32"' not in script
        assert "12582912" in script
