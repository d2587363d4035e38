"""The gcc that links compiled code for a target, and what machine a linked library is for.

A leaf: the tuner's builder (one kernel per library) and model export (a whole model per
library) both link with it, so a missing cross compiler is reported the same way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from functools import cache

__all__ = ["ELF_MACHINES", "CrossCompilerNotFoundError", "cross_compiler_problem", "elf_machine",
           "require_cross_compiler"]


class CrossCompilerNotFoundError(RuntimeError):
    """The gcc needed to link code for a board is not installed (the message says how)."""


# Debian packages providing a cross gcc and the C library it links shared objects against.
_DEBIAN_LIBC = {"aarch64-linux-gnu": "libc6-dev-arm64-cross", "riscv64-linux-gnu": "libc6-dev-riscv64-cross",
                "arm-linux-gnueabihf": "libc6-dev-armhf-cross"}

#: ELF ``e_machine`` -> the architecture name ``platform.machine()`` gives on it.
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0xF3: "riscv64", 0x28: "arm"}


def _debian_packages(compiler: str) -> str:
    triple = compiler[: -len("-gcc")] if compiler.endswith("-gcc") else compiler
    return " ".join(p for p in (f"gcc-{triple}", _DEBIAN_LIBC.get(triple)) if p)


@cache
def cross_compiler_problem(compiler: str) -> str | None:
    """Why ``compiler`` cannot link a shared object here (``None``: it can)."""
    if shutil.which(compiler) is None:
        return f"cross compiler {compiler!r} is not installed"
    with tempfile.TemporaryDirectory(prefix="alt_tvm_cc_") as tmp:
        probe = subprocess.run(
            [compiler, "-x", "c", "-shared", "-fPIC", "-o", os.path.join(tmp, "probe.so"), "-"],
            input=b"int alt_tvm_probe(void) { return 0; }\n", capture_output=True, timeout=60,
        )
    if probe.returncode != 0:
        detail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        return f"cross compiler {compiler!r} cannot link a shared object ({detail[0]})"
    return None


def require_cross_compiler(compiler: str, *, purpose: str) -> None:
    """Raise :class:`CrossCompilerNotFoundError` saying how to install ``compiler`` if it cannot link.

    ``purpose`` completes the message (e.g. "links kernels for target 'kirin990'").
    """
    problem = cross_compiler_problem(compiler)
    if problem:
        raise CrossCompilerNotFoundError(
            f"{problem}; it {purpose}. On Debian/Ubuntu install it with "
            f"`apt-get install {_debian_packages(compiler)}` (or run .ci/install-cross.sh)")


def elf_machine(path: str | os.PathLike | None) -> str | None:
    """The architecture an ELF file is for (``"x86_64"``, ``"aarch64"``, ...); None: not ELF or unreadable."""
    try:
        with open(path or "", "rb") as file:
            header = file.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    code = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return ELF_MACHINES.get(code, f"elf-machine-{code:#x}")


def export_library(executable: object, path: str | os.PathLike, *, cross_compiler: str | None,
                   addons: list[str | os.PathLike] = ()) -> None:
    """Link ``tvm.compile``'s result and the object files ``addons`` into the shared library ``path``
    (with ``cross_compiler`` for a board)."""
    extra = [os.fspath(a) for a in addons] or None
    if cross_compiler:
        from tvm.support import cc

        executable.export_library(os.fspath(path), fcompile=cc.cross_compiler(cross_compiler), addons=extra)
    else:
        executable.export_library(os.fspath(path), addons=extra)
