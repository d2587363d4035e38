"""Builders and runners: local build+run, error codes, timeouts, a real RPC tracker, cross-compilation."""

from __future__ import annotations

import os
import time

import pytest
import tvm
from rpc_loopback import free_port
from tvm import te, tirx

from alt_tvm.records import RecordWriter, load_best, load_records
from alt_tvm.target import board, host
from alt_tvm.tuning.measure import (
    ArgSpec,
    BuildResult,
    CrossCompilerNotFoundError,
    ErrorCode,
    LocalBuilder,
    LocalRunner,
    MeasureInput,
    MeasureResult,
    RPCRunner,
    argument_specs,
    measure,
    random_arguments,
)

N = 64  # matmul size: builds and runs in a fraction of a second


def _matmul_func(n: int = N) -> tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


def _matmul(*, tiled: bool) -> MeasureInput:
    sch = tvm.s_tir.Schedule(_matmul_func())
    if tiled:
        block = sch.get_sblock("C")
        i, j, k = sch.get_loops(block)
        jo, ji = sch.split(j, [None, 16])
        sch.reorder(i, jo, k, ji)
        sch.vectorize(ji)
    return MeasureInput(workload_key=f"matmul_{N}", candidate={"layout": {}, "loop": {"tiled": tiled}}, mod=sch.mod)


def _broken(kind: str) -> MeasureInput:
    func = _matmul_func()
    if kind == "build":
        # A variable that is not a parameter: MakePackedAPI rejects it at build time.
        body = tirx.Evaluate(tirx.call_extern("int32", "foo", tirx.Var("undefined_x", "int32")))
    else:
        # Builds and links (shared objects may have undefined symbols), dies when called.
        body = tirx.Evaluate(tirx.call_extern("int32", "alt_tvm_no_such_symbol"))
    return MeasureInput(workload_key=f"matmul_{N}", candidate={"broken": kind},
                        mod=tvm.IRModule({"main": func.with_body(body)}))


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(target=host(), n_parallel=1, timeout_s=120) as b:
        yield b


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(number=3, repeat=3, timeout_s=120) as r:
        yield r


def _assert_plausible(result: MeasureResult) -> None:
    assert result.ok, result.error_msg
    assert len(result.latencies_ms) == 3
    gflops = 2 * N**3 / (result.median_ms * 1e-3) / 1e9
    # Slower than 1 MFLOP/s or faster than 10 TFLOP/s would be a timing bug, not this CPU.
    assert 1e-3 < gflops < 1e4, result.latencies_ms
    assert result.build_s > 0 and result.run_s > 0


def test_local_build_and_run_gives_plausible_latencies_and_records(builder, runner, tmp_path):
    inputs = [_matmul(tiled=False), _matmul(tiled=True), _broken("build")]
    builds = builder.build(inputs)
    assert [b.error_code for b in builds] == [ErrorCode.NONE, ErrorCode.NONE, ErrorCode.BUILD_ERROR]
    assert all(os.path.isfile(b.artifact_path) for b in builds[:2]) and builds[2].artifact_path is None
    assert "undefined_x" in builds[2].error_msg and "not passed in as API arguments" in builds[2].error_msg
    results = runner.run(inputs, builds)
    _assert_plausible(results[0])
    _assert_plausible(results[1])
    assert results[2].error_code == ErrorCode.BUILD_ERROR and results[2].latencies_ms == ()

    # Results become log lines; the best is the faster candidate.
    log = tmp_path / "log.jsonl"
    with RecordWriter(log) as writer:
        for trial, (item, result) in enumerate(zip(inputs, results)):
            writer.write(result.to_record(item, target=host(), trial=trial, seed=0))
    records = load_records(log)
    assert [r.error_code for r in records] == [None, None, "BUILD_ERROR"]
    assert records[0].target == str(host().to_tvm()) and records[0].latencies_ms == results[0].latencies_ms
    best = load_best(log, workload_key=f"matmul_{N}")
    assert best.candidate == min(zip(inputs, results), key=lambda p: p[1].median_ms)[0].candidate


def test_crashing_kernel_gives_run_error_and_the_runner_goes_on(builder, runner):
    inputs = [_broken("run"), _matmul(tiled=True)]
    results = measure(inputs, builder=builder, runner=runner)
    assert results[0].error_code == ErrorCode.RUN_ERROR
    assert "runner process died" in results[0].error_msg
    _assert_plausible(results[1])


