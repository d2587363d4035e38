"""Which target a builder builds for and which gcc links its kernels (a cross gcc for a foreign board).

Kept apart from the builder: it is the only part of measuring that depends on the
machine's installed toolchains.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import Any

import tvm

from alt_tvm.target import HardwareTarget, board
from alt_tvm.toolchain import CrossCompilerNotFoundError

__all__ = ["CrossCompilerNotFoundError"]


def _resolve_target(target: Any, cross_compiler: str | None) -> tuple[tvm.target.Target, str | None, str]:
    """(Target, the gcc that links for it or None for the host's, a name for messages)."""
    if isinstance(target, str):
        target = board(target)
    if isinstance(target, HardwareTarget):
        name, board_cc, target = target.name, target.cross_compiler, target.to_tvm()
    else:
        if isinstance(target, Mapping):
            target = tvm.target.Target(dict(target))
        if not isinstance(target, tvm.target.Target):
            raise TypeError(
                "target must be a board name, an alt_tvm.target.HardwareTarget, a tvm.target.Target or a "
                f"target dict, got {type(target).__name__}"
            )
        name, board_cc = target.kind.name, None
    if cross_compiler is not None:
        if not isinstance(cross_compiler, str) or not cross_compiler:
            raise TypeError(f"cross_compiler must be a non-empty str, got {cross_compiler!r}")
        return target, cross_compiler, name
    arch = _foreign_arch(target)
    if arch is None:
        return target, None, name  # also a board of this machine's architecture: the native gcc links
    return target, board_cc or _default_cross_compiler(arch), name


def _foreign_arch(target: tvm.target.Target) -> str | None:
    """The architecture of an LLVM target's triple if it is not this machine's, else ``None``."""
    if target.kind.name != "llvm":
        return None  # device targets export with the host compiler (their host is llvm)
    arch = str(target.attrs.get("mtriple", "") or "").split("-")[0]
    host_arch = platform.machine().lower()
    if not arch or arch == host_arch or (arch, host_arch) in {("x86_64", "amd64"), ("arm64", "aarch64")}:
        return None
    return arch


def _default_cross_compiler(arch: str) -> str:
    if arch in ("aarch64", "arm64"):
        return "aarch64-linux-gnu-gcc"
    if arch.startswith("riscv64"):
        return "riscv64-linux-gnu-gcc"
    raise ValueError(f"targets for {arch!r} need a cross compiler: pass cross_compiler='<gcc driver>'")
