"""The CUDA conv and GEMM kernels run on a real GPU and match PyTorch there.

Runs only where TVM sees a CUDA device (``tvm.cuda(0).exist``); everywhere else every test
skips and says why. The kernels are built for the device found (``detect_cuda``: its
``sm_XY``, SM count and block limits) and compared with PyTorch's convolution on the same
GPU in FP32 (TF32 off), relative to the output's largest magnitude. The outputs are
poisoned with NaN before each call, so an element the kernel does not write fails.
"""

import functools

import numpy as np
import pytest
import torch
import tvm

from alt_tvm.integration import extract_tasks
from alt_tvm.target import detect_cuda

HAS_GPU = tvm.cuda(0).exist
pytestmark = pytest.mark.skipif(
    not HAS_GPU, reason="no CUDA GPU here (tvm.cuda(0).exist is False): these checks run on a GPU machine, "
                        "see docs/gpu.md")

RTOL = 1e-4  # relative to max|ref|; FP32 with another summation order


class ConvAct(torch.nn.Module):
    """Conv (bias) + an epilogue: ReLU, or a residual add then ReLU (fused into the kernel's write-back)."""

    def __init__(self, conv, residual=False):
        super().__init__()
        self.conv, self.residual = conv, residual

    def forward(self, x):
        y = self.conv(x)
        if self.residual:
            y = y + x
        return torch.relu(y)


