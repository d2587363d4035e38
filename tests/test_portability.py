"""Code built for an instruction set this machine runs, whatever its own CPU: a CNN built for
an AVX2 description (8-lane vectors, 16 registers) and for an AVX-512 one runs here and
matches PyTorch, and its machine code uses only its own ISA's registers."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
import torch
from torch import nn

import alt_tvm


class _SmallNet(nn.Module):
    """A dense conv, an inverted-residual block (expand, depthwise, project, shortcut), a pool
    and a classifier: every CPU strategy family a CNN meets."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU6())
        self.block = nn.Sequential(nn.Conv2d(32, 96, 1), nn.ReLU6(), nn.Conv2d(96, 96, 3, padding=1, groups=96),
                                   nn.ReLU6(), nn.Conv2d(96, 32, 1))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        y = self.stem(x)
        y = y + self.block(y)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _machine_code(built) -> str:
    return "\n".join(m.inspect_source("asm") for m in built.executable.mod.imports if m.kind == "llvm")


def test_a_cnn_built_for_each_x86_isa_runs_here_and_matches_pytorch(x86_runnable):
    torch.manual_seed(0)
    model = _SmallNet().eval()
    x = torch.randn(1, 3, 32, 32)
    built = alt_tvm.build(model, x86_runnable, example_inputs=(x,), strict=True)
    assert built.target is x86_runnable and not built.report.failed
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(built(x.numpy())[0], expected, rtol=1e-4, atol=1e-5)
    lanes = x86_runnable.vector_lanes()
    tiles = [int(k.layout.split("x")[-1]) for k in built.report.kernels if k.kind == "partition" and k.layout]
    assert tiles and all(t % lanes == 0 or lanes % t == 0 for t in tiles), tiles
    asm = _machine_code(built)
    uses_zmm = re.search(r"%zmm\d", asm) is not None
    assert uses_zmm == (lanes == 16)  # AVX2 code never touches a 512-bit register
    assert re.search(r"%ymm\d", asm)


def test_a_model_built_for_an_isa_the_host_lacks_is_refused_with_the_reason(monkeypatch, tmp_path):
    """A build for a CPU whose features this machine lacks compiles, and calling it is a clear
    error naming them, not an illegal instruction."""
    from alt_tvm import target as hw

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86 feature flags")
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2\n")
    monkeypatch.setattr(hw, "_CPUINFO", tmp_path / "cpuinfo")  # this machine, as one without AVX
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    built = alt_tvm.build(model, hw.describe_cpu("haswell"), example_inputs=(x,))
    with pytest.raises(RuntimeError, match="avx2"):
        built(x.numpy())
