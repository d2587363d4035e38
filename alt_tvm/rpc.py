"""Reaching boards through TVM's RPC tracker: addresses, the tracker check, calls with a time limit.

Shared by the tuner's RPC runner (one kernel per session) and deployment (a whole model
per session), so both fail the same way when a tracker or board cannot be reached.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["call_with_timeout", "count_servers", "format_exception", "free_port", "kill_group", "parse_address",
           "request_session", "tracker_problem"]


def parse_address(text: Any, *, what: str = "tracker") -> tuple[str, int]:
    """``"host:port"`` as (host, port).

    Raises
    ------
    ValueError
        Naming ``text`` when it is not ``host:port`` with a port in 1..65535.
    """
    host, _, port = str(text).rpartition(":") if isinstance(text, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be host:port with a port in 1..65535, got {text!r}")
    return host, int(port)


def format_exception(err: BaseException) -> str:
    """An exception as one line: its type and the last line of its message (TVM's are long)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1].strip() if lines else ''}".rstrip(": ")


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[str, Any]:
    """``("ok", value)``, ``("error", exception)`` or ``("timeout", None)``.

    ``fn`` runs in a daemon thread: a call that hangs (a board that stopped answering)
    is abandoned there rather than blocking the caller.
    """
    box: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            box.append(("ok", fn()))
        except Exception as err:  # noqa: BLE001 - reported to the caller
            box.append(("error", err))

    thread = threading.Thread(target=target, name="alt_tvm_rpc", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else ("timeout", None)


def _summary(host: str, port: int) -> dict:
    import tvm  # here, so parsing an address imports no TVM

    tracker = tvm.rpc.connect_tracker(host, port)
    try:
        return tracker.summary()
    finally:
        tracker.close()


def tracker_problem(host: str, port: int, key: str, *, timeout_s: float = 5.0) -> str | None:
    """Why the tracker at ``host:port`` cannot hand out a server for ``key`` now (None: it can).

    Checks that the tracker accepts connections within ``timeout_s`` (TVM's own client
    retries a refused connection for a minute) and that a server with ``key`` registered.
    """
    address = f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return f"cannot reach tracker {address}: {err}"
    outcome = call_with_timeout(lambda: _summary(host, port), timeout_s)
    if outcome[0] != "ok":
        why = format_exception(outcome[1]) if outcome[0] == "error" else f"no answer within {timeout_s:g} s"
        return f"tracker {address} did not answer a summary request: {why}"
    summary = outcome[1]
    keys = set(summary.get("queue_info", {}))
    keys |= {str(s.get("key", "")).split(":", 1)[-1] for s in summary.get("server_info", [])}
    if key not in keys:
        return f"no RPC server with key {key!r} is registered at tracker {address} (registered keys: {sorted(keys)})"
    return None


def _server_keys(summary: dict) -> list[str]:
    """The key of every server registered in a tracker summary (``"server:kirin"`` -> ``"kirin"``)."""
    return [str(s.get("key", "")).split(":", 1)[-1] for s in summary.get("server_info", [])]


def count_servers(host: str, port: int, key: str, *, timeout_s: float = 5.0) -> int:
    """How many RPC servers with ``key`` the tracker at ``host:port`` holds, free or busy.

    Raises
    ------
    ConnectionError
        If the tracker does not answer within ``timeout_s``.
    """
    outcome = call_with_timeout(lambda: _summary(host, port), timeout_s)
    if outcome[0] != "ok":
        why = format_exception(outcome[1]) if outcome[0] == "error" else f"no answer within {timeout_s:g} s"
        raise ConnectionError(f"tracker {host}:{port} did not answer a summary request: {why}")
    return sum(k == key for k in _server_keys(outcome[1]))


def request_session(host: str, port: int, key: str, *, session_timeout: float = 0.0,
                    priority: int = 1) -> tuple[Any, str]:
    """A session on a free server with ``key``, and that server's ``host:port`` as the tracker gave it.

    TVM's ``TrackerSession.request`` does the same but does not say which server it
    connected to; a fleet's measurements are counted per server, so this asks the tracker
    itself (one request, no retry: the caller's time limit governs).

    Raises
    ------
    RuntimeError
        If the tracker refuses the request.
    OSError
        If the tracker or the server cannot be reached.
    """
    import tvm
    from tvm.rpc import base

    sock = socket.create_connection((host, port))
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", base.recvall(sock, 4))[0]
        if magic != base.RPC_TRACKER_MAGIC:
            raise RuntimeError(f"{host}:{port} is not an RPC tracker")
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", priority])
        value = base.recvjson(sock)
    finally:
        sock.close()
    if value[0] != base.TrackerCode.SUCCESS:
        raise RuntimeError(f"tracker {host}:{port} refused a session for key {key!r}: {value!r}")
    url, server_port, match_key = value[1]
    return tvm.rpc.connect(url, server_port, match_key, session_timeout), f"{url}:{server_port}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a local tracker or server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group and reap it: a process started with
    ``start_new_session=True`` leads its own group, so an RPC server's popen workers go with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
