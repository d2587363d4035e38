"""Hardware descriptions: the host CPU (detected) and a few boards (as data).

A :class:`HardwareTarget` carries what the strategies need beyond TVM's own target: core
count, SIMD width and register count (micro-kernel sizing), and cache sizes (analytic tiling,
e.g. SConv's CSA). ``tvm_target`` is the JSON-style dict that ``tvm.target.Target(dict)``
accepts in TVM 0.27 (string targets such as ``"llvm -mcpu=..."`` are gone).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tvm

from alt_tvm.facts import DECLARED_FMA_CHAINS, issue_facts
from alt_tvm.isa import CPUINFO as _CPUINFO
from alt_tvm.isa import X86_MACHINES as _X86
from alt_tvm.isa import cpu_flags, isa_flag, machine_flags, missing_features, normalized

__all__ = [
    "BOARDS",
    "HOST_CPU_ENV",
    "HardwareTarget",
    "board",
    "describe_cpu",
    "detect_host",
    "host",
    "isa_features",
    "known_boards",
    "parse_cache_size",
    "process_cores",
    "resolve",
    "runs_on_host",
]

KIB = 1024
MIB = 1024 * KIB

_SYS_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")

# Used when /sys or /proc cannot be read (containers, non-Linux): typical of recent x86/Arm.
_DEFAULT_L1D = 32 * KIB
_DEFAULT_L2 = 1 * MIB
_DEFAULT_L3 = 0
_DEFAULT_LINE = 64


@dataclass(frozen=True)
class HardwareTarget:
    """One machine a kernel can be built for.

    Attributes
    ----------
    name, description : str
        Short key (``"host"``, ``"kirin990"`` ...) and a human-readable line.
    tvm_target : dict
        Argument for ``tvm.target.Target``; use :meth:`to_tvm` (it passes a copy).
    num_cores : int
        Cores used for parallel loops (SMs for a GPU).
    vector_bits : int
        SIMD register width in bits (128 for a GPU's ``float4`` loads).
    vector_registers : int
        Architectural SIMD registers (32 for AVX-512/NEON/RVV, 16 for AVX2); 0 where the
        notion does not apply (GPUs).
    l1d_bytes, l2_bytes, l3_bytes : int
        Cache sizes as one core sees them (an instance of a shared cache counts once);
        0 for an absent level.
    cache_line_bytes : int
        Cache line size.
    cross_compiler : str or None
        gcc driver that links shared objects for this target (``None``: host or CUDA).
    half_vectors_full_rate : bool
        Whether an FMA on half a vector register issues at the full rate of lanes (as where
        512-bit operations run as two 256-bit halves) rather than taking a whole vector's
        issue slot. Measured on the host (:mod:`alt_tvm.facts`); declared for boards.
    fma_chains : int
        Independent FMA accumulators that cover the FMA latency (latency x FMA pipes).
        Measured on the host (:mod:`alt_tvm.facts`); declared for boards.
    """

    name: str
    description: str
    tvm_target: dict[str, Any] = field(hash=False)
    num_cores: int
    vector_bits: int
    vector_registers: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cache_line_bytes: int
    cross_compiler: str | None = None
    half_vectors_full_rate: bool = False
    fma_chains: int = DECLARED_FMA_CHAINS

    def __post_init__(self) -> None:
        if isinstance(self.fma_chains, bool) or not isinstance(self.fma_chains, int) or self.fma_chains < 1:
            raise ValueError(f"fma_chains must be an int >= 1, got {self.fma_chains!r}")

    def vector_lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector register (at least 1).

        Raises
        ------
        ValueError
            If ``dtype`` is not a TVM data type string.
        """
        try:
            bits = tvm.runtime.DataType(dtype).bits
        except (ValueError, TypeError) as err:
            raise ValueError(f"unknown dtype {dtype!r}: {err}") from None
        return max(1, self.vector_bits // max(1, bits))

    def to_tvm(self) -> tvm.target.Target:
        """The ``tvm.target.Target`` for this hardware (built from a copy of ``tvm_target``)."""
        return tvm.target.Target(copy.deepcopy(self.tvm_target))


def parse_cache_size(text: str) -> int:
    """Bytes from a sysfs cache size such as ``"32K"``, ``"1024K"``, ``"1M"`` or ``"512"``.

    Raises
    ------
    ValueError
        If ``text`` is not a number with an optional K/M/G suffix.
    """
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"cannot parse cache size {text!r}; expected e.g. '32K', '1M', '512'")
    scale = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}[match.group(2).upper()]
    return int(match.group(1)) * scale


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_caches(cache_dir: Path) -> tuple[dict[int, int], int | None]:
    """Sizes of the data/unified caches by level, and the line size, from sysfs."""
    sizes: dict[int, int] = {}
    line = None
    for index in sorted(cache_dir.glob("index*")) if cache_dir.is_dir() else []:
        level, kind, size = (_read(index / f) for f in ("level", "type", "size"))
        if level is None or kind is None or size is None:
            continue
        # L1 counts only its data half; L2/L3 only when unified (skip instruction caches).
        if kind not in ("Data", "Unified"):
            continue
        try:
            sizes.setdefault(int(level), parse_cache_size(size))
        except ValueError:
            continue
        if line is None:
            text = _read(index / "coherency_line_size")
            line = int(text) if text and text.isdigit() else None
    return sizes, line


