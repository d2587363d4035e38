"""Kernels, whole models and tuning on an ARM board: emulated-arm64, a Cortex-A72 under qemu-user,
reached through a TVM RPC tracker on loopback as a real board is.

The board is prepared once by ``.ci/prepare-board.sh`` (``make test`` runs it) and started here
(:mod:`alt_tvm.emulated_board`). Every output computed there is checked against PyTorch or ONNX
Runtime computed on this machine. Emulated timings measure qemu, not an A72: nothing here
asserts a speed. Where the board cannot be had (not prepared, no aarch64 cross compiler) the
tests that need it skip with the reason.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from torch import nn

import alt_tvm
from alt_tvm.emulated_board import BOARD_NAME, board_problem, start_emulated_board
from alt_tvm.records import is_emulated, load_records
from alt_tvm.target import board

#: Emulated runs are slow (qemu translates every instruction); each remote call gets this long.
CALL_S = 300.0


@pytest.fixture(scope="session")
def emulated_board():
    """The emulated board's RPC server registered with a loopback tracker, for the whole session."""
    why = board_problem()
    if why is not None:
        pytest.skip(why)
    compiler = board(BOARD_NAME).cross_compiler
    if shutil.which(compiler) is None:
        pytest.skip(f"cross compiler {compiler} missing (run .ci/install-cross.sh)")
    started = start_emulated_board()
    try:
        yield started
    finally:
        started.close()


def _on_board(emulated, built, tmp_path, *arrays: np.ndarray) -> list[np.ndarray]:
    """``built`` exported (cross-linked for the board), loaded there through the tracker, run on ``arrays``."""
    return _run_artifact(emulated, built.export(tmp_path / "model.alt"), *arrays)


def _run_artifact(emulated, path, *arrays: np.ndarray) -> list[np.ndarray]:
    with alt_tvm.load(path, remote=emulated.tracker, key=emulated.key, timeout_s=CALL_S) as remote:
        assert remote.metadata["target"]["name"] == BOARD_NAME
        return [np.asarray(o) for o in remote(*arrays)]


def _close(got: np.ndarray, want: np.ndarray, *, rel: float = 2e-5) -> None:
    """float32 agreement: absolute error within ``rel`` of the reference's largest magnitude."""
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * float(np.abs(want).max()))


# --------------------------------------------------------------------------- without the board

def test_the_board_is_an_a72_and_its_records_are_marked_emulated():
    hw = board(BOARD_NAME)
    assert hw.vector_lanes("float32") == 4 and hw.vector_registers == 32
    assert hw.tvm_target["mcpu"] == "cortex-a72" and hw.cross_compiler == "aarch64-linux-gnu-gcc"
    assert is_emulated(hw) and is_emulated(hw.to_tvm()) and is_emulated(str(hw.to_tvm()))
    assert not is_emulated(board("kirin990")) and not is_emulated(board("kirin990").to_tvm())
    assert not is_emulated("not a json target")


def test_missing_board_names_the_cache_and_the_script(tmp_path):
    why = board_problem(cache=tmp_path)
    assert str(tmp_path / "arm64") in why and ".ci/prepare-board.sh" in why
    with pytest.raises(FileNotFoundError, match="prepare-board.sh"):
        start_emulated_board(cache=tmp_path)
    with pytest.raises(ValueError, match="threads must be an int >= 1, got 0"):
        start_emulated_board(threads=0)


# --------------------------------------------------------------------------- kernels (default run)

