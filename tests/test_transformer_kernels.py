"""Transformer kernels: row kernels (softmax, layer norm), GEMMs over batched rows,
attention products whose width no vector divides. Each checked against PyTorch, and
against the program the strategy lowers (which kernel took the op, what it computes in)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import tvm
from conftest import torch_to_onnx
from torch import nn
from tvm import te

import alt_tvm
from alt_tvm.integration import extract_tasks
from alt_tvm.ops.rows import layer_norm_rows, softmax_rows
from alt_tvm.strategies.alt.rows import schedule_rows


def _run_rows(kernel, inputs: list[np.ndarray], placeholders: list) -> np.ndarray:
    func = te.create_prim_func([*placeholders, kernel.output])
    lib = tvm.compile(schedule_rows(func, kernel=kernel, stages=[]), target="llvm")
    out = tvm.runtime.tensor(np.zeros([int(s) for s in kernel.output.shape], "float32"))
    lib(*[tvm.runtime.tensor(x) for x in inputs], out)
    return out.numpy()


@pytest.mark.parametrize("n", [1, 8, 30, 197, 1000])
def test_softmax_rows_match_torch_for_rows_no_vector_divides(n):
    data = np.random.default_rng(n).standard_normal((3, 5, n)).astype("float32") * 8
    x = te.placeholder(data.shape, name="x")
    out = _run_rows(softmax_rows(x, lanes=8), [data], [x])
    np.testing.assert_allclose(out, torch.softmax(torch.from_numpy(data), -1).numpy(), rtol=2e-6, atol=1e-7)


def test_softmax_rows_keep_nan_to_its_row_and_do_not_overflow():
    data = np.random.default_rng(0).standard_normal((4, 197)).astype("float32")
    data[1, 7] = np.nan
    data[2] *= 1e4  # exp(x) alone would overflow
    x = te.placeholder(data.shape, name="x")
    out = _run_rows(softmax_rows(x, lanes=8), [data], [x])
    assert np.isnan(out[1]).all() and not np.isnan(out[[0, 2, 3]]).any()
    np.testing.assert_allclose(out[[0, 2, 3]], torch.softmax(torch.from_numpy(data[[0, 2, 3]]), -1).numpy(),
                               rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("n", [30, 197, 768])
def test_layer_norm_rows_match_float64_even_with_a_large_mean(n):
    rng = np.random.default_rng(n)
    data = (rng.standard_normal((6, n)) + np.array([[0], [0], [0], [1e4], [-3e3], [0]])).astype("float32")
    gamma, beta = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
    x, g, b = te.placeholder(data.shape, name="x"), te.placeholder((n,), name="g"), te.placeholder((n,), name="b")
    out = _run_rows(layer_norm_rows(x, g, b, epsilon=1e-5, lanes=8), [data, gamma, beta], [x, g, b])
    d = data.astype("float64")
    ref = (d - d.mean(-1, keepdims=True)) / np.sqrt(d.var(-1, keepdims=True) + 1e-5) * gamma + beta
    # E[x^2] - E[x]^2 in float32 would lose every digit of the 1e4-mean rows (errors of
    # ~1e3); the plain two passes are off by 3e-3, PyTorch's layer_norm by up to 1e-3.
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_row_kernels_reject_what_they_cannot_compute():
    with pytest.raises(ValueError, match="float32"):
        softmax_rows(te.placeholder((4, 8), dtype="float64"), lanes=8)
    with pytest.raises(ValueError, match=r"gamma must have shape \[8\]"):
        layer_norm_rows(te.placeholder((4, 8)), te.placeholder((4,)), None, epsilon=1e-5, lanes=8)


class _Encoder(nn.Module):
    """Pre-norm attention over 197 tokens (ViT's count, prime), sequence first as
    ``nn.MultiheadAttention`` computes internally: softmax rows of 197, a ``[197, 1, 64]``
    input to the packed QKV projection."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        y = self.norm(x)
        return self.attention(y, y, y, need_weights=False)[0] + x


def test_attention_over_a_prime_token_count_runs_every_op_in_an_alt_kernel():
    torch.manual_seed(0)
    model, x = _Encoder().eval(), torch.randn(1, 197, 64)
    built = alt_tvm.build(model, example_inputs=(x,), strict=True)
    anchors = [op for _, op, _ in built.report.partitions]
    assert anchors == ["relax.nn.layer_norm", "relax.matmul", "relax.matmul", "relax.matmul"]
    # QKV, then attention with torch.export's guard for rows of -inf scores and the heads put
    # back, then the output projection
    (attention,) = [ops for _, _, ops in built.report.partitions if "relax.nn.softmax" in ops]
    assert attention[-2:] == ["relax.matmul", "relax.permute_dims"] and "relax.equal" in attention
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-4)
    scripts = [f.script() for _, f in built.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    # The score product pads its right-hand side to whole vectors (197 -> a multiple of 16).
    assert any('"rhs_padded"' in s for s in scripts)


class _SeqFirstLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 48)

    def forward(self, x):
        return self.linear(x.transpose(0, 1))  # [tokens, 1, features]


