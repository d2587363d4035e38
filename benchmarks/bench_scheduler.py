"""Static shares vs the gradient task scheduler, on a public model, at equal trials.

Tunes every tunable task of an ONNX model (e.g. torchvision's SqueezeNet 1.1 exported by
``scripts/export_public.py``) twice on this machine, with ``--trials`` measured candidates in
all: once with ``scheduler="static"`` (each task its share by weight) and once with
``scheduler="gradient"`` (rounds to the task expected to cut the most off the model). Each
run builds and times its candidates for real (``isolated_measure``: parallel builds, runs
after the batch is built). The figure of merit is what the scheduler optimises: the sum over
tasks of weight x best latency, i.e. the model's time in its tuned operators, before
(defaults) and after; the best latencies are medians of re-validated finalists (3 x 2 more
measurements), so one lucky draw does not decide. Runs alternate over ``--seeds`` seeds.

The rows go to ``benchmarks/results/<machine kind>/tuning.json`` unless ``--json`` says where.

    python benchmarks/bench_scheduler.py MODEL.onnx [--trials 120] [--seeds 0 1] [--top-k 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

from alt_tvm.bench.results import write_results
from alt_tvm.integration import extract_tasks
from alt_tvm.target import host
from alt_tvm.tuning.driver import tune_tasks
from alt_tvm.tuning.remote import isolated_measure


def model_ms(summaries, attr: str) -> float:
    """Sum of weight x latency over the tasks (inf if a task has none)."""
    return sum(s.weight * getattr(s, attr) for s in summaries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="ONNX file")
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--json", default=None,
                        help="write the rows here (default benchmarks/results/<machine kind>/tuning.json)")
    args = parser.parse_args()
    if not os.path.isfile(args.model):
        parser.error(f"{args.model}: no such file")
    tasks = extract_tasks(args.model, target=host())
    print(f"{os.path.basename(args.model)}: {len(tasks)} tasks, {sum(t.weight for t in tasks)} operators; "
          f"{args.trials} trials per run, batches of {args.top_k}; time in the tuned operators (sum of weight x ms)")
    print(f"{'seed':>4s} {'scheduler':>9s} {'untuned ms':>10s} {'tuned ms':>9s} {'speedup':>8s} {'wall s':>7s}")
    tuned: dict[str, list[float]] = {"static": [], "gradient": []}
    rows = []
    for seed in args.seeds:
        for scheduler in tuned:
            with tempfile.TemporaryDirectory() as tmp, isolated_measure(target=host(), number=5, repeat=3) as measure:
                start = time.perf_counter()
                summaries = tune_tasks(tasks, trials=args.trials, log=os.path.join(tmp, "log.jsonl"), seed=seed,
                                       measure=measure, progress=False, features="knobs", top_k=args.top_k,
                                       scheduler=scheduler)
                wall = time.perf_counter() - start
            before, after = model_ms(summaries, "default_ms"), model_ms(summaries, "best_ms")
            tuned[scheduler].append(after)
            rows.append({"seed": seed, "scheduler": scheduler, "untuned_ms": before, "tuned_ms": after,
                         "wall_s": wall})
            speedup = before / after if math.isfinite(before) and math.isfinite(after) else math.nan
            print(f"{seed:4d} {scheduler:>9s} {before:10.3f} {after:9.3f} {speedup:7.2f}x {wall:7.0f}")
            sys.stdout.flush()
    ratio = statistics.median(tuned["static"]) / statistics.median(tuned["gradient"])
    print(f"median tuned time, static / gradient: {ratio:.3f}x")
    written = write_results("tuning", {"model": os.path.basename(args.model), "trials": args.trials,
                                       "top_k": args.top_k, "rows": rows, "static_over_gradient": ratio},
                            path=args.json)
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
