"""Running an artifact on a board reached through TVM's RPC tracker.

The library is uploaded to one server registered under the key, loaded into a Relax VM
there, and every call (inputs copied over, the run, ``time_evaluator``) happens on the
board. Each remote call has a time limit: a board that dies or hangs gives a
``ConnectionError``/``TimeoutError`` naming the call, never a hung caller. The tracker
is checked as the tuner checks it (:func:`alt_tvm.rpc.tracker_problem`).
"""

from __future__ import annotations

import gc
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from alt_tvm.rpc import call_with_timeout, format_exception, parse_address, tracker_problem

from .artifact import LIBRARY, LoadedModel
from .profile import KernelProfile

__all__ = ["RemoteModel"]

LOGGER = logging.getLogger("alt_tvm")


class RemoteModel(LoadedModel):
    """An artifact loaded on a remote board: call and ``time`` it as a local model.

    Made by ``alt_tvm.load(path, remote="host:port", key=...)``. ``time`` measures on the
    board (``time_evaluator`` runs there; the RPC round trip is not in the numbers).
    ``profile`` is local only: the VM's per-kernel instrument is a Python callback, which
    cannot cross the RPC boundary.
    """

    def __init__(self, executable: Any, metadata: Mapping[str, Any], path: Path, *, session: Any, vm: Any,
                 address: str, key: str, timeout_s: float) -> None:
        super().__init__(executable, metadata, path, device=session.cpu(0))
        self.session = session
        self._vm = vm
        self._session_lock = threading.Lock()  # one RPC session: one call at a time
        self.address, self.key, self.timeout_s = address, key, float(timeout_s)
        self._lost: str | None = None  # why the session is unusable after a failed call

    @classmethod
    def connect(cls, path: Path, metadata: Mapping[str, Any], *, remote: str, key: str, timeout_s: float,
                connect_timeout_s: float) -> RemoteModel:
        """Upload the artifact's library to a board with ``key`` and load it there."""
        host_name, port = parse_address(remote, what="remote")
        for name, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        problem = tracker_problem(host_name, port, key, timeout_s=connect_timeout_s)
        if problem is not None:
            raise ConnectionError(problem)
        phase = ["requesting a session"]

        def open_session() -> tuple[Any, Any, Any, int]:
            tracker = tvm.rpc.connect_tracker(host_name, port)
            try:
                session = tracker.request(key, priority=1, max_retry=1)
            finally:
                tracker.close()
            phase[0] = "uploading the library"
            name = f"alt_tvm_model_{uuid.uuid4().hex}.so"
            session.upload(str(path / LIBRARY), name)
            phase[0] = "loading the library"
            module = session.load_module(name)
            vm = relax.VirtualMachine(module, session.cpu(0))
            phase[0] = "asking the server's thread count"
            threads = int(session.get_function("runtime.NumThreads")())
            return session, module, vm, threads

        outcome = call_with_timeout(open_session, timeout_s)
        where = f"board {key!r} at tracker {remote}"
        if outcome[0] == "timeout":
            if phase[0] == "requesting a session":
                raise TimeoutError(f"{where}: no free server within {timeout_s:g} s (a server runs one session "
                                   f"at a time; close() other models loaded on it)")
            raise TimeoutError(f"{where}: {phase[0]} exceeded the {timeout_s:g} s limit")
        if outcome[0] == "error":
            raise ConnectionError(f"{where}: {phase[0]} failed: {format_exception(outcome[1])}")
        session, module, vm, threads = outcome[1]
        cores = int(metadata["target"]["num_cores"])
        if threads < cores:
            # TVM's pool defaults to half the logical CPUs on x86 and cannot grow once started.
            LOGGER.warning("%s: the server's TVM runs %d thread(s), the model was built for %d cores: start "
                           "the server with TVM_NUM_THREADS=%d", where, threads, cores, cores)
        return cls(module, metadata, path, session=session, vm=vm, address=remote, key=key, timeout_s=timeout_s)

    @property
    def vm(self) -> Any:
        """The VM on the board (one for the session; calls from several threads take turns)."""
        return self._vm

    def _new_vm(self) -> Any:
        return self._vm

    def _time_main(self, args: list, *, number: int, repeat: int) -> list[float]:
        timer = self.vm.time_evaluator("main", self.device, number=number, repeat=repeat)
        return list(timer(*args).results)

    def _invoke(self, call: Callable[[], Any], what: str) -> Any:
        with self._session_lock:
            return self._invoke_alone(call, what)

    def _invoke_alone(self, call: Callable[[], Any], what: str) -> Any:
        where = f"board {self.key!r} at tracker {self.address}"
        if self._lost is not None:
            raise ConnectionError(f"{where}: the session was lost ({self._lost}); load the model again")
        outcome = call_with_timeout(call, self.timeout_s)
        if outcome[0] == "ok":
            return outcome[1]
        if outcome[0] == "timeout":
            self._lost = f"{what} exceeded the {self.timeout_s:g} s limit"
            raise TimeoutError(f"{where}: {self._lost}; the board may have died or hung")
        self._lost = f"{what} failed: {format_exception(outcome[1])}"
        raise ConnectionError(f"{where}: {self._lost}")

    def _run_main(self, args: list) -> Any:
        # A tuple result would come back as an opaque remote object: fetch the outputs one by one.
        self.vm.set_input("main", *args)
        self.vm.invoke_stateful("main")
        return self.vm.get_outputs("main")

    def profile(self, *arrays: Any, repeat: int = 5) -> KernelProfile:
        """Refused, always: the per-kernel instrument is a Python callback of the Relax VM, and a
        VM on the board cannot call back into this process. Profile on the board itself, or
        time the whole model here with :meth:`time`.

        Raises
        ------
        RuntimeError
            Naming both alternatives.
        """
        raise RuntimeError("per-kernel profiling needs the VM's Python instrument, which does not cross "
                           "RPC: profile on the board (alt_tvm.load there, then .profile), or time the "
                           "whole model with .time")

    def close(self) -> None:
        """End the session (the server frees the board)."""
        # A remote device keeps its session alive too (``device._rpc_sess``).
        self._vm = self.executable = self.session = self.device = None
        self._lost = "closed"
        gc.collect()  # remote objects left in reference cycles (timers, tracebacks) would hold the session open

    def __enter__(self) -> RemoteModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
