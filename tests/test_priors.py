"""Learned defaults: in-model decisions of tuning logs applied to the untuned build on their target."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import block_net

from alt_tvm.graph.build import build
from alt_tvm.options import BuildOptions
from alt_tvm.priors import LearnedDecision, Priors, fit_priors, workload_kind
from alt_tvm.records import RecordWriter, TuningRecord, target_key
from alt_tvm.target import host


def _conv_key(cin: int, cout: int, size: int, *, window: int = 3, groups: int = 1, stride: int = 1) -> str:
    pad = window // 2
    out = (size + 2 * pad - window) // stride + 1
    attrs = {"data_layout": "NCHW", "dilation": [1, 1], "groups": groups, "kernel_layout": "OIHW",
             "out_dtype": "float32", "out_layout": "NCHW", "padding": [pad] * 4, "strides": [stride, stride]}
    return (f"nn.conv2d|(1, {cin}, {size}, {size}):float32,({cout}, {cin // groups}, {window}, {window}):float32|"
            f"{json.dumps(attrs, separators=(',', ':'), sort_keys=True)}|out=(1, {cout}, {out}, {out}):float32|"
            f"epilogue=add+nn.relu")


def test_a_workload_kind_is_its_operator_window_strides_and_grouping_and_its_extents_are_the_rest():
    dense, other = workload_kind(_conv_key(64, 64, 56)), workload_kind(_conv_key(128, 128, 28))
    assert dense[0] == other[0]
    assert dense[1][:4] == (0.0, 6.0, pytest.approx(np.log2(56)), pytest.approx(np.log2(56)))
    assert workload_kind(_conv_key(64, 64, 56, window=1))[0] != dense[0]
    assert workload_kind(_conv_key(64, 64, 56, stride=2))[0] != dense[0]
    depthwise = workload_kind(_conv_key(64, 64, 56, groups=64))
    assert depthwise[0] != dense[0] and depthwise[0] == workload_kind(_conv_key(96, 96, 56, groups=96))[0]
    assert workload_kind("model|abc") is None


def _decision(writer, key: str, target: str, *, strategy: str, ratio: float, label: str = "tuned#1",
              params=None) -> None:
    writer.write(TuningRecord(workload_key=key, target=target, latencies_ms=(1.0,),
                              candidate={"decision": "in-model", "strategy": strategy, "params": params,
                                         "label": label, "reason": "test", "ratio": ratio, "in_model_ms": {}}))


def _check(writer, target: str, *, kept: bool) -> None:
    writer.write(TuningRecord(workload_key="model|0", target=target, latencies_ms=(1.0,),
                              candidate={"model_check": "in-model", "kept": kept, "untuned_ms": [1.0], "workloads": 1}))


def test_fitting_keeps_checked_decisions_and_answers_with_the_nearest_of_the_same_kind(tmp_path):
    target = '{"kind":"llvm","mcpu":"somecpu","num-cores":2}'
    log = tmp_path / "a.jsonl"
    with RecordWriter(log) as writer:
        _decision(writer, _conv_key(64, 64, 56), target, strategy="sconv", ratio=0.6)
        _decision(writer, _conv_key(512, 512, 7), target, strategy="alt", ratio=1.0, label="default")
        _check(writer, target, kept=True)
        _decision(writer, _conv_key(32, 32, 112, window=1), target, strategy="sconv", ratio=0.5)
        _check(writer, target, kept=False)  # the tuned model lost: its decisions teach nothing
    priors = fit_priors([log])
    assert len(priors.decisions) == 2
    near = priors.nearest(_conv_key(96, 64, 40), target=target)  # every extent within 2x
    assert near.workload == _conv_key(64, 64, 56) and near.finding and near.source.endswith(":1")
    assert priors.nearest(_conv_key(160, 64, 56), target=target) is None  # 2.5x the channels
    assert priors.nearest(_conv_key(64, 64, 56), target='{"kind":"llvm","mcpu":"other"}') is None
    assert priors.nearest(_conv_key(32, 32, 112, window=1), target=target) is None  # dropped by its check
    # The defaults held on 512 channels: a workload nearest to it keeps them.
    assert not priors.nearest(_conv_key(384, 384, 7), target=target).finding
    assert priors.strategies([_conv_key(96, 64, 40), _conv_key(384, 384, 7)], target=target) == \
        {_conv_key(96, 64, 40): "sconv"}
    path = tmp_path / "priors.json"
    path.write_text(json.dumps(priors.to_json()))
    assert Priors.read(path) == priors


def test_a_finding_needs_the_same_choice_in_enough_logs_to_be_kept(tmp_path):
    target = '{"kind":"llvm","mcpu":"somecpu","num-cores":2}'
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b", "c")}
    with RecordWriter(logs["a"]) as writer:
        _decision(writer, _conv_key(64, 64, 56), target, strategy="sconv", ratio=0.6)
        _decision(writer, _conv_key(32, 32, 112, window=1), target, strategy="sconv", ratio=0.5)
        _decision(writer, _conv_key(512, 512, 7), target, strategy="alt", ratio=1.0, label="default")
    with RecordWriter(logs["b"]) as writer:
        _decision(writer, _conv_key(96, 96, 40), target, strategy="sconv", ratio=0.8)  # agrees with a's 3x3
        _decision(writer, _conv_key(32, 32, 112, window=1), target, strategy="alt", ratio=0.7,
                  params={"prefetch": True})  # another choice on a's 1x1
    with RecordWriter(logs["c"]) as writer:
        _decision(writer, _conv_key(256, 256, 14), target, strategy="sconv", ratio=0.7)  # 4x a's channels: too far
    both = [logs["a"], logs["b"]]
    assert len(fit_priors(both).decisions) == 4  # one log is enough by default
    kept = fit_priors(both, min_logs=2)
    assert {(d.workload, d.strategy) for d in kept.decisions if d.finding} == {
        (_conv_key(64, 64, 56), "sconv"), (_conv_key(96, 96, 40), "sconv")}
    assert not kept.nearest(_conv_key(512, 512, 7), target=target).finding  # kept defaults stay
    assert not any(d.finding for d in fit_priors([logs["a"], logs["c"]], min_logs=2).decisions)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=f"min_logs must be an int >= 1, got {bad!r}"):
            fit_priors(both, min_logs=bad)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU()).eval()


def _priors_for_conv(built, index: int, *, strategy: str, switches=None) -> tuple[Priors, str]:
    key = built.report.workloads[index]
    assert key.startswith("nn.conv2d|(1, 16, 24, 24)")
    # Decided on a neighbour of the same kind (24 channels, 20x20): the nearest within 2x.
    neighbour = key.replace("(1, 16, 24, 24)", "(1, 24, 20, 20)")
    decision = LearnedDecision(target_key(host()), neighbour, strategy, switches or {}, 0.7, "log.jsonl:9")
    return Priors((decision,)), key


def test_a_learned_strategy_choice_lowers_the_neighbour_with_that_strategy():
    model, x = _model(), torch.randn(1, 16, 24, 24)
    plain = build(model, example_inputs=[x], priors=None)
    assert plain.report.partitions[0][0] == "alt" and not plain.report.learned
    priors, key = _priors_for_conv(plain, 0, strategy="sconv")
    learned = build(model, example_inputs=[x], priors=priors)
    assert learned.report.partitions[0][0] == "sconv"
    assert learned.report.learned[key].startswith("strategy sconv (0.70x the defaults' time at log.jsonl:9)")
    assert key not in learned.report.chosen_strategies and "learned defaults" in learned.report.summary()
    np.testing.assert_allclose(learned(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    # Another target's decisions, or a tuning log, leave the build to the rules.
    other = "cpu:skylake-avx512" if host().tvm_target.get("mcpu") == "haswell" else "cpu:haswell"
    assert BuildOptions(priors=priors, target=other).learned is None


def test_learned_loop_switches_change_only_those_knobs():
    model, x = _model(), torch.randn(1, 16, 24, 24)
    plain = build(model, example_inputs=[x], priors=None)
    # The 1x1 conv: the 3x3 one is a Winograd point by default, whose knobs are the transform's.
    priors, key = _priors_for_conv(plain, 1, strategy="alt", switches={"epilogue_in_block": False})
    learned = build(model, example_inputs=[x], priors=priors)
    assert learned.report.learned[key].startswith("loop knobs epilogue_in_block=False")
    assert learned.report.tuning_of(key) == "learned"
    assert learned.report.learned.keys() == {key}
    assert learned.kernel_info() != plain.kernel_info()  # the 1x1 conv's kernel changed
    np.testing.assert_allclose(learned(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_priors_option_names_a_bad_value(tmp_path):
    with pytest.raises(TypeError, match="priors must be 'auto', None, the path of a priors file.*got int 3"):
        BuildOptions(priors=3)
    with pytest.raises(FileNotFoundError, match="priors file '/no/such.json' does not exist"):
        BuildOptions(priors="/no/such.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 9}')
    with pytest.raises(ValueError, match="not a priors file of schema 1"):
        _ = BuildOptions(priors=bad).learned


def test_the_shipped_priors_are_the_reference_logs_fitted(monkeypatch):
    """alt_tvm/data/priors.json is what scripts/fit_priors.py makes of logs/reference/."""
    from pathlib import Path

    from alt_tvm.priors import SHIPPED

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    logs = sorted(str(p.relative_to(root)) for p in (root / "logs" / "reference").glob("*.jsonl"))
    shipped = Priors.read(SHIPPED)
    assert shipped.to_json() == fit_priors(logs).to_json() and any(d.finding for d in shipped.decisions)


def test_a_learned_split_builds_the_neighbouring_block_as_its_pieces_unless_the_log_decides_it(tmp_path):
    model, x = block_net(), torch.randn(1, 3, 12, 12)
    always = {"alt": {"fuse_blocks": "always"}}
    plain = build(model, example_inputs=[x], strategy_options=always, priors=None)
    (block,) = [k.workload for k in plain.report.kernels if k.kind == "partition" and "then=" in k.workload]
    neighbour = block.replace("12, 12)", "16, 16)")  # every extent of the map within 2x
    assert workload_kind(neighbour)[0] == workload_kind(block)[0] != workload_kind(block.split("|then=")[0])[0]
    stride2 = block.replace('"strides":[1,1]}+add', '"strides":[2,2]}+add', 1)
    assert stride2 != block and workload_kind(stride2)[0] != workload_kind(block)[0]

    log = tmp_path / "log.jsonl"
    with RecordWriter(log) as writer:
        writer.write(TuningRecord(workload_key=neighbour, target=target_key(host()), latencies_ms=(0.8,),
                                  candidate={"decision": "in-model", "strategy": "alt", "params": None,
                                             "label": "unfused", "fuse": False, "ratio": 0.8}))
    priors = fit_priors([log])
    (decision,) = priors.decisions
    assert not decision.fused and LearnedDecision.from_json(decision.to_json()) == decision
    assert priors.unfused([block, block.split("|then=")[0]], target=target_key(host())) == {block}

    learned = build(model, example_inputs=[x], strategy_options=always, priors=priors)
    assert learned.report.learned[block].startswith("built as its pieces (0.80x the defaults' time")
    assert learned.report.tuning_of(block) == "learned" and not learned.report.unfused
    pieces = [k for k in learned.report.kernels if k.kind == "partition" and k.workload == block]
    assert [k.ops.count("relax.nn.conv2d") for k in pieces] == [1, 1, 1]
    np.testing.assert_allclose(learned(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)

    kept = tmp_path / "kept.jsonl"  # a log that decided this block keeps it fused
    with RecordWriter(kept) as writer:
        writer.write(TuningRecord(workload_key=block, target=target_key(host()), latencies_ms=(1.0,),
                                  candidate={"decision": "in-model", "strategy": "alt", "params": None,
                                             "label": "default"}))
    logged = build(model, example_inputs=[x], strategy_options=always, priors=priors, records=kept)
    assert block not in logged.report.learned
    assert [k.ops.count("relax.nn.conv2d") for k in logged.report.kernels
            if k.kind == "partition" and k.workload == block] == [3]