class _ConvNet(nn.Module):
    """A 3x3 conv, a depthwise 3x3, a pointwise 1x1 and a dense layer (ALT's conv/GEMM templates)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 24, 1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.relu(self.dw(y))
        y = self.pw(y) + 0.5
        return self.fc(y.mean(dim=(2, 3)))


@pytest.mark.parametrize("strategies, expected", [(None, ["alt"] * 4), (["sconv"], ["sconv"] * 2)])
def test_conv_gemm_and_sconv_kernels_run_on_the_board(emulated_board, tmp_path, strategies, expected):
    torch.manual_seed(0)
    model, x = _ConvNet().eval(), torch.rand(1, 8, 14, 14)
    built = alt_tvm.build(model, example_inputs=(x,), target=BOARD_NAME, strategies=strategies, strict=True)
    assert [p[0] for p in built.report.partitions] == expected
    with torch.no_grad():
        want = model(x).numpy()
    _close(_on_board(emulated_board, built, tmp_path, x.numpy())[0], want)


# --------------------------------------------------------------------------- every ARM family (slow)

class _Convs(nn.Module):
    """Strided, grouped, dilated and transposed convs, 1-D and 3-D ones, and the ops without a
    strategy between them (pooling, concat, mean: the fallback schedules)."""

    def __init__(self):
        super().__init__()
        self.strided = nn.Conv2d(6, 16, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.dilated = nn.Conv2d(16, 8, 3, padding=2, dilation=2)
        self.dw5 = nn.Conv2d(16, 16, 5, stride=2, padding=2, groups=16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.c1 = nn.Conv1d(8, 12, 3, padding=1)
        self.c3 = nn.Conv3d(2, 4, 3, padding=1)

    def forward(self, x, v):
        y = torch.relu(self.strided(x))
        y = torch.cat([self.dilated(torch.relu(self.grouped(y))), torch.max_pool2d(y, 3, 1, 1)[:, :8]], dim=1)
        z = self.up(torch.relu(self.dw5(y)))
        s = self.c1(z.mean(dim=3))
        t = self.c3(v).sum(dim=(2, 3, 4))
        return nn.functional.avg_pool2d(z, 2), s, t


class _BasicBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))) + x)


class _InvertedResidual(nn.Module):
    """MobileNet-V2's block, expand -> depthwise -> project, fused as one kernel."""

    def __init__(self, c=16, expand=6):
        super().__init__()
        m = c * expand
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.expand = nn.Conv2d(c, m, 1)
        self.dw = nn.Conv2d(m, m, 3, 1, 1, groups=m)
        self.project = nn.Conv2d(m, c, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return self.project(torch.clamp(self.dw(torch.clamp(self.expand(x), 0, 6)), 0, 6)) + x


class _Encoder(nn.Module):
    """A transformer layer: layer norm before the GEMMs, attention (batched matmuls, softmax), GELU."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.out((att @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class _Rows(nn.Module):
    """Softmax and layer norm alone (the row kernels)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(48)

    def forward(self, x):
        return torch.softmax(x * 2.0, dim=-1), self.norm(x)


class _SConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.c = nn.Conv2d(32, 32, 1)

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x))))
        return torch.relu(self.c(y) + y)


def _tt_case():
    from alt_tvm.strategies.tt.strategy import TTLayerRequest, TTOptions

    torch.manual_seed(0)
    model = nn.Linear(512, 256).eval()
    request = TTLayerRequest(in_factors=(2, 2, 128), out_factors=(64, 2, 2), ranks=(1, 8, 8, 1))
    return model, request, {"strategies": ["tt_einsum", "alt"],
                            "strategy_options": {"tt_einsum": TTOptions(default=request)}}


