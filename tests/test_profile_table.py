"""The per-kernel table of a built model: what each kernel computes, its time and rate."""

import numpy as np
import pytest
import torch

from alt_tvm.graph.build import build


def test_profile_rows_name_operators_layouts_and_exact_flops():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10)).eval()
    x = torch.randn(1, 8, 16, 16)
    built = build(model, example_inputs=[x])
    profile = built.profile(x.numpy(), repeat=2)
    rows = profile.rows()
    assert {r.kernel for r in rows} == set(profile.times_ms)
    assert [r.ms for r in rows] == sorted((r.ms for r in rows), reverse=True)
    assert 0.0 < sum(r.share for r in rows) <= 1.0
    conv = next(r for r in rows if r.kind == "partition" and "relax.nn.conv2d" in r.ops)
    assert conv.ops[:2] == ("relax.nn.conv2d", "relax.add") and "relax.nn.relu" in conv.ops
    assert conv.layout and conv.layout != "1x16x16x16"  # a tiled layout, written as the shape it stores
    info = built.kernel_info()[conv.kernel]
    assert info.flops == 2 * 16 * 8 * 9 * 16 * 16  # a multiply-add counts 2; the epilogue does not count
    # The minimum traffic: each argument and the result once, as the kernel stores them (the
    # input padded or not, in the channel tiles the target's vectors set).
    func = next(built.mod[g] for g in built.mod.get_global_vars() if g.name_hint == conv.kernel)
    assert info.bytes == 4 * sum(int(np.prod([int(d) for d in p.ty.shape])) for p in func.params)
    assert 4 * (8 * 16 * 16 + 16 * 8 * 9 + 16 + 16 * 16 * 16) <= info.bytes
    assert conv.gflops > 0 and conv.gbytes > 0
    # Ops without a strategy run as TVM legalized them ("tvm") or in their operands' layouts ("operator").
    assert all(r.kind in {"partition", "conversion", "elementwise", "operator", "tvm"} for r in rows)
    pool = next(r for r in rows if "relax.nn.max_pool2d" in r.ops)
    assert pool.kind == "operator"  # read in the tiled layout: no conversion but at the model's input
    boundary = {k.name for k in built.report.kernels if k.boundary}
    assert all(r.kernel in boundary for r in rows if r.kind == "conversion")
    # Which kernels a tuning space covers: the conv's strategy has one, the pool its loop knobs
    # (alt_tvm.operator_tasks), the conversions none.
    assert conv.tuning == "default" and pool.tuning == "default" and info.tuning == "default"
    assert all(r.tuning == "" for r in rows if r.kind == "conversion")
    space, tuned = profile.tuning_shares()
    kernels_ms = sum(r.ms for r in rows if not r.kernel.startswith("vm.builtin."))
    assert tuned == 0.0 and space == pytest.approx(sum(r.ms for r in rows if r.tuning) / kernels_ms)
    assert (conv.ms + pool.ms) / kernels_ms <= space <= 1.0
    text = profile.table(limit=3)
    assert text.splitlines()[0].split()[:4] == ["kernel", "kind", "tuning", "ms"]
    assert "more kernels" in text and text.splitlines()[-2].startswith("model ")
    assert text.splitlines()[-1].startswith(f"in kernels with a tuning space: {space * 100:.1f}% of the kernels' "
                                            f"time (tuned: 0.0%); VM builtins ")
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_time_interleaved_warms_each_turn_after_a_pause():
    """Every turn starts with a pause and an untimed call (a runtime that ran just before
    may leave its thread pool spinning), and rounds rotate which runner goes first."""
    import time

    from alt_tvm.bench import time_interleaved

    calls = {"a": [], "b": []}

    def runner(label):
        def run():
            calls[label].append(time.perf_counter())
        return run

    times = time_interleaved({"a": (runner("a"), ()), "b": (runner("b"), ())}, rounds=3, repeat=2, warmup=1,
                             pause_s=0.01)
    # 3 rounds asked, 4 run: two runners' design is two rounds long (balanced_rounds)
    assert set(times) == {"a", "b"} and all(len(rounds) == 4 for _, rounds in times.values())
    assert len(calls["a"]) == len(calls["b"]) == 1 + 4 * (1 + 2)  # warm-up, then per round: 1 untimed + 2
    turn_starts = sorted(c[1 + 3 * k] for c in calls.values() for k in range(4))
    first_calls = sorted(c[0] for c in calls.values())
    assert min(turn_starts) - max(first_calls) >= 0.009  # the pause before the first turn


