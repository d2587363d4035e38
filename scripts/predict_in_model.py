"""How well do a kernel's timings alone predict its time inside the model?

For a few tasks of a model, ``--candidates`` points of each task's space (its default and
seeded random valid points) are timed three ways:

* alone, hot: ``time_evaluator`` calls back to back, weights staying in cache;
* alone, cache-flushed: every argument but the activation flushed before each call (the
  tuner's default, :class:`alt_tvm.timing.TimingPolicy`);
* in the model: copy ``v`` of the model lowers every studied task with its ``v``-th
  candidate (the others at their defaults) and the copies run in interleaved rounds with
  per-kernel timing; a task's time is its kernels' plus the layout conversions its layout
  caused (what :mod:`alt_tvm.in_model` decides with).

Printed per task: Spearman's rank correlation of each alone-timing with the in-model time
over the candidates, and of two independent sets of in-model rounds with each other (the
ceiling noise allows), and the median ratio of in-model to alone time per kernel. The ALT
paper (§6) motivates judging a layout in its graph.

    python scripts/predict_in_model.py [--model resnet18] [--tasks 4] [--candidates 8] [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings


def spearman(a, b) -> float:
    """Spearman's rank correlation (no ties expected among float timings)."""
    import numpy as np

    ranks = [np.argsort(np.argsort(np.asarray(x, dtype=float))) for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def random_params(task, count: int, seed: int) -> list:
    """The default point and up to ``count - 1`` distinct random valid points that lower."""
    import numpy as np

    from alt_tvm.records import candidate_key

    space = task.space
    layout, loop = space.default()
    found = [space.params(layout, loop)]
    seen = {candidate_key(found[0])}
    rng = np.random.default_rng(seed)
    for _ in range(50 * count):
        if len(found) >= count:
            break
        layout = {k.name: k.choices[int(rng.integers(len(k.choices)))] for k in space.layout_knobs}
        loop = space.random_loop(layout, rng)
        if space.check(layout, loop) is not None:
            continue
        params = space.params(layout, loop)
        if candidate_key(params) in seen:
            continue
        try:
            task.lower(params)
        except Exception:  # noqa: BLE001 - a point that does not lower is not a candidate
            continue
        seen.add(candidate_key(params))
        found.append(params)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="reference model name or ONNX file")
    parser.add_argument("--tasks", type=int, default=4, help="tasks studied (the largest by occurrences x output size)")
    parser.add_argument("--candidates", type=int, default=8, help="points per task (default point included)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved in-model rounds per set (two sets)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("tasks", "candidates", "rounds", "threads"):
        if getattr(args, name) < (2 if name == "candidates" else 1):
            parser.error(f"--{name} is too small: {getattr(args, name)}")
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    from alt_tvm.graph.build import build
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.in_model import Choice, choices_log, model_inputs, profile_rounds
    from alt_tvm.integration import extract_tasks
    from alt_tvm.models import MODEL_NAMES, get_model
    from alt_tvm.records import target_key
    from alt_tvm.target import host
    from alt_tvm.timing import measure_peak_gflops
    from alt_tvm.tuning.task import measure_in_process

    if args.model in MODEL_NAMES:
        module, inputs = get_model(args.model)
        imported = load_model(module, example_inputs=inputs)
    else:
        imported = load_model(args.model)
    peak = measure_peak_gflops(threads=args.threads)
    tasks = extract_tasks(imported.mod)
    tasks = sorted(tasks, key=lambda t: -t.weight * math.prod(t.lower(None).arg_specs[-1][0]))[: args.tasks]
    target_json = target_key(host().to_tvm())
    print(f"{args.model}: {len(tasks)} tasks x {args.candidates} candidates, {args.threads} thread(s), "
          f"FP32 FMA peak measured in this run {peak:.0f} GFLOP/s")
    candidates = {task.key: random_params(task, args.candidates, args.seed + i) for i, task in enumerate(tasks)}
    alone = {}
    for task in tasks:
        hot, flushed = [], []
        for params in candidates[task.key]:
            pair = []
            for flush in (False, True):
                pair.append(statistics.median(measure_in_process(task, params, cache_flush=flush) for _ in range(3)))
            hot.append(pair[0])
            flushed.append(pair[1])
        alone[task.key] = (hot, flushed)
    copies = max(len(c) for c in candidates.values())
    built = []
    started = time.perf_counter()
    for v in range(copies):
        picks = {t.key: Choice(t.strategy.name, c[v] if v < len(c) else c[0], f"candidate {v}")
                 for t in tasks for c in [candidates[t.key]]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built.append(build(imported.mod, records=choices_log(f"<copy {v}>", target_json, picks)))
    print(f"built {copies} copies in {time.perf_counter() - started:.0f} s")
    arrays = model_inputs(built[0], seed=args.seed)
    keys = {t.key for t in tasks}
    sets = [profile_rounds(built, arrays, keys=keys, rounds=args.rounds) for _ in range(2)]
    print(f"{'task':58s} {'n':>2s} {'hot~model':>9s} {'flushed~model':>13s} {'model~model':>11s} "
          f"{'model/flushed':>13s} {'model/hot':>9s}")
    summary = {"hot": [], "flushed": [], "retest": []}
    for task in tasks:
        n = len(candidates[task.key])
        # per occurrence: a task that occurs k times has k kernels in the model
        model = [statistics.median(sets[0][task.key][v] + sets[1][task.key][v]) / task.weight for v in range(n)]
        first = [statistics.median(sets[0][task.key][v]) for v in range(n)]
        second = [statistics.median(sets[1][task.key][v]) for v in range(n)]
        hot, flushed = alone[task.key]
        row = {"hot": spearman(hot, model), "flushed": spearman(flushed, model), "retest": spearman(first, second)}
        for k, v in row.items():
            summary[k].append(v)
        ratio_f = statistics.median(m / f for m, f in zip(model, flushed))
        ratio_h = statistics.median(m / h for m, h in zip(model, hot))
        print(f"{task.key[:58]:58s} {n:2d} {row['hot']:9.2f} {row['flushed']:13.2f} {row['retest']:11.2f} "
              f"{ratio_f:12.2f}x {ratio_h:8.2f}x")
    print(f"{'mean':58s} {'':2s} {statistics.mean(summary['hot']):9.2f} {statistics.mean(summary['flushed']):13.2f} "
          f"{statistics.mean(summary['retest']):11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