def test_a_linear_layer_over_sequence_first_tokens_blocks_rows_across_the_batch_dims():
    torch.manual_seed(0)
    model, x = _SeqFirstLinear().eval(), torch.randn(1, 197, 32)
    (task,) = extract_tasks(model, example_inputs=(x,))
    # 197 rows of one shared weight, in blocks of several: not 197 products of one row each.
    assert task.space.m == 197
    assert task.space.default()[1]["mt"] > 1
    built = alt_tvm.build(model, example_inputs=(x,), strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-4)


class _Gpt2Mlp(nn.Module):
    """GPT-2's feed-forward layer as Hugging Face writes it: GELU's tanh form spelled out."""

    def __init__(self, exponent: float = 3.0) -> None:
        super().__init__()
        self.fc, self.proj, self.exponent = nn.Linear(32, 128), nn.Linear(128, 32), exponent

    def forward(self, x):
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, self.exponent))))
        return self.proj(h)


def _onnx(model: nn.Module, x: torch.Tensor, tmp_path) -> str:
    path = str(tmp_path / "model.onnx")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
    return path


def test_gpt2_gelu_becomes_one_gelu_tanh_in_the_projection_epilogue(tmp_path):
    torch.manual_seed(0)
    model, x = _Gpt2Mlp().eval(), torch.randn(1, 64, 32)
    built = alt_tvm.build(_onnx(model, x, tmp_path), strict=True)
    assert [ops for _, _, ops in built.report.partitions][0] == ["relax.matmul", "relax.add", "relax.nn.gelu_tanh"]
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_a_power_with_a_constant_exponent_joins_the_epilogue(tmp_path):
    # 2.0 is no GELU: the chain stays spelled out, power and all, in the GEMM's epilogue.
    torch.manual_seed(0)
    model, x = _Gpt2Mlp(exponent=2.0).eval(), torch.randn(1, 64, 32)
    built = alt_tvm.build(_onnx(model, x, tmp_path), strict=True)
    first = [ops for _, _, ops in built.report.partitions][0]
    assert first[:3] == ["relax.matmul", "relax.add", "relax.power"] and "relax.tanh" in first
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


