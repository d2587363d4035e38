"""This machine's instruction-set features, and which of a list it lacks, without TVM.

Code built for an x86 CPU runs on a machine that has every instruction-set feature LLVM
enabled for that CPU. The build side (:mod:`alt_tvm.target`) asks LLVM for the list; an
artifact keeps it, so loading one compares the list with ``/proc/cpuinfo`` here and needs no
compiler. LLVM and cpuinfo spell most features alike once ``_`` and ``.`` are dropped
(``avx512vnni`` / ``avx512_vnni``, ``sse4.1`` / ``sse4_1``); :func:`isa_flag` maps the rest.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CPUINFO", "X86_MACHINES", "cpu_flags", "is_x86", "isa_flag", "machine_flags", "missing_features",
           "normalized"]

CPUINFO = Path("/proc/cpuinfo")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")

#: LLVM x86 feature -> cpuinfo flag, where the two spell it differently (both normalized).
_RENAMED = {"sse3": "pni", "bmi": "bmi1", "lzcnt": "abm"}
#: LLVM features that are instruction sets (the rest are tuning hints such as ``fast-...``).
_ISA_PREFIXES = ("avx", "amx", "sse", "fma", "f16c")
_ISA_SCALAR = ("bmi", "bmi2", "lzcnt", "popcnt", "movbe")


def normalized(flag: str) -> str:
    """A feature name without ``_``, ``.`` and ``-``, so LLVM's and cpuinfo's spellings meet."""
    return flag.replace("_", "").replace(".", "").replace("-", "")


def isa_flag(feature: str) -> str | None:
    """The (normalized) cpuinfo flag a machine must show to run code that LLVM x86 feature
    ``feature`` allows; None for tuning hints and for features alt-tvm's code does not use."""
    if feature in _RENAMED:
        return _RENAMED[feature]
    if feature.startswith(_ISA_PREFIXES) or feature in _ISA_SCALAR:
        return normalized(feature)
    return None


def cpu_flags(cpuinfo_path: Path | str = CPUINFO) -> set[str]:
    """ISA feature flags of the first CPU (x86 ``flags``, Arm ``Features``, RISC-V ``isa``) as
    cpuinfo spells them; empty where the file cannot be read."""
    try:
        text = Path(cpuinfo_path).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features"):
            return set(value.split())
        if key == "isa":
            # e.g. "rv64imafdcv_zba_zbb": single-letter base extensions, then "_z..." ones.
            base, *rest = value.strip().split("_")
            letters = set(re.sub(r"^rv\d+", "", base))
            return letters | set(rest)
    return set()


def machine_flags(cpuinfo_path: Path | str = CPUINFO) -> set[str]:
    """This machine's cpuinfo flags, :func:`normalized`."""
    return {normalized(flag) for flag in cpu_flags(cpuinfo_path)}


def missing_features(features: Iterable[str], have: set[str]) -> list[str]:
    """The LLVM x86 ``features`` (instruction sets; hints are ignored) whose cpuinfo flag is
    not among the normalized flags ``have``, sorted."""
    return sorted(f for f in set(features) if (flag := isa_flag(f)) is not None and flag not in have)


def is_x86() -> bool:
    """Whether this machine is x86."""
    return platform.machine().lower() in X86_MACHINES
