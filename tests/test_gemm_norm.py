"""Layer norms fused into the GEMM after them (a post-norm layer's ``LayerNorm(x W + b +
residual)``) or before them (a pre-norm layer's ``LayerNorm(x) W``) as one kernel of row
groups (``strategies/alt/gemm_norm.py``): the rules, the partitions, and encoder layers
exported by both of PyTorch's exporters against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import torch_to_onnx
from torch import nn

import alt_tvm
from alt_tvm.strategies.alt import gemm
from alt_tvm.strategies.alt.gemm_norm import group_blocks, group_cap, group_unit, norm_fits


def test_groups_deal_register_blocks_evenly_with_the_fewest_groups():
    assert group_blocks(rows=128, mt=6, cores=2) == 11  # 22 blocks: two groups of 11
    assert group_blocks(rows=128, mt=4, cores=2) == 16  # 32 blocks: two groups of 16
    assert group_blocks(rows=10, mt=6, cores=2) == 1  # 2 blocks: one each
    assert group_blocks(rows=6, mt=6, cores=4) == 1
    assert group_blocks(rows=30, mt=6, cores=2) == 3  # 5 blocks: 3 + 2, not 5 on one thread


def test_a_group_keeps_its_row_buffers_in_half_the_l2():
    # ConvNeXt-T's first stage: LayerNorm -> 96 x 384 GEMM on 56 x 56 positions, units of three
    # rows of 56 (168 rows x (96 + 384) floats = 315 KiB): one unit per group in a 1 MiB L2.
    assert group_cap(unit=168, row_bytes=4 * (96 + 384), l2_bytes=1 << 20) == 1
    assert group_blocks(rows=3136, mt=168, cores=2) == 10  # unbounded: two groups of 1568 rows (3 MiB each)
    assert group_blocks(rows=3136, mt=168, cores=2, max_blocks=1) == 1
    assert group_cap(unit=6, row_bytes=4 * 128, l2_bytes=1 << 20) == 170  # BERT-tiny's 128 rows: no bound reached
    assert group_blocks(rows=128, mt=6, cores=2, max_blocks=170) == 11
    assert group_cap(unit=6, row_bytes=4 << 20, l2_bytes=1 << 20) == 1  # at least one unit
    assert group_cap(unit=6, row_bytes=512, l2_bytes=0) == 0  # L2 unknown: no bound


def test_groups_of_a_feature_map_are_whole_rows_of_it():
    assert group_unit(mt=6, shape=(1, 128, 32)) == 6
    assert group_unit(mt=6, shape=(1, 56, 56, 96)) == 168  # three rows of 56 positions
    assert group_unit(mt=4, shape=(3, 7, 32)) == 28


def test_norm_fuses_only_where_the_weight_stays_in_l2():
    l2 = 2 << 20
    assert norm_fits(row=128, n=128, k=512, l2_bytes=l2) is None
    assert "does not stay in half the L2" in norm_fits(row=768, n=768, k=768, l2_bytes=l2)
    assert "at most" in norm_fits(row=32768, n=32768, k=4, l2_bytes=0)  # too long a row for a row buffer
    assert norm_fits(row=768, n=768, k=3072, l2_bytes=0) is None  # L2 unknown: no reason to refuse


class _PostNorm(nn.Module):
    """BERT's output block: ``LayerNorm(dense(x) + residual)``, twice (attention output and FFN)."""

    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-12)
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x):
        h = self.norm1(self.dense(x) + x)
        return self.norm2(self.down(torch.nn.functional.gelu(self.up(h))) + h)


def _built_and_checked(model: nn.Module, x: torch.Tensor, tmp_path, dynamo: bool, target=None):
    """(ONNX path, model built from it for ``target``), its output checked against PyTorch's."""
    path = str(tmp_path / "model.onnx")
    torch_to_onnx(model, (x,), path, dynamo=dynamo)
    built = alt_tvm.build(path, target=target, strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)
    return path, built


