"""The Relax pass: partitions, layout propagation, conversions, fallbacks, variants, registry."""

import numpy as np
import pytest
import torch
import tvm
from conftest import host_target
from tvm import relax

from alt_tvm.graph.prepare import prepare
from alt_tvm.graph.propagate import AltLayoutPass
from alt_tvm.strategies import registry
from alt_tvm.strategies.base import OpInfo, Strategy

torch.manual_seed(0)


def relax_module(model: torch.nn.Module, *inputs: torch.Tensor) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program

    return from_exported_program(torch.export.export(model.eval(), inputs), keep_params_as_input=False)


def build_and_run(model, inputs, **options):
    alt_pass = AltLayoutPass(**options)
    mod = alt_pass(prepare(relax_module(model, *inputs)))
    vm = relax.VirtualMachine(tvm.compile(mod, target=host_target()), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x.numpy(), tvm.cpu()) for x in inputs])
    with torch.no_grad():
        ref = model(*inputs)
    np.testing.assert_allclose(out[0].numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    return mod, alt_pass.report


def calls(mod: tvm.IRModule) -> list[str]:
    """Names of the PrimFuncs main calls, in order."""
    text = mod["main"].script()
    return [line.split("R.call_tir(")[1].split(",")[0] for line in text.splitlines() if "R.call_tir(" in line]


class ConvBiasRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 32, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 2.0


def test_epilogue_shares_the_conv_layout_and_fuses_into_one_kernel():
    mod, report = build_and_run(ConvBiasRelu(), [torch.rand(1, 8, 16, 16)])
    assert report.partitions == [("alt", "relax.nn.conv2d",
                                  ["relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.multiply"])]
    names = calls(mod)
    # One kernel, and conversions only at the model's boundary: its output (and, where the
    # target's channel tiles take the 8 input channels whole, its input).
    (conv,) = [n for n in names if not n.startswith("layout_convert")]
    assert conv.startswith("alt_conv2d") and names[-1].startswith("layout_convert") and len(names) <= 3
    # The partition's output is in the tiled layout N.H/ht.W/wt.O/ot.ht.wt.ot ...
    call = [line for line in mod["main"].script().splitlines() if f"R.call_tir({conv}," in line][0]
    assert call.split("out_ty=R.Tensor((")[1].split(")")[0].count(",") == 6
    # ... and the epilogue is computed inside the conv's tile loop, in the same kernel.
    text = mod[conv].script()
    assert 'T.sblock("multiply_2")' in text  # the last epilogue stage, with bias and ReLU inlined
    assert 'T.sblock("add_0")' not in text and 'T.sblock("relu_1")' not in text


class TwoConvs(torch.nn.Module):
    def __init__(self, second_stride: int, second_kernel: int):
        super().__init__()
        self.a = torch.nn.Conv2d(16, 32, 1)
        self.b = torch.nn.Conv2d(32, 32, second_kernel, stride=second_stride, padding=second_kernel // 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_pad_stage_absorbs_the_conversion_between_two_convs():
    mod, report = build_and_run(TwoConvs(second_stride=2, second_kernel=3), [torch.rand(1, 16, 16, 16)])
    names = calls(mod)
    # The model input is converted for the 1x1 conv (no pad stage); then conv -> conv directly.
    assert [n.rstrip("0123456789").rstrip("_") for n in names] == ["layout_convert", "alt_conv2d", "alt_conv2d",
                                                                  "layout_convert"]
    assert report.conversions == 2


def test_strided_1x1_conv_reads_its_producers_tiles_without_a_conversion():
    # A 1x1 stride-2 conv wants every other row/column: its own input layout has gaps that
    # the producer's layout does not, and there is no pad stage to convert. It reads the
    # producer's tiles directly (same channel vector innermost) instead of a conversion.
    mod, report = build_and_run(TwoConvs(second_stride=2, second_kernel=1), [torch.rand(1, 16, 16, 16)])
    names = calls(mod)
    assert [n.rstrip("0123456789").rstrip("_") for n in names] == ["layout_convert", "alt_conv2d", "alt_conv2d",
                                                                  "layout_convert"]
    assert report.conversions == 2 and all(k.boundary for k in report.kernels if k.kind == "conversion")


class SharedProducer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(16, 16, 1)
        self.b = torch.nn.Conv2d(16, 16, 1)
        self.c = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        # (b's relu keeps the sum from merging into one conv: graph/reorder.py)
        return torch.relu(self.b(y)) + self.c(y) + y


def test_layout_reaches_every_consumer():
    mod, report = build_and_run(SharedProducer(), [torch.rand(1, 16, 8, 16)])
    # a, b and c all read/write one layout: no conversion but the model input's and output's.
    assert report.conversions == 2
    assert len(report.partitions) == 3


class NoStrategyOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x, y):
        z = torch.relu(self.conv(x)).flatten(1)
        # A float64 matmul: alt-tvm's GEMM strategies are float32 only. (The importer
        # computes the softmax after the cast back to float32: a row kernel of alt-tvm's.)
        return torch.softmax(z.to(torch.float64) @ y.to(torch.float64), dim=-1).to(torch.float32)


def test_ops_without_strategy_fall_back_and_are_reported():
    mod, report = build_and_run(NoStrategyOps(), [torch.rand(1, 4, 4, 4), torch.rand(128, 5)])
    assert report.fallbacks["relax.matmul"] == ["alt: dtypes ('float64', 'float64') (needs float32)"]
    assert "relax.nn.softmax" not in report.fallbacks
    assert "fell back to TVM's legalization: relax.matmul (alt: dtypes" in report.summary()
    assert [op for _, op, _ in report.partitions] == ["relax.nn.conv2d", "relax.nn.softmax"]


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.c3 = torch.nn.Conv2d(32, 32, 1)
        self.bn = torch.nn.BatchNorm2d(32)
        self.dw = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.fc = torch.nn.Linear(32, 10)
        self.bn.running_mean.uniform_()
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        z = torch.relu(self.c2(y))
        z = torch.nn.functional.relu6(self.bn(self.c3(z))) + z
        return self.fc(self.dw(z).mean((2, 3)))


@pytest.mark.parametrize("variant", ["alt", "alt-wp", "alt-ol"])
def test_variants_match_pytorch(variant):
    mod, report = build_and_run(SmallNet(), [torch.rand(1, 3, 32, 32)], variant=variant)
    assert len(report.partitions) == 5
    if variant == "alt-wp":
        # Nothing propagates: one conversion after each of the 4 convs, and one into the 1x1 conv.
        assert report.conversions == 5
        assert all(len(ops) == 1 for _, _, ops in report.partitions)
    else:
        # None: the global mean reads the depthwise conv's tiles (graph/in_layout.py).
        assert report.conversions == 0
        assert [k.ops for k in report.kernels if k.kind == "operator"] == [("relax.mean",)]
        # conv + (bias and BN folded into one add) + relu6 + residual
        assert max(len(ops) for _, _, ops in report.partitions) == 4


def test_conv1d_conv3d_and_transposed_convs_build_with_alt():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv1d(4, 8, 3, padding=1, dilation=1)
            self.c3 = torch.nn.Conv3d(2, 4, 3, padding=1, stride=(1, 2, 2))
            self.t2 = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)

        def forward(self, a, b):
            x = torch.relu(self.c1(a))
            y = self.c3(b).mean(2)
            return x.sum() + self.t2(y).sum(dim=(1, 2, 3))

    _, report = build_and_run(Mixed(), [torch.rand(1, 4, 20), torch.rand(1, 2, 4, 8, 8)])
    assert {op for _, op, _ in report.partitions} == {"relax.nn.conv1d", "relax.nn.conv3d",
                                                     "relax.nn.conv2d_transpose"}


