"""ResNet-18's convolutions and classifier on a CUDA GPU: alt-tvm's CUDA templates tuned vs
MetaSchedule vs cuDNN/cuBLAS.

Needs a CUDA GPU that TVM sees (``tvm.cuda(0).exist``) and ``nvcc``. For each layer (batch 1,
conv + bias (batch norm folded) + ReLU, or for ``fc`` dense + bias + ReLU; FP32), all in this
run, on the GPU found (``alt_tvm.target.detect_cuda``):

* **alt-tvm untuned**: the CUDA strategy's default point (with ``--split-k``, also that
  point with each split of the reduction among blocks given);
* **alt-tvm tuned**: ``tune_tasks`` with ``--trials`` measured candidates, measured on the GPU
  by ``isolated_measure`` (build in a worker process, time in another), the best record
  lowered and timed;
* **MetaSchedule**: TVM's own tuner on the same layer + bias + ReLU written with TOPI (NCHW),
  ``--ms-trials`` measured candidates (default: ``--trials``);
* **cuDNN** (cuBLAS for ``fc``) through PyTorch, FP32 with TF32 off (the arithmetic the TVM
  kernels do), and with TF32 on (PyTorch's default for convolutions: tensor cores, fewer
  mantissa bits), for reference.

Every kernel's output is checked against PyTorch's FP32 result before it is timed. TVM
kernels are timed with ``time_evaluator`` (CUDA events, at least 50 ms per repeat), cuDNN with
CUDA events over as many calls; the median of ``--repeat`` repeats is reported, with
TFLOP/s and the share of the FP32 rate of the GPU measured in the same run (an FP32
matrix product through cuBLAS with TF32 off). The inputs of one layer fit in the L2 cache:
every runner is timed hot, as in a model whose layers run back to back.

    python benchmarks/bench_gpu.py [--layers layer1 layer2 ...] [--trials 64] [--ms-trials 64]
                                [--repeat 7] [--seed 0] [--json FILE] [--log-dir DIR]
                                [--split-k 1 2 4 8 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import tvm

from alt_tvm.bench.cuda import cuda_events_ms, matmul_rate_tflops, nvidia_driver
from alt_tvm.bench.results import write_results
from alt_tvm.integration import extract_tasks
from alt_tvm.records import best_params
from alt_tvm.target import HardwareTarget, detect_cuda
from alt_tvm.tuning.driver import tune_tasks
from alt_tvm.tuning.remote import isolated_measure

# ResNet-18's distinct 3x3/7x7 convolutions at 224x224: (in, out, kernel, stride, input size).
LAYERS = {
    "conv1": (3, 64, 7, 2, 224),
    "layer1": (64, 64, 3, 1, 56),
    "layer2_down": (64, 128, 3, 2, 56),
    "layer2": (128, 128, 3, 1, 28),
    "layer3": (256, 256, 3, 1, 14),
    "layer4": (512, 512, 3, 1, 7),
}
# ResNet-18's classifier at batch 1: (in features, out features), a GEMM with M = 1.
DENSE_LAYERS = {"fc": (512, 1000)}
RTOL = 1e-4  # relative to max|ref|


class ConvReLU(torch.nn.Module):
    def __init__(self, c: int, o: int, k: int, s: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, o, k, stride=s, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class DenseReLU(torch.nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def layer(name: str) -> tuple[torch.nn.Module, tuple[int, ...], int]:
    """(model, input shape, FLOPs) of the benchmark layer ``name``."""
    if name in DENSE_LAYERS:
        k, n = DENSE_LAYERS[name]
        return DenseReLU(k, n), (1, k), 2 * k * n
    c, o, k, s, size = LAYERS[name]
    return ConvReLU(c, o, k, s), (1, c, size, size), conv_flops(c, o, k, s, size)


@dataclass
class Row:
    layer: str
    gflop: float
    cudnn_fp32_ms: float = float("nan")
    cudnn_tf32_ms: float = float("nan")
    alt_default_ms: float = float("nan")
    alt_tuned_ms: float = float("nan")
    ms_tuned_ms: float = float("nan")
    alt_tune_s: float = float("nan")
    ms_tune_s: float = float("nan")
    alt_trials: int = 0
    ms_trials: int = 0
    alt_default_params: dict = field(default_factory=dict)
    alt_tuned_params: dict = field(default_factory=dict)
    split_k_ms: dict = field(default_factory=dict)  # the default point at each split_k
    errors: str = ""


def conv_flops(c: int, o: int, k: int, s: int, size: int) -> int:
    out = (size + 2 * (k // 2) - k) // s + 1
    return 2 * o * out * out * c * k * k


def check(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    if np.isnan(out).any():
        raise AssertionError(f"{what}: outputs left unwritten")
    err = float(np.abs(out - ref).max() / np.abs(ref).max())
    if not err <= RTOL:
        raise AssertionError(f"{what}: max error {err:.2e} of max|ref| > {RTOL}")


def alt_kernel(task, params, x: np.ndarray, ref: np.ndarray, what: str, repeat: int) -> float:
    """Check and time one point of the alt-tvm task (its arguments in the layouts it reads)."""
    lowered = task.lower(params)
    module = tvm.compile(tvm.IRModule({"main": lowered.func}), target=task.target.to_tvm())
    kernel = module["main"]
    check(lowered.run(kernel, [x], tvm.cuda(0)), ref, what)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(lowered.constants.get(i, rng.standard_normal(shape).astype(dtype)), tvm.cuda(0))
            for i, (shape, dtype) in enumerate(lowered.arg_specs)]
    return _time_executable(module, args, repeat)


def _time_executable(executable: Any, args: list, repeat: int) -> float:
    """Median ms of ``main`` over ``repeat`` repeats of at least 50 ms each (CUDA events)."""
    module = executable.jit() if hasattr(executable, "jit") else executable
    timer = module.time_evaluator("main", tvm.cuda(0), number=1, repeat=repeat, min_repeat_ms=50)
    return float(np.median(timer(*args).results)) * 1e3


def metaschedule(model: torch.nn.Module, x: np.ndarray, ref: np.ndarray, target: HardwareTarget, *, trials: int,
                 seed: int, repeat: int, work_dir: str) -> tuple[float, float]:
    """Tune conv (TOPI, NCHW) or dense, + bias + ReLU, with MetaSchedule; (ms, tuning s)."""
    from tvm import te, topi

    from alt_tvm.graph.metaschedule import tune_kernel

    op = model.fc if isinstance(model, DenseReLU) else model.conv
    w = op.weight.detach().numpy()
    b = op.bias.detach().numpy()
    data = te.placeholder(x.shape, name="data")
    weight = te.placeholder(w.shape, name="weight")
    bias = te.placeholder((w.shape[0],), name="bias")
    if isinstance(model, DenseReLU):
        out = topi.nn.relu(topi.add(topi.nn.dense(data, weight), bias))
    else:
        out = topi.nn.conv2d_nchw(data, weight, op.stride[0], op.padding[0], 1)
        out = topi.nn.relu(topi.add(out, topi.reshape(bias, (1, w.shape[0], 1, 1))))
    func = te.create_prim_func([data, weight, bias, out])
    result = tune_kernel(func, target=target.to_tvm(), trials=trials, seed=seed, work_dir=work_dir,
                         build_workers=os.cpu_count() or 1)
    if result.artifact is None:
        raise RuntimeError(f"MetaSchedule found no kernel: {result.error}")
    executable = tvm.compile(result.artifact, target=target.to_tvm())
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(a, dev) for a in (x, w, b)]
    args.append(tvm.runtime.tensor(np.full(ref.shape, np.nan, np.float32), dev))
    module = executable.jit() if hasattr(executable, "jit") else executable
    module["main"](*args)
    check(args[-1].numpy(), ref, "MetaSchedule")
    return _time_executable(executable, args, repeat), result.tune_s


def _allow_tf32(allow: bool) -> None:
    """TF32 in PyTorch's convolutions (cuDNN) and matrix products (cuBLAS)."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allow