def _randomise(model: nn.Module) -> nn.Module:
    """Norm scales and shifts away from 1 and 0 (a test of both)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_()
    return model.eval()


@pytest.mark.parametrize("shape", [(1, 24, 32), (2, 5, 32)], ids=["one-sequence", "batch-of-2-partial-blocks"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_post_norm_layers_fuse_into_their_gemms_and_match_torch(shape, dynamo, tmp_path):
    model, x = _randomise(_PostNorm()), torch.randn(*shape)
    path, built = _built_and_checked(model, x, tmp_path, dynamo)
    fused = [k for k in built.report.kernels if "relax.nn.layer_norm" in k.ops]
    assert len(fused) == 2 and all(k.ops[0] == "relax.matmul" for k in fused), [k.ops for k in fused]
    assert all("|then=nn.layer_norm:" in k.workload for k in fused)
    # The option turns it off: two layer-norm kernels of their own, the same numbers.
    apart = alt_tvm.build(path, strict=True, strategy_options={"alt": {"fuse_norms": False}})
    norms = [k.ops for k in apart.report.kernels if "relax.nn.layer_norm" in k.ops]
    assert norms == [("relax.nn.layer_norm",)] * 2
    np.testing.assert_allclose(apart(x.numpy())[0], built(x.numpy())[0], rtol=1e-5, atol=1e-6)


def test_a_large_weight_keeps_its_own_norm_kernel_unless_told(tmp_path):
    model = _randomise(_PostNorm(dim=768, hidden=64))
    x = torch.randn(1, 8, 768)
    path = str(tmp_path / "wide.onnx")
    torch_to_onnx(model, (x,), path, dynamo=False)
    default = alt_tvm.build(path, strict=True)
    fused_ops = [k.ops for k in default.report.kernels if "relax.nn.layer_norm" in k.ops]
    # The 768 x 768 weight (2.4 MB) is not fused; the 64 x 768 one (196 kB) is.
    assert ("relax.nn.layer_norm",) in fused_ops and len(fused_ops) == 2
    always = alt_tvm.build(path, strict=True, strategy_options={"alt": {"fuse_norms": "always"}})
    assert all(ops[0] == "relax.matmul" for ops in
               (k.ops for k in always.report.kernels if "relax.nn.layer_norm" in k.ops))
    with torch.no_grad():
        want = model(x).numpy()
    for built in (default, always):
        np.testing.assert_allclose(built(x.numpy())[0], want, rtol=1e-4, atol=1e-4)


class _Shifted(nn.Module):
    """A residual far from zero: the norm's mean is 1e3 times its rows' spread."""

    def __init__(self, dim: int = 48) -> None:
        super().__init__()
        self.dense, self.norm = nn.Linear(dim, dim), nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.dense(x) + x + 1000.0)


def test_rows_with_a_large_mean_keep_their_precision(tmp_path):
    model = _Shifted().eval()
    x = torch.randn(1, 16, 48)
    path = str(tmp_path / "shifted.onnx")
    torch_to_onnx(model, (x,), path, dynamo=False)
    built = alt_tvm.build(path, strict=True)
    assert any("relax.nn.layer_norm" in k.ops and k.ops[0] == "relax.matmul" for k in built.report.kernels)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    # float32 rows around 1000 carry 6e-5 of rounding each: the result stays near that.
    np.testing.assert_allclose(built(x.numpy())[0], want, atol=2e-3)


class _PreNorm(nn.Module):
    """A pre-norm block (GPT-2, ViT, Swin): ``x + W2 gelu(W1 LayerNorm(x))``, twice; the norms'
    inputs are also read by the residual adds."""

    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.norm1, self.proj = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.norm2, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.proj(self.norm1(x))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


@pytest.mark.parametrize("shape", [(1, 20, 32), (3, 7, 32), (1, 6, 6, 32)],
                         ids=["one-sequence", "batch-of-3", "feature-map"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_pre_norm_layers_fuse_into_the_gemm_reading_them_and_match_torch(shape, dynamo, tmp_path):
    _, built = _built_and_checked(_randomise(_PreNorm()), torch.randn(*shape), tmp_path, dynamo)
    fused = [k for k in built.report.kernels if "relax.nn.layer_norm" in k.ops]
    assert [k.ops[:2] for k in fused] == [("relax.matmul", "relax.nn.layer_norm")] * 2
    assert all("|prologue=nn.layer_norm:" in k.workload for k in fused)
    assert not [k for k in built.report.kernels if k.ops == ("relax.nn.layer_norm",)]


@pytest.mark.parametrize("norm_before", [True, False], ids=["pre-norm", "post-norm"])
def test_groups_bounded_by_a_small_l2_still_match_torch(norm_before, tmp_path):
    import dataclasses

    from alt_tvm.target import host

    # With a 16 KiB L2 a group holds a few units of rows: more groups than threads, the last one
    # padded (two groups, one per thread, without the bound).
    machine = dataclasses.replace(host(), l2_bytes=16 << 10)
    model = _randomise(_PreNorm() if norm_before else _PostNorm())
    _, built = _built_and_checked(model, torch.randn(1, 14, 14, 32) if norm_before else torch.randn(1, 150, 32),
                                  tmp_path, False, target=machine)
    fused = [k for k in built.report.kernels if "relax.nn.layer_norm" in k.ops]
    assert len(fused) == 2, [k.ops for k in built.report.kernels]
    scripts = [next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == k.name).script()
               for k in fused]
    tasks = [int(line.split("T.parallel(")[1].split(")")[0]) for script in scripts
             for line in script.splitlines() if "T.parallel(" in line]
    assert tasks and min(tasks) > 2, tasks


class _SharedNorm(nn.Module):
    """One norm read by two projections (BERT's ``h`` feeding Q, K and V)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.norm, self.a, self.b = nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        h = self.norm(x)
        return self.a(h) * self.b(h)


def test_a_norm_that_two_gemms_read_keeps_its_own_kernel(tmp_path):
    model = _randomise(_SharedNorm())
    x = torch.randn(1, 12, 32)
    path = str(tmp_path / "shared.onnx")
    torch_to_onnx(model, (x,), path, dynamo=False)
    built = alt_tvm.build(path, strict=True)
    assert [k.ops for k in built.report.kernels if "relax.nn.layer_norm" in k.ops] == [("relax.nn.layer_norm",)]
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", [_PostNorm, _PreNorm], ids=["post-norm", "pre-norm"])
def test_a_fused_kernel_that_fails_falls_back_to_the_gemm_and_norm_kernels(model, tmp_path, monkeypatch):
    model = _randomise(model())
    x = torch.randn(1, 10, 32)
    path = str(tmp_path / "norm.onnx")
    torch_to_onnx(model, (x,), path, dynamo=False)

    def broken(*args, **kwargs):
        raise RuntimeError("no schedule today")

    monkeypatch.setattr(gemm, "schedule_gemm_norm", broken)
    monkeypatch.setattr(gemm, "schedule_norm_gemm", broken)
    built = alt_tvm.build(path)
    assert len(built.report.failed) == 2
    assert all("no schedule today" in why and "nn.layer_norm:" in key for key, why in built.report.failed.items())
    # Each piece is lowered by its own strategy: two GEMM kernels and two layer-norm kernels.
    assert [k.ops for k in built.report.kernels if "relax.nn.layer_norm" in k.ops] == [("relax.nn.layer_norm",)] * 2
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_a_bad_fuse_norms_option_names_the_values_allowed(tmp_path):
    model = _randomise(_PostNorm())
    x = torch.randn(1, 6, 32)
    path = str(tmp_path / "post_norm.onnx")
    torch_to_onnx(model, (x,), path, dynamo=False)
    with pytest.raises(ValueError, match=r"fuse_norms.*True, False or 'always'.*'sometimes'"):
        alt_tvm.build(path, strategy_options={"alt": {"fuse_norms": "sometimes"}})


@pytest.mark.parametrize("classes", [2, 10])
def test_a_one_row_classifier_after_its_norm_builds_on_every_isa(x86_runnable, classes):
    """ConvNeXt's head (Hugging Face's has 2 labels by default): a layer norm, then a linear
    layer, on one pooled row. The product's register block keeps its one-row loop under the
    group loop (a unit loop dropped there made the schedule fail and the head fall back)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(768), nn.Linear(768, classes)).eval()
    x = torch.randn(1, 768)
    built = alt_tvm.build(model, x86_runnable, example_inputs=(x,), strict=True)
    assert not built.report.failed and len(built.report.partitions) == 1
    with torch.no_grad():
        np.testing.assert_allclose(built(x.numpy())[0], model(x).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_before", [False, True], ids=["post-norm", "pre-norm"])
def test_a_fused_gemm_norm_has_a_space_whose_default_is_the_untuned_kernel_and_whose_points_compute_it(
        norm_before, tmp_path):
    """Register block, panel, unroll and group size are knobs; every valid point computes the layer."""
    from conftest import check_space

    from alt_tvm.integration import extract_tasks
    from alt_tvm.strategies.alt.space import GemmNormSpace

    model = _randomise(_PreNorm() if norm_before else _PostNorm())
    x = torch.randn(1, 24, 32)
    (task, *_) = [t for t in extract_tasks(model, example_inputs=[x]) if isinstance(t.space, GemmNormSpace)]
    check_space(task)
    with pytest.raises(ValueError, match="do not fit rows=24, N=32"):
        task.lower({**task.space.params(*task.space.default()), "nt": 5})