class _MaskedAttention(nn.Module):
    """Attention written out as BERT writes it: scaled scores, an additive mask, softmax, V."""

    def __init__(self, tokens: int, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.qkv, self.heads, self.dim = nn.Linear(dim, 3 * dim), heads, dim
        mask = torch.zeros(1, 1, 1, tokens)
        mask[..., -3:] = -1e4  # padding keys
        self.register_buffer("mask", mask)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (y.reshape(b, t, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dim // self.heads) + self.mask
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, self.dim)


@pytest.mark.parametrize("tokens", [64, 49, 197])
def test_attention_is_one_kernel_from_scores_to_context_and_matches_torch(tokens, tmp_path):
    torch.manual_seed(0)
    model, x = _MaskedAttention(tokens).eval(), torch.randn(1, tokens, 32)
    built = alt_tvm.build(_onnx(model, x, tmp_path), strict=True)
    fused = [ops for _, _, ops in built.report.partitions if "relax.nn.softmax" in ops]
    # ... and on through the transpose that puts the heads back
    assert len(fused) == 1 and fused[0][0] == "relax.matmul"
    assert fused[0][-3:] == ["relax.nn.softmax", "relax.matmul", "relax.permute_dims"]
    assert "relax.add" in fused[0]  # the mask, in the scores' epilogue
    assert any("|then=nn.softmax+matmul+permute_dims(0,2,1,3):" in key for key in built.report.workloads)
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


class _Sdpa(nn.Module):
    """``scaled_dot_product_attention`` with a boolean mask that leaves query 2 no key."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        allowed = torch.ones(tokens, tokens, dtype=torch.bool)
        allowed[2] = False
        self.register_buffer("allowed", allowed)

    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed)


def _qkv(tokens: int = 21) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    return tuple(torch.randn(1, 2, tokens, 16, generator=generator) for _ in range(3))


def test_attention_keeps_torch_exports_zero_weights_for_a_query_with_no_key():
    inputs = _qkv()
    program = torch.export.export(_Sdpa(21).eval(), inputs)
    want = program.module()(*inputs).detach().numpy()
    assert np.isfinite(want).all() and not want[0, :, 2].any()  # the guard's zeros, not softmax's NaN
    built = alt_tvm.build(program, strict=True)
    (attention,) = [ops for _, _, ops in built.report.partitions if "relax.nn.softmax" in ops]
    # (torch.export's SDPA ends in a transpose of the context, which the kernel writes)
    assert attention[0] == "relax.matmul" and attention[-2:] == ["relax.matmul", "relax.permute_dims"]
    np.testing.assert_allclose(built(*[t.numpy() for t in inputs])[0], want, rtol=1e-4, atol=1e-5)


def test_attention_keeps_the_dynamo_exports_nan_guard_and_matches_onnx_runtime(tmp_path):
    import onnxruntime as ort

    inputs = _qkv()
    path = str(tmp_path / "sdpa.onnx")
    torch.onnx.export(_Sdpa(21).eval(), inputs, path, dynamo=True, input_names=["q", "k", "v"])
    feeds = {name: t.numpy() for name, t in zip("qkv", inputs)}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    built = alt_tvm.build(path, strict=True)
    (attention,) = [ops for _, _, ops in built.report.partitions if "relax.nn.softmax" in ops]
    assert "relax.isnan" in attention and attention[-1] == "relax.matmul"
    np.testing.assert_allclose(built(*feeds.values())[0], want, rtol=1e-4, atol=1e-5)


class _WindowAttention(nn.Module):
    """Swin's shifted-window attention: a position bias, then the window mask added to a view
    of the scores with a leading unit dim (``attn.view(1, nW, heads, N, N) + mask``)."""

    def __init__(self, windows: int = 4, heads: int = 2, tokens: int = 9) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.register_buffer("bias", torch.randn(1, heads, tokens, tokens, generator=generator))
        mask = torch.zeros(1, windows, 1, tokens, tokens)
        mask[:, 1:, :, :, -2:] = -100.0
        self.register_buffer("mask", mask)
        self.windows, self.heads = windows, heads

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) + self.bias
        n = scores.shape[-1]
        scores = (scores.view(1, self.windows, self.heads, n, n) + self.mask).view(-1, self.heads, n, n)
        return torch.softmax(scores, dim=-1) @ v


def test_a_window_mask_added_through_a_unit_dim_view_stays_in_the_fused_attention(tmp_path):
    generator = torch.Generator().manual_seed(6)
    inputs = tuple(torch.randn(4, 2, 9, 8, generator=generator) for _ in range(3))
    path = str(tmp_path / "window.onnx")
    torch.onnx.export(_WindowAttention().eval(), inputs, path, dynamo=False, opset_version=17)
    built = alt_tvm.build(path, strict=True)
    (attention,) = [ops for _, _, ops in built.report.partitions]
    assert attention == ["relax.matmul", "relax.add", "relax.add", "relax.nn.softmax", "relax.matmul"]
    with torch.no_grad():
        want = _WindowAttention().eval()(*inputs).numpy()
    np.testing.assert_allclose(built(*[t.numpy() for t in inputs])[0], want, rtol=1e-4, atol=1e-5)


class _TinyVit(nn.Module):
    """torchvision's ViT in small: patches by a strided conv, a class token concatenated in
    front, a learned position embedding added, one pre-norm encoder block (its attention
    sequence first inside ``nn.MultiheadAttention``) and the head on the class token."""

    def __init__(self, dim: int = 32, heads: int = 2, patch: int = 4, image: int = 12) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        with torch.no_grad():  # a zero bias is dropped by the dynamo exporter
            self.attention.out_proj.bias.uniform_(-1, 1)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return self.head(x[:, 0])


@pytest.mark.parametrize("dynamo", [False, True])
def test_class_token_and_position_embedding_leave_every_product_and_residual_to_alt_kernels(dynamo, tmp_path):
    torch.manual_seed(0)
    model, x = _TinyVit().eval(), torch.randn(1, 3, 12, 12)
    path = str(tmp_path / "vit.onnx")
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    built = alt_tvm.build(path, strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-4)
    parts = [ops for _, _, ops in built.report.partitions]
    assert sum("relax.nn.softmax" in ops for ops in parts) == 1
    # both residual adds end a projection's kernel (after its bias)
    assert sum(ops[0] == "relax.matmul" and ops[-2:] == ["relax.add", "relax.add"] for ops in parts) == 2
    left = [gv.name_hint for gv, f in built.mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and not f.attrs.get("alt_tvm.kernel")]
    assert not [name for name in left if "matmul" in name or "softmax" in name or "layer_norm" in name], left
    # only the embedding (concatenation and position add) is left to TVM's kernels among the adds
    assert len([name for name in left if "add" in name]) <= 1, left


@pytest.mark.parametrize("tokens", [49, 64])
def test_attention_has_a_space_whose_default_is_the_untuned_kernel_and_whose_points_compute_it(tokens):
    """Score and context register blocks and the parallel loop are knobs of the fused attention."""
    from conftest import check_space

    from alt_tvm.integration import extract_tasks
    from alt_tvm.strategies.alt.space import BatchMatmulSpace

    torch.manual_seed(0)
    model, x = _MaskedAttention(tokens).eval(), torch.randn(1, tokens, 32)
    (task,) = [t for t in extract_tasks(model, example_inputs=[x]) if isinstance(t.space, BatchMatmulSpace)]
    assert task.space.attention
    layout, _ = task.space.default()
    rows = {knob.name: knob.choices for knob in task.space.loop_knobs(layout)}["mt"]
    assert all(tokens % t == 0 for t in rows if t not in (1, 2, 3, 4, 6, 8)) and (tokens != 49 or 7 in rows)
    check_space(task)
    with pytest.raises(ValueError, match="batch matmul parameters .* do not fit N="):
        task.lower({**task.space.params(*task.space.default()), "column": 5})


@pytest.mark.parametrize("op", ["layer_norm", "softmax"])
def test_a_row_kernel_has_a_space_of_rows_per_task_and_vector_width_whose_points_compute_it(op):
    import tvm

    from alt_tvm.integration import extract_tasks
    from alt_tvm.strategies.alt.space import RowSpace

    torch.manual_seed(0)
    model = (nn.LayerNorm(40) if op == "layer_norm" else nn.Softmax(dim=-1)).eval()
    x = torch.randn(2, 13, 40)
    (task,) = [t for t in extract_tasks(model, example_inputs=[x]) if isinstance(t.space, RowSpace)]
    space = task.space
    assert str(task.lower(space.params(*space.default())).func) == str(task.lower(None).func)
    rng = np.random.default_rng(0)
    lowered = task.lower(None)
    acts = [rng.standard_normal(shape).astype("float32")
            for i, (shape, _) in enumerate(lowered.arg_specs[:-1]) if i not in lowered.constants]

    def run(params):
        point = task.lower(params)
        return point.run(tvm.compile(point.func, task.target.to_tvm())["main"], acts, tvm.cpu())

    ref = run(None)
    expected = model(torch.from_numpy(acts[0])).detach().numpy()
    np.testing.assert_allclose(ref, expected, rtol=1e-5, atol=1e-5)
    layout, _ = space.default()
    for rows in space.loop_knobs(layout)[0].choices:
        for lanes in space.loop_knobs(layout)[1].choices:
            np.testing.assert_allclose(run(space.params(layout, {"rows": rows, "lanes": lanes})), expected,
                                       rtol=1e-5, atol=1e-5, err_msg=f"rows={rows} lanes={lanes}")
    with pytest.raises(ValueError, match="row kernel parameters .* must be positive"):
        task.lower({"rows": 0, "lanes": 4})


def test_short_rows_keep_their_partial_sums_in_half_vectors():
    from alt_tvm.strategies.alt.rows import HALF_LANE_VECTORS, HALF_RATE_HALF_LANE_VECTORS, row_lanes
    from alt_tvm.strategies.alt.space import RowSpace

    assert (HALF_LANE_VECTORS, HALF_RATE_HALF_LANE_VECTORS) == (7, 4)
    # 16 lanes, half vectors at the full rate (Zen 4): SegFormer's 32-float rows and Swin's 96 in
    # half vectors, DeiT's 384 whole
    full = [row_lanes(n, 16, half_vectors_full_rate=True) for n in (32, 64, 96, 112, 113, 160, 384, 768)]
    assert full == [8, 8, 8, 8, 16, 16, 16, 16]
    # where half vectors take half the lanes per cycle, only rows of up to 4 vectors
    assert [row_lanes(n, 16, half_vectors_full_rate=False) for n in (64, 65, 96)] == [8, 16, 16]
    # AVX2 (8 lanes): up to 32 floats at half rate, 56 at the full rate; no vector under 4 lanes
    assert [row_lanes(n, 8, half_vectors_full_rate=False) for n in (32, 33, 48, 384)] == [4, 8, 8, 8]
    assert [row_lanes(n, 8, half_vectors_full_rate=True) for n in (48, 56, 57)] == [4, 4, 8]
    assert row_lanes(8, 4, half_vectors_full_rate=True) == 4
    space = RowSpace(rows=4096, lanes=16, default_lanes=row_lanes(32, 16, half_vectors_full_rate=True))
    assert space.default() == ({}, {"rows": 1, "lanes": 8})
    assert space.loop_knobs({})[1].choices == (8, 16)
