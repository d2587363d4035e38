"""A CPU peer's own per-node times for a model, to read beside ``alt-tvm profile``'s.

    python scripts/profile_peer.py model.onnx [--peer onnxruntime|openvino] [--threads 2] [--runs 60]
                                   [--limit 25] [--peak GFLOPS]

Runs the model ``--runs`` times in the peer as the benchmarks time it, with the peer's own
per-node timing on, and prints each node's median time, slowest first:

- ``onnxruntime``: its profiler (``--threads`` intra-op threads, spinning off); the names are
  those of its fused and NCHWc-rewritten graph. The trace goes to a folder of its own and is
  removed.
- ``openvino``: its CPU plugin's per-node counters (``--threads`` inference threads, the latency
  hint, f32 precision), with the kernel it chose for each node (``brgconv_avx512_1x1_f32``,
  ``gemm_mlas_f32`` ...).

A node that computes a Conv, Gemm or MatMul of the model (alone or with the element-wise ops the
peer fused into it) also gets its GFLOP/s and their share of the FP32 FMA peak, counted as
``alt-tvm profile`` counts alt-tvm's kernels (direct convolution, 2 FLOPs per multiply-add;
:func:`alt_tvm.bench.onnx_flops.kernel_flops`). The peak is measured before and after the runs
(the best reading) unless ``--peak`` gives it.
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

PEERS = ("onnxruntime", "openvino")


def random_input(shape, *, integral: bool, dtype, rng):
    """Token ids (0-999) for an integer input, else standard normal floats; a dynamic dimension is 1."""
    import numpy as np

    shape = [d if isinstance(d, int) and d > 0 else 1 for d in shape]
    return rng.integers(0, 1000, shape).astype(dtype) if integral else rng.standard_normal(shape).astype(np.float32)


def onnxruntime_nodes(model: Path, *, threads: int, runs: int) -> tuple[str, dict[tuple[str, str, str], list[float]]]:
    """ONNX Runtime's version and, per (node, op, kernel), its kernel times in ms."""
    import numpy as np
    import onnxruntime as ort

    from alt_tvm.bench import onnxruntime_session

    # The trace goes to a folder of its own, not the working directory (an interrupted run left it there).
    trace_dir = tempfile.mkdtemp(prefix="alt_ort_profile_")
    try:
        session = onnxruntime_session(model, threads=threads, profile_prefix=str(Path(trace_dir) / "ort")).session
        rng = np.random.default_rng(0)
        feeds = {spec.name: random_input(spec.shape, integral="int" in spec.type, dtype=np.int64, rng=rng)
                 for spec in session.get_inputs()}
        for _ in range(runs):
            session.run(None, feeds)
        trace = Path(session.end_profiling())
        times = defaultdict(list)
        for event in json.loads(trace.read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                node = (event["name"].removesuffix("_kernel_time"), event["args"].get("op_name", ""), "")
                times[node].append(event["dur"] / 1e3)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    return f"ONNX Runtime {ort.__version__}", times


def openvino_nodes(model: Path, *, threads: int, runs: int) -> tuple[str, dict[tuple[str, str, str], list[float]]]:
    """OpenVINO's version and, per (node, op, kernel) it executed, the node's times in ms."""
    import numpy as np
    import openvino

    from alt_tvm.bench import openvino_session

    runner = openvino_session(model, threads=threads, profile=True)
    rng = np.random.default_rng(0)
    feeds = []
    for port in runner.compiled.inputs:
        kind = port.get_element_type()
        feeds.append(random_input([d.get_length() if d.is_static else 1 for d in port.get_partial_shape()],
                                  integral=kind.is_integral(), dtype=kind.to_dtype(), rng=rng))
    times = defaultdict(list)
    for _ in range(runs):
        runner(*feeds)
        for info in runner.request.profiling_info:
            if info.status.name == "EXECUTED":
                times[(info.node_name, info.node_type, info.exec_type)].append(info.real_time.total_seconds() * 1e3)
    return f"OpenVINO {openvino.get_version()}", times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--peer", choices=PEERS, default="onnxruntime")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--peak", type=float, default=None, help="FP32 FMA peak in GFLOP/s (default: measured)")
    args = parser.parse_args(argv)
    if args.peak is not None and args.peak <= 0:
        parser.error(f"--peak must be positive, got {args.peak}")
    if args.runs < 1 or args.threads < 1:
        parser.error(f"--runs and --threads must be >= 1, got {args.runs} and {args.threads}")
    from alt_tvm.bench import PeakReadings, openvino_available
    from alt_tvm.bench.onnx_flops import kernel_flops
    from alt_tvm.deploy.model import use_runtime_threads

    if args.peer == "openvino" and (why := openvino_available()):
        parser.error(why)
    use_runtime_threads(args.threads)  # TVM's pool, for the peak readings (idle while the peer runs)
    peak = PeakReadings(threads=args.threads)
    if args.peak is None:
        peak.measure()
    nodes = onnxruntime_nodes if args.peer == "onnxruntime" else openvino_nodes
    version, times = nodes(args.model, threads=args.threads, runs=args.runs)
    rows = sorted(((statistics.median(v), *key) for key, v in times.items()), reverse=True)
    best = args.peak if args.peak is not None else peak.measure()
    flops = kernel_flops(str(args.model), [name for _, name, _, _ in rows])
    print(f"{args.model.name}: {version}, {args.threads} threads; "
          f"sum of node medians {sum(r[0] for r in rows):.3f} ms; FP32 FMA peak {best:.0f} GFLOP/s")
    print(f"{'ms':>8}     {'GFLOP/s':>7}  {'peak':>4}  {'op':<20} {'kernel':<22} node")
    for ms, name, op, kernel in rows[: args.limit]:
        rate = f"{flops[name] / ms / 1e6:7.1f}  {100 * flops[name] / ms / 1e6 / best:3.0f}%" if name in flops \
            else f"{'':7}  {'':4}"
        print(f"{ms:8.3f} ms  {rate}  {op:<20} {kernel:<22} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
