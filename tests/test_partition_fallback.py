"""A partition its strategy cannot lower falls back to TVM's legalization; the build goes on.

The failing case is real: a batched matmul with ViT-B/16's odd sequence length (197) makes
the ALT GEMM schedule's ``vectorize`` fail, while 196 lowers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import alt_tvm


class TwoMatmuls(torch.nn.Module):
    """Attention scores of two sequence lengths: 197 (the ALT schedule fails) and 196 (it lowers)."""

    def forward(self, q, k, q2, k2):
        return torch.matmul(q, k), torch.relu(torch.matmul(q2, k2))


def test_a_failing_partition_falls_back_and_the_others_still_use_their_strategy():
    gen = torch.Generator().manual_seed(0)
    inputs = (torch.randn(1, 2, 197, 64, generator=gen), torch.randn(1, 2, 64, 197, generator=gen),
              torch.randn(1, 2, 196, 64, generator=gen), torch.randn(1, 2, 64, 196, generator=gen))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = alt_tvm.build(TwoMatmuls().eval(), example_inputs=inputs)
    report = built.report
    (key,) = report.failed
    assert key.startswith("matmul|(1, 2, 197, 64)")
    assert "strategy 'alt' failed" in report.failed[key] and "vectorize" in report.failed[key]
    assert [(strategy, ops) for strategy, _, ops in report.partitions] == [("alt", ["relax.matmul", "relax.nn.relu"])]
    assert key not in report.workloads and len(report.workloads) == 1
    assert any("fell back to TVM's legalization: relax.matmul (strategy 'alt' failed" in str(w.message)
               for w in caught)
    got = built(*(x.numpy() for x in inputs))
    want = TwoMatmuls()(*inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)


def test_strict_builds_re_raise_the_strategy_failure():
    q, k = torch.randn(1, 2, 197, 64), torch.randn(1, 2, 64, 197)

    class Scores(torch.nn.Module):
        def forward(self, q, k):
            return torch.matmul(q, k)

    with pytest.raises(Exception, match="vectorize"):
        alt_tvm.build(Scores().eval(), example_inputs=(q, k), strict=True)
    with pytest.raises(TypeError, match="strict must be a bool"):
        alt_tvm.build(Scores().eval(), example_inputs=(q, k), strict="yes")