#: name -> (model factory, input shapes, build keywords, the strategies every partition must use)
FAMILIES = {
    "alt_conv_variants_and_fallbacks": (_Convs, [(1, 6, 20, 20), (1, 2, 4, 6, 6)], {}, {"alt"}),
    "alt_winograd": (lambda: _BasicBlock(32), [(1, 32, 24, 24)],
                     {"strategy_options": {"alt": {"winograd": "always"}}}, {"alt"}),
    "alt_block": (_InvertedResidual, [(1, 3, 16, 16)], {"strategy_options": {"alt": {"fuse_blocks": "always"}}},
                  {"alt"}),
    "alt_gemm_attention_rows": (_Encoder, [(1, 16, 64)], {}, {"alt"}),
    "alt_rows": (_Rows, [(4, 12, 48)], {}, {"alt"}),
    "sconv": (_SConvNet, [(1, 3, 20, 18)], {"strategies": ["sconv"]}, {"sconv"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_arm_family_runs_on_the_board(emulated_board, tmp_path, name):
    factory, shapes, keywords, strategies = FAMILIES[name]
    torch.manual_seed(0)
    model = factory().eval()
    inputs = tuple(torch.randn(*s) for s in shapes)
    built = alt_tvm.build(model, example_inputs=inputs, target=BOARD_NAME, strict=True, **keywords)
    assert built.report.partitions and {p[0] for p in built.report.partitions} == strategies
    if name == "alt_winograd":
        lanes = board(BOARD_NAME).vector_lanes()
        assert all(k.layout.endswith(f"x{lanes}") and k.layout.count("x") == 6
                   for k in built.report.kernels if k.kind == "partition"), built.report.kernels
    if name == "alt_block":
        assert any(k.ops.count("relax.nn.conv2d") == 3 for k in built.report.kernels if k.kind == "partition")
    with torch.no_grad():
        want = model(*inputs)
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    got = _on_board(emulated_board, built, tmp_path, *[x.numpy() for x in inputs])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)


@pytest.mark.slow
def test_tt_einsum_runs_on_the_board(emulated_board, tmp_path):
    from alt_tvm.strategies.tt.decompose import reconstruct
    from alt_tvm.strategies.tt.strategy import plan_layer

    model, request, keywords = _tt_case()
    x = np.random.default_rng(8).standard_normal((4, 512)).astype(np.float32)
    built = alt_tvm.build(model, example_inputs=(torch.from_numpy(x),), target=BOARD_NAME, strict=True, **keywords)
    assert [p[0] for p in built.report.partitions] == ["tt_einsum"]
    _, dec = plan_layer(model.weight.detach().numpy(), request=request)
    want = x.astype(np.float64) @ reconstruct(dec.cores).T.astype(np.float64) + model.bias.detach().numpy()
    _close(_on_board(emulated_board, built, tmp_path, x)[0], want)


# --------------------------------------------------------------------------- models and tuning (slow)

def _onnx_reference(name: str, tmp_path):
    from alt_tvm.bench import onnxruntime_session
    from alt_tvm.models import MODELS, export_onnx, get_model

    path = export_onnx(name, tmp_path / f"{name}.onnx")
    arrays = [x.numpy() for x in get_model(name)[1]]
    return path, arrays, onnxruntime_session(str(path), threads=1)(*arrays), MODELS[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "bert_tiny"])
def test_a_model_built_by_the_cli_runs_on_the_board(emulated_board, tmp_path, name, capsys):
    from alt_tvm.cli import main

    path, arrays, reference, info = _onnx_reference(name, tmp_path)
    artifact = tmp_path / f"{name}.alt"
    assert main(["build", str(path), "--target", BOARD_NAME, "-o", str(artifact), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == BOARD_NAME and report["partitions"] > 0 and not report["failed"]
    got = _run_artifact(emulated_board, artifact, *arrays)
    assert len(got) == len(reference)
    for g, r in zip(got, reference):
        np.testing.assert_allclose(g, r, rtol=info.rtol, atol=info.atol)


@pytest.mark.slow
def test_tuning_on_the_board_is_marked_emulated_and_its_build_matches(emulated_board, tmp_path, capsys):
    from alt_tvm.cli import main

    log = tmp_path / "small_cnn.jsonl"
    status = main(["tune", "small_cnn", "--trials", "14", "--tracker", emulated_board.tracker, "--key",
                   emulated_board.key, "--target", BOARD_NAME, "--log", str(log), "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "is emulated" in out and not any(line.rstrip().endswith("x") for line in out.splitlines()
                                            if line.startswith("nn.") or line.startswith("matmul"))
    records = load_records(log)
    assert records and all(r.emulated and r.board for r in records)
    assert sum(r.ok for r in records) >= 7

    path, arrays, reference, info = _onnx_reference("small_cnn", tmp_path)
    artifact = tmp_path / "small_cnn.alt"
    assert main(["build", str(path), "--records", str(log), "--target", BOARD_NAME, "-o", str(artifact),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tuned"] and not report["failed"]
    for g, r in zip(_run_artifact(emulated_board, artifact, *arrays), reference):
        np.testing.assert_allclose(g, r, rtol=info.rtol, atol=info.atol)