def _vector_width(machine: str, flags: set[str]) -> tuple[int, int]:
    """(vector bits, vector registers) from the architecture and its feature flags (cpuinfo
    spelling or LLVM's: the x86 names that decide the width are the same in both)."""
    if machine in _X86:
        if "avx512f" in flags:
            return 512, 32
        if "avx2" in flags or "avx" in flags:
            return 256, 16
        return 128, 16  # SSE2 is baseline on x86-64
    if machine in ("aarch64", "arm64"):
        return 128, 32  # NEON; SVE widths are not used by our kernels
    if machine.startswith("riscv"):
        return 128, 32  # RVV guarantees VLEN >= 128 (Zvl128b); the exact VLEN is not in cpuinfo
    return 128, 16


#: Environment variable naming an LLVM CPU (``haswell``, ``znver3``, ``skylake-avx512`` ...) that
#: :func:`host` describes this machine as: builds, tuning and tests then target that CPU's
#: instruction set, with this machine's cores and caches. The CPU must be one this machine can
#: execute (an AVX2 CPU on an AVX-512 host, not the reverse).
HOST_CPU_ENV = "ALT_TVM_HOST_CPU"


def _llvm_features(tvm_target: Mapping[str, Any]) -> set[str]:
    """The instruction-set features LLVM enables for a CPU target dict (its ``mcpu`` and ``mattr``)."""
    return set(tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(dict(tvm_target))))


def _host_flags() -> set[str]:
    """This machine's cpuinfo feature flags, normalized (LLVM's system CPU's features where
    cpuinfo cannot be read)."""
    flags = machine_flags(_CPUINFO)
    if not flags:
        system = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}
        flags = {normalized(f) for f in _llvm_features(system)}
    return flags


def isa_features(target: HardwareTarget) -> list[str]:
    """The instruction-set features (LLVM's names) that code built for an x86 ``target`` may use,
    sorted; empty for other architectures and for GPUs. An artifact keeps the list, so loading
    it checks this machine against it without a compiler (:mod:`alt_tvm.isa`)."""
    triple = str(target.tvm_target.get("mtriple") or "")
    x86 = triple.split("-")[0] in _X86 if triple else platform.machine().lower() in _X86
    if target.tvm_target.get("kind") != "llvm" or not x86:
        return []
    return sorted(f for f in _llvm_features(target.tvm_target) if isa_flag(f) is not None)


