"""Compiled-model artifacts: export, load here and in a fresh process, cross-compiled ELFs, remote runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tvm
from conftest import build_messages, unpinned
from rpc_loopback import free_port, kill_group

import alt_tvm
from alt_tvm.deploy.artifact import LIBRARY, METADATA, ArtifactError
from alt_tvm.models import get_model
from alt_tvm.toolchain import cross_compiler_problem, elf_machine


@pytest.fixture(scope="module")
def small():
    """(built model, its inputs as NumPy, exported artifact directory)."""
    module, inputs = get_model("small_cnn")
    built = alt_tvm.build(module, example_inputs=inputs)
    arrays = [np.asarray(x.numpy()) for x in inputs]
    return built, arrays


@pytest.fixture()
def artifact(small, tmp_path):
    built, _ = small
    return built.export(tmp_path / "small.alt")


def test_export_load_round_trip_is_bit_exact_and_keeps_the_report(small, artifact):
    built, arrays = small
    assert sorted(p.name for p in artifact.iterdir()) == [METADATA, LIBRARY]
    loaded = alt_tvm.load(artifact)
    for want, got in zip(built(*arrays), loaded(*arrays)):
        np.testing.assert_array_equal(got, want)
    assert loaded.report == built.report.summary()
    assert loaded.input_shapes == built.input_shapes and loaded.input_dtypes == built.input_dtypes
    meta = loaded.metadata
    assert meta["tvm_version"] == tvm.__version__ and meta["alt_tvm_version"] == alt_tvm.__version__
    assert meta["machine"] == elf_machine(sys.executable)
    # the kernel table travels with it: the loaded model profiles with operators and FLOPs
    profile = loaded.profile(*arrays, repeat=2)
    rows = {row.kernel: row for row in profile.rows()}
    conv = [row for row in rows.values() if any("conv2d" in op for op in row.ops)]
    assert conv and all(row.gflops > 0 for row in conv)
    with pytest.raises(ValueError, match=r"input 'x' has shape \(1, 3\)|has shape"):
        loaded(np.zeros((1, 3), "float32"))


def test_loading_onto_a_named_cpu_device_is_the_default_load(small, artifact):
    """``alt_tvm.load(path, device=tvm.cpu())`` is the default spelled out (it raised an
    AttributeError reading the device's type)."""
    built, arrays = small
    loaded = alt_tvm.load(artifact, device=tvm.cpu())
    np.testing.assert_array_equal(loaded(*arrays)[0], built(*arrays)[0])
    default = alt_tvm.load(artifact)  # the same thread set-up as without a device
    assert (loaded.launcher is None) == (default.launcher is None)
    assert (loaded.thread_governor is None) == (default.thread_governor is None)


def load_in_fresh_process(artifact, array: np.ndarray, workdir) -> tuple[np.ndarray, float]:
    """Load ``artifact`` in a new Python process and run it on ``array``: (output 0, load seconds).

    Also checks that the process printed nothing and imported none of the build code.
    """
    np.save(workdir / "x.npy", array)
    code = textwrap.dedent(f"""
        import json, sys, time
        import numpy as np
        import tvm  # imported before the clock starts: TVM's own import is not load time
        started = time.perf_counter()
        import alt_tvm
        model = alt_tvm.load({str(artifact)!r})
        load_s = time.perf_counter() - started
        out = model(np.load({str(workdir / "x.npy")!r}))[0]
        np.save({str(workdir / "out.npy")!r}, out)
        ours = sorted(m for m in sys.modules if m.startswith("alt_tvm."))
        print(json.dumps({{"load_s": load_s, "ours": ours, "xgboost": "xgboost" in sys.modules}}))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         preexec_fn=unpinned)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # TVM's per-kernel "Scope Loaded" lines go to the log, not the terminal
    result = json.loads(run.stdout)
    # the runtime side only: no strategy, graph, tuner, layout or op module (nothing that builds)
    runtime = {"alt_tvm.deploy", "alt_tvm.isa", "alt_tvm.rpc", "alt_tvm.native_log"}
    assert [m for m in result["ours"] if not m.startswith(tuple(runtime))] == []
    assert not result["xgboost"]
    return np.load(workdir / "out.npy"), result["load_s"]


def test_a_fresh_process_loads_without_the_build_code_and_fast(small, artifact, tmp_path):
    built, arrays = small
    out, load_s = load_in_fresh_process(artifact, arrays[0], tmp_path)
    assert load_s < 1.0
    np.testing.assert_array_equal(out, built(*arrays)[0])


@pytest.mark.parametrize("board, machine", [("kirin990", "aarch64"), ("bananapi-f3", "riscv64")])
def test_a_board_artifact_is_an_elf_of_the_boards_machine(board, machine, tmp_path):
    from alt_tvm.target import board as board_named

    compiler = board_named(board).cross_compiler
    if cross_compiler_problem(compiler):
        pytest.skip(f"{cross_compiler_problem(compiler)} (make test installs it)")
    module, inputs = get_model("small_cnn")
    built = alt_tvm.build(module, target=board, example_inputs=inputs)
    with pytest.raises(RuntimeError, match=f"built for '{board}'"):
        built(np.asarray(inputs[0].numpy()))  # not this machine's code: an error, not a crash
    path = built.export(tmp_path / f"{board}.alt")
    assert elf_machine(path / LIBRARY) == machine
    assert json.loads((path / METADATA).read_text())["machine"] == machine
    with pytest.raises(ArtifactError, match=f"holds {machine} code for '{board}'"):
        alt_tvm.load(path)


def _edit_metadata(path, **changes):
    """Change ``model.json`` as if the artifact had been written so (its checksum written anew):
    ``target.X`` is the target's TVM dict entry X, ``target_isa`` its instruction-set features."""
    from alt_tvm.deploy.artifact import _metadata_digest

    meta = json.loads((path / METADATA).read_text())
    for key, value in changes.items():
        if key == "target_isa":
            meta["target"]["isa_features"] = value
        elif "." in key:
            outer, inner = key.split(".")
            meta[outer]["tvm"][inner] = value
        else:
            meta[key] = value
    meta["checksum"] = _metadata_digest(meta)
    (path / METADATA).write_text(json.dumps(meta))


def test_bad_artifacts_are_clear_errors(small, artifact, tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        alt_tvm.load(tmp_path / "nothing")
    with pytest.raises(ArtifactError, match="is a file"):
        alt_tvm.load(artifact / LIBRARY)
    with pytest.raises(ValueError, match="remote and key go together"):
        alt_tvm.load(artifact, key="board")
    with pytest.raises(ValueError, match=r"\['timeout_s'\] apply to a remote run"):
        alt_tvm.load(artifact, timeout_s=3)

    isa = json.loads((artifact / METADATA).read_text())["target"]["isa_features"]
    # An instruction set no CPU's cpuinfo shows (a made-up AMX extension), as a newer CPU's would be.
    _edit_metadata(artifact, target_isa=[*isa, "amx-nextgen"], **{"target.mcpu": "sapphirerapids"})
    with pytest.raises(ArtifactError, match="built for CPU 'sapphirerapids', whose features amx-nextgen .*check_cpu"):
        alt_tvm.load(artifact)
    _edit_metadata(artifact, target_isa=isa, **{"target.mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    alt_tvm.load(artifact)  # the edit back makes it loadable again
    _edit_metadata(artifact, **{"target.kind": "cuda"})  # what `alt-tvm build --target h100 -o DIR` writes
    with pytest.raises(ArtifactError, match="holds cuda code .* alt_tvm.load runs CPU code only"):
        alt_tvm.load(artifact, check_cpu=False)
    _edit_metadata(artifact, **{"target.kind": "llvm"})
    alt_tvm.load(artifact)

    _edit_metadata(artifact, tvm_version="0.19.0")
    with pytest.raises(ArtifactError, match=f"built with TVM 0.19.0, this process runs TVM {tvm.__version__}"):
        alt_tvm.load(artifact)
    _edit_metadata(artifact, tvm_version=tvm.__version__, artifact_version=99)
    with pytest.raises(ArtifactError, match="format version 99"):
        alt_tvm.load(artifact)
    (artifact / METADATA).write_text("{not json")
    with pytest.raises(ArtifactError, match="not readable JSON"):
        alt_tvm.load(artifact)
    (artifact / METADATA).unlink()
    with pytest.raises(ArtifactError, match="has no model.json"):
        alt_tvm.load(artifact)


# --------------------------------------------------------------------------- remote runs
def test_remote_errors_name_the_tracker_and_the_key(artifact, loopback):
    with pytest.raises(ConnectionError, match="no RPC server with key 'no-such-board' is registered"):
        alt_tvm.load(artifact, remote=loopback.address, key="no-such-board")
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"cannot reach tracker 127.0.0.1:{port}"):
        alt_tvm.load(artifact, remote=f"127.0.0.1:{port}", key="k", connect_timeout_s=2)
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError, match="remote must be host:port"):
        alt_tvm.load(artifact, remote="localhost", key="k")


def test_a_server_running_fewer_threads_than_the_target_has_cores_is_named(artifact, loopback):
    # the loopback's server runs TVM with one thread
    with build_messages() as messages, alt_tvm.load(artifact, remote=loopback.address, key=loopback.key) as board:
        assert board.metadata["target"]["num_cores"] >= 2
    assert any("the server's TVM runs 1 thread(s)" in m and "TVM_NUM_THREADS=" in m for m in messages)


# kills the module's loopback server: keep it last of the tests that use it
def test_a_remote_model_runs_and_times_on_the_board_and_fails_cleanly_when_it_dies(small, artifact, loopback):
    built, arrays = small
    remote = alt_tvm.load(artifact, remote=loopback.address, key=loopback.key, timeout_s=30)
    for want, got in zip(built(*arrays), remote(*arrays)):
        np.testing.assert_array_equal(got, want)
    best, median = remote.time(*arrays, number=2, repeat=2)
    assert 0 < best <= median
    with pytest.raises(RuntimeError, match="does not cross RPC"):
        remote.profile(*arrays)
    remote.close()  # the server is free for the next session
    with pytest.raises(ConnectionError, match="closed"):
        remote(*arrays)

    # The board dies while the model runs: the caller gets an error, nothing hangs.
    slow = alt_tvm.load(artifact, remote=loopback.address, key=loopback.key, timeout_s=8)
    outcome: list[BaseException | None] = []

    def call_many() -> None:
        try:
            for _ in range(100_000):
                slow(*arrays)
            outcome.append(None)
        except (ConnectionError, TimeoutError) as err:
            outcome.append(err)

    worker = threading.Thread(target=call_many, daemon=True)
    worker.start()
    time.sleep(1.0)
    started = time.monotonic()
    for server in loopback.servers:
        kill_group(server)
    worker.join(30)
    assert not worker.is_alive() and time.monotonic() - started < 30
    assert isinstance(outcome[0], (ConnectionError, TimeoutError))
    assert f"board {loopback.key!r} at tracker {loopback.address}" in str(outcome[0])
    with pytest.raises(ConnectionError, match="session was lost"):
        slow(*arrays)


def test_a_launcher_that_does_not_compile_is_an_artifact_error(small, tmp_path, monkeypatch):
    """The compiler that links the artifact cannot build the parallel launcher (a compiler
    without pthreads, say): the export fails with the artifact's error, naming the cause."""
    from alt_tvm.deploy import artifact as artifact_module
    from alt_tvm.deploy.parallel import LauncherError

    def no_launcher(compiler=None):
        raise LauncherError(f"{compiler or 'gcc'} could not compile parallel.c: pthread.h: no such file")

    monkeypatch.setattr(artifact_module, "launcher_object", no_launcher)
    built, _ = small
    with pytest.raises(ArtifactError, match="could not compile parallel.c: pthread.h") as caught:
        built.export(tmp_path / "small.alt")
    assert isinstance(caught.value.__cause__, LauncherError)
