"""scripts/ab_conv_knob.py: the two builds differ only in the forced knob, in the order asked."""

import numpy as np
import pytest
import torch
from conftest import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("ab_conv_knob")


def test_a_forced_knob_changes_only_its_convs_and_the_pair_is_timed(script, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU()).eval()
    path = tmp_path / "pw.onnx"
    torch.onnx.export(model, (torch.randn(1, 16, 56, 56),), str(path), dynamo=False, opset_version=17)
    builds = script.build_pair(str(path), knob="prefetch_input", value=False, forced_first=True)
    assert list(builds) == ["forced", "default"]  # the order asked

    def hints(built):
        return sum("_lines = " in built.mod[g].script() for g in built.mod.get_global_vars()
                   if g.name_hint.startswith("alt_conv2d"))

    assert hints(builds["default"]) == 1 and hints(builds["forced"]) == 0
    result = script.compare(builds, rounds=2, repeat=1)
    assert result["rounds"] == 2 and 0 <= result["rounds_default_faster"] <= 2
    assert np.isfinite(result["default_over_forced"]) and result["default_over_forced"] > 0
    assert script.parse_value("false") is False and script.parse_value("4") == 4
    with pytest.raises(ValueError, match=r"unknown knob 'prefetch_inputs'.*'prefetch_input'"):
        script.build_pair(str(path), knob="prefetch_inputs", value=False, forced_first=False)


def test_per_kernel_mode_forces_one_kind_of_conv_and_times_its_kernels_apart(script, tmp_path):
    class PointwiseDepthwise(torch.nn.Module):  # the add reads the 1x1 map too: no fused block
        def __init__(self):
            super().__init__()
            self.pw, self.dw = torch.nn.Conv2d(16, 32, 1), torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)

        def forward(self, x):
            y = torch.relu(self.pw(x))
            return torch.relu(self.dw(y)) + y

    torch.manual_seed(0)
    model = PointwiseDepthwise().eval()
    path = tmp_path / "pw_dw.onnx"
    torch.onnx.export(model, (torch.randn(1, 16, 28, 28),), str(path), dynamo=False, opset_version=17)
    builds = script.build_pair(str(path), knob="unroll_window", value=True, forced_first=False, convs="depthwise")
    changed = script.changed_kernels(builds)
    assert len(changed) == 1  # the depthwise conv's kernel; the 1x1 conv's is the same function in both
    (name,) = changed
    default, forced = (script._functions(builds[k])[name].script() for k in ("default", "forced"))
    assert "T.unroll(3)" in forced and "T.unroll(3)" not in default  # its 3x3 window unrolled
    dense = script.build_pair(str(path), knob="epilogue_in_block", value=False, forced_first=False, convs="dense")
    (dense_name,) = script.changed_kernels(dense)
    assert dense_name != name
    result = script.compare_kernels(builds, rounds=2, repeat=1)
    assert result["changed_kernels"] == 1 and list(result["kernels"]) == [name]
    assert all(ms > 0 for ms in result["kernels"][name])
    assert result["changed_default_ms"] > 0 and result["unchanged_ms"] > 0
    assert np.isfinite(result["changed_default_over_forced"]) and np.isfinite(result["unchanged_default_over_forced"])
    with pytest.raises(ValueError, match=r"convs must be one of .*'depthwise'.*got 'grouped'"):
        script.build_pair(str(path), knob="unroll_window", value=True, forced_first=False, convs="grouped")


def test_the_in_place_pair_differs_in_the_residual_kernel_only_and_is_timed(tmp_path):
    script = load_script("ab_rewrite")

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(torch.nn.Conv2d(16, 16, 1) for _ in range(3))

        def forward(self, x):
            shortcut = torch.relu(self.convs[0](x))
            return torch.relu(self.convs[2](torch.relu(self.convs[1](shortcut))) + shortcut)

    torch.manual_seed(0)
    path = tmp_path / "residual.onnx"
    torch.onnx.export(Residual().eval(), (torch.randn(1, 16, 28, 28),), str(path), dynamo=False, opset_version=17)
    builds = script.build_pair(str(path), rewrite="in-place", forced_first=True)
    assert builds["default"].report.in_place == 1 and builds["forced"].report.in_place == 0
    result = script.ab_conv_knob.compare_kernels(builds, rounds=2, repeat=1)
    assert result["changed_kernels"] == 1  # the residual conv, same name in both builds
    assert all(ms > 0 for ms in next(iter(result["kernels"].values())))