class DenseAct(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.relu(self.fc(x))


def conv(c, o, k, **kw):
    return torch.nn.Conv2d(c, o, k, **kw)


# Every kernel family the CUDA strategies emit, each with its fused epilogue.
FAMILIES = {
    "plain_3x3": (lambda: ConvAct(conv(64, 64, 3, padding=1)), (1, 64, 28, 28)),
    "residual_3x3": (lambda: ConvAct(conv(32, 32, 3, padding=1), residual=True), (1, 32, 14, 14)),
    "strided_3x3_s2": (lambda: ConvAct(conv(32, 64, 3, stride=2, padding=1)), (1, 32, 28, 28)),
    "stem_7x7_s2": (lambda: ConvAct(conv(3, 32, 7, stride=2, padding=3)), (1, 3, 64, 64)),
    "pointwise_1x1": (lambda: ConvAct(conv(64, 128, 1)), (1, 64, 14, 14)),
    "grouped_g4": (lambda: ConvAct(conv(64, 64, 3, padding=1, groups=4)), (1, 64, 14, 14)),
    "depthwise_3x3": (lambda: ConvAct(conv(48, 48, 3, padding=1, groups=48)), (1, 48, 28, 28)),
    "depthwise_5x5_s2": (lambda: ConvAct(conv(32, 32, 5, stride=2, padding=2, groups=32)), (1, 32, 28, 28)),
    "dilated_d2": (lambda: ConvAct(conv(32, 32, 3, padding=2, dilation=2)), (1, 32, 20, 20)),
    "conv1d": (lambda: ConvAct(torch.nn.Conv1d(16, 32, 5, padding=2)), (1, 16, 64)),
    "conv3d": (lambda: ConvAct(torch.nn.Conv3d(8, 16, 3, padding=1)), (1, 8, 6, 10, 10)),
    "split_k_3x3_7x7": (lambda: ConvAct(conv(256, 256, 3, padding=1), residual=True), (1, 256, 7, 7)),
    "dense": (lambda: DenseAct(256, 192), (32, 256)),
    "dense_row": (lambda: DenseAct(1024, 96), (1, 1024)),  # batch 1: split-K points in its space
}


@functools.cache
def gpu():
    return detect_cuda()


@functools.cache
def case(name):
    """(torch model, input, its single task on this GPU)."""
    make, shape = FAMILIES[name]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    (task,) = extract_tasks(model, target=gpu(), example_inputs=(x,))
    return model, x, task


def reference(model, x):
    """PyTorch on the GPU in FP32 (no TF32), or on the CPU if this PyTorch has no CUDA."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            return model.to(device)(x.to(device)).cpu().numpy()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        model.cpu()


def run_on_gpu(task, params, x):
    lowered = task.lower(params)
    kernel = tvm.compile(tvm.IRModule({"main": lowered.func}), target=task.target.to_tvm())["main"]
    return lowered.run(kernel, [x.numpy()], tvm.cuda(0))


def points(space, count, seed):
    """The default point, the default without staging or unroll, then ``count`` random valid points."""
    layout, loop = space.default()
    found = [space.params(layout, loop), space.params(layout, {**loop, "shared": False, "unroll": 0})]
    rng = np.random.default_rng(seed)
    while len(found) < 2 + count:
        layout = {k.name: k.choices[int(rng.integers(len(k.choices)))] for k in space.layout_knobs}
        loop = space.random_loop(layout, rng)
        if space.check(layout, loop) is None:
            found.append(space.params(layout, loop))
    return found


def test_the_detected_target_is_the_device():
    target = gpu()
    dev = tvm.cuda(0)
    assert target.to_tvm().kind.name == "cuda"
    assert target.tvm_target["arch"] == "sm_" + dev.compute_version.replace(".", "")
    assert target.num_cores == dev.multi_processor_count > 0


@pytest.mark.parametrize("name", list(FAMILIES))
def test_kernel_family_matches_pytorch_on_the_gpu(name):
    model, x, task = case(name)
    ref = reference(model, x)
    for params in points(task.space, count=3, seed=len(name)):
        out = run_on_gpu(task, params, x)
        assert not np.isnan(out).any(), f"{name}: unwritten outputs with {params}"
        np.testing.assert_allclose(out, ref, rtol=0, atol=RTOL * np.abs(ref).max(), err_msg=f"{name} {params}")


def test_fresh_inputs_give_fresh_outputs():
    """A second, different input through the same compiled kernel: no stale or input-independent result."""
    model, x, task = case("plain_3x3")
    lowered = task.lower(None)
    kernel = tvm.compile(tvm.IRModule({"main": lowered.func}), target=task.target.to_tvm())["main"]
    x2 = torch.randn_like(x)
    out1 = lowered.run(kernel, [x.numpy()], tvm.cuda(0))
    out2 = lowered.run(kernel, [x2.numpy()], tvm.cuda(0))
    ref2 = reference(model, x2)
    np.testing.assert_allclose(out2, ref2, rtol=0, atol=RTOL * np.abs(ref2).max())
    assert not np.allclose(out1, out2)


def test_the_tuner_measures_on_the_gpu_and_its_best_point_is_correct(tmp_path):
    from alt_tvm.records import best_params
    from alt_tvm.tuning.driver import tune_tasks
    from alt_tvm.tuning.remote import isolated_measure

    model, x, task = case("strided_3x3_s2")
    log = tmp_path / "gpu.jsonl"
    (summary,) = tune_tasks([task], trials=12, log=log, measure=isolated_measure(target=task.target),
                            progress=False, batch=32, top_k=4, revalidate=0, features="knobs")
    assert np.isfinite(summary.best_ms) and summary.best_ms > 0
    params = best_params(log, target=task.target)[task.key]
    ref = reference(model, x)
    np.testing.assert_allclose(run_on_gpu(task, params, x), ref, rtol=0, atol=RTOL * np.abs(ref).max())



@pytest.mark.parametrize("name", ["split_k_3x3_7x7", "dense_row"])
def test_split_k_matches_pytorch_at_every_split_on_the_gpu(name):
    """Split-K (partial sums in a first kernel, their sum and the epilogue in a second)."""
    model, x, task = case(name)  # 7x7 / one row: a few dozen output blocks for 100+ SMs
    ref = reference(model, x)
    layout, loop = task.space.default()
    stage = {"rc_split": 32} if name.startswith("split_k") else {"k_split": 16}  # 8 / 64 stages
    assert loop["split_k"] > 1  # few output blocks for the SMs: the untuned point splits
    for split_k in (1, 2, 4, 8):
        params = task.space.params(layout, {**loop, **stage, "split_k": split_k})
        out = run_on_gpu(task, params, x)
        assert not np.isnan(out).any(), f"unwritten outputs with split_k={split_k}"
        np.testing.assert_allclose(out, ref, rtol=0, atol=RTOL * np.abs(ref).max(), err_msg=f"split_k={split_k}")
