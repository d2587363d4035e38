"""ONNX Runtime's own per-node times for a model, to read beside ``profile_model.py``'s.

    python scripts/profile_ort.py model.onnx [--threads 2] [--runs 60] [--limit 25]

Runs the model ``--runs`` times with ONNX Runtime's profiler on (2 intra-op threads, spinning
off, as the benchmarks time it) and prints each node's median kernel time, slowest first:
where ``profile_model.py`` shows an alt-tvm kernel, this shows the node ONNX Runtime ran for
the same operator (its fused and NCHWc-rewritten graph's names).
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
    args = parser.parse_args(argv)
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    # The trace goes to a folder of its own, not the working directory (an interrupted run left it there).
    trace_dir = tempfile.mkdtemp(prefix="alt_ort_profile_")
    options.profile_file_prefix = str(Path(trace_dir) / "ort")
    session = ort.InferenceSession(str(args.model), options, providers=["CPUExecutionProvider"])
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
    print(f"{args.model.name}: ONNX Runtime {ort.__version__}, {args.threads} threads; "
          f"sum of node medians {sum(r[0] for r in rows):.3f} ms")
    for ms, name, op in rows[: args.limit]:
        print(f"{ms:8.3f} ms  {op:<20} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