def detect_host(*, cache_dir: Path | str = _SYS_CACHE_DIR, cpuinfo_path: Path | str = _CPUINFO) -> HardwareTarget:
    """Describe the machine this process runs on (uncached; see :func:`host`, which also reads
    :data:`HOST_CPU_ENV`).

    Parameters
    ----------
    cache_dir : path, optional
        sysfs cache directory of CPU 0.
    cpuinfo_path : path, optional
        ``/proc/cpuinfo``.

    Returns
    -------
    HardwareTarget
        ``name="host"``. Missing cache information falls back to 32 KiB L1d, 1 MiB L2, no
        L3, 64-byte lines; a missing cpuinfo to LLVM's vector width for the detected CPU.
    """
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    cores = process_cores()
    sizes, line = _read_caches(Path(cache_dir))
    flags = cpu_flags(cpuinfo_path)
    machine = platform.machine().lower()
    vbits, vregs = _vector_width(machine, flags)
    tvm_target = {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}
    if not flags:
        # No cpuinfo: ask LLVM what the detected CPU's widest vector is.
        llvm_bits = int(tvm.target.codegen.llvm_get_vector_width(tvm.target.Target(tvm_target)))
        if llvm_bits > 0:
            vbits = llvm_bits
            # x86 has 32 vector registers only with AVX-512; Arm and RISC-V always have 32.
            vregs = 16 if machine in _X86 and vbits < 512 else 32
    l1d = sizes.get(1, _DEFAULT_L1D)
    l2 = sizes.get(2, _DEFAULT_L2)
    l3 = sizes.get(3, _DEFAULT_L3)
    full_rate, chains, _ = issue_facts(vector_bits=vbits, mcpu=mcpu, cpuinfo_path=cpuinfo_path)
    return HardwareTarget(
        name="host",
        description=(
            f"host CPU ({mcpu}, {machine}, {cores} cores, {vbits}-bit vectors, "
            f"L1d {l1d // KIB} KiB, L2 {l2 // KIB} KiB, L3 {l3 // KIB} KiB)"
        ),
        tvm_target=tvm_target,
        num_cores=cores,
        vector_bits=vbits,
        vector_registers=vregs,
        l1d_bytes=l1d,
        l2_bytes=l2,
        l3_bytes=l3,
        cache_line_bytes=line or _DEFAULT_LINE,
        cross_compiler=None,
        half_vectors_full_rate=full_rate,
        fma_chains=chains,
    )


def _affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset()


# TVM's thread pool may pin the calling thread to one core once a parallel kernel has run
# (``TVM_BIND_THREADS``), so the mask the process started with is kept.
_AFFINITY_AT_IMPORT = _affinity()


def process_cores() -> int:
    """CPUs this process may run on: its mask when alt-tvm was imported and its threads' masks.

    Not the calling thread's mask alone: once a TVM kernel has run, TVM's thread pool may
    have pinned the main thread to one core and its workers to the others.
    """
    try:
        allowed = set(_AFFINITY_AT_IMPORT) | set(os.sched_getaffinity(0))
        for task in os.listdir("/proc/self/task"):
            try:
                allowed |= os.sched_getaffinity(int(task))
            except OSError:  # the thread ended meanwhile
                continue
        return len(allowed)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def host() -> HardwareTarget:
    """This machine (computed once per process): :func:`detect_host`, or, where the environment
    variable :data:`HOST_CPU_ENV` names an LLVM CPU, :func:`describe_cpu` of that CPU.

    Raises
    ------
    ValueError
        If :data:`HOST_CPU_ENV` names a CPU LLVM does not know or this machine cannot execute.
    """
    detected = detect_host()
    cpu = os.environ.get(HOST_CPU_ENV, "").strip()
    if not cpu or cpu == detected.tvm_target["mcpu"]:
        return detected
    described = describe_cpu(cpu, name="host", base=detected)
    why = not_on_host(described.tvm_target)
    if why is not None:
        raise ValueError(f"{HOST_CPU_ENV}={cpu!r} cannot describe this machine: {why}")
    return described


