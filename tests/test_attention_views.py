"""Attention reading Q, K and V through the views in front of it, from projections that
write each head's rows contiguously (``strategies/views.py``): the index maps against
NumPy, the layout rule, and whole attention blocks written the usual ways against PyTorch,
with the reshape/transpose kernels gone from the built program."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from conftest import torch_to_onnx
from torch import nn
from tvm import relax, te

import alt_tvm
from alt_tvm.strategies.alt.batch_matmul import attention_rows, entries_in_parallel
from alt_tvm.strategies.alt.gemm import row_tile
from alt_tvm.strategies.base import static_shape
from alt_tvm.strategies.views import contiguous_layout, renaming_layout, source_positions, view_source, view_te


def _chain() -> tuple[dict, relax.Var, relax.Var]:
    """``x [6, 1, 24]`` through every kind of view; returns (bindings by var, last, x)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((6, 1, 24), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, [8], axis=2))  # [6, 1, 8] and [6, 1, 16]
            second = bb.emit(relax.TupleGetItem(parts, 1))
            a = bb.emit(relax.op.reshape(second, (6, 1, 2, 2, 4)))
            b = bb.emit(relax.op.permute_dims(a, [2, 1, 3, 0, 4]))  # [2, 1, 2, 6, 4]
            c = bb.emit(relax.op.squeeze(b, [1]))  # [2, 2, 6, 4]
            d = bb.emit(relax.op.take(c, relax.const(1, "int64"), axis=0))  # [2, 6, 4]
            e = bb.emit(relax.op.expand_dims(d, [0]))  # [1, 2, 6, 4]
            f = bb.emit(relax.op.multiply(relax.const(0.5, "float32"), e))
            out = bb.emit_output(f)
        bb.emit_func_output(out)
    func = bb.get()["main"]
    bindings = {b.var: b for block in func.body.blocks for b in block.bindings}
    last = func.body.blocks[0].bindings[-2].var  # the multiply (the last binding is the output alias)
    return bindings, last, func.params[0]


def _numpy_chain(x: np.ndarray) -> np.ndarray:
    second = x[:, :, 8:]
    d = second.reshape(6, 1, 2, 2, 4).transpose(2, 1, 3, 0, 4).squeeze(1)[1]
    return d[None]


def test_source_positions_follow_every_view_as_numpy_does():
    bindings, last, x = _chain()
    source, positions = source_positions(last, bindings)
    assert source.same_as(x)
    np.testing.assert_array_equal(positions, _numpy_chain(np.arange(6 * 24).reshape(6, 1, 24)))


def test_view_stages_compute_what_numpy_does():
    bindings, last, x = _chain()
    order = []  # the views from x to the last one, first first
    var = last
    while var in bindings and view_source(bindings[var], bindings) is not None:
        if not isinstance(bindings[var].value, relax.Call) or bindings[var].value.op.name != "relax.multiply":
            order.append(bindings[var])
        var = view_source(bindings[var], bindings)
    placeholder = te.placeholder((6, 1, 24), "float32", name="x")
    tensor = placeholder
    for k, binding in enumerate(reversed(order)):
        tensor = view_te(binding, tensor, bindings, name=f"view{k}")
    lib = tvm.compile(te.create_prim_func([placeholder, tensor]), target="llvm")
    data = np.random.default_rng(0).standard_normal((6, 1, 24)).astype("float32")
    out = tvm.runtime.tensor(np.zeros([int(s) for s in tensor.shape], "float32"))
    lib(tvm.runtime.tensor(data), out)
    np.testing.assert_array_equal(out.numpy(), _numpy_chain(data))


def _heads(tokens: int, heads: int, depth: int, *, third: int = 0, thirds: int = 1) -> np.ndarray:
    """Positions in ``[tokens, thirds * heads * depth]`` of Q/K/V ``[1, heads, tokens, depth]``."""
    s, h, d = np.indices((tokens, heads, depth))
    return ((s * thirds + third) * heads * depth + h * depth + d).transpose(1, 0, 2)[None]


