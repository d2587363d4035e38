"""The public-model sweep (``benchmarks/sweep_public.py``): every architecture, both exporters,
builds with alt-tvm and matches ONNX Runtime, for this machine and, on an AVX-512 machine, for
an AVX2 CPU too (the portability sweep: the AVX2 kernels run on AVX-512). Slow (about 20
minutes a target on 2 cores): each model is exported twice, built twice and checked in a child
process of its own. The checks of the model selection (``--names`` with groups, ``--kind``),
of OpenVINO checked before it is timed, and of the reading against the faster peer are fast."""

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


def _row(model: str, ms: dict, status: str = "ok") -> dict:
    entry = {"status": status, "build_s": 1.0, "partitions": {"alt": 2}, "fallbacks": [], "conversions": 0,
             "max_rel_error": 1e-7}
    return {"model": model, "kind": "cnn", "target": "x", "exporters": {"torchscript": entry}, "ms": ms}


def test_each_export_is_read_against_the_faster_peer_and_the_run_summed_up():
    rows = [sweep_public.add_faster_peer(_row("a", {"alt-tvm torchscript": 2.0, "onnxruntime": 3.0, "openvino": 2.5})),
            sweep_public.add_faster_peer(_row("b", {"alt-tvm torchscript": 4.0, "onnxruntime": 2.0, "openvino": 3.0})),
            sweep_public.add_faster_peer(_row("c", {"alt-tvm torchscript": 1.0, "onnxruntime": 2.0})),
            sweep_public.add_faster_peer(_row("d", {"alt-tvm torchscript": 1.0, "onnxruntime": 0.1}, "mismatch"))]
    entries = [row["exporters"]["torchscript"] for row in rows]
    assert [e["faster_peer"] for e in entries] == ["openvino", "onnxruntime", "onnxruntime", "onnxruntime"]
    assert [e["ratio_vs_faster_peer"] for e in entries] == pytest.approx([1.25, 0.5, 2.0, 0.1])
    assert entries[0]["ratios_vs_peers"] == pytest.approx({"onnxruntime": 1.5, "openvino": 1.25})
    # Over the models whose export is ok: (1.25 * 0.5 * 2) ** (1/3), behind on b.
    (summary,) = sweep_public.summary(rows).values()
    assert summary["models"] == 3 and summary["behind"] == ["b"] and summary["models_behind_faster_peer"] == 1
    assert summary["geomean_ratio_vs_faster_peer"] == pytest.approx(1.25 ** (1 / 3))
    rows[2]["peers"] = {"openvino": {"status": "skipped", "reason": "OpenVINO is not installed (no module)"}}
    table = sweep_public.markdown(rows)
    head, _, first, second, third, fourth, _ = table.split("\n")
    assert "| ORT ms | OpenVINO ms | faster peer | peer / alt-tvm [90% interval] | % of FP32 peak: alt-tvm, peer |" \
        in head
    assert first.endswith("| 2.0 | 3.0 | 2.5 | openvino | 1.25x |  |")
    assert third.endswith("| 1.0 | 2.0 | skipped | onnxruntime | 2.00x |  |")
    assert all(line.count("|") == head.count("|") for line in (first, second, third, fourth))
    foot = sweep_public.foot(rows)
    assert "alt-tvm (torchscript) against the faster peer" in foot and "geometric mean 1.08x, behind on 1 (b)" in foot
    assert "openvino skipped: OpenVINO is not installed (no module)" in foot
    assert "FP32 FMA peak" not in foot  # no model's arithmetic counted


