"""One graph, one workload key, whatever route a model takes into alt-tvm.

The rules of :mod:`alt_tvm.graph.canonical` are checked on small torch modules (the rewrite
fires, the built model still matches PyTorch / ONNX Runtime, and values with other users are
left alone); then the property users rely on: a log written while tuning a model given one
way (a reference model by name, i.e. its torch module; its ONNX export with BatchNorm kept;
an ONNX export with BatchNorm folded by the exporter) applies fully to a build of the same
model given any other way. Tuning there uses a fake measure (the bookkeeping is under test,
not the timings).
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import build_messages, torch_to_onnx

import alt_tvm
from alt_tvm.graph.frontend import load_model
from alt_tvm.graph.prepare import prepare
from alt_tvm.integration import extract_tasks, tune
from alt_tvm.models import export_onnx, get_model
from alt_tvm.records import candidate_key


def ops_of(mod) -> list[str]:
    return [str(b.value.op.name) for block in mod["main"].body.blocks for b in block.bindings
            if hasattr(b.value, "op") and hasattr(b.value.op, "name")]


def canonical_ops(model, inputs) -> list[str]:
    return ops_of(prepare(load_model(model, example_inputs=inputs).mod))


def build_quietly(model, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return alt_tvm.build(model, **options)


def ort_run(path, inputs):
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, [x.numpy() for x in inputs])))


class ConvBN(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=bias)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():  # non-trivial statistics, so a wrong fold shows
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        return torch.nn.functional.relu6(self.bn(self.conv(x)))


@pytest.mark.parametrize("bias", [False, True])
def test_batchnorm_folds_into_the_convolution_and_the_result_is_unchanged(bias):
    torch.manual_seed(0)
    model, x = ConvBN(bias).eval(), torch.randn(1, 4, 16, 16)
    assert canonical_ops(model, (x,)) == ["relax.nn.conv2d", "relax.add", "relax.clip"]
    built = build_quietly(model, example_inputs=(x,))
    (out,) = built(x.numpy())
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    assert built.report.partitions[0][2] == ["relax.nn.conv2d", "relax.add", "relax.clip"]


class TwoUsers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        return y * 2.0 + 1.0, y  # y is also an output: the scale must not be folded into the conv


def test_a_value_with_other_users_is_not_folded():
    torch.manual_seed(0)
    model, x = TwoUsers().eval(), torch.randn(1, 3, 8, 8)
    assert "relax.multiply" in canonical_ops(model, (x,))
    out = build_quietly(model, example_inputs=(x,))(x.numpy())
    for got, want in zip(out, model(x)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-5)


class LinearGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


def test_torch_linear_and_onnx_gelu_become_one_matmul_partition(tmp_path):
    torch.manual_seed(0)
    model, x = LinearGelu().eval(), torch.randn(1, 8, 16)
    # torch.export flattens (1, 8, 16) to (8, 16) around the matmul; the reshapes are dropped
    assert canonical_ops(model, (x,)) == ["relax.matmul", "relax.add", "relax.nn.gelu"]
    path = tmp_path / "linear_gelu.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)  # GELU as erf
    assert canonical_ops(str(path), None) == ["relax.matmul", "relax.add", "relax.nn.gelu"]
    keys = {tuple(t.key for t in extract_tasks(m, example_inputs=i)) for m, i in ((model, (x,)), (str(path), None))}
    assert len(keys) == 1
    want = ort_run(path, [x])[0]
    for source, inputs in ((model, (x,)), (str(path), None)):
        (out,) = build_quietly(source, example_inputs=inputs)(x.numpy())
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


class MergesRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 4))

    def forward(self, x):  # (2, 8, 16) -> (8, 32): the reshape mixes rows, it is not a batch flatten
        return (x.reshape(8, 32)[:, :16] @ self.w).reshape(2, 4, 4)


def test_a_reshape_that_is_not_a_batch_flatten_stays():
    torch.manual_seed(0)
    model, x = MergesRows().eval(), torch.randn(2, 8, 16)
    assert "relax.reshape" in canonical_ops(model, (x,))
    (out,) = build_quietly(model, example_inputs=(x,))(x.numpy())
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


class SequenceFirstAttention(torch.nn.Module):
    """torchvision's encoder block: ``nn.MultiheadAttention`` works sequence first inside, so
    its output projection is ``(L, 1, E)``, transposed back before the residual add."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(32, 2, batch_first=True)
        with torch.no_grad():  # a zero bias is dropped by the dynamo exporter
            self.attn.out_proj.bias.uniform_(-1, 1)

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=False)
        return y + x


