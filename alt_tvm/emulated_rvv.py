"""Kernels for a RISC-V vector board run on an emulated core: qemu-user with the V extension.

No TVM runtime for riscv64 can be had here (no wheel is published for it, and the TVM source at
hand lacks the release's tag to build the matching one), so a RISC-V board cannot serve TVM's
RPC as the emulated ARM board does (:mod:`alt_tvm.emulated_board`). What can run is one kernel:
alt-tvm compiles it for the board (:func:`export_kernel`, linked by the board's cross gcc), and
a small C harness (``alt_tvm/data/rvv_harness.c``) loads it, supplies the few runtime symbols
a kernel imports (a parallel launch runs its tasks one after another), and calls it through
the TVM FFI C calling convention on tensors read from a file. The harness runs under
``qemu-riscv64`` with the board's vector length (:func:`qemu_cpu`) and Debian's riscv64 C
library as its root (``-L``), so no riscv64 root file system is needed.

This checks the kernels' numerics as the board's vector unit computes them (the same run
with the V extension off dies of SIGILL). It does not check the Relax VM, whole models, the
runtime's thread pool or any timing: qemu's speed says nothing about a SpacemiT X60.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from alt_tvm import lowering
from alt_tvm.target import HardwareTarget, board
from alt_tvm.toolchain import cross_compiler_problem, export_library

__all__ = ["EmulatedRunError", "QEMU", "SYSROOT", "export_kernel", "partition_tasks", "prepare_harness",
           "qemu_cpu", "run_library", "run_lowered", "rvv_problem"]

#: The qemu-user binary (Debian package ``qemu-user``, installed by ``.ci/prepare-board.sh``).
QEMU = "qemu-riscv64"
#: Debian's riscv64 C library (package ``libc6-riscv64-cross``, with the cross gcc): qemu's ``-L`` root.
SYSROOT = Path("/usr/riscv64-linux-gnu")
#: The harness's C source, shipped with the package.
HARNESS_SOURCE = Path(__file__).parent / "data" / "rvv_harness.c"
#: DLPack type codes of the NumPy kinds a kernel argument may have.
_DL_CODES = {"i": 0, "u": 1, "f": 2}


class EmulatedRunError(RuntimeError):
    """The harness failed: a kernel error, a crash (``signal`` set, e.g. ``"SIGILL"``), a timeout."""

    def __init__(self, message: str, *, returncode: int | None, signal_name: str | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.signal = signal_name


def _rvv_board(target: HardwareTarget | str) -> HardwareTarget:
    """``target`` as a board whose triple is riscv64 and that has a vector length."""
    hw = board(target) if isinstance(target, str) else target
    if not isinstance(hw, HardwareTarget):
        raise TypeError(f"target must be a HardwareTarget or a board name, got {type(target).__name__}")
    triple = str(hw.tvm_target.get("mtriple", ""))
    mattr = [str(a) for a in hw.tvm_target.get("mattr", ())]
    if not triple.startswith("riscv64") or "+v" not in mattr or not hw.vector_bits or not hw.cross_compiler:
        raise ValueError(f"target {hw.name!r} is not a riscv64 board with the V extension and a cross compiler "
                         f"(mtriple {triple!r}, mattr {mattr}, vector_bits {hw.vector_bits}, "
                         f"cross_compiler {hw.cross_compiler!r})")
    return hw


def qemu_cpu(*, target: HardwareTarget | str = "bananapi-f3", vector: bool = True) -> str:
    """qemu's ``-cpu`` for ``target``: rv64 with the V extension at the board's vector length
    (VLEN) and the bit-manipulation extensions its kernels are compiled for; ``vector`` False:
    the same core without V (a vector instruction then raises SIGILL).

    Raises
    ------
    ValueError
        If ``target`` is not a riscv64 board with the V extension.
    """
    hw = _rvv_board(target)
    mattr = {str(a) for a in hw.tvm_target.get("mattr", ())}
    bits = ",".join(f"{ext}=true" for ext in ("zba", "zbb", "zbs") if f"+{ext}" in mattr)
    vec = f"v=true,vlen={hw.vector_bits},elen=64,vext_spec=v1.0" if vector else "v=false"
    return f"rv64,{vec}" + (f",{bits}" if bits else "")


def rvv_problem(*, target: HardwareTarget | str = "bananapi-f3") -> str | None:
    """Why kernels for ``target`` cannot run on the emulated core here (None: they can)."""
    hw = _rvv_board(target)
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (Debian package qemu-user; .ci/prepare-board.sh installs it)"
    problem = cross_compiler_problem(hw.cross_compiler)
    if problem:
        return f"{problem} (run .ci/install-cross.sh)"
    if not any(SYSROOT.glob("lib/ld-linux-riscv64*.so*")):
        return f"no riscv64 C library under {SYSROOT} (Debian package libc6-riscv64-cross)"
    return None


def prepare_harness(*, directory: str | os.PathLike, target: HardwareTarget | str = "bananapi-f3") -> Path:
    """The harness compiled for ``target`` into ``directory`` (reused when already there).

    Raises
    ------
    RuntimeError
        If the emulated core cannot be used here (:func:`rvv_problem`) or the harness does not compile.
    """
    hw = _rvv_board(target)
    problem = rvv_problem(target=hw)
    if problem:
        raise RuntimeError(f"cannot run kernels for {hw.name!r} on an emulated core: {problem}")
    out = Path(directory) / "rvv_harness"
    if out.exists():
        return out
    import tvm_ffi

    include = Path(tvm_ffi.__file__).parent / "include"
    cmd = [hw.cross_compiler, "-O2", "-std=c11", "-I", str(include), "-rdynamic", str(HARNESS_SOURCE),
           "-o", str(out), "-ldl", "-Wl,--no-as-needed", "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the harness did not compile ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return out


def export_kernel(func: tvm.tirx.PrimFunc | tvm.IRModule, *, path: str | os.PathLike,
                  target: HardwareTarget | str = "bananapi-f3") -> Any:
    """Compile ``func`` (a kernel, or a module of one) for ``target`` with alt-tvm's pipeline,
    link it into the shared object ``path`` with the board's cross gcc, and return the
    executable (its ``mod.inspect_source("asm")`` is the board's assembly). The kernel is
    exported as ``main``."""
    hw = _rvv_board(target)
    if isinstance(func, tvm.IRModule):
        funcs = [f for f in func.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise ValueError(f"func must be a module of one PrimFunc, got {len(funcs)}")
        func = funcs[0]
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise TypeError(f"func must be a tvm.tirx.PrimFunc or an IRModule, got {type(func).__name__}")
    executable = lowering.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                                  target=hw.to_tvm())
    export_library(executable, path, cross_compiler=hw.cross_compiler)
    return executable


def _write_arrays(path: Path, arrays: Sequence[np.ndarray]) -> None:
    with open(path, "wb") as file:
        file.write(struct.pack("<i", len(arrays)))
        for i, array in enumerate(arrays):
            array = np.ascontiguousarray(array)
            if array.dtype.kind not in _DL_CODES or array.dtype.byteorder == ">":
                raise ValueError(f"argument {i}: dtype {array.dtype} is not a little-endian int, uint or float")
            file.write(struct.pack("<i", array.ndim) + struct.pack(f"<{array.ndim}q", *array.shape))
            file.write(bytes([_DL_CODES[array.dtype.kind], array.dtype.itemsize * 8]))
            file.write(array.tobytes())


def _read_arrays(path: Path, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    with open(path, "rb") as file:
        (count,) = struct.unpack("<i", file.read(4))
        if count != len(like):
            raise EmulatedRunError(f"the harness wrote {count} arguments back, expected {len(like)}", returncode=0)
        for array in like:
            (ndim,) = struct.unpack("<i", file.read(4))
            shape = struct.unpack(f"<{ndim}q", file.read(8 * ndim))
            file.read(2)
            size = int(np.prod(shape, dtype=np.int64)) * array.dtype.itemsize
            out.append(np.frombuffer(file.read(size), array.dtype).reshape(shape).copy())
    return out


def run_library(*, harness: str | os.PathLike, library: str | os.PathLike, arrays: Sequence[np.ndarray],
                function: str = "main", target: HardwareTarget | str = "bananapi-f3", vector: bool = True,
                tasks: int | None = None, timeout_s: float = 600.0) -> list[np.ndarray]:
    """Call ``function`` of the kernel library ``library`` on ``arrays`` (every argument, the
    outputs included) on the emulated core, and return the arguments as the kernel left them.

    Parameters
    ----------
    harness
        :func:`prepare_harness`'s result.
    library
        A shared object from :func:`export_kernel` (its data file goes beside it).
    arrays
        The kernel's arguments in order.
    function
        The exported kernel name.
    target
        The board (its vector length sets qemu's).
    vector
        False: run on the same core without the V extension (a vector kernel dies of SIGILL).
    tasks
        Tasks a parallel launch that asks for the default count gets (default: the board's cores);
        the harness runs them one after another.
    timeout_s
        Wall-clock limit of the emulated run.

    Raises
    ------
    EmulatedRunError
        If the kernel reports an error, the harness crashes (``.signal`` names the signal) or
        runs past ``timeout_s``.
    ValueError
        If ``tasks`` is not a positive int, or an array's dtype has no DLPack code here.
    """
    hw = _rvv_board(target)
    tasks = hw.num_cores if tasks is None else tasks
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise ValueError(f"tasks must be a positive int, got {tasks!r}")
    library = Path(library)
    io_path = library.with_suffix(".io")
    arrays = [np.ascontiguousarray(a) for a in arrays]
    _write_arrays(io_path, arrays)
    cmd = [QEMU, "-cpu", qemu_cpu(target=hw, vector=vector), "-L", str(SYSROOT), str(harness), str(library),
           function, str(io_path), str(tasks)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        raise EmulatedRunError(f"{library.name} ran past {timeout_s} s on the emulated core", returncode=None) from err
    # qemu notes the vector spec it defaults to on stderr; only the harness's lines matter.
    stderr = "\n".join(line for line in done.stderr.splitlines() if "vector version" not in line)
    if done.returncode != 0:
        name = None
        if done.returncode < 0 or done.returncode > 128:
            number = -done.returncode if done.returncode < 0 else done.returncode - 128
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        what = f"died of {name}" if name else f"exited with {done.returncode}"
        raise EmulatedRunError(f"{library.name} {what} on the emulated core ({' '.join(cmd[:4])}): {stderr[-2000:]}",
                               returncode=done.returncode, signal_name=name)
    return _read_arrays(io_path, arrays)


def run_lowered(lowered: Any, *, activations: Sequence[np.ndarray], directory: str | os.PathLike,
                target: HardwareTarget | str = "bananapi-f3", vector: bool = True,
                timeout_s: float = 600.0) -> np.ndarray:
    """A lowered task (:meth:`alt_tvm.tuning.task.Task.lower`) compiled for ``target`` and run
    on the emulated core on ``activations`` (canonical layout, as
    :meth:`~alt_tvm.tuning.task.Lowered.run` takes them); its output in canonical layout.

    The library, its data file and the harness go into ``directory``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    args = lowered.arrays(activations)
    library = directory / "kernel.so"
    export_kernel(lowered.func, path=library, target=target)
    harness = prepare_harness(directory=directory, target=target)
    result = run_library(harness=harness, library=library, arrays=args, target=target, vector=vector,
                         timeout_s=timeout_s)[-1]
    return lowered.canonical_output(result)


def partition_tasks(model: Any, *, example_inputs: Sequence[Any], target: HardwareTarget | str = "bananapi-f3",
                    **keywords: Any) -> list[Any]:
    """Every partition of ``model`` that a strategy lowers, as a task (the tunable ones, as
    :func:`alt_tvm.integration.extract_tasks` gives them, and the others with no space), in
    topological order; ``keywords`` are :func:`alt_tvm.build`'s options (``strategies``,
    ``strategy_options``, ...)."""
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.graph.partition import plan_partitions
    from alt_tvm.graph.prepare import prepare
    from alt_tvm.options import build_options
    from alt_tvm.strategies.base import PartitionContext
    from alt_tvm.tuning.task import Task

    options = build_options(None, caller="partition_tasks", target=target, **keywords)
    func = prepare(load_model(model, example_inputs=example_inputs).mod)["main"]
    plan = plan_partitions(func, target=options.target, variant=options.variant, allowed=options.strategies,
                           strategy_options=options.strategy_options)
    tasks = []
    for partition in plan.partitions:
        strategy = plan.strategy_of(partition)
        strategy_options = options.strategy_options.get(strategy.name)
        context = PartitionContext(partition, options.target, options.variant, {}, options=strategy_options)
        tasks.append(Task(context.workload_key, strategy, partition, options.target,
                          strategy.space(partition.anchor, context), variant=options.variant,
                          options=strategy_options))
    return tasks
