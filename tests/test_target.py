"""alt_tvm.target: host detection checked against /sys, /proc and LLVM; boards build targets."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

import pytest
import tvm
from tvm import te

from alt_tvm import target as hw
from alt_tvm.facts import issue_facts

SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _sys_caches() -> dict[tuple[int, str], int]:
    """(level, type) -> bytes, read straight from sysfs (independently of the module)."""
    out = {}
    for index in SYS_CACHE.glob("index*"):
        level = int((index / "level").read_text())
        kind = (index / "type").read_text().strip()
        size = (index / "size").read_text().strip()
        unit = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
        out[(level, kind)] = int(size.rstrip("KMG")) * unit
    return out


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _host_cpu() -> str:
    """The CPU the host is described as: the one ALT_TVM_HOST_CPU names, else LLVM's."""
    return os.environ.get(hw.HOST_CPU_ENV, "").strip() or tvm.target.codegen.llvm_get_system_cpu()


def test_host_matches_llvm_and_affinity():
    h = hw.host()
    assert h.name == "host"
    assert h.tvm_target["mcpu"] == _host_cpu()
    assert h.num_cores == hw.process_cores() == len(hw._AFFINITY_AT_IMPORT | _worker_affinities())
    t = h.to_tvm()
    assert t.kind.name == "llvm"
    assert str(t.attrs["mcpu"]) == _host_cpu()
    assert int(t.attrs["num-cores"]) == h.num_cores
    assert hw.host() is h  # cached
    # The issue facts are this machine's, measured (or cached, or overridden), never named.
    facts = issue_facts(vector_bits=h.vector_bits, mcpu=h.tvm_target["mcpu"])
    assert (h.half_vectors_full_rate, h.fma_chains) == facts[:2]


@pytest.mark.skipif(not SYS_CACHE.is_dir(), reason="no sysfs cache information")
def test_host_caches_match_sysfs():
    caches = _sys_caches()
    h = hw.host()
    assert h.l1d_bytes == caches[(1, "Data")]
    if (2, "Unified") in caches:
        assert h.l2_bytes == caches[(2, "Unified")]
    assert h.l3_bytes == caches.get((3, "Unified"), 0)
    line = SYS_CACHE / "index0" / "coherency_line_size"
    if line.exists():
        assert h.cache_line_bytes == int(line.read_text())


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo")
def test_host_vector_width_matches_cpuinfo():
    flags = _cpu_flags() if not os.environ.get(hw.HOST_CPU_ENV) else \
        set(tvm.target.codegen.llvm_get_cpu_features(hw.host().to_tvm()))  # the CPU it is described as
    machine = platform.machine()
    if machine == "x86_64":
        if "avx512f" in flags:
            expected_bits, expected_regs = 512, 32
        elif "avx2" in flags or "avx" in flags:
            expected_bits, expected_regs = 256, 16
        else:
            expected_bits, expected_regs = 128, 16
    elif machine == "aarch64":
        expected_bits, expected_regs = 128, 32
    else:
        pytest.skip(f"no expectation written for {machine}")
    h = hw.host()
    assert h.vector_bits == expected_bits
    assert h.vector_registers == expected_regs
    assert h.vector_lanes() == expected_bits // 32
    assert h.vector_lanes("float64") == expected_bits // 64
    assert h.vector_lanes("int8") == expected_bits // 8


def test_host_fallbacks_without_sys_or_proc(tmp_path):
    h = hw.detect_host(cache_dir=tmp_path / "none", cpuinfo_path=tmp_path / "cpuinfo")
    assert (h.l1d_bytes, h.l2_bytes, h.l3_bytes, h.cache_line_bytes) == (32768, 1 << 20, 0, 64)
    # Vector width then comes from LLVM for the detected CPU.
    assert h.vector_bits == int(tvm.target.codegen.llvm_get_vector_width(h.to_tvm()))


