"""alt-tvm's parallel launcher (``parallel.c``): linked into every model library, installed at load.

TVM's own launcher splits each parallel loop into one block per thread and waits for all of
them; when another process holds a core, every parallel kernel waits for the descheduled
thread (MobileNet-V2 on 2 vCPUs with one busy process: 7.5x slower). ``parallel.c`` cuts
each launch into ``chunks_per_thread`` chunks per thread that threads claim while they run,
so the caller takes the chunks of a thread that is not running. The library keeps TVM's
calling convention (``__TVMBackendParallelLaunch``); :func:`install` points a loaded
library's pointer at the launcher linked into it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["CHUNKS_PER_THREAD", "SOURCE", "compile_launcher", "install"]

SOURCE = Path(__file__).with_name("parallel.c")
#: Chunks per thread and launch: enough that a descheduled thread's share is small, few
#: enough that a chunk still fills whole register tiles of the kernels' parallel loops.
CHUNKS_PER_THREAD = 4
#: Polls of the job counter an idle worker makes before it sleeps.
SPIN_POLLS = 2000


def compile_launcher(out_dir: str | os.PathLike, *, compiler: str | None = None) -> Path:
    """Compile ``parallel.c`` to an object file in ``out_dir`` with ``compiler`` (default: the host's cc).

    Raises
    ------
    RuntimeError
        If no C compiler is found or it fails (the message has its error output).
    """
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler to build alt-tvm's parallel launcher: install gcc (or set CC)")
    obj = Path(out_dir) / "alt_tvm_parallel.o"
    done = subprocess.run([cc, "-c", "-O2", "-fPIC", "-std=gnu11", "-pthread", str(SOURCE), "-o", str(obj)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cc} could not compile {SOURCE.name}: {done.stderr.strip()[-500:]}")
    return obj


def install(library: str | os.PathLike, *, threads: int, chunks_per_thread: int = CHUNKS_PER_THREAD,
            spin_polls: int = SPIN_POLLS) -> bool:
    """Point the loaded model library's parallel launches at its linked-in launcher.

    Call after ``tvm.runtime.load_module(library)`` (which sets the pointer to TVM's own
    launcher). Returns False, leaving TVM's launcher, for a library without the launcher
    (built before it existed) or one that uses TVM's parallel barrier, which the launcher
    does not provide.
    """
    lib = ctypes.CDLL(os.fspath(library))  # the handle TVM opened: same symbols, same pool
    try:
        launch = lib.alt_tvm_parallel_launch
        pointer = ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelLaunch")
    except ValueError:
        return False
    try:
        ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelBarrier")
        return False
    except ValueError:
        pass
    lib.alt_tvm_parallel_configure(ctypes.c_int(threads), ctypes.c_int(chunks_per_thread), ctypes.c_int(spin_polls))
    pointer.value = ctypes.cast(launch, ctypes.c_void_p).value
    return True