def test_contiguous_layout_stores_each_head_of_each_operand_as_one_block():
    one = contiguous_layout((1, 128, 768), [_heads(128, 12, 64)])
    assert one.shape == (1, 12, 128, 64)
    stored = one.apply(np.arange(128 * 768).reshape(1, 128, 768)).reshape(-1)
    np.testing.assert_array_equal(stored, _heads(128, 12, 64).reshape(-1))
    # A packed projection (ViT, GPT-2): Q, K and V thirds, each in its heads' blocks.
    reads = [_heads(197, 12, 64, third=t, thirds=3) for t in range(3)]
    packed = contiguous_layout((197, 1, 2304), reads)
    assert packed.shape == (1, 3, 12, 197, 64)
    stored = packed.apply(np.arange(197 * 2304).reshape(197, 1, 2304)).reshape(-1)
    np.testing.assert_array_equal(stored, np.concatenate([r.reshape(-1) for r in reads]))


def test_contiguous_layout_refuses_reads_that_no_split_and_reorder_make_contiguous():
    # one third of a packed projection: the others would have no place
    assert contiguous_layout((197, 2304), [_heads(197, 12, 64, third=1, thirds=3)[0]]) is None
    # a read that is not affine in its index (every other row, then wrapped)
    assert contiguous_layout((8, 4), [np.roll(np.arange(32).reshape(8, 4), 1, axis=0)]) is None
    # operands of different shapes
    assert contiguous_layout((4, 8), [np.arange(16).reshape(4, 4), np.arange(16, 32).reshape(2, 8)]) is None


class _SeparateProjections(nn.Module):
    """BERT's self-attention as Hugging Face writes it: three projections, ``view`` and
    ``transpose`` to heads, ``scaled_dot_product_attention`` (whose export scales Q and K by
    the root of the scale each), heads back and the output projection."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.heads = heads

    def forward(self, x):
        b, t, dim = x.shape

        def split(y):
            return y.view(b, t, self.heads, dim // self.heads).transpose(1, 2)

        context = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.out(context.transpose(1, 2).reshape(b, t, dim))


class _PackedChunk(nn.Module):
    """GPT-2's and BERT-from-scratch style: one packed projection cut by ``chunk``."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.heads = nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        b, t, dim = x.shape
        q, k, v = (y.reshape(b, t, self.heads, -1).transpose(1, 2) for y in self.qkv(x).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) * (dim // self.heads) ** -0.5
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, dim)


class _PackedTake(nn.Module):
    """Swin's window attention: a packed projection reshaped and permuted to
    ``[3, windows, heads, tokens, depth]``, Q, K and V taken from it by index."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.qkv, self.heads = nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        w, t, dim = x.shape
        qkv = self.qkv(x).reshape(w, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q * (dim // self.heads) ** -0.5) @ k.transpose(-2, -1)
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(w, t, dim)


@pytest.mark.parametrize(("model", "shape", "stored"), [
    (_SeparateProjections(), (1, 40, 64), ["1x4x40x16"] * 3),
    # 3 heads: on 2 cores, K^T is packed for all heads in a parallel pass of its own first
    (_SeparateProjections(dim=48, heads=3), (1, 40, 48), ["1x3x40x16"] * 3),
    (_PackedChunk(), (1, 49, 64), ["1x3x4x49x16"]),
    (_PackedTake(), (4, 9, 32), ["3x4x2x9x16"]),
], ids=["separate", "separate-3-heads", "chunk", "take"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_attention_reads_its_projections_in_place_and_matches_torch(model, shape, stored, dynamo, tmp_path):
    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(*shape)
    path = str(tmp_path / "attention.onnx")
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    built = alt_tvm.build(path, strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)
    (attention,) = [k for k in built.report.kernels if "relax.nn.softmax" in k.ops]
    assert "|prologue=view" in attention.workload
    # The projections write Q, K and V in their heads' blocks ...
    assert sorted(k.layout for k in built.report.kernels if k.layout) == stored
    # ... and no kernel moves them there: only the heads going back (before the output
    # projection) are left to TVM.
    moved = [k for k in built.report.kernels if k.kind == "operator"]
    assert len(moved) <= 1, moved
    tvm_kernels = [gv.name_hint for gv, f in built.mod.functions.items()
                   if isinstance(f, tvm.tirx.PrimFunc) and not f.attrs.get("alt_tvm.kernel")]
    assert len([name for name in tvm_kernels if "transpose" in name]) <= 1, tvm_kernels


class _LeakedQuery(nn.Module):
    """Attention whose query the model also returns: the view of it runs as its own op."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.heads = heads

    def forward(self, x):
        b, t, dim = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in (self.q(x), self.k(x), self.v(x)))
        context = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return context, q


