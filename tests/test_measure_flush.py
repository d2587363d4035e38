"""The tuner times candidates on flushed CPU caches, with the model's thread count.

A layer's weights (MBs) are cold when the model runs it: the layers before evicted them.
The tuner's measure functions and runners therefore flush every argument but the first
(the activation) before each timed call (:class:`alt_tvm.bench.timing.TimingPolicy`). These
tests check that the default path asks TVM's ``time_evaluator`` for the flush, that the
flush has its effect on a real kernel that streams a 4 MiB weight (which fits in this
machine's caches, so hot calls read it from cache), and that the LocalRunner's workers
run TVM's thread pool as the built model will.
"""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest
import tvm
from tvm import te

from alt_tvm.bench.timing import CACHE_FLUSH_FUNC, TimingPolicy, is_cpu, time_compiled
from alt_tvm.target import host, process_cores
from alt_tvm.tuning.measure import BuildResult, LocalRunner, MeasureInput, RPCRunner, argument_specs
from alt_tvm.tuning.measure.base import _time_module
from alt_tvm.tuning.task import measure_in_process

# 1024 x 1024 float32 = 4 MiB: in cache when hot (a few MiB of L2 + L3 on common CPUs),
# read from memory when flushed; a call takes well under a millisecond.
N = 1024
# The fastest flushed call over ROUNDS rounds must be this much slower than the fastest hot
# one: about 2x on 2 shared cores with a 32 MiB L3, so 1.25 leaves room for noise. The fastest,
# not the median: a test in the other xdist worker can slow most hot calls 20x (a flush is a
# cost every flushed call pays; interference only ever adds time).
MIN_RATIO, ROUNDS = 1.25, 5
# Rows of the Linear layer's input: with 4, its kernel computes faster than memory streams the
# weight on AVX2 as on AVX-512 (one row is a dependent chain per vector of outputs that reads
# the weight no faster than memory does on AVX2, so a flush would not show there).
ROWS = 4


def _matvec_mod(n: int = N) -> tvm.IRModule:
    """``y = W^T x``: streams the weight ``W`` (second argument) row by row, vectorized."""
    x = te.placeholder((n,), name="x")
    w = te.placeholder((n, n), name="W")
    k = te.reduce_axis((0, n), "k")
    y = te.compute((n,), lambda j: te.sum(w[k, j] * x[k], axis=k), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, y]))
    block = sch.get_sblock("y")
    j, kk = sch.get_loops(block)
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(kk, jo, ji)
    sch.vectorize(ji)
    sch.decompose_reduction(block, kk)
    return sch.mod


@pytest.fixture(scope="module")
def matvec(tmp_path_factory):
    """(jit module, exported shared object, argument specs, arguments on the CPU)."""
    executable = tvm.compile(_matvec_mod(), target=host().to_tvm())
    path = str(tmp_path_factory.mktemp("matvec") / "matvec.so")
    executable.export_library(path)
    specs = argument_specs(_matvec_mod()["main"])
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, s.shape).astype(s.dtype), tvm.cpu()) for s in specs]
    module = executable.jit()
    module["main"](*args)
    np.testing.assert_allclose(args[2].numpy(), args[0].numpy() @ args[1].numpy(), rtol=1e-4, atol=1e-3)
    return module, path, specs, args


@pytest.fixture(scope="module")
def linear_task():
    """The tuning task of a 1024 -> 1024 Linear layer on ``ROWS`` rows (a 4 MiB packed weight)."""
    torch = pytest.importorskip("torch")
    from alt_tvm.integration import extract_tasks

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(N, N)

        def forward(self, x):
            return torch.relu(self.fc(x))

    (task,) = extract_tasks(Linear().eval(), example_inputs=(torch.rand(ROWS, N),))
    return task


@pytest.fixture()
def evaluator_calls(monkeypatch):
    """The keyword arguments of every ``Module.time_evaluator`` call (the real one still runs)."""
    calls: list[dict] = []
    original = tvm.runtime.Module.time_evaluator

    def spy(self, func_name, dev, **kwargs):
        calls.append(kwargs)
        return original(self, func_name, dev, **kwargs)

    monkeypatch.setattr(tvm.runtime.Module, "time_evaluator", spy)
    return calls