def test_build_and_run_timeouts(builder):
    with LocalBuilder(target=host(), n_parallel=1, timeout_s=0.01) as quick_builder:
        [timed_out] = quick_builder.build([_matmul(tiled=True)])
    assert timed_out.error_code == ErrorCode.BUILD_TIMEOUT and "exceeded 0.01 s" in timed_out.error_msg
    with LocalRunner(number=1, repeat=1, timeout_s=0.5) as quick_runner:
        [result] = measure([_slow_kernel()], builder=builder, runner=quick_runner)
    assert result.error_code == ErrorCode.RUN_TIMEOUT and "exceeded 0.5 s" in result.error_msg
    assert result.run_s < 30


def _slow_kernel() -> MeasureInput:
    # 2^32 dependent float multiply-adds (seconds) that LLVM may not reorder (no fast-math).
    a = te.placeholder((16,), name="A")
    k1, k2 = te.reduce_axis((0, 2**28), "k1"), te.reduce_axis((0, 16), "k2")
    c = te.compute((1,), lambda i: te.sum(a[k2] * a[k2], axis=[k1, k2]), name="C")
    return MeasureInput(workload_key="slow", candidate={}, mod=tvm.IRModule({"main": te.create_prim_func([a, c])}))


def test_argument_specs_come_from_buffer_typed_params():
    assert argument_specs(_matmul_func(8)) == (ArgSpec((8, 8), "float32"),) * 3
    x = te.placeholder((2, 3), name="x", dtype="int8")
    y = te.compute((2, 3), lambda i, j: x[i, j] + 1, name="y")
    assert argument_specs(te.create_prim_func([x, y])) == (ArgSpec((2, 3), "int8"), ArgSpec((2, 3), "int32"))
    with pytest.raises(TypeError, match="expected a tvm.tirx.PrimFunc"):
        argument_specs("main")


def test_random_arguments_keep_a_0d_argument_0d():
    # np.ascontiguousarray made the 0-d values shape (1,), which copyfrom into a () tensor refuses
    specs = [ArgSpec((), "float32"), ArgSpec((), "int8"), ArgSpec((2, 3), "float32")]
    args = random_arguments(specs, tvm.cpu(), seed=0)
    assert [tuple(a.shape) for a in args] == [(), (), (2, 3)]
    assert [str(a.dtype) for a in args] == ["float32", "int8", "float32"]


def test_bad_parameters_are_rejected_with_precise_messages():
    with pytest.raises(ValueError, match="timeout_s must be a number > 0, got 0"):
        LocalBuilder(target=host(), timeout_s=0)
    with pytest.raises(ValueError, match="n_parallel must be an int > 0, got 0"):
        LocalRunner(n_parallel=0)
    with pytest.raises(ValueError, match="device must be one of"):
        LocalRunner(device="tpu")
    with pytest.raises(ValueError, match="unknown board 'nope'"):
        LocalBuilder(target="nope")
    with pytest.raises(TypeError, match="target must be a board name"):
        LocalBuilder(target=42)
    with pytest.raises(ValueError, match="tracker_port must be an int in 1..65535, got 0"):
        RPCRunner(tracker_host="127.0.0.1", tracker_port=0, key="k")
    with pytest.raises(ValueError, match="func_name 'kernel' is not a PrimFunc of the module"):
        MeasureInput(workload_key="w", candidate={}, mod=tvm.IRModule({"main": _matmul_func(4)}), func_name="kernel")
    with pytest.raises(TypeError, match="MeasureInput.mod must be a tvm.IRModule"):
        MeasureInput(workload_key="w", candidate={}, mod=_matmul_func(4))
    with pytest.raises(ValueError, match="got 1 inputs but 0 build results"):
        LocalRunner().run([_matmul(tiled=False)], [])


def test_missing_cross_compiler_names_the_debian_package():
    with pytest.raises(CrossCompilerNotFoundError, match=r"apt-get install gcc-aarch65-linux-gnu"):
        LocalBuilder(target=board("kirin990"), cross_compiler="aarch65-linux-gnu-gcc")


# ---------------------------------------------------------------------------------------
# Cross-compilation for the boards

ELF_MACHINE = {"kirin990": 0xB7, "bananapi-f3": 0xF3}  # EM_AARCH64, EM_RISCV


def _elf_machine(path: str) -> int:
    header = open(path, "rb").read(20)
    assert header[:4] == b"\x7fELF", header
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


