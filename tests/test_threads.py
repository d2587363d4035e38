"""The thread governor: all threads while they pay, one thread while another process holds a core."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import unpinned

import alt_tvm.target
from alt_tvm.deploy.model import POOL_SPIN_COUNT
from alt_tvm.deploy.threads import ThreadGovernor, ThreadPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _governor(**policy):
    applied: list[int] = []
    clock = Clock()
    governor = ThreadGovernor(2, policy=ThreadPolicy(**policy), set_threads=applied.append,
                              get_threads=lambda: applied[-1] if applied else 2, clock=clock)
    return governor, applied, clock


def _run(governor, clock, latency_by_threads, calls):
    """Make ``calls`` calls 10 ms apart whose latency depends on the governor's thread count."""
    used = []
    for _ in range(calls):
        governor.before_call()
        used.append(governor.threads)
        clock.now += 0.01
        governor.after_call(latency_by_threads[governor.threads])
    return used


def test_a_quiet_machine_keeps_all_threads_and_never_switches():
    governor, applied, clock = _governor()
    assert _run(governor, clock, {2: 0.010, 1: 0.019}, 200) == [2] * 200
    assert applied == [] and governor.switches == 0


def test_slow_first_calls_do_not_start_a_trial_on_a_quiet_machine():
    """A model's first calls are slow (page faults, cold caches); a trial judged against them
    once kept a 0.07 ms GEMM on one thread (0.13 ms) on a quiet machine."""
    governor, applied, clock = _governor()
    for latency in [0.030, 0.038, 0.035, 0.028, 0.035] + [0.016, 0.017] * 50:
        governor.before_call()
        clock.now += 0.01
        governor.after_call(latency)
    assert applied == [] and governor.state == "all"


def test_noise_of_single_calls_does_not_trigger_a_trial():
    governor, applied, clock = _governor()
    for latency in [0.010, 0.014, 0.010, 0.010, 0.015, 0.010] * 20:  # isolated spikes above slack x best
        governor.before_call()
        governor.after_call(latency)
    assert applied == [] and governor.state == "all"


def test_under_load_it_moves_to_one_thread_and_back_when_the_load_ends():
    governor, applied, clock = _governor(retry_s=0.5)
    _run(governor, clock, {2: 0.010, 1: 0.019}, 12)  # quiet: learns the best on 2 threads
    busy = {2: 0.040, 1: 0.019}  # another process holds a core: 2 threads wait at every barrier
    used = _run(governor, clock, busy, 160)
    assert used[:6] == [2, 2, 1, 1, 1, 1]  # 2 of 3 calls slowed down: a trial of 1 + 3 calls on one thread
    # judged against the latest 12 calls on all threads (mostly quiet ones): no better yet; after
    # retry_s (0.5 s = 50 calls) the trial is judged against slowed-down calls only, and one thread wins
    assert used[6:56] == [2] * 50 and used[56:60] == [1, 1, 1, 1]
    assert used[60:].count(2) <= 4 * 2  # then one thread, but for a retry of 1 + 3 calls every 0.5 s
    assert governor.state in ("one", "retry") and governor.switches >= 2
    used = _run(governor, clock, {2: 0.010, 1: 0.019}, 100)  # the load ends
    assert used[-50:] == [2] * 50 and governor.state == "all"
    assert applied[0] == 1 and applied[-1] == 2


def test_a_trial_that_does_not_pay_goes_back_and_waits_before_the_next():
    governor, applied, clock = _governor(retry_s=0.5)
    _run(governor, clock, {2: 0.010, 1: 0.019}, 12)
    used = _run(governor, clock, {2: 0.016, 1: 0.030}, 100)  # slower, but one thread is worse still
    assert used.count(1) == 2 * 4  # one trial of 1 + 3 calls, and another after retry_s (50 calls of 10 ms)
    assert governor.state == "all"