def test_roof_column_reads_each_kernel_against_the_nearer_roof():
    from alt_tvm.deploy.profile import KernelInfo, KernelProfile

    profile = KernelProfile({"conv": (1.0, 1.0), "copy": (2.0, 2.0)}, (3.0, 3.0),
                            {"conv": KernelInfo("partition", ("relax.nn.conv2d",), "", 1e8, 1e6),
                             "copy": KernelInfo("operator", ("relax.concat",), "", 0.0, 4e7)})
    lines = profile.table(peak_gflops=200.0, bandwidth_gbs=40.0).splitlines()
    assert lines[0].split()[:8] == ["kernel", "kind", "tuning", "ms", "share", "GFLOP/s", "GB/s", "roof"]
    # conv: 100 GFLOP/s of 200 (50%) beats 1 GB/s of 40; copy: 20 GB/s of 40 (50%)
    assert {line.split()[0]: line.split()[7] for line in lines[1:3]} == {"conv": "50%", "copy": "50%"}
    assert "roof" not in profile.table().splitlines()[0]


def test_a_kernel_called_several_times_per_run_is_read_per_call():
    """A function TVM shares between identical ops is timed as the sum of its calls: its
    rates divide one call's FLOPs and bytes by one call's time, not by the sum."""
    from alt_tvm.deploy.profile import KernelInfo, KernelProfile

    profile = KernelProfile({"shared": (3.0, 3.0), "once": (1.0, 1.0)}, (4.0, 4.0),
                            {"shared": KernelInfo("tvm", ("transpose",), "", 0.0, 4e6),
                             "once": KernelInfo("operator", ("transpose",), "", 0.0, 4e6)},
                            calls={"shared": 3})
    rows = {r.kernel: r for r in profile.rows()}
    assert (rows["shared"].calls, rows["once"].calls) == (3, 1)
    assert rows["shared"].ms == 3.0 and rows["shared"].gbytes == pytest.approx(rows["once"].gbytes) == 4.0
    assert "shared x3" in profile.table()


def test_profiled_runs_count_the_calls_of_each_function():
    from alt_tvm.graph.build import build

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(1, 8, 16, 16)
    built = build(model, example_inputs=[x])
    profile = built.profile(x.numpy(), repeat=2)
    calls = {r.kernel: r.calls for r in profile.rows()}
    assert all(calls[k] == 1 for k in calls if k.startswith("alt_"))  # two different convs: a function each
    assert max(calls.values()) > 1  # the VM's builtins (tensor allocation) run once per tensor


