"""Batched, pipelined measurement: builds in parallel, every board busy, results streamed into the log.

The bookkeeping tests use a builder and runner that only sleep (nothing is timed there); the
loopback tests run a real tracker with three real RPC servers and real kernels.
"""

from __future__ import annotations

import functools
import math
import re
import time

import pytest
import torch

from alt_tvm.integration import extract_tasks
from alt_tvm.records import candidate_key, load_records
from alt_tvm.rpc import count_servers
from alt_tvm.tuning.driver import tune_tasks
from alt_tvm.tuning.fleet import Attempt, PipelinedMeasure
from alt_tvm.tuning.measure.simulated import SleepBuilder, SleepRunner


@functools.cache
def small_task():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU()).eval()
    # The direct template's space on every target (8 channels fill AVX2's vectors, and its
    # Winograd choice would change the search's first points).
    (task,) = extract_tasks(model, example_inputs=(torch.randn(1, 8, 12, 12),),
                            strategy_options={"alt": {"winograd": False}})
    return task


def points(task, count):
    layout, loop = task.space.default()
    import numpy as np

    rng = np.random.default_rng(0)
    found = []
    while len(found) < count:
        candidate = task.space.random_loop(layout, rng)
        if task.space.check(layout, candidate) is None:
            params = task.space.params(layout, candidate)
            if params not in found:
                found.append(params)
    return found


def test_a_batch_builds_in_parallel_runs_on_every_board_and_streams_each_result_once():
    task = small_task()
    builder, runner = SleepBuilder(0.2), SleepRunner(boards=3, run_s=0.3)
    with PipelinedMeasure(builder=builder, runner=runner, build_workers=3, boards=3) as measure:
        start = time.perf_counter()
        seen = [(i, time.perf_counter() - start) for i, _ in measure.measure_batch(task, points(task, 6))]
        wall = time.perf_counter() - start
    assert sorted(i for i, _ in seen) == list(range(6))
    assert builder.most == 3
    assert set(measure.stats.ran) == {"sim:0", "sim:1", "sim:2"} and sum(measure.stats.ran.values()) == 6
    # one at a time: 6 x (0.2 + 0.3) = 3.0 s; pipelined on 3 workers and 3 boards: ~0.2 + 2 x 0.3
    assert wall < 1.5, wall
    assert seen[0][1] < wall - 0.2  # streamed: the first result came before the batch was over


def test_a_lost_board_costs_only_its_candidate_which_is_measured_again_elsewhere():
    task = small_task()
    runner = SleepRunner(boards=3, run_s=0.05, lose=(1,))
    with PipelinedMeasure(builder=SleepBuilder(0.01), runner=runner, build_workers=2, boards=3) as measure:
        outcomes = dict(measure.measure_batch(task, points(task, 6)))
    assert all(o.ok for o in outcomes.values())
    retried = [o for o in outcomes.values() if o.retried]
    assert len(retried) == 1
    (attempt,) = retried[0].retried
    assert attempt == Attempt("RPC_ERROR", "remote: connection lost", attempt.board, attempt.build_s, 0.0)
    assert sum(measure.stats.failed.values()) == 1 and sum(measure.stats.ran.values()) == 6


def test_a_board_lost_twice_gives_a_transient_failure_and_no_more_retries():
    task = small_task()
    runner = SleepRunner(boards=1, run_s=0.01, lose=(0, 1))
    with PipelinedMeasure(builder=SleepBuilder(0.0), runner=runner, retries=1) as measure:
        ((_, outcome),) = list(measure.measure_batch(task, points(task, 1)))
        assert outcome.error_code == "RPC_ERROR" and len(outcome.retried) == 1
        assert runner.started == 2
        assert measure(task, points(task, 1)[0]) > 0  # the third run is not lost


def test_expected_wall_time_follows_the_slower_stage():
    task = small_task()
    with PipelinedMeasure(builder=SleepBuilder(0.04), runner=SleepRunner(2, 0.1), build_workers=4,
                          boards=2) as measure:
        assert measure.expected_wall_s(100) is None  # nothing measured yet
        list(measure.measure_batch(task, points(task, 4)))
        # runs: 0.1 s on 2 boards = 0.05 s per trial; builds: 0.04 s on 4 workers = 0.01
        assert measure.expected_wall_s(100) == pytest.approx(5.0, rel=0.3)
        assert "sim:0: " in measure.board_report() and " timed, 0 lost" in measure.board_report()


@pytest.mark.parametrize("bad", [dict(build_workers=0), dict(boards=0), dict(retries=-1), dict(boards=True)])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="must be an int >="):
        PipelinedMeasure(builder=SleepBuilder(0), runner=SleepRunner(1, 0), **bad)


