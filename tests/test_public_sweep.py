"""The public-model sweep (``benchmarks/sweep_public.py``): every architecture, both exporters,
builds with alt-tvm and matches ONNX Runtime, for this machine and, on an AVX-512 machine, for
an AVX2 CPU too (the portability sweep: the AVX2 kernels run on AVX-512). Slow (about 20
minutes a target on 2 cores): each model is exported twice, built twice and checked in a child
process of its own. The checks of the model selection (``--names`` with groups, ``--kind``)
are fast."""

from __future__ import annotations

import platform

import pytest
from conftest import load_script

import alt_tvm.models.public as public

sweep_public = load_script("sweep_public")


def _available(name: str) -> bool:
    if not name.startswith(("tv_", "timm_")):
        return True
    public._python_torchvision()
    try:
        import torchvision.models  # noqa: F401
        if name.startswith("timm_"):
            import timm  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or no torchvision matches this torch
        return False
    return True


def _targets() -> list[str]:
    """This machine, and an AVX2 CPU where this one has wider vectors (its code runs here)."""
    from alt_tvm.target import host

    wider = platform.machine().lower() in ("x86_64", "amd64") and host().vector_bits > 256
    return ["host", *(["cpu:haswell"] if wider else [])]


@pytest.mark.slow
@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize("name", sorted(public.public_models()))
def test_every_public_architecture_builds_and_matches_onnx_runtime(name, target, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    if not _available(name):
        pytest.skip("torchvision or timm is not importable (make test installs both)")
    args = sweep_public.parse_args(["--names", name, "--export-dir", str(tmp_path), "--rounds", "0",
                                    "--timeout", "1500", "--target", target])
    row = sweep_public.run_in_child(name, args)
    assert "error" not in row, row.get("error")
    exported = {e: entry for e, entry in row["exporters"].items() if entry.get("status") != "export failed"}
    assert "torchscript" in exported, row["exporters"]["torchscript"]
    for exporter, entry in exported.items():
        assert entry["status"] == "ok", (exporter, entry)
        assert entry["max_rel_error"] < 1e-4 and not entry["fallbacks"] and not entry["left_as_is"], entry


def test_cnn_suite_group_names_torchvision_cnns_of_the_zoo():
    models = public.public_models()
    group = public.GROUPS["cnn_suite"]
    assert len(group) == 11 and len(set(group)) == 11
    for name in group:
        assert name in models, name
        assert name.startswith("tv_") and models[name].kind == "cnn"
        assert models[name].input_shape == (1, 3, 224, 224)


def test_names_take_groups_and_kind_filters():
    group = list(public.GROUPS["cnn_suite"])
    assert sweep_public.parse_args(["--names", "cnn_suite"]).names == group
    assert sweep_public.parse_args(["--names", "cnn_suite"]).suite == "cnn_suite"  # filed under its suite
    assert sweep_public.parse_args(["--names", "tv_googlenet", "cnn_suite"]).suite == "public_sweep"
    # A group and a name in it, once each, in the order given.
    assert sweep_public.parse_args(["--names", "tv_googlenet", "cnn_suite"]).names == (
        ["tv_googlenet"] + [n for n in group if n != "tv_googlenet"])
    cnns = sweep_public.parse_args(["--kind", "cnn"]).names
    models = public.public_models()
    assert set(group) <= set(cnns) and all(models[n].kind == "cnn" for n in cnns)
    assert sweep_public.parse_args(["--names", "hf_vit_b16", "cnn_suite", "--kind", "transformer"]).names == [
        "hf_vit_b16"]


def test_unknown_names_error_with_the_choices(capsys):
    with pytest.raises(ValueError, match=r"unknown models \['cnn-suite'\].*cnn_suite.*tv_resnet18"):
        public.select(["cnn-suite"])
    with pytest.raises(SystemExit):
        sweep_public.parse_args(["--names", "tv_resnet18", "no_such_model"])
    assert "unknown models ['no_such_model']" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the group has no transformer
        sweep_public.parse_args(["--names", "cnn_suite", "--kind", "transformer"])
    with pytest.raises(SystemExit):
        load_script("export_public").main(["--names", "cnn-suite"])
