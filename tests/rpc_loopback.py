"""A real TVM RPC tracker and servers on loopback, for tests of the tuner's runner and of remote models."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from alt_tvm.rpc import free_port, kill_group, tracker_problem


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    # Own session = own process group: the server's popen_worker children die with it.
    return subprocess.Popen([sys.executable, "-m", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=None if env is None else {**os.environ, **env})


@dataclass
class Loopback:
    """A tracker at ``host:port`` with servers registered under ``key``."""

    host: str
    port: int
    key: str
    tracker: subprocess.Popen
    servers: list[subprocess.Popen] = field(default_factory=list)
    #: each server's ``host:port``, as the tracker hands it out (a record's ``board``)
    boards: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        for proc in [*self.servers, self.tracker]:
            kill_group(proc)


def start_loopback(*, servers: int = 1, wait_s: float = 90.0, server_threads: int | None = None) -> Loopback:
    """Start a tracker and ``servers`` RPC servers on 127.0.0.1; returns once a server registered.

    ``server_threads`` sets the servers' ``TVM_NUM_THREADS`` (default: inherited).

    Raises ``RuntimeError`` (after stopping them) when none registers within ``wait_s``.
    """
    port, key = free_port(), f"alt-tvm-test-{os.getpid()}"
    server_env = None if server_threads is None else {"TVM_NUM_THREADS": str(server_threads)}
    loop = Loopback("127.0.0.1", port, key, _start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port",
                                                    str(port), "--port-end", str(port + 1), "--silent"]))
    try:
        for _ in range(servers):
            server_port = free_port()
            loop.boards.append(f"127.0.0.1:{server_port}")
            loop.servers.append(_start(["tvm.exec.rpc_server", "--tracker", loop.address, "--key", key,
                                        "--host", "127.0.0.1", "--port", str(server_port), "--port-end",
                                        str(server_port + 1), "--silent"],
                                       env=server_env))
        deadline = time.monotonic() + wait_s
        while (problem := tracker_problem(loop.host, port, key, timeout_s=2)) is not None:
            if time.monotonic() > deadline or any(p.poll() is not None for p in [loop.tracker, *loop.servers]):
                raise RuntimeError(f"RPC server did not register: {problem}")
            time.sleep(0.5)
    except BaseException:
        loop.close()
        raise
    return loop
