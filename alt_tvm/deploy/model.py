"""A compiled model that runs: inputs checked, called, timed and profiled in the Relax VM.

One base for the model :func:`alt_tvm.build` returns and the one :func:`alt_tvm.load`
reads from an artifact, so both check inputs, time and profile the same way. It needs
TVM's runtime only (:mod:`.runtime`): loading an artifact imports no strategy, no compiler
and compiles nothing.

A model may be called from any number of threads at once: the executable and its weights
are shared, and each calling thread runs a Relax VM of its own (a VM holds one call's
registers). Inputs are given in order, by name (``model(x=...)``) or as a dict of feeds.
"""

from __future__ import annotations

import abc
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from alt_tvm.native_log import tvm_output_to_log

from . import runtime
from .parallel import ParallelLauncher
from .profile import KernelInfo, KernelProfile, profile_vm
from .threads import ThreadGovernor, set_tvm_pool_threads, tvm_pool_threads

__all__ = ["ALIGNMENT", "RunnableModel", "aligned", "flatten_outputs", "use_runtime_threads"]

_CPU = 1  # DLPack's kDLCPU: this machine's CPU (a remote session's devices carry an RPC mask)

#: Byte alignment TVM's kernels assume of every tensor: an input array aligned so is read in
#: place by a model call; any other is copied first (:meth:`RunnableModel._to_device`).
ALIGNMENT = 64


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` as a C-ordered copy whose data starts on an :data:`ALIGNMENT`-byte boundary
    (``array`` itself when it already does): a model call reads such an input in place.

    NumPy aligns its allocations to 16 bytes, so about one array in four is aligned by chance.
    """
    array = np.asarray(array)
    if array.flags.c_contiguous and _is_aligned(array):
        return array
    return _aligned_copy(array)


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-ordered copy of ``array`` whose data starts on an :data:`ALIGNMENT`-byte boundary."""
    buffer = np.empty(array.nbytes + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    out = buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _is_aligned(array: np.ndarray) -> bool:
    return array.ctypes.data % ALIGNMENT == 0


def _on_this_cpu(device: Any) -> bool:
    """Whether ``device`` is this machine's CPU, whose tensors NumPy can share through DLPack."""
    return device is not None and device.dlpack_device_type() == _CPU


def flatten_outputs(value: Any) -> list[np.ndarray]:
    """A model's (nested) outputs as a flat list of NumPy arrays, in output order."""
    return _flatten(value, [])


def _flatten(value: Any, out: list[np.ndarray]) -> list[np.ndarray]:
    """Append every tensor in a (nested) tuple/list of TVM/torch tensors to ``out`` as NumPy
    (copies: a VM output may be a view of an input or a constant of the model)."""
    if isinstance(value, runtime.ffi().Tensor):
        # DLPack, not Tensor.numpy(): right after a model call the caches hold the model's data,
        # and numpy()'s Python steps (ctypes, dtype parsing) took 0.1 ms there for 4 KB (MNASNet).
        out.append(np.from_dlpack(value).copy() if _on_this_cpu(value.device) else value.numpy())
    elif isinstance(value, np.ndarray):
        out.append(value)
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # torch.Tensor
        out.append(value.detach().cpu().numpy())
    elif hasattr(value, "__iter__") and not isinstance(value, (str, bytes)):
        for item in value:  # Python sequences and TVM FFI Arrays (a VM's tuple outputs)
            _flatten(item, out)
    else:
        raise TypeError(f"unexpected model output of type {type(value).__name__}")
    return out


#: ``TVM_THREAD_POOL_SPIN_COUNT`` alt-tvm runs TVM's pool with: a worker polls for its next
#: task this many times (each poll a ``sched_yield``) before it sleeps. Between the kernels of
#: one model call the workers stay awake; soon after the call they sleep, so another runtime
#: timed next is not slowed. Measured at batch 1 on 2 threads (Xeon guest), alt-tvm and ONNX
#: Runtime timed interleaved in one process: TVM's default (300000) made ORT's MobileNet-V2
#: 4.92 ms instead of 4.04 ms; 0 (no polling) made alt-tvm's 4.27 ms instead of 3.59 ms with
#: this value, with ORT's unchanged (4.00 ms).
POOL_SPIN_COUNT = 1000


def use_runtime_threads(cores: int) -> int:
    """Make TVM's thread pool run ``cores`` threads, unpinned, unless the user chose otherwise.

    The schedules split their parallel loops for ``cores`` threads, but TVM's pool
    defaults to half the logical CPUs on x86 (it assumes SMT): one thread on 2 vCPUs,
    which silently halves every parallel kernel. So ``TVM_NUM_THREADS`` is set to
    ``cores`` when neither it nor ``OMP_NUM_THREADS`` is set. ``TVM_BIND_THREADS`` is set
    to 0 when unset: by default the pool pins the calling thread to one core, and every
    thread or process that thread creates afterwards inherits the one-core mask (an ONNX
    Runtime made later runs both its threads on one core; a child build sees a one-core
    host), and it re-pins at every thread-count change of the
    :class:`~alt_tvm.deploy.threads.ThreadGovernor`. ``TVM_THREAD_POOL_SPIN_COUNT`` is set
    to :data:`POOL_SPIN_COUNT` when unset. The pool reads all three once, when it starts;
    if it already runs fewer threads, this warns. Returns the pool size.
    """
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(cores)
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(POOL_SPIN_COUNT))
    pool = tvm_pool_threads()
    if pool < cores and os.environ.get("TVM_NUM_THREADS") == str(cores):
        warnings.warn(f"TVM's thread pool already runs {pool} thread(s), fewer than the target's {cores} cores: "
                      f"set TVM_NUM_THREADS={cores} before the first TVM kernel runs", stacklevel=3)
    return pool


def seeded_inputs(*, shapes: Sequence[Sequence[int]], dtypes: Sequence[str], seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs of these shapes and dtypes, :func:`aligned` so a call reads them in place.

    Floats are standard normal; integers and booleans are 0 or 1, valid as token ids, masks
    and indices into any dimension of two or more.
    """
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if np.issubdtype(np.dtype(dtype), np.floating):
            out.append(rng.standard_normal(shape).astype(dtype))
        else:
            out.append(rng.integers(0, 2, shape).astype(dtype))
    return [aligned(array) for array in out]


class RunnableModel(abc.ABC):
    """A compiled model: call it on NumPy arrays, ``time`` it, ``profile`` its kernels.

    Parameters
    ----------
    executable
        The Relax VM executable (``tvm.compile``'s result, or a loaded library module).
    input_names, input_shapes, input_dtypes
        The model inputs, in call order.
    device
        Where it runs (default this machine's CPU; a remote session's device for a board).
    not_here
        Why the code cannot run on ``device`` (built for another machine), or None; a
        call then raises ``RuntimeError`` with it instead of crashing the process.
    threads
        The thread count of TVM's pool for this model (``use_runtime_threads``' result):
        with more than one, each call's thread count is chosen by a
        :class:`~alt_tvm.deploy.threads.ThreadGovernor` (``model.thread_governor``; set it
        to None to keep all threads whatever the load). None: no governor (remote models).

    Attributes
    ----------
    launcher : ParallelLauncher or None
        The parallel launcher the model's kernels run on (:mod:`alt_tvm.deploy.parallel`), set
        once the model's library is loaded (a built model's at its first call; the thread
        governor is then dropped); None while they run on TVM's thread pool.
    """

    def __init__(self, executable: Any, *, input_names: Sequence[str], input_shapes: Sequence[Sequence[int]],
                 input_dtypes: Sequence[str], device: Any = None, not_here: str | None = None,
                 threads: int | None = None) -> None:
        self.executable = executable
        self.input_names = list(input_names)
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        self.input_dtypes = [str(d) for d in input_dtypes]
        self.device = device if device is not None else runtime.cpu()
        self._not_here = not_here
        self._vms = threading.local()  # each calling thread's VM
        self._library_lock = threading.Lock()  # the first calls of several threads link the library once
        self._governor_lock = threading.Lock()
        self.launcher: ParallelLauncher | None = None
        self._threads = threads
        self.thread_governor = (ThreadGovernor(threads, set_threads=self._set_threads, get_threads=self._get_threads)
                                if threads is not None and threads > 1 else None)

    def set_threads(self, threads: int) -> None:
        """Run each call on ``threads`` threads from now on, whatever the load (the thread
        governor is dropped): with ``N`` concurrent callers on ``C`` cores, ``C // N`` each.

        Raises
        ------
        ValueError
            If ``threads`` is not an int >= 1.
        """
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if self._not_here is None:
            with self._library_lock:
                self._runtime_module()  # a built model's launcher exists from its first call on
        self.thread_governor = None
        self._set_threads(threads)

    def _set_threads(self, threads: int) -> None:
        if self.launcher is not None:
            self.launcher.set_threads(threads)
        else:
            set_tvm_pool_threads(threads)

    def _get_threads(self) -> int:
        return self.launcher.threads if self.launcher is not None else tvm_pool_threads()

    def _use_launcher(self, launcher: ParallelLauncher | None) -> None:
        """Run the kernels on ``launcher`` (None: on TVM's pool). The launcher balances a stalled
        thread's share itself, so the governor is dropped: under one busy process it took
        ResNet-18 to one thread (1.94x quiet) where the launcher on both threads gave 1.45x
        (``docs/shared_machine.md`` §5)."""
        self.launcher = launcher
        if launcher is not None:
            self.thread_governor = None

    def _runtime_module(self) -> Any:
        """The module the VM runs: ``executable``; a built model links it with the launcher first."""
        return self.executable

    @abc.abstractmethod
    def kernel_info(self) -> dict[str, KernelInfo]:
        """Kernel name -> what it computes (operators, output layout, FLOPs, bytes); subclasses
        know it from the module they were built from, or from the artifact."""

    @property
    def vm(self) -> Any:
        """The calling thread's Relax VM running the model (created on its first call)."""
        if self._not_here is not None:
            raise RuntimeError(self._not_here)
        local = self._vms
        vm = getattr(local, "vm", None)
        if vm is None:
            vm = local.vm = self._new_vm()
        return vm

    def _new_vm(self) -> Any:
        """A VM over the model's library (each thread and each profile gets its own)."""
        with self._library_lock:
            module = self._runtime_module()
        with tvm_output_to_log():
            return runtime.VirtualMachine(module, self.device)

    def _drop_vms(self) -> None:
        """Let every thread's next call make a new VM (the library it runs changed; a copy of
        the model gets VMs of its own)."""
        self._vms = threading.local()

    def _invoke(self, call: Callable[[], Any], what: str) -> Any:
        """Run one call into the VM; a remote model bounds it in time (``what`` names it)."""
        return call()

    def _bound(self, arrays: Sequence[Any], feeds: Mapping[str, Any]) -> list[Any]:
        """The inputs in the model's order, from positional ``arrays``, from keyword ``feeds``,
        or from one positional dict of feeds (ONNX Runtime's ``run`` takes one).

        Raises
        ------
        ValueError
            For an unknown or a missing input name, naming the model's inputs.
        TypeError
            For inputs given both by position and by name.
        """
        if len(arrays) == 1 and isinstance(arrays[0], Mapping) and not feeds:
            feeds, arrays = arrays[0], ()
        if not feeds:
            return list(arrays)
        if arrays:
            raise TypeError(f"give the inputs by position or by name, not both (got {len(arrays)} positional "
                            f"and {sorted(feeds)} by name); the model's inputs are {self.input_names}")
        unknown = [name for name in feeds if name not in self.input_names]
        missing = [name for name in self.input_names if name not in feeds]
        if unknown or missing:
            raise ValueError(f"the model's inputs are {self.input_names}; "
                             + "; ".join(f"{what} {names}" for what, names in
                                         (("unknown", unknown), ("missing", missing)) if names))
        return [feeds[name] for name in self.input_names]

    def _checked(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The inputs as C-ordered NumPy arrays, after checking their number, shapes and dtypes."""
        if len(arrays) != len(self.input_shapes):
            raise ValueError(f"model takes {len(self.input_shapes)} inputs {self.input_names}, got {len(arrays)}")
        out = []
        for name, array, shape, dtype in zip(self.input_names, arrays, self.input_shapes, self.input_dtypes):
            if array is None:
                raise TypeError(f"input {name!r} is None; the model expects an array of shape {shape}, {dtype}")
            array = np.asarray(array)
            if tuple(array.shape) != shape:
                raise ValueError(f"input {name!r} has shape {tuple(array.shape)}, the model expects {shape}")
            if str(array.dtype) != dtype:
                raise ValueError(f"input {name!r} has dtype {array.dtype}, the model expects {dtype}")
            # not np.ascontiguousarray: it turns a 0-d input (a scalar bound, a scalar bias) into shape (1,)
            out.append(np.asarray(array, order="C"))
        return out

    def _to_device(self, arrays: Sequence[np.ndarray]) -> list:
        """The inputs as tensors on the model's device.

        On this machine's CPU, an array aligned as TVM's kernels assume (:func:`aligned`) is
        read in place (DLPack); any other is copied into a new tensor. Measured right after a
        call, when the caches hold the model's data: the copy of a 224x224 image took
        0.17-0.22 ms, and the whole call read in place was 1.4-1.5% faster (MNASNet,
        MobileNet-V2) and 5% faster (ShuffleNet-V2). A copy into a tensor kept from call to
        call gained nothing measurable. The VM's outputs never alias an input after the
        call: :func:`flatten_outputs` copies them.
        """
        if not _on_this_cpu(self.device):
            import tvm  # a GPU or a remote session's device: copied there

            return [tvm.runtime.tensor(array, self.device) for array in arrays]
        ffi = runtime.ffi()
        out = []
        for array in arrays:
            if not (_is_aligned(array) and array.flags.writeable and array.size):
                array = _aligned_copy(array)
            try:
                out.append(ffi.from_dlpack(array))
            except (BufferError, TypeError, ValueError, RuntimeError):  # not exportable: a 0-size or 0-d oddity
                import tvm

                out.append(tvm.runtime.tensor(array, self.device))
        return out

    def random_inputs(self, *, seed: int = 0) -> list[np.ndarray]:
        """Inputs of the model's shapes and dtypes (:func:`seeded_inputs`)."""
        return seeded_inputs(shapes=self.input_shapes, dtypes=self.input_dtypes, seed=seed)

    def __call__(self, *arrays: Any, **feeds: Any) -> list[np.ndarray]:
        """The model's outputs (NumPy arrays, in output order) for its inputs: in order, by name
        (``model(x=image)``), or as one dict of feeds (``model({"x": image})``). Safe to call
        from several threads at once (module doc)."""
        checked = self._checked(self._bound(arrays, feeds))
        governor = self.thread_governor
        if governor is None:
            return self._invoke(lambda: flatten_outputs(self._run_main(self._to_device(checked))), "running the model")
        with self._governor_lock:
            governor.before_call()
        started = time.perf_counter()
        outputs = flatten_outputs(self._run_main(self._to_device(checked)))
        with self._governor_lock:
            governor.after_call(time.perf_counter() - started)
        return outputs

    def _run_main(self, args: list) -> Any:
        """The VM's result of ``main`` on device tensors."""
        return self.vm["main"](*args)

    def time(self, *arrays: Any, number: int = 10, repeat: int = 5, **feeds: Any) -> tuple[float, float]:
        """(min, median) latency in ms of one call, VM overhead included (timed where it runs),
        at the thread count the governor chose last (it does not adapt within a timing)."""
        checked = self._checked(self._bound(arrays, feeds))

        def timed() -> list[float]:
            args = self._to_device(checked)
            self.vm["main"](*args)
            return self._time_main(args, number=number, repeat=repeat)

        results = np.asarray(self._invoke(timed, "timing the model")) * 1e3
        return float(results.min()), float(np.median(results))

    def _time_main(self, args: list, *, number: int, repeat: int) -> list[float]:
        """Seconds per call of ``main``, ``repeat`` means of ``number`` calls, timed where it runs."""
        return self.vm.time(args, number=number, repeat=repeat)

    def profile(self, *arrays: Any, repeat: int = 5, **feeds: Any) -> KernelProfile:
        """Time every kernel inside ``repeat`` runs of the whole model (after one warm-up run).

        ``print(profile.table())`` shows every kernel with its operators, layout, time, share
        and GFLOP/s; ``profile.by_workload(kernels)`` gives each partition's time in the model.
        """
        if self._not_here is not None:
            raise RuntimeError(self._not_here)
        vm = self._new_vm()  # the instrument stays on this VM only
        inputs = self._to_device(self._checked(self._bound(arrays, feeds)))
        sync = None if _on_this_cpu(self.device) else self.device.sync
        return profile_vm(vm, inputs, repeat=repeat, sync=sync).with_info(self.kernel_info())


def kernel_info_from_json(entries: Mapping[str, Any]) -> dict[str, KernelInfo]:
    """:meth:`RunnableModel.kernel_info` from its JSON form (:func:`kernel_info_to_json`)."""
    return {name: KernelInfo(str(e["kind"]), tuple(e["ops"]), str(e["layout"]), float(e["flops"]), int(e["bytes"]),
                             str(e.get("digest", "")), str(e.get("tuning", "")))
            for name, e in entries.items()}


def kernel_info_to_json(info: Mapping[str, KernelInfo]) -> dict[str, dict]:
    """:meth:`RunnableModel.kernel_info` as JSON-ready dicts."""
    return {name: {"kind": k.kind, "ops": list(k.ops), "layout": k.layout, "flops": k.flops, "bytes": k.bytes,
                   "digest": k.digest, "tuning": k.tuning} for name, k in info.items()}