def test_bad_policies_are_errors():
    with pytest.raises(ValueError, match="slack must be a number > 1"):
        ThreadPolicy(slack=1.0)
    with pytest.raises(ValueError, match="retry_s must be a number > 0"):
        ThreadPolicy(retry_s=0)
    with pytest.raises(ValueError, match="samples must be an int >= 1"):
        ThreadPolicy(samples=0)
    with pytest.raises(ValueError, match="cores must be an int >= 1"):
        ThreadGovernor(0)


_GOVERNED = """
import copy, json, sys
import numpy as np
import tvm
import alt_tvm
from alt_tvm.deploy.threads import ThreadGovernor
from alt_tvm.models import get_model

module, inputs = get_model("small_cnn")
built = alt_tvm.build(module, example_inputs=inputs)
count = tvm.get_global_func("runtime.NumThreads")
x = inputs[0].numpy()
facts = {"governed_before_first_call": built.thread_governor is not None}
want = built(x)[0]  # links the library: its kernels run on alt-tvm's launcher, which needs no governor
facts.update({"pool": int(count()), "launcher_threads": built.launcher.threads,
              "governor_after_first_call": built.thread_governor is not None,
              "bind": __import__("os").environ.get("TVM_BIND_THREADS"),
              "spin": __import__("os").environ.get("TVM_THREAD_POOL_SPIN_COUNT")})
# The same code on TVM's pool (a model without the launcher: no C compiler, an older artifact)
pooled = copy.copy(built)
pooled._library, pooled.launcher = built.executable, None
pooled._drop_vms()
pooled.thread_governor = governor = ThreadGovernor(facts["pool"], set_threads=pooled._set_threads,
                                                   get_threads=pooled._get_threads)
governor.state = "one"  # as after a trial under load
facts["same_on_one"] = bool(np.array_equal(pooled(x)[0], want))  # same code, fewer larger blocks
facts["threads_on_one"] = int(count())
governor.state = "all"
pooled(x)
facts["threads_on_all"] = int(count())
tvm.get_global_func("runtime.config_threadpool")(1, 1)  # another model left the pool on one thread
pooled(x)
facts["threads_after_other"] = int(count())
loaded = alt_tvm.load(built.export(sys.argv[1]))
facts["loaded_launcher_threads"] = loaded.launcher.threads
facts["loaded_governor"] = loaded.thread_governor is not None
print(json.dumps(facts))
"""


def test_the_governor_sizes_tvms_pool_and_the_launcher_replaces_it(tmp_path):
    """In a fresh process (TVM's pool is sized once per process, and other tests size it to 1)."""
    if len(os.sched_getaffinity(0) | alt_tvm.target._AFFINITY_AT_IMPORT) < 2:
        pytest.skip("one CPU: nothing to govern")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")}
    done = subprocess.run([sys.executable, "-c", _GOVERNED, str(tmp_path / "m.alt")], capture_output=True, text=True,
                          timeout=300, env=env, preexec_fn=unpinned)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["pool"] >= 2 and facts["launcher_threads"] == facts["pool"]
    assert facts["governed_before_first_call"] and not facts["governor_after_first_call"]
    assert facts["bind"] == "0"  # the pool does not pin the caller (and its children) to one core
    assert facts["spin"] == str(POOL_SPIN_COUNT)  # workers poll briefly, then sleep
    assert facts["same_on_one"] and facts["threads_on_one"] == 1
    assert facts["threads_on_all"] == facts["threads_after_other"] == facts["pool"]
    assert facts["loaded_launcher_threads"] == facts["pool"] and not facts["loaded_governor"]


def test_single_slow_samples_do_not_keep_it_on_one_thread_when_all_threads_pay_in_the_median():
    """Under load, calls on all threads vary several-fold; the median decides, not one call."""
    governor, applied, clock = _governor(retry_s=0.2)
    _run(governor, clock, {2: 0.010, 1: 0.019}, 12)
    pattern = iter([0.030, 0.031, 0.012, 0.013, 0.012, 0.011, 0.012] * 100)  # median 0.012
    used = []
    for _ in range(300):
        governor.before_call()
        used.append(governor.threads)
        clock.now += 0.01
        governor.after_call(next(pattern) if governor.threads == 2 else 0.019)
    assert used.count(2) > 0.6 * len(used)
