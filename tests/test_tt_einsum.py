"""TT decomposition, analytic schedule choices and einsum kernels."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te

from alt_tvm.strategies.tt.decompose import decompose, reconstruct, tt_forward, tt_svd
from alt_tvm.strategies.tt.dse import solutions
from alt_tvm.strategies.tt.einsum import (
    TABLE3,
    EinsumShape,
    L2Cache,
    LoopOrder,
    RegisterBlock,
    build_chain,
    build_einsum,
    choose_loop_order,
    choose_register_block,
    core_layout,
    einsum_reference,
    load_store_count,
    pack_core,
    plan_einsum,
    threads_for,
)
from alt_tvm.target import board, host

RNG = np.random.default_rng(1234)
DEV = tvm.cpu()


# --------------------------------------------------------------------------- decomposition


def test_full_rank_tt_svd_is_exact():
    w = RNG.standard_normal((60, 48))
    dec = tt_svd(w, in_factors=(4, 3, 4), out_factors=(5, 3, 4), ranks=(1, 10**6, 10**6, 1))
    assert dec.ranks == (1, 20, 16, 1)  # capped by the unfolding ranks
    assert dec.rel_error < 1e-12
    np.testing.assert_allclose(reconstruct(dec.cores), w, atol=1e-10)
    assert [c.shape for c in dec.cores] == [(1, 4, 5, 20), (20, 3, 3, 16), (16, 4, 4, 1)]


def test_error_decreases_with_rank():
    w = RNG.standard_normal((64, 64))
    errs = [tt_svd(w, in_factors=(8, 8), out_factors=(8, 8), ranks=(1, r, 1)).rel_error for r in (2, 8, 16, 32, 64)]
    assert all(a > b for a, b in zip(errs, errs[1:]))
    assert errs[-1] < 1e-12


def test_reported_error_matches_reconstruction():
    w = RNG.standard_normal((32, 48)).astype(np.float32)
    dec = tt_svd(w, in_factors=(4, 12), out_factors=(8, 4), ranks=(1, 8, 1))
    direct = np.linalg.norm(w - reconstruct(dec.cores)) / np.linalg.norm(w)
    assert dec.rel_error == pytest.approx(direct, rel=1e-5)
    assert dec.cores[0].dtype == np.float32


def test_tt_forward_matches_dense_reconstruction():
    w = RNG.standard_normal((60, 48))
    b = RNG.standard_normal(60)
    x = RNG.standard_normal((5, 48))
    dec = tt_svd(w, in_factors=(4, 3, 4), out_factors=(5, 3, 4), ranks=(1, 4, 4, 1))
    np.testing.assert_allclose(tt_forward(x, cores=dec.cores, bias=b), x @ reconstruct(dec.cores).T + b,
                               rtol=1e-10, atol=1e-10)


def test_decompose_uses_dse_solution():
    sol = solutions(64, 32)[0]
    w = RNG.standard_normal((32, 64))
    dec = decompose(w, solution=sol)
    assert dec.in_factors == sol.in_factors and dec.out_factors == sol.out_factors
    assert dec.ranks == sol.ranks
    assert dec.params + 32 == sol.params  # eq. (4): cores + bias


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_factors": (4, 4), "out_factors": (4, 4), "ranks": (1, 2, 1)}, "multiply to 16"),
        ({"in_factors": (4, 12), "out_factors": (8, 4), "ranks": (1, 2, 2)}, "start and end with 1"),
        ({"in_factors": (4, 12), "out_factors": (8, 4), "ranks": (1, 1)}, "length d \\+ 1"),
        ({"in_factors": (4, 12), "out_factors": (32,), "ranks": (1, 2, 1)}, "equal length"),
    ],
)
def test_tt_svd_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tt_svd(np.zeros((32, 48)), **kwargs)


def test_reconstruct_rejects_mismatched_ranks():
    with pytest.raises(ValueError, match="rank mismatch"):
        reconstruct([np.zeros((1, 2, 2, 3)), np.zeros((4, 2, 2, 1))])


# --------------------------------------------------------------------------- analytic choices


def test_register_block_reproduces_paper_example():
    # §4.3.4: 16 registers, {mt, bt, rt, nt*rt_1} = {128, 32, 8, 8} -> {4, 3, 1, 1}. The paper's
    # example matches its earlier model (no padding micro-kernels); with the eq. (22) padding
    # terms (3, 4) costs fewer loads/stores (both use 16 registers).
    shape = EinsumShape(m=128, bt=32, n=1, r_out=8, r_in=8)
    assert choose_register_block(shape, vector_registers=16, vl=8, count_padding=False) == RegisterBlock(4, 3, 1, 1)
    with_pad = choose_register_block(shape, vector_registers=16, vl=8)
    assert with_pad.registers() <= 16
    assert load_store_count(shape, with_pad, vl=8) <= load_store_count(shape, RegisterBlock(4, 3, 1, 1), vl=8)


def test_register_block_respects_budget_and_divisors():
    for kinds in TABLE3.values():
        for shape in kinds.values():
            blk = choose_register_block(shape, vector_registers=32, vl=8, divisors_only=True)
            assert blk.registers() <= 32
            assert shape.m % blk.rm == 0 and shape.bt % blk.rb == 0


def test_loop_order_steps():
    l2 = L2Cache(512 * 1024, 16)  # 32 KiB ways
    assert choose_loop_order(EinsumShape(m=64, bt=64, n=4, r_out=8, r_in=8), threads=4, cache=l2) == LoopOrder("mbr")
    # CB6 middle: huge bt -> {b, m, r, nk} fits (the paper's choice for CB6).
    assert choose_loop_order(TABLE3["CB6"]["middle"], threads=4, cache=l2) == LoopOrder("bmr")
    tiled = choose_loop_order(EinsumShape(m=512, bt=16383, n=28, r_out=64, r_in=8), threads=4, cache=l2)
    assert tiled.order == "mbr" and tiled.b_tile is not None and 1 <= tiled.b_tile < 16383


def test_threads_for_thresholds():
    paper = (2_000_000, 4_000_000, 8_000_000)
    assert [threads_for(f, thresholds=paper) for f in (1e6, 3e6, 5e6, 9e6)] == [1, 2, 3, 4]
    assert threads_for(9e6, thresholds=paper, max_threads=2) == 2
    with pytest.raises(ValueError, match="increasing"):
        threads_for(1, thresholds=(5, 1))


def test_bad_shape_rejected():
    with pytest.raises(ValueError, match="EinsumShape.bt must be a positive integer"):
        EinsumShape(m=4, bt=0, n=2, r_out=8, r_in=8)


def test_core_packing_layout_is_papers():
    shape = TABLE3["CB3"]["middle"]
    plan = dataclasses.replace(plan_einsum(shape, target=host()), pair=1)
    lay = core_layout(shape, plan=plan)
    v = plan.pack
    assert lay.shape == (shape.m, shape.r_out // v, shape.n * shape.r_in, v)
    core = RNG.standard_normal(shape.core_shape).astype(np.float32)
    packed = pack_core(core, shape=shape, plan=plan)
    # G_t[m, r/V, n*k, V] = G[r, n, m, k]
    r, n, m, k = 5, 3, 7, 2
    assert packed[m, r // v, n * shape.r_in + k, r % v] == core[r, n, m, k]


def test_paired_core_layout_fills_the_vector():
    # r = 8 on 16 float lanes: two consecutive m share a vector, G -> (m/2, n*k, 2*r).
    shape = TABLE3["CB3"]["middle"]
    avx512 = dataclasses.replace(host(), vector_bits=512, vector_registers=32)  # whatever runs the test
    plan = plan_einsum(shape, target=avx512)
    lanes = avx512.vector_lanes("float32")
    assert plan.pair == lanes // shape.r_out
    p = plan.pair
    core = RNG.standard_normal(shape.core_shape).astype(np.float32)
    packed = pack_core(core, shape=shape, plan=plan)
    assert packed.shape == (shape.m // p, shape.n * shape.r_in, p * shape.r_out)
    r, n, m, k = 5, 3, 7, 2
    assert packed[m // p, n * shape.r_in + k, (m % p) * shape.r_out + r] == core[r, n, m, k]
    # m not divisible by the pair: the paper's layout.
    odd = EinsumShape(m=7, bt=4, n=3, r_out=8, r_in=8)
    assert plan_einsum(odd, target=host()).pair == 1


# --------------------------------------------------------------------------- kernels


def _run_kernel(shape: EinsumShape, *, optimized: bool = True, threads: int | None = None):
    plan = plan_einsum(shape, threads=threads) if optimized else None
    kern = build_einsum(shape, plan=plan, optimized=optimized)
    core = RNG.standard_normal(shape.core_shape).astype(np.float32)
    x = RNG.standard_normal(shape.input_shape).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(shape.output_shape, np.float32), DEV)
    kern.compile().jit()["main"](tvm.runtime.tensor(x, DEV), tvm.runtime.tensor(kern.pack(core), DEV), out)
    ref = einsum_reference(core.astype(np.float64), x.astype(np.float64))
    # float32 sums of up to n * k = 7168 terms: tolerance relative to the output scale.
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def _reduced(shape: EinsumShape, cap: int = 256) -> EinsumShape:
    return EinsumShape(m=shape.m, bt=min(shape.bt, cap), n=shape.n, r_out=shape.r_out, r_in=shape.r_in)


@pytest.mark.parametrize("cb", list(TABLE3))
@pytest.mark.parametrize("kind", ["first", "middle", "final"])
def test_table3_kernels_match_numpy(cb, kind):
    # Batch capped at 256 for speed (CB6/CB7 middle have bt up to 16383); other extents as printed.
    _run_kernel(_reduced(TABLE3[cb][kind]))


@pytest.mark.parametrize("kind", ["first", "middle", "final", "first8", "middle8", "final8"])
def test_kernels_odd_sizes_serial_and_naive(kind):
    r_out, r_in = {"first": (16, 1), "middle": (16, 8), "final": (1, 16),
                   "first8": (8, 1), "middle8": (8, 8), "final8": (1, 8)}[kind]
    # m = 6 pairs m into the vector for rank 8; bt = 13 and n = 5 divide nothing.
    shape = EinsumShape(m=6 if kind.endswith("8") else 7, bt=13, n=5, r_out=r_out, r_in=r_in)
    _run_kernel(shape, threads=1)
    _run_kernel(shape, threads=2)
    _run_kernel(shape, optimized=False)


@pytest.mark.parametrize("threads", [1, 2])
def test_final_b_vector_kernel_padded_and_parallel(threads):
    # Short n*k: X transposed per b tile, b in vectors; bt = 200 pads to whole tiles.
    shape = EinsumShape(m=12, bt=200, n=5, r_out=1, r_in=8)
    plan = plan_einsum(shape, threads=threads)
    assert plan.b_lanes == host().vector_lanes("float32") and plan.threads == threads
    _run_kernel(shape, threads=threads)
    # Long n*k keeps the paper's k-vector kernel with the horizontal add.
    assert plan_einsum(TABLE3["CB0"]["final"]).b_lanes == 0


def test_full_size_cb6_middle_bmr_order():
    shape = TABLE3["CB6"]["middle"]  # bt = 16383, the {b, m, r, nk} case
    assert plan_einsum(shape).loop.order == "bmr"
    _run_kernel(shape)


_CHAINS = [((32, 64), (100, 10), 8, 1), ((4, 8, 8), (8, 8, 4), 8, 3), ((2, 4, 4, 2), (4, 2, 2, 4), 8, 2)]


# The unoptimised chain of the largest layer takes ~20 s to build: it runs with the slow tests.
@pytest.mark.parametrize(("ins", "outs", "rank", "batch", "optimized"), [
    pytest.param(*case, optimized, marks=[pytest.mark.slow] if case is _CHAINS[0] and not optimized else [])
    for optimized in (True, False) for case in _CHAINS])
def test_chain_matches_dense_tt_layer(ins, outs, rank, batch, optimized):
    n, m = int(np.prod(ins)), int(np.prod(outs))
    w = RNG.standard_normal((m, n)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    x = RNG.standard_normal((batch, n)).astype(np.float32)
    dec = tt_svd(w, in_factors=ins, out_factors=outs, ranks=(1,) + (rank,) * (len(ins) - 1) + (1,))
    chain = build_chain(in_factors=ins, out_factors=outs, ranks=dec.ranks, batch=batch, optimized=optimized)
    y = tvm.runtime.tensor(np.zeros((batch, m), np.float32), DEV)
    args = [tvm.runtime.tensor(x, DEV), *[tvm.runtime.tensor(g, DEV) for g in chain.pack(dec.cores)],
            tvm.runtime.tensor(b, DEV), y]
    chain.compile().jit()["main"](*args)
    ref = x.astype(np.float64) @ reconstruct(dec.cores).T + b
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_chain_rank3_input_with_epilogue():
    # [B, S, N] read by indexing, then a residual-style epilogue: relu(y) * scale[B, S, M].
    ins, outs, lead = (8, 16), (16, 8), (2, 3)
    n, m = 128, 128
    w = RNG.standard_normal((m, n)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    x = RNG.standard_normal((*lead, n)).astype(np.float32)
    scale = RNG.standard_normal((*lead, m)).astype(np.float32)
    dec = tt_svd(w, in_factors=ins, out_factors=outs, ranks=(1, 8, 1))

    def epilogue(y):
        s = te.placeholder((*lead, m), name="scale")
        relu = te.compute(y.shape, lambda *i: te.max(y(*i), 0.0), name="relu")
        out = te.compute(y.shape, lambda *i: relu(*i) * s(*i), name="out")
        return [relu, out], [s]

    chain = build_chain(in_factors=ins, out_factors=outs, ranks=dec.ranks, batch=6, input_shape=(*lead, n),
                        epilogue=epilogue)
    y = tvm.runtime.tensor(np.zeros((*lead, m), np.float32), DEV)
    args = [tvm.runtime.tensor(x, DEV), *[tvm.runtime.tensor(g, DEV) for g in chain.pack(dec.cores)],
            tvm.runtime.tensor(b, DEV), tvm.runtime.tensor(scale, DEV), y]
    chain.compile().jit()["main"](*args)
    ref = np.maximum(x.astype(np.float64) @ reconstruct(dec.cores).T + b, 0) * scale
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    with pytest.raises(ValueError, match=r"input_shape must be \(\*lead, N\) .* got \(4, 128\)"):
        build_chain(in_factors=ins, out_factors=outs, ranks=dec.ranks, batch=6, input_shape=(4, n))


# --------------------------------------------------------------------------- IREE baseline


def _bench_module():
    # Imported by name (not from a file spec): the IREE worker process unpickles its entry point.
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    return importlib.import_module("bench_tt")


def test_iree_baseline_matches_numpy():
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")
    bench = _bench_module()
    assert bench.iree_missing() == ""
    worker = bench.IreeWorker(threads=1)
    try:
        for i, shape in enumerate([EinsumShape(m=6, bt=5, n=3, r_out=8, r_in=8),
                                   EinsumShape(m=4, bt=7, n=3, r_out=1, r_in=8)]):
            core = RNG.standard_normal(shape.core_shape).astype(np.float32)
            x = RNG.standard_normal(shape.input_shape).astype(np.float32)
            ref = einsum_reference(core.astype(np.float64), x.astype(np.float64))
            for form in bench.IREE_FORMS:
                out = worker.load(key=f"{i}-{form}", vmfb=bench.iree_compile(shape=shape, form=form), x=x,
                                  g=bench.iree_pack(core, shape=shape, form=form))
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
                assert worker.timer(key=f"{i}-{form}")(2, 1) > 0
    finally:
        worker.close()
    with pytest.raises(ValueError, match="form must be one of .* got 'dense'"):
        bench.iree_mlir(shape=shape, form="dense")


# --------------------------------------------------------------------------- RISC-V


def test_bananapi_cross_compile_emits_rvv():
    bpi = board("bananapi-f3")
    kern = build_einsum(TABLE3["CB0"]["middle"], target=bpi)
    asm = kern.compile(bpi).mod.inspect_source("asm")
    ops = set(re.findall(r"\b(v[a-z0-9]+\.[a-z.]+)", asm))
    assert {"vfmacc.vv", "vle32.v", "vse32.v"} <= ops or {"vfmacc.vf", "vle32.v", "vse32.v"} <= ops, sorted(ops)
    assert "vsetvli" in asm or "vsetivli" in asm
