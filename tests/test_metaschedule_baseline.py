"""The MetaSchedule baseline used by the benchmarks: it must build candidates and be right."""

import numpy as np
import pytest
import tvm
from tvm import te

from alt_tvm.graph.metaschedule import build_candidate, tune_kernel
from alt_tvm.target import host


def _matmul(n=32):
    a = te.placeholder((n, n), name="a")
    b = te.placeholder((n, n), name="b")
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    return te.create_prim_func([a, b, c])


def _run(lib, n=32):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    out = tvm.runtime.tensor(np.zeros((n, n), "float32"))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y), out)
    return out.numpy(), x @ y


def test_candidate_builder_compiles_a_kernel_without_the_intrinsic_import():
    lib = build_candidate(tvm.IRModule({"main": _matmul()}), host().to_tvm(), None)
    got, want = _run(lib)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bad_budget_is_refused_before_any_work():
    with pytest.raises(ValueError, match="trials must be a positive int, got 0"):
        tune_kernel(_matmul(), target=host().to_tvm(), trials=0)


@pytest.mark.slow
def test_metaschedule_tunes_a_kernel_and_the_schedule_is_correct():
    target = host().to_tvm()
    result = tune_kernel(_matmul(), target=target, trials=4, per_iter=4)
    assert result.artifact is not None and result.tune_s > 0
    got, want = _run(tvm.compile(result.artifact, target=target))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
