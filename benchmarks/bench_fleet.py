"""Tuning throughput: boards in parallel (a simulation), and parallel, pipelined builds (real).

Two parts, both on tasks of ResNet-18's convolutions (batch 1, conv + bias + ReLU):

1. **Scheduling, by simulation.** ``tune_tasks`` with the real tuner (PPO search, XGBoost
   cost model on the knobs) but a builder and runner that only sleep
   (``alt_tvm.tuning.measure.simulated``): a build takes ``--build-s`` seconds, a run
   ``--run-s`` on the first free one of N simulated boards, so the wall time measures the
   scheduling alone (the 2-core machine does not bound it). For each N, ``--sim-trials``
   trials of one task (batches of ``--top-k``), and of several tasks in flight, each with
   the search running ``--lookahead`` steps ahead of the boards (0: a batch is proposed only
   once the previous one's results are in); the ideal is ``trials x run_s / N`` (the runs are
   the slower stage). Nothing is compiled or timed in this part: **it is a simulation**.
2. **Builds on this machine, real.** ``--candidates`` candidates of the ResNet-18 layer1 task
   built with TVM (``LocalBuilder``) and timed (``LocalRunner``) through
   ``PipelinedMeasure``: one build at a time; ``--workers`` builds at once, runs after the
   whole batch is built; and the same with each run started as its build finishes
   (pipelined). Configurations are interleaved over ``--rounds`` rounds (medians
   reported), each builder's worker processes are started before timing, and the
   candidates' latencies under each configuration are compared, since on a machine that
   both builds and times, a build beside a timed run can disturb the timing.

    python benchmarks/bench_fleet.py [--sim-trials 256] [--boards 1 2 4 8] [--build-s 0.1] [--run-s 0.5]
                                  [--in-flight 1 2 4] [--lookahead 0 1]
                                  [--candidates 8] [--workers 2] [--rounds 3] [--skip-real] [--json F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

from alt_tvm.bench import run_interleaved, write_results
from alt_tvm.integration import extract_tasks
from alt_tvm.tuning.driver import tune_tasks
from alt_tvm.tuning.fleet import PipelinedMeasure
from alt_tvm.tuning.measure import LocalBuilder, LocalRunner
from alt_tvm.tuning.measure.simulated import SleepBuilder, SleepRunner

# (in, out, input size) of ResNet-18's 3x3 stride-1 convolutions
LAYERS = {"layer1": (64, 64, 56), "layer2": (128, 128, 28), "layer3": (256, 256, 14), "layer4": (512, 512, 7)}


def conv_task(layer: str) -> Any:
    cin, cout, size = LAYERS[layer]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.ReLU()).eval()
    (task,) = extract_tasks(model, example_inputs=(torch.randn(1, cin, size, size),))
    return task


def simulate(tasks: list[Any], *, boards: int, trials: int, top_k: int, build_s: float, run_s: float,
             build_workers: int, seed: int, lookahead: int) -> float:
    """Wall seconds of tuning ``tasks`` (all in flight) for ``trials`` on ``boards`` simulated boards."""
    with tempfile.TemporaryDirectory() as tmp, \
            PipelinedMeasure(builder=SleepBuilder(build_s), runner=SleepRunner(boards, run_s),
                             build_workers=build_workers, boards=boards) as measure:
        start = time.perf_counter()
        summaries = tune_tasks(tasks, trials=trials, log=os.path.join(tmp, "sim.jsonl"), measure=measure,
                               progress=False, features="knobs", top_k=top_k, batch=64, revalidate=0, seed=seed,
                               in_flight=len(tasks), lookahead=lookahead)
        wall = time.perf_counter() - start
    done = sum(s.trials for s in summaries)
    if done != trials:
        raise RuntimeError(f"the simulation measured {done} trials, not {trials}")
    return wall


def candidates(task: Any, count: int, seed: int) -> list[dict[str, Any]]:
    layout, _ = task.space.default()
    rng = np.random.default_rng(seed)
    found: list[dict[str, Any]] = []
    for _ in range(100 * count):
        loop = task.space.random_loop(layout, rng)
        if task.space.check(layout, loop) is None:
            params = task.space.params(layout, loop)
            if params not in found:
                found.append(params)
        if len(found) == count:
            return found
    raise RuntimeError(f"found only {len(found)} valid candidates")


def real_builds(task: Any, *, count: int, workers: int, rounds: int, seed: int) -> dict[str, Any]:
    """Walls of building and timing ``count`` candidates three ways, interleaved over ``rounds``."""
    points = candidates(task, count, seed)
    configs = {"one build at a time": (1, False), f"{workers} builds at once": (workers, False),
               f"{workers} builds at once, pipelined": (workers, True)}
    measures = {}
    for name, (build_workers, overlap) in configs.items():
        builder = LocalBuilder(target=task.target, n_parallel=build_workers, timeout_s=120)
        runner = LocalRunner(number=5, repeat=3, timeout_s=60, num_cores=task.target.num_cores)
        measures[name] = PipelinedMeasure(builder=builder, runner=runner, build_workers=build_workers,
                                          overlap=overlap)
        list(measures[name].measure_batch(task, points[:build_workers]))  # start the workers, untimed
    names = list(measures)

    def turn(i: int) -> tuple[float, list[float], float]:
        name, measure = names[i], measures[names[i]]
        measure.stats.build_s.clear()
        start = time.perf_counter()
        outcomes = dict(measure.measure_batch(task, points))
        wall = time.perf_counter() - start
        bad = [o for o in outcomes.values() if not o.ok]
        if bad:
            raise RuntimeError(f"{name}: {bad[0].error_code}: {bad[0].error_msg}")
        return wall, [outcomes[i].latency_ms for i in range(count)], sum(measure.stats.build_s)

    runs = dict(zip(names, run_interleaved(len(names), rounds=rounds, run=turn)))
    walls = {name: [wall for wall, _, _ in runs[name]] for name in names}
    latencies = {name: [latency for _, latency, _ in runs[name]] for name in names}
    builds = {name: [built for _, _, built in runs[name]] for name in names}
    for measure in measures.values():
        measure.close()
    base = statistics.median(walls["one build at a time"])
    rows = {}
    for name in configs:
        per_candidate = np.median(np.asarray(latencies[name]), axis=0)
        rows[name] = {"wall_s": statistics.median(walls[name]), "speedup": base / statistics.median(walls[name]),
                      "build_s_sum": statistics.median(builds[name]), "latency_ms": per_candidate.tolist()}
    first = np.asarray(rows["one build at a time"]["latency_ms"])
    for row in rows.values():  # how far each candidate's latency moved from the undisturbed one
        row["latency_vs_serial"] = float(np.median(np.asarray(row["latency_ms"]) / first))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sim-trials", type=int, default=256)
    parser.add_argument("--boards", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--build-s", type=float, default=0.1, help="simulated build seconds")
    parser.add_argument("--run-s", type=float, default=0.5, help="simulated run seconds (a slow board)")
    parser.add_argument("--sim-build-workers", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=8, help="candidates per batch")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4],
                        help="tasks tuned at once (ResNet-18 layer1, layer2, ... in that order)")
    parser.add_argument("--lookahead", type=int, nargs="+", default=[0, 1],
                        help="search steps proposed before the previous one's results are in")
    parser.add_argument("--candidates", type=int, default=8, help="real part: candidates built per batch")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="real part: build workers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--json", default=None,
                        help="write the report here (default benchmarks/results/<machine kind>/fleet.json)")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    if min(args.lookahead) < 0:
        parser.error(f"--lookahead: ints >= 0, got {args.lookahead}")
    if max(args.in_flight) > len(LAYERS) or min(args.in_flight) < 1:
        parser.error(f"--in-flight: between 1 and {len(LAYERS)} tasks")
    tasks = [conv_task(layer) for layer in LAYERS][: max(args.in_flight)]
    if not args.skip_sim:
        print(f"1. SIMULATION: {args.sim_trials} trials; a build sleeps {args.build_s} s "
              f"({args.sim_build_workers} at once), a run {args.run_s} s on one of N simulated boards; "
              f"batches of {args.top_k}")
        combos = [(n, ahead) for ahead in args.lookahead for n in args.in_flight]
        print(f"{'boards':>6s} {'ideal s':>8s}" + "".join(f" {f'{n} in flight, ahead {ahead}':>20s} {'of linear':>9s}"
                                                        for n, ahead in combos))
        rows = []
        for boards in args.boards:
            ideal = args.sim_trials * args.run_s / boards
            row: dict[str, Any] = {"boards": boards, "ideal_s": ideal}
            line = f"{boards:6d} {ideal:8.1f}"
            for n, ahead in combos:
                wall = simulate(tasks[:n], boards=boards, trials=args.sim_trials, top_k=args.top_k,
                                build_s=args.build_s, run_s=args.run_s, build_workers=args.sim_build_workers,
                                seed=args.seed, lookahead=ahead)
                row[f"in_flight_{n}_lookahead_{ahead}"] = {"wall_s": wall, "of_linear": ideal / wall}
                line += f" {wall:20.1f} {ideal / wall:9.2f}"
            rows.append(row)
            print(line)
            sys.stdout.flush()
        report["simulation"] = {"build_s": args.build_s, "run_s": args.run_s, "trials": args.sim_trials,
                                "top_k": args.top_k, "rows": rows}
    if not args.skip_real:
        print(f"\n2. REAL, this machine ({os.cpu_count()} CPUs): {args.candidates} candidates of ResNet-18 layer1 "
              f"(64->64, 3x3, 56x56), built and timed; median of {args.rounds} interleaved rounds")
        rows = real_builds(tasks[0], count=args.candidates, workers=args.workers, rounds=args.rounds,
                           seed=args.seed)
        print(f"{'configuration':36s} {'wall s':>7s} {'speedup':>8s} {'sum of builds s':>16s} "
              f"{'latency vs serial':>18s}")
        for name, row in rows.items():
            print(f"{name:36s} {row['wall_s']:7.1f} {row['speedup']:7.2f}x {row['build_s_sum']:16.1f} "
                  f"{row['latency_vs_serial']:17.3f}x")
        report["real"] = rows
    print(f"results: {write_results('fleet', report, path=args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