def describe_cpu(mcpu: str, *, name: str | None = None, base: HardwareTarget | None = None) -> HardwareTarget:
    """A CPU of this machine's architecture as LLVM CPU ``mcpu`` (``"haswell"``: AVX2 and FMA,
    ``"skylake-avx512"``: AVX-512), with ``base``'s cores and caches (default: this machine's).

    The vector width and register count come from the features LLVM enables for ``mcpu``, so a
    build for an AVX2 CPU on an AVX-512 machine uses 8-lane vectors and 16 registers; the code
    runs here wherever this machine has those features (:func:`runs_on_host`).

    Raises
    ------
    ValueError
        If LLVM does not know ``mcpu`` for this architecture.
    """
    base = base if base is not None else detect_host()
    tvm_target = {**base.tvm_target, "mcpu": mcpu}
    if not isinstance(mcpu, str) or not tvm.target.codegen.llvm_is_valid_cpu(
            mcpu, str(tvm_target.get("mtriple") or tvm.target.codegen.llvm_get_system_triple())):
        known = ", ".join(sorted(str(c) for c in tvm.target.codegen.llvm_get_cpu_archlist(base.to_tvm())))
        raise ValueError(f"unknown CPU {mcpu!r} for LLVM on {platform.machine()}; known CPUs: {known}")
    machine = platform.machine().lower()
    vbits, vregs = _vector_width(machine, _llvm_features(tvm_target))
    # Code for a CPU this machine cannot run is not timed here: that CPU's facts are declared.
    full_rate, chains = (issue_facts(vector_bits=vbits, mcpu=mcpu)[:2] if not_on_host(tvm_target) is None
                         else (False, DECLARED_FMA_CHAINS))
    return dataclasses.replace(
        base,
        name=name or f"cpu:{mcpu}",
        description=(f"CPU {mcpu} ({machine}, {base.num_cores} cores, {vbits}-bit vectors, "
                     f"L1d {base.l1d_bytes // KIB} KiB, L2 {base.l2_bytes // KIB} KiB, L3 {base.l3_bytes // KIB} KiB)"),
        tvm_target=tvm_target,
        vector_bits=vbits,
        vector_registers=vregs,
        half_vectors_full_rate=full_rate,
        fma_chains=chains,
    )


def detect_cuda(device_id: int = 0) -> HardwareTarget:
    """The CUDA GPU ``device_id`` of this machine, read off the device by TVM's runtime.

    The architecture (``sm_XY`` from the compute capability), SM count, per-block limits
    and L2 size are the device's; the block shared-memory limit is the one a kernel gets
    without the dynamic opt-in, which TVM's kernels do not request.

    Raises
    ------
    RuntimeError
        If TVM sees no CUDA device ``device_id`` (no GPU, no driver, or a TVM without CUDA).
    """
    dev = tvm.cuda(device_id)
    if not dev.exist:
        raise RuntimeError(f"no CUDA device {device_id}: tvm.cuda({device_id}).exist is False "
                           f"(USE_CUDA={tvm.support.libinfo().get('USE_CUDA')} in this TVM)")
    arch = _sm_arch(dev)
    l2 = int(dev.l2_cache_size_bytes)
    return HardwareTarget(
        name=f"cuda{device_id}",
        description=f"{dev.device_name} ({arch}, {dev.multi_processor_count} SMs), detected",
        tvm_target={
            "kind": "cuda",
            "arch": arch,
            "max_threads_per_block": int(dev.max_threads_per_block),
            "max_num_threads": int(dev.max_threads_per_block),
            "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
            "thread_warp_size": int(dev.warp_size),
            "registers_per_block": 65536,  # every CUDA architecture since Kepler
            "l2_cache_size_bytes": l2,
            "host": {"kind": "llvm"},
        },
        num_cores=int(dev.multi_processor_count),
        vector_bits=128,
        vector_registers=0,
        l1d_bytes=128 * KIB,
        l2_bytes=l2,
        l3_bytes=0,
        cache_line_bytes=128,
    )


def runs_on_host(target: HardwareTarget) -> bool:
    """Whether code built for ``target`` runs on this machine (see :func:`not_on_host`)."""
    return target.cross_compiler is None and not_on_host(target.tvm_target) is None


def _sm_arch(dev: Any) -> str:
    """A CUDA device's architecture as nvcc names it (``sm_90`` for compute capability 9.0)."""
    return "sm_" + str(dev.compute_version).replace(".", "")


