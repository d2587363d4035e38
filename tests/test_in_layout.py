"""Operators without a strategy computed in their producers' tiled layouts: no conversion kernels.

Each model is a CNN pattern from a public architecture; each build must match PyTorch
and must have no layout conversion (a conversion of the graph input is allowed, as the
first convolution reads the user's row-major array).
"""

import numpy as np
import onnx
import pytest
import torch
import tvm
from conftest import torch_to_onnx
from torch import nn

from alt_tvm.graph import canonical
from alt_tvm.graph.build import build
from alt_tvm.layout import Layout


class _MaxPoolThenTwo1x1(nn.Module):  # ResNet's stem: pool feeding the block and its shortcut
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.a, self.b = nn.Conv2d(16, 16, 1), nn.Conv2d(16, 32, 1)

    def forward(self, x):
        y = self.pool(torch.relu(self.stem(x)))
        return self.a(y).sum(1, keepdim=True) + self.b(y).mean(1, keepdim=True)


class _StridedShortcut(nn.Module):  # ResNet's downsampling 1x1 conv, stride 2, no padding
    def __init__(self):
        super().__init__()
        self.c1, self.down = nn.Conv2d(8, 32, 3, padding=1), nn.Conv2d(32, 64, 1, stride=2)

    def forward(self, x):
        return self.down(torch.relu(self.c1(x)))


class _SqueezeExcite(nn.Module):  # EfficientNet / MobileNet-V3: mean, two 1x1 convs, scale, project
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.reduce, self.expand = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
        self.project = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = nn.functional.hardswish(self.dw(x))
        s = torch.sigmoid(self.expand(torch.relu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return self.project(y * s)


class _GroupedSqueezeExcite(nn.Module):  # RegNet-Y: grouped 3x3 (groups of 8), SE, 1x1 project (16 lanes: tiles differ)
    def __init__(self, channels: int = 48, width: int = 8):
        super().__init__()
        self.grouped = nn.Conv2d(channels, channels, 3, padding=1, groups=channels // width)
        self.reduce, self.expand = nn.Conv2d(channels, 12, 1), nn.Conv2d(12, channels, 1)
        self.project = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        y = torch.relu(self.grouped(x))
        s = torch.sigmoid(self.expand(torch.relu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return self.project(y * s)


class _Inception(nn.Module):  # GoogLeNet / SqueezeNet / DenseNet: branches concatenated, read by 1x1 convs
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.b1, self.b2 = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 1, 1)
        self.next1, self.next2 = nn.Conv2d(32, 16, 1), nn.Conv2d(32, 8, 1)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        cat = torch.cat([self.b1(y), self.b2(y), self.pool(y)], 1)
        return torch.cat([self.next1(cat), self.next2(self.pool(cat))], 1)


class _DenseBlock(nn.Module):  # DenseNet: batch norm + ReLU before each conv, on the growing concatenation
    def __init__(self, stem: int = 32, growth: int = 16, layers: int = 2):
        super().__init__()
        self.stem = nn.Conv2d(3, stem, 3, padding=1)
        self.norms, self.convs = nn.ModuleList(), nn.ModuleList()
        for k in range(layers):
            channels = stem + k * growth
            self.norms.append(nn.BatchNorm2d(channels))
            self.convs.append(nn.Sequential(nn.Conv2d(channels, 2 * growth, 1), nn.ReLU(),
                                            nn.Conv2d(2 * growth, growth, 3, padding=1)))
        for norm in self.norms:  # statistics far from the identity, so a wrong fold shows
            with torch.no_grad():
                norm.running_mean.uniform_(-1, 1)
                norm.running_var.uniform_(0.5, 2)
                norm.weight.uniform_(0.5, 2)
                norm.bias.uniform_(-1, 1)

    def forward(self, x):
        features = [self.stem(x)]
        for norm, conv in zip(self.norms, self.convs):
            features.append(conv(torch.relu(norm(torch.cat(features, 1)))))
        return torch.cat(features, 1)


class _ConvNeXtBlock(nn.Module):  # depthwise 7x7, layer norm over channels between permutes
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 32)

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        return self.fc(y).permute(0, 3, 1, 2)


class _Classifier(nn.Module):  # global pooling and flatten before the linear head
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1), 1))


