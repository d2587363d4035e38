"""FLOPs a kernel is read against the peak with: the operators' multiply-adds (alt_tvm.flops)."""

import numpy as np
import pytest
import torch
from tvm import relax

from alt_tvm.flops import conv_flops, matmul_flops, relax_flops


def test_conv_flops_count_the_window_per_output_in_any_weight_layout():
    # 8 -> 16 channels, 3x3, on a 5x5 output: 2 x 16*25 outputs x 8*9 taps
    assert conv_flops(output_shape=[1, 16, 5, 5], weight_shape=[16, 8, 3, 3]) == 2 * 16 * 25 * 72
    assert conv_flops(output_shape=[1, 16, 5, 5], weight_shape=[3, 3, 8, 16], out_channels_axis=3) == 2 * 16 * 25 * 72
    # depthwise: one input channel per output
    assert conv_flops(output_shape=[1, 32, 7, 7], weight_shape=[32, 1, 5, 5]) == 2 * 32 * 49 * 25
    assert matmul_flops(output_shape=[2, 3, 10], reduction=64) == 2 * 60 * 64
    with pytest.raises(ValueError, match="output channels"):
        conv_flops(output_shape=[1, 0, 5, 5], weight_shape=[0, 8, 3, 3])


def test_relax_flops_counts_convs_and_matmuls_and_nothing_else():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float32"))
    w = relax.Var("w", relax.TensorType((4, 8, 3, 3), "float32"))
    m = relax.Var("m", relax.TensorType((100, 6), "float32"))
    with bb.function("main", [x, w, m]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            act = bb.emit(relax.op.sigmoid(conv))
            flat = bb.emit(relax.op.reshape(act, (4, 100)))
            out = bb.emit_output(relax.op.matmul(flat, m))
        bb.emit_func_output(out)
    bindings = bb.get()["main"].body.blocks[0].bindings
    assert relax_flops(bindings) == 2 * 4 * 100 * 72 + 2 * 4 * 6 * 100
    assert relax_flops(bindings[1:3]) is None  # sigmoid and reshape: no arithmetic counted


def test_kernel_flops_leave_out_an_exp_heavy_epilogue():
    """A SiLU epilogue computes a polynomial exp per element, ~20x the multiply-adds of this
    conv; TIR's count of it made kernels read several times the peak."""
    from alt_tvm.graph.build import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1), torch.nn.SiLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 16 * 16, 10)).eval()
    x = torch.randn(1, 8, 16, 16)
    built = build(model, example_inputs=[x])
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    info = built.kernel_info()
    (conv,) = [i for i in info.values() if "relax.nn.conv2d" in i.ops]
    (dense,) = [i for i in info.values() if "relax.matmul" in i.ops]
    assert "relax.sigmoid" in conv.ops
    assert conv.flops == 2 * 16 * 256 * 8
    assert dense.flops == 2 * 10 * 16 * 16 * 16


def test_peak_readings_keep_the_best_of_the_run(monkeypatch):
    import alt_tvm.bench.peak as timing

    readings = iter([117.0, 229.0, 228.0])
    monkeypatch.setattr(timing, "measure_peak_gflops", lambda *, threads: next(readings))
    peak = timing.PeakReadings(threads=2)
    with pytest.raises(ValueError, match="measure"):
        _ = peak.best
    assert peak.measure() == 117.0 and peak.describe() == "117 GFLOP/s"
    assert peak.measure() == 229.0 and peak.measure() == 229.0
    assert peak.readings == [117.0, 229.0, 228.0]
    assert peak.describe() == "229 GFLOP/s (best of 117, 229, 228)"
