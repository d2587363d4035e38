"""alt-tvm's parallel launcher: every task runs once, idle threads take a stalled thread's tasks,
and built and loaded models run their kernels on it."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import unpinned

import alt_tvm.target
from alt_tvm.deploy.parallel import SOURCE, LauncherConfig, ParallelLauncher, install, launcher_object


class Env(ctypes.Structure):
    _fields_ = [("sync_handle", ctypes.c_void_p), ("num_task", ctypes.c_int32)]


LAMBDA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(Env), ctypes.c_void_p)


@pytest.fixture(scope="module")
def launcher_lib(tmp_path_factory):
    """``parallel.c`` as a shared library of its own, called here as TVM's generated code calls it."""
    path = tmp_path_factory.mktemp("launcher") / "launcher.so"
    subprocess.run(["gcc", "-shared", "-o", str(path), str(launcher_object())], check=True)
    lib = ctypes.CDLL(str(path))
    lib.alt_tvm_parallel_launch.argtypes = [LAMBDA, ctypes.c_void_p, ctypes.c_int]
    return lib


def _launch(lib, body, *, threads=2, tasks_per_thread=4):
    """Launch ``body(task, num_task)`` (returns 0 or an error code); (result, {task: thread ident})."""
    ran: dict[int, list[int]] = {}
    seen_num_task: set[int] = set()

    def run(task, env, _):
        ran.setdefault(task, []).append(threading.get_ident())
        seen_num_task.add(env.contents.num_task)
        return body(task)

    launcher = ParallelLauncher(lib, threads=threads, config=LauncherConfig(tasks_per_thread=tasks_per_thread))
    callback = LAMBDA(run)
    result = lib.alt_tvm_parallel_launch(callback, None, 0)
    assert seen_num_task == {threads * tasks_per_thread if threads > 1 else 1}
    return result, ran, launcher


def test_every_task_runs_exactly_once(launcher_lib):
    result, ran, launcher = _launch(launcher_lib, lambda task: 0, threads=2, tasks_per_thread=4)
    assert result == 0
    assert sorted(ran) == list(range(8)) and all(len(who) == 1 for who in ran.values())
    stats = launcher.stats()
    assert stats.launches == 1 and stats.tasks == 8


def test_the_caller_takes_the_tasks_of_a_stalled_thread(launcher_lib):
    """The worker owns tasks 4..7; while it is stuck in task 4, the caller runs 5, 6 and 7."""
    caller = threading.get_ident()

    def body(task):
        if task < 4:
            time.sleep(0.02)  # the worker wakes and takes its first task meanwhile
        elif task == 4 and threading.get_ident() != caller:
            time.sleep(0.5)
        return 0

    result, ran, launcher = _launch(launcher_lib, body, threads=2, tasks_per_thread=4)
    assert result == 0 and sorted(ran) == list(range(8))
    assert all(ran[t] == [caller] for t in range(4))
    if ran[4] != [caller]:  # the worker took its task 4 (it had woken): the caller ran the rest of its range
        assert all(ran[t] == [caller] for t in (5, 6, 7))
        stats = launcher.stats()
        assert stats.stolen == 3
        # The worker's half-second asleep in its task is time its stretch lost (wall time less
        # CPU time); it counts that once it is done with the launch, which may be after this.
        losses, longest = stats.losses, stats.max_loss_us
        for _ in range(100):
            if losses:
                break
            time.sleep(0.01)
            later = launcher.stats()
            losses, longest = losses + later.losses, max(longest, later.max_loss_us)
        assert losses >= 1 and longest > 4e5


