"""VTA simulator and strategy: bit-exact int8 results against NumPy, cycles, DMA, ALU."""

import numpy as np
import pytest

from alt_tvm.strategies.vta.gemm import applicable, vta_conv2d, vta_dense
from alt_tvm.vta_mapping.dfg import GemmShape
from alt_tvm.vta_mapping.sim import Alu, Gemm, Load, Simulator, Store, VTAConfig


def conv_ref(x, w, stride, pad, dil, groups):
    """Direct int64 NumPy conv2d (NCHW/OIHW)."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dil * (r - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (s - 1) - 1) // stride + 1
    out = np.zeros((n, k, oh, ow), np.int64)
    kg = k // groups
    for o in range(k):
        g = o // kg
        for i in range(r):
            for j in range(s):
                hs, ws = slice(i * dil, i * dil + stride * oh, stride), slice(j * dil, j * dil + stride * ow, stride)
                win = xp[:, g * cg:(g + 1) * cg, hs, ws]
                out[:, o] += np.einsum("nchw,c->nhw", win, w[o, :, i, j].astype(np.int64))
    return out


CASES = {
    "stride1": (1, 32, 10, 10, 32, 3, 3, 1, 1, 1, 1),
    "stride2": (1, 16, 11, 11, 32, 3, 3, 1, 2, 1, 1),
    "dilation2": (1, 16, 12, 12, 16, 3, 3, 2, 1, 2, 1),
    "depthwise": (1, 16, 10, 10, 16, 3, 3, 1, 1, 1, 16),
    "grouped": (1, 32, 8, 8, 32, 3, 3, 1, 1, 1, 2),
    "low_channel": (1, 3, 16, 16, 16, 3, 3, 1, 2, 1, 1),
    "one_by_one": (2, 32, 7, 7, 48, 1, 1, 0, 1, 1, 1),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("strategy", ["csp", "static"])
def test_conv2d_bit_exact(name, strategy):
    n, c, h, w, k, r, s, pad, st, dil, g = CASES[name]
    rng = np.random.default_rng(hash(name) % 2**32)
    x = rng.integers(-128, 128, (n, c, h, w), dtype=np.int8)
    wt = rng.integers(-128, 128, (k, c // g, r, s), dtype=np.int8)
    res = vta_conv2d(x, wt, stride=st, padding=pad, dilation=dil, groups=g, strategy=strategy)
    ref = conv_ref(x, wt, st, pad, dil, g)
    assert res.output.dtype == np.int32
    np.testing.assert_array_equal(res.output, ref)
    assert res.stats.cycles > 0 and res.stats.bytes_loaded > 0
    assert res.stats.gemm_uops * 256 == res.mac_total


def test_conv2d_nhwc_matches_nchw():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (1, 8, 9, 9), dtype=np.int8)
    wt = rng.integers(-128, 128, (16, 8, 3, 3), dtype=np.int8)
    a = vta_conv2d(x, wt, padding=1)
    b = vta_conv2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), wt, padding=1, data_layout="NHWC")
    np.testing.assert_array_equal(a.output, b.output.transpose(0, 3, 1, 2))
    assert a.embedding == b.embedding


def test_csp_beats_static_on_low_channel_and_depthwise():
    rng = np.random.default_rng(2)
    for shape, g in (((1, 3, 16, 16), 1), ((1, 16, 12, 12), 16)):
        c = shape[1]
        x = rng.integers(-128, 128, shape, dtype=np.int8)
        wt = rng.integers(-128, 128, (16, c // g, 3, 3), dtype=np.int8)
        csp = vta_conv2d(x, wt, padding=1, groups=g)
        ref = vta_conv2d(x, wt, padding=1, groups=g, strategy="static")
        assert csp.stats.cycles < ref.stats.cycles
        assert csp.mac_total < ref.mac_total


@pytest.mark.parametrize("gemm", [GemmShape(1, 16, 16), GemmShape(8, 8, 8), GemmShape(2, 4, 8)])
def test_dense_bit_exact(gemm):
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (4, 40), dtype=np.int8)
    b = rng.integers(-128, 128, (24, 40), dtype=np.int8)
    res = vta_dense(a, b, config=VTAConfig(gemm=gemm))
    np.testing.assert_array_equal(res.output, a.astype(np.int64) @ b.astype(np.int64).T)


def test_small_buffers_force_reloads_and_stay_exact():
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (1, 64, 8, 8), dtype=np.int8)
    wt = rng.integers(-128, 128, (64, 64, 3, 3), dtype=np.int8)
    big = vta_conv2d(x, wt, padding=1, strategy="static")
    small = vta_conv2d(x, wt, padding=1, strategy="static",
                       config=VTAConfig(inp_bytes=512, wgt_bytes=4096, acc_bytes=1024))
    np.testing.assert_array_equal(big.output, small.output)
    assert small.stats.bytes_loaded > big.stats.bytes_loaded


def test_instructions_and_cost_model():
    cfg = VTAConfig(gemm=GemmShape(1, 2, 2), inp_bytes=16, wgt_bytes=32, acc_bytes=64)
    sim = Simulator(cfg)
    dram = {"inp": np.arange(8, dtype=np.int8).reshape(4, 1, 2),
            "wgt": np.ones((2, 2, 2), np.int8), "out": np.zeros((2, 1, 2), np.int32)}
    prog = [Load("inp", 0, 2, 1, 2, 0),  # 2-D: tiles 0 and 2
            Load("wgt", 0, 1, 2, 2, 0),
            Gemm(np.array([[0, 0, 0], [1, 0, 0]]), reset=True),
            Gemm(np.array([[0, 0, 0], [0, 1, 1], [1, 1, 0]])),
            Alu("max", np.array([1]), 10),
            Store(0, 0, 1, 2, 2)]
    st = sim.run(prog, dram)
    # acc0 = inp[t0]·1 + inp[t2]·1 = (0+1) + (4+5) = 10 per output; acc1 = max(9, 10)
    np.testing.assert_array_equal(dram["out"][:, 0], [[10, 10], [10, 10]])
    c = cfg.cost
    assert st.load_cycles == (c.insn + c.dma_setup + 2 * c.dma_row + 1) + (c.insn + c.dma_setup + c.dma_row + 1)
    assert st.bytes_loaded == 2 * 2 + 2 * 4 and st.bytes_stored == 2 * 8
    assert st.gemm_cycles == 2 * c.insn + 5 * c.gemm_uop
    with pytest.raises(ValueError, match="overflows"):
        sim.run([Load("inp", 0, 3, 3, 3, 0)], dram)
    with pytest.raises(ValueError, match="ALU op"):
        sim.run([Alu("mul", np.array([0]), 2)], dram)


def test_applicable():
    assert applicable({"op": "conv2d", "dtype": "int8", "out_dtype": "int32", "data_layout": "NHWC"})
    assert applicable({"op": "dense", "dtype": "int8"})
    assert not applicable({"op": "conv2d", "dtype": "float32"})
    assert not applicable({"op": "pool2d", "dtype": "int8"})
    with pytest.raises(ValueError, match="int8"):
        vta_dense(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32))
