"""Decisions in the whole model: per-kernel profiles of a built model, decision records that
builds apply (strategy included), and the verification that keeps a tuned choice only where
the model gains. Search measurements are faked (the bookkeeping is under test); the builds,
the per-kernel profiles of real runs and the numerics are real."""

from __future__ import annotations

import dataclasses
import json
import warnings
import zlib

import numpy as np
import pytest
import torch
from conftest import block_net

import alt_tvm
from alt_tvm.deploy.profile import KernelProfile
from alt_tvm.in_model import InModelConfig, InModelResult, decide_in_model
from alt_tvm.integration import extract_tasks, tune
from alt_tvm.records import (
    RecordWriter,
    TuningRecord,
    candidate_key,
    rank_candidates,
    read_log,
    target_key,
)
from alt_tvm.target import host


class TwoConvs(torch.nn.Module):
    """Two 3x3 convolutions: a model small enough to build many copies of in a test."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))))


MODEL = TwoConvs().eval()
INPUTS = (torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(1)),)
TARGET = target_key(host().to_tvm())
# Built in this process: the fake profilers read each copy's build report.
FAST = InModelConfig(finalists=1, rounds=3, model_rounds=3, build_workers=1)


def fake_measure(task, params) -> float:
    if params == task.space.params(*task.space.default()):
        return 2.0  # every other point looks faster alone: each task has finalists
    return 1.0 + zlib.crc32(candidate_key(params).encode()) % 1000 / 1000


def quiet_build(model=MODEL, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return alt_tvm.build(model, example_inputs=INPUTS, **options)


def reference() -> np.ndarray:
    return MODEL(*INPUTS).detach().numpy()


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A log with search records only (fake latencies), and its tasks."""
    path = tmp_path_factory.mktemp("in_model") / "two_convs.jsonl"
    tune(MODEL, example_inputs=INPUTS, trials=8, log=path, measure=fake_measure, cost_model=None, features="knobs",
         progress=False, revalidate=0, verify=False)
    return path, extract_tasks(MODEL, example_inputs=INPUTS)


