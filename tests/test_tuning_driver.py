"""Whole-model tuning: records written per measurement, resume, budget split, applying a log."""

import json

import numpy as np
import pytest
import torch

import alt_tvm
from alt_tvm.integration import tune
from alt_tvm.records import best_params, load_records
from alt_tvm.tuning.driver import split_budget


class TwoConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.b(torch.relu(self.a(x))))
        return self.fc(y.mean((2, 3)))


MODEL, INPUTS = TwoConvs().eval(), (torch.rand(1, 8, 12, 12),)


def fake_measure(calls):
    def measure(task, params):
        calls.append(params)
        # Larger register blocks and channel tiles are "faster": deterministic and cheap.
        reg = params.get("reg", params.get("mt", 1))
        tile = params.get("ot", params.get("nt", 1))
        return 1.0 + 1.0 / reg + 4.0 / tile
    return measure


def test_every_measurement_is_logged_and_resume_measures_nothing_twice(tmp_path):
    log = tmp_path / "tune.jsonl"
    calls = []
    summaries = tune(MODEL, verify=False, trials=12, log=log, example_inputs=INPUTS, measure=fake_measure(calls),
                     cost_model=None, progress=False)
    records = load_records(log)
    assert len(records) == len(calls) == 12
    assert {r.workload_key for r in records} == {s.key for s in summaries}
    assert all({"layout", "loop", "params"} <= set(r.candidate) for r in records)
    assert all(s.best_ms <= s.default_ms for s in summaries)
    again = []
    tune(MODEL, verify=False, trials=12, log=log, example_inputs=INPUTS, measure=fake_measure(again), cost_model=None,
         progress=False, resume=True)
    assert again == []  # every point of the same seed is already in the log
    assert len(load_records(log)) == 12


def test_build_applies_the_best_record_of_each_workload(tmp_path):
    log = tmp_path / "tune.jsonl"
    tune(MODEL, verify=False, trials=12, log=log, example_inputs=INPUTS, measure=fake_measure([]), cost_model=None,
         progress=False)
    best = best_params(log)
    partitions = [key for key in best if "|in_layout=" not in key]
    assert len(partitions) == 3  # two convs and the linear layer (besides operator kernels: the mean)
    compiled = alt_tvm.build(MODEL, example_inputs=INPUTS, records=str(log))
    assert compiled.report.tuned == 3
    with torch.no_grad():
        np.testing.assert_allclose(compiled(INPUTS[0].numpy())[0], MODEL(*INPUTS).numpy(), rtol=1e-4, atol=1e-4)


def test_corrupt_log_lines_are_skipped_with_a_warning(tmp_path):
    log = tmp_path / "tune.jsonl"
    tune(MODEL, verify=False, trials=6, log=log, example_inputs=INPUTS, measure=fake_measure([]), cost_model=None,
         progress=False)
    lines = log.read_text().splitlines()
    lines.insert(2, '{"schema_version": 2, "workload_key": "x", truncated')
    log.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"tune.jsonl:3: skipped corrupt"):
        best = best_params(log)
    assert len(best) == 3


def test_budget_split_and_bad_budget():
    class T:
        def __init__(self, weight, time_ms=None):
            self.weight, self.time_ms = weight, time_ms

    assert split_budget([T(2), T(1), T(1)], 20) == [10, 5, 5]
    assert sum(split_budget([T(1)] * 3, 7)) == 7
    # The least budget allowed, with one heavy task: every task still gets its 2 (the floor
    # of 2 for the light ones once overspent the budget and left the first task -1).
    tight = split_budget([T(1)] + [T(1)] * 14 + [T(30)], 32)
    assert sum(tight) == 32 and min(tight) == 2
    with pytest.raises(ValueError, match="trials=3 is too small for 3 tasks"):
        split_budget([T(1)] * 3, 3)
    assert json.dumps(split_budget([T(5), T(1)], 12))


def test_the_budget_follows_the_tasks_time_in_the_untuned_model_where_every_task_has_one():
    class T:
        def __init__(self, weight, time_ms=None):
            self.weight, self.time_ms = weight, time_ms

    # A kernel taking 80% of the model's time, occurring once, beside three that occur 3 times.
    assert split_budget([T(3, 1.0), T(3, 1.0), T(1, 8.0), T(3, 0.0)], 40) == [4, 4, 30, 2]
    assert split_budget([T(3), T(3), T(1), T(3)], 40) == [12, 12, 4, 12]  # by occurrences
    # One task not profiled (or all at zero): by occurrences.
    assert split_budget([T(3, 1.0), T(1, None)], 40) == split_budget([T(3), T(1)], 40)
    assert split_budget([T(3, 0.0), T(1, 0.0)], 40) == split_budget([T(3), T(1)], 40)


