"""The ``alt-tvm`` command: ``alt-tvm {tune,build,bench,profile,dse} ...`` (``alt-tvm CMD -h`` for each)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

COMMANDS = {
    "tune": ("alt_tvm.cli.tune", "tune a model's layouts and loops, write the tuning log"),
    "build": ("alt_tvm.cli.build", "build a model (with a tuning log) into an artifact alt_tvm.load runs"),
    "bench": ("alt_tvm.cli.bench", "time a model beside ONNX Runtime, OpenVINO, PyTorch, TVM; or two builds"),
    "profile": ("alt_tvm.cli.profile", "per-kernel times of a model or artifact inside whole runs"),
    "dse": ("alt_tvm.cli.dse", "tensor-train design-space exploration of one FC layer"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; returns the exit status."""
    import importlib

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        lines = [f"  {name:8s} {about}" for name, (_, about) in COMMANDS.items()]
        print("usage: alt-tvm {" + ",".join(COMMANDS) + "} ...\n\ncommands:\n" + "\n".join(lines))
        return 0 if args else 2
    if args[0] not in COMMANDS:
        print(f"alt-tvm: unknown command {args[0]!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[args[0]][0])
    return int(module.main(args[1:]) or 0)