@pytest.mark.parametrize("name", sorted(ELF_MACHINE))
def test_cross_compiled_shared_object_is_for_the_board(name, runner):
    try:
        b = LocalBuilder(target=name, n_parallel=1, timeout_s=120)
    except CrossCompilerNotFoundError as err:
        pytest.skip(f"cross compiler for {name} missing (run .ci/install-cross.sh): {err}")
    with b:
        assert b.cross_compiler == board(name).cross_compiler
        # A plain target dict with the board's triple infers the same compiler.
        with LocalBuilder(target=board(name).tvm_target) as from_dict:
            assert from_dict.cross_compiler == board(name).cross_compiler
        [result] = b.build([_matmul(tiled=True)])
        assert result.ok, result.error_msg
        assert _elf_machine(result.artifact_path) == ELF_MACHINE[name]
        # Loading it here must fail cleanly (wrong architecture), not crash the tuner.
        [run] = runner.run([_matmul(tiled=True)], [result])
        assert run.error_code == ErrorCode.RUN_ERROR and "cannot load the kernel" in run.error_msg


def test_cuda_board_produces_cuda_source_without_a_gpu():
    sch = tvm.s_tir.Schedule(_matmul_func())
    i, j, _ = sch.get_loops(sch.get_sblock("C"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    bound = MeasureInput(workload_key="mm", candidate={"bound": True}, mod=sch.mod)
    unbound = MeasureInput(workload_key="mm", candidate={"bound": False}, mod=tvm.IRModule({"main": _matmul_func()}))
    with LocalBuilder(target="v100", n_parallel=1, timeout_s=120) as b:
        ok, bad = b.build([bound, unbound])
        assert ok.ok, ok.error_msg
        assert "__global__" in ok.device_source and "blockIdx.x" in ok.device_source
        assert os.path.isfile(ok.artifact_path)  # host stub + CUDA module, loadable on a GPU machine
    assert not os.path.exists(ok.artifact_path)  # the builder's temporary directory is gone
    assert bad.error_code == ErrorCode.BUILD_ERROR and "no CUDA kernel was generated" in bad.error_msg


# ---------------------------------------------------------------------------------------
# RPC through a real tracker and server on loopback


@pytest.fixture()
def rpc_tracker(loopback):
    """(host, port, key) of a tracker with one registered server."""
    return loopback.host, loopback.port, loopback.key


def test_rpc_runner_times_a_kernel_through_a_real_tracker(rpc_tracker, builder, tmp_path):
    host_, port, key = rpc_tracker
    inputs = [_matmul(tiled=True), _broken("build")]
    rpc = RPCRunner(tracker_host=host_, tracker_port=port, key=key, number=3, repeat=3, timeout_s=60,
                    session_timeout_s=90)
    results = measure(inputs, builder=builder, runner=rpc)
    _assert_plausible(results[0])
    assert results[1].error_code == ErrorCode.BUILD_ERROR
    log = tmp_path / "rpc.jsonl"
    with RecordWriter(log) as writer:
        for trial, (item, result) in enumerate(zip(inputs, results)):
            writer.write(result.to_record(item, target=host(), trial=trial))
    assert load_best(log, workload_key=f"matmul_{N}").latencies_ms == results[0].latencies_ms

    other = RPCRunner(tracker_host=host_, tracker_port=port, key="no-such-board", timeout_s=5)
    [missing] = other.run([inputs[0]], [BuildResult("/nonexistent.so")])
    assert missing.error_code == ErrorCode.RPC_ERROR
    assert "no RPC server with key 'no-such-board' is registered" in missing.error_msg

    # A hanging kernel is abandoned after timeout_s; the server ends its session later.
    hang = RPCRunner(tracker_host=host_, tracker_port=port, key=key, number=1, repeat=1, timeout_s=1.5,
                     session_timeout_s=5)
    [hung] = measure([_slow_kernel()], builder=builder, runner=hang)
    assert hung.error_code == ErrorCode.RUN_TIMEOUT and "running exceeded the 1.5 s limit" in hung.error_msg


def test_unreachable_tracker_fails_fast_with_rpc_error():
    port = free_port()  # nothing listens there
    rpc = RPCRunner(tracker_host="127.0.0.1", tracker_port=port, key="k", timeout_s=30, connect_timeout_s=2)
    started = time.monotonic()
    [result] = rpc.run([_matmul(tiled=False)], [BuildResult("/nonexistent.so")])
    assert time.monotonic() - started < 5
    assert result.error_code == ErrorCode.RPC_ERROR
    assert f"cannot reach tracker 127.0.0.1:{port}" in result.error_msg


def test_rpc_runner_warns_when_the_server_runs_fewer_threads_than_the_kernels_get(builder, loopback):
    rpc = RPCRunner(tracker_host=loopback.host, tracker_port=loopback.port, key=loopback.key, number=1, repeat=1,
                    timeout_s=60, threads=2)
    with pytest.warns(RuntimeWarning, match="runs 1 TVM thread\\(s\\) for kernels built for 2.*TVM_NUM_THREADS=2"):
        [result] = measure([_matmul(tiled=False)], builder=builder, runner=rpc)
    assert result.ok
