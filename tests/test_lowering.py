"""alt_tvm.lowering: small CPU buffers stay on the stack; results are unchanged."""

import re

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import te, tirx

import alt_tvm
from alt_tvm import lowering
from alt_tvm.tir import uses_var

CPU = tvm.target.Target({"kind": "llvm"})


def _blocked_matmul(rows_per_task: int = 7) -> tvm.IRModule:
    """A (112 x 32) @ (32 x 64) product whose parallel tasks accumulate ``rows_per_task`` rows of
    the output in a local buffer: 7 x 64 floats = 1792 bytes, above TVM's 1 KiB stack limit."""
    a = te.placeholder((112, 32), name="A")
    b = te.placeholder((32, 64), name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((112, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    task, row = sch.split(i, [None, rows_per_task])
    sch.reorder(task, kk, row, j)
    sch.parallel(task)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), task)
    sch.vectorize(j)
    return sch.mod


def _run(executable, a, b):
    out = tvm.runtime.tensor(np.zeros((a.shape[0], b.shape[1]), "float32"))
    executable.jit()["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


def test_a_register_block_over_1kib_is_on_the_stack_not_the_workspace_pool():
    mod = _blocked_matmul()
    default = tvm.compile(mod, target=CPU)
    ours = lowering.compile(mod, target=CPU)
    # TVM's default serves the 1792-byte buffer from the pool in every task; ours allocates it in the frame
    assert "TVMBackendAllocWorkspace" in default.mod.inspect_source("ll")
    assert "TVMBackendAllocWorkspace" not in ours.mod.inspect_source("ll")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((112, 32)).astype("float32"), rng.standard_normal((32, 64)).astype("float32")
    np.testing.assert_allclose(_run(ours, a, b), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(_run(ours, a, b), _run(default, a, b))


def _allocating(nbytes: int, target) -> tirx.PrimFunc:
    """A function allocating one float buffer of ``nbytes`` (after the default pipeline's flattening)."""
    buffer = tirx.decl_buffer((nbytes // 4,), "float32", name="scratch", scope="local")
    body = tirx.SeqStmt([tirx.AllocBuffer(buffer), tirx.BufferStore(buffer, tirx.FloatImm("float32", 0.0), [0])])
    func = tirx.PrimFunc([], body)
    return func if target is None else func.with_attr("target", target)


def _marked(func: tirx.PrimFunc) -> list[bool]:
    found = []
    tvm_ffi.structural_walk(func.body, (tirx.AllocBuffer, lambda a: found.append("disable_lower_builtin" in
                                                                                  a.annotations)))
    return found


def test_only_constant_cpu_allocations_up_to_the_limit_are_marked():
    assert _marked(lowering.keep_on_stack(_allocating(1792, CPU))) == [True]
    assert _marked(lowering.keep_on_stack(_allocating(lowering.STACK_BYTES, CPU))) == [True]
    assert _marked(lowering.keep_on_stack(_allocating(lowering.STACK_BYTES + 4, CPU))) == [False]
    assert _marked(lowering.keep_on_stack(_allocating(2048, CPU), limit=1024)) == [False]
    # a GPU kernel's buffers, and a function not yet bound to a target, are left to TVM
    assert _marked(lowering.keep_on_stack(_allocating(1792, tvm.target.Target({"kind": "cuda"})))) == [False]
    assert _marked(lowering.keep_on_stack(_allocating(1792, None))) == [False]
    with pytest.raises(ValueError, match=r"limit must be a non-negative int \(bytes\), got -1"):
        lowering.keep_on_stack(_allocating(1792, CPU), limit=-1)


def _pool_users(built) -> dict[str, int]:
    """Function -> its reads of the workspace pool's allocator, in the model's LLVM IR (a parallel
    loop's body is a function of its own, ``__tvm_parallel_lambda``)."""
    source = "\n".join(m.inspect_source("ll") for m in built.executable.mod.imports if m.kind == "llvm")
    users = {}
    for definition in source.split("\ndefine ")[1:]:
        name = re.search(r"@([\w.]+)\(", definition.split("\n", 1)[0]).group(1)
        users[name] = definition.split("\n}\n", 1)[0].count("@__TVMBackendAllocWorkspace")
    return users


def test_a_built_conv_model_matches_pytorch_with_its_tiles_on_the_stack(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 1),
                                torch.nn.ReLU()).eval()
    x = torch.randn(1, 32, 28, 28)
    built = alt_tvm.build(model, example_inputs=(x,))
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(built(x.numpy())[0], want, rtol=1e-4, atol=1e-4)
    # each parallel task's output tile (2 rows x 28 positions x 32 channels, 7 KiB) is in its frame
    assert not any(_pool_users(built).values()), _pool_users(built)
    # with TVM's own pipeline every task takes it from the pool
    monkeypatch.setattr(lowering, "compile", lambda mod, *, target, **kw: tvm.compile(mod, target=target, **kw))
    assert sum(_pool_users(alt_tvm.build(model, example_inputs=(x,))).values()) >= 2


def _partial_blocks(bound: int = 30, outer_kind: str = "serial", guard_in_loop: bool = True) -> tirx.PrimFunc:
    """Row sums of a (30, 32) matrix in blocks of 7 rows: 5 blocks, the last one partial (2 rows),
    so every row is guarded by ``mo * 7 + mi < bound`` inside the reduction loop over ``k``
    (``guard_in_loop=False``: a guard outside it)."""
    from tvm.script import tirx as T

    if guard_in_loop:
        @T.prim_func(private=True)
        def func(a: T.Buffer((30, 32), "float32"), c: T.Buffer((30,), "float32")):
            for mo in T.serial(5) if outer_kind == "serial" else T.parallel(5):
                for k in range(32):
                    for mi in range(7):
                        if mo * 7 + mi < bound:
                            c[mo * 7 + mi] = c[mo * 7 + mi] + a[mo * 7 + mi, k]
    else:
        @T.prim_func(private=True)
        def func(a: T.Buffer((30, 32), "float32"), c: T.Buffer((30,), "float32")):
            for mo in T.serial(5):
                if mo * 7 < bound - 7:
                    for k in range(32):
                        c[mo * 7] = c[mo * 7] + a[mo * 7, k]
    return func


def _guards(stmt) -> list:
    found = []
    tvm_ffi.structural_walk(stmt, (tirx.IfThenElse, lambda node: found.append(node)))
    return found


def test_a_partial_last_register_block_is_peeled_off_its_guards():
    peeled = lowering.peel_partial_blocks(_partial_blocks())
    full, last = peeled.body.seq
    # the four full blocks run with no guard; the last block keeps its rows' guards
    assert isinstance(full, tirx.For) and int(full.extent) == 4 and not _guards(full)
    assert len(_guards(last)) == 1 and not uses_var(last, full.loop_var)
    # and the pipeline computes what the guarded loop does
    a = np.random.default_rng(0).standard_normal((30, 32)).astype("float32")
    sums = []
    for func, compile_ in ((_partial_blocks(), tvm.compile), (_partial_blocks(), lowering.compile),
                           (peeled, tvm.compile)):
        out = tvm.runtime.tensor(np.zeros(30, "float32"))
        module = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        compile_(module, target=CPU).jit()["main"](tvm.runtime.tensor(a), out)
        sums.append(out.numpy())
    np.testing.assert_allclose(sums[0], a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sums[1], sums[0])  # the same sums, in the same order
    np.testing.assert_array_equal(sums[2], sums[0])


def test_only_a_guard_failing_in_the_last_iteration_alone_inside_a_loop_is_peeled():
    for func in (_partial_blocks(bound=20),  # fails from the third block on
                 _partial_blocks(guard_in_loop=False)):  # checked once per block: not worth a copy
        assert lowering.peel_partial_blocks(func).same_as(func)


def _parallel_blocks() -> tirx.PrimFunc:
    """A GEMM's shape after unrolling: row blocks of 3 fused with 2 column panels in one parallel
    loop over 8 row blocks x 2 panels of a (23, 32) @ (32, 32); the partial last block's rows
    are guarded by the fused index alone (``f < 14``) inside the reduction loop, and the
    write-back by the row."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def func(a: T.Buffer((23, 32), "float32"), b: T.Buffer((32, 32), "float32"), c: T.Buffer((23, 32), "float32")):
        for f in T.parallel(16):
            acc = T.alloc_buffer((3, 16), scope="local")
            for i, j in T.grid(3, 16):
                acc[i, j] = T.float32(0)
            for k in range(32):
                for j in range(16):
                    acc[0, j] = acc[0, j] + a[f // 2 * 3, k] * b[k, f % 2 * 16 + j]
                    acc[1, j] = acc[1, j] + a[f // 2 * 3 + 1, k] * b[k, f % 2 * 16 + j]
                    if f < 14:
                        acc[2, j] = acc[2, j] + a[f // 2 * 3 + 2, k] * b[k, f % 2 * 16 + j]
            for i, j in T.grid(3, 16):
                if f // 2 * 3 + i < 23:
                    c[f // 2 * 3 + i, f % 2 * 16 + j] = acc[i, j]

    return func


def test_a_parallel_loop_runs_its_full_blocks_in_a_copy_with_no_guard():
    versioned = lowering.peel_partial_blocks(_parallel_blocks())
    loop = versioned.body
    while not isinstance(loop, tirx.For):
        loop = loop.body
    # still one parallel loop (one launch), whose tasks take the unguarded copy when f < 14
    assert loop.kind == tirx.ForKind.PARALLEL and int(loop.extent) == 16
    branch = loop.body
    assert isinstance(branch, tirx.IfThenElse) and str(branch.condition) == "f < 14"
    # the copy keeps only the write-back's guard (it reads the row loop, not f alone)
    assert [str(g.condition) for g in _guards(branch.then_case)] == ["f // 2 * 3 + i < 23"]
    assert len(_guards(branch.else_case)) == 2
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((23, 32)).astype("float32"), rng.standard_normal((32, 32)).astype("float32")
    outs = []
    for func, compile_ in ((_parallel_blocks(), tvm.compile), (_parallel_blocks(), lowering.compile),
                           (versioned, tvm.compile)):
        out = tvm.runtime.tensor(np.zeros((23, 32), "float32"))
        # each copy allocates its own accumulators (as the pipeline's ConvertSSA makes them)
        module = tirx.transform.ConvertSSA()(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
        compile_(module, target=CPU).jit()["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        outs.append(out.numpy())
    np.testing.assert_allclose(outs[0], a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])
