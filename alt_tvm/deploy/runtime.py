"""TVM's runtime without its compiler: what loading and running a model needs.

``import tvm`` loads the compiler library (259 MB) and, through ``tvm_ffi``, PyTorch: about
3 s in a fresh process on 2 cores. Running a model needs TVM's runtime library
(3.4 MB) and the FFI only. This module loads just those, ``tvm_ffi`` (skipping its eager
import of PyTorch where PyTorch is not loaded yet: it is there for tensor conversion, which
the deploy path does through DLPack) and ``libtvm_runtime``, and runs the Relax VM through the
FFI. In a process that has imported ``tvm`` (one that builds) the same functions work on its
objects: the runtime library is the one ``tvm`` loaded.
"""

from __future__ import annotations

import functools
import importlib.util
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["VirtualMachine", "cpu", "ffi", "load_module", "tvm_version"]

#: The Relax VM's pooled allocator (``tvm.runtime.vm.VirtualMachine.POOLED_ALLOCATOR``).
_POOLED_ALLOCATOR = 2
_CPU = 1  # DLPack's kDLCPU


@functools.cache
def ffi() -> Any:
    """``tvm_ffi``, with TVM's runtime library loaded (RTLD_GLOBAL, as ``tvm`` loads it)."""
    if "tvm_ffi" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None  # tvm_ffi imports torch if it can: 2.6 s the deploy path does not use
        try:
            import tvm_ffi
        finally:
            del sys.modules["torch"]
    import tvm_ffi
    from tvm_ffi.libinfo import load_lib_ctypes

    if "tvm" not in sys.modules:
        spec = importlib.util.find_spec("tvm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("TVM's runtime is not installed: pip install apache-tvm==0.27.0.post1")
        load_lib_ctypes("tvm", "tvm_runtime", "RTLD_GLOBAL",
                        extra_lib_paths=[Path(spec.submodule_search_locations[0]) / "lib"])
    return tvm_ffi


@functools.cache
def tvm_version() -> str:
    """The installed TVM's version, read without importing it."""
    if "tvm" in sys.modules:
        return str(sys.modules["tvm"].__version__)
    import importlib.metadata

    return importlib.metadata.version("apache-tvm")


def cpu(index: int = 0) -> Any:
    """This machine's CPU as an FFI device."""
    return ffi().device("cpu", index)


def load_module(path: str | Path) -> Any:
    """A compiled library (``export_library``'s shared object) as an FFI module."""
    return ffi().load_module(str(path))


class VirtualMachine:
    """A Relax VM over a library module, on one device (CPU shape functions included).

    The executable and its constants (the model's weights) are the module's and are shared;
    a VM holds one call's registers and allocator, so each thread that calls the model needs a
    VM of its own (two threads calling one VM corrupt its registers).
    """

    def __init__(self, module: Any, device: Any) -> None:
        if hasattr(module, "jit"):  # tvm.compile's Executable, not yet a library: linked in memory
            module = module.jit()
        self.module = module["vm_load_executable"]()
        self.device = device
        args = [device.dlpack_device_type(), device.index, _POOLED_ALLOCATOR]
        if device.dlpack_device_type() != _CPU:
            args += [_CPU, 0, _POOLED_ALLOCATOR]
        self.module["vm_initialization"](*args)

    def __getitem__(self, name: str) -> Any:
        return self.module[name]

    def set_instrument(self, instrument: Any) -> None:
        """Call ``instrument(func, symbol, before_run, ret_value, *args)`` around every call the
        VM makes (TVM's VM instrument protocol)."""
        self.module["set_instrument"](instrument)

    def time(self, args: Sequence[Any], *, number: int, repeat: int, func_name: str = "main") -> list[float]:
        """Seconds per call of ``func_name`` on ``args``: ``repeat`` means of ``number`` calls each,
        timed by TVM's runtime where the VM runs (``runtime.RPCTimeEvaluator``)."""
        evaluate = ffi().get_global_func("runtime.RPCTimeEvaluator")(
            self.module, func_name, self.device.dlpack_device_type(), self.device.index, number, repeat,
            0, 100, 0, 1, 0, "")
        blob = evaluate(*args)
        return list(struct.unpack("@" + "d" * repeat, blob))