def bench_layer(name: str, target: HardwareTarget, args: argparse.Namespace, log_dir: str) -> Row:
    torch.manual_seed(args.seed)
    model, shape, flops = layer(name)
    model.eval()
    row = Row(name, flops / 1e9)
    x_t = torch.randn(*shape)
    x = x_t.numpy()
    errors = []
    _allow_tf32(False)
    with torch.no_grad():
        gpu_model, gpu_x = model.cuda(), x_t.cuda()
        ref = gpu_model(gpu_x).cpu().numpy()
        row.cudnn_fp32_ms = cuda_events_ms(lambda: gpu_model(gpu_x), repeat=args.repeat)
        _allow_tf32(True)
        row.cudnn_tf32_ms = cuda_events_ms(lambda: gpu_model(gpu_x), repeat=args.repeat)
        _allow_tf32(False)
    model.cpu()
    (task,) = extract_tasks(model, target=target, example_inputs=(x_t,))
    layout, loop = task.space.default()
    row.alt_default_params = task.space.params(layout, loop)
    try:
        row.alt_default_ms = alt_kernel(task, None, x, ref, "alt-tvm default", args.repeat)
    except Exception as err:  # noqa: BLE001 - reported in the row; the other runners go on
        errors.append(f"alt-tvm default: {type(err).__name__}: {err}")
    for split_k in args.split_k:
        point = {**loop, "split_k": split_k}
        if task.space.check(layout, point) is not None:
            continue
        try:
            row.split_k_ms[str(split_k)] = alt_kernel(task, task.space.params(layout, point), x, ref,
                                                      f"alt-tvm default, split_k={split_k}", args.repeat)
        except Exception as err:  # noqa: BLE001
            errors.append(f"alt-tvm split_k={split_k}: {type(err).__name__}: {err}")
    log = os.path.join(log_dir, f"{name}.jsonl")
    try:
        start = time.perf_counter()
        (summary,) = tune_tasks([task], trials=args.trials, log=log, seed=args.seed,
                                measure=isolated_measure(target=target), progress=False)
        row.alt_tune_s, row.alt_trials = time.perf_counter() - start, summary.trials
        row.alt_tuned_params = best_params(log, target=target)[task.key]
        row.alt_tuned_ms = alt_kernel(task, row.alt_tuned_params, x, ref, "alt-tvm tuned", args.repeat)
    except Exception as err:  # noqa: BLE001
        errors.append(f"alt-tvm tuned: {type(err).__name__}: {err}")
    try:
        with tempfile.TemporaryDirectory() as work:
            row.ms_tuned_ms, row.ms_tune_s = metaschedule(model, x, ref, target, trials=args.ms_trials,
                                                          seed=args.seed, repeat=args.repeat, work_dir=work)
        row.ms_trials = args.ms_trials
    except Exception as err:  # noqa: BLE001
        errors.append(f"MetaSchedule: {type(err).__name__}: {err}")
    row.errors = "; ".join(errors)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", nargs="+", default=["layer1", "layer2", "layer3", "layer4"],
                        choices=sorted({**LAYERS, **DENSE_LAYERS}))
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--ms-trials", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None,
                        help="write the rows and the device here (default benchmarks/results/<machine kind>/gpu.json)")
    parser.add_argument("--log-dir", default=None, help="keep the tuning logs here (default: a temporary folder)")
    parser.add_argument("--split-k", nargs="*", type=int, default=[],
                        help="also time the untuned point with each of these split_k values (where valid)")
    args = parser.parse_args(argv)
    args.ms_trials = args.trials if args.ms_trials is None else args.ms_trials
    if args.trials < 2 or args.ms_trials < 1 or args.repeat < 1:
        parser.error("--trials must be >= 2, --ms-trials and --repeat >= 1")
    try:
        target = detect_cuda()
    except RuntimeError as err:
        print(f"bench_gpu: {err}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_gpu: this PyTorch has no CUDA (cuDNN is a baseline)", file=sys.stderr)
        return 2
    dev = tvm.cuda(0)
    peak = matmul_rate_tflops(repeat=args.repeat)
    device = {"name": dev.device_name, "arch": target.tvm_target["arch"], "sms": target.num_cores,
              "driver": dev.driver_version or nvidia_driver(), "tvm": tvm.__version__, "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "fp32_tflops_measured": peak}
    print(f"{dev.device_name} {target.tvm_target['arch']}, {target.num_cores} SMs; "
          f"FP32 (cuBLAS, TF32 off) {peak:.1f} TFLOP/s")
    rows = []
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench_gpu_")
    os.makedirs(log_dir, exist_ok=True)
    for name in args.layers:
        rows.append(bench_layer(name, target, args, log_dir))
        # rewritten after every layer: an interrupted run keeps what it finished
        written = write_results("gpu", {"device": device, "args": vars(args), "rows": [asdict(r) for r in rows]},
                                path=args.json)
        print(rows[-1], flush=True)
    print_table(rows, peak)
    if rows:
        print(f"results: {written}")
    return 0


def print_table(rows: list[Row], peak: float) -> None:
    head = ("layer", "GFLOP", "cuDNN fp32", "cuDNN tf32", "alt default", "alt tuned", "MetaSched",
            "alt/MS", "alt/cuDNN", "alt % FP32")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        tflops = r.gflop / r.alt_tuned_ms if r.alt_tuned_ms == r.alt_tuned_ms else float("nan")
        cells = (r.layer, f"{r.gflop:.3f}", f"{r.cudnn_fp32_ms:.4f}", f"{r.cudnn_tf32_ms:.4f}",
                 f"{r.alt_default_ms:.4f}", f"{r.alt_tuned_ms:.4f}", f"{r.ms_tuned_ms:.4f}",
                 f"{r.ms_tuned_ms / r.alt_tuned_ms:.2f}x", f"{r.cudnn_fp32_ms / r.alt_tuned_ms:.2f}x",
                 f"{100 * tflops / peak:.0f}%")
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.errors:
            print(f"{r.layer}: {r.errors}")


if __name__ == "__main__":
    sys.exit(main())
