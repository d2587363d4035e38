"""The CUDA loop space of the ALT conv/GEMM templates on the V100 board.

The tests need no GPU, so kernels are compile-tested: lowered through
``tvm.compile`` to CUDA source and checked by TVM's GPU verifier against the V100's
limits. The schedules' arithmetic is checked on this CPU by building the same loop nest
without thread bindings or shared buffers (``cuda_cpu_emulation``) and comparing with
PyTorch.
"""

import dataclasses
import functools
import re

import numpy as np
import pytest
import torch
import tvm
from conftest import host_target, load_script
from tvm import te

from alt_tvm.integration import extract_tasks
from alt_tvm.strategies.alt.conv_cuda import schedule_cuda_gemm
from alt_tvm.strategies.alt.cuda_space import CudaConvSpace, CudaGemmSpace
from alt_tvm.strategies.alt.cuda_tiling import (
    CudaConvTiling,
    CudaGemmTiling,
    GpuLimits,
    conv_block_usage,
    default_cuda_conv_tiling,
    default_cuda_gemm_tiling,
    gpu_kernel_violations,
)
from alt_tvm.strategies.alt.space import ConvSpace
from alt_tvm.target import board

V100 = board("v100")
LIMITS = GpuLimits.from_target(V100)


class ConvReLU(torch.nn.Module):
    def __init__(self, c, o, k, stride=1, pad=0, groups=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, o, k, stride=stride, padding=pad, groups=groups)

    def forward(self, x):
        return torch.relu(self.conv(x))