@pytest.mark.parametrize("solo", [True, False], ids=["solo", "always-parallel"])
def test_the_caller_runs_alone_while_its_worker_costs_it_time(launcher_lib, solo):
    """A worker whose tasks take 30 ms (as if the OS had preempted it in each) makes the caller
    wait far longer than running them itself would: after a 20 ms window of that, the caller
    runs the next launches whole, alone (``solo_when_stalled``); with it off, it never does."""
    caller = threading.get_ident()
    ran: list[tuple[int, int, bool]] = []  # (task, num_task, on the caller)

    def run(task, env, _):
        on_caller = threading.get_ident() == caller
        ran.append((task, env.contents.num_task, on_caller))
        time.sleep(0.001 if on_caller else 0.03)
        return 0

    launcher = ParallelLauncher(launcher_lib, threads=2,
                                config=LauncherConfig(tasks_per_thread=4, solo_when_stalled=solo))
    callback = LAMBDA(run)
    launches = []
    for _ in range(8):
        ran.clear()
        assert launcher_lib.alt_tvm_parallel_launch(callback, None, 0) == 0
        launches.append(list(ran))
    stats = launcher.stats()
    whole = [r for r in launches if [(t, n) for t, n, _ in r] == [(0, 1)]]
    if solo:
        assert stats.solo == len(whole) >= 1
        assert all(r[0][2] for r in whole)  # on the caller
        first = launches.index(whole[0])
        assert any(not on_caller for r in launches[:first] for _, _, on_caller in r)  # the worker ran before
    else:
        assert stats.solo == 0 and not whole
    for r in launches:  # every launch ran all of its tasks once
        assert sorted(t for t, _, _ in r) == list(range(r[0][1]))


def test_one_thread_runs_the_whole_loop_inline(launcher_lib):
    result, ran, _ = _launch(launcher_lib, lambda task: 0, threads=1)
    assert result == 0 and list(ran) == [0] and ran[0] == [threading.get_ident()]


def test_a_failing_task_fails_the_launch_after_all_tasks_ran(launcher_lib):
    result, ran, _ = _launch(launcher_lib, lambda task: -1 if task == 5 else 0, threads=2, tasks_per_thread=4)
    assert result == -1 and sorted(ran) == list(range(8))


def test_bad_settings_are_errors(launcher_lib):
    with pytest.raises(ValueError, match=r"tasks_per_thread must be an int in \[1, 64\]"):
        LauncherConfig(tasks_per_thread=0)
    with pytest.raises(ValueError, match="spin_polls must be an int"):
        LauncherConfig(spin_polls=-1)
    with pytest.raises(ValueError, match="solo_when_stalled must be a bool, got 1"):
        LauncherConfig(solo_when_stalled=1)
    launcher = ParallelLauncher(launcher_lib, threads=2, config=LauncherConfig())
    with pytest.raises(ValueError, match=r"threads must be an int in \[1, 64\], got 0"):
        launcher.set_threads(0)
    with pytest.raises(ValueError, match="got True"):
        launcher.set_threads(True)


def test_a_library_without_the_launcher_keeps_tvms(tmp_path):
    plain = tmp_path / "plain.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", "-o", str(plain), "-"], input=b"int f(void) { return 0; }\n",
                   check=True)
    assert install(plain, threads=2) is None


