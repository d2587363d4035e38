"""Per-kernel profile of a model built by alt-tvm: where the time goes inside the model.

Builds the model (an ONNX file, or a reference model name of ``alt_tvm.models``), runs it
``--repeat`` times with every kernel timed by the Relax VM's instrument, and prints the
table of :meth:`alt_tvm.deploy.profile.KernelProfile.table`: kernel, kind, median ms,
share of a run, GFLOP/s and GB/s (minimum traffic), how close it is to the nearer roof
(FMA peak or memory bandwidth, both measured first in this run), operators and output layout.

    python scripts/profile_model.py models/public/tv_resnet50.onnx [--limit 25] [--records LOG]
        [--markdown docs/profile_resnet50.md]

The instrument costs a few microseconds per kernel call, so the table's total is a little
above the model's latency measured without it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="ONNX file or reference model name (resnet18, mobilenet_v2, ...)")
    parser.add_argument("--records", default=None, help="tuning log to build with")
    parser.add_argument("--repeat", type=int, default=10, help="profiled runs (median per kernel)")
    parser.add_argument("--limit", type=int, default=30, help="rows shown (the rest summed in one line)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: the target's cores)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here, in a code block")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import alt_tvm
    from alt_tvm.bench import PeakReadings, measure_memory_bandwidth
    from alt_tvm.deploy.model import use_runtime_threads
    from alt_tvm.target import host

    threads = args.threads or host().num_cores
    use_runtime_threads(threads)
    peak = PeakReadings(threads=threads)
    peak.measure()
    bandwidth = measure_memory_bandwidth(threads=threads)
    model = args.model
    inputs = None
    if not Path(model).exists():
        from alt_tvm.models import get_model

        module, inputs = get_model(model)
        model = module
    started = time.perf_counter()
    built = alt_tvm.build(model, records=args.records, example_inputs=inputs)
    build_s = time.perf_counter() - started
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(dtype) if dtype.startswith("float") else np.zeros(shape, dtype)
              for shape, dtype in zip(built.input_shapes, built.input_dtypes)]
    profile = built.profile(*arrays, repeat=args.repeat)
    _, median_ms = built.time(*arrays, number=10, repeat=5)
    peak.measure()  # again after the profile: one reading can land in a slow phase of the host
    head = (f"{args.model}: built in {build_s:.1f} s; {built.report.summary().splitlines()[0]}\n"
            f"latency {median_ms:.3f} ms (median, no instrument); measured now on {threads} threads: FP32 FMA "
            f"peak {peak.describe()}, memory bandwidth {bandwidth:.0f} GB/s (the 'roof' column: the nearer roof)")
    table = profile.table(limit=args.limit, peak_gflops=peak.best, bandwidth_gbs=bandwidth)
    print(head)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(f"{head}\n\n```\n{table}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
