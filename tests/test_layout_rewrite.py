"""The TE rewrite pass on every operator family, in three layouts each, checked against PyTorch.

Layouts per family: the canonical one, channels-last (NHWO-style) and the paper's tiled
template (output N.H/ht.W/wt.O/ot.ht.wt.ot, input unfolded into overlapping tiles,
weight O/ot.I/it.K.it.ot), with tile sizes that do not divide the extents (padding).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import tvm
from conftest import host_target
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import te

from alt_tvm import ops
from alt_tvm.layout import Layout, convert_layout, create_prim_func, rewrite
from alt_tvm.layout.examples import fig3_prim_func
from alt_tvm.layout.rewrite import padding_reach
from alt_tvm.layout.templates import (
    channels_last,
    conv_input_unfolded,
    conv_output_tiled,
    conv_weight_tiled,
    matrix_tiled,
    weight_channels_last,
)

F = torch.nn.functional
LAYOUT_KINDS = ["canonical", "channels_last", "tiled"]


def run_with_layouts(args, layouts, inputs):
    """Rewrite, compile and run; pack inputs and unpack outputs with their layouts."""
    placeholders = [t for t in args if isinstance(t.op, te.PlaceholderOp)]
    outputs = [t for t in args if not isinstance(t.op, te.PlaceholderOp)]
    result = rewrite(outputs, layouts=layouts)
    executable = tvm.compile(te.create_prim_func(result.args(args)), target=host_target()).jit()
    values = dict(zip(placeholders, inputs))
    guests = [step.key for layout in layouts.values() for step in layout.guests]
    dev = tvm.cpu()
    packed = []
    for tensor in placeholders:
        if any(tensor.same_as(g) for g in guests):
            continue  # a store_at guest travels inside its host's buffer
        layout = result.layout_of(tensor)
        packed.append(layout.apply(values[tensor], guests=[values[g.key] for g in layout.guests]))
    outs = [np.zeros(result.layout_of(t).shape, str(t.dtype)) for t in outputs]
    tensors = [tvm.runtime.tensor(a, dev) for a in packed + outs]
    executable["main"](*tensors)
    return [result.layout_of(t).inverse_apply(o.numpy()) for t, o in zip(outputs, tensors[len(packed):])]


def assert_close(got, ref):
    ref = np.asarray(ref)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@dataclass
class ConvCase:
    name: str
    data: tuple
    weight: tuple
    build: Callable  # (data, weight) -> out te.Tensor
    reference: Callable  # (x, w) -> torch tensor
    tiles: tuple  # spatial tiles of the tiled template
    ot: int = 4
    it: int = 3
    transposed: bool = False


CONV_CASES = [
    ConvCase("conv1d_stride2", (2, 4, 19), (6, 4, 3),
             lambda d, w: ops.conv1d(d, w, stride=2, padding=1),
             lambda x, w: F.conv1d(x, w, stride=2, padding=1), tiles=(4,)),
    ConvCase("conv2d_stride2", (1, 5, 13, 11), (8, 5, 3, 3),
             lambda d, w: ops.conv2d(d, w, stride=2, padding=1),
             lambda x, w: F.conv2d(x, w, stride=2, padding=1), tiles=(3, 4), ot=3),
    ConvCase("conv2d_dilation2", (1, 3, 12, 14), (5, 3, 3, 3),
             lambda d, w: ops.conv2d(d, w, padding=2, dilation=2),
             lambda x, w: F.conv2d(x, w, padding=2, dilation=2), tiles=(5, 4), ot=4, it=2),
    ConvCase("conv2d_grouped", (1, 6, 9, 9), (4, 3, 3, 3),
             lambda d, w: ops.conv2d(d, w, padding=1, groups=2),
             lambda x, w: F.conv2d(x, w, padding=1, groups=2), tiles=(4, 4), ot=3, it=4),
    ConvCase("conv2d_depthwise", (1, 8, 10, 10), (8, 1, 3, 3),
             lambda d, w: ops.conv2d(d, w, stride=2, padding=1, groups=8),
             lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=8), tiles=(2, 3), ot=8, it=8),
    ConvCase("conv3d", (1, 3, 6, 7, 5), (4, 3, 3, 3, 3),
             lambda d, w: ops.conv3d(d, w, stride=(1, 2, 1), padding=1),
             lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1), tiles=(4, 2, 3), ot=3, it=2),
    ConvCase("conv_transpose2d", (1, 4, 5, 6), (4, 3, 3, 3),
             lambda d, w: ops.conv_transpose2d(d, w, stride=2, padding=1, output_padding=1),
             lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
             tiles=(4, 5), ot=2, it=3, transposed=True),
    ConvCase("conv_transpose3d_grouped", (1, 4, 3, 4, 3), (4, 1, 2, 3, 2),
             lambda d, w: ops.conv_transpose3d(d, w, stride=2, groups=2),
             lambda x, w: F.conv_transpose3d(x, w, stride=2, groups=2), tiles=(3, 4, 2), ot=1, it=3,
             transposed=True),
]


def conv_layouts(case: ConvCase, out: te.Tensor, weight: te.Tensor, kind: str) -> dict:
    conv = out
    source = conv.op.input_tensors[0]  # the pad / dilate_pad stage feeding the window reads
    shape = lambda t: tuple(int(s) for s in t.shape)  # noqa: E731
    if kind == "canonical":
        return {}
    if kind == "channels_last":
        return {conv: channels_last(shape(conv)), source: channels_last(shape(source)),
                weight: weight_channels_last(shape(weight))}
    attrs = {k: list(v) if hasattr(v, "__len__") else v for k, v in conv.op.attrs.items()}
    kernel = shape(weight)[2:]
    strides = [int(s) for s in attrs.get("strides", [1] * len(kernel))]
    dilation = [int(d) for d in attrs.get("dilation", [1] * len(kernel))]
    if case.transposed:
        strides = [1] * len(kernel)  # the conv after dilate_pad always has stride 1
    return {
        conv: conv_output_tiled(shape(conv), spatial_tiles=case.tiles, channel_tile=case.ot),
        source: conv_input_unfolded(shape(source), spatial_tiles=case.tiles, channel_tile=case.it,
                                    kernel=kernel, strides=strides, dilation=dilation),
        weight: conv_weight_tiled(shape(weight), out_tile=case.ot, in_tile=case.it),
    }


@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c.name)
def test_conv_family_in_layout_matches_pytorch(case, kind):
    rng = np.random.default_rng(abs(hash(case.name)) % 2**32)
    x = rng.standard_normal(case.data, dtype=np.float32)
    w = rng.standard_normal(case.weight, dtype=np.float32)
    data = te.placeholder(case.data, name="data")
    weight = te.placeholder(case.weight, name="weight")
    out = case.build(data, weight)
    layouts = conv_layouts(case, out, weight, kind)
    if kind == "tiled":
        assert any(p.kind == "unfold" for p in layouts[out.op.input_tensors[0]].primitives)
    (got,) = run_with_layouts([data, weight, out], layouts, [x, w])
    assert_close(got, case.reference(torch.from_numpy(x), torch.from_numpy(w)).numpy())


GEMM_CASES = {
    # name: (shapes, build, reference)
    "dense": ([(5, 10), (13, 10)], lambda a, b: ops.dense(a, b), lambda a, b: a @ b.T),
    "matmul": ([(6, 9), (9, 7)], lambda a, b: ops.matmul(a, b), lambda a, b: a @ b),
    "batch_matmul": ([(3, 5, 6), (3, 6, 7)], lambda a, b: ops.batch_matmul(a, b), lambda a, b: a @ b),
}


def gemm_layouts(tensors, kind):
    if kind == "canonical":
        return {}
    layouts = {}
    for t in tensors:
        shape = tuple(int(s) for s in t.shape)
        if kind == "channels_last":  # swap the two matrix dims (column-major storage)
            rank = len(shape)
            layouts[t] = Layout(shape).reorder([*range(rank - 2), rank - 1, rank - 2])
        else:
            layouts[t] = matrix_tiled(shape, tiles=[4, 3])
    return layouts


@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@pytest.mark.parametrize("name", sorted(GEMM_CASES))
def test_gemm_family_in_layout_matches_reference(name, kind):
    shapes, build, reference = GEMM_CASES[name]
    rng = np.random.default_rng(7)
    a_np, b_np = (rng.standard_normal(s, dtype=np.float32) for s in shapes)
    a = te.placeholder(shapes[0], name="a")
    b = te.placeholder(shapes[1], name="b")
    out = build(a, b)
    (got,) = run_with_layouts([a, b, out], gemm_layouts([a, b, out], kind), [a_np, b_np])
    assert_close(got, reference(a_np.astype(np.float64), b_np.astype(np.float64)))


def test_unfolded_placeholder_gives_paper_fig3_accesses():
    """Input unfolded as a function argument: accesses become Inp[n][oh][ow][i][ih+rh][iw+rw]."""
    func, layouts = fig3_prim_func(size=8, channels=3, out_channels=8, ot=4)
    text = func.script()
    assert "Inp[0, v_h_o, v_w_o, v_i, v_h_i + v_rh, v_w_i + v_rw]" in text
    assert "Ker[v_o_o, v_i, v_rh, v_rw, v_o_i]" in text
    conv, inp, ker = list(layouts)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(tuple(int(s) for s in inp.shape), dtype=np.float32)
    w = rng.standard_normal(tuple(int(s) for s in ker.shape), dtype=np.float32)
    (got,) = run_with_layouts([inp, ker, conv], layouts, [x, w])
    assert_close(got, F.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy())


def test_unfold_with_stride_and_dilation_uses_equation_1():
    data = te.placeholder((1, 2, 21), name="data")
    weight = te.placeholder((3, 2, 3), name="weight")
    out = ops.conv(data, weight, strides=(2,), dilation=(2,))  # V=2, M=5: out 9 wide
    # Output tile of 3 windows: B = (3-1)*2 + 5 = 9, S = 6.
    layouts = {data: Layout((1, 2, 21)).unfold(2, 9, 6), out: Layout((1, 3, 9)).split(2, [3, 3])}
    text = create_prim_func([data, weight, out], layouts=layouts).script()
    assert "data[0, v_rc, v_w_o, v_w_i * 2 + v_rw * 2]" in text, text
    x = np.random.default_rng(0).standard_normal((1, 2, 21), dtype=np.float32)
    w = np.random.default_rng(1).standard_normal((3, 2, 3), dtype=np.float32)
    (got,) = run_with_layouts([data, weight, out], layouts, [x, w])
    assert_close(got, F.conv1d(torch.from_numpy(x), torch.from_numpy(w), stride=2, dilation=2).numpy())


def test_unfold_that_does_not_match_the_window_is_rejected():
    data = te.placeholder((1, 1, 10), name="data")
    weight = te.placeholder((1, 1, 3), name="weight")
    out = ops.conv(data, weight, strides=(1,), dilation=(1,))
    # Tiles of 3 with stride 4 leave gaps, and no window fits the (4 - 1) * 1 + 3 = 6 needed.
    with pytest.raises(ValueError, match="leaves gaps"):
        create_prim_func([data, weight, out], layouts={data: Layout((1, 1, 10)).unfold(2, 3, 4)})


def test_store_at_reads_bias_from_weight_buffer():
    x = te.placeholder((4, 6), name="x")
    w = te.placeholder((5, 6), name="w")
    bias = te.placeholder((5,), name="bias")
    k = te.reduce_axis((0, 6), "k")
    y = te.compute((4, 5), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="y")
    out = te.compute((4, 5), lambda i, j: y[i, j] + bias[j], name="out")
    layouts = {w: Layout((5, 6)).store_at(bias, dim=1)}
    result = rewrite([out], layouts=layouts)
    args = result.args([x, w, bias, out])
    assert [a.op.name for a in args] == ["x", "w", "out"]
    assert tuple(int(s) for s in args[1].shape) == (5, 7)
    text = te.create_prim_func(args).script()
    assert "w[v_j, 6]" in text
    rng = np.random.default_rng(5)
    xv, wv, bv = (rng.standard_normal(s, dtype=np.float32) for s in [(4, 6), (5, 6), (5,)])
    (got,) = run_with_layouts([x, w, bias, out], layouts, [xv, wv, bv])
    assert_close(got, xv @ wv.T + bv)


def test_padded_output_guards_only_when_reads_could_leave_the_buffer():
    a = te.placeholder((5, 3), name="a")
    out = te.compute((5, 3), lambda i, j: a[i, j] * 2.0, name="out")
    padded = Layout((5, 3)).pad(0, 3).split(0, [2, 4])
    text = create_prim_func([a, out], layouts={out: padded}).script()
    assert "if_then_else" in text  # rows 5..7 do not exist in `a`
    both = create_prim_func([a, out], layouts={out: padded, a: padded}).script()
    assert "if_then_else" not in both  # `a` is padded the same way: reads stay inside
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    (got,) = run_with_layouts([a, out], {out: padded, a: padded}, [x])
    assert_close(got, 2 * x)


def test_a_padded_output_holds_zeros_where_the_padding_of_its_inputs_is_nan():
    """An output reached at its padding with in-bounds reads is selected to zero there (a vector
    blend); the intermediate stage is not guarded, and a NaN in its padding goes no further."""
    a = te.placeholder((5, 3), name="a")
    scale = te.placeholder((5, 1), name="scale")  # padded with zeros: a / scale is NaN there
    mid = te.compute((5, 3), lambda i, j: a[i, j] / scale[i, 0], name="mid")
    out = te.compute((5, 3), lambda i, j: mid[i, j] + 1.0, name="out")
    padded = Layout((5, 3)).pad(0, 3).split(0, [2, 4])
    layouts = {a: padded, scale: Layout((5, 1)).pad(0, 3), mid: padded, out: padded}
    result = rewrite([out], layouts=layouts)
    func = te.create_prim_func(result.args([a, scale, out]))
    text = func.script()
    assert "if_then_else" not in text and text.count("T.Select") == 1  # on `out` only
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    s = np.arange(1, 6, dtype=np.float32).reshape(5, 1)
    packed = padded.apply(x)
    packed[1, 1:] = np.nan  # rows 5..7 of `a`: padding the kernel must not pass on
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(v, dev) for v in (packed, np.pad(s, ((0, 3), (0, 0))), np.full(padded.shape, 7.0,
                                                                                                  np.float32))]
    tvm.compile(func, target=host_target()).jit()["main"](*tensors)
    got = tensors[2].numpy()
    np.testing.assert_array_equal(got[1, 1:], 0.0)
    assert_close(padded.inverse_apply(got), x / s + 1)


def test_padding_reach_says_how_far_a_layout_stores_beyond_each_dimension():
    assert padding_reach(conv_output_tiled((1, 104, 28, 28), spatial_tiles=[2, 28], channel_tile=16)) == \
        [(0, 0), (0, 8), (0, 0), (0, 0)]
    assert padding_reach(Layout((5, 3)).pad(1, (2, 1)).reorder([1, 0])) == [(0, 0), (2, 1)]
    assert padding_reach(Layout((6, 8)).split(1, [2, 4])) == [(0, 0), (0, 0)]


def test_convert_layout_between_two_tiled_layouts():
    src = Layout((6, 8)).split(1, [2, 4]).reorder([1, 0, 2])
    dst = Layout((6, 8)).pad(0, 2).split(0, [2, 4]).reorder([1, 0, 2])
    packed = te.placeholder(src.shape, name="packed")
    converted = convert_layout(packed, src=src, dst=dst)
    assert tuple(int(s) for s in converted.shape) == dst.shape
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    func = te.create_prim_func([packed, converted])
    executable = tvm.compile(func, target=host_target()).jit()
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(dst.shape, np.float32), dev)
    executable["main"](tvm.runtime.tensor(src.apply(x), dev), out)
    np.testing.assert_array_equal(dst.inverse_apply(out.numpy()), x)
    with pytest.raises(ValueError, match="different tensors"):
        convert_layout(packed, src=src, dst=Layout((8, 6)))


def test_layout_shape_mismatch_names_the_tensor():
    a = te.placeholder((4, 4), name="a")
    out = te.compute((4, 4), lambda i, j: a[i, j], name="out")
    with pytest.raises(ValueError, match=r"layout for 'a' starts from shape \(4, 5\)"):
        rewrite([out], layouts={a: Layout((4, 5))})


def test_rewritten_function_takes_loop_primitives():
    """The result is an ordinary PrimFunc: split/reorder/vectorize/parallel/cache/compute_at work."""
    data = te.placeholder((1, 4, 18, 18), name="data")
    weight = te.placeholder((16, 4, 3, 3), name="weight")
    conv = ops.conv2d(data, weight, padding=1)
    out = ops.relu(conv)
    tiled = conv_output_tiled((1, 16, 18, 18), spatial_tiles=[6, 6], channel_tile=8)
    layouts = {conv: tiled, out: tiled,
               conv.op.input_tensors[0]: conv_input_unfolded((1, 4, 20, 20), spatial_tiles=[6, 6], channel_tile=4,
                                                             kernel=[3, 3]),
               weight: conv_weight_tiled((16, 4, 3, 3), out_tile=8, in_tile=4)}
    func = create_prim_func([data, weight, out], layouts=layouts)
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(conv.op.name)
    n, ho, wo, oo, hi, wi, oi, rc, rh, rw = sch.get_loops(block)
    wio, wii = sch.split(wi, [None, 3])
    sch.reorder(n, ho, wo, oo, wio, rc, rh, rw, hi, wii, oi)
    sch.cache_read(block, 1, "global")
    write_back = sch.cache_write(block, 0, "local")
    sch.vectorize(oi)
    sch.unroll(wii)
    sch.parallel(sch.fuse(n, ho, wo))
    sch.reverse_compute_at(write_back, oo)
    sch.reverse_compute_at(sch.get_sblock(out.op.name), oo)
    sch.compute_inline(sch.get_sblock(conv.op.input_tensors[0].op.name))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 4, 18, 18), dtype=np.float32)
    w = rng.standard_normal((16, 4, 3, 3), dtype=np.float32)
    executable = tvm.compile(sch.mod, target=host_target()).jit()
    dev = tvm.cpu()
    y = tvm.runtime.tensor(np.zeros(tiled.shape, np.float32), dev)
    executable["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(layouts[weight].apply(w), dev), y)
    assert_close(tiled.inverse_apply(y.numpy()), F.relu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1)))


@pytest.mark.parametrize("extent, tile, stride", [(11, 5, 3), (12, 3, 3), (13, 7, 2)])
def test_elementwise_read_of_unfolded_tensor(extent, tile, stride):
    """Reads of single elements pick a tile holding them; the last tile may be clamped."""
    a = te.placeholder((2, extent), name="a")
    out = ops.relu(a)
    layouts = {a: Layout((2, extent)).unfold(1, tile, stride)}
    text = create_prim_func([a, out], layouts=layouts).script()
    # Tiles that only just cover the reads need no clamp.
    assert ("T.min" in text) == (Layout((extent,)).unfold(0, tile, stride).shape[0] * stride < extent)
    x = np.random.default_rng(2).standard_normal((2, extent), dtype=np.float32)
    (got,) = run_with_layouts([a, out], layouts, [x])
    assert_close(got, np.maximum(x, 0))


def test_conversion_op_is_exported_from_ops():
    assert ops.convert_layout is convert_layout


@settings(max_examples=12, deadline=None)
@given(stride=st.integers(1, 3), dilation=st.integers(1, 2), kernel=st.integers(1, 4),
       out_width=st.integers(1, 9), tile=st.integers(1, 5), slack=st.integers(0, 2))
def test_unfold_rewrite_of_random_sliding_windows(stride, dilation, kernel, out_width, tile, slack):
    """Equation (1) for any stride V and window M, with tiles of exactly or more than P windows."""
    window = (kernel - 1) * dilation + 1
    width = (out_width - 1) * stride + window
    data = te.placeholder((1, 2, width), name="data")
    weight = te.placeholder((3, 2, kernel), name="weight")
    out = ops.conv(data, weight, strides=(stride,), dilation=(dilation,))
    tile = min(tile, out_width)
    size = min((tile - 1) * stride + window + slack, width)
    layouts = {data: Layout((1, 2, width)).unfold(2, size, tile * stride)}
    rng = np.random.default_rng(stride * 100 + kernel)
    x = rng.standard_normal((1, 2, width), dtype=np.float32)
    w = rng.standard_normal((3, 2, kernel), dtype=np.float32)
    (got,) = run_with_layouts([data, weight, out], layouts, [x, w])
    ref = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, dilation=dilation)
    assert_close(got, ref.numpy())