def test_the_padded_operand_pair_differs_in_the_padded_conv_only(tmp_path):
    script = load_script("ab_rewrite")
    torch.manual_seed(0)
    # 16 channels: no padding; 100 are padded to whole vectors of 8 or of 16
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 100, 1), torch.nn.Hardswish()).eval()
    path = tmp_path / "padded.onnx"
    torch.onnx.export(model, (torch.randn(1, 16, 14, 14),), str(path), dynamo=False, opset_version=17)
    builds = script.build_pair(str(path), rewrite="padded-operands", forced_first=False)
    changed = script.ab_conv_knob.changed_kernels(builds)
    assert len(changed) == 1
    default, forced = (builds[n].mod[next(iter(changed))].script() for n in ("default", "forced"))
    assert "if_then_else" in forced and "if_then_else" not in default  # guarded loads against one blend
    result = script.ab_conv_knob.compare(builds, rounds=2, repeat=1)  # checks the two builds agree
    assert result["rounds"] == 2
    with pytest.raises(ValueError, match=r"unknown rewrite 'fused'; known: \['in-place', 'padded-operands', 'vector-"):
        script.build_pair(str(path), rewrite="fused", forced_first=False)


def test_two_exported_builds_are_checked_and_profiled_with_their_unchanged_kernels_as_control(tmp_path):
    import alt_tvm

    script = load_script("ab_artifacts")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 1)).eval()
    x = torch.randn(1, 16, 14, 14)
    built = {}
    for name, fast_math in (("a", False), ("b", True)):  # the ReLU's NaN test goes: the first conv changes
        built[name] = alt_tvm.build(model, example_inputs=[x], fast_math=fast_math)
        built[name].export(tmp_path / name / "net")
    models = {name: alt_tvm.load(tmp_path / name / "net") for name in ("a", "b")}
    assert models["a"].kernel_info() == built["a"].kernel_info()  # the digests travel with the artifact
    first, second = (k.name for k in built["a"].report.kernels if k.name.startswith("alt_conv2d"))
    assert script.changed_kernels(models) == {first}
    result = script.compare(models, rounds=2, repeat=1)
    assert result["rounds"] == 2 and 0 <= result["rounds_b_faster"] <= 2
    assert result["changed_kernels"] == [first] and second in result["kernels"]
    assert all(np.isfinite(result[k]) and result[k] > 0 for k in ("b_over_a", "changed_b_over_a", "unchanged_b_over_a"))
    with pytest.raises(ValueError, match=r"as 'a' and 'b', got \['b', 'a'\]"):
        script.compare({"b": models["b"], "a": models["a"]}, rounds=1, repeat=1)


def test_an_artifact_without_kernel_digests_reads_as_unknown():
    from alt_tvm.deploy.model import kernel_info_from_json

    info = kernel_info_from_json({"k": {"kind": "partition", "ops": ["relax.add"], "layout": "", "flops": 1.0,
                                        "bytes": 8}})
    assert info["k"].digest == ""


def test_a_model_the_rewrite_leaves_unchanged_is_reported_skipped_and_the_run_goes_on(tmp_path, capsys):
    import json

    script = load_script("ab_rewrite")
    torch.manual_seed(0)
    path = tmp_path / "pw.onnx"  # a 1x1 conv: no pad stage for the vector-pad switch to change
    torch.onnx.export(torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.ReLU()).eval(),
                      (torch.randn(1, 16, 8, 8),), str(path), dynamo=False, opset_version=17)
    script.main(["--rewrite", "vector-pad", "--both-orders", "--rounds", "1", "--repeat", "1",
                 "--models", str(path), str(path)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and all("changes no kernel" in line["skipped"] for line in lines)  # once per model
