"""Full-size VTA runs: analytic tile counts, count-only statistics, slab execution, and bench_vta.py."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

from alt_tvm.strategies.vta.gemm import DEFAULT_CONSTRAINTS, vta_conv2d
from alt_tvm.vta_mapping.csp import enumerate_embeddings
from alt_tvm.vta_mapping.dfg import GemmShape
from alt_tvm.vta_mapping.embedding import static_embedding
from alt_tvm.vta_mapping.polyhedral import conv2d_op
from alt_tvm.vta_mapping.rewrite import lower, plan, tile_counts
from alt_tvm.vta_mapping.select import rank
from alt_tvm.vta_mapping.sim import Simulator, VTAConfig, program_stats
from alt_tvm.vta_mapping.slabs import count_conv2d, run_conv2d

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load_script("bench_vta")


GEOS = [dict(n=1, c=3, h=12, w=12, k=16, r=3, s=3, pad_h=1, pad_w=1, stride_h=2, stride_w=2),
        dict(n=2, c=16, h=9, w=9, k=32, r=3, s=3, pad_h=2, pad_w=2, dilation_h=2, dilation_w=2),
        dict(n=1, c=16, h=8, w=8, k=16, r=3, s=3, pad_h=1, pad_w=1, groups=16)]


@pytest.mark.parametrize("geo", GEOS)
def test_tile_counts_match_plan_and_counts_match_simulation(geo):
    op = conv2d_op(**geo)
    cfg = VTAConfig()
    embs = [c.embedding for c in rank(op, enumerate_embeddings(op, constraints=DEFAULT_CONSTRAINTS).embeddings)]
    for emb in [*embs[:3], static_embedding(op, cfg.gemm)]:
        p = plan(op, emb)
        assert tile_counts(op, emb) == {"calls": p.calls, **p.ntiles}
        prog = lower(p, cfg)
        rng = np.random.default_rng(0)
        a = rng.integers(-128, 128, op.inputs[0].shape, dtype=np.int8)
        b = rng.integers(-128, 128, op.inputs[1].shape, dtype=np.int8)
        inp, wgt = p.pack(a, b)
        dram = {"inp": inp, "wgt": wgt, "out": np.zeros((p.ntiles["C"], 1, 16), np.int32)}
        assert Simulator(cfg).run(prog, dram) == program_stats(prog, cfg)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("rows", [None, 1, 2])
def test_slabs_bit_exact_and_equal_to_one_shot(layout, rows):
    geo = GEOS[0] | {"groups": 1}
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (1, 3, 12, 12), dtype=np.int8)
    wt = rng.integers(-128, 128, (16, 3, 3, 3), dtype=np.int8)
    op = conv2d_op(**geo)
    emb = rank(op, enumerate_embeddings(op, constraints=DEFAULT_CONSTRAINTS).embeddings)[0].embedding
    data = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    run = run_conv2d(data=data, weight=wt, geometry=geo, embedding=emb, config=VTAConfig(), data_layout=layout,
                     slab_rows=rows)
    one = vta_conv2d(x, wt, stride=2, padding=1)
    assert run.matched and run.checked_slabs == run.slabs
    out = run.output if layout == "NCHW" else run.output.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(out, one.output)
    assert run.mac_total == one.mac_total and run.data_total == one.data_total
    if rows is None:  # one slab: the same program as the one-shot path
        assert run.stats.cycles == one.stats.cycles and run.slabs == 1
    else:
        assert run.slabs == -(-6 // rows)


def test_slab_subsample_is_deterministic_and_counts_whole_layer():
    geo = dict(n=1, c=32, h=28, w=28, k=32, r=3, s=3, pad_h=1, pad_w=1)
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (1, 32, 28, 28), dtype=np.int8)
    wt = rng.integers(-128, 128, (32, 32, 3, 3), dtype=np.int8)
    emb = static_embedding(conv2d_op(**geo), GemmShape())
    kw = dict(data=x, weight=wt, geometry=geo, embedding=emb, config=VTAConfig(), slab_rows=4)
    full = run_conv2d(**kw)
    part = run_conv2d(**kw, check_uops=3 * 4 * 28 * 2 * 2 * 9)  # three slabs' worth
    assert full.slabs == part.slabs == 7 and part.checked_slabs == 3 and part.checked_rows == 12
    assert part.matched and full.matched and part.output is None
    assert part.stats == full.stats  # counts do not depend on which slabs ran numerically
    assert count_conv2d(geometry=geo, embedding=emb, config=VTAConfig(), slab_rows=4) == full.stats
    with pytest.raises(ValueError, match="data_layout"):
        run_conv2d(**kw, data_layout="CHWN")
    with pytest.raises(ValueError, match="unknown conv2d geometry"):
        run_conv2d(**{**kw, "geometry": {**geo, "pad": 1}})


def test_bench_configs_and_parse_errors():
    bench = _bench()
    raw = json.loads((ROOT / "benchmarks" / "data" / "deepbench_conv.json").read_text())
    assert len(raw) >= 100
    geos = [bench.parse_config(raw=r, index=i) for i, r in enumerate(raw)]
    cats = {bench.category(g, GemmShape()) for g in geos}
    assert cats == {"standard", "low-channel", "depthwise", "dilated"}
    assert all("suite" in r for r in raw)
    with pytest.raises(ValueError, match="missing keys"):
        bench.parse_config(raw={"n": 1}, index=0)
    with pytest.raises(ValueError, match="stride_h must be an int"):
        bench.parse_config(raw={**raw[0], "stride_h": "2"}, index=3)
    with pytest.raises(ValueError, match="dilation"):
        bench.parse_config(raw={**raw[0], "dilation": [1, 2, 3]}, index=3)
    with pytest.raises(ValueError, match="#5"):
        bench.parse_config(raw={**raw[0], "pad_h": -1}, index=5)


def test_bench_main_writes_json(tmp_path):
    bench = _bench()
    cfgs = [dict(name="lowc", n=1, c=3, h=10, w=10, k=16, r=3, s=3, pad_h=1, pad_w=1, stride_h=1, stride_w=1),
            dict(name="dw", n=1, c=16, h=8, w=8, k=16, r=3, s=3, pad_h=1, pad_w=1, stride_h=1, stride_w=1,
                 groups=16),
            dict(name="dil", n=1, c=16, h=9, w=9, k=16, r=3, s=3, pad_h=2, pad_w=2, stride_h=1, stride_w=1,
                 dilation=2)]
    src, out = tmp_path / "c.json", tmp_path / "o.json"
    src.write_text(json.dumps(cfgs))
    assert bench.main(["--configs", str(src), "--json", str(out), "--limit", "3"]) == 0
    written = json.loads(out.read_text())
    assert written["suite"] == "vta" and written["machine"]["kind"]  # the machine's facts beside the rows
    res = written["results"]["rows"]
    assert [r["name"] for r in res] == ["lowc", "dw", "dil"]
    for r in res:
        assert r["mapped"] and r["csp"]["matched_numpy"] and r["static"]["matched_numpy"]
        assert r["csp"]["matched_numpy_nhwc"] is not False
        for key in ("solve_seconds", "speedup_cycles", "bytes_moved_ratio"):
            assert r[key] > 0
        for side in ("csp", "static"):
            keys = {"cycles", "bytes_moved", "footprint_bytes", "host_pack_ms_nchw", "host_pack_ms_nhwc"}
            assert keys <= set(r[side])
    assert res[0]["speedup_cycles"] > 1 and res[1]["speedup_cycles"] > 1 and res[2]["speedup_cycles"] > 1
    assert "zero-dilated" in res[2]["reference_note"] and res[2]["static"]["matched_numpy"]
    assert len(res[0]["top_k_cycles"]) >= 1 and res[0]["csp"]["cycles"] == min(res[0]["top_k_cycles"])
    summ = written["results"]["summary"]
    assert summ["1x16x16"]["mapped"] == 3
    with pytest.raises(SystemExit, match="--limit"):
        bench.main(["--configs", str(src), "--limit", "0"])
    with pytest.raises(SystemExit, match="--gemm"):
        bench.main(["--configs", str(src), "--gemm", "1,x,16"])


@pytest.mark.slow
def test_bench_full_size_layers(tmp_path):
    """Three full-size DeepBench layers (speech, ResNet, face) end to end, numerics sub-sampled."""
    bench = _bench()
    raw = json.loads((ROOT / "benchmarks" / "data" / "deepbench_conv.json").read_text())
    out = tmp_path / "o.json"
    src = tmp_path / "c.json"
    src.write_text(json.dumps([raw[0], raw[41], raw[10]]))
    assert bench.main(["--configs", str(src), "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]["rows"]
    assert all(r["mapped"] and r["csp"]["matched_numpy"] and r["static"]["matched_numpy"] for r in res)
    assert res[0]["speedup_cycles"] > 2  # low-channel speech layer
    assert 0.95 <= res[1]["speedup_cycles"] <= 1.05  # 64->64 ResNet layer: parity
