"""An emulated ARM board behind a TVM RPC tracker: TVM's RPC server run by qemu-user.

``.ci/prepare-board.sh`` prepares the board once (an aarch64 Debian root with Python, NumPy and
the aarch64 TVM wheel, in ``$ALT_TVM_BOARD_CACHE`` or ``~/.cache/alt-tvm/boards``); this module
starts its RPC server, registered with a tracker under a key, as a real board's would be::

    python -m alt_tvm.emulated_board                  # its own tracker on 127.0.0.1
    python -m alt_tvm.emulated_board --tracker 127.0.0.1:9190 --key emulated-arm64

Build for it with ``--target emulated-arm64`` (a Cortex-A72; qemu emulates exactly that CPU, so
code for a later one traps). What runs there runs as on an A72: its numerics are the board's.
Its timings measure the emulator, not an A72, and say nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from alt_tvm.rpc import free_port, kill_group, parse_address, tracker_problem

__all__ = ["BOARD_NAME", "EmulatedBoard", "board_cache", "board_problem", "board_python", "start_emulated_board"]

#: The alt_tvm.target board the emulated server runs code for, and its default RPC key.
BOARD_NAME = "emulated-arm64"
CACHE_ENV = "ALT_TVM_BOARD_CACHE"


def board_cache() -> Path:
    """Where ``.ci/prepare-board.sh`` keeps the boards (``$ALT_TVM_BOARD_CACHE`` or
    ``~/.cache/alt-tvm/boards``)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "alt-tvm" / "boards"


def board_python(*, cache: str | os.PathLike | None = None) -> Path:
    """The host command that runs the board's aarch64 Python under qemu-user.

    Raises
    ------
    FileNotFoundError
        Naming the directory and the script that prepares it, when the board is not prepared.
    """
    directory = (Path(cache) if cache is not None else board_cache()) / "arm64"
    wrapper = directory / "python"
    if not (directory / "READY").is_file() or not os.access(wrapper, os.X_OK):
        raise FileNotFoundError(f"no emulated arm64 board prepared in {directory}: run .ci/prepare-board.sh "
                                f"(as root, with network access; {CACHE_ENV} moves the cache)")
    return wrapper


def board_problem(*, cache: str | os.PathLike | None = None) -> str | None:
    """Why the emulated board cannot be started here (None: it can)."""
    try:
        board_python(cache=cache)
    except FileNotFoundError as err:
        return str(err)
    return None


@dataclass
class EmulatedBoard:
    """A running emulated board: its RPC server registered as ``key`` at ``tracker``.

    ``close()`` (or leaving a ``with`` block) stops the server, and the tracker when this
    board started it.
    """

    tracker: str
    key: str
    server: subprocess.Popen
    log_path: Path
    own_tracker: subprocess.Popen | None = None
    _log_dir: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def tracker_host(self) -> str:
        return parse_address(self.tracker)[0]

    @property
    def tracker_port(self) -> int:
        return parse_address(self.tracker)[1]

    def log(self) -> str:
        """What the board's server printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the server (and the tracker this board started)."""
        for proc in (self.server, self.own_tracker):
            if proc is not None:
                kill_group(proc)
        if self._log_dir is not None:
            self._log_dir.cleanup()
            self._log_dir = None

    def __enter__(self) -> EmulatedBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_emulated_board(*, tracker: str | None = None, key: str = BOARD_NAME, threads: int = 2,
                         wait_s: float = 240.0, cache: str | os.PathLike | None = None) -> EmulatedBoard:
    """Start the emulated board's RPC server and wait until it registered with the tracker.

    Parameters
    ----------
    tracker
        ``"host:port"`` of a running TVM RPC tracker; default: start one on 127.0.0.1 (a free port).
    key
        The device key the server registers under.
    threads
        TVM threads on the board (``TVM_NUM_THREADS``; the board's cores).
    wait_s
        Seconds to wait for the registration (the emulated ``import tvm`` alone takes 10-20 s).
    cache
        The boards' cache directory (default :func:`board_cache`).

    Raises
    ------
    FileNotFoundError
        When the board is not prepared (see :func:`board_python`).
    ValueError
        For a bad ``tracker``, ``key``, ``threads`` or ``wait_s``, naming the value.
    RuntimeError
        When the server does not register within ``wait_s`` or exits; with the end of its output.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty str, got {key!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s > 0:
        raise ValueError(f"wait_s must be a number > 0, got {wait_s!r}")
    python = board_python(cache=cache)
    # The children run in a fresh directory: `-m` puts the working directory first on sys.path.
    log_dir = tempfile.TemporaryDirectory(prefix="alt_tvm_board_")
    log_path = Path(log_dir.name) / "server.log"
    own_tracker = None
    if tracker is None:
        port = free_port()
        tracker = f"127.0.0.1:{port}"
        own_tracker = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
             "--port-end", str(port + 1), "--silent"],
            cwd=log_dir.name, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host, port = parse_address(tracker, what="tracker")
    server_port = free_port()
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [str(python), "-m", "tvm.exec.rpc_server", "--tracker", tracker, "--key", key, "--host", "127.0.0.1",
             "--port", str(server_port), "--port-end", str(server_port + 1)],
            cwd=log_dir.name, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "TVM_NUM_THREADS": str(threads)})
    board = EmulatedBoard(tracker=tracker, key=key, server=server, log_path=log_path, own_tracker=own_tracker,
                          _log_dir=log_dir)
    try:
        deadline = time.monotonic() + wait_s
        while (problem := tracker_problem(host, port, key, timeout_s=2.0)) is not None:
            exited = server.poll() is not None or (own_tracker is not None and own_tracker.poll() is not None)
            if exited or time.monotonic() > deadline:
                tail = "\n".join(board.log().strip().splitlines()[-8:])
                why = "exited" if exited else f"did not register within {wait_s:g} s"
                raise RuntimeError(f"the emulated board's RPC server {why}: {problem}\n{tail}".rstrip())
            time.sleep(1.0)
    except BaseException:
        board.close()
        raise
    return board


def main(argv: list[str] | None = None) -> int:
    """Start the emulated board and keep it running until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m alt_tvm.emulated_board", description=__doc__.split("\n")[0])
    parser.add_argument("--tracker", default=None, help="host:port of a running tracker (default: start one)")
    parser.add_argument("--key", default=BOARD_NAME, help=f"RPC key (default {BOARD_NAME})")
    parser.add_argument("--threads", type=int, default=2, help="TVM threads on the board (default 2)")
    args = parser.parse_args(argv)
    try:
        board = start_emulated_board(tracker=args.tracker, key=args.key, threads=args.threads)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        parser.exit(2, f"{parser.prog}: {err}\n")
    # SIGTERM ends it as Ctrl-C does: the server and tracker run in process groups of their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"emulated board {args.key!r} registered at tracker {board.tracker} (Ctrl-C stops it)", flush=True)
    try:
        while board.server.poll() is None:
            time.sleep(1.0)
        print(f"the board's server exited:\n{board.log()[-2000:]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        board.close()


if __name__ == "__main__":
    sys.exit(main())