def _not_on_this_gpu(arch: str) -> str | None:
    """Why CUDA code for ``arch`` (``sm_XY``) cannot run on this machine's first GPU (None: it can)."""
    dev = tvm.cuda(0)
    if not dev.exist:
        return "it is CUDA code and TVM sees no CUDA device here"
    here = _sm_arch(dev)
    if arch and arch != here:
        return f"it is CUDA code for {arch} and this machine's GPU is {here}"
    return None


def not_on_host(tvm_target: Mapping[str, Any]) -> str | None:
    """Why code built for the target dict ``tvm_target`` cannot run on this machine (None: it can).

    A CPU target runs here when its triple (if any) is for this architecture and this machine
    has the instruction-set features LLVM enables for its ``mcpu`` and ``mattr``: on x86 those
    are checked against this machine's cpuinfo flags, so code for an AVX2 CPU runs on an
    AVX-512 machine and AVX-512 code is refused on an AVX2 one. On other architectures a named
    CPU must be this machine's (LLVM's) or generic.
    """
    if tvm_target.get("kind") == "cuda":
        return _not_on_this_gpu(str(tvm_target.get("arch", "")))
    if tvm_target.get("kind") != "llvm":
        return f"it is {tvm_target.get('kind')} code and this machine runs llvm"
    host_arch = platform.machine().lower()
    triple = str(tvm_target.get("mtriple") or "")
    if triple:
        arch = triple.split("-")[0]
        if arch != host_arch and (arch, host_arch) not in {("x86_64", "amd64"), ("arm64", "aarch64")}:
            return f"it is {arch} code and this machine is {host_arch}"
    cpu = tvm_target.get("mcpu")
    system_cpu = tvm.target.codegen.llvm_get_system_cpu()
    if host_arch in _X86:
        missing = missing_features(_llvm_features(tvm_target), _host_flags())
        if missing:
            return (f"it was built for CPU {cpu or 'generic'!r}, whose features {', '.join(missing)} this "
                    f"machine ({system_cpu}) lacks")
        return None
    if cpu is not None and cpu not in (system_cpu, "generic"):
        return f"it was built for CPU {cpu!r} and this machine's is {system_cpu!r}"
    return None