def test_the_source_compiles_without_warnings(tmp_path):
    done = subprocess.run(["gcc", "-c", "-O2", "-fPIC", "-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Werror",
                           str(SOURCE), "-o", str(tmp_path / "p.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


_BUILT = """
import json, sys, ctypes
import numpy as np, torch, tvm
import alt_tvm
from alt_tvm.models import get_model

module, inputs = get_model("small_cnn")
built = alt_tvm.build(module, example_inputs=inputs)
x = inputs[0].numpy()
with torch.no_grad():
    want = module(*inputs).numpy()
got = built(x)[0]
launcher = built.launcher
parallel = sum("T.parallel(" in built.mod[g].script() for g in built.mod.get_global_vars()
               if isinstance(built.mod[g], tvm.tirx.PrimFunc))
launcher.stats()
built(x)
two = launcher.stats()
launcher.set_threads(1)
one_out = built(x)[0]
one = launcher.stats()
launcher.set_threads(2)
loaded = alt_tvm.load(built.export(sys.argv[1]))
loaded_out = loaded(x)[0]
print(json.dumps({"err": float(np.abs(got - want).max()), "scale": float(np.abs(want).max()),
                  "parallel_kernels": parallel, "threads": launcher.threads,
                  "tasks_per_thread": launcher.config.tasks_per_thread,
                  "two": two.__dict__, "one_launches": one.launches,
                  "same_on_one": bool(np.array_equal(one_out, got)), "loaded_launcher": loaded.launcher is not None,
                  "loaded_same": bool(np.array_equal(loaded_out, got))}))
"""


def test_built_and_loaded_models_run_their_parallel_kernels_on_the_launcher(tmp_path):
    """In a fresh process with two threads (the test session runs TVM on one)."""
    if len(os.sched_getaffinity(0) | alt_tvm.target._AFFINITY_AT_IMPORT) < 2:
        pytest.skip("one CPU: the model runs on one thread, without the launcher")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", _BUILT, str(tmp_path / "m.alt")], capture_output=True, text=True,
                          timeout=300, env=env, preexec_fn=unpinned)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["err"] <= 1e-4 * max(1.0, facts["scale"])
    assert facts["threads"] == 2 and facts["parallel_kernels"] > 0
    two = facts["two"]
    # every parallel kernel went through the launcher, cut into tasks_per_thread tasks per thread, or
    # ran on the caller alone where the workers had cost it time (a busy machine: solo_when_stalled)
    assert two["launches"] + two["solo"] >= facts["parallel_kernels"]
    assert two["tasks"] == two["launches"] * 2 * facts["tasks_per_thread"]
    assert facts["one_launches"] == 0 and facts["same_on_one"]  # one thread: each loop runs whole, inline
    assert facts["loaded_launcher"] and facts["loaded_same"]


_AWAY = """
import ctypes, json, os, sys, threading, time
from alt_tvm.deploy.parallel import LauncherConfig, ParallelLauncher

class Env(ctypes.Structure):
    _fields_ = [("sync_handle", ctypes.c_void_p), ("num_task", ctypes.c_int32)]

LAMBDA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(Env), ctypes.c_void_p)
lib = ctypes.CDLL(sys.argv[1])
lib.alt_tvm_parallel_launch.argtypes = [LAMBDA, ctypes.c_void_p, ctypes.c_int]
libc = ctypes.CDLL(None)
caller = threading.get_native_id()
ran = []  # (task, thread, cpu) of every task

def body(task, env, _):
    ran.append((task, threading.get_native_id(), libc.sched_getcpu()))
    if task < 4 and threading.get_native_id() == caller:
        time.sleep(0.02)  # the worker wakes meanwhile and runs its own tasks
    return 0

callback = LAMBDA(body)
launcher = ParallelLauncher(lib, threads=2, config=LauncherConfig(tasks_per_thread=4,
                                                                    avoid_caller_cpu=sys.argv[2] == "1"))
everywhere = os.sched_getaffinity(0)
# The worker, started just now, takes part in this first launch (it once missed the launches
# published before it first ran) and shows its thread.
lib.alt_tvm_parallel_launch(callback, None, 0)
worker = next(tid for _, tid, _ in ran if tid != caller)
cpu = min(everywhere)
os.sched_setaffinity(0, {cpu})       # the caller, and the worker with it, on one CPU
os.sched_setaffinity(worker, {cpu})
launcher.stats()
ran.clear()
lib.alt_tvm_parallel_launch(callback, None, 0)
moves = launcher.stats().moves
print(json.dumps({"cpu": cpu, "moves": moves, "worker_mask": sorted(os.sched_getaffinity(worker)),
                  "everywhere": sorted(everywhere),
                  "worker_cpus": sorted({c for _, tid, c in ran if tid == worker}),
                  "tasks": sorted(t for t, _, _ in ran)}))
"""


@pytest.mark.parametrize("avoid", [True, False], ids=["avoid", "stay"])
def test_a_worker_on_the_callers_cpu_moves_off_it(launcher_lib, tmp_path, avoid):
    """With both threads on one CPU, the worker takes that CPU out of its mask at the next
    launch (where it would take turns with a caller that polls for it); with
    ``avoid_caller_cpu=False`` it stays. In a child process: it changes CPU masks."""
    if len(alt_tvm.target._AFFINITY_AT_IMPORT) < 2:
        pytest.skip("one CPU: a worker has nowhere else to go")
    lib = tmp_path / "launcher.so"
    subprocess.run(["gcc", "-shared", "-o", str(lib), str(launcher_object())], check=True)
    done = subprocess.run([sys.executable, "-c", _AWAY, str(lib), str(int(avoid))], capture_output=True, text=True,
                          timeout=120, preexec_fn=unpinned)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["tasks"] == list(range(8))
    if avoid:
        assert facts["moves"] == 1
        assert facts["worker_mask"] == [c for c in facts["everywhere"] if c != facts["cpu"]]
        assert facts["cpu"] not in facts["worker_cpus"]
    else:
        assert facts["moves"] == 0 and facts["worker_mask"] == [facts["cpu"]]
