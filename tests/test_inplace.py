"""Kernels that write over an operand whose last use they are (alt_tvm.graph.inplace)."""

import numpy as np
import pytest
import torch
import tvm
from conftest import host_target
from tvm import relax, te

from alt_tvm.graph.inplace import _overwritable, write_in_place
from alt_tvm.graph.report import ALT_KERNEL_ATTR

N = 16


def _kernel(*, operand_index=lambda i, j: (i, j), alt: bool = True, guarded: bool = False) -> tvm.tirx.PrimFunc:
    """``out = max(a @ a + r[operand_index], 0)``: a GEMM with a residual epilogue, scheduled
    as alt-tvm schedules one (the product in its own block, computed at the epilogue's rows).
    ``guarded``: the product is added in the first ``N - 2`` columns only, as an epilogue
    over padded channels does."""
    a = te.placeholder((N, N), name="a")
    r = te.placeholder((N, N), name="r")
    k = te.reduce_axis((0, N), name="k")
    prod = te.compute((N, N), lambda i, j: te.sum(a[i, k] * a[k, j], axis=k), name="prod")

    def value(i, j):
        product = te.if_then_else(j < N - 2, prod[i, j], 0.0) if guarded else prod[i, j]
        return te.max(product + r[operand_index(i, j)], 0.0)

    out = te.compute((N, N), value, name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, r, out]))
    sch.compute_at(sch.get_sblock("prod"), sch.get_loops(sch.get_sblock("out"))[0])
    func = sch.mod["main"]
    return func.with_attr(ALT_KERNEL_ATTR, True) if alt else func


def _exp() -> tvm.tirx.PrimFunc:
    a = te.placeholder((N, N), name="a")
    return te.create_prim_func([a, te.compute((N, N), lambda i, j: te.exp(a[i, j]), name="e")])


def _module(body, kernel: tvm.tirx.PrimFunc | None = None) -> tvm.IRModule:
    """``main(a, b)`` whose dataflow block ``body(bb, a, b, kernel_gvar, exp_gvar)`` emits."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((N, N), "float32"))
    b = relax.Var("b", relax.TensorType((N, N), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            kernel = kernel if kernel is not None else _kernel()
            gvar = bb.add_func(kernel.with_attr("global_symbol", "residual_gemm"), "residual_gemm")
            exp = bb.add_func(_exp().with_attr("global_symbol", "exp"), "exp")
            out = bb.emit_output(body(bb, a, b, gvar, exp))
        bb.emit_func_output(out)
    return bb.get()


def _call(bb, gvar, args):
    return bb.emit(relax.call_tir(gvar, args, relax.TensorType((N, N), "float32")))


def _run(mod: tvm.IRModule, *inputs: np.ndarray) -> np.ndarray:
    with host_target():
        executable = tvm.compile(mod, target=host_target())
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy()


def _in_place_calls(mod: tvm.IRModule) -> int:
    return mod["main"].script().count("call_tir_inplace")


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal((N, N)).astype("float32") / 4, rng.standard_normal((N, N)).astype("float32")


def _reference(a, b):
    return np.maximum(a @ a + np.exp(b), 0.0)


def test_a_residual_kernel_that_is_the_shortcuts_last_use_writes_over_it(inputs):
    mod = _module(lambda bb, a, b, gvar, exp: _call(bb, gvar, [a, _call(bb, exp, [b])]))
    rewritten, calls, _ = write_in_place(mod, attr=ALT_KERNEL_ATTR)
    assert calls == 1 and _in_place_calls(rewritten) == 1
    assert [p.name for p in rewritten["residual_gemm"].params] == ["a", "r"]  # same name, output bound to r
    np.testing.assert_allclose(_run(rewritten, *inputs), _reference(*inputs), rtol=1e-5, atol=1e-5)


def _used_after(bb, a, b, gvar, exp):
    shortcut = _call(bb, exp, [b])
    return bb.emit(relax.op.add(_call(bb, gvar, [a, shortcut]), shortcut))


def _model_input(bb, a, b, gvar, exp):
    return _call(bb, exp, [_call(bb, gvar, [a, b])])


def _in_a_tuple(bb, a, b, gvar, exp):
    shortcut = _call(bb, exp, [b])
    pair = bb.emit(relax.Tuple([shortcut, a]))
    out = _call(bb, gvar, [a, shortcut])
    return bb.emit(relax.op.add(out, bb.emit(relax.TupleGetItem(pair, 0))))


def _passed_twice(bb, a, b, gvar, exp):
    shortcut = _call(bb, exp, [b])
    return _call(bb, gvar, [shortcut, shortcut])


@pytest.mark.parametrize("body, reference", [
    (_used_after, lambda a, b: _reference(a, b) + np.exp(b)),
    (_model_input, lambda a, b: np.exp(np.maximum(a @ a + b, 0.0))),
    (_in_a_tuple, lambda a, b: _reference(a, b) + np.exp(b)),
    (_passed_twice, lambda a, b: np.maximum(np.exp(b) @ np.exp(b) + np.exp(b), 0.0)),
], ids=["used-after", "model-input", "in-a-tuple", "passed-twice"])
def test_a_shortcut_that_lives_on_or_is_not_the_kernels_own_is_left_alone(inputs, body, reference):
    mod = _module(body)
    rewritten, calls, _ = write_in_place(mod, attr=ALT_KERNEL_ATTR)
    assert calls == 0 and rewritten.same_as(mod)
    np.testing.assert_allclose(_run(rewritten, *inputs), reference(*inputs), rtol=1e-4, atol=1e-4)


def test_a_kernel_is_rewritten_only_where_every_call_can_overwrite(inputs):
    def body(bb, a, b, gvar, exp):
        shortcut = _call(bb, exp, [b])
        first = _call(bb, gvar, [a, _call(bb, exp, [a])])  # its shortcut dies here
        second = _call(bb, gvar, [a, shortcut])  # shortcut is used again below
        return bb.emit(relax.op.add(bb.emit(relax.op.add(first, second)), shortcut))

    rewritten, calls, _ = write_in_place(_module(body), attr=ALT_KERNEL_ATTR)
    assert calls == 0
    a, b = inputs
    expected = np.maximum(a @ a + np.exp(a), 0) + _reference(a, b) + np.exp(b)
    np.testing.assert_allclose(_run(rewritten, a, b), expected, rtol=1e-4, atol=1e-4)


def test_only_kernels_carrying_the_attribute_are_rewritten():
    mod = _module(lambda bb, a, b, gvar, exp: _call(bb, gvar, [a, _call(bb, exp, [b])]), kernel=_kernel(alt=False))
    assert write_in_place(mod, attr=ALT_KERNEL_ATTR)[1] == 0


def test_the_kernel_must_read_the_operand_exactly_where_it_writes():
    assert _overwritable(_kernel(), 1)
    assert not _overwritable(_kernel(operand_index=lambda i, j: (j, i)), 1)  # transposed: read after overwritten
    assert not _overwritable(_kernel(operand_index=lambda i, j: (i, 0)), 1)  # one element read by many
    assert not _overwritable(_kernel(), 0)  # a is read by the product block, at other elements
    assert not _overwritable(_kernel(guarded=True), 1)  # correct in place, but LLVM's code for it is slower


def test_a_kernel_that_accumulates_into_its_output_is_not_overwritable():
    a = te.placeholder((N, N), name="a")
    r = te.placeholder((N, N), name="r")
    k = te.reduce_axis((0, N), name="k")
    out = te.compute((N, N), lambda i, j: te.sum(a[i, k] * r[i, j], axis=k), name="out")
    assert not _overwritable(te.create_prim_func([a, r, out]), 1)


class _Bottleneck(torch.nn.Module):
    """A bottleneck (1x1, 3x3, 1x1 + shortcut), the shortcut computed by a conv of its own."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(16, 8, 1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(8, 16, 1)

    def forward(self, x):
        shortcut = torch.relu(self.stem(x))
        inner = torch.relu(self.conv2(torch.relu(self.conv1(shortcut))))
        return torch.relu(self.conv3(inner) + shortcut)


