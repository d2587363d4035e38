"""``alt_tvm.load``: an artifact as a runnable model, in this process or on a board."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .artifact import load_local, read_metadata
from .model import RunnableModel

__all__ = ["load"]


def load(path: str | os.PathLike, *, device: Any = None, remote: str | None = None, key: str | None = None,
         check_cpu: bool = True, timeout_s: float | None = None,
         connect_timeout_s: float | None = None) -> RunnableModel:
    """Load an artifact written by ``CompiledModel.export`` (or ``alt-tvm build -o``) without rebuilding.

    Parameters
    ----------
    path
        The artifact directory.
    device
        Local device to run on (default ``tvm.cpu()``); not with ``remote``.
    remote, key
        ``"host:port"`` of a TVM RPC tracker and the device key a board registered with
        (``python -m tvm.exec.rpc_server --tracker host:port --key KEY`` on the board):
        the library is uploaded to one of those boards and the model runs and is timed
        there (see :class:`alt_tvm.deploy.remote.RemoteModel`).
    check_cpu
        Local only: refuse (True, default) code that uses instruction-set features this
        machine lacks (AVX-512 code on an AVX2 machine).
    timeout_s
        Remote only: the limit in seconds for each upload, load, run or timing call
        (default 60).
    connect_timeout_s
        Remote only: the limit in seconds for reaching the tracker (default 5).

    Raises
    ------
    ArtifactError
        The artifact is missing, incomplete, corrupt, of another format or TVM version, or
        (locally) built for another machine.
    ConnectionError
        Remote only: the tracker or a board with ``key`` cannot be reached.
    """
    if remote is not None or key is not None:
        if remote is None or key is None:
            raise ValueError(f"remote and key go together, got remote={remote!r}, key={key!r}")
        local_only = {"device": device is not None, "check_cpu": check_cpu is not True}
        if any(local_only.values()):
            raise ValueError(f"{[k for k, v in local_only.items() if v]} apply to a local run, not to a remote one")
        from .remote import RemoteModel  # TVM's RPC client: imported for a remote run only

        return RemoteModel.connect(Path(path), read_metadata(path), remote=remote, key=key,
                                   timeout_s=60.0 if timeout_s is None else timeout_s,
                                   connect_timeout_s=5.0 if connect_timeout_s is None else connect_timeout_s)
    remote_only = {"timeout_s": timeout_s is not None, "connect_timeout_s": connect_timeout_s is not None}
    if any(remote_only.values()):
        raise ValueError(f"{[k for k, v in remote_only.items() if v]} apply to a remote run (remote=, key=) only")
    return load_local(path, device=device, check_cpu=check_cpu)