class _PaddedChannels(nn.Module):  # ShuffleNet's 58/116 and SqueezeNet's 1000 channels
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 58, 3, padding=1), nn.Conv2d(58, 116, 1)
        self.squeeze, self.excite = nn.Conv2d(116, 16, 1), nn.Conv2d(16, 116, 1)
        self.head = nn.Conv2d(116, 1000, 1)

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x))))
        scale = torch.sigmoid(self.excite(torch.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        y = nn.functional.max_pool2d(y * scale, 2)
        return torch.flatten(nn.functional.adaptive_avg_pool2d(torch.relu(self.head(y)), 1), 1)


class _ShuffleUnit(nn.Module):  # ShuffleNet-V2's stride-1 unit: chunk, one half's branch, concat, shuffle
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 116, 3, padding=1)
        self.branch = nn.Sequential(nn.Conv2d(58, 58, 1), nn.ReLU(), nn.Conv2d(58, 58, 3, padding=1, groups=58),
                                    nn.Conv2d(58, 58, 1), nn.ReLU())
        self.head = nn.Conv2d(116, 32, 1)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        kept, changed = y.chunk(2, dim=1)
        y = torch.cat((kept, self.branch(changed)), dim=1)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        return self.head(y)


CASES = {
    "max_pool_read_by_two_1x1_convs": (_MaxPoolThenTwo1x1, (1, 3, 32, 32)),
    "strided_1x1_conv": (_StridedShortcut, (1, 8, 28, 28)),
    "squeeze_excitation": (_SqueezeExcite, (1, 32, 14, 14)),
    "grouped_conv_squeeze_excitation": (_GroupedSqueezeExcite, (1, 48, 28, 28)),
    "concatenated_branches": (_Inception, (1, 3, 28, 28)),
    "dense_block": (_DenseBlock, (1, 3, 16, 16)),
    "layer_norm_between_permutes": (_ConvNeXtBlock, (1, 16, 14, 14)),
    "global_pool_flatten_classifier": (_Classifier, (1, 8, 14, 14)),
    "padded_channel_tiles": (_PaddedChannels, (1, 3, 16, 16)),
    "channel_split_and_shuffle": (_ShuffleUnit, (1, 3, 12, 12)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cnn_pattern_builds_without_layout_conversions(case):
    make, shape = CASES[case]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    built = build(model, example_inputs=[x])
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    inner = [k for k in built.report.kernels if k.kind == "conversion" and not k.boundary]
    assert inner == [], [k.detail[:120] for k in inner]
    operators = [k for k in built.report.kernels if k.kind == "operator"]
    if case != "strided_1x1_conv":  # (that one is two convs: the second reads the first's tiles)
        assert operators, "the pattern's ops without a strategy should run in the producers' layouts"


def test_max_pool_writes_the_layout_its_1x1_consumers_read():
    """Backward propagation to a non-element-wise op: the pool's output is stored tiled."""
    torch.manual_seed(0)
    model = _MaxPoolThenTwo1x1().eval()
    built = build(model, example_inputs=[torch.randn(1, 3, 32, 32)])
    pool = next(k for k in built.report.kernels if k.ops == ("relax.nn.max_pool2d",))
    assert pool.kind == "operator" and pool.layout and pool.layout != "1x16x16x16"
    func = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == pool.name)
    shapes = [tuple(int(d) for d in p.ty.shape) for p in func.params]
    assert all(len(s) > 4 for s in shapes), shapes  # reads and writes tiled buffers
    # The padded input is written per parallel iteration (the rows its windows read), not first
    # for the whole map: the one parallel loop holds both the padding and the pooling.
    script = func.script()
    assert script.count("T.parallel(") == 1, script
    parallel = script.index("T.parallel(")
    assert parallel < script.index('T.sblock("max_pool_pad")') < script.index('T.sblock("max_pool")'), script


def test_channel_counts_vectors_do_not_divide_are_stored_padded(x86_target):
    """58, 116 and 1000 channels are stored in whole vectors (58 and 116 padded, to 64 and 128
    with 16 lanes), through the squeeze-excitation, the pools and the global pool, with no
    conversion in between."""
    torch.manual_seed(0)
    model = _PaddedChannels().eval()
    built = build(model, target=x86_target, example_inputs=[torch.randn(1, 3, 16, 16)])
    lanes = x86_target.vector_lanes("float32")
    sizes = {int(np.prod([int(d) for d in k.layout.split("x")])) for k in built.report.kernels if k.layout}

    def stored_whole(channels: int, plane: int) -> bool:  # padded up to a channel tile of whole vectors
        return any(size % plane == 0 and (size // plane) % lanes == 0
                   and channels <= size // plane < channels + 3 * lanes for size in sizes)

    assert stored_whole(58, 16 * 16) and stored_whole(116, 16 * 16) and stored_whole(1000, 8 * 8), sorted(sizes)
    assert all(size % lanes == 0 for size in sizes), sorted(sizes)


def test_relayout_reads_a_padded_input_and_zero_fills_a_padded_output():
    import tvm
    from tvm import relax

    from alt_tvm.graph.in_layout import legalize_alone, relayout
    from alt_tvm.layout import Layout
    from alt_tvm.target import host

    x = relax.Var("x", relax.TensorType((1, 20, 6, 6), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        builder.emit_func_output(builder.emit(relax.op.nn.max_pool2d(x, (2, 2), (2, 2))))
    legal = legalize_alone(builder.get()["main"].body.blocks[0].bindings[0].value)
    src = Layout((1, 20, 6, 6)).pad(1, 12).split(1, [2, 16]).reorder([0, 1, 3, 4, 2])
    dst = Layout((1, 20, 3, 3)).pad(1, 4).split(1, [3, 8]).reorder([0, 1, 3, 4, 2])
    func = relayout(legal.func, [src], dst)
    data = np.random.default_rng(0).standard_normal((1, 20, 6, 6)).astype("float32")
    stored = src.apply(data)
    stored[:, 1, :, :, 4:] = np.nan  # padding is never read
    lib = tvm.tirx.build(func.with_attr("global_symbol", "main"), target=host().to_tvm())
    out = tvm.runtime.tensor(np.full(dst.shape, 7.0, np.float32), tvm.cpu())
    lib["main"](tvm.runtime.tensor(stored, tvm.cpu()), out)
    out = out.numpy()
    ref = data.reshape(1, 20, 3, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(dst.inverse(lossy=True).apply(out), ref)
    assert np.all(out[:, 2, :, :, 4:] == 0)  # channels 20..23: zeros


def test_relayout_finds_the_output_by_identity_where_stages_share_its_name():
    """TVM's GELU legalization names its product stages and its output all ``T_multiply``;
    the output, not the first stage of that name, is written in the tiled layout (a name
    lookup left FastViT's GELU writing a row-major map where its consumer read a tiled one)."""
    import tvm
    from tvm import relax

    from alt_tvm.graph.in_layout import legalize_alone, relayout

    shape = (1, 16, 4, 4)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        builder.emit_func_output(builder.emit(relax.op.nn.gelu(x)))
    legal = legalize_alone(builder.get()["main"].body.blocks[0].bindings[0].value)
    names = [p.name for p in legal.func.params]
    assert legal.func.script().count(f'{names[-1]} = T.sblock_alloc_buffer') == 0  # printer renames the stages
    tiled = Layout(shape).split(1, [8, 2]).split(3, [2, 2]).reorder([0, 1, 3, 4, 2, 5])
    func = relayout(legal.func, [tiled], tiled)
    assert [tuple(int(d) for d in p.ty.shape) for p in func.params] == [tuple(tiled.shape)] * 2
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    lib = tvm.tirx.build(func.with_attr("global_symbol", "main"), target="llvm")
    out = tvm.runtime.tensor(np.zeros(tiled.shape, np.float32), tvm.cpu())
    lib["main"](tvm.runtime.tensor(tiled.apply(data), tvm.cpu()), out)
    expected = torch.nn.functional.gelu(torch.from_numpy(data)).numpy()
    np.testing.assert_allclose(tiled.inverse().apply(out.numpy()), expected, rtol=1e-5, atol=1e-6)


def test_relayout_rejects_a_layout_of_another_shape():
    from tvm import relax

    from alt_tvm.graph.in_layout import legalize_alone, relayout
    from alt_tvm.layout import Layout

    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        builder.emit_func_output(builder.emit(relax.op.nn.max_pool2d(x, (2, 2), (2, 2))))
    call = builder.get()["main"].body.blocks[0].bindings[0].value  # normalized: its type is known
    legal = legalize_alone(call)
    assert legal is not None and legal.args == (x,)
    with pytest.raises(ValueError, match=r"layout .* is for shape \(1, 16, 4, 4\), but buffer"):
        relayout(legal.func, [Layout((1, 16, 4, 4)).split(1, [2, 8])], None)


def test_dense_block_norms_are_one_kernel_and_concatenations_copy_each_input_alone():
    """A batch norm + ReLU is one pass over memory (multiply, add, ReLU in one kernel), and a
    concatenation of channel-vector-aligned maps copies each input in a loop of its own
    (no per-element selection), all inside one parallel loop."""
    torch.manual_seed(0)
    built = build(_DenseBlock().eval(), example_inputs=[torch.randn(1, 3, 16, 16)])
    chains = [k.ops for k in built.report.kernels if k.kind == "elementwise"]
    assert chains == [("relax.multiply", "relax.add", "relax.nn.relu")] * 2, chains
    concats = [k for k in built.report.kernels if k.ops == ("relax.concat",)]
    assert len(concats) == 2  # the single-map concatenation of the first layer is gone
    for kernel in concats:
        func = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == kernel.name)
        script = func.script()
        inputs = len(func.params) - 1
        assert script.count("T.parallel(") == 1, script
        assert script.count("_partition") == inputs, script  # one copy loop per input


@pytest.mark.parametrize("sizes, aligned", [((32, 16, 16), True), ((24, 8), False)])
def test_schedule_concat_copies_each_input_and_matches_numpy(sizes, aligned):
    import tvm
    from tvm import relax

    from alt_tvm.graph.in_layout import channel_blocked, legalize_alone, relayout, schedule_concat
    from alt_tvm.target import host

    # The layouts pin channel blocks of 16 (not the host's vector width: the schedule and its
    # expectation are the same on AVX2, where LLVM splits each 16-wide copy in two).
    block, hw = 16, 6
    xs = [relax.Var(f"x{i}", relax.TensorType((1, c, hw, hw), "float32")) for i, c in enumerate(sizes)]
    builder = relax.BlockBuilder()
    with builder.function("main", xs):
        builder.emit_func_output(builder.emit(relax.op.concat(relax.Tuple(xs), axis=1)))
    call = builder.get()["main"].body.blocks[0].bindings[0].value
    legal = legalize_alone(call)
    out_layout = channel_blocked((1, sum(sizes), hw, hw), block)
    in_layouts = [channel_blocked((1, c, hw, hw), block) for c in sizes]
    scheduled = schedule_concat(relayout(legal.func, in_layouts, out_layout), cores=2, output=out_layout,
                                axis=1, sizes=list(sizes))
    if not aligned:
        assert scheduled is None  # 24 channels do not end on a block of 16: the general schedule
        return
    rng = np.random.default_rng(0)
    data = [rng.standard_normal((1, c, hw, hw)).astype(np.float32) for c in sizes]

    def blocked(a):
        return a.reshape(1, a.shape[1] // block, block, hw, hw).transpose(0, 1, 3, 4, 2)

    lib = tvm.tirx.build(scheduled.with_attr("global_symbol", "main"), target=host().to_tvm())
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(out_layout.shape, np.float32), dev)
    lib["main"](*[tvm.runtime.tensor(blocked(a), dev) for a in data], out)
    np.testing.assert_array_equal(out.numpy(), blocked(np.concatenate(data, 1)))


def test_a_pool_keeps_its_producers_channel_tile_when_it_is_whole_vectors():
    """A pool reading 32-channel tiles writes 32-channel vectors: with 16, each parallel
    iteration would read half of every cache line and its neighbour the other half."""
    from alt_tvm.graph.in_layout import channel_blocked, channel_vector
    from alt_tvm.layout import Layout

    def tiled(channels, tile):  # N C H W -> N C/tile H W tile, as a conv's output
        return Layout((1, channels, 8, 8)).split(1, [channels // tile, tile]).reorder([0, 1, 3, 4, 2])

    pooled = (1, 64, 4, 4)
    assert channel_vector(pooled, 16, tiled(64, 32)) == channel_blocked(pooled, 32)
    assert channel_vector((1, 48, 4, 4), 16, tiled(48, 24)) == channel_blocked((1, 48, 4, 4), 16)  # 24: not whole
    # no whole vector divides 24 channels: the producer's 12-channel tile, not row-major rows
    assert channel_vector((1, 24, 4, 4), 16, tiled(24, 12)) == channel_blocked((1, 24, 4, 4), 12)
    assert channel_vector(pooled, 16, None) == channel_blocked(pooled, 16)
    width_inner = Layout((1, 64, 8, 8)).split(3, [2, 4])  # innermost: a tile of W, not of C
    assert channel_vector(pooled, 16, width_inner) == channel_blocked(pooled, 16)


class _StemPool(nn.Module):
    """ShuffleNet-V2's stem: a stride-2 conv to 24 channels, ReLU, a 3x3 stride-2 max pool,
    read by two branches (a depthwise conv and a 1x1 conv) that want different layouts."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 24, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.branch1 = nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24)
        self.branch2 = nn.Conv2d(24, 40, 1)

    def forward(self, x):
        pooled = self.pool(torch.relu(self.conv(x)))
        return self.branch1(pooled).sum() + self.branch2(pooled).sum()


def test_a_pool_of_channels_no_vector_divides_writes_its_producers_tiles():
    """24 channels: the pool keeps the conv's channel tile instead of writing row-major rows,
    where each output vector would gather across the conv's tiles."""
    torch.manual_seed(0)
    module, x = _StemPool().eval(), torch.randn(1, 3, 64, 64)
    built = build(module, example_inputs=[x])
    np.testing.assert_allclose(built(x.numpy())[0], module(x).detach().numpy(), rtol=1e-4)
    conv = next(k.layout for k in built.report.kernels if "relax.nn.relu" in k.ops)
    pool = next(k.layout for k in built.report.kernels if "relax.nn.max_pool2d" in k.ops)
    tile = int(conv.split("x")[-1])
    assert 24 % tile == 0 and tile % 16 != 0, conv  # the conv's channel tile: no whole vector
    assert pool == f"1x{24 // tile}x16x16x{tile}", pool


def _built_kernels(module, shape):
    """The scheduled kernels of ``module`` built by alt-tvm (name -> TVMScript), and whether
    its output matches PyTorch's."""
    import tvm

    torch.manual_seed(0)
    x = torch.randn(*shape)
    built = build(module.eval(), example_inputs=[x])
    want = module(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], want, rtol=1e-6, atol=1e-6)
    return {g.name_hint: built.mod[g].script() for g in built.mod.get_global_vars()
            if isinstance(built.mod[g], tvm.tirx.PrimFunc)}


class _KeyTranspose(nn.Module):
    """Attention's key: ``[s, h * d] -> [h, d, s]``, scaled."""

    def forward(self, x):
        return (x.reshape(1, 64, 4, 32).permute(0, 2, 3, 1) * 0.5).contiguous()


class _BiasAdd(nn.Module):
    """``x[c, s] + bias[c]``: contiguous along s, the bias broadcast (not a transpose)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(32, 1))

    def forward(self, x):
        return torch.relu(x) + self.bias


class _LayerScaleBack(nn.Module):
    """ConvNeXt's block end: channels-last rows back to NCHW, times the layer scale."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(torch.randn(64, 1, 1))

    def forward(self, x):
        return self.gamma * x.permute(0, 3, 1, 2)


def test_a_transpose_is_copied_in_tiles_and_a_broadcast_is_not():
    from alt_tvm.graph.in_layout import TRANSPOSE_TILE

    kernels = _built_kernels(_KeyTranspose(), (1, 64, 128))
    (script,) = [s for name, s in kernels.items() if "transpose" in name]
    # the tile's input columns unrolled, each output row of the tile one vector (no scatter)
    loops = [line.strip() for line in script.splitlines() if line.strip().startswith("for ")]
    assert f"T.unroll(T.int64({TRANSPOSE_TILE}))" in loops[-2] and \
        f"T.vectorized(T.int64({TRANSPOSE_TILE}))" in loops[-1], script

    # NHWC -> NCHW with a multiply: the channel loop moves in next to the width loop, and
    # tiles of 16 channels by the whole 14-wide row are copied, each row one vector
    kernels = _built_kernels(_LayerScaleBack(), (1, 14, 14, 64))
    (script,) = [s for name, s in kernels.items() if "transpose" in name]
    loops = [line.strip() for line in script.splitlines() if line.strip().startswith("for ")]
    assert "T.unroll(T.int64(16))" in loops[-2] and "T.vectorized(T.int64(14))" in loops[-1], script

    kernels = _built_kernels(_BiasAdd(), (1, 32, 128))
    (script,) = [s for name, s in kernels.items() if "add" in name]
    assert "T.unroll" not in script and "T.vectorized" in script, script


def test_a_global_mean_sums_whole_channel_vectors_of_the_tiled_map():
    """The squeeze-excitation mean reads the depthwise conv's tiled map: its sum runs over the
    positions with the channel vector innermost, vectorised (not one channel at a time, a
    strided gather per position), and matches PyTorch (checked by :func:`_built_kernels`)."""
    kernels = _built_kernels(_SqueezeExcite(), (1, 32, 14, 14))
    (script,) = [s for name, s in kernels.items() if name.startswith("alt_mean")]
    head, _, body = script.partition('T.sblock("p0_red")')
    assert body, script
    loops = head[head.rindex("for "):]  # the loops around the sum's update
    assert "T.vectorized" in loops, script
    # the positions (k2, k3) are reduced outside the vector loop
    assert head.rindex("k3") < head.rindex("T.vectorized"), script


class _FirePool(nn.Module):  # SqueezeNet / GoogLeNet: branches concatenated, max-pooled, squeezed
    def __init__(self, padding=0):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.e1, self.e3 = nn.Conv2d(16, 64, 1), nn.Conv2d(16, 64, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, padding, ceil_mode=True)
        self.squeeze = nn.Conv2d(128, 32, 1)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        return self.squeeze(self.pool(torch.cat([torch.relu(self.e1(y)), torch.relu(self.e3(y))], 1)))


@pytest.mark.parametrize(("make", "op"), [
    (lambda: _FirePool(), "relax.nn.max_pool2d"),
    (lambda: _FirePool(padding=1), "relax.nn.max_pool2d"),  # with a padded copy of the input
    (lambda: _GroupedSqueezeExcite(), "relax.mean"),  # RegNet: 8-channel groups, 16-lane vectors
], ids=["pool", "padded_pool", "mean_of_grouped_conv"])
def test_an_op_between_layouts_of_different_vector_widths_loads_whole_input_vectors(make, op):
    """The concatenation stores channel vectors of the machine's width; the squeeze conv may
    want wider channel tiles, which the pool writes. Its vector loops are then cut to the
    input's width: each load is one contiguous input vector (a 32-wide loop over two 16-channel
    blocks is a gather: SqueezeNet's and GoogLeNet's pools 3-4x slower, RegNet-Y's
    squeeze-excitation means 3-5x)."""
    import re

    import tvm
    from conftest import x86_description

    from alt_tvm.target import runs_on_host

    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(1, 3, 29, 29) if isinstance(model, _FirePool) else torch.randn(1, 48, 28, 28)
    target = x86_description("avx512")  # 16-lane vectors: the cases' widths differ from the convs' tiles
    built = build(model, target=target, example_inputs=[x])
    if runs_on_host(target):
        ref = model(x).detach().numpy()
        np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    (kernel,) = [k for k in built.report.kernels if k.ops == (op,)]
    func = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == kernel.name)
    assert isinstance(func, tvm.tirx.PrimFunc)
    read, written = (int(p.ty.shape[-1]) for p in func.params)  # innermost: the channel vectors
    vectorized = {int(v) for v in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", func.script())}
    assert read != written, "the case should store the channels in vectors of two widths"
    assert vectorized == {min(read, written)}, (read, written, func.script()[:600])


class _ClassifierMean(nn.Module):  # SqueezeNet's end: a 1x1 conv, ReLU, then the global mean as the output
    def __init__(self, classes=80):  # several channel tiles (40 would be one 40-lane tile)
        super().__init__()
        self.conv = nn.Conv2d(16, classes, 1)

    def forward(self, x):
        return torch.flatten(nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1), 1)


def test_a_mean_into_an_untiled_output_sums_whole_vectors_of_the_tiled_map():
    """The classifier's mean writes a plain ``(1, C, 1, 1)``: its sum still runs over the
    positions with the map's channel tile (as much of it as divides C) vectorised innermost."""
    import math
    import re

    kernels = _built_kernels(_ClassifierMean(), (1, 16, 13, 13))
    (script,) = [s for name, s in kernels.items() if name.startswith("alt_mean")]
    shape = re.search(r"p0: T\.Buffer\(\((.*?)\), \"float32\"\)", script).group(1)
    read = int(re.findall(r"\d+", shape.split(",")[-1])[-1])  # the map's channel tile
    assert read > 1, script
    head = script.partition('T.sblock("p0_red")')[0]
    assert f"T.vectorized(T.int64({math.gcd(read, 80)}))" in head[head.rindex("for "):], script
    # the channel vectors run in parallel; the positions they sum are not fused into that loop
    assert "T.parallel" in head and "k2_fused" not in head, script


class _ConvThenPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 32, 3, padding=1)

    def forward(self, x):
        return nn.functional.max_pool2d(torch.relu(self.conv(x)), 3, 2, 1)


class _Fire(nn.Module):  # SqueezeNet's fire module: two expands of one squeeze, concatenated
    def __init__(self):
        super().__init__()
        self.squeeze, self.expand1 = nn.Conv2d(32, 16, 1), nn.Conv2d(16, 32, 1)
        self.expand3 = nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1(y)), torch.relu(self.expand3(y))], 1)


@pytest.mark.parametrize("make, shape", [(_Fire, (1, 32, 15, 15)), (_ConvThenPool, (1, 8, 14, 14))],
                         ids=["concat", "max_pool"])
def test_an_onnx_output_computed_from_tiled_operands_is_written_row_major(tmp_path, make, shape):
    """An ONNX graph's output is a binding of its own (torch.export returns a tuple of values):
    an op without a strategy that computes it from tiled operands writes it row-major, no
    conversion after it (a concatenation of equal tiles kept them and left the output unbound)."""
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    path = tmp_path / "model.onnx"
    torch_to_onnx(model, (x,), path, dynamo=False)
    built = build(str(path))
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    last = built.report.kernels[-1]
    assert last.kind == "operator" and last.layout == ""  # the last kernel, writing the output


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_a_channel_split_from_either_onnx_exporter_runs_in_the_producers_tiles(tmp_path, dynamo):
    """ShuffleNet-V2's ``chunk``: Slice ops from the TorchScript exporter, a Split from the
    dynamo one. Both become one slice per part, read in the producer's tiles: no conversion."""
    torch.manual_seed(0)
    model = _ShuffleUnit().eval()
    x = torch.randn(1, 3, 12, 12)
    path = tmp_path / "model.onnx"
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert ("Split" in ops) == dynamo
    built = build(str(path))
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    inner = [k.detail[:120] for k in built.report.kernels if k.kind == "conversion" and not k.boundary]
    assert inner == []  # (the output, written by a conv in its tiles, is converted at the boundary)
    assert any("relax.strided_slice" in k.ops for k in built.report.kernels if k.kind == "operator")


class _AttentionResidual(nn.Module):  # ViT's block: the attention's output added back to its input
    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(width), nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


def test_a_fused_reshape_reads_by_its_blocks_indices_not_flat_positions(tmp_path, monkeypatch):
    """TVM's fused reshape before the residual add reads ``out[(j // 64 + i) % 10, j % 64]``;
    simplified within the block's domain it reads ``out[i, j]``, so the vector loop along
    ``j`` loads contiguous vectors rather than gathering lane by lane. (The canonical rule
    ``unit_axis_views`` now puts this add in the projection's epilogue; without it the
    graph is one whose fused reshape a fallback kernel computes.)"""
    monkeypatch.setattr(canonical, "unit_axis_views", lambda mod: mod)
    torch.manual_seed(0)
    model = _AttentionResidual().eval()
    x = torch.randn(1, 10, 64)
    path = tmp_path / "residual.onnx"
    torch_to_onnx(model, (x,), path, dynamo=False)
    built = build(str(path))
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    fused = [g for g in built.mod.get_global_vars() if "reshape" in g.name_hint and "add" in g.name_hint]
    assert fused, [g.name_hint for g in built.mod.get_global_vars()]
    stores = [line for line in built.mod[fused[0]].script().splitlines() if "] = " in line]
    assert stores and not any("%" in line or "//" in line for line in stores), stores


class _LateScale(nn.Module):  # EfficientNet's 7x7 stages: the scale is its own kernel (the weights outweigh the map)
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(32, 256, 1), nn.Conv2d(256, 128, 1)
        self.reduce, self.expand = nn.Conv2d(256, 16, 1), nn.Conv2d(16, 256, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return self.b(y * torch.sigmoid(self.expand(torch.relu(self.reduce(y.mean((2, 3), keepdim=True))))))


@pytest.mark.parametrize(("make", "channels", "lanes"), [
    (lambda: _LateScale(), 32, None),  # the output's own tile
    (lambda: _GroupedSqueezeExcite(256, 8), 256, 8),  # RegNet: 8-channel group tiles into wider ones
], ids=["same_tiles", "narrower_input_tiles"])
def test_a_standalone_scale_is_vectorized_over_whole_input_vectors(make, channels, lanes):
    """A squeeze-excitation scale whose next conv's weights are larger than the map runs as
    an element-wise kernel of its own. Its lane loop is vectorized (LLVM left it scalar:
    EfficientNet-B0's 7x7 scales took 28-36 us a call, 5 vectorized), in vectors as wide as the
    narrowest input tile, so that each load is one contiguous piece."""
    import re

    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(1, channels, 7, 7)
    built = build(model, example_inputs=[x])
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    (kernel,) = [k for k in built.report.kernels if k.kind == "elementwise"]
    assert kernel.ops == ("relax.multiply",)
    func = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == kernel.name)
    tiles = [int(p.ty.shape[-1]) for p in func.params]
    assert re.findall(r"T\.vectorized\((\d+)\)", func.script()) == [str(lanes or tiles[-1])], tiles


def test_elementwise_lanes_refuse_a_gather():
    from alt_tvm.graph.in_layout import elementwise_lanes
    from alt_tvm.layout.templates import conv_output_tiled

    shape = [1, 64, 7, 7]
    tiled = lambda tile: conv_output_tiled(shape, spatial_tiles=[7, 7], channel_tile=tile)  # noqa: E731
    out = tiled(16)
    assert elementwise_lanes(out, [(shape, tiled(16)), ([1, 64, 1, 1], None)]) == 16  # a per-channel vector
    assert elementwise_lanes(out, [(shape, tiled(8)), ([64, 1, 1], None)]) == 8  # narrower tiles
    assert elementwise_lanes(out, [(shape, tiled(32))]) == 16  # wider tiles: 16-lane pieces of them
    assert elementwise_lanes(out, [(shape, None)]) == 0  # a row-major map: channels a plane apart
    assert elementwise_lanes(conv_output_tiled([1, 48, 7, 7], spatial_tiles=[7, 7], channel_tile=16),
                             [([1, 48, 7, 7], conv_output_tiled([1, 48, 7, 7], spatial_tiles=[7, 7],
                                                                 channel_tile=12))]) == 0  # 12 into 16
    assert elementwise_lanes(Layout(shape), [(shape, None)]) == 0  # no vector in the output


class _DecodeHead(nn.Module):  # SegFormer's decoder: per-stage linear, to NCHW, resized, concatenated, fused
    # Resized to the smaller map's size: no part is upsampled, so graph/reorder.py keeps the concatenation.
    def __init__(self):
        super().__init__()
        self.mlps = nn.ModuleList(nn.Linear(c, 32) for c in (16, 24))
        self.fuse = nn.Conv2d(64, 16, 1)

    def forward(self, a, b):
        maps = []
        for x, mlp in zip((a, b), self.mlps):
            side = int(x.shape[1] ** 0.5)
            y = mlp(x).permute(0, 2, 1).reshape(1, 32, side, side)
            maps.append(nn.functional.interpolate(y, size=(8, 8), mode="bilinear", align_corners=False))
        return torch.relu(self.fuse(torch.cat(maps, dim=1)))


class _MixFFN(nn.Module):  # SegFormer's Mix-FFN: linear, to NCHW, depthwise 3x3, back, GELU, linear
    def __init__(self):
        super().__init__()
        self.dense1, self.dense2 = nn.Linear(16, 64), nn.Linear(64, 16)
        self.dwconv = nn.Conv2d(64, 64, 3, padding=1, groups=64)

    def forward(self, x):
        y = self.dense1(x).transpose(1, 2).reshape(1, 64, 12, 12)
        y = self.dwconv(y).flatten(2).transpose(1, 2)
        return self.dense2(nn.functional.gelu(y))


def test_a_concatenations_operands_are_written_in_its_tiles_and_read_through_their_transposes():
    """Backward propagation through a concatenation: each resized operand is written in its
    slice of the fused conv's input layout (so the concatenation copies whole tiles), and the
    resize reads its linear layer's row-major output through the transpose and reshape
    (a layout, no transpose kernel)."""
    torch.manual_seed(0)
    model = _DecodeHead().eval()
    a, b = torch.randn(1, 256, 16), torch.randn(1, 64, 24)
    built = build(model, example_inputs=[a, b])
    ref = model(a, b).detach().numpy()
    np.testing.assert_allclose(built(a.numpy(), b.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    ops = [op for k in built.report.kernels for op in k.ops]
    assert "relax.permute_dims" not in ops and "relax.reshape" not in ops, ops
    concat = next(k for k in built.report.kernels if k.ops == ("relax.concat",))
    resizes = [k for k in built.report.kernels if k.ops == ("relax.image.resize2d",)]
    assert len(resizes) == 2 and all(k.kind == "operator" for k in resizes)
    whole = [int(d) for d in concat.layout.split("x")]
    for kernel in resizes:
        mine = [int(d) for d in kernel.layout.split("x")]
        # The concatenation's tiles, with this operand's half of the channel tiles.
        differ = [d for d, (m, w) in enumerate(zip(mine, whole)) if m != w]
        assert len(mine) == len(whole) and len(differ) == 1 and 2 * mine[differ[0]] == whole[differ[0]], \
            (kernel.layout, concat.layout)
    inner = [k for k in built.report.kernels if k.kind == "conversion" and not k.boundary]
    assert inner == [], [k.detail[:120] for k in inner]


def test_a_conv_reads_its_input_through_a_transpose_and_reshape():
    """Mix-FFN: the depthwise conv's pad stage reads the linear layer's (tokens, channels)
    output through the transpose and reshape to NCHW; no transpose kernel runs before it."""
    torch.manual_seed(0)
    model = _MixFFN().eval()
    x = torch.randn(1, 144, 16)
    built = build(model, example_inputs=[x])
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    conv = built.report.kernels.index(next(k for k in built.report.kernels if k.kind == "partition"
                                           and "relax.nn.conv2d" in k.ops))
    before = [op for k in built.report.kernels[:conv] for op in k.ops]
    assert "relax.permute_dims" not in before and "relax.reshape" not in before, before


class _PatchEmbed(nn.Module):  # ViT / SegFormer: a strided conv, flattened, transposed to tokens, normed
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 32, 4, stride=4)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


def test_a_reshape_before_a_transpose_writes_the_transposed_rows():
    """Backward through a transpose: the reshape of the conv's tiles writes (tokens, channels)
    rows, so the transpose after it is no kernel."""
    torch.manual_seed(0)
    model = _PatchEmbed().eval()
    x = torch.randn(1, 3, 32, 32)
    built = build(model, example_inputs=[x])
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    ops = [op for k in built.report.kernels for op in k.ops]
    assert "relax.permute_dims" not in ops, ops
    kernels = {g.name_hint: built.mod[g] for g in built.mod.get_global_vars()
               if isinstance(built.mod[g], tvm.tirx.PrimFunc)}
    transposes = [name for name in kernels if "transpose" in name]
    assert transposes == [], transposes


@pytest.mark.parametrize("shape, axes", [((1, 64, 28, 28), [1, 2, 3]), ((1, 1, 50176), [2])])
def test_a_reduction_to_one_value_runs_in_parallel_chunks_of_vector_lanes(shape, axes):
    """A group norm's variance over a whole map (PoolFormer's GroupNorm of one group, as a
    3-D or a flattened reduction) has no spatial loop to parallelise or vectorise: it is
    scheduled as partial sums, parallel over chunks and vectorised over lanes, and still
    computes NumPy's variance."""
    from tvm import relax

    from alt_tvm.graph.in_layout import schedule_in_layout

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.variance(x, axis=axes, keepdims=True))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    func = next(mod[g] for g in mod.get_global_vars() if isinstance(mod[g], tvm.tirx.PrimFunc))
    scheduled = schedule_in_layout(func, cores=2)
    script = scheduled.script()
    assert script.count("T.parallel(") >= 2 and script.count("T.vectorized(") >= 2, script
    lib = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target="llvm").jit()
    data = np.random.default_rng(0).standard_normal(shape).astype("float32") + 3
    result = tvm.runtime.tensor(np.zeros([1 if a in axes else d for a, d in enumerate(shape)], "float32"))
    lib["main"](tvm.runtime.tensor(data), result)
    np.testing.assert_allclose(result.numpy().ravel()[0], np.var(data.astype("float64")), rtol=1e-4)


def test_a_reduction_to_one_value_runs_its_lanes_along_the_stored_innermost_axis():
    from tvm import te

    from alt_tvm.graph.in_layout import _contiguous_loop

    # channels c (16) stored as (c // 8, h, c % 8): the sum runs over (c, h) in that order, but
    # only c indexes the contiguous axis
    stored = te.placeholder((2, 4, 8), name="stored")
    c, h = te.reduce_axis((0, 16), name="c"), te.reduce_axis((0, 4), name="h")
    total = te.compute((1,), lambda _: te.sum(stored[c // 8, h, c % 8], axis=[c, h]), name="total")
    sch = tvm.s_tir.Schedule(te.create_prim_func([stored, total]))
    block = sch.get_sblock("total")
    loops = sch.get_loops(block)
    assert sch.get(_contiguous_loop(sch, block, loops)).same_as(sch.get(loops[1]))  # the loop over c


def test_a_reduction_over_a_small_map_splits_its_channel_lanes_among_the_cores():
    from tvm import te

    from alt_tvm.graph.in_layout import _reductions_in_parallel

    # 512 channels stored as (c // 32, h, w, c % 32) over a 7x7 map: no chunk count divides 7,
    # so the chunks come from the channel loop
    stored = te.placeholder((16, 7, 7, 32), name="stored")
    c, h, w = te.reduce_axis((0, 512), name="c"), te.reduce_axis((0, 7), name="h"), te.reduce_axis((0, 7), name="w")
    total = te.compute((1,), lambda _: te.sum(stored[c // 32, h, w, c % 32], axis=[c, h, w]), name="total")
    func, made = _reductions_in_parallel(te.create_prim_func([stored, total]), cores=2)
    script = func.script()
    assert made and "T.parallel(16)" in script and "T.vectorized(16)" in script
    data = np.random.default_rng(0).standard_normal((16, 7, 7, 32)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(1, np.float32))
    tvm.compile(tvm.IRModule({"main": func}), target="llvm")["main"](tvm.runtime.tensor(data), out)
    np.testing.assert_allclose(out.numpy()[0], data.sum(dtype=np.float64), rtol=1e-4)