def test_a_residual_block_built_by_alt_tvm_writes_over_its_shortcut_and_matches_torch(tmp_path):
    import alt_tvm

    model, x = _Bottleneck().eval(), torch.rand(1, 8, 14, 14)
    # Direct convs only: where a target's vectors make the 3x3 convs Winograd ones (8 channels
    # in AVX2's 8 lanes), the shortcut is stored in the Winograd output tiles, another layout
    # than the last conv's output, and cannot be overwritten element for element.
    compiled = alt_tvm.build(model, example_inputs=(x,), strategy_options={"alt": {"winograd": False}})
    assert compiled.report.in_place == 1
    assert "1 kernel calls writing over a dead operand" in compiled.report.summary()
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(compiled(x.numpy())[0], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(compiled(x.numpy())[0], expected, rtol=1e-4, atol=1e-4)  # the input is not consumed
    loaded = alt_tvm.load(compiled.export(tmp_path / "bottleneck.alt"))  # the exported artifact runs in place too
    np.testing.assert_allclose(loaded(x.numpy())[0], expected, rtol=1e-4, atol=1e-4)


def _partitioned_kernel() -> tvm.tirx.PrimFunc:
    """:func:`_kernel` with its row loop partitioned by TVM's ``loop_partition``, which copies the
    blocks under it with the same iteration variables: TIR that TVM's verifier rejects."""
    sch = tvm.s_tir.Schedule(_kernel())
    columns, _ = sch.split(sch.get_loops(sch.get_sblock("out"))[1], [None, 4])
    sch.loop_partition(columns, [N // 4 - 1, None])
    return sch.mod["main"].with_attr(ALT_KERNEL_ATTR, True)


def test_a_kernel_the_analysis_cannot_read_is_left_as_it_is_and_named(inputs):
    kernel = _partitioned_kernel()
    with pytest.raises(Exception, match="multiple definitions"):
        tvm.s_tir.Schedule(kernel)
    mod = _module(lambda bb, a, b, gvar, exp: _call(bb, gvar, [a, _call(bb, exp, [b])]), kernel=kernel)
    rewritten, calls, skipped = write_in_place(mod, attr=ALT_KERNEL_ATTR)
    assert calls == 0 and rewritten.same_as(mod)
    assert list(skipped) == ["residual_gemm"] and "multiple definitions" in skipped["residual_gemm"]
    np.testing.assert_allclose(_run(rewritten, *inputs), _reference(*inputs), rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="multiple definitions"):  # a strict build stops there
        write_in_place(mod, attr=ALT_KERNEL_ATTR, strict=True)


def test_fresh_block_vars_makes_a_partitioned_kernel_analysable(inputs):
    from alt_tvm.strategies.wellformed import fresh_block_vars

    kernel = fresh_block_vars(_partitioned_kernel())
    tvm.s_tir.Schedule(kernel)  # well-formed now
    assert fresh_block_vars(kernel).same_as(kernel)  # nothing left to rename
    mod = _module(lambda bb, a, b, gvar, exp: _call(bb, gvar, [a, _call(bb, exp, [b])]), kernel=kernel)
    rewritten, calls, skipped = write_in_place(mod, attr=ALT_KERNEL_ATTR)
    assert not skipped and calls == 0  # analysed: two blocks write the output, so not in place
    np.testing.assert_allclose(_run(rewritten, *inputs), _reference(*inputs), rtol=1e-5, atol=1e-5)