class ConvNd(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return torch.relu(self.conv(x))


class Dense(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(96, 64)

    def forward(self, x):
        return self.fc(x)


class DenseRow(torch.nn.Module):  # batch 1: M = 1, a long reduction
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(512, 96)

    def forward(self, x):
        return torch.relu(self.fc(x))


# name -> (model, input shape); one partition each.
CASES = {
    "conv3x3_s1": (lambda: ConvReLU(16, 32, 3, pad=1), (1, 16, 14, 14)),
    "conv3x3_s2": (lambda: ConvReLU(8, 16, 3, stride=2, pad=1), (1, 8, 16, 16)),
    "conv1x1": (lambda: ConvReLU(32, 64, 1), (1, 32, 8, 8)),
    "depthwise": (lambda: ConvReLU(32, 32, 3, pad=1, groups=32), (1, 32, 10, 10)),
    "conv1d": (lambda: ConvNd(torch.nn.Conv1d(8, 16, 3, padding=1)), (1, 8, 32)),
    "conv3d": (lambda: ConvNd(torch.nn.Conv3d(4, 8, 3, padding=1)), (1, 4, 4, 6, 6)),
    "small_map": (lambda: ConvReLU(64, 64, 3, pad=1), (1, 64, 4, 4)),  # 2 output tiles: split-K by default
    "dense": (lambda: Dense(), (16, 96)),
    "dense_row": (lambda: DenseRow(), (1, 512)),
}


@functools.cache
def case(name):
    """(torch model, input, its single task on the V100)."""
    make, shape = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.rand(*shape)
    (task,) = extract_tasks(model, target=V100, example_inputs=(x,))
    return model, x, task


def cuda_source(func):
    executable = tvm.compile(tvm.IRModule({"main": func}), target=V100.to_tvm())
    return "\n".join(m.inspect_source() for m in executable.mod.imports if m.kind == "cuda")


def verifies_on_gpu(func, *, limits=LIMITS):
    """TVM's GPU verifier on the kernels of ``func`` lowered by the CUDA pipeline, with ``limits``."""
    return not gpu_kernel_violations(tvm.IRModule({"main": func}), target=V100.to_tvm(), limits=limits)


def shared_bytes(source):
    """Bytes of the ``__shared__`` float arrays a CUDA source declares."""
    return 4 * sum(int(n) for n in re.findall(r"__shared__\s+(?:alignas\(\d+\)\s+)?float\s+\w+\[(\d+)\]", source))


def point(space, **loop):
    layout, default_loop = space.default()
    return layout, {**default_loop, **loop}


# ------------------------------------------------------------------------- extraction


def test_tasks_on_the_v100_get_cuda_spaces_and_defaults_fit_the_board():
    for name in CASES:
        _, _, task = case(name)
        expected = CudaGemmSpace if name.startswith("dense") else CudaConvSpace
        assert isinstance(task.space, expected), name
        layout, loop = task.space.default()
        assert task.space.check(layout, loop) is None, name
        assert task.space.params(layout, loop)  # decodes
    # The same model on the host keeps the CPU space.
    model, x, _ = case("conv3x3_s1")
    (cpu_task,) = extract_tasks(model, example_inputs=(x,))
    assert isinstance(cpu_task.space, ConvSpace)


# ------------------------------------------------------------------------- compile tests


@pytest.mark.parametrize("name", list(CASES))
def test_default_kernel_compiles_to_cuda_with_blocks_threads_and_shared_memory(name):
    _, _, task = case(name)
    func = task.lower(None).func
    source = cuda_source(func)
    for needle in ("__global__", "blockIdx.x", "threadIdx.x", "__shared__", "__syncthreads"):
        assert needle in source, (name, needle)
    assert verifies_on_gpu(func), name
    # The estimate that check() relies on bounds what the kernel really allocates.
    assert 0 < shared_bytes(source) <= _estimate(task.space, task.space.params(*task.space.default()))


def test_tuned_points_compile_and_the_shared_estimate_bounds_the_allocation():
    rng = np.random.default_rng(0)
    for name in ("conv3x3_s2", "depthwise", "dense"):
        _, _, task = case(name)
        space = task.space
        tried = 0
        while tried < 3:
            layout = {k.name: k.choices[int(rng.integers(len(k.choices)))] for k in space.layout_knobs}
            loop = space.random_loop(layout, rng)
            loop["shared"] = True
            if space.check(layout, loop) is not None:
                continue
            tried += 1
            params = space.params(layout, loop)
            func = task.lower(params).func
            source = cuda_source(func)
            assert "threadIdx.x" in source and "__shared__" in source, (name, params)
            assert shared_bytes(source) <= _estimate(space, params), (name, params)
            assert verifies_on_gpu(func), (name, params)


def _estimate(space, params):
    if isinstance(space, CudaGemmSpace):
        from alt_tvm.strategies.alt.cuda_tiling import gemm_block_usage

        return gemm_block_usage(CudaGemmTiling.from_json(params)).shared_bytes
    return conv_block_usage(CudaConvTiling.from_json(params), in_channels_per_group=space.in_channels_per_group,
                            out_channels_per_group=space.out_channels_per_group, kernel=space.kernel,
                            strides=space.strides, dilation=space.dilation).shared_bytes


def test_staging_off_uses_no_shared_memory_and_unroll_unrolls():
    _, _, task = case("conv3x3_s1")
    layout, loop = point(task.space, shared=False, unroll=0)
    source = cuda_source(task.lower(task.space.params(layout, loop)).func)
    assert "__shared__" not in source and "blockIdx.x" in source
    rolled = source.count("for (")
    layout, loop = point(task.space, shared=False, unroll=512)
    unrolled = cuda_source(task.lower(task.space.params(layout, loop)).func)
    assert unrolled.count("for (") < rolled


def test_verifier_rejects_a_kernel_over_smaller_limits():
    _, _, task = case("conv3x3_s1")
    func = task.lower(None).func
    used = shared_bytes(cuda_source(func))
    assert not verifies_on_gpu(func, limits=dataclasses.replace(LIMITS, max_shared_memory_per_block=used - 4))
    assert not verifies_on_gpu(func, limits=dataclasses.replace(LIMITS, max_threads_per_block=32))


# ------------------------------------------------------------------------- invalid points


def test_check_rejects_too_many_threads_and_too_much_shared_memory_before_building():
    _, _, task = case("conv3x3_s1")  # 32 channels, 14x14, 16 -> 32
    space = task.space
    layout = {"s0": 7, "s1": 14, "ot": 32, "it": 16, "weight_ot": 32, "weight_it": 16}
    threads = {"block_o": 1, "tile_o": 1, "tile_s": 1, "rc_split": 1, "shared": True, "unroll": 0, "split_k": 1}
    why = space.check(layout, threads)  # 7 * 14 * 32 = 3136 threads
    assert why is not None and "3136 threads per block exceed max_threads_per_block=1024" in why
    with pytest.raises(ValueError, match="3136 threads"):
        space.params(layout, threads)
    small = CudaConvSpace(out_shape=(1, 512, 14, 14), in_channels_per_group=512, out_channels_per_group=512,
                          in_channels=512, kernel=(3, 3), strides=(1, 1), dilation=(1, 1),
                          default=CudaConvTiling((2, 7), 32, 32, rc_split=8).to_json(), limits=LIMITS)
    layout = {"s0": 7, "s1": 14, "ot": 64, "it": 64, "weight_ot": 64, "weight_it": 64}
    loop = {"block_o": 1, "tile_o": 8, "tile_s": 7, "rc_split": 64, "shared": True, "unroll": 0, "split_k": 1}
    why = small.check(layout, loop)  # 64 x 64 x 3 x 3 weights alone are 144 KiB
    assert why is not None and "shared memory per block exceed max_shared_memory_per_block=49152" in why
    assert small.check(layout, {**loop, "shared": False}) is None  # no staging, no shared memory
    assert "layout knob ot=64 not in" in space.check(layout, loop)  # 32 channels: no tile of 64
    layout = {"s0": 2, "s1": 7, "ot": 16, "it": 16, "weight_ot": 32, "weight_it": 16}
    loop = {"block_o": 1, "tile_o": 1, "tile_s": 1, "rc_split": 16, "shared": True, "unroll": 0, "split_k": 1}
    assert "weight_ot=32 does not divide the block's 16 output channels" in space.check(layout, loop)
    assert space.check(layout, {**loop, "block_o": 2}) is None
    gemm = case("dense")[2].space
    layout, loop = gemm.default()
    why = gemm.check(layout, {**loop, "thread_m": 16, "tile_m": 2})  # 32 rows per block, M = 16
    assert why is not None and "do not divide M=16" in why


def test_schedule_refuses_parameters_that_do_not_divide_or_fit():
    a = te.placeholder((8, 16), name="a")
    b = te.placeholder((16, 12), name="b")
    k = te.reduce_axis((0, 16), "k")
    c = te.compute((8, 12), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    func = te.create_prim_func([a, b, c])
    with pytest.raises(ValueError, match=r"thread_n \* tile_n=8 does not divide the loop extent 12"):
        schedule_cuda_gemm(func, gemm=c, stages=[], batch=0, tiling=CudaGemmTiling(12, 1, 1, 8, 1, 4))
    with pytest.raises(ValueError, match="2048 threads per block exceed"):
        schedule_cuda_gemm(func, gemm=c, stages=[], batch=0, tiling=CudaGemmTiling(12, 64, 1, 32, 1, 4),
                           limits=LIMITS)
    with pytest.raises(ValueError, match="CudaConvTiling.split_k must be a positive int, got 0"):
        CudaConvTiling((2, 8), 16, 8, split_k=0)
    with pytest.raises(ValueError, match="CudaGemmTiling.split_k must be a positive int, got -2"):
        CudaGemmTiling(16, split_k=-2)
    with pytest.raises(ValueError, match="tile_o=3 must divide ot=16"):
        CudaConvTiling((2, 8), 16, 8, tile_o=3)
    with pytest.raises(ValueError, match="not a CUDA conv tiling record"):
        CudaConvTiling.from_json({"ot": 4})
    with pytest.raises(ValueError, match="is not a CUDA target"):
        GpuLimits.from_target(board("kirin990"))


# ------------------------------------------------------------------------- arithmetic on the CPU


def run_emulated(task, params, x):
    """Lower ``params`` with the GPU loop nest unbound (plain buffers) and run it here."""
    emulated = dataclasses.replace(task, options={"cuda_cpu_emulation": True})
    lowered = emulated.lower(params)
    kernel = tvm.compile(tvm.IRModule({"main": lowered.func}), target=host_target())["main"]
    return lowered.run(kernel, [x.numpy()], tvm.cpu())


@pytest.mark.parametrize("name", list(CASES))
def test_gpu_schedule_arithmetic_matches_pytorch_on_the_cpu(name):
    model, x, task = case(name)
    with torch.no_grad():
        ref = model(x).numpy()
    space = task.space
    layout, loop = space.default()
    points = [space.params(layout, loop), space.params(layout, {**loop, "shared": False, "unroll": 0})]
    rng = np.random.default_rng(1)
    while len(points) < 3:  # and one tuned point, staged
        layout = {k.name: k.choices[int(rng.integers(len(k.choices)))] for k in space.layout_knobs}
        loop = {**space.random_loop(layout, rng), "shared": True}
        if space.check(layout, loop) is None:
            points.append(space.params(layout, loop))
    for params in points:
        np.testing.assert_allclose(run_emulated(task, params, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(),
                                   err_msg=f"{name} {params}")


def test_split_k_sums_partials_in_a_second_kernel_at_every_split():
    model, x, task = case("small_map")  # 64 input channels: 2 stages of 32
    with torch.no_grad():
        ref = model(x).numpy()
    layout, loop = task.space.default()
    assert loop["split_k"] == 2  # 2 blocks of outputs are far too few for 80 SMs
    source = cuda_source(task.lower(task.space.params(layout, loop)).func)
    kernels = re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\) \{", source)
    assert [name for name, _ in kernels] == ["main_kernel", "main_kernel_1"]
    assert "conv_rf" in kernels[0][1] and "conv_rf" in kernels[1][1] and "data" not in kernels[1][1]
    # Staged stages are whole 32-channel input tiles; unstaged ones may be smaller.
    for split_k, rc_split, shared in ((1, 32, True), (2, 32, True), (4, 16, False), (8, 8, False), (32, 1, False)):
        params = task.space.params(layout, {**loop, "split_k": split_k, "rc_split": rc_split, "shared": shared})
        np.testing.assert_allclose(run_emulated(task, params, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(),
                                   err_msg=f"split_k={split_k} rc_split={rc_split} shared={shared}")
    why = task.space.check(layout, {**loop, "split_k": 4})  # 2 stages of 32 channels
    assert why is not None and "split_k=4 does not divide the 2 reduction stages" in why
    with pytest.raises(ValueError, match="split_k=4 does not divide the 2 reduction stages"):
        task.lower({**task.space.params(layout, loop), "split_k": 4})
    depthwise = case("depthwise")[2].space
    layout, loop = depthwise.default()
    assert loop["split_k"] == 1 and depthwise.check(layout, {**loop, "split_k": 2}) is not None  # nothing to split


def test_gemm_split_k_sums_partials_in_a_second_kernel():
    model, x, task = case("dense_row")
    with torch.no_grad():
        ref = model(x).numpy()
    layout, loop = task.space.default()
    steps = 512 // loop["k_split"]
    # One row of 96 outputs makes a few blocks for 80 SMs: the untuned point splits the stages.
    assert 1 < loop["split_k"] <= steps
    for split_k in sorted({1, 2, loop["split_k"], steps}):
        params = task.space.params(layout, {**loop, "split_k": split_k})
        source = cuda_source(task.lower(params).func)
        kernels = 2 if split_k > 1 else 1
        assert source.count("__global__") == 2 * kernels and "conv_rf" not in source  # declared and defined
        np.testing.assert_allclose(run_emulated(task, params, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(),
                                   err_msg=f"split_k={split_k}")
    why = task.space.check(layout, {**loop, "k_split": 64, "split_k": 16})
    assert why is not None and "split_k=16 does not divide the 8 stages (K=512 / k_split=64)" in why


def test_the_tuner_only_spends_trials_on_points_the_board_can_run():
    from alt_tvm.tuning.tuner import TuneConfig, Tuner

    _, _, task = case("conv3x3_s1")
    seen = []

    def measure(params):  # a fake latency: bookkeeping only, nothing is timed here
        seen.append(params)
        return 1.0 + 1.0 / params.get("tile_o", 1)

    result = Tuner(task.space, measure=measure, config=TuneConfig(trials=16, batch=32, top_k=4, seed=0)).run()
    assert len(result.trials) == len(seen) > 1
    assert all(task.space.check(t.layout, t.loop) is None for t in result.trials)


# ------------------------------------------------------------------------- running a lowered point


def test_lowered_run_refuses_wrong_activations():
    _, x, task = case("conv3x3_s1")
    lowered = dataclasses.replace(task, options={"cuda_cpu_emulation": True}).lower(None)
    with pytest.raises(ValueError, match="takes 1 activation"):
        lowered.run(lambda *args: None, [], tvm.cpu())
    with pytest.raises(ValueError, match=r"has shape \(1, 16, 7, 7\), the kernel takes"):
        lowered.run(lambda *args: None, [np.zeros((1, 16, 7, 7), np.float32)], tvm.cpu())


def test_lowered_run_leaves_nan_where_the_kernel_writes_nothing():
    _, x, task = case("conv1x1")
    lowered = dataclasses.replace(task, options={"cuda_cpu_emulation": True}).lower(None)
    out = lowered.run(lambda *args: None, [x.numpy()], tvm.cpu())  # a "kernel" that writes nothing
    assert out.shape == (1, 64, 8, 8) and np.isnan(out).all()


def test_isolated_measure_times_a_cuda_target_on_the_gpu():
    from alt_tvm.toolchain import cross_compiler_problem
    from alt_tvm.tuning.remote import isolated_measure

    for target, device in ((V100, "cuda"), (board("kirin990"), "cpu")):
        if target.cross_compiler and cross_compiler_problem(target.cross_compiler):
            continue  # no aarch64 linker on this machine (make test installs it)
        with isolated_measure(target=target) as measure:
            assert measure.runner.device == device and not measure.overlap, target.name


def test_detect_cuda_says_why_without_a_gpu():
    from alt_tvm.target import detect_cuda

    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match=r"no CUDA device 0: tvm.cuda\(0\).exist is False"):
        detect_cuda()


def test_metaschedule_build_workers_must_be_positive():
    from alt_tvm.graph.metaschedule import _builder_runner

    with pytest.raises(ValueError, match="build_workers must be a positive int, got 0"):
        _builder_runner(number=1, repeat=1, timeout_s=1.0, build_workers=0)


# ------------------------------------------------------------------------- the GPU benchmark's layers


def test_gpu_benchmark_layers_give_tasks_whose_split_points_compute_the_layer():
    """benchmarks/bench_gpu.py runs on a GPU only; its layers, tasks and ``--split-k`` points are
    checked here (the points' loop nests emulated on the CPU, as the benchmark checks them there)."""
    bench = load_script("bench_gpu")
    h100 = board("h100")
    for name, space_type, flops in (("fc", CudaGemmSpace, 2 * 512 * 1000), ("layer4", CudaConvSpace, None)):
        torch.manual_seed(0)
        model, shape, layer_flops = bench.layer(name)
        model.eval()
        assert flops is None or layer_flops == flops
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = model(x).numpy()
        (task,) = extract_tasks(model, target=h100, example_inputs=(x,))
        assert isinstance(task.space, space_type)
        layout, loop = task.space.default()
        for split_k in (1, 8):
            params = task.space.params(layout, {**loop, "split_k": split_k})
            bench.check(run_emulated(task, params, x), ref, f"{name} split_k={split_k}")
    with pytest.raises(AssertionError, match="max error"):
        bench.check(ref + 1.0, ref, "shifted")


def test_the_untuned_tilings_split_k_only_where_the_output_blocks_leave_sms_idle():
    h100 = GpuLimits(num_sms=132)
    # ResNet-18's classifier at batch 1: 40 blocks for 132 SMs. 8 blocks per SM would take 32
    # splits; each block keeps 64 of the 512 products instead: 8 splits.
    fc = default_cuda_gemm_tiling(m=1, n=1000, k=512, limits=h100)
    assert fc.split_k == 8 and 512 // fc.split_k == 64
    assert default_cuda_gemm_tiling(m=1, n=1000, k=4096, limits=h100).split_k == 32  # 128 products each
    assert default_cuda_gemm_tiling(m=512, n=512, k=512, limits=h100).split_k == 1  # 256 blocks: no split
    splits = {}
    for channels, size in ((64, 56), (512, 7)):
        tiling = default_cuda_conv_tiling(out_shape=(1, channels, size, size), in_channels_per_group=channels,
                                          out_channels_per_group=channels, in_channels=channels, kernel=(3, 3),
                                          strides=(1, 1), dilation=(1, 1), limits=h100)
        splits[channels] = tiling.split_k
    assert splits == {64: 1, 512: 16}  # 196 blocks (layer1) fill the SMs; 112 (layer4) do not
