"""Does running the search a step ahead of the boards cost search quality? Real timings, equal trials.

With ``lookahead=1`` the tuner proposes batch n+1 before batch n's results are in (ranked
with a cost model one batch stale). This script tunes the same tasks with ``lookahead`` 0 and
1 at equal trials and seeds, then re-times each run's best candidate, interleaved, and prints
the ratio of the two bests.

Every candidate is built and timed in this process, one at a time: a lock serialises the
batches a lookahead keeps out, so no timing is disturbed by another build and only the
information the search had when it proposed each batch differs. The wall time of this script
therefore says nothing about the pipelining's speed (``benchmarks/bench_fleet.py`` measures that).

    python benchmarks/bench_lookahead.py [--layers layer1 layer2 layer3] [--trials 64] [--seeds 0 1]
                                      [--rounds 5] [--json F]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# the fleet benchmark's layers, beside this file (a benchmark's folder is on its import path)
from bench_fleet import LAYERS, conv_task

from alt_tvm.bench import run_interleaved, write_results
from alt_tvm.records import choose_best, load_records
from alt_tvm.tuning.driver import tune_tasks
from alt_tvm.tuning.fleet import Outcome
from alt_tvm.tuning.measure import classify_exception
from alt_tvm.tuning.task import measure_in_process


class SerialBatches:
    """A batch measure that builds and times here, one candidate at a time whatever batch it is in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, task: Any, params: dict[str, Any]) -> float:
        with self._lock:
            return measure_in_process(task, params)

    def measure_batch(self, task: Any, batch: list[dict[str, Any]]):
        for index, params in enumerate(batch):
            with self._lock:
                try:
                    outcome = Outcome(measure_in_process(task, params))
                except Exception as err:  # noqa: BLE001 - a failing candidate is data
                    code, message = classify_exception(err)
                    outcome = Outcome(math.inf, code.name, message)
            yield index, outcome


def best_params(task: Any, *, trials: int, seed: int, lookahead: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "t.jsonl"
        (summary,) = tune_tasks([task], trials=trials, log=log, measure=SerialBatches(), progress=False,
                                revalidate=0, seed=seed, lookahead=lookahead)
        if not summary.ok:
            raise RuntimeError(f"no candidate of {task.key} was measured: {summary.error}")
        best = choose_best(load_records(log))[task.key]
        return best.candidate["params"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", nargs="+", default=["layer1", "layer2", "layer3"], choices=list(LAYERS))
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-timings of each best")
    parser.add_argument("--json", default=None,
                        help="write the rows here (default benchmarks/results/<machine kind>/lookahead.json)")
    args = parser.parse_args()
    if args.trials < 8 or args.rounds < 1:
        parser.error("--trials must be >= 8 and --rounds >= 1")
    rows = []
    print(f"ResNet-18 3x3 convolutions, {args.trials} trials each, real timings serialised; "
          f"best of each run re-timed {args.rounds}x interleaved (median ms)")
    print(f"{'layer':8s} {'seed':>4s} {'lookahead 0':>12s} {'lookahead 1':>12s} {'1 / 0':>7s}")
    for layer in args.layers:
        task = conv_task(layer)
        for seed in args.seeds:
            bests = {ahead: best_params(task, trials=args.trials, seed=seed, lookahead=ahead) for ahead in (0, 1)}
            samples = run_interleaved(2, rounds=args.rounds,
                                      run=lambda ahead, task=task, bests=bests: measure_in_process(task, bests[ahead]))
            times = dict(enumerate(samples))
            med = {ahead: statistics.median(t) for ahead, t in times.items()}
            rows.append({"layer": layer, "seed": seed, "ms": med, "ratio": med[1] / med[0]})
            print(f"{layer:8s} {seed:4d} {med[0]:12.3f} {med[1]:12.3f} {med[1] / med[0]:6.2f}x")
            sys.stdout.flush()
    geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
    print(f"geometric mean of lookahead 1 / lookahead 0 best latency: {geo:.3f} (above 1: lookahead found slower)")
    written = write_results("lookahead", {"trials": args.trials, "rounds": args.rounds, "rows": rows,
                                          "geomean_ratio": geo}, path=args.json)
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
