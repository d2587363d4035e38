"""The shared-machine benchmark's bookkeeping: its phases, how a busy phase is set against quiet ones,
and alt-tvm against the faster peer in each."""

import math

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def bench_load():
    return load_script("bench_load")


def test_phases_alternate_and_end_quiet(bench_load):
    assert bench_load.phase_names(1) == ["quiet", "busy", "quiet"]
    assert bench_load.phase_names(3) == ["quiet", "busy"] * 3 + ["quiet"]


def test_a_busy_phase_is_set_against_the_quiet_phases_on_either_side(bench_load):
    # The host slows down through the run (quiet 10 -> 20 -> 40 ms): against the first quiet phase
    # alone the second busy phase would read 3.0; against its neighbours it reads the same as the first.
    phases = [{"a": 10.0, "b": 1.0}, {"a": 15.0, "b": 2.0}, {"a": 20.0, "b": 1.0},
              {"a": 30.0, "b": 2.0}, {"a": 40.0, "b": 1.0}]
    ratios = bench_load.cycle_ratios(phases)
    assert ratios["a"] == pytest.approx([15 / math.sqrt(200), 30 / math.sqrt(800)])
    assert ratios["a"][0] == pytest.approx(ratios["a"][1])
    assert ratios["b"] == pytest.approx([2.0, 2.0])


@pytest.mark.parametrize("phases", [[{"a": 1.0}], [{"a": 1.0}, {"a": 2.0}],
                                    [{"a": 1.0}, {"a": 2.0}, {"a": 1.0}, {"a": 2.0}]])
def test_phases_that_do_not_alternate_from_quiet_to_quiet_are_refused(bench_load, phases):
    with pytest.raises(ValueError, match=f"got {len(phases)}"):
        bench_load.cycle_ratios(phases)


def test_a_cycle_count_below_one_is_refused_with_its_value(bench_load):
    with pytest.raises(ValueError, match="cycles must be at least 1, got 0"):
        bench_load.phase_names(0)
    with pytest.raises(ValueError, match="got -2"):
        bench_load.main(["--cycles", "-2", "--models", "resnet18"])


def test_the_table_prints_the_median_of_the_cycle_ratios(bench_load):
    phases = [{"alt-tvm": 10.0}, {"alt-tvm": 13.0}, {"alt-tvm": 10.0}, {"alt-tvm": 30.0}, {"alt-tvm": 10.0},
              {"alt-tvm": 14.0}, {"alt-tvm": 10.0}]
    row = {"phases": phases, "parallel_kernels": [5, 9],
           "busy_over_quiet": {"alt-tvm": 1.4}}
    table = bench_load._table("m", "default", row)
    assert "3 quiet/busy cycles" in table
    line = table.splitlines()[-1].split()
    assert line[0] == "alt-tvm" and float(line[1]) == 10.0 and float(line[2]) == 14.0 and line[3] == "1.40"


def test_each_phase_reads_alt_tvm_against_its_faster_peer(bench_load):
    # Quiet medians: alt-tvm 2, ONNX Runtime 3, OpenVINO 2.5; busy medians: alt-tvm 4, ORT 3, OpenVINO 6.
    phases = [{"alt-tvm": 2.0, "onnxruntime": 3.0, "openvino": 2.0},
              {"alt-tvm": 4.0, "onnxruntime": 3.0, "openvino": 6.0},
              {"alt-tvm": 2.0, "onnxruntime": 3.0, "openvino": 3.0}]
    quiet, busy = bench_load.phase_medians(phases)
    assert quiet == {"alt-tvm": 2.0, "onnxruntime": 3.0, "openvino": 2.5} and busy["alt-tvm"] == 4.0
    against = bench_load.against_peers(phases)
    assert (against["quiet"]["faster_peer"], against["quiet"]["ratio_vs_faster_peer"]) == ("openvino", 1.25)
    assert (against["busy"]["faster_peer"], against["busy"]["ratio_vs_faster_peer"]) == ("onnxruntime", 0.75)
    assert bench_load.against_peers([{"alt-tvm": 1.0}] * 3) == {}  # no peer timed
    rows = [{"model": "a", "setting": "default", "against_faster_peer": against},
            {"model": "b", "setting": "default", "against_faster_peer": {"quiet": {"ratio_vs_faster_peer": 0.8}}},
            {"model": "a", "setting": "spin0", "against_faster_peer": {}}]
    summary = bench_load.summaries(rows)
    assert list(summary) == ["default"]
    assert summary["default"]["quiet"]["geomean_ratio_vs_faster_peer"] == pytest.approx(1.0)  # (1.25 * 0.8) ** 0.5
    assert summary["default"]["quiet"]["behind"] == ["b"] and summary["default"]["busy"]["behind"] == ["a"]
    row = {"phases": phases, "parallel_kernels": [1, 2], "busy_over_quiet": {k: 1.0 for k in phases[0]},
           "against_faster_peer": against, "skipped_peers": {"tensorrt": "not a CPU peer"}}
    table = bench_load._table("m", "default", row).splitlines()
    assert table[-2] == ("  alt-tvm against the faster peer (peer ms / alt-tvm ms): quiet openvino 1.25x, "
                         "busy onnxruntime 0.75x")
    assert table[-1] == "  tensorrt skipped: not a CPU peer"


def test_the_busy_loop_stops_when_its_parent_dies(bench_load, tmp_path):
    import subprocess
    import sys
    import time

    # A parent that starts the load and exits at once, as a worker killed mid-phase would.
    parent = (f"import os, subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', {bench_load.BUSY_LOOP!r}, "
              "str(os.getpid())], stdout=subprocess.DEVNULL)\nimport time\ntime.sleep(0.5)\n"
              "print(child.pid, child.poll() is None, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    pid, running = done.stdout.split()
    pid = int(pid)
    assert running == "True"  # busy while its parent lives
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        subprocess.run(["kill", str(pid)])
        raise AssertionError(f"the busy loop {pid} outlived its parent")
