"""ONNX Runtime's own per-node times for a model, to read beside ``profile_model.py``'s.

    python scripts/profile_ort.py model.onnx [--threads 2] [--runs 60] [--limit 25] [--peak GFLOPS]

Runs the model ``--runs`` times with ONNX Runtime's profiler on (2 intra-op threads, spinning
off, as the benchmarks time it) and prints each node's median kernel time, slowest first:
where ``profile_model.py`` shows an alt-tvm kernel, this shows the node ONNX Runtime ran for
the same operator (its fused and NCHWc-rewritten graph's names). A node that computes a Conv,
Gemm or MatMul of the model (alone or with the element-wise ops ONNX Runtime fused into it)
also gets its GFLOP/s and their share of the FP32 FMA peak, counted as ``profile_model.py``
counts alt-tvm's kernels (direct convolution, 2 FLOPs per multiply-add). The peak is measured
before and after the runs (the best reading) unless ``--peak`` gives it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
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
    import numpy as np
    import onnxruntime as ort

    from alt_tvm.bench.onnx_flops import kernel_flops

    # The trace goes to a folder of its own, not the working directory (an interrupted run left it there).
    trace_dir = tempfile.mkdtemp(prefix="alt_ort_profile_")
    from alt_tvm.bench import PeakReadings, onnxruntime_session
    from alt_tvm.deploy.model import use_runtime_threads

    use_runtime_threads(args.threads)  # TVM's pool, for the peak readings (idle while ONNX Runtime runs)
    peak = PeakReadings(threads=args.threads)
    if args.peak is None:
        peak.measure()
    session = onnxruntime_session(args.model, threads=args.threads, profile_prefix=str(Path(trace_dir) / "ort")).session
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        if "int" in spec.type:  # token ids
            feeds[spec.name] = rng.integers(0, 1000, shape).astype(np.int64)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    for _ in range(args.runs):
        session.run(None, feeds)
    trace = Path(session.end_profiling())
    times = defaultdict(list)
    for event in json.loads(trace.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            times[(event["name"].removesuffix("_kernel_time"), event["args"].get("op_name", ""))].append(event["dur"])
    shutil.rmtree(trace_dir, ignore_errors=True)
    rows = sorted(((statistics.median(v) / 1e3, name, op) for (name, op), v in times.items()), reverse=True)
    best = args.peak if args.peak is not None else peak.measure()
    flops = kernel_flops(str(args.model), [name for _, name, _ in rows])
    print(f"{args.model.name}: ONNX Runtime {ort.__version__}, {args.threads} threads; "
          f"sum of node medians {sum(r[0] for r in rows):.3f} ms; FP32 FMA peak {best:.0f} GFLOP/s")
    print(f"{'ms':>8}     {'GFLOP/s':>7}  {'peak':>4}  {'op':<20} node")
    for ms, name, op in rows[: args.limit]:
        rate = f"{flops[name] / ms / 1e6:7.1f}  {100 * flops[name] / ms / 1e6 / best:3.0f}%" if name in flops \
            else f"{'':7}  {'':4}"
        print(f"{ms:8.3f} ms  {rate}  {op:<20} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