_BOARD_LIST = (
    # Banana Pi BPI-F3, SpacemiT K1: 8 X60 cores (rv64gcv, RVA22, RVV 1.0 with VLEN=256) in two
    # clusters of 4. Per core 32 KiB L1d; 512 KiB L2 shared per 4-core cluster; no L3
    # (SpacemiT K1 datasheet, docs.banana-pi.org/en/BPI-F3/SpacemiT_K1_datasheet, and hwloc
    # output published by owners). We target one cluster: 4 cores sharing one L2.
    # mcpu stays generic-rv64 (LLVM 22 also knows "spacemit-x60"); +zvl256b tells LLVM the
    # VLEN, so its vectorizer uses 256-bit registers (llvm_get_vector_width reports 256).
    HardwareTarget(
        name="bananapi-f3",
        description="Banana Pi BPI-F3 (SpacemiT K1, 4-core X60 cluster, RVV 1.0 VLEN=256)",
        tvm_target={
            "kind": "llvm",
            "mtriple": "riscv64-unknown-linux-gnu",
            "mcpu": "generic-rv64",
            "mabi": "lp64d",
            "mattr": [
                "+64bit",
                "+m",
                "+a",
                "+f",
                "+d",
                "+c",
                "+v",
                "+zvl256b",
                "+zba",
                "+zbb",
                "+zbs",
            ],
            "num-cores": 4,
        },
        num_cores=4,
        vector_bits=256,
        vector_registers=32,
        l1d_bytes=32 * KIB,
        l2_bytes=512 * KIB,
        l3_bytes=0,
        cache_line_bytes=64,
        cross_compiler="riscv64-linux-gnu-gcc",
    ),
    # Kirin 990, big cores only: 4x Cortex-A76 (2 @ 2.86 GHz + 2 @ 2.36/2.09 GHz), AArch64
    # NEON 128-bit, 32 vector registers. L1d 64 KiB per core (Arm Cortex-A76 TRM: fixed
    # 64 KiB L1D); L2 512 KiB per big core (AnandTech's Kirin 980 table; WikiChip and
    # AnandTech describe the 990 as the same core organisation at higher clocks). The L3
    # (DSU, shared) is taken as 2 MiB, the project's figure; AnandTech lists 4 MB DSU L3 for
    # the Kirin 980, so 2 MiB is the conservative choice for tiling. Taken from these sources,
    # not from a board.
    HardwareTarget(
        name="kirin990",
        description="HiSilicon Kirin 990, 4 big Cortex-A76 cores (AArch64, NEON 128-bit)",
        tvm_target={
            "kind": "llvm",
            "mtriple": "aarch64-linux-gnu",
            "mcpu": "cortex-a76",
            "mattr": ["+neon"],
            "num-cores": 4,
        },
        num_cores=4,
        vector_bits=128,
        vector_registers=32,
        l1d_bytes=64 * KIB,
        l2_bytes=512 * KIB,
        l3_bytes=2 * MIB,
        cache_line_bytes=64,
        cross_compiler="aarch64-linux-gnu-gcc",
    ),
    # The emulated board of the test suite: Cortex-A72 under qemu-user (.ci/prepare-board.sh;
    # qemu runs it as -cpu cortex-a72, so code using a later CPU's instructions traps). ARMv8.0-A,
    # NEON 128-bit, 32 vector registers; caches as the Cortex-A72 TRM and a Raspberry Pi 4
    # (BCM2711): 32 KiB L1d per core, 1 MiB L2 shared, no L3. Two cores: qemu-user maps each
    # guest thread to a host thread. Its timings say nothing about an A72's speed.
    HardwareTarget(
        name="emulated-arm64",
        description="Cortex-A72 emulated by qemu-user (AArch64, NEON 128-bit; numerics only, not speed)",
        tvm_target={
            "kind": "llvm",
            "mtriple": "aarch64-linux-gnu",
            "mcpu": "cortex-a72",
            "mattr": ["+neon"],
            "num-cores": 2,
            # TVM's device-model attribute: marks every tuning record of this board as emulated.
            "model": "qemu",
        },
        num_cores=2,
        vector_bits=128,
        vector_registers=32,
        l1d_bytes=32 * KIB,
        l2_bytes=1 * MIB,
        l3_bytes=0,
        cache_line_bytes=64,
        cross_compiler="aarch64-linux-gnu-gcc",
    ),
    # NVIDIA Tesla V100 (Volta, sm_70): 80 SMs, 128 KiB combined L1/shared memory per SM
    # (48 KiB shared per block without opt-in), 6 MiB L2, 128-byte L1 lines, 64K registers
    # per SM (and per block), warp 32. "Vectors" are 128-bit (float4) loads.
    HardwareTarget(
        name="v100",
        description="NVIDIA Tesla V100 (Volta sm_70, 80 SMs, 6 MiB L2)",
        tvm_target={
            "kind": "cuda",
            "arch": "sm_70",
            "max_threads_per_block": 1024,
            "max_num_threads": 1024,
            "max_shared_memory_per_block": 49152,
            "thread_warp_size": 32,
            "registers_per_block": 65536,
            "l2_cache_size_bytes": 6 * MIB,
            "host": {"kind": "llvm"},
        },
        num_cores=80,
        vector_bits=128,
        vector_registers=0,
        l1d_bytes=128 * KIB,
        l2_bytes=6 * MIB,
        l3_bytes=0,
        cache_line_bytes=128,
        cross_compiler=None,
    ),
    # NVIDIA H100 SXM (Hopper, sm_90): 132 SMs (an H100 80GB HBM3 reports 132 multiprocessors
    # and 50 MiB of L2 through PyTorch), 228 KiB shared memory per SM of
    # which 48 KiB per block without the dynamic opt-in (TVM's kernels do not opt in), 64K
    # registers per block, warp 32. The FP32 (non-tensor-core) rate is 67 TFLOP/s in NVIDIA's
    # H100 datasheet; alt-tvm's CUDA kernels use FP32 FMA, not the tensor cores.
    HardwareTarget(
        name="h100",
        description="NVIDIA H100 SXM (Hopper sm_90, 132 SMs, 50 MiB L2)",
        tvm_target={
            "kind": "cuda",
            "arch": "sm_90",
            "max_threads_per_block": 1024,
            "max_num_threads": 1024,
            "max_shared_memory_per_block": 49152,
            "thread_warp_size": 32,
            "registers_per_block": 65536,
            "l2_cache_size_bytes": 50 * MIB,
            "host": {"kind": "llvm"},
        },
        num_cores=132,
        vector_bits=128,
        vector_registers=0,
        l1d_bytes=256 * KIB,
        l2_bytes=50 * MIB,
        l3_bytes=0,
        cache_line_bytes=128,
        cross_compiler=None,
    ),
    # VTA: the host CPU runs everything but int8 conv2d/dense, which the ``vta_gemm``
    # strategy runs on the VTA model in alt_tvm.vta_mapping.sim (simulated; no FPGA). Generic
    # llvm (no -mcpu) so the code runs on any x86-64/AArch64 host; the CPU figures are the
    # module's detection defaults, used only to size fallback kernels' parallel loops.
    HardwareTarget(
        name="vta",
        description="host CPU + VTA GEMM accelerator model (simulated)",
        tvm_target={"kind": "llvm", "num-cores": 4},
        num_cores=4,
        vector_bits=128,
        vector_registers=16,
        l1d_bytes=_DEFAULT_L1D,
        l2_bytes=_DEFAULT_L2,
        l3_bytes=_DEFAULT_L3,
        cache_line_bytes=_DEFAULT_LINE,
        cross_compiler=None,
    ),
)

