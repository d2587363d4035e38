"""TVM's C++ log lines routed through Python ``logging``.

TVM's runtime and code generators write warnings straight to the process's stderr
(``Warning: Unknown pragma pragma_scope`` for every parallel loop at codegen, one
``Scope Loaded`` line per kernel when a VM loads): a normal build would print hundreds.
Around those calls, file descriptor 2 is sent to a temporary file; afterwards each of
TVM's lines goes to the ``alt_tvm.tvm`` logger at DEBUG level, and any other line
(a Python warning, a message from elsewhere) is written back to stderr unchanged.
With that logger enabled for DEBUG (``alt-tvm ... --verbose``) nothing is redirected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

__all__ = ["LOGGER", "tvm_output_to_log"]

#: Where TVM's own log lines go.
LOGGER = logging.getLogger("alt_tvm.tvm")

# TVM's LOG(...) prefix: "[hh:mm:ss] path/file.cc:123: ..."
_TVM_LINE = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] \S+:\d+: ")
_LOCK = threading.Lock()  # fd 2 is one per process: one redirection at a time


@contextlib.contextmanager
def tvm_output_to_log() -> Iterator[None]:
    """Route what TVM writes to stderr inside the block to :data:`LOGGER` (see the module doc)."""
    if LOGGER.isEnabledFor(logging.DEBUG) or not _LOCK.acquire(blocking=False):
        yield  # verbose, or already redirected by an enclosing block
        return
    try:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no usable fd 2 (an embedding host): leave output alone
            yield
            return
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                _forward(sink.read().decode(errors="replace"))
    finally:
        _LOCK.release()


def _forward(text: str) -> None:
    others = []
    for line in text.splitlines():
        if _TVM_LINE.match(line):
            LOGGER.debug(line)
        elif line.strip():
            others.append(line)
    if others:
        sys.stderr.write("\n".join(others) + "\n")
