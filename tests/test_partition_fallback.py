"""A partition its strategy cannot lower falls back to TVM's legalization; the build goes on.

The failure is forced (the batched-matmul strategy is patched to raise on one shape), so the
test does not depend on some strategy failing; the model goes through ONNX and is checked
against ONNX Runtime."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import build_messages

import alt_tvm
from alt_tvm.strategies.alt.batch_matmul import AltBatchMatmulStrategy
from alt_tvm.strategies.base import static_shape


class TwoMatmuls(torch.nn.Module):
    """Attention scores of two sequence lengths, ViT-B/16's 197 and 196."""

    def forward(self, q, k, q2, k2):
        return torch.matmul(q, k), torch.relu(torch.matmul(q2, k2))


def _inputs() -> list[np.ndarray]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(1, 2, 197, 64), (1, 2, 64, 197), (1, 2, 196, 64), (1, 2, 64, 196)]
    return [torch.randn(*s, generator=gen).numpy() for s in shapes]


@pytest.fixture
def failing_on_197(monkeypatch):
    """The batched-matmul strategy raises on M = 197 (restored after the test)."""
    original = AltBatchMatmulStrategy.implement

    def implement(self, anchor, context):
        if static_shape(anchor.value.args[0])[-2] == 197:
            raise RuntimeError("forced failure on M=197")
        return original(self, anchor, context)

    monkeypatch.setattr(AltBatchMatmulStrategy, "implement", implement)


def test_a_failing_partition_falls_back_and_the_model_still_matches_onnx_runtime(failing_on_197):
    arrays = _inputs()
    buffer = io.BytesIO()
    torch.onnx.export(TwoMatmuls().eval(), tuple(torch.from_numpy(a) for a in arrays), buffer, dynamo=False,
                      opset_version=17)
    model = onnx.load_from_string(buffer.getvalue())
    with build_messages() as messages:
        built = alt_tvm.build(model)
    report = built.report
    (key,) = report.failed
    assert key.startswith("matmul|(1, 2, 197, 64)")
    assert "strategy 'alt' failed" in report.failed[key] and "forced failure on M=197" in report.failed[key]
    assert [(strategy, ops) for strategy, _, ops in report.partitions] == [("alt", ["relax.matmul", "relax.nn.relu"])]
    assert key not in report.workloads and len(report.workloads) == 1
    assert any("fell back to TVM's legalization: relax.matmul (strategy 'alt' failed" in m for m in messages)
    assert any(m.startswith("strategy failed on matmul") for m in messages)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})
    for got, expected in zip(built(*arrays), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_strict_builds_re_raise_the_strategy_failure(failing_on_197):
    q, k = torch.randn(1, 2, 197, 64), torch.randn(1, 2, 64, 197)

    class Scores(torch.nn.Module):
        def forward(self, q, k):
            return torch.matmul(q, k)

    with pytest.raises(RuntimeError, match="forced failure on M=197"):
        alt_tvm.build(Scores().eval(), example_inputs=(q, k), strict=True)
    with pytest.raises(TypeError, match="strict must be a bool"):
        alt_tvm.build(Scores().eval(), example_inputs=(q, k), strict="yes")


def test_an_extent_with_no_vector_divisor_lowers_with_the_strategy():
    # 197 is prime: the vector tile is 1 and the schedule must not try to vectorize it.
    arrays = _inputs()
    built = alt_tvm.build(TwoMatmuls().eval(), example_inputs=tuple(torch.from_numpy(a) for a in arrays),
                          strict=True)
    assert not built.report.failed
    assert [ops for _, _, ops in built.report.partitions] == [["relax.matmul"], ["relax.matmul", "relax.nn.relu"]]
    want = TwoMatmuls()(*(torch.from_numpy(a) for a in arrays))
    for got, expected in zip(built(*arrays), want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4)


def test_a_kernel_that_fails_to_compile_falls_back_and_strict_re_raises(monkeypatch):
    # The schedule succeeds; LLVM code generation then rejects the kernel (a pragma importing
    # text that is not LLVM IR), so the failure shows only inside tvm.compile.
    import tvm

    from alt_tvm.strategies.alt import batch_matmul

    original = batch_matmul.schedule_gemm

    def uncompilable(func, **kwargs):
        sch = tvm.s_tir.Schedule(original(func, **kwargs))
        block = sch.get_child_blocks(sch.get_sblock("root"))[0]
        sch.annotate(sch.get_loops(block)[-1], "pragma_import_llvm", "not LLVM IR")
        return sch.mod

    monkeypatch.setattr(batch_matmul, "schedule_gemm", uncompilable)
    arrays = _inputs()[2:]  # the 196-token pair
    inputs = tuple(torch.from_numpy(a) for a in arrays)

    class Scores(torch.nn.Module):
        def forward(self, q, k):
            return torch.relu(torch.matmul(q, k))

    built = alt_tvm.build(Scores().eval(), example_inputs=inputs)
    (reason,) = built.report.failed.values()
    assert "does not compile" in reason and "alt_matmul" in reason
    assert not built.report.partitions
    np.testing.assert_allclose(built(*arrays)[0], torch.relu(inputs[0] @ inputs[1]).numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="expected top-level entity"):
        alt_tvm.build(Scores().eval(), example_inputs=inputs, strict=True)


def test_a_fallback_kernel_the_schedule_fails_on_is_left_unscheduled_and_named(monkeypatch):
    """The minimal schedule of TVM's legalized kernels (a pool, here) failing on one kernel
    leaves that kernel as TVM legalized it: the build goes on, names the kernel in its report
    and computes the right result; a strict build raises."""
    from alt_tvm.graph import in_layout

    def failing(func, **_):
        raise ValueError("this schedule fails")

    # For both users of the schedule: the ops computed in their operands' layouts (which then
    # fall back to TVM's legalization) and the fallbacks' schedule itself.
    monkeypatch.setattr(in_layout, "schedule_in_layout", failing)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.MaxPool2d(2), torch.nn.Softmax(dim=1)).eval()
    x = torch.randn(1, 3, 12, 12)
    built = alt_tvm.build(model, example_inputs=[x])
    assert built.report.left_as_is and all("this schedule fails" in why for why in built.report.left_as_is.values())
    assert any(name in built.report.summary() for name in built.report.left_as_is)
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="this schedule fails"):
        alt_tvm.build(model, example_inputs=[x], strict=True)
