"""OpenVINO's own per-node times for a model, to read beside ``alt-tvm profile``'s.

    python scripts/profile_openvino.py model.onnx [--threads 2] [--runs 60] [--limit 25] [--peak GFLOPS]

Compiles the model with OpenVINO's CPU plugin as the benchmarks time it (``--threads`` inference
threads, the latency hint, f32 precision; :func:`alt_tvm.bench.openvino_session`) with its
per-node counters on, runs it ``--runs`` times and prints each executed node's median time,
slowest first, with the kernel OpenVINO chose for it (``brgemm_avx512``, ``jit_avx512`` ...).
A node that computes a Conv, Gemm or MatMul of the model (alone or with the element-wise ops
OpenVINO fused into it) also gets its GFLOP/s and their share of the FP32 FMA peak, counted as
``alt-tvm profile`` counts alt-tvm's kernels (direct convolution, 2 FLOPs per multiply-add).
The peak is measured before and after the runs (the best reading) unless ``--peak`` gives it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--peak", type=float, default=None, help="FP32 FMA peak in GFLOP/s (default: measured)")
    args = parser.parse_args(argv)
    if args.peak is not None and args.peak <= 0:
        parser.error(f"--peak must be positive, got {args.peak}")
    if args.runs < 1 or args.threads < 1:
        parser.error(f"--runs and --threads must be >= 1, got {args.runs} and {args.threads}")
    import numpy as np

    from alt_tvm.bench import PeakReadings, openvino_available, openvino_session
    from alt_tvm.bench.onnx_flops import kernel_flops
    from alt_tvm.deploy.model import use_runtime_threads

    why = openvino_available()
    if why:
        parser.error(why)
    use_runtime_threads(args.threads)  # TVM's pool, for the peak readings (idle while OpenVINO runs)
    peak = PeakReadings(threads=args.threads)
    if args.peak is None:
        peak.measure()
    runner = openvino_session(args.model, threads=args.threads, profile=True)
    rng = np.random.default_rng(0)
    feeds = []
    for port in runner.compiled.inputs:
        shape = [d.get_length() if d.is_static else 1 for d in port.get_partial_shape()]
        if port.get_element_type().is_integral():  # token ids
            feeds.append(rng.integers(0, 1000, shape).astype(port.get_element_type().to_dtype()))
        else:
            feeds.append(rng.standard_normal(shape).astype(np.float32))
    times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for _ in range(args.runs):
        runner(*feeds)
        for info in runner.request.profiling_info:
            if info.status.name != "EXECUTED":
                continue
            times[(info.node_name, info.node_type, info.exec_type)].append(info.real_time.total_seconds() * 1e3)
    rows = sorted(((statistics.median(v), *key) for key, v in times.items()), reverse=True)
    best = args.peak if args.peak is not None else peak.measure()
    flops = kernel_flops(str(args.model), [name for _, name, _, _ in rows])
    import openvino

    print(f"{args.model.name}: OpenVINO {openvino.get_version()}, {args.threads} threads; "
          f"sum of node medians {sum(r[0] for r in rows):.3f} ms; FP32 FMA peak {best:.0f} GFLOP/s")
    print(f"{'ms':>8}     {'GFLOP/s':>7}  {'peak':>4}  {'op':<18} {'kernel':<22} node")
    for ms, name, op, kernel in rows[: args.limit]:
        rate = f"{flops[name] / ms / 1e6:7.1f}  {100 * flops[name] / ms / 1e6 / best:3.0f}%" if name in flops \
            else f"{'':7}  {'':4}"
        print(f"{ms:8.3f} ms  {rate}  {op:<18} {kernel:<22} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
