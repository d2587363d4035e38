"""alt-tvm's parallel launcher (``parallel.c``), linked into every model library and installed at load.

TVM's thread pool splits each parallel loop into one block per thread and waits for all of
them, so a thread the OS has descheduled (another process holds its core) stalls every
parallel kernel: on 2 cores with one busy process, ResNet-18 takes 30-50 ms instead of
10.5 ms. ``parallel.c`` keeps TVM's calling convention (the generated code calls the
library's ``__TVMBackendParallelLaunch`` pointer, and each parallel lambda computes its block
from ``penv->num_task``) but cuts each launch into ``tasks_per_thread`` tasks per thread that
idle threads take from the others, so the caller runs the share of a thread that is not
running; see the C file for how its workers poll or sleep (``docs/shared_machine.md`` has the
measurements).

:func:`launcher_object` compiles it for a compiler (once per process), the model library is
linked with it (``export_library(..., addons=[object])``), and :func:`install` points a
loaded library's pointer at its launcher. TVM's JIT module (what ``tvm.compile`` returns)
keeps its pointer out of reach, so a built model runs from a library linked at its first
call (:func:`link_and_load`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LaunchStats", "LauncherConfig", "LauncherError", "ParallelLauncher", "install", "launcher_object",
           "link_and_load"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("parallel.c")
_MAX_THREADS = 64  # ALT_MAX_THREADS in parallel.c
_MAX_TASKS_PER_THREAD = 64


class LauncherError(RuntimeError):
    """The launcher could not be compiled, or a library's launcher could not be configured."""