def _flushed(call: dict, *, calls: int) -> bool:
    """Whether a time_evaluator call flushes before each of ``calls`` single-call repeats."""
    return call.get("f_preproc") == CACHE_FLUSH_FUNC and call["number"] == 1 and call["repeat"] == calls


def _slower_when_flushed(flushed, hot) -> tuple[bool, list[tuple[float, float]]]:
    """Whether ``flushed()`` (ms) is MIN_RATIO times ``hot()`` or more, fastest of ROUNDS rounds.

    The two alternate, after an untimed round: the first timings after other work are
    slow (clock ramp-up, page faults), which would favour whichever ran first.
    """
    hot(), flushed()
    seen = [(flushed(), hot()) for _ in range(ROUNDS)]
    ratio = min(f for f, _ in seen) / min(h for _, h in seen)
    return bool(ratio >= MIN_RATIO), seen


# ---------------------------------------------------------------------------------------
# (a) the default path asks for the flush, before every timed call


def test_measure_in_process_flushes_before_every_call_by_default(linear_task, evaluator_calls):
    measure_in_process(linear_task, None, number=4, repeat=3)
    measure_in_process(linear_task, None, number=4, repeat=3, cache_flush=False)
    flushed, hot = evaluator_calls
    assert _flushed(flushed, calls=12), flushed  # every one of the 4 x 3 calls
    assert not hot.get("f_preproc") and hot["number"] == 4 and hot["repeat"] == 3, hot


def test_runner_timing_loop_flushes_before_every_call_by_default(matvec, evaluator_calls):
    module, _, specs, _ = matvec
    latencies = {}
    for cache_flush in (True, False):
        runner = LocalRunner(number=5, repeat=2, cache_flush=cache_flush)
        assert runner.timing == TimingPolicy(number=5, repeat=2, cache_flush=cache_flush)
        # the loop LocalRunner's workers and RPCRunner run, with the runner's policy
        latencies[cache_flush] = _time_module(module, "main", tvm.cpu(), specs, runner.timing, seed=0)
    flushed, hot = evaluator_calls
    assert _flushed(flushed, calls=10), flushed
    assert not hot.get("f_preproc") and hot["number"] == 5 and hot["repeat"] == 2, hot
    # still one latency per repeat, each the mean of `number` calls
    assert len(latencies[True]) == len(latencies[False]) == 2
    assert RPCRunner(tracker_host="127.0.0.1", tracker_port=9190, key="k").timing.cache_flush


def test_time_compiled_stays_hot_unless_asked(matvec, evaluator_calls):
    module, _, _, args = matvec
    time_compiled(module, args, number=2, repeat=3)
    time_compiled(module, args, number=2, repeat=3, cache_flush=True)
    hot, flushed = evaluator_calls
    assert not hot.get("f_preproc") and hot["number"] == 2 and hot["repeat"] == 3, hot
    assert _flushed(flushed, calls=6), flushed


def test_the_flush_applies_to_cpus_local_or_remote_only():
    policy = TimingPolicy()
    assert policy.flushes(tvm.cpu(0))
    assert policy.flushes(tvm.runtime.Device(1 + 128, 0))  # the CPU of RPC session 0
    assert not is_cpu(tvm.cuda(0)) and not policy.flushes(tvm.cuda(0))  # no GPU needed to ask
    assert not policy.flushes(tvm.runtime.Device(2 + 128, 0))  # a remote GPU
    assert not TimingPolicy(cache_flush=False).flushes(tvm.cpu(0))


# ---------------------------------------------------------------------------------------
# (b) the flush has its effect: the weight is read from memory, not from cache


def test_flushed_calls_read_the_weight_from_memory(matvec):
    module, _, _, args = matvec

    def median_ms(cache_flush: bool) -> float:
        return float(np.median(TimingPolicy(number=10, repeat=3, cache_flush=cache_flush)
                               .time(module, "main", tvm.cpu(), args)))

    slower, seen = _slower_when_flushed(lambda: median_ms(True), lambda: median_ms(False))
    assert slower, f"(flushed ms, hot ms) per round: {seen}"