def test_a_projection_that_something_else_reads_keeps_its_layout(tmp_path):
    torch.manual_seed(0)
    model, x = _LeakedQuery().eval(), torch.randn(1, 24, 32)
    path = str(tmp_path / "leak.onnx")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
    built = alt_tvm.build(path, strict=True)
    with torch.no_grad():
        want = [t.numpy() for t in model(x)]
    for got, expected in zip(built(x.numpy()), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # K and V are read in place; Q's transpose is a model output, so Q stays canonical.
    assert sorted(k.layout for k in built.report.kernels if k.kind == "partition" and k.layout) \
        == ["1x2x24x16", "1x2x24x16"]


def test_heads_run_in_parallel_by_themselves_only_in_equal_or_many_shares():
    assert entries_in_parallel(12, 2) and entries_in_parallel(2, 2) and entries_in_parallel(9, 2)
    assert not entries_in_parallel(3, 2) and not entries_in_parallel(1, 2) and not entries_in_parallel(12, 16)


def test_attention_blocks_queries_by_a_divisor_of_the_tokens_that_fits_the_registers():
    assert attention_rows(49, vectors=2, registers=32) == 7  # Swin's windows: 7 blocks of 7
    # 7 rows of 4 accumulators each do not fit 16 registers: 4 rows, a partial last block
    assert attention_rows(49, vectors=4, registers=16) == row_tile(49, 4) == 4
    assert attention_rows(197, vectors=2, registers=32) == 4  # prime: no divisor but itself
    assert attention_rows(64, vectors=2, registers=32) == 4



@pytest.mark.parametrize("op, in_shape", [
    (lambda x: relax.op.permute_dims(x, [0, 2, 1]), (1, 12, 8)),
    (lambda x: relax.op.permute_dims(x), (2, 3, 4)),
    (lambda x: relax.op.reshape(x, (1, 8, 3, 4)), (1, 8, 12)),
    (lambda x: relax.op.reshape(x, (4, 6)), (2, 3, 4)),
    (lambda x: relax.op.reshape(x, (1, 4, 8, 8)), (1, 4, 64)),  # SegFormer's tokens to a map
    (lambda x: relax.op.reshape(x, (1, 64, 4)), (1, 4, 8, 8)),
    (lambda x: relax.op.reshape(x, (6, 1, 4, 1)), (2, 3, 4)),
    (lambda x: relax.op.reshape(x, (3, 8)), (2, 3, 4)),  # no shared boundary but the ends
])
def test_renaming_layout_stores_the_result_as_its_input_buffer(op, in_shape):
    """Read through :func:`renaming_layout`, the input's buffer holds the op's result: the
    layout maps the result's shape onto the input's, element for element as NumPy moves them."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(in_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op(x))
        bb.emit_func_output(out)
    binding = bb.get()["main"].body.blocks[0].bindings[0]
    layout = renaming_layout(binding)
    data = np.arange(np.prod(in_shape), dtype="float32").reshape(in_shape)
    name = binding.value.op.name
    if name == "relax.permute_dims":
        axes = binding.value.attrs.axes
        expected = np.transpose(data, None if axes is None else [int(a) for a in axes])
    else:
        expected = data.reshape(static_shape(binding.var))
    assert layout.shape == in_shape
    np.testing.assert_array_equal(layout.inverse_apply(data), expected)
    np.testing.assert_array_equal(layout.apply(expected), data)


def test_a_reshape_that_splits_one_dim_reads_its_source_without_a_division():
    """Tokens (4096) read as a 64 x 64 map: position ``h * 64 + w``, and the other dims as they
    are, not a flat position's quotient and remainder (which a kernel cannot vectorise)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 4096), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.reshape(x, (1, 32, 64, 64)))
        bb.emit_func_output(out)
    layout = renaming_layout(bb.get()["main"].body.blocks[0].bindings[0])
    index = [str(e) for e in layout.forward([tvm.tirx.Var(n, "int32") for n in "nchw"])]
    assert not any("//" in e or "%" in e or "floordiv" in e or "floormod" in e for e in index), index