@pytest.mark.parametrize("channels, groups", [(2, 2), (4, 2), (6, 3)])
def test_grouped_transposed_conv_lowers_with_alt_whatever_the_channels_per_group(channels, groups):
    # With one output channel per group the output's channel tile spans groups, and the
    # weight's O/groups tile was that tile floored: split factor 0, the strategy failed.
    model = torch.nn.ConvTranspose2d(channels, channels, 3, stride=2, groups=groups)
    _, report = build_and_run(model, [torch.rand(1, channels, 5, 5)], strict=True)
    assert [p[:2] for p in report.partitions] == [("alt", "relax.nn.conv2d_transpose")]


def batch_norm_onnx(*, training: bool):
    """ONNX BatchNormalization (2, 3, 4, 5) with constant scale, bias and running statistics."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    stats = {"scale": rng.random(3) + 0.5, "bias": rng.random(3), "mean": rng.random(3), "var": rng.random(3) + 0.5}
    node = helper.make_node("BatchNormalization", ["x", *stats], ["y"], epsilon=1e-3, training_mode=int(training))
    graph = helper.make_graph([node], "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 5])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), stats


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_uses_batch_statistics_in_training_mode_and_running_ones_otherwise(training):
    import alt_tvm

    model, stats = batch_norm_onnx(training=training)
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32) * 3 + 1
    mean, var = (x.mean((0, 2, 3)), x.var((0, 2, 3))) if training else (stats["mean"], stats["var"])
    shape = (1, 3, 1, 1)
    expected = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) * stats["scale"].reshape(shape) \
        + stats["bias"].reshape(shape)
    (got,) = alt_tvm.build(model)(x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_unknown_variant_and_strategy_names_are_rejected():
    with pytest.raises(ValueError, match=r"unknown variant 'alt-xx'; choose from \['alt', 'alt-wp', 'alt-ol'\]"):
        AltLayoutPass(variant="alt-xx")
    with pytest.raises(ValueError, match=r"unknown strategies \['fast'\]; registered:"):
        AltLayoutPass(strategies=["fast"])


def test_restricting_strategies_forces_fallback():
    _, report = build_and_run(ConvBiasRelu(), [torch.rand(1, 8, 8, 8)], strategies=[])
    assert report.partitions == [] and "relax.nn.conv2d" in report.fallbacks


class _Probe(Strategy):
    name = "probe"
    ops = ("relax.nn.conv2d",)
    priority = 100

    def applicable(self, info: OpInfo):
        return None if info.input_shapes[0][1] == 3 else "only 3 input channels"

    def implement(self, anchor, context):
        raise AssertionError("not built in this test")


def test_registry_prefers_priority_and_checks_applicability():
    probe = registry.register_strategy(_Probe())
    try:
        info = OpInfo("relax.nn.conv2d", {}, ((1, 3, 8, 8), (4, 3, 3, 3)), ("float32",) * 2, (1, 4, 6, 6),
                      "float32", "llvm", {1: np.zeros((4, 3, 3, 3), np.float32)})
        chosen, _ = registry.select(info)
        assert chosen is probe
        other = OpInfo("relax.nn.conv2d", {}, ((1, 5, 8, 8), (4, 5, 3, 3)), ("float32",) * 2, (1, 4, 6, 6),
                       "float32", "llvm", {1: np.zeros((4, 5, 3, 3), np.float32)})
        chosen, reasons = registry.select(other)
        assert chosen is not None and chosen.name == "alt"
        assert reasons == ["probe: only 3 input channels"]
        chosen, _ = registry.select(info, allowed=["alt"])
        assert chosen.name == "alt"
    finally:
        registry._REGISTRY.remove(probe)


def test_pipeline_in_tvm_compile_gives_builds_executable():
    """A TVM user's own Relax module through ``tvm.compile(..., relax_pipeline=alt_tvm.pipeline())``
    gets the kernels and the outputs ``alt_tvm.build`` gives, bit for bit."""
    import alt_tvm

    model, x = ConvBiasRelu().eval(), torch.rand(1, 8, 8, 8)
    mod = relax_module(model, x)
    built = alt_tvm.build(mod)
    executable = tvm.compile(mod, target=host_target(), relax_pipeline=alt_tvm.pipeline())
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy(), tvm.cpu()))
    np.testing.assert_array_equal(out[0].numpy(), built(x.numpy())[0])
    with torch.no_grad():
        np.testing.assert_allclose(out[0].numpy(), model(x).numpy(), rtol=1e-4, atol=1e-4)
    assert {k.name for k in built.report.kernels} and all(
        executable.mod.implements_function(k.name, query_imports=True) for k in built.report.kernels)


def test_package_level_build_takes_a_torch_module():
    import alt_tvm

    model, x = ConvBiasRelu().eval(), torch.rand(1, 8, 8, 8)
    compiled = alt_tvm.build(model, example_inputs=(x,))
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-4)
    low, median = compiled.time(x.numpy(), number=2, repeat=2)
    assert 0 < low <= median


def test_opt_in_strategies_stay_silent_unless_named():
    info = OpInfo("relax.matmul", {}, ((1, 16), (16, 4)), ("float32",) * 2, (1, 4), "float32", "llvm",
                  {1: np.zeros((16, 4), np.float32)})
    chosen, reasons = registry.select(info)
    assert chosen.name == "alt" and reasons == []  # tt_einsum and vta_gemm are opt-in
    chosen, reasons = registry.select(info, allowed=["tt_einsum"])
    assert chosen is None and reasons and reasons[0].startswith("tt_einsum:")


class ScaleThenPointwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 32, 1)

    def forward(self, x):
        y = torch.relu(self.a(x)).sum()  # a side branch so the input has two uses
        return self.b(x * 0.5 + 1.0) + y


def test_element_wise_producers_take_the_consumer_layout_backwards():
    # x * 0.5 + 1.0 runs before a pad-less 1x1 conv: instead of TVM's canonical kernels plus
    # a conversion, both ops are computed straight into the conv's input layout, as one kernel.
    mod, report = build_and_run(ScaleThenPointwise(), [torch.rand(1, 16, 8, 16)])
    names = calls(mod)
    assert any(n.startswith("alt_add") for n in names) and not any(n.startswith("alt_multiply") for n in names)
    chain = next(k for k in report.kernels if k.kind == "elementwise")
    assert chain.ops == ("relax.multiply", "relax.add") and chain.layout
    conv_b = [n for n in names if n.startswith("alt_conv2d")][-1]
    assert not names[names.index(conv_b) - 1].startswith("layout_convert")
    wp_mod, wp_report = build_and_run(ScaleThenPointwise(), [torch.rand(1, 16, 8, 16)], variant="alt-wp")
    assert wp_report.conversions > report.conversions


class ExplicitPadThenConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 1)
        self.b = torch.nn.Conv2d(16, 16, 3)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return self.b(torch.nn.functional.pad(y, (2, 1, 1, 0)))  # left, right, top, bottom


def test_explicit_pad_is_absorbed_into_the_conv_partition():
    mod, report = build_and_run(ExplicitPadThenConv(), [torch.rand(1, 8, 10, 12)])
    names = calls(mod)
    # conv a -> (pad + conv b) directly: the pad converts a's layout into b's input layout.
    assert [n.rstrip("0123456789").rstrip("_") for n in names] == ["layout_convert", "alt_conv2d", "alt_conv2d",
                                                                  "layout_convert"]
    assert "relax.nn.pad" not in report.fallbacks


class ChannelsLastInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.pointwise = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x_nhwc, y_nhwc):
        a = torch.relu(self.conv(x_nhwc.permute(0, 3, 1, 2)))  # transpose then a padded conv
        return a + self.pointwise(y_nhwc.permute(0, 3, 1, 2))  # transpose then a pad-less conv


def test_transpose_producers_become_the_layout_the_conv_reads():
    mod, report = build_and_run(ChannelsLastInput(), [torch.rand(1, 8, 12, 3), torch.rand(1, 8, 12, 16)])
    assert "relax.permute_dims" not in report.fallbacks  # no transpose kernel at all
    names = calls(mod)
    # Both convs read their NHWC inputs in place; the first one's output is the residual the
    # second one's epilogue adds; only the model output is converted back.
    assert [n.rstrip("0123456789").rstrip("_") for n in names] == ["alt_conv2d", "alt_conv2d", "layout_convert"]


def test_build_gives_tvm_thread_pool_one_thread_per_core_unless_the_user_set_it():
    import os
    import subprocess
    import sys

    code = ("import tvm; from alt_tvm.deploy.model import use_runtime_threads; "
            "print(use_runtime_threads(2), tvm.get_global_func('runtime.NumThreads')())")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    # TVM alone starts one thread on a 2-vCPU x86 machine (half the logical CPUs).
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "2"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "TVM_NUM_THREADS": "1"}, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["1", "1"]  # the user's choice stands
