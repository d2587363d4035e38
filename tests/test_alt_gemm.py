"""The ALT GEMM template on row counts with no small divisor (ViT's 197 tokens is prime).

A row block of one re-reads the whole packed weight for every row; the template blocks 4 rows
and lets the last block be partial, and the tuning space offers such partial blocks."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm

import alt_tvm
from alt_tvm.integration import extract_tasks

TOKENS, IN, OUT = 197, 64, 96


def _run(lowered, x: torch.Tensor, target=None) -> np.ndarray:
    """Compile a lowered task for ``target`` (a HardwareTarget; generic LLVM if None) and run it on
    ``x`` (its constants as packed; the output zeroed first)."""
    func = tvm.compile(tvm.IRModule({"main": lowered.func}), target=target.to_tvm() if target else "llvm")
    args = []
    for i, (shape, dtype) in enumerate(lowered.arg_specs):
        data = lowered.constants.get(i)
        if data is None:
            data = x.numpy() if shape == tuple(x.shape) else np.zeros(shape, dtype)
        args.append(tvm.runtime.tensor(np.asarray(data, dtype=dtype), tvm.cpu()))
    func(*args)
    return args[-1].numpy()


def _linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(IN, OUT).eval()


def test_a_prime_row_count_gets_a_four_row_block_and_matches_torch():
    model = _linear()
    x = torch.randn(1, TOKENS, IN, generator=torch.Generator().manual_seed(1))
    built = alt_tvm.build(model, example_inputs=(x,), strict=True)
    assert [ops for _, _, ops in built.report.partitions] == [["relax.matmul", "relax.add"]]
    (task,) = extract_tasks(model, example_inputs=(x,))
    _, loop = task.space.default()
    assert loop["mt"] == 4  # not 1, the only divisor of 197 up to 8
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mt", [1, 2, 4, 8])
def test_every_row_block_of_the_space_lowers_and_computes_the_product(mt):
    model = _linear()
    x = torch.randn(1, TOKENS, IN, generator=torch.Generator().manual_seed(1))
    (task,) = extract_tasks(model, example_inputs=(x,))
    (mt_knob, *_) = task.space.loop_knobs({"nt": 16})
    assert set(mt_knob.choices) == {1, 2, 4, 8}
    layout, loop = task.space.default()
    lowered = task.lower(task.space.decode(layout, {**loop, "mt": mt}))
    np.testing.assert_allclose(_run(lowered, x), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def _deep_linear_task(target=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 96).eval()
    x = torch.randn(1, 40, 512, generator=torch.Generator().manual_seed(2))
    (task,) = extract_tasks(model, example_inputs=(x,), target=target)
    return model, x, task


@pytest.mark.parametrize("panels_outer,kc", [(0, 0), (1, 0), (1, 64), (1, 256)])
def test_every_loop_order_and_k_chunk_of_the_space_computes_the_product(panels_outer, kc):
    model, x, task = _deep_linear_task()
    layout, loop = task.space.default()
    knobs = {k.name: k for k in task.space.loop_knobs(layout)}
    assert set(knobs["kc"].choices) == {0, 64, 128, 256} and set(knobs["panels_outer"].choices) == {0, 1}
    lowered = task.lower(task.space.decode(layout, {**loop, "panels_outer": panels_outer, "kc": kc}))
    np.testing.assert_allclose(_run(lowered, x), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_a_k_chunk_that_does_not_divide_k_is_a_clear_error():
    _, _, task = _deep_linear_task()
    layout, loop = task.space.default()
    with pytest.raises(ValueError, match=r"kc \(0: no chunks\)"):
        task.lower({**task.space.decode(layout, loop), "kc": 100})


def _batched_matmul_onnx(rows: tuple[int, ...], k: int, n: int):
    """ONNX MatMul of a ``[*rows, k]`` input by a constant ``[k, n]`` weight (ConvNeXt's pointwise
    layers: ``[1, 7, 7, 768] x [768, 3072]``), as the exporters write it."""
    from onnx import TensorProto, helper, numpy_helper

    weight = (np.random.default_rng(0).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*rows, n])],
                              [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight


@pytest.mark.parametrize("l2_kib", [256, 64 * 1024])
def test_weight_panels_run_outside_the_batch_rows_when_the_weight_does_not_fit(l2_kib):
    """With a weight over half the L2, the parallel loop runs weight panels outermost, outside
    the batch dims too, so each panel is read from memory once for all batch entries."""
    import dataclasses

    from alt_tvm.target import host

    model, weight = _batched_matmul_onnx((1, 3, 10), 512, 96)
    machine = dataclasses.replace(host(), l2_bytes=l2_kib * 1024)
    built = alt_tvm.build(model, target=machine)
    x = np.random.default_rng(1).standard_normal((1, 3, 10, 512)).astype(np.float32)
    np.testing.assert_allclose(built(x)[0], x @ weight, rtol=1e-4, atol=1e-4)
    kernel = next(k for k in built.report.kernels if k.kind == "partition")
    script = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == kernel.name).script()
    (parallel,) = [line.split()[1] for line in script.splitlines() if "T.parallel(" in line]
    # loops i0, i1 (batch), i2 (rows), i3 (columns): panels of columns first when 196 KB > L2 / 2
    assert parallel.startswith("i3_0" if l2_kib == 256 else "i0"), parallel


@pytest.mark.parametrize("m,n,registers,lanes,want", [
    (197, 768, 16, 8, (4, 24)),    # AVX2: 4 rows of 3 vectors, 12 accumulators
    (197, 768, 32, 16, (6, 64)),   # AVX-512: 6 rows of 4 vectors, 24 accumulators (33 blocks, 1 row padded)
    (128, 768, 32, 16, (4, 96)),   # 4 rows divide M exactly: 4 rows of 6 vectors, as many accumulators
    (197, 96, 32, 16, (4, 96)),    # 4 vectors do not divide 96
    (1, 1000, 16, 8, (1, 8)),      # a classifier's one row streams its weight: one vector per panel
    (1, 1000, 32, 16, (1, 8)),     # 16 lanes do not divide 1000: the widest power of two that does
    (1, 1280, 32, 16, (1, 16)),
    (2, 1001, 32, 16, (2, 13)),    # no power of two divides 1001 (7 x 11 x 13): its widest divisor up to 16
])
def test_the_register_block_does_the_most_fmas_per_load_that_fit_the_registers(m, n, registers, lanes, want):
    from alt_tvm.strategies.alt.gemm import register_tile

    rows, nt = register_tile(m, n, lanes, registers)
    assert (rows, nt) == want
    if m >= 4:
        assert rows * (nt // lanes) + nt // lanes + 1 <= registers


def test_an_order_that_guards_a_partial_row_block_takes_whole_blocks_where_they_score_near_the_best():
    from alt_tvm.strategies.alt.gemm import WHOLE_BLOCK_SHARE, register_tile

    # SegFormer-B0's 4096 x 32 x 256 GEMM: 6 x 4 leaves a partial block; 4 x 4 scores 2.0 of 2.4.
    assert register_tile(4096, 256, 16, 32) == (6, 64)
    assert register_tile(4096, 256, 16, 32, whole_blocks=True) == (4, 64)
    assert register_tile(1024, 160, 16, 32, whole_blocks=True) == (4, 80)  # 5 x 5 -> 4 x 5
    # ViT's 197 rows (a prime): only one-row blocks divide them, far below: the partial block stays.
    assert 0.97 < WHOLE_BLOCK_SHARE * 2.4 and register_tile(197, 768, 16, 32, whole_blocks=True) == (6, 64)
    assert register_tile(128, 768, 16, 32, whole_blocks=True) == register_tile(128, 768, 16, 32) == (4, 96)


def test_the_defaults_take_whole_row_blocks_where_the_schedule_would_guard_every_step():
    from types import SimpleNamespace

    from kernel_digests import PINNED

    from alt_tvm.strategies.alt.gemm import AltGemmStrategy

    context = SimpleNamespace(target=PINNED["avx512"])  # 2 cores, 32 registers, 1 MiB L2
    # A small weight (no chunked, prefetching order): 4 x 4 blocks, no guard.
    small = AltGemmStrategy._defaults(4096, 256, 32, context)
    assert (small["mt"], small["nt"], small["prefetch"]) == (4, 64, 0)
    # ViT-B's 197 x 768 x 3072: the prefetching order runs the partial block apart and keeps 6 x 4.
    vit = AltGemmStrategy._defaults(197, 768, 3072, context)
    assert (vit["mt"], vit["nt"], vit["prefetch"]) == (6, 64, 1)


def test_panel_groups_one_per_core_only_where_the_rows_outweigh_a_groups_outputs():
    from alt_tvm.strategies.alt.gemm import groups_panels

    assert groups_panels(m=197, n=768, k=3072, nt=64, cores=2) == 2  # ViT's second feed-forward GEMM
    assert groups_panels(m=197, n=3072, k=768, nt=64, cores=2) == 0  # its first: outputs 2x the rows
    assert groups_panels(m=197, n=768, k=3072, nt=64, cores=5) == 0  # 12 panels do not divide among 5
    assert groups_panels(m=197, n=768, k=3072, nt=64, cores=1) == 0


def test_a_gemm_of_few_panels_chunks_k_where_they_split_into_one_group_per_core():
    from dataclasses import replace
    from types import SimpleNamespace

    from kernel_digests import PINNED

    from alt_tvm.strategies.alt.gemm import AltGemmStrategy

    def defaults(target):  # a PyTorch encoder's 128 x 1024 x 256 feed-forward GEMM
        return AltGemmStrategy._defaults(128, 256, 1024, SimpleNamespace(target=target))

    two = PINNED["avx512"]  # 2 cores: 4 panels of 64 columns in 2 groups
    assert two.num_cores == 2 and defaults(two)["nt"] == 64
    assert defaults(two)["kc"] > 0 and defaults(two)["panel_groups"] == 2 and defaults(two)["prefetch"] == 1
    one = defaults(replace(two, num_cores=1))  # no groups and fewer than 8 panels: no chunks
    assert one["kc"] == 0 and one["panel_groups"] == 0


def test_grouped_panels_run_k_chunks_outside_a_cores_panels_and_compute_the_product(x86_runnable):
    model, x, task = _deep_linear_task(x86_runnable)
    layout, loop = task.space.default()
    layout = {**layout, "nt": 16}  # 6 panels
    knobs = {k.name: k for k in task.space.loop_knobs(layout)}
    cores = task.target.num_cores
    assert set(knobs["panel_groups"].choices) == ({0, cores} if cores > 1 and 6 % cores == 0 else {0})
    lanes = x86_runnable.vector_lanes()
    params = task.space.decode(layout, {**loop, "vec": lanes, "panels_outer": 1, "kc": 64, "panel_groups": 2})
    lowered = task.lower(params)
    script = lowered.func.script()
    # the parallel loop is the 2 groups; inside it the 8 chunks of k, a group's 3 panels, the
    # 10 row blocks and the 64 steps of a chunk
    assert "in T.parallel(2)" in script
    assert script.index("in T.parallel(2)") < script.index("in T.grid(8, 3, 10, 64)")
    # the register block is unrolled in the product, not in the zeroing of the group's outputs
    # (unrolled, that zeroing is one long straight block for LLVM to generate)
    sch = tvm.s_tir.Schedule(lowered.func)
    kinds = {name: [sch.get(loop).kind for loop in sch.get_loops(sch.get_sblock(name))]
             for name in ("matmul_init", "matmul_update")}
    assert tvm.tirx.ForKind.UNROLLED not in kinds["matmul_init"]
    assert kinds["matmul_update"].count(tvm.tirx.ForKind.UNROLLED) == 2
    # ... but in one serial loop of vectors (nested, LLVM unrolls the rows into memsets)
    shared = {sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_update"))}
    own = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_init")) if sch.get(loop) not in shared]
    assert [loop.kind for loop in own] == [tvm.tirx.ForKind.SERIAL, tvm.tirx.ForKind.VECTORIZED]
    # and a group's write-back (48 columns) runs in vectors of the register block's width
    assert {int(n) for n in re.findall(r"T\.vectorized\((\d+)\)", script)} == {lanes}
    np.testing.assert_allclose(_run(lowered, x, x86_runnable), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_panel_groups_that_do_not_divide_the_panels_are_refused(x86_target):
    _, _, task = _deep_linear_task(x86_target)
    layout, loop = task.space.default()
    params = task.space.decode({**layout, "nt": 16}, {**loop, "vec": x86_target.vector_lanes(), "panels_outer": 1,
                                                      "kc": 64, "panel_groups": 4})
    with pytest.raises(ValueError, match="panel_groups"):
        task.lower(params)


@pytest.mark.parametrize("groups,rows", [(0, 40), (2, 40), (0, 42)])
def test_the_chunk_needed_next_is_prefetched_and_the_product_is_unchanged(x86_runnable, groups, rows):
    """Chunked order: while the row blocks use a panel's chunk of ``k``, the one they use next
    is prefetched, a share per row block, outside the register block: the panel's next chunk
    (``k_0 + 1``), or with groups of panels the next panel's same chunk. A partial last row
    block (42 rows in blocks of 4) runs in a loop of its own, without hints."""
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 96).eval()
    x = torch.randn(1, rows, 512, generator=torch.Generator().manual_seed(2))
    (task,) = extract_tasks(model, example_inputs=(x,), target=x86_runnable)
    layout, loop = task.space.default()
    layout = {**layout, "nt": 16}  # 6 panels
    point = {**loop, "mt": 4, "vec": x86_runnable.vector_lanes(), "panels_outer": 1, "kc": 64, "panel_groups": groups,
             "prefetch": 1}
    assert task.space.check(layout, point) is None
    lowered = task.lower(task.space.decode(layout, point))
    lines = lowered.func.script().splitlines()
    hints = [i for i, line in enumerate(lines) if "T.prefetch(" in line]
    # loops: [group,] k_0 (8 chunks) [, the group's panel], i1_0 (10 full row blocks), k_1 (64 steps)
    blocks = next(i for i, line in enumerate(lines) if "i1_0" in line and ("T.grid(" in line or "range(10)" in line)
                  and "init" not in line)
    steps = next(i for i, line in enumerate(lines) if "for k_1 in range(64)" in line and i > blocks)
    assert hints and all(blocks < i < steps for i in hints), (blocks, hints, steps)
    # One hint per line of the chunk's 64 rows of 16 columns (one 16-lane vector, or two 8-lane
    # ones, a line), shared among the 10 row blocks: 7 each.
    assert "for prefetch_j in range(7)" in lines[hints[0] - 1], lines[hints[0] - 1]
    assert ("i2_0_1 + 1" if groups else "k_0 + 1") in lines[hints[0]], lines[hints[0]]
    np.testing.assert_allclose(_run(lowered, x, x86_runnable), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_prefetch_outside_the_chunked_order_is_refused(x86_target):
    _, _, task = _deep_linear_task(x86_target)
    layout, loop = task.space.default()
    unchunked = {**loop, "panels_outer": 1, "kc": 0, "prefetch": 1}
    assert "need the chunked order" in task.space.check(layout, unchunked)
    knobs = {k.name: k for k in task.space.loop_knobs({**layout, "nt": 16})}
    if 2 in knobs["panel_groups"].choices:  # a 2-core machine or more
        assert "need the chunked order" in task.space.check({**layout, "nt": 16}, {
            **loop, "vec": x86_target.vector_lanes(), "panels_outer": 0, "kc": 64, "panel_groups": 2})
    with pytest.raises(ValueError, match="prefetch needs the chunked order"):
        task.lower({**task.space.decode(layout, loop), "panels_outer": 1, "kc": 0, "prefetch": 1})


def test_a_record_of_an_unchunked_order_written_before_the_prefetch_knob_still_builds():
    """A record without ``prefetch`` takes the rule's choice only where its own order is chunked:
    an unchunked record of a weight that streams (where the rule prefetches) gets none."""
    torch.manual_seed(0)
    model = torch.nn.Linear(768, 3072).eval()  # 9.4 MB: more than half of any L2 here
    x = torch.randn(1, 64, 768, generator=torch.Generator().manual_seed(3))
    (task,) = extract_tasks(model, example_inputs=(x,))
    layout, loop = task.space.default()
    assert loop["panels_outer"] == 1 and loop["kc"] and loop["prefetch"] == 1
    old = {k: v for k, v in task.space.decode(layout, {**loop, "panels_outer": 0}).items()
           if k not in ("prefetch", "kc", "panel_groups")}
    lowered = task.lower(old)
    assert "T.prefetch(" not in lowered.func.script()
    np.testing.assert_allclose(_run(lowered, x), model(x).detach().numpy(), rtol=1e-4, atol=1e-3)


def test_a_k_chunk_fills_half_of_l1_or_three_quarters_with_many_rows():
    from alt_tvm.strategies.alt.gemm import WIDE_CHUNK_ROWS, k_chunk

    # 96-column panels of a 768-deep weight in a 32 KiB L1: 32-deep chunks (12 KiB) for
    # GPT-2's 64 rows, 64-deep ones (24 KiB) for BERT-base's 128.
    assert k_chunk(k=768, nt=96, l1_bytes=32768, rows=WIDE_CHUNK_ROWS - 1) == 32
    assert k_chunk(k=768, nt=96, l1_bytes=32768, rows=WIDE_CHUNK_ROWS) == 64
    assert k_chunk(k=3072, nt=96, l1_bytes=32768, rows=197) == 64
    assert k_chunk(k=64, nt=96, l1_bytes=32768, rows=512) == 0  # the whole panel fits


class _ResidualLinear(torch.nn.Module):
    """A ViT block's projection: ``fc(x) + relu(x)``; the residual operand is a kernel's own
    output, so the in-place pass analyses the GEMM kernel."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x) + torch.relu(x)


def test_a_partial_last_row_block_leaves_a_well_formed_kernel(x86_runnable):
    """ViT-B/16's 197 x 768 projections: the row loop is partitioned at the partial last block
    (the full ones then run unguarded), which TVM's ``loop_partition`` leaves with block
    variables defined twice; the strategy hands over well-formed TIR, so the in-place pass
    reads it and writes over the residual operand."""
    torch.manual_seed(0)
    model, x = _ResidualLinear(768).eval(), torch.randn(1, TOKENS, 768)
    built = alt_tvm.build(model, x86_runnable, example_inputs=(x,), strict=True)
    for _, func in built.mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            tvm.s_tir.Schedule(func)  # raises on ill-formed TIR
    assert not built.report.left_as_is and built.report.in_place == 1
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