def test_the_tuner_measures_each_round_as_one_batch_and_logs_boards_and_lost_attempts(tmp_path):
    task = small_task()
    log = tmp_path / "fleet.jsonl"
    batches = []

    class Spy(PipelinedMeasure):
        def measure_batch(self, task, batch):
            batches.append(len(batch))
            yield from super().measure_batch(task, batch)

    runner = SleepRunner(boards=3, run_s=0.01, lose=(4,))
    with Spy(builder=SleepBuilder(0.0), runner=runner, build_workers=2, boards=3) as measure:
        (summary,) = tune_tasks([task], trials=20, log=log, measure=measure, progress=False, top_k=6,
                                batch=32, revalidate=0, features="knobs", cost_model=None)
    records = load_records(log)
    assert max(batches) == 6  # top_k candidates per batch
    final = [r for r in records if r.ok]
    lost = [r for r in records if r.error_code == "RPC_ERROR"]
    assert summary.trials == len(final) == 20 and len(lost) == 1
    assert {r.board for r in final} == {"sim:0", "sim:1", "sim:2"}
    # the lost attempt and the final measurement are of the same candidate
    assert any(r.candidate == lost[0].candidate for r in final)


class _Overlapping(PipelinedMeasure):
    """Counts the batches out at once and the candidates asked for."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.out = self.most = 0
        self.asked = []

    def measure_batch(self, task, batch):
        self.asked.extend(batch)
        self.out += 1
        self.most = max(self.most, self.out)
        try:
            yield from super().measure_batch(task, batch)
        finally:
            self.out -= 1


def _interrupt_then_resume(task, interrupted, options, *, boards, run_s):
    """Tune with ``interrupted`` (a PipelinedMeasure class that raises KeyboardInterrupt) then resume.

    Returns the log's records before and after the resume, and what the resumed run asked for.
    """
    sizes = dict(build_workers=boards, boards=boards)
    with interrupted(builder=SleepBuilder(0.0), runner=SleepRunner(boards, run_s), **sizes) as measure:
        with pytest.raises(KeyboardInterrupt):
            tune_tasks([task], measure=measure, **options)
    before = load_records(options["log"])
    with _Overlapping(builder=SleepBuilder(0.0), runner=SleepRunner(boards, run_s), **sizes) as measure:
        (summary,) = tune_tasks([task], measure=measure, resume=True, **options)
    after = load_records(options["log"])
    assert summary.trials == len(after) == options["trials"]
    assert len({candidate_key(r.candidate) for r in after}) == len(after)  # nothing measured twice
    return before, after, measure.asked


def test_a_batch_interrupted_half_way_resumes_with_the_other_half(tmp_path):
    task = small_task()
    log = tmp_path / "half.jsonl"
    options = dict(trials=20, log=log, progress=False, top_k=6, batch=32, revalidate=0, features="knobs",
                   cost_model=None)

    class Interrupted(PipelinedMeasure):
        """The second batch of six is interrupted after three results."""

        batches = 0

        def measure_batch(self, task, batch):
            if len(batch) == 6:
                Interrupted.batches += 1
            for n, item in enumerate(super().measure_batch(task, batch)):
                if Interrupted.batches == 2 and n == 3:
                    raise KeyboardInterrupt
                yield item

    before, _, asked = _interrupt_then_resume(task, Interrupted, options, boards=3, run_s=0.01)
    assert len(before) == 1 + 5 + 6 + 3  # default, first layout (its start point + 4), a batch, half a batch
    assert len(asked) == 20 - len(before)  # only what the log did not hold


def test_with_lookahead_the_next_batch_builds_while_this_one_runs_and_the_log_is_exact(tmp_path):
    task = small_task()
    walls, most = {}, {}
    for lookahead in (0, 1):
        log = tmp_path / f"ahead{lookahead}.jsonl"
        # builds as slow as runs and one batch filling the boards: without lookahead they alternate
        with _Overlapping(builder=SleepBuilder(0.1), runner=SleepRunner(boards=4, run_s=0.1), build_workers=4,
                          boards=4) as measure:
            start = time.perf_counter()
            (summary,) = tune_tasks([task], trials=41, log=log, measure=measure, progress=False, top_k=4, batch=32,
                                    revalidate=0, features="knobs", cost_model=None, lookahead=lookahead)
            walls[lookahead], most[lookahead] = time.perf_counter() - start, measure.most
        records = load_records(log)
        assert summary.trials == len(records) == 41
        assert len({candidate_key(r.candidate) for r in records}) == 41  # no point sent twice
        assert len(measure.asked) == 41
    assert most == {0: 1, 1: 2}
    assert walls[1] < 0.8 * walls[0], walls


def test_a_run_with_lookahead_interrupted_resumes_to_an_exact_log(tmp_path):
    task = small_task()
    log = tmp_path / "ahead.jsonl"
    options = dict(trials=30, log=log, progress=False, top_k=4, batch=32, revalidate=0, features="knobs",
                   cost_model=None, lookahead=1)

    class Interrupted(PipelinedMeasure):
        """Interrupted at the 15th result, with two batches out."""

        results = 0

        def measure_batch(self, task, batch):
            for item in super().measure_batch(task, batch):
                Interrupted.results += 1
                if Interrupted.results == 15:
                    raise KeyboardInterrupt
                yield item

    before, _, asked = _interrupt_then_resume(task, Interrupted, options, boards=4, run_s=0.02)
    assert 10 <= len(before) <= 14  # the other batch's finished results are logged too
    assert len(asked) == 30 - len(before)  # only what the log did not hold


@pytest.mark.parametrize("options, match", [
    (dict(lookahead=1), "lookahead=1 needs a batched measure"),
    (dict(lookahead=-1), "lookahead must be an int >= 0"),
    (dict(in_flight=2), "in_flight=2 needs a measure that runs elsewhere"),
])
def test_running_ahead_or_several_tasks_at_once_needs_a_measure_elsewhere(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        tune_tasks([small_task()], trials=8, log=tmp_path / "x.jsonl", progress=False, **options)


# ------------------------------------------------------------------------------ loopback


@pytest.fixture(scope="module")
def three_servers():
    """One tracker with three servers for the module (starting them takes ~25 s): the test that
    kills a server comes last."""
    from rpc_loopback import start_loopback

    try:
        loop = start_loopback(servers=3, server_threads=1)
    except RuntimeError as err:
        pytest.fail(str(err))
    try:
        deadline = time.monotonic() + 90
        while count_servers(loop.host, loop.port, loop.key) < 3:
            if time.monotonic() > deadline:
                pytest.fail("three RPC servers did not register within 90 s")
            time.sleep(0.5)
        yield loop
    finally:
        loop.close()


def test_the_cli_tunes_on_every_board_reports_each_and_sizes_the_rest(three_servers, tmp_path, capsys):
    from alt_tvm.cli import main

    loop = three_servers
    log = tmp_path / "cli.jsonl"
    status = main(["tune", "small_cnn", "--trials", "18", "--log", str(log), "--tracker", f"{loop.host}:{loop.port}",
                   "--key", loop.key, "--build-workers", "2", "--revalidate", "0", "--features", "knobs",
                   "--no-verify"])
    out = capsys.readouterr().out
    assert status == 0, out
    records = load_records(log)
    assert len(records) == 18
    ran = {b: sum(r.board == b for r in records) for b in loop.boards}
    assert all(ran.values()), ran  # every server ran candidates
    for board, count in ran.items():
        assert f"{board}: {count} timed, 0 lost" in out
    assert "candidates per board (3 at once, 2 build workers):" in out
    assert re.search(r"\d+ trials left: about \d+\.\d min", out), out
    assert pending_requests(loop) == 0


def test_three_boards_behind_one_tracker_each_run_candidates_and_a_killed_one_costs_only_its_own(
        three_servers, tmp_path):
    from rpc_loopback import kill_group

    from alt_tvm.tuning.remote import rpc_measure

    loop = three_servers
    task = small_task()
    log = tmp_path / "fleet.jsonl"
    seen = []  # sizes of the batches of six so far

    class KillMidBatch(PipelinedMeasure):
        """At the second result of the second batch of six, the first server dies (its run, if any, is lost)."""

        def measure_batch(self, task, batch):
            if len(batch) == 6:
                seen.append(len(batch))
            for n, item in enumerate(super().measure_batch(task, batch)):
                if len(seen) == 2 and n == 1 and not killed:
                    kill_group(loop.servers[0])
                    killed.append(time.time())
                yield item

    killed = []
    measure = rpc_measure(tracker_host=loop.host, tracker_port=loop.port, key=loop.key, target=task.target,
                          number=2, repeat=1, timeout_s=30, build_workers=2)
    assert measure.boards == 3
    with measure, KillMidBatch(builder=measure.builder, runner=measure.runner, build_workers=2,
                               boards=3) as killing:
        (summary,) = tune_tasks([task], trials=24, log=log, measure=killing, progress=False, top_k=6, batch=32,
                                revalidate=0, features="knobs")
    records = load_records(log)
    final = [r for r in records if r.ok]
    assert killed, "the search never measured two batches of six"
    assert summary.trials == 24 and len(final) == 24 and summary.pending == 0
    assert {r.board for r in final} == set(loop.boards)  # every server ran candidates
    dead = loop.boards[0]
    lost = [r for r in records if not r.ok]
    assert len(lost) <= 1  # at most the one run that was on the killed server
    assert all(r.error_code == "RPC_ERROR" and r.board in (dead, "") for r in lost)
    assert not [r for r in final if r.board == dead and r.timestamp > killed[0] + 0.5]
    assert all(math.isfinite(r.median_ms) for r in final)
    assert pending_requests(loop) == 0  # no orphaned request left in the tracker's queue


def pending_requests(loop):
    """Session requests the tracker still queues for the loopback's key."""
    import tvm.rpc

    queue = tvm.rpc.connect_tracker(loop.host, loop.port).summary()["queue_info"]
    return queue.get(loop.key, {}).get("pending", 0)