def test_measure_in_process_times_the_layer_with_a_cold_weight(linear_task):
    slower, seen = _slower_when_flushed(lambda: measure_in_process(linear_task, None),
                                        lambda: measure_in_process(linear_task, None, cache_flush=False))
    assert slower, f"(flushed ms, hot ms) per round: {seen}"


def test_local_runner_worker_flushes_and_runs_the_models_thread_count(matvec, monkeypatch):
    module, path, _, args = matvec
    # The environment of a tuner that has not built a model yet: TVM's pool would default
    # to half the logical CPUs (x86), not the target's cores.
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    inputs = [MeasureInput(workload_key=f"matvec_{N}", candidate={}, mod=_matvec_mod())]
    cores = process_cores()  # TVM runs no more threads than there are cores
    with LocalRunner(number=10, repeat=3, timeout_s=60, num_cores=cores) as runner:
        assert runner.threads == cores

        def flushed() -> float:
            [result] = runner.run(inputs, [BuildResult(path)])
            assert result.ok and len(result.latencies_ms) == 3, result.error_msg
            return result.median_ms

        def hot() -> float:
            return float(np.median(TimingPolicy(cache_flush=False).time(module, "main", tvm.cpu(), args)))

        slower, seen = _slower_when_flushed(flushed, hot)
        assert slower, f"(flushed ms in the worker, hot ms here) per round: {seen}"
        # Ask the worker that timed the kernel (n_parallel=1: one worker) for its pool size.
        [(_, threads, _)] = runner._pool.map(tvm.runtime.num_threads, [()], timeout_s=30)
        [(_, env, _)] = runner._pool.map(os.getenv, [("TVM_NUM_THREADS",)], timeout_s=30)
    assert (threads, env) == (cores, str(cores))


def test_the_models_environment_decides_the_worker_thread_count(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # the user's choice wins, as in alt_tvm.build
    assert LocalRunner(num_cores=3).threads == 1
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert LocalRunner(num_cores=3).threads == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert LocalRunner(num_cores=3).threads == 3


# ---------------------------------------------------------------------------------------
# (c) bad values are refused


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_cache_flush_must_be_a_bool(value, linear_task):
    match = f"cache_flush must be a bool, got {value!r}"
    with pytest.raises(TypeError, match=match):
        LocalRunner(cache_flush=value)
    with pytest.raises(TypeError, match=match):
        RPCRunner(tracker_host="127.0.0.1", tracker_port=9190, key="k", cache_flush=value)
    with pytest.raises(TypeError, match=match):
        measure_in_process(linear_task, None, cache_flush=value)
    with pytest.raises(TypeError, match=match):
        TimingPolicy(cache_flush=value)


def test_min_repeat_ms_would_defeat_the_flush():
    with pytest.raises(ValueError, match="min_repeat_ms=5 needs cache_flush=False"):
        LocalRunner(min_repeat_ms=5)
    assert LocalRunner(min_repeat_ms=5, cache_flush=False).timing.min_repeat_ms == 5
    with pytest.raises(ValueError, match="number must be an int > 0, got 0"):
        TimingPolicy(number=0)
    with pytest.raises(ValueError, match="num_cores must be an int > 0, got 0"):
        LocalRunner(num_cores=0)


def test_rpc_runner_says_when_the_boards_cpu_cannot_be_flushed(matvec, tmp_path):
    _, path, _, _ = matvec
    riscv = tmp_path / "riscv.so"
    shutil.copy(path, riscv)
    with open(riscv, "r+b") as file:  # e_machine = EM_RISCV: TVM's builtin does nothing there
        file.seek(18)
        file.write((0xF3).to_bytes(2, "little"))
    runner = RPCRunner(tracker_host="127.0.0.1", tracker_port=9190, key="k")
    with pytest.warns(RuntimeWarning, match="timed on hot caches"):
        runner._warn_if_not_flushed(str(riscv))
    runner = RPCRunner(tracker_host="127.0.0.1", tracker_port=9190, key="k")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner._warn_if_not_flushed(path)  # x86-64 (or AArch64) host: flushed, no warning
        RPCRunner(tracker_host="127.0.0.1", tracker_port=9190, key="k",
                  cache_flush=False)._warn_if_not_flushed(str(riscv))