X86 = platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not X86, reason="x86 CPU names")
@pytest.mark.parametrize("cpu, bits, registers", [
    ("haswell", 256, 16), ("znver3", 256, 16), ("x86-64-v3", 256, 16),
    ("skylake-avx512", 512, 32), ("znver4", 512, 32), ("x86-64", 128, 16),
])
def test_a_cpu_is_described_by_the_features_llvm_gives_it(cpu, bits, registers):
    d = hw.describe_cpu(cpu)
    assert (d.vector_bits, d.vector_registers, d.vector_lanes()) == (bits, registers, bits // 32)
    assert d.tvm_target["mcpu"] == cpu and d.name == f"cpu:{cpu}"
    assert (d.l1d_bytes, d.l2_bytes, d.num_cores) == (hw.host().l1d_bytes, hw.host().l2_bytes, hw.host().num_cores)
    runs_here = hw.not_on_host(d.tvm_target) is None
    facts = issue_facts(vector_bits=bits, mcpu=cpu)[:2] if runs_here else (False, 8)
    assert (d.half_vectors_full_rate, d.fma_chains) == facts
    assert hw.board(f"cpu:{cpu}") == d
    with pytest.raises(ValueError, match="unknown CPU 'pentium9'.*haswell"):
        hw.describe_cpu("pentium9")


def _fake_cpuinfo(tmp_path, monkeypatch, flags: str) -> None:
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(hw, "_CPUINFO", tmp_path / "cpuinfo")


AVX2_FLAGS = "fpu sse sse2 pni ssse3 fma sse4_1 sse4_2 movbe popcnt avx f16c abm bmi1 avx2 bmi2"


@pytest.mark.skipif(not X86, reason="x86 feature flags")
def test_code_runs_where_the_host_has_the_targets_features(tmp_path, monkeypatch):
    """By instruction-set features, not CPU names: AVX2 code runs on an AVX-512 machine,
    AVX-512 code is refused on an AVX2 one with the features it lacks named."""
    avx2, avx512 = hw.describe_cpu("haswell").tvm_target, hw.describe_cpu("skylake-avx512").tvm_target
    _fake_cpuinfo(tmp_path, monkeypatch, AVX2_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl")
    assert hw.not_on_host(avx2) is None and hw.not_on_host(avx512) is None
    _fake_cpuinfo(tmp_path, monkeypatch, AVX2_FLAGS)
    assert hw.not_on_host(avx2) is None
    why = hw.not_on_host(avx512)
    assert why and "avx512f" in why and "'skylake-avx512'" in why
    assert "avx512f" in hw.not_on_host({**avx2, "mattr": ["+avx512f"]})  # features added by mattr count too
    _fake_cpuinfo(tmp_path, monkeypatch, "fpu sse sse2 pni")  # an old x86-64: no AVX
    assert "avx2" in hw.not_on_host(avx2) and hw.not_on_host({"kind": "llvm"}) is None
    assert "aarch64 code" in hw.not_on_host(hw.board("kirin990").tvm_target)
    assert "CUDA code" in hw.not_on_host(hw.board("v100").tvm_target)  # no GPU here, or not an sm_70 one


@pytest.mark.skipif(not X86, reason="x86 CPU names")
def test_the_host_can_be_described_as_a_lesser_cpu(tmp_path):
    """ALT_TVM_HOST_CPU describes this machine as another CPU it can run the code of: the whole
    build flow (and the test suite) then targets that instruction set."""
    import subprocess
    import sys

    script = "from alt_tvm.target import host; h = host(); print(h.tvm_target['mcpu'], h.vector_bits, " \
             "h.vector_registers)"
    env = {**os.environ, hw.HOST_CPU_ENV: "haswell"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["haswell", "256", "16"]
    bad = subprocess.run([sys.executable, "-c", script], env={**env, hw.HOST_CPU_ENV: "pentium9"},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown CPU 'pentium9'" in bad.stderr


def test_detect_host_reads_given_files(tmp_path):
    for i, (level, kind, size) in enumerate(
        [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2M"), (3, "Unified", "32768K")]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "coherency_line_size").write_text("64\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n")
    h = hw.detect_host(cache_dir=tmp_path, cpuinfo_path=cpuinfo)
    assert (h.l1d_bytes, h.l2_bytes, h.l3_bytes) == (48 * 1024, 2 << 20, 32 << 20)
    if platform.machine() == "x86_64":
        assert (h.vector_bits, h.vector_registers, h.vector_lanes()) == (256, 16, 8)


@pytest.mark.parametrize(
    "text, expected",
    [("32K", 32768), ("1024K", 1 << 20), ("32768K", 32 << 20), ("1M", 1 << 20), ("512", 512), ("2 MiB", 2 << 20)],
)
def test_parse_cache_size(text, expected):
    assert hw.parse_cache_size(text) == expected


def test_parse_cache_size_rejects_garbage():
    with pytest.raises(ValueError, match="'lots'"):
        hw.parse_cache_size("lots")


LLVM_BOARDS = {
    "bananapi-f3": ("riscv64-unknown-linux-gnu", "riscv64-linux-gnu-gcc"),
    "emulated-arm64": ("aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
    "kirin990": ("aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
}


def test_known_boards():
    assert set(hw.known_boards()) == {"bananapi-f3", "emulated-arm64", "h100", "kirin990", "v100", "vta"}
    assert not any(hw.board(name).half_vectors_full_rate for name in hw.known_boards())
    assert hw.board("host") is hw.host()


@pytest.mark.parametrize("name", sorted(LLVM_BOARDS))
def test_llvm_boards_build_targets(name):
    b = hw.board(name)
    triple, cc = LLVM_BOARDS[name]
    t = b.to_tvm()
    assert t.kind.name == "llvm"
    assert str(t.attrs["mtriple"]) == triple
    assert int(t.attrs["num-cores"]) == b.num_cores
    assert b.cross_compiler == cc
    # LLVM agrees on the SIMD width the description claims (zvl256b for the K1, NEON for A76).
    assert int(tvm.target.codegen.llvm_get_vector_width(t)) == b.vector_bits
    assert b.vector_registers == 32
    assert b.l1d_bytes > 0 and b.l2_bytes > b.l1d_bytes


@pytest.mark.parametrize("name, marker", [("bananapi-f3", "vsetvli"), ("kirin990", ".4s")])
def test_llvm_boards_cross_compile(name, marker):
    # Compile only (no linking, so no cross gcc needed): the back end emits the board's SIMD.
    a = te.placeholder((256,), name="a")
    b = te.compute((256,), lambda i: a[i] * 2.0 + 1.0, name="b")
    rt = tvm.compile(te.create_prim_func([a, b]), target=hw.board(name).to_tvm())
    assert marker in rt.mod.inspect_source("asm")


def test_v100_target():
    b = hw.board("v100")
    t = b.to_tvm()
    assert t.kind.name == "cuda"
    assert str(t.attrs["arch"]) == "sm_70"
    assert int(t.attrs["max_threads_per_block"]) == 1024
    assert int(t.attrs["max_shared_memory_per_block"]) == 49152
    assert int(t.attrs["thread_warp_size"]) == 32
    assert t.host is not None and t.host.kind.name == "llvm"
    assert b.num_cores == 80 and b.l2_bytes == 6 << 20 and b.cross_compiler is None
    assert b.vector_lanes("float32") == 4


def test_unknown_board_lists_known_names():
    with pytest.raises(ValueError, match="unknown board 'pynq'") as info:
        hw.board("pynq")
    for name in hw.known_boards():
        assert name in str(info.value)


def test_descriptions_are_frozen_and_targets_copied():
    b = hw.board("kirin990")
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.num_cores = 8  # type: ignore[misc]
    b.to_tvm()
    assert b.tvm_target["mattr"] == ["+neon"]
    with pytest.raises(TypeError):
        hw.BOARDS["x"] = b  # type: ignore[index]


def test_vector_lanes_bad_dtype():
    with pytest.raises(ValueError, match="'floaty'"):
        hw.host().vector_lanes("floaty")


def _worker_affinities() -> set[int]:
    cores = set()
    for task in os.listdir("/proc/self/task"):
        cores |= os.sched_getaffinity(int(task))
    return cores


def test_host_cores_survive_tvm_pinning_the_main_thread():
    # Running a parallel kernel lets TVM's pool pin the calling thread to one core; the
    # process may still use every core it was given.
    import numpy as np
    from tvm import te

    before = hw.process_cores()
    x = te.placeholder((4096,), "float32", name="x")
    y = te.compute((4096,), lambda i: x[i] * 2.0, name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    sch.parallel(loop)
    lib = tvm.compile(sch.mod, target=hw.host().to_tvm())
    a = tvm.runtime.tensor(np.ones(4096, "float32"))
    b = tvm.runtime.tensor(np.zeros(4096, "float32"))
    lib["main"](a, b)
    assert hw.process_cores() == before
    np.testing.assert_allclose(b.numpy(), 2.0)


def test_cuda_names_this_machines_gpu_or_says_why_not():
    from alt_tvm.cli.common import target_problem

    assert target_problem("cpu:haswell") is None  # the CLI takes what board() takes
    with pytest.raises(ValueError, match="GPU index 'x' in 'cuda:x'"):
        hw.board("cuda:x")
    if tvm.cuda(0).exist:
        assert hw.board("cuda").tvm_target["kind"] == "cuda" and hw.board("cuda:0").num_cores > 0
    else:
        with pytest.raises(RuntimeError, match="no CUDA device 0"):
            hw.board("cuda")
        assert "no CUDA device 0" in target_problem("cuda")
