"""The ``tt_einsum`` build strategy: dense layers rewritten into TT chains on request."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_messages

import alt_tvm
from alt_tvm.strategies.tt.decompose import decompose, reconstruct
from alt_tvm.strategies.tt.dse import dense_flops, solutions
from alt_tvm.strategies.tt.strategy import TTBudgetError, TTLayerRequest, TTOptions, plan_layer

N, M, B = 512, 256, 4
#: The TT shape the test weight is built from: DSE solution #2 of 512x256 (sorted by FLOPs).
INS, OUTS, RANKS = (2, 2, 128), (64, 2, 2), (1, 8, 8, 1)


def _weight() -> np.ndarray:
    # Low TT rank plus a little noise: TT-SVD recovers it to ~4% relative error, while the
    # cheapest DSE solution (another factorisation) cannot; random weights would not factorise.
    rng = np.random.default_rng(7)
    cores = [rng.standard_normal((RANKS[t], INS[t], OUTS[t], RANKS[t + 1])) for t in range(3)]
    w = reconstruct(cores)
    w = 10 * w / np.linalg.norm(w) + 1e-3 * rng.standard_normal(w.shape)
    return w.astype(np.float32)


WEIGHT = _weight()
X = np.random.default_rng(8).standard_normal((B, N)).astype(np.float32)


def _model(*, bias: bool = True, relu: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    linear = torch.nn.Linear(N, M, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(WEIGHT))
    layers = [linear, torch.nn.ReLU()] if relu else [linear]
    return torch.nn.Sequential(*layers).eval()


def _build(model: torch.nn.Module, *, strategies=("tt_einsum", "alt"), options=None):
    kwargs = {} if options is None else {"strategy_options": {"tt_einsum": options}}
    return alt_tvm.build(model, example_inputs=(torch.from_numpy(X),), strategies=list(strategies), **kwargs)


def _dense(model: torch.nn.Module, weight: np.ndarray) -> np.ndarray:
    bias = model[0].bias.detach().numpy() if model[0].bias is not None else 0.0
    return X.astype(np.float64) @ weight.T.astype(np.float64) + bias


@pytest.fixture(scope="module")
def budget_build():
    model = _model()
    request = TTLayerRequest(max_error=0.1)
    return model, request, _build(model, options=TTOptions(default=request))


# --------------------------------------------------------------------------- planning


def test_budget_picks_the_cheapest_solution_within_the_error():
    request = TTLayerRequest(max_error=0.1)
    solution, dec = plan_layer(WEIGHT, request=request)
    assert (solution.in_factors, solution.out_factors, solution.ranks) == (INS, OUTS, RANKS)
    assert dec.rel_error <= 0.1 and solution.flops < dense_flops(N, M)
    cheaper = [s for s in solutions(N, M)[:request.candidates] if s.flops < solution.flops]
    assert cheaper and all(decompose(WEIGHT, solution=s).rel_error > 0.1 for s in cheaper)


def test_unmet_budget_names_the_best_error():
    with pytest.raises(TTBudgetError, match=r"best relative error 0\.\d+") as err:
        plan_layer(WEIGHT, request=TTLayerRequest(max_error=1e-4, candidates=2))
    assert err.value.best_error > 1e-4


# --------------------------------------------------------------------------- builds


def test_requested_layer_becomes_the_tt_chain(budget_build):
    model, request, compiled = budget_build
    assert compiled.report.partitions == [("tt_einsum", "relax.matmul", ["relax.matmul", "relax.add"])]
    _, dec = plan_layer(WEIGHT, request=request)
    y = compiled(X)[0]
    # Exactly the TT-reconstructed dense layer (bias fused) ...
    np.testing.assert_allclose(y, _dense(model, reconstruct(dec.cores)), rtol=1e-4, atol=1e-4)
    # ... and the original one up to the reported weight error.
    dense = _dense(model, WEIGHT)
    out_error = np.linalg.norm(y - dense) / np.linalg.norm(dense)
    assert out_error < 2 * dec.rel_error


def test_off_by_default():
    compiled = _build(_model())
    assert [p[0] for p in compiled.report.partitions] == ["alt"]
    np.testing.assert_allclose(compiled(X)[0], _dense(_model(), WEIGHT), rtol=1e-4, atol=1e-4)


def test_fixed_solution_without_bias():
    request = TTLayerRequest(in_factors=(2, 256), out_factors=(128, 2), ranks=(1, 8, 1))
    model = _model(bias=False)
    compiled = _build(model, options=TTOptions(layers={f"{N}x{M}": request}))
    assert compiled.report.partitions == [("tt_einsum", "relax.matmul", ["relax.matmul"])]
    solution, dec = plan_layer(WEIGHT, request=request)
    assert (solution.in_factors, solution.ranks) == ((2, 256), (1, 8, 1))
    np.testing.assert_allclose(compiled(X)[0], _dense(model, reconstruct(dec.cores)), rtol=1e-4, atol=1e-4)


def test_impossible_budget_is_reported_as_the_fallback_reason():
    options = TTOptions(layers={"*": TTLayerRequest(max_error=1e-4, candidates=2)})
    with build_messages() as messages:
        compiled = _build(_model(), strategies=["tt_einsum"], options=options)
    assert any("fell back" in m for m in messages)
    reasons = compiled.report.fallbacks["relax.matmul"]
    assert any(r.startswith("tt_einsum: none of the 2 cheapest") and "best relative error" in r for r in reasons)
    assert compiled.report.partitions == []


FIXED = TTLayerRequest(in_factors=INS, out_factors=OUTS, ranks=RANKS)


def _tt_dense(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """The layer with the TT-reconstructed weight, in float64."""
    _, dec = plan_layer(WEIGHT, request=FIXED)
    return x.astype(np.float64) @ reconstruct(dec.cores).T.astype(np.float64) + model[0].bias.detach().numpy()


def test_relu_epilogue_runs_after_the_chain():
    model = _model(relu=True)
    compiled = _build(model, options=TTOptions(default=FIXED))
    (strategy, anchor, ops), = compiled.report.partitions
    assert (strategy, anchor) == ("tt_einsum", "relax.matmul") and "relax.nn.relu" in ops
    y = compiled(X)[0]
    ref = np.maximum(_tt_dense(model, X), 0.0)
    assert (ref == 0).any() and (ref > 0).any()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


class _Residual(torch.nn.Module):
    """``relu(Linear(x)) + x``: an epilogue whose extra input is the activation itself."""

    def __init__(self, weight: np.ndarray) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


def test_residual_epilogue_reads_the_activation():
    w = WEIGHT[:, :M]  # [256, 256]
    request = TTLayerRequest(in_factors=(16, 16), out_factors=(16, 16), ranks=(1, 8, 1))
    model = _Residual(w).eval()
    x = X[:, :M].copy()
    compiled = alt_tvm.build(model, example_inputs=(torch.from_numpy(x),), strategies=["tt_einsum", "alt"],
                             strategy_options={"tt_einsum": TTOptions(layers={f"{M}x{M}": request})})
    assert compiled.report.partitions == [
        ("tt_einsum", "relax.matmul", ["relax.matmul", "relax.add", "relax.nn.relu", "relax.add"])]
    _, dec = plan_layer(w, request=request)
    ref = np.maximum(x.astype(np.float64) @ reconstruct(dec.cores).T + model.linear.bias.detach().numpy(), 0) + x
    np.testing.assert_allclose(compiled(x)[0], ref, rtol=1e-4, atol=1e-4)


def test_rank3_activation():
    # torch.export flattens [B, S, N] @ W.T into a 2-D matmul between reshapes; the rank-3
    # read of the chain itself is tested in test_tt_einsum.py (build_chain input_shape).
    x3 = np.random.default_rng(9).standard_normal((2, 3, N)).astype(np.float32)
    model = _model()
    compiled = alt_tvm.build(model, example_inputs=(torch.from_numpy(x3),), strategies=["tt_einsum", "alt"],
                             strategy_options={"tt_einsum": TTOptions(layers={f"{N}x{M}": FIXED})})
    assert [p[0] for p in compiled.report.partitions] == ["tt_einsum"]
    y = compiled(x3)[0]
    assert y.shape == (2, 3, M)
    np.testing.assert_allclose(y, _tt_dense(model, x3.reshape(-1, N)).reshape(2, 3, M), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "needs max_error or a fixed solution"),
    ({"max_error": 1.5}, r"max_error must be a number in \[0, 1\]"),
    ({"max_error": True}, r"max_error must be a number in \[0, 1\]"),
    ({"in_factors": (2, 256), "ranks": (1, 8, 1)}, "needs all of in_factors, out_factors and ranks"),
    ({"in_factors": (2, 256), "out_factors": (256,), "ranks": (1, 8, 1)}, "need equal length d >= 2"),
    ({"in_factors": (2, 256), "out_factors": (128, 2), "ranks": (1, 8)}, r"ranks must be \(1, r_1"),
    ({"in_factors": (1, 512), "out_factors": (128, 2), "ranks": (1, 8, 1)}, "in_factors must be integers >= 2"),
    ({"max_error": 0.1, "candidates": 0}, "candidates must be an integer >= 1"),
])
def test_bad_requests_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TTLayerRequest(**kwargs)


def test_bad_options_are_rejected():
    request = TTLayerRequest(max_error=0.1)
    with pytest.raises(ValueError, match="layer key '512-256' must be 'NxM'"):
        TTOptions(layers={"512-256": request})
    with pytest.raises(ValueError, match=r"layers\['\*'\] must be a TTLayerRequest, got dict"):
        TTOptions(layers={"*": {"max_error": 0.1}})
    with pytest.raises(ValueError, match="either default or a '\\*' layer entry"):
        TTOptions(layers={"*": request}, default=request)
    with pytest.raises(ValueError, match=r"strategy_options\['tt_einsum'\] must be a TTOptions, got dict"):
        _build(_model(), options={"max_error": 0.1})
    # A request naming this layer whose factors do not fit it is a mistake, not a fallback.
    wrong = TTLayerRequest(in_factors=(2, 128), out_factors=(128, 2), ranks=(1, 8, 1))
    with pytest.raises(ValueError, match=r"layers\['512x256'\]: in_factors \(2, 128\) multiply to 256"):
        _build(_model(), options=TTOptions(layers={"512x256": wrong}))


def test_layer_lookup_prefers_the_exact_shape():
    exact, other = TTLayerRequest(max_error=0.1), TTLayerRequest(max_error=0.2)
    options = TTOptions(layers={"512x256": exact, "*": other})
    assert options.request_for(512, 256) is exact and options.request_for(256, 512) is other
    assert TTOptions(layers={"512x256": exact}).request_for(256, 512) is None