@pytest.mark.parametrize("dynamo", [False, True])
def test_the_residual_after_a_sequence_first_projection_joins_its_matmul(dynamo, tmp_path):
    torch.manual_seed(0)
    model, x = SequenceFirstAttention().eval(), torch.randn(1, 10, 32)
    path = tmp_path / "attention.onnx"
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    built = build_quietly(str(path))
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-5, atol=1e-5)
    (projection,) = [k.ops for k in built.report.kernels if k.ops[-1] == "relax.add" and len(k.ops) == 3]
    assert projection == ("relax.matmul", "relax.add", "relax.add")  # bias, then the residual


class TransposedSquare(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, r):  # (4, 4) -> (1, 4, 4) transposed: a view that changes the memory order
        return self.fc(x).reshape(1, 4, 4).transpose(1, 2) + r


def test_a_view_that_moves_a_non_unit_axis_stays():
    torch.manual_seed(0)
    model, x, r = TransposedSquare().eval(), torch.randn(4, 4), torch.randn(1, 4, 4)
    assert "relax.permute_dims" in canonical_ops(model, (x, r))
    (out,) = build_quietly(model, example_inputs=(x, r))(x.numpy(), r.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(out, model(x, r).numpy(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- routes into alt-tvm


def routes(name: str, tmp_path) -> dict[str, tuple]:
    """The ways a user hands the reference model ``name`` to alt-tvm: (model, example_inputs)."""
    module, inputs = get_model(name)
    kept = export_onnx(name, tmp_path / f"{name}_bn.onnx")
    folded = export_onnx(name, tmp_path / f"{name}_folded.onnx", fold_batchnorm=True)
    return {"name": (module, inputs), "onnx": (str(kept), None), "onnx-bn-folded": (str(folded), None)}


def keys_by_route(name, tmp_path) -> dict[str, list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {route: [t.key for t in extract_tasks(m, example_inputs=i)]
                for route, (m, i) in routes(name, tmp_path).items()}


@pytest.mark.parametrize("name", ["small_cnn", "bert_tiny",
                                  pytest.param("mobilenet_v2", marks=pytest.mark.slow),
                                  pytest.param("resnet18", marks=pytest.mark.slow)])
def test_every_route_gives_the_same_workload_keys(name, tmp_path):
    keys = keys_by_route(name, tmp_path)
    assert all(k for k in keys.values())
    assert len({tuple(k) for k in keys.values()}) == 1, keys


def fake_measure(task, params) -> float:
    """A deterministic 'latency' per candidate (the bookkeeping is under test, not timings)."""
    return 1.0 + zlib.crc32(candidate_key(params).encode()) % 1000 / 1000


@pytest.mark.parametrize("tuned_by, built_by", [("name", "onnx"), ("onnx", "onnx-bn-folded"),
                                                ("onnx-bn-folded", "name")])
def test_a_log_tuned_by_one_route_applies_fully_to_a_build_by_another(tuned_by, built_by, tmp_path):
    given = routes("small_cnn", tmp_path)
    log = tmp_path / "tune.jsonl"
    model, inputs = given[tuned_by]
    tune(model, verify=False, example_inputs=inputs, trials=14, log=log, measure=fake_measure, cost_model=None,
         features="knobs", progress=False, revalidate=0)
    model, inputs = given[built_by]
    with build_messages() as messages:
        built = alt_tvm.build(model, example_inputs=inputs, records=log)
    report = built.report
    assert report.untuned == [] and report.tuned == 7, report.tuning_summary()
    assert report.tuning_summary().startswith(f"7 of 7 tunable partitions tuned from {log}")
    assert not [m for m in messages if "untuned" in m]
    module, x = given["name"]
    (out,) = built(x[0].numpy())
    np.testing.assert_allclose(out, module(*x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_resuming_with_another_route_measures_nothing_again(tmp_path):
    given = routes("small_cnn", tmp_path)
    log = tmp_path / "tune.jsonl"
    options = {"trials": 14, "log": log, "cost_model": None, "features": "knobs", "progress": False,
               "revalidate": 0}
    module, inputs = given["name"]
    tune(module, verify=False, example_inputs=inputs, measure=fake_measure, **options)
    calls = []

    def counting(task, params):
        calls.append(task.key)
        return fake_measure(task, params)

    summaries = tune(given["onnx"][0], verify=False, measure=counting, resume=True, **options)
    assert calls == [] and len(summaries) == 7


class WholeInputPools(torch.nn.Module):
    """Hugging Face EfficientNet's final pooling (a window far larger than the input, ceil mode),
    a max pool of the same kind, and an average that counts explicit padding (stays a pool)."""

    def forward(self, x):
        head = torch.nn.functional.avg_pool2d(x, 64, ceil_mode=True)
        peak = torch.nn.functional.max_pool2d(x, (7, 9), stride=(7, 9), ceil_mode=True)
        padded = torch.nn.functional.avg_pool2d(x, 8, padding=1, count_include_pad=True)
        return head, peak, padded


def test_a_pool_whose_window_covers_the_input_becomes_a_global_reduction():
    torch.manual_seed(0)
    model, x = WholeInputPools().eval(), torch.randn(1, 5, 7, 7)
    ops = canonical_ops(model, (x,))
    assert ops.count("relax.mean") == 1 and ops.count("relax.max") == 1
    assert ops.count("relax.nn.avg_pool2d") == 1 and "relax.nn.max_pool2d" not in ops
    out = build_quietly(model, example_inputs=(x,))(x.numpy())
    for got, want in zip(out, model(x)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


class ConvGroupNorm(torch.nn.Module):
    """A conv (its output stored tiled), a group norm, a second use of the conv's output."""

    def __init__(self, groups: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.norm = torch.nn.GroupNorm(groups, 32)
        with torch.no_grad():  # non-trivial affine, so a wrong fold shows
            self.norm.weight.uniform_(0.5, 2)
            self.norm.bias.uniform_(-1, 1)

    def forward(self, x):
        y = self.conv(x)
        return self.norm(y) + y


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("dynamo", [False, True])
def test_an_exported_group_norm_becomes_one_group_norm_and_matches_onnxruntime(groups, dynamo, tmp_path):
    torch.manual_seed(0)
    model, x = ConvGroupNorm(groups).eval(), torch.randn(1, 3, 24, 24)
    path = tmp_path / "gn.onnx"
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    ops = ops_of(prepare(load_model(str(path)).mod))
    assert ops.count("relax.nn.group_norm") == 1
    assert "relax.reshape" not in ops and "relax.variance" not in ops
    built = build_quietly(str(path))
    # computed in the conv's tiled layout, its reductions split among the cores
    assert built.report.conversions == 0 and not built.report.left_as_is
    norm = next(built.mod[g] for g in built.mod.get_global_vars() if "group_norm" in g.name_hint)
    assert "T.parallel" in norm.script() and "T.vectorized" in norm.script()
    np.testing.assert_allclose(built(x.numpy())[0], ort_run(path, (x,))[0], rtol=1e-4, atol=1e-4)


def test_a_norm_reshape_whose_values_have_other_users_stays():
    class Leaky(torch.nn.Module):  # the centred values are also returned: not a group norm alone
        def forward(self, x):
            rows = x.reshape(1, 1, -1)
            centred = rows - rows.mean(dim=2, keepdim=True)
            normed = centred / torch.sqrt(rows.var(dim=2, unbiased=False, keepdim=True) + 1e-5)
            return normed.reshape(x.shape), centred

    x = torch.randn(1, 8, 4, 4)
    ops = canonical_ops(Leaky().eval(), (x,))
    assert "relax.nn.group_norm" not in ops and "relax.reshape" in ops
