"""Tuning logs: round trip, crash safety, resume, best record, bad lines skipped with warnings."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import signal
import time
import warnings
from pathlib import Path

import pytest

from alt_tvm.records import (
    SCHEMA_VERSION,
    RecordWarning,
    RecordWriter,
    TuningRecord,
    candidate_key,
    finished_candidates,
    load_best,
    load_records,
)

TARGET = '{"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"rocketlake"}'


def _record(trial: int, *, latencies=(1.0,), workload: str = "conv2d_1x3x32x32", error: str | None = None,
            candidate: dict | None = None, target: str = TARGET) -> TuningRecord:
    # tvm_version given explicitly: the spawned writer below need not import TVM.
    return TuningRecord(
        workload_key=workload,
        target=target,
        candidate=candidate if candidate is not None else {"layout": {"ht": trial}, "loop": {"unroll": 4}},
        latencies_ms=() if error else latencies,
        error_code=error,
        error_msg="boom" if error else "",
        build_s=0.5,
        run_s=0.25,
        trial=trial,
        seed=7,
        tvm_version="0.27.0.post1",
    )


def test_round_trip_keeps_every_field(tmp_path):
    log = tmp_path / "log.jsonl"
    records = [_record(0, latencies=(1.5, 1.25, 1.75)), _record(1, error="BUILD_ERROR"), _record(2)]
    with RecordWriter(log) as writer:
        for record in records:
            writer.write(record)
    assert writer.closed
    assert load_records(log) == records
    assert load_records(log, workload_key="other") == []
    line = json.loads(log.read_text().splitlines()[1])
    assert line["error"] == {"code": "BUILD_ERROR", "message": "boom"}
    assert line["schema_version"] == SCHEMA_VERSION and line["latencies_ms"] == []
    assert records[0].median_ms == 1.5 and math.isinf(records[1].median_ms) and not records[1].ok


def test_default_tvm_version_is_the_installed_one():
    import tvm

    record = TuningRecord(workload_key="w", target=TARGET, candidate={}, latencies_ms=[1.0])
    assert record.tvm_version == tvm.__version__ and record.timestamp > 0


def test_corrupt_line_in_the_middle_is_skipped_with_its_line_number(tmp_path):
    log = tmp_path / "log.jsonl"
    with RecordWriter(log) as writer:
        writer.write(_record(0))
    with open(log, "a") as f:
        f.write('{"schema_version": 2, "workload_key": "conv2d_1x3x32x32", "cand\n')  # cut short
        f.write("\n")  # blank lines are ignored silently
        f.write('{"schema_version": 2, "trial": 3}\n')  # valid JSON, missing fields
    with RecordWriter(log) as writer:
        writer.write(_record(1))
    with pytest.warns(RecordWarning) as caught:
        records = load_records(log)
    assert [r.trial for r in records] == [0, 1]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert messages[0].startswith(f"{log}:2: skipped corrupt or truncated record")
    assert messages[1].startswith(f"{log}:4: skipped corrupt or truncated record") and "missing" in messages[1]


def test_unknown_schema_version_is_skipped_with_a_warning(tmp_path):
    log = tmp_path / "log.jsonl"
    future = _record(5).to_dict() | {"schema_version": 99}
    log.write_text(json.dumps(future) + "\n" + _record(6).to_json() + "\n")
    expected = rf"{log}:1: skipped schema version 99 \(this alt-tvm reads version 2 or {SCHEMA_VERSION}\)"
    with pytest.warns(RecordWarning, match=expected):
        records = load_records(log)
    assert [r.trial for r in records] == [6]


def test_missing_log_is_a_clear_error_for_readers_and_empty_for_resume(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"tuning log .*nope.jsonl does not exist"):
        load_records(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_best(missing, workload_key="w")
    assert finished_candidates(missing, "w") == set()
    with pytest.raises(FileNotFoundError, match="directory .* does not exist"):
        RecordWriter(tmp_path / "no_dir" / "log.jsonl")


def test_best_is_the_lowest_median_success(tmp_path):
    log = tmp_path / "log.jsonl"
    other_target = '{"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"cortex-a76"}'
    with RecordWriter(log) as writer:
        writer.write(_record(0, latencies=(3.0, 3.0, 3.0)))
        writer.write(_record(1, latencies=(0.1, 5.0, 5.0)))  # lowest min, but median 5.0
        writer.write(_record(2, latencies=(2.0, 2.5, 1.9)))  # median 2.0: the best
        writer.write(_record(3, error="RUN_ERROR"))
        writer.write(_record(4, latencies=(2.0,)))  # tie: the earlier record wins
        writer.write(_record(5, latencies=(0.5,), workload="dense_64"))
        writer.write(_record(6, latencies=(0.5,), target=other_target))
    assert load_best(log, workload_key="conv2d_1x3x32x32", target=TARGET).trial == 2
    assert load_best(log, workload_key="conv2d_1x3x32x32").trial == 6
    assert load_best(log, workload_key="dense_64").trial == 5
    assert load_best(log, workload_key="unknown") is None
    with RecordWriter(log) as writer:
        writer.write(_record(7, workload="failing", error="BUILD_TIMEOUT"))
    assert load_best(log, workload_key="failing") is None


def test_resume_skips_finished_candidates_whatever_their_key_order(tmp_path):
    log = tmp_path / "log.jsonl"
    a = {"layout": {"ht": 4, "wt": 16}, "loop": {"tile": [8, 4]}}
    b = {"layout": {"ht": 2, "wt": 8}, "loop": {"tile": [4, 4]}}
    with RecordWriter(log) as writer:
        writer.write(_record(0, candidate=a))
        writer.write(_record(1, candidate=b, error="BUILD_ERROR"))  # failed ones are finished too
        writer.write(_record(2, candidate={"layout": {}, "loop": {}}, workload="dense_64"))
    done = finished_candidates(log, "conv2d_1x3x32x32")
    assert done == {candidate_key(a), candidate_key(b)}
    reordered = {"loop": {"tile": [8, 4]}, "layout": {"wt": 16, "ht": 4}}
    assert candidate_key(reordered) in done
    # A resumed run appends to the same file; both runs' records are there once each.
    todo = [a, b, {"layout": {"ht": 1, "wt": 1}, "loop": {"tile": [1, 1]}}]
    with RecordWriter(log) as writer:
        for trial, cand in enumerate(todo, start=3):
            if candidate_key(cand) not in done:
                writer.write(_record(trial, candidate=cand))
    assert [r.trial for r in load_records(log, workload_key="conv2d_1x3x32x32")] == [0, 1, 5]


def _write_forever(path: str, ready: str) -> None:
    """Child process: append records as fast as it can until killed."""
    payload = {"layout": {"seq": list(range(200))}, "loop": {"note": "x" * 2000}}
    Path(ready).touch()
    with RecordWriter(path) as writer:
        for trial in range(1_000_000):
            writer.write(_record(trial, candidate=payload | {"trial": trial}))


def test_killed_writer_loses_no_finished_record_and_resume_appends_cleanly(tmp_path):
    log, ready = tmp_path / "log.jsonl", tmp_path / "ready"
    # spawn, not fork: the test process has TVM's threads; the child imports only records.
    child = multiprocessing.get_context("spawn").Process(target=_write_forever, args=(str(log), str(ready)))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while (not log.exists() or log.read_bytes().count(b"\n") < 30) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)  # no chance to clean up: like a crash or OOM kill
    finally:
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    data = log.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: b"" or the line cut short by the kill
    assert len(complete) >= 30
    trials = [TuningRecord.from_json(line.decode()).trial for line in complete]
    assert trials == list(range(len(complete)))
    if tail:
        with pytest.raises(ValueError):
            TuningRecord.from_json(tail.decode(errors="replace"))
    # Simulate the worst case explicitly too: a partial last line, then a resumed writer.
    with open(log, "ab") as f:
        f.write(b'{"schema_version": 2, "workload_key": "conv')
    with RecordWriter(log) as writer:
        writer.write(_record(len(complete)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = load_records(log)
    assert [r.trial for r in records] == list(range(len(complete) + 1))
    assert len(caught) == 1 and f"{log}:{len(complete) + 1}: skipped corrupt" in str(caught[0].message)


def test_record_validation_messages():
    with pytest.raises(ValueError, match="without error_code must have at least one latency"):
        TuningRecord(workload_key="w", target=TARGET, candidate={}, tvm_version="x")
    with pytest.raises(ValueError, match="with error_code 'RUN_ERROR' must have no latencies"):
        TuningRecord(workload_key="w", target=TARGET, candidate={}, latencies_ms=[1.0], error_code="RUN_ERROR",
                     tvm_version="x")
    with pytest.raises(ValueError, match="latencies_ms item must be a finite number >= 0, got nan"):
        TuningRecord(workload_key="w", target=TARGET, candidate={}, latencies_ms=[float("nan")], tvm_version="x")
    with pytest.raises(TypeError, match="candidate is not JSON-serialisable"):
        TuningRecord(workload_key="w", target=TARGET, candidate={"f": object()}, latencies_ms=[1.0],
                     tvm_version="x")
    with pytest.raises(TypeError, match="candidate must be a mapping"):
        TuningRecord(workload_key="w", target=TARGET, candidate=[1], latencies_ms=[1.0], tvm_version="x")
    with pytest.raises(ValueError, match="trial must be an int >= 0, got -1"):
        TuningRecord(workload_key="w", target=TARGET, candidate={}, latencies_ms=[1.0], trial=-1, tvm_version="x")
    with pytest.raises(ValueError, match="workload_key must not be empty"):
        TuningRecord(workload_key="", target=TARGET, candidate={}, latencies_ms=[1.0], tvm_version="x")
    # The stored candidate is a detached copy.
    cand = {"layout": {"ht": 4}}
    record = TuningRecord(workload_key="w", target=TARGET, candidate=cand, latencies_ms=[1.0], tvm_version="x")
    cand["layout"]["ht"] = 8
    assert record.candidate == {"layout": {"ht": 4}}


def test_closed_writer_and_bad_record_are_rejected(tmp_path):
    writer = RecordWriter(tmp_path / "log.jsonl")
    with pytest.raises(TypeError, match="expects a TuningRecord, got dict"):
        writer.write({"trial": 0})
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        writer.write(_record(0))


def test_version_2_lines_are_read_without_a_board_and_new_lines_carry_it(tmp_path):
    log = tmp_path / "log.jsonl"
    old = _record(1).to_dict()
    del old["board"]
    old["schema_version"] = 2
    new = dataclasses.replace(_record(2), board="10.0.0.7:9090")
    log.write_text(json.dumps(old) + "\n" + new.to_json() + "\n")
    first, second = load_records(log)
    assert (first.board, second.board) == ("", "10.0.0.7:9090")
    assert json.loads(new.to_json())["schema_version"] == SCHEMA_VERSION == 3
    with pytest.raises(ValueError, match="unknown"):
        TuningRecord.from_dict(old | {"schema_version": 2, "extra": 1})