@dataclass(frozen=True)
class LauncherConfig:
    """How the launcher splits a parallel loop and how long its idle workers poll.

    Attributes
    ----------
    tasks_per_thread
        Tasks per thread and launch (1 to 64). More tasks make the share a stalled thread
        leaves smaller; on a quiet machine each thread runs its own contiguous range, so
        the count costs little (8 runs within 1% of TVM's one block per thread on
        ResNet-18 and MobileNet-V2).
    spin_polls
        Polls (``pause`` instructions) an idle worker makes before it sleeps, while its core
        is not contended: long enough to bridge the gap between two kernels of one call.
        A worker that found its core contended sleeps at once (see ``parallel.c``).
    avoid_caller_cpu
        A worker that finds itself on the calling thread's CPU when a launch starts takes
        that CPU out of its affinity mask, so the two never take turns on one core (with a
        busy process on the other core they otherwise do, and ResNet-18 runs at its one-thread
        speed).
        False leaves placement to the OS alone (e.g. for a caller that pins its threads).
    solo_when_stalled
        The calling thread keeps an account of what the workers save it: per launch, its own
        time per task times all the tasks, less the time the launch took. Where a worker the
        OS preempted in the middle of a task made the caller wait longer than the workers
        saved it over 20 ms, the launches of the next 200 ms run on the caller alone (the
        workers sleep), then the workers are tried again (see ``parallel.c``). On a quiet
        machine the account is the parallel speed-up, and this never fires.
    """

    tasks_per_thread: int = 8
    spin_polls: int = 3000
    avoid_caller_cpu: bool = True
    solo_when_stalled: bool = True

    def __post_init__(self) -> None:
        for name, low, high in (("tasks_per_thread", 1, _MAX_TASKS_PER_THREAD), ("spin_polls", 0, 10**8)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
        for name in ("avoid_caller_cpu", "solo_when_stalled"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class LaunchStats:
    """What the launcher did since the previous :meth:`ParallelLauncher.stats` call.

    Attributes
    ----------
    launches
        Parallel launches run on more than one thread.
    tasks
        Tasks run (``launches * threads * tasks_per_thread``).
    worker_tasks
        Tasks run by a worker thread (the rest ran on the calling thread).
    stolen
        Tasks run by a thread other than the one whose range they were in.
    sleeps
        Times a worker went to sleep.
    moves
        Times a worker found itself on the calling thread's CPU at the start of a launch and
        took that CPU out of its affinity mask (see ``parallel.c``).
    losses
        Times a worker lost more than 30 us of one stretch (polling for a launch and running
        its tasks) to other threads: wall time less its CPU time, or time on a run queue after
        a wake-up. Its contention detection counts the losses over 1 ms (``parallel.c``).
    max_loss_us
        The longest such loss, in microseconds.
    solo
        Launches the calling thread ran alone, whole, because its workers had cost it more
        time than they saved (:attr:`LauncherConfig.solo_when_stalled`).
    """

    launches: int
    tasks: int
    worker_tasks: int
    stolen: int
    sleeps: int
    moves: int
    losses: int = 0
    max_loss_us: float = 0.0
    solo: int = 0


@functools.cache
def launcher_object(compiler: str | None = None) -> Path:
    """``parallel.c`` compiled to an object file by ``compiler`` (default: ``$CC``, gcc or cc), once per process.

    Raises
    ------
    LauncherError
        No C compiler is found, or it fails (the message has its error output).
    """
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise LauncherError("no C compiler to build alt-tvm's parallel launcher: install gcc (or set CC)")
    out = Path(tempfile.mkdtemp(prefix="alt_tvm_launcher_")) / "alt_tvm_parallel.o"
    done = subprocess.run([cc, "-c", "-O2", "-fPIC", "-std=gnu11", "-pthread", str(SOURCE), "-o", str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise LauncherError(f"{cc} could not compile {SOURCE.name}: {done.stderr.strip()[-800:]}")
    return out


class ParallelLauncher:
    """The launcher inside one loaded model library: its thread count and counters.

    Made by :func:`install`. Each library has its own launcher and workers (idle workers
    sleep), so models in one process do not share a pool.
    """

    def __init__(self, library: ctypes.CDLL, *, threads: int, config: LauncherConfig) -> None:
        self._lib = library
        self.config = config
        self._lib.alt_tvm_parallel_stats.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        self.set_threads(threads)

    @property
    def threads(self) -> int:
        """Threads per launch, the calling thread included."""
        return int(self._lib.alt_tvm_parallel_threads())

    def get_threads(self) -> int:
        """:attr:`threads` (the thread governor's reader)."""
        return self.threads

    def set_threads(self, threads: int) -> None:
        """Run the next launches on ``threads`` threads (1 to 64; workers start on first use).

        Raises
        ------
        ValueError
            ``threads`` is not an int in [1, 64].
        LauncherError
            The system refused to start the workers.
        """
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= _MAX_THREADS:
            raise ValueError(f"threads must be an int in [1, {_MAX_THREADS}], got {threads!r}")
        got = self._lib.alt_tvm_parallel_configure(threads, self.config.tasks_per_thread, self.config.spin_polls,
                                                   int(self.config.avoid_caller_cpu),
                                                   int(self.config.solo_when_stalled))
        if got != threads:
            raise LauncherError(f"the parallel launcher could start only {got} of {threads} threads")

    def stats(self) -> LaunchStats:
        """Counters since the previous call (and resets them)."""
        out = (ctypes.c_longlong * 9)()  # a library linked before a counter existed leaves it 0
        self._lib.alt_tvm_parallel_stats(out)
        return LaunchStats(*(int(v) for v in out[:7]), max_loss_us=out[7] / 1e3, solo=int(out[8]))


def install(library: str | os.PathLike, *, threads: int,
            config: LauncherConfig = LauncherConfig()) -> ParallelLauncher | None:
    """Point a loaded model library's parallel launches at the launcher linked into it.

    Call after ``tvm.runtime.load_module(library)``, which sets the library's pointer to
    TVM's own launcher. Returns None, leaving TVM's launcher, for a library without the
    launcher (an artifact written before it existed) and for one whose kernels synchronise
    inside parallel loops (TVM's parallel barrier, which this launcher does not provide).
    """
    lib = ctypes.CDLL(os.fspath(library))  # the handle TVM opened: the same pointer and pool
    try:
        launch = lib.alt_tvm_parallel_launch
        pointer = ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelLaunch")
    except (AttributeError, ValueError):
        return None
    try:
        ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelBarrier")
    except ValueError:
        pass
    else:
        log.warning("%s synchronises inside parallel loops (TVM's parallel barrier): it runs on TVM's thread pool",
                    os.fspath(library))
        return None
    launcher = ParallelLauncher(lib, threads=threads, config=config)
    pointer.value = ctypes.cast(launch, ctypes.c_void_p).value
    return launcher


def link_and_load(executable: Any, *, threads: int,
                  config: LauncherConfig = LauncherConfig()) -> tuple[Any, ParallelLauncher | None]:
    """Link ``tvm.compile``'s result with the launcher into a library, load it and install the launcher.

    Returns (the loaded module, its launcher). The library file is removed once loaded.
    Without a C compiler (or if linking fails) it logs why and returns ``(executable, None)``:
    the model then runs on TVM's pool.
    """
    import tvm

    from alt_tvm.toolchain import export_library

    try:
        addon = launcher_object()
        with tempfile.TemporaryDirectory(prefix="alt_tvm_model_") as tmp:
            path = os.path.join(tmp, "model.so")
            export_library(executable, path, cross_compiler=None, addons=[addon])
            module = tvm.runtime.load_module(path)
            launcher = install(path, threads=threads, config=config)
    except (LauncherError, OSError, RuntimeError) as err:
        log.warning("alt-tvm's parallel launcher is not used (the model runs on TVM's thread pool): %s", err)
        return executable, None
    return module, launcher
