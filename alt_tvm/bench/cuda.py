"""Timing on a CUDA GPU through PyTorch: CUDA events, and the GPU's measured matrix rates.

The ceilings GPU kernels are read against are measured in the same run, not taken from a
datasheet: an 8192^3 matrix product through cuBLAS in FP32 with TF32 off (the arithmetic
alt-tvm's FP32 kernels do) and with TF32 on (the tensor cores' FP32 mode).
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from typing import Any

__all__ = ["cuda_events_ms", "matmul_rate_tflops", "nvidia_driver"]


def cuda_events_ms(fn: Callable[[], Any], *, repeat: int, min_ms: float = 50.0) -> float:
    """Median over ``repeat`` of the mean time per call of ``fn`` in ms (CUDA events around
    enough back-to-back calls to last ``min_ms``; one warm-up call first)."""
    import torch

    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat!r}")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    number = 1
    while True:  # calls per repeat: enough for min_ms
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= min_ms or number >= 1 << 16:
            break
        number *= 2
    times = []
    for _ in range(repeat):
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / number)
    return statistics.median(times)


def matmul_rate_tflops(*, repeat: int, tf32: bool = False, size: int = 8192) -> float:
    """This GPU's FP32 matrix rate through cuBLAS (``tf32``: with TF32 tensor cores) in
    TFLOP/s: a ``size``^3 product of random matrices."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a = torch.randn(size, size, device="cuda")
        b = torch.randn(size, size, device="cuda")
        ms = cuda_events_ms(lambda: torch.mm(a, b), repeat=repeat, min_ms=200.0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return 2 * size**3 / (ms * 1e-3) / 1e12


def nvidia_driver() -> str | None:
    """The driver version nvidia-smi reports (TVM 0.27's ``Device.driver_version`` is None for CUDA)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None