#: Known boards by name (read-only).
BOARDS: Mapping[str, HardwareTarget] = MappingProxyType({b.name: b for b in _BOARD_LIST})


def known_boards() -> tuple[str, ...]:
    """Names accepted by :func:`board` (``"host"`` and ``"cpu:<LLVM CPU>"`` are accepted as well)."""
    return tuple(sorted(BOARDS))


def board(name: str) -> HardwareTarget:
    """The description of board ``name``; ``"host"`` gives :func:`host`, ``"cpu:MCPU"`` this
    machine as LLVM CPU ``MCPU`` (:func:`describe_cpu`, e.g. ``"cpu:haswell"`` for AVX2),
    ``"cuda"`` or ``"cuda:N"`` this machine's CUDA GPU 0 or N (:func:`detect_cuda`).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones) or an unknown CPU.
    RuntimeError
        For ``"cuda"`` where TVM sees no such GPU.
    """
    if name == "host":
        return host()
    if isinstance(name, str) and name.startswith("cpu:"):
        return describe_cpu(name[len("cpu:"):])
    if isinstance(name, str) and (name == "cuda" or name.startswith("cuda:")):
        index = name[len("cuda:"):] if name != "cuda" else "0"
        if not index.isdigit():
            raise ValueError(f"GPU index {index!r} in {name!r}: expected 'cuda' or 'cuda:<N>' such as 'cuda:0'")
        return detect_cuda(int(index))
    try:
        return BOARDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown board {name!r}; known boards: {', '.join(known_boards())} "
                         f"(or 'host', 'cpu:<LLVM CPU>' such as 'cpu:haswell', or 'cuda[:N]' for this "
                         f"machine's GPU)") from None


def resolve(target: HardwareTarget | str | None) -> HardwareTarget:
    """The :class:`HardwareTarget` a user's ``target`` argument names.

    Parameters
    ----------
    target : HardwareTarget, str or None
        A description, a board name (see :func:`known_boards`, or ``"host"``), or None
        for this host.

    Raises
    ------
    TypeError
        For anything else (the message names the type given).
    ValueError
        For an unknown board name.
    """
    if target is None:
        return host()
    if isinstance(target, HardwareTarget):
        return target
    if isinstance(target, str):
        return board(target)
    raise TypeError(f"target must be an alt_tvm.target.HardwareTarget, a board name "
                    f"({', '.join(known_boards())}, 'host') or None, got {type(target).__name__} {target!r}")