class RepeatedBlocks(torch.nn.Module):
    """Three identical conv + ReLU blocks after a different first conv, as ResNet's stages repeat."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.blocks = torch.nn.ModuleList(torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(3))

    def forward(self, x):
        x = torch.relu(self.first(x))
        for conv in self.blocks:
            x = torch.relu(conv(x))
        return x


def test_structurally_equal_kernels_compile_once_and_each_call_site_keeps_its_weights():
    import tvm

    model = RepeatedBlocks().eval()
    x = torch.randn(1, 8, 16, 16)
    built = build(model, example_inputs=[x])
    partitions = [k for k in built.report.kernels if k.kind == "partition"]
    assert len(partitions) == 4 and len({k.workload for k in partitions}) == 2
    names = [k.name for k in partitions]
    # The last two blocks read a block's tiles: one kernel. The first block reads the first
    # conv's, which are the same tiles or not by the target's vector width: its own kernel or
    # the same one.
    assert names[2] == names[3] != names[0] and len(set(names)) == 3 - (names[1] == names[2])
    alt_funcs = [g.name_hint for g in built.mod.get_global_vars()
                 if isinstance(built.mod[g], tvm.tirx.PrimFunc) and g.name_hint.startswith("alt_")]
    assert sorted(alt_funcs) == sorted(set(names))
    # The shared kernel reads each block's own weights: a wrong sharing would repeat one block's.
    np.testing.assert_allclose(built(x.numpy())[0], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    profile = built.profile(x.numpy(), repeat=2)
    assert profile.calls[names[2]] == names.count(names[2])
    per_workload = profile.by_workload(built.report.kernels, conversions=False)
    if names[1] == names[2]:
        both = profile.times_ms[names[2]]
    else:
        assert names[1] not in profile.calls  # called once
        both = [a + b for a, b in zip(profile.times_ms[names[1]], profile.times_ms[names[2]])]
    assert per_workload[partitions[1].workload] == pytest.approx(both)


def test_the_report_names_each_kernel_by_the_symbol_the_profile_times():
    # Twelve kernels: Relax's builder renames the global var "alt_conv2d_11" apart from the
    # binding "alt_conv2d_1" + "1"; the VM and the profile still know it as alt_conv2d_11.
    torch.manual_seed(0)
    layers, channels = [], 8
    for i in range(12):
        layers += [torch.nn.Conv2d(channels, channels + 8 * (i % 2), 3, padding=1), torch.nn.ReLU()]
        channels += 8 * (i % 2)
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(1, 8, 8, 8)
    built = build(model, example_inputs=[x])
    profile = built.profile(x.numpy(), repeat=1)
    names = {k.name for k in built.report.kernels}
    assert len(names) == 13 and names <= set(profile.times_ms)
    assert all(built.kernel_info()[name].kind in {"partition", "conversion"} for name in names)


def test_a_shared_function_counts_per_call_towards_each_workload_that_calls_it():
    from alt_tvm.deploy.profile import KernelProfile
    from alt_tvm.graph.report import Kernel

    profile = KernelProfile({"conv": (6.0, 9.0), "convert": (2.0, 2.0)}, (10.0, 12.0), calls={"conv": 3, "convert": 2})
    kernels = [Kernel("conv", "partition", "a"), Kernel("conv", "partition", "a"), Kernel("conv", "partition", "b"),
               Kernel("convert", "conversion", "a", "detail"), Kernel("convert", "conversion", "b", "detail")]
    # conv: 2 of its 3 calls are workload a's, one b's; each workload caused one conversion call.
    assert profile.by_workload(kernels) == {"a": pytest.approx((5.0, 7.0)), "b": pytest.approx((3.0, 4.0))}
    assert profile.by_workload(kernels, conversions=False) == {"a": pytest.approx((4.0, 6.0)),
                                                                "b": pytest.approx((2.0, 3.0))}
    assert [row[3] for row in profile.conversions(kernels)] == [1.0, 1.0]


def test_memory_bandwidth_is_measured_in_gb_per_s():
    from alt_tvm.bench.peak import measure_memory_bandwidth

    # (not use_runtime_threads(1): it would set TVM_NUM_THREADS=1 for the tests after this one)
    assert 0.5 < measure_memory_bandwidth(threads=1, megabytes=8, repeat=2) < 2000
    with pytest.raises(ValueError, match="megabytes"):
        measure_memory_bandwidth(threads=1, megabytes=0)


def test_roof_column_needs_both_roofs():
    from alt_tvm.deploy.profile import KernelProfile

    with pytest.raises(ValueError, match="needs both peak_gflops and bandwidth_gbs"):
        KernelProfile({"k": (1.0,)}, (1.0,)).table(peak_gflops=100.0)


class _AsyncVM:
    """A VM whose one kernel 'launches' work that only a sync finishes (as a GPU's does)."""

    def __init__(self) -> None:
        self.pending = 0.0
        self.instrument = None

    def set_instrument(self, instrument) -> None:
        self.instrument = instrument

    def sync(self) -> None:
        import time

        time.sleep(self.pending)
        self.pending = 0.0

    def __getitem__(self, name):
        def main():
            self.instrument(None, "kernel", True, None)
            self.pending = 0.02  # launched: returns at once, 20 ms of device work queued
            self.instrument(None, "kernel", False, None)

        return main


def test_a_profile_with_the_device_sync_times_an_asynchronous_kernel_to_its_end():
    from alt_tvm.deploy.profile import profile_vm

    vm = _AsyncVM()
    unsynced = profile_vm(vm, [], repeat=2, warmup=0)
    vm.pending = 0.0
    synced = profile_vm(vm, [], repeat=2, warmup=0, sync=vm.sync)
    assert max(unsynced.times_ms["kernel"]) < 10.0
    assert min(synced.times_ms["kernel"]) >= 19.0