def test_with_the_rounds_each_ratio_gets_its_interval_and_the_run_tells_noise_from_behind():
    # Five paired rounds each (the interval is their range): a is behind in every round, b in
    # its median only, c ahead; b reads behind, but not beyond the rounds' spread.
    rounds = {"a": ([2.0] * 5, [1.8, 1.9, 1.7, 1.8, 1.85]), "b": ([2.0] * 5, [1.9, 2.1, 1.95, 2.2, 1.9]),
              "c": ([1.0] * 5, [2.0] * 5)}
    rows = []
    for model, (alt, peer) in rounds.items():
        row = _row(model, {"alt-tvm torchscript": sorted(alt)[2], "onnxruntime": sorted(peer)[2]})
        row["rounds_ms"] = {"alt-tvm torchscript": alt, "onnxruntime": peer}
        rows.append(sweep_public.add_faster_peer(row))
    intervals = [bound for row in rows for bound in row["exporters"]["torchscript"]["ratio_interval"]]
    assert intervals == pytest.approx([0.85, 0.95, 0.95, 1.1, 2.0, 2.0])
    (summary,) = sweep_public.summary(rows).values()
    assert summary["behind"] == ["a", "b"] and summary["behind_beyond_noise"] == ["a"]
    assert sweep_public.markdown(rows).split("\n")[2].endswith("| onnxruntime | 0.90x [0.85, 0.95] |  |")
    assert "behind on 2 (a, b), 1 beyond the rounds' spread (its whole interval below 1: a)" in sweep_public.foot(rows)


def test_with_the_runs_peak_each_export_is_read_against_it_and_the_run_gets_its_ceiling():
    # 0.2 GFLOP at 100 GFLOP/s take 2 ms; a counts, b (no arithmetic counted) does not.
    rows = [{**_row("a", {"alt-tvm torchscript": 2.5, "onnxruntime": 3.0, "openvino": 4.0}), "gflop": 0.2},
            _row("b", {"alt-tvm torchscript": 1.0, "onnxruntime": 2.0})]
    for row in rows:
        sweep_public.add_faster_peer(row, peak_gflops=100.0)
    entry = rows[0]["exporters"]["torchscript"]
    assert entry["alt_share_of_peak"] == pytest.approx(0.8) and entry["peer_share_of_peak"] == pytest.approx(2 / 3)
    assert entry["ceiling_vs_faster_peer"] == pytest.approx(1.5)
    assert "ceiling_vs_faster_peer" not in rows[1]["exporters"]["torchscript"]
    assert sweep_public.markdown(rows).split("\n")[2].endswith("| onnxruntime | 1.20x | 80, 67 |")
    (summary,) = sweep_public.summary(rows).values()
    assert "geomean_ceiling_vs_faster_peer" not in summary  # one model of two counted
    (summary,) = sweep_public.summary(rows[:1]).values()
    assert summary["geomean_ceiling_vs_faster_peer"] == pytest.approx(1.5)
    assert "a runtime at the run's FP32 FMA peak: 1.50x" in sweep_public.foot(rows[:1])


def test_openvino_is_checked_against_alt_tvm_before_it_is_timed(tmp_path):
    import numpy as np
    import torch

    from alt_tvm.bench import onnxruntime_session, openvino_available

    path = tmp_path / "conv.onnx"
    torch.onnx.export(torch.nn.Conv2d(3, 4, 3).eval(), (torch.randn(1, 3, 8, 8),), str(path), dynamo=False,
                      opset_version=17)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32")
    got = onnxruntime_session(path)(x)[0]  # stands for alt-tvm's output, which matches it
    row: dict = {}
    timed = sweep_public.other_peers(row, path, x, got, threads=1)
    if why := openvino_available():
        assert timed == {} and row["peers"] == {"openvino": {"status": "skipped", "reason": why}}
        pytest.skip(why)
    assert list(timed) == ["openvino"] and row["peers"]["openvino"]["status"] == "ok"
    assert row["peers"]["openvino"]["max_rel_error"] < sweep_public.TOLERANCE
    row = {}
    assert sweep_public.other_peers(row, path, x, got * 1.01, threads=1) == {}  # computes something else: not timed
    assert row["peers"]["openvino"]["status"] == "mismatch"


def test_an_export_at_another_batch_has_that_many_rows_and_says_so_in_its_name(tmp_path):
    import onnx

    path = public.export("hf_bert_tiny", tmp_path, batch=3)
    assert path.name == "hf_bert_tiny.b3.onnx"
    dims = [d.dim_value for d in onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [3, 128]
    with pytest.raises(ValueError, match="batch must be an int >= 1, got 0"):
        public.export("hf_bert_tiny", tmp_path, batch=0)
