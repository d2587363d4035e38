"""The build and tuning options: validated once when made, with errors naming the bad value;
the keyword calls and the options objects reach the same code path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from alt_tvm.options import BuildOptions, InModelConfig, TuneOptions, build_options, tune_options
from alt_tvm.target import describe_cpu, host


class ConvRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


INPUTS = [torch.randn(1, 8, 12, 12)]


def test_build_options_hold_their_values_resolved():
    options = BuildOptions()
    assert options.target == host() and options.variant == "alt" and options.strategies is None
    assert options.strategy_options == {} and options.records is None and options.log_path is None
    haswell = BuildOptions(target="cpu:haswell", strategies=["alt"])
    assert haswell.target == describe_cpu("haswell", name="cpu:haswell") and haswell.strategies == ("alt",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        haswell.variant = "alt-wp"


@pytest.mark.parametrize("fields, error, match", [
    (dict(variant="alt-xx"), ValueError, r"unknown variant 'alt-xx'; choose from \['alt', 'alt-wp', 'alt-ol'\]"),
    (dict(target=42), TypeError, "target must be .* got int 42"),
    (dict(target="pi5"), ValueError, "unknown board 'pi5'"),
    (dict(strategies="alt"), TypeError, "not the string 'alt'"),
    (dict(strategies=["fast"]), ValueError, r"unknown strategies \['fast'\]; registered:"),
    (dict(strategy_options={"fast": {}}), ValueError, r"strategy_options for unknown strategies \['fast'\]"),
    (dict(fast_math=1), TypeError, "fast_math must be a bool, got 1"),
    (dict(strict="yes"), TypeError, "strict must be a bool, got 'yes'"),
    (dict(records=42), TypeError, "records must be the path of a tuning log"),
    (dict(records="/nonexistent/log.jsonl"), FileNotFoundError, "'/nonexistent/log.jsonl' does not exist"),
])
def test_bad_build_options_name_the_value_and_what_is_allowed(fields, error, match):
    with pytest.raises(error, match=match):
        BuildOptions(**fields)


@pytest.mark.parametrize("fields, error, match", [
    (dict(trials=1), ValueError, "trials must be an int >= 2, got 1"),
    (dict(log=None), TypeError, "log must be the path of a JSON-lines file"),
    (dict(in_flight=0), ValueError, "in_flight must be an int >= 1, got 0"),
    (dict(lookahead=-1), ValueError, "lookahead must be an int >= 0, got -1"),
    (dict(scheduler="fifo"), ValueError, "scheduler must be 'static' or 'gradient', got 'fifo'"),
    (dict(layout_levels=3), ValueError, "layout_levels must be 1 or 2, got 3"),
    (dict(cost_model="rf"), ValueError, "cost_model must be 'xgb', None or a model object, got 'rf'"),
    (dict(features="ast"), ValueError, "features must be 'tir' or 'knobs', got 'ast'"),
    (dict(plot=3), TypeError, "plot must be None or the path of a PNG file"),
    (dict(verify="yes"), TypeError, "verify must be a bool, got 'yes'"),
    (dict(resume=None), TypeError, "resume must be a bool, got None"),
    (dict(build={"target": None}), TypeError, "build must be an alt_tvm.options.BuildOptions, got dict"),
    (dict(in_model={"rounds": 3}), TypeError, "in_model must be an alt_tvm.options.InModelConfig, got dict"),
])
def test_bad_tune_options_name_the_value_and_what_is_allowed(fields, error, match):
    with pytest.raises(error, match=match):
        TuneOptions(**{"trials": 8, "log": "x.jsonl", **fields})


def test_a_tuning_run_writes_its_log_so_its_build_applies_none(tmp_path):
    log = tmp_path / "old.jsonl"
    log.write_text("")
    with pytest.raises(ValueError, match="build.records must be None when tuning"):
        TuneOptions(trials=8, log=tmp_path / "new.jsonl", build=BuildOptions(records=log))


def test_numpy_ints_are_held_as_ints():
    options = TuneOptions(trials=np.int64(8), log="x.jsonl", seed=np.int32(3))
    assert type(options.trials) is int and type(options.seed) is int and options.seed == 3


def test_keywords_make_one_options_object():
    base = BuildOptions(variant="alt-wp")
    assert build_options(None) == BuildOptions()
    assert build_options(base) is base
    assert build_options(base, strategies=["alt"]) == BuildOptions(variant="alt-wp", strategies=["alt"])
    with pytest.raises(TypeError, match=r"build: unexpected keyword\(s\) \['trials'\]; the build options are"):
        build_options(trials=4)


def test_a_target_alone_may_stand_where_the_options_go():
    haswell = describe_cpu("haswell")
    assert build_options(haswell).target == haswell
    assert build_options("cpu:haswell", fast_math=True) == BuildOptions(target="cpu:haswell", fast_math=True)
    with pytest.raises(TypeError, match="the target is given twice"):
        build_options("cpu:haswell", target=host())
    with pytest.raises(TypeError, match=r"BuildOptions or a target \(a HardwareTarget or its name\), got int 3"):
        build_options(3)


def test_tune_keywords_may_name_build_fields():
    options = tune_options(trials=8, log="x.jsonl", variant="alt-ol", seed=2)
    assert options.build.variant == "alt-ol" and options.seed == 2
    again = tune_options(options, strategies=["alt"])
    assert again.build == BuildOptions(variant="alt-ol", strategies=["alt"]) and again.seed == 2
    assert tune_options(options, in_model=InModelConfig(rounds=3)).in_model.rounds == 3
    with pytest.raises(TypeError, match="not both"):
        tune_options(trials=8, log="x.jsonl", build=BuildOptions(), variant="alt-ol")
    with pytest.raises(TypeError, match=r"tune: missing the tuning option\(s\) \['log'\]"):
        tune_options(trials=8)
    with pytest.raises(TypeError, match=r"tune: unexpected keyword\(s\) \['budget'\]"):
        tune_options(trials=8, log="x.jsonl", budget=3)


def test_the_options_module_imports_no_tvm_and_nothing_above_it():
    done = subprocess.run([sys.executable, "-c", "import sys, alt_tvm, alt_tvm.options\n"
                           "alt_tvm.options.TuneOptions.__doc__\nprint('tvm' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False"]
    from test_architecture import imports_of

    path = Path(__file__).resolve().parent.parent / "alt_tvm" / "options.py"
    imported = imports_of(path.read_text(), "alt_tvm.options")
    above = ("alt_tvm.graph", "alt_tvm.tuning", "alt_tvm.in_model", "alt_tvm.integration", "alt_tvm.cli",
             "alt_tvm.deploy")
    assert not [name for name in imported if name.startswith(above)]


def test_the_pass_pipeline_and_task_extraction_take_the_options_object():
    import tvm

    import alt_tvm
    from alt_tvm.graph.propagate import AltLayoutPass
    from alt_tvm.integration import extract_tasks

    options = BuildOptions(variant="alt-wp", strategies=["alt"])
    assert AltLayoutPass(options).options is options
    assert AltLayoutPass(options, variant="alt").options.variant == "alt"
    assert isinstance(alt_tvm.pipeline(options), tvm.ir.transform.Pass)
    by_object = extract_tasks(ConvRelu().eval(), options, example_inputs=INPUTS)
    by_keywords = extract_tasks(ConvRelu().eval(), example_inputs=INPUTS, variant="alt-wp", strategies=["alt"])
    assert [t.key for t in by_object] == [t.key for t in by_keywords] and len(by_object) == 1
    with pytest.raises(ValueError, match="layout_levels must be 1 or 2"):
        extract_tasks(ConvRelu().eval(), options, example_inputs=INPUTS, layout_levels=0)


def test_a_build_from_the_options_object_equals_the_keyword_build():
    import alt_tvm

    model = ConvRelu().eval()
    by_object = alt_tvm.build(model, BuildOptions(variant="alt-wp"), example_inputs=INPUTS)
    by_keywords = alt_tvm.build(model, example_inputs=INPUTS, variant="alt-wp")
    digests = [sorted(k.digest for k in m.kernel_info().values()) for m in (by_object, by_keywords)]
    assert digests[0] == digests[1] and by_object.report.conversions == by_keywords.report.conversions
    (out,) = by_object(INPUTS[0].numpy())
    np.testing.assert_allclose(out, model(INPUTS[0]).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_tune_takes_the_options_object(tmp_path):
    from alt_tvm.integration import tune

    options = TuneOptions(trials=4, log=tmp_path / "t.jsonl", verify=False, revalidate=0, features="knobs",
                          cost_model=None, progress=False)
    measured = []
    summaries = tune(ConvRelu().eval(), options, example_inputs=INPUTS,
                     measure=lambda task, params: measured.append(params) or 1.0)
    assert len(summaries) == 1 and summaries[0].trials == 4 and len(measured) == 4
    assert summaries.in_model is None