def test_tuning_through_isolated_workers_writes_real_latencies(tmp_path):
    from alt_tvm.target import host
    from alt_tvm.tuning.remote import isolated_measure

    log = tmp_path / "tune.jsonl"
    measure = isolated_measure(target=host(), number=3, repeat=2)
    tune(MODEL, verify=False, trials=6, log=log, example_inputs=INPUTS, measure=measure, cost_model=None,
         progress=False)
    records = load_records(log)
    assert len(records) == 6 and all(r.ok and 0 < r.median_ms < 100 for r in records)


def test_unreachable_tracker_fails_before_tuning_starts():
    import socket

    from alt_tvm.target import host
    from alt_tvm.tuning.remote import rpc_measure

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody listens there
    with pytest.raises(ConnectionError, match=f"cannot reach tracker 127.0.0.1:{port}"):
        rpc_measure(tracker_host="127.0.0.1", tracker_port=port, key="board", target=host())


def test_the_cost_model_ranks_candidates_by_features_of_their_lowered_tir(tmp_path):
    from alt_tvm.tuning.cost_model import XGBCostModel
    from alt_tvm.tuning.features import feature_names

    class Spy(XGBCostModel):
        widths = set()

        def update(self, features, latencies):
            self.widths.add(features.shape[1])
            super().update(features, latencies)

    log = tmp_path / "tune.jsonl"
    tune(MODEL, verify=False, trials=24, log=log, example_inputs=INPUTS, measure=fake_measure([]),
         cost_model=Spy(seed=0),
         progress=False, batch=16)
    assert Spy.widths == {len(feature_names())}
    with pytest.raises(ValueError, match="features must be 'tir' or 'knobs'"):
        tune(MODEL, verify=False, trials=24, log=log, example_inputs=INPUTS, measure=fake_measure([]), features="ast")


def test_revalidation_picks_the_consistently_fast_candidate_over_a_lucky_draw(tmp_path):
    log = tmp_path / "tune.jsonl"
    calls, seen = [], {}

    def noisy(task, params):
        # The true latency is fake_measure's; the first measurement of the first candidate
        # of each task is a lucky draw at a tenth of it, later ones are honest.
        calls.append(params)
        true = fake_measure([])(task, params)
        first = task.key not in seen
        seen.setdefault(task.key, params)
        return true / 10 if first else true

    # (No operator kernels: a space smaller than its share would end early, off the 48.)
    summaries = tune(MODEL, verify=False, trials=48, log=log, example_inputs=INPUTS, measure=noisy, cost_model=None,
                     progress=False, revalidate=2, revalidate_rounds=2, operators=False)
    records = load_records(log)
    assert len(records) == len(calls) == 48  # re-validation counts towards the budget
    again = [r for r in records if r.candidate.get("revalidation")]
    assert again and all(r.ok for r in again)
    best = best_params(log)
    true = fake_measure([])
    for summary in summaries:
        lucky = seen[summary.key]
        mine = [r for r in records if r.workload_key == summary.key]
        # Without re-validation the lucky draw would win: it is the lowest single measurement.
        assert min(r.median_ms for r in mine) == pytest.approx(true(None, lucky) / 10)
        finalists = [r.candidate["params"] for r in mine if r.candidate.get("revalidation")]
        fastest = min(true(None, p) for p in finalists)
        assert true(None, best[summary.key]) == pytest.approx(fastest)
        assert summary.best_ms == pytest.approx(fastest)
        if true(None, lucky) > fastest:
            assert best[summary.key] != lucky
    # Resuming measures nothing again, re-validation included.
    more = []
    tune(MODEL, verify=False, trials=48, log=log, example_inputs=INPUTS, measure=lambda t, p: more.append(p) or 1.0,
         cost_model=None, progress=False, revalidate=2, revalidate_rounds=2, operators=False)
    assert more == []
    with pytest.raises(ValueError, match="revalidate"):
        tune(MODEL, verify=False, trials=48, log=log, example_inputs=INPUTS, revalidate=-1)


def test_tir_features_are_missing_for_a_candidate_that_does_not_lower_or_that_the_extractor_cannot_read(
        monkeypatch):
    from conftest import build_messages

    from alt_tvm.integration import extract_tasks
    from alt_tvm.tuning import features
    from alt_tvm.tuning.driver import tir_featurizer

    torch.manual_seed(0)
    model, x = torch.nn.Linear(64, 32).eval(), torch.randn(1, 8, 64)
    (task,) = extract_tasks(model, example_inputs=(x,))
    layout, loop = task.space.default()
    featurize = tir_featurizer(task)
    good = featurize(task.space.decode(layout, loop))
    assert np.isfinite(good).all()
    bad = featurize({**task.space.decode(layout, loop), "nt": 7})  # 7 does not divide N = 32: no lowering
    assert bad.shape == good.shape and np.isnan(bad).all()

    def broken(func, **kwargs):
        raise TypeError("an expression the extractor does not know")

    monkeypatch.setattr(features, "extract_features", broken)
    with build_messages() as messages:
        other = tir_featurizer(task)(task.space.decode(layout, loop))
    assert np.isnan(other).all()
    assert any("no TIR features" in m and "an expression the extractor does not know" in m for m in messages)
