"""Task scheduling: static shares, the gradient scheduler, several tasks in flight."""

import functools
import math
import time

import pytest
import torch
from test_fleet import points, small_task

from alt_tvm.integration import extract_tasks
from alt_tvm.records import load_records
from alt_tvm.tuning.driver import split_budget, tune_tasks
from alt_tvm.tuning.fleet import PipelinedMeasure
from alt_tvm.tuning.measure.simulated import SleepBuilder, SleepRunner
from alt_tvm.tuning.scheduler import GradientScheduler, StaticScheduler, TaskProgress, make_scheduler


@functools.cache
def two_tasks():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
    tasks = extract_tasks(model, example_inputs=(torch.randn(1, 8, 12, 12),))
    assert len(tasks) == 2
    return tasks


def scaled_measure(scale):
    """Latency = the task's scale x a deterministic function of the candidate (bookkeeping only)."""
    def measure(task, params):
        reg = params.get("reg", params.get("mt", 1))
        tile = params.get("ot", params.get("nt", 1))
        return scale[task.key] * (1.0 + 1.0 / reg + 4.0 / tile)
    return measure


# ------------------------------------------------------------------ the schedulers alone


def test_gradient_scheduler_warms_every_task_up_in_order_then_follows_the_expected_gain():
    policy = GradientScheduler(round_trials=8)
    tasks = [TaskProgress(weight=1, share=20), TaskProgress(weight=1, share=3), TaskProgress(weight=1, share=20)]
    assert policy.pick(tasks, set(), left=43) == (0, 8)
    assert policy.pick(tasks, {0}, left=35) == (1, 3)  # a first round is never bigger than the share
    tasks[0].best_ms, tasks[1].best_ms, tasks[2].best_ms = [10.0], [1.0], [2.0]
    assert policy.pick(tasks, set(), left=30)[0] == 0  # the slowest task moves the model most
    tasks[1].weight = 20  # ... unless another occurs 20 times
    assert policy.pick(tasks, set(), left=30)[0] == 1
    tasks[1].best_ms = [math.inf]  # every candidate failed: last
    assert policy.pick(tasks, {0}, left=30)[0] == 2
    assert policy.pick(tasks, set(), left=5) == (0, 5)  # never more than the budget left
    assert policy.pick(tasks, set(), left=0) is None


def test_gradient_priority_rewards_recent_improvement():
    policy = GradientScheduler(alpha=1.0, window=2)
    flat = TaskProgress(weight=1, share=8, best_ms=[5.0, 5.0, 5.0])
    improving = TaskProgress(weight=1, share=8, best_ms=[5.0, 4.0, 3.0])
    assert policy.priority(improving) == pytest.approx(1.0) and policy.priority(flat) == 0.0


def test_static_scheduler_spends_each_share_in_order():
    policy = StaticScheduler()
    tasks = [TaskProgress(weight=2, share=6, used=6), TaskProgress(weight=1, share=4)]
    assert policy.final(tasks[0]) and not policy.final(tasks[1])
    assert policy.pick(tasks, set(), left=0) == (1, 4)
    assert policy.pick(tasks, {1}, left=0) is None


@pytest.mark.parametrize("bad", [dict(round_trials=0), dict(alpha=1.5), dict(window=0)])
def test_bad_gradient_settings_are_refused(bad):
    with pytest.raises(ValueError, match="must be"):
        GradientScheduler(**bad)


def test_unknown_scheduler_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="'static' or 'gradient', got 'fifo'"):
        make_scheduler("fifo", round_trials=8)
    with pytest.raises(ValueError, match="in_flight must be an int >= 1"):
        tune_tasks(two_tasks(), trials=8, log=tmp_path / "x.jsonl", in_flight=0)


# ------------------------------------------------------------------ in the driver


def test_gradient_scheduling_gives_the_slow_task_more_than_its_share(tmp_path):
    first, second = two_tasks()
    scale = {first.key: 0.05, second.key: 5.0}
    log = tmp_path / "gradient.jsonl"
    summaries = tune_tasks([first, second], trials=48, log=log, measure=scaled_measure(scale), progress=False,
                           cost_model=None, features="knobs", top_k=4, batch=16, revalidate=0,
                           scheduler="gradient")
    counts = {s.key: s.trials for s in summaries}
    static = dict(zip((first.key, second.key), split_budget([first, second], 48)))
    assert sum(counts.values()) == 48
    assert counts[second.key] > static[second.key] and counts[first.key] >= 4  # it had its first round
    assert len(load_records(log)) == 48


def test_two_tasks_in_flight_overlap_their_batches_and_log_everything(tmp_path):
    tasks = two_tasks()
    walls = {}
    for in_flight in (1, 2):
        log = tmp_path / f"flight{in_flight}.jsonl"
        # one simulated board per task in flight, so the comparison is of the overlap alone
        with PipelinedMeasure(builder=SleepBuilder(0.05), runner=SleepRunner(boards=2, run_s=0.05),
                              build_workers=2, boards=2) as measure:
            start = time.perf_counter()
            summaries = tune_tasks(tasks, trials=32, log=log, measure=measure, progress=False, cost_model=None,
                                   features="knobs", top_k=1, batch=8, revalidate=0, in_flight=in_flight)
            walls[in_flight] = time.perf_counter() - start
        records = load_records(log)
        assert [s.trials for s in summaries] == split_budget(tasks, 32)
        assert len(records) == 32 and {r.workload_key for r in records} == {t.key for t in tasks}
    # top_k=1: one candidate at a time per task, so only a second task in flight keeps two boards busy
    assert walls[2] < 0.75 * walls[1], walls


def test_without_overlap_no_run_starts_before_the_whole_batch_is_built():
    task = small_task()
    builder = SleepBuilder(0.1)
    with PipelinedMeasure(builder=builder, runner=SleepRunner(boards=1, run_s=0.01), build_workers=2,
                          overlap=False) as measure:
        start = time.perf_counter()
        first = next(iter(measure.measure_batch(task, points(task, 4))))
        # 4 builds on 2 workers: 0.2 s before any run
        assert time.perf_counter() - start >= 0.19 and first[1].ok