def copy_of(searched, tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(searched[0].read_text())
    return path


def profiler_where(kernel_ms):
    """A profiler that times every partition kernel of a copy by ``kernel_ms(copy's report)``."""
    def profile(model, arrays):
        ms = kernel_ms(model.report)
        times = {k.name: (ms,) for k in model.report.kernels if k.kind == "partition"}
        return KernelProfile(times, (ms * len(times),))
    return profile


def untuned_copy(report) -> bool:
    return report.tuned == 0


def test_a_profile_times_every_kernel_alt_tvm_emitted_inside_real_runs():
    built = quiet_build()
    profile = built.profile(INPUTS[0].numpy(), repeat=3)
    emitted = [k for k in built.report.kernels if k.kind == "partition"]
    assert len(emitted) == 2
    assert all(len(profile.times_ms[k.name]) == 3 and profile.median(k.name) > 0 for k in emitted)
    per_workload = profile.by_workload(built.report.kernels)
    assert set(per_workload) == set(built.report.workloads)
    # the kernels ran inside the runs: together they take less than a whole run
    assert sum(profile.median(k.name) for k in emitted) < max(profile.totals_ms)


def test_the_report_lists_each_layout_conversion_with_its_cost_in_the_model():
    # ALT-WP converts back to the canonical layout after every partition (paper §7 ablation)
    built = quiet_build(variant="alt-wp")
    profile = built.profile(INPUTS[0].numpy(), repeat=2)
    rows = profile.conversions(built.report.kernels)
    assert len(rows) == built.report.conversions >= 2
    text = built.report.summary(profile)
    for name, _detail, op, ms in rows:
        assert op == "nn.conv2d" and ms > 0
        assert f"{name}: {ms:.3f} ms for nn.conv2d" in text


def test_a_choice_slower_in_the_model_is_dropped_and_the_log_builds_the_defaults(searched, tmp_path):
    log = copy_of(searched, tmp_path)
    tasks = searched[1]
    # the search's best looks fastest alone (fake latencies); in the model every tuned copy is slower
    result = decide_in_model(MODEL, tasks, log=log, target=host(), config=FAST, example_inputs=INPUTS,
                             profiler=profiler_where(lambda r: 1.0 if untuned_copy(r) else 1.5))
    assert [d.choice.label for d in result.decisions] == ["default", "default"]
    assert not result.kept
    tuned = read_log(log)
    assert not tuned.best and set(tuned.defaults) == {t.key for t in tasks}
    built = quiet_build(records=log)
    assert built.report.tuned == 0 and len(built.report.kept_default) == 2 and not built.report.untuned
    assert not built.report.changed_by_log  # the untuned build's kernels
    np.testing.assert_allclose(built(INPUTS[0].numpy())[0], reference(), rtol=1e-4, atol=1e-4)


def test_a_choice_faster_in_the_model_is_kept_and_applied(searched, tmp_path):
    log = copy_of(searched, tmp_path)
    tasks = searched[1]
    result = decide_in_model(MODEL, tasks, log=log, target=host(), config=FAST, example_inputs=INPUTS,
                             profiler=profiler_where(lambda r: 1.5 if untuned_copy(r) else 1.0),
                             model_timer=lambda model, arrays: 1.5 if untuned_copy(model.report) else 1.0)
    assert result.kept and result.speedup == pytest.approx(1.5)
    ranked = rank_candidates(r for r in map(TuningRecord.from_json, log.read_text().splitlines()))
    by_key = {task.key: task for task in tasks}
    for d in result.decisions:
        # The best-ranked candidate off the default point (one at the default point is the default).
        default = by_key[d.key].space.params(*by_key[d.key].space.default())
        best = next(r.candidate["params"] for r in ranked[d.key] if r.candidate["params"] != default)
        assert d.choice.label == "tuned#1" and d.choice.params == best
    built = quiet_build(records=log)
    assert built.report.tuned == 2 and built.report.changed_by_log
    np.testing.assert_allclose(built(INPUTS[0].numpy())[0], reference(), rtol=1e-4, atol=1e-4)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    (check,) = [obj for obj in lines if "model_check" in obj["candidate"]]
    assert check["candidate"]["kept"] and check["latencies_ms"] == [1.0] * FAST.model_rounds


def test_choices_that_gain_alone_but_not_in_the_whole_model_are_reverted(searched, tmp_path):
    log = copy_of(searched, tmp_path)
    result = decide_in_model(MODEL, searched[1], log=log, target=host(), config=FAST, example_inputs=INPUTS,
                             profiler=profiler_where(lambda r: 1.5 if untuned_copy(r) else 1.0),
                             model_timer=lambda model, arrays: 1.0 if untuned_copy(model.report) else 1.2)
    assert not result.kept and all(d.choice.label == "default" for d in result.decisions)
    assert all("untuned model's time" in d.reason for d in result.decisions)
    assert read_log(log).best == {}


def profiler_by_copy(kernel_ms):
    """A profiler that times each partition kernel by ``kernel_ms(copy's log name, workload)``."""
    def profile(model, arrays):
        report = model.report
        times = {k.name: (kernel_ms(report.log, k.workload),) for k in report.kernels if k.kind == "partition"}
        return KernelProfile(times, (sum(t[0] for t in times.values()),))
    return profile


def test_a_choice_that_loses_beside_the_others_is_dropped_and_the_rest_built_again(searched, tmp_path):
    log = copy_of(searched, tmp_path)
    first, second = (t.key for t in searched[1])

    def kernel_ms(copy, workload):
        if copy == "<in-model copy 0>":
            return 1.5
        # both tuned candidates gain in their copy; beside the other, the second loses
        return 1.6 if copy == "<in-model choices>" and workload == second else 1.0

    result = decide_in_model(MODEL, searched[1], log=log, target=host(), config=FAST, example_inputs=INPUTS,
                             profiler=profiler_by_copy(kernel_ms),
                             model_timer=lambda model, arrays: 1.5 if untuned_copy(model.report) else 1.0)
    by_key = {d.key: d for d in result.decisions}
    assert by_key[first].choice.label == "tuned#1"
    assert by_key[second].choice.label == "default" and "gained in its copy" in by_key[second].reason
    # 2 copies, the choices, and the choices without the dropped one: the model kept is the one timed
    assert result.builds == 4 and result.kept
    assert quiet_build(records=log).report.tuned == 1


def test_the_choices_and_the_same_without_strategy_switches_are_built_in_one_batch(searched, tmp_path,
                                                                                   monkeypatch):
    from alt_tvm.graph.variants import VariantBuilder

    batches = []
    build = VariantBuilder.build
    monkeypatch.setattr(VariantBuilder, "build", lambda self, logs: batches.append(len(logs)) or build(self, logs))
    log = copy_of(searched, tmp_path)
    first, second = (t.key for t in searched[1])
    config = InModelConfig(finalists=1, rounds=3, model_rounds=3, build_workers=1, copies=3)

    def kernel_ms(copy, workload):
        fastest = {first: "<in-model copy 2>", second: "<in-model copy 1>"}  # SConv, a tuned point
        return 1.5 if copy in ("<in-model copy 0>", "<in-model copy 1>", "<in-model copy 2>") \
            and copy != fastest[workload] else 1.0

    result = decide_in_model(MODEL, searched[1], log=log, target=host(), config=config, example_inputs=INPUTS,
                             profiler=profiler_by_copy(kernel_ms),
                             model_timer=lambda model, arrays: 1.5 if untuned_copy(model.report) else 1.0)
    by_key = {d.key: d for d in result.decisions}
    assert by_key[first].choice.strategy == "sconv" and by_key[second].choice.label == "tuned#1"
    assert batches == [3, 2] and result.builds == 5 and result.kept  # no copy built twice


def decision(key, strategy, params=None):
    return TuningRecord(workload_key=key, target=TARGET, latencies_ms=(1.0,),
                        candidate={"decision": "in-model", "strategy": strategy, "params": params,
                                   "label": strategy, "reason": "test", "in_model_ms": {}})


def test_a_log_that_chooses_sconv_for_one_partition_builds_it_with_sconv(tmp_path):
    keys = quiet_build().report.workloads
    log = tmp_path / "choice.jsonl"
    with RecordWriter(log) as writer:
        writer.write(decision(keys[1], "sconv"))
    built = quiet_build(records=log)
    assert [strategy for strategy, *_ in built.report.partitions] == ["alt", "sconv"]
    assert built.report.chosen_strategies == {keys[1]: "sconv"} and built.report.changed_by_log
    assert "1 partitions lowered with the strategy the log chose by in-model time (sconv)" in \
        built.report.tuning_summary()
    np.testing.assert_allclose(built(INPUTS[0].numpy())[0], reference(), rtol=1e-4, atol=1e-4)
    # a build restricted to other strategies says why it did not follow the log
    restricted = quiet_build(records=log, strategies=["alt"])
    assert [strategy for strategy, *_ in restricted.report.partitions] == ["alt", "alt"]
    assert "excludes" in restricted.report.refused[keys[1]]


def test_the_last_decision_overrides_the_best_measurement_and_params_of_another_strategy_do_not_apply(tmp_path):
    key = "nn.conv2d|x"
    log = tmp_path / "log.jsonl"
    with RecordWriter(log) as writer:
        writer.write(TuningRecord(workload_key=key, target=TARGET, latencies_ms=(0.5,),
                                  candidate={"params": {"a": 1}, "strategy": "alt"}))
        writer.write(decision(key, "alt"))  # defaults
    tuned = read_log(log)
    assert key not in tuned.best and "test" in tuned.why_not(key)
    with RecordWriter(log) as writer:
        writer.write(decision(key, "sconv", {"b": 2}))
    tuned = read_log(log)
    assert tuned.strategies[key] == "sconv" and tuned.best[key].candidate["params"] == {"b": 2}
    assert tuned.params_for(key, "sconv") is tuned.best[key]
    assert tuned.params_for(key, "alt") is None


def test_ranking_puts_revalidated_candidates_first_by_their_pooled_median():
    def rec(params, ms, revalidation=False):
        candidate = {"params": params, **({"revalidation": True} if revalidation else {})}
        return TuningRecord(workload_key="k", target=TARGET, latencies_ms=(ms,), candidate=candidate)

    ranked = rank_candidates([rec({"a": 1}, 0.1), rec({"a": 2}, 0.3), rec({"a": 3}, 0.2),
                              rec({"a": 2}, 0.25, True), rec({"a": 3}, 0.4, True), decision("k", "alt", {"a": 9})])
    assert [r.candidate["params"]["a"] for r in ranked["k"]] == [2, 3, 1]
    assert ranked["k"][0].latencies_ms == (0.3, 0.25)


def test_bad_in_model_options_are_clear_errors():
    with pytest.raises(ValueError, match="finalists"):
        InModelConfig(finalists=-1)
    with pytest.raises(ValueError, match="margin"):
        InModelConfig(margin=1.5)
    with pytest.raises(TypeError, match="verify"):
        tune(MODEL, example_inputs=INPUTS, trials=8, log="x.jsonl", verify="yes")


def test_the_model_check_reports_the_per_round_ratio_it_decided_on():
    """On a drifting host the medians can disagree with the per-round ratios: the summary
    and the speed-up give the per-round one, which decided."""
    result = InModelResult([], untuned_ms=2.0, tuned_ms=2.7, kept=True, untuned_samples=(1.0, 2.0, 3.0),
                           tuned_samples=(0.9, 3.3, 2.7))
    assert result.paired_ratio == pytest.approx(0.9)
    assert result.speedup == pytest.approx(1 / 0.9)
    assert "(medians; tuned / untuned per round 0.900) -> kept" in result.summary()
    reverted = InModelResult([], untuned_ms=2.0, tuned_ms=2.0, kept=False)
    assert reverted.speedup == 1.0 and reverted.paired_ratio == pytest.approx(1.0)


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_runs_interleave_each_runner_first_once_and_after_every_other_equally_often(count):
    from collections import Counter

    from alt_tvm.bench import run_interleaved

    rounds = count if count % 2 == 0 else 2 * count  # one whole Williams design
    calls = []
    results = run_interleaved(count, rounds=rounds, run=lambda i: calls.append(i) or 10 * i)
    assert results == [[10 * i] * rounds for i in range(count)]  # grouped per runner, in round order
    orders = [calls[r * count:(r + 1) * count] for r in range(rounds)]
    assert all(sorted(order) == list(range(count)) for order in orders)
    assert Counter(order[0] for order in orders) == Counter({i: rounds // count for i in range(count)})
    follows = Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1


def test_timed_rounds_complete_the_design_so_every_runner_follows_every_other_equally_often():
    from collections import Counter

    from alt_tvm.bench import balanced_rounds, time_interleaved

    assert [balanced_rounds(n, 9) for n in (1, 2, 3, 4, 5)] == [9, 10, 12, 12, 10]
    assert balanced_rounds(4, 8) == 8 and balanced_rounds(3, 1) == 6
    with pytest.raises(ValueError, match="balanced_rounds needs count >= 1 and rounds >= 1, got 4, 0"):
        balanced_rounds(4, 0)
    calls = []
    runners = {label: (lambda label=label: calls.append(label), ()) for label in "abcd"}
    times = time_interleaved(runners, rounds=9, repeat=1, warmup=0, pause_s=0.0)
    assert all(len(rounds) == 12 for _, rounds in times.values())
    turns = calls[::2]  # each turn: one untimed call, then the timed one
    follows = Counter(pair for r in range(12) for pair in zip(turns[4 * r:4 * r + 4], turns[4 * r + 1:4 * r + 4]))
    assert len(follows) == 12 and set(follows.values()) == {3}  # 9 rounds: "b" would follow "a" 3 times, others 2


def test_round_order_names_a_bad_count_or_round():
    from alt_tvm.bench import round_order

    for count, index in ((0, 0), (3, -1)):
        with pytest.raises(ValueError, match=f"round_order needs count >= 1 and round_index >= 0, got {count}"):
            round_order(count, index)


def test_a_finalist_at_the_default_point_is_not_timed_again(searched):
    from alt_tvm.in_model import _candidates

    task = searched[1][0]
    default = task.space.params(*task.space.default())
    at_default = TuningRecord(workload_key=task.key, target=TARGET, latencies_ms=(0.5,),
                              candidate={"params": default, "strategy": task.strategy.name})
    choices = _candidates([task], {task.key: [at_default]}, FAST, host(), None, {})
    assert [c.label for c in choices[task.key] if c.strategy == task.strategy.name] == ["default"]


def test_a_candidate_measured_slower_than_the_default_is_no_finalist(searched):
    from alt_tvm.in_model import _candidates

    task = searched[1][0]
    default = task.space.params(*task.space.default())
    logged = rank_candidates(map(TuningRecord.from_json, searched[0].read_text().splitlines()))[task.key]
    others = [r.candidate["params"] for r in logged if r.candidate["params"] != default]

    def record(params, ms):
        return TuningRecord(workload_key=task.key, target=TARGET, latencies_ms=(ms,),
                            candidate={"params": params, "strategy": task.strategy.name})

    ranked = [record(others[0], 0.8), record(default, 1.0), record(others[1], 1.2)]
    config = InModelConfig(finalists=2, alternatives=False)
    choices = _candidates([task], {task.key: ranked}, config, host(), None, {})[task.key]
    assert [(c.label, c.params) for c in choices] == [("default", None), ("tuned#1", others[0])]
    # a log without the default's measurement keeps the finalists as ranked
    choices = _candidates([task], {task.key: [ranked[0], ranked[2]]}, config, host(), None, {})[task.key]
    assert [c.label for c in choices] == ["default", "tuned#1", "tuned#2"]


def test_the_candidates_timed_are_cut_to_the_copies_built_finalists_first(searched):
    from alt_tvm.in_model import _candidates, _copies

    task = searched[1][0]
    default = task.space.params(*task.space.default())
    logged = rank_candidates(map(TuningRecord.from_json, searched[0].read_text().splitlines()))[task.key]
    others = [r.candidate["params"] for r in logged if r.candidate["params"] != default]
    ranked = [TuningRecord(workload_key=task.key, target=TARGET, latencies_ms=(ms,),
                           candidate={"params": params, "strategy": task.strategy.name})
              for params, ms in ((others[0], 0.8), (others[1], 0.9), (default, 1.0))]
    config = InModelConfig(finalists=2, alternatives=True)
    every = _candidates([task], {task.key: ranked}, config, host(), None, {})[task.key]
    assert [c.label for c in every][:3] == ["default", "tuned#1", "tuned#2"]
    assert len(every) > 3, "a convolution has another exact strategy (SConv) to time"
    for copies in (1, 2, 3, len(every) + 1):
        cut = _candidates([task], {task.key: ranked}, config, host(), None, {}, copies=copies)[task.key]
        assert cut == every[:copies]
    assert _copies(InModelConfig(), 3, [task]) == 3
    assert _copies(InModelConfig(), 1, [task]) == 2  # the defaults and one candidate at least
    assert _copies(InModelConfig(copies=4), 1, [task]) == 4
    with pytest.raises(ValueError, match="copies"):
        InModelConfig(copies=0)


def test_a_fused_block_whose_pieces_are_faster_in_the_model_is_built_as_its_pieces(tmp_path):
    from alt_tvm.in_model import _candidates, _copies

    model, x = block_net(), torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(2))
    always = {"alt": {"fuse_blocks": "always"}}
    tasks = extract_tasks(model, example_inputs=[x], strategy_options=always)
    (block,) = [t for t in tasks if t.partition.pieces()]
    assert _copies(InModelConfig(), 2, tasks) == 3  # the defaults, the best finalist, the pieces
    # SConv lowers no block: as the block's alternative it would build partitions of other keys
    assert [c.label for c in _candidates([block], {}, InModelConfig(), host(), None, always)[block.key]] \
        == ["default", "unfused"]

    def profile(built, arrays):  # the pieces together take less than the fused kernel
        report = built.report
        times = {k.name: (0.2 if k.workload in report.unfused else 1.0,)
                 for k in report.kernels if k.kind == "partition"}
        return KernelProfile(times, (sum(t[0] for t in times.values()),))

    log = tmp_path / "log.jsonl"
    log.write_text("")  # no search records: the block's candidates are its defaults and its pieces
    result = decide_in_model(model, tasks, log=log, target=host(), strategy_options=always, example_inputs=[x],
                             config=dataclasses.replace(FAST, alternatives=False), profiler=profile,
                             model_timer=lambda built, arrays: 1.0 if built.report.unfused else 1.5)
    by_key = {d.key: d for d in result.decisions}
    assert result.kept and by_key[block.key].choice.label == "unfused"
    assert by_key[block.key].times_ms["unfused"] == pytest.approx(0.6)  # three kernels, timed as the block
    assert all(d.choice.label == "default" for k, d in by_key.items() if k != block.key)
    decision = [json.loads(line)["candidate"] for line in log.read_text().splitlines()
                if json.loads(line)["workload_key"] == block.key][-1]
    assert decision["fuse"] is False and decision["params"] is None
    assert set(read_log(log).unfused) == {block.key}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = alt_tvm.build(model, example_inputs=[x], strategy_options=always, records=log)
    assert built.report.unfused == {block.key}
    ref = model(x).detach().numpy()
    np.testing.assert_allclose(built(x.numpy())[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_tuning_shares_its_trials_by_each_tasks_time_in_the_untuned_model(tmp_path, monkeypatch):
    """The untuned model is profiled once (here by a fake profiler giving conv ``b`` 9x the time of
    conv ``a``) and each task's share of the trials follows its time, not its occurrences."""
    import alt_tvm.integration as integration
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.in_model import untuned_times
    from alt_tvm.options import BuildOptions

    tasks = extract_tasks(MODEL, example_inputs=INPUTS)
    assert len(tasks) == 2 and [t.weight for t in tasks] == [1, 1]
    kernels = quiet_build(priors=None).report.timed_kernels

    def profiler(model, arrays):
        ms = {k.name: (0.0 if k.kind == "conversion" else 9.0 if k.workload == tasks[1].key else 1.0,) for k in kernels}
        return KernelProfile(ms, (10.0,),
                             calls={k.name: 1 for k in kernels})

    times = untuned_times(load_model(MODEL, example_inputs=INPUTS).mod, tasks, BuildOptions(priors=None),
                          example_inputs=INPUTS, profiler=profiler)
    assert times == {tasks[0].key: 1.0, tasks[1].key: 9.0}

    def run(**options):
        outcome = tune(MODEL, example_inputs=INPUTS, trials=20, log=tmp_path / f"{len(options)}.jsonl",
                       measure=fake_measure, cost_model=None, features="knobs", progress=False, revalidate=0,
                       **options)
        return [s.trials for s in outcome]

    monkeypatch.setattr(integration, "untuned_times", lambda mod, tasks, *a, **k: times)
    monkeypatch.setattr(integration, "decide_in_model", lambda *a, **k: None)
    assert run() == [2, 18]
    assert run(shares="occurrences") == [10, 10]
