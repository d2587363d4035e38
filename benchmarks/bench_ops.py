"""The ALT paper's §7.1 single-operator suite on this machine, all baselines measured in this run.

Nine operator families (C2D, GRP, DEP, DIL, C3D, C1D, GMM, T2D, T3D); configurations are
drawn with a fixed seed from ranges sized for a 2-core CPU (the paper's: batch 1–16,
input channels 3–1280, 10 per family, 1000 trials). For every configuration, at the same
number of **measured trials**:

* alt-tvm: ``alt_tvm.tune`` of the one-operator model (joint layout + loop stage, then
  loop-only), the best record lowered and timed as a kernel (its input/weight/output in the
  tuned layouts, as inside a model where layouts propagate), plus the whole one-op model
  built from the log (with the layout conversions at its boundary, through the VM);
* TVM MetaSchedule (``tvm.s_tir.meta_schedule``, Ansor's successor) on the same operator in
  NCHW-style and channels-last layouts (the paper reports the best layout for tuners), each
  with the same trial budget;
* PyTorch (oneDNN) and TVM's untuned build of the canonical kernel.

Every kernel is checked against PyTorch before it is timed. Speedups are geometric means
per family and overall. Each configuration's kernels are timed together right after it is
tuned, under the same conditions (the script prints them): every runtime on the same
threads (TVM_NUM_THREADS = torch's threads = the target's cores unless ``--threads``),
``--rounds`` interleaved rounds whose order alternates, the median over rounds reported in
ms and as GFLOP/s and % of the FP32 FMA peak measured in the same run. A runner that fails
(tuning finds nothing, a build or check fails, ...) is shown as ``failed`` with its error
listed under the tables; the others go on. The JSON is rewritten after every
configuration (by default ``benchmarks/results/<machine kind>/ops.json``), so an interrupted
run keeps what it finished. The suite's configurations and harness are
:mod:`alt_tvm.bench.ops`; this script tunes, builds and checks each runner.

    python benchmarks/bench_ops.py [--trials 24] [--per-family 1] [--families C2D DEP ...]
                                   [--threads 2] [--rounds 5] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

from alt_tvm.bench.ops import (
    FAMILIES,
    OpConfig,
    Row,
    Timed,
    attempt,
    calibrated,
    canonical_kernel,
    check_result,
    draw_configs,
    flops,
    fmt,
    read_runs,
    report,
    time_row,
    timing_line,
    torch_module,
    torch_timed,
    tvm_timed,
)
from alt_tvm.bench.results import write_results


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--per-family", type=int, default=1, help="configurations per family")
    parser.add_argument("--trials", type=int, default=24, help="measured trials per operator, for each tuner")
    parser.add_argument("--joint-fraction", type=float, default=0.3, help="alt-tvm's joint-stage share (paper 0.3)")
    parser.add_argument("--ms-layouts", nargs="+", default=["nchw", "nhwc"], choices=["nchw", "nhwc"])
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of every runtime (default: the target's cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median reported)")
    parser.add_argument("--repeat", type=int, default=20,
                        help="timed samples per kernel per round (at least 3; fewer if a kernel is slow)")
    parser.add_argument("--skip-ms", action="store_true", help="skip MetaSchedule (e.g. for a quick run)")
    parser.add_argument("--log-dir", default=None,
                        help="keep alt-tvm's logs and MetaSchedule's databases here (default: temporary)")
    parser.add_argument("--json", default=None,
                        help="write the run here (default benchmarks/results/<machine kind>/ops.json)")
    parser.add_argument("--report", nargs="+", default=None, metavar="JSON",
                        help="only print the tables of earlier runs' JSON files (a later file's row replaces an "
                             "earlier row of the same configuration, e.g. a re-measurement)")
    args = parser.parse_args(argv)
    for name in ("per_family", "trials", "threads", "rounds", "repeat"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        return _report_files(args.report)
    from alt_tvm.target import host

    machine = host()  # no kernel has run yet: TVM's thread pool still reads TVM_NUM_THREADS below
    threads = args.threads or machine.num_cores
    os.environ["TVM_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ImportError as err:  # every operator and its reference come from torch.nn
        raise SystemExit(f"bench_ops needs PyTorch for the operators and their reference: {err}") from err
    from alt_tvm.bench import PeakReadings

    torch.set_num_threads(threads)
    configs = draw_configs(families=args.families, per_family=args.per_family, seed=args.seed)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="alt_bench_ops_")
    os.makedirs(log_dir, exist_ok=True)
    rows: list[Row] = []
    ms_import_s = 0.0
    pause_s = 0.05
    line = timing_line(threads=threads, cores=machine.num_cores, rounds=args.rounds, repeat=args.repeat,
                       pause_s=pause_s)
    print(line, flush=True)
    peaks = PeakReadings(threads=threads)
    peak = peaks.measure()
    print(f"FP32 FMA peak at the start: {peak:.0f} GFLOP/s", flush=True)
    for index, cfg in enumerate(configs):
        row = Row(cfg, flops(cfg) / 1e9)
        rows.append(row)
        print(f"[{index + 1}/{len(configs)}] {cfg.family} {cfg.describe()} ({row.gflop:.3f} GFLOP)", flush=True)
        timed, import_s = _set_up(cfg, row, index=index, args=args, threads=threads, machine=machine,
                                  log_dir=log_dir)
        ms_import_s = max(ms_import_s, import_s)
        # This configuration's kernels, all tuned, timed together in interleaved rounds.
        time_row(row, {label: calibrated(fn, repeat=args.repeat) for label, fn in timed.items()},
                 rounds=args.rounds, pause_s=pause_s)
        print("    " + " | ".join(f"{label} {fmt(row.outcome(label), '.3f')}" for label in
                                  ("torch", "tvm_untuned", "ms", "alt_default", "alt_kernel", "alt_model")), flush=True)
        # A shared machine's load drifts: the ceiling is the best peak seen in this run.
        if peaks.measure() > peak:
            print(f"    FP32 FMA peak now {peaks.best:.0f} GFLOP/s (was {peak:.0f}): the run's peak is the best seen",
                  flush=True)
            peak = peaks.best
        # rewritten after every configuration: an interrupted run keeps what it finished
        written = _write_json(args.json, rows, args, threads, peak, ms_import_s, machine, line)
    report(rows, trials=args.trials, threads=threads, peak=peak, ms_import_s=ms_import_s)
    if rows:
        print(f"results: {written}")
    return 1 if any(r.errors or r.failures for r in rows) else 0


def _set_up(cfg: OpConfig, row: Row, *, index: int, args: argparse.Namespace, threads: int, machine: Any,
            log_dir: str) -> tuple[dict[str, Timed], float]:
    """Tune, build and check every runner of one configuration: ``({label: timed}, MS import s)``.

    A runner whose setup fails is left out, its error in ``row.failures``.
    """
    import torch

    target = machine.to_tvm()
    module, x = torch_module(cfg, args.seed + index)
    with torch.no_grad():
        reference = module(x).numpy()
    weight = module.weight.detach().numpy()
    timed: dict[str, Timed] = {"torch": torch_timed(module, x, threads=threads)}

    alt = attempt(row, "alt", lambda: _alt_tvm(module, x, reference, index=index, cfg=cfg, args=args,
                                                 machine=machine, log_dir=log_dir, row=row))
    if alt is not None:
        task, compiled, best = alt
        if best is None:
            print("    alt-tvm's log keeps the default schedule: its tuned kernel is the default one", flush=True)
        for label, params in (("alt_kernel", best), ("alt_default", None)):
            kernel = attempt(row, label, lambda p=params: _task_timed(task, p, seed=args.seed))
            if kernel is not None:
                timed[label] = kernel
        timed["alt_model"] = lambda number, repeat: compiled.time(x.numpy(), number=number, repeat=repeat)[1]

    untuned = attempt(row, "tvm_untuned", lambda: _untuned(cfg, weight, x.numpy(), reference, target=target))
    if untuned is not None:
        timed["tvm_untuned"] = untuned
    import_s = 0.0
    # A dense has no channel layout (canonical_kernel ignores channels_last): one search, not none.
    layouts = args.ms_layouts[:1] if cfg.family == "GMM" else args.ms_layouts
    for layout in layouts:
        if args.skip_ms:
            row.skipped.append(f"ms_{layout}")
            continue
        work_dir = os.path.join(log_dir, f"{index:02d}_{cfg.family}_ms_{layout}")
        found = attempt(row, f"ms_{layout}", lambda layout=layout, work_dir=work_dir: _metaschedule(
            cfg, weight, x.numpy(), reference, layout=layout, target=target, work_dir=work_dir,
            trials=args.trials, seed=args.seed))
        if found is not None:
            timed[f"ms_{layout}"], row.ms_tune_s[layout], found_import_s = found
            import_s = max(import_s, found_import_s)
    return timed, import_s


def _write_json(path, rows, args, threads, peak, ms_import_s, machine, line):
    """The run so far, through :func:`~alt_tvm.bench.results.write_results` (suite ``ops``)."""
    return write_results("ops", {"argv": sys.argv[1:], "threads": threads, "trials": args.trials,
                                 "rounds": args.rounds, "repeat": args.repeat, "timing": line, "peak_gflops": peak,
                                 "ms_import_s": ms_import_s,
                                 "machine": {"name": machine.name, "cores": machine.num_cores,
                                             "l1d": machine.l1d_bytes, "l2": machine.l2_bytes},
                                 "rows": [dict(asdict(r), ms_best_ms=r.ms_best_ms) for r in rows]},
                         path=path, peak_gflops=peak, threads=threads)


def _alt_tvm(module, x, reference, *, index: int, cfg: OpConfig, args, machine, log_dir: str, row: Row):
    """Tune the one-op model with alt-tvm, build it and check it: ``(task, compiled model, best params)``."""
    from alt_tvm.graph.build import build
    from alt_tvm.integration import extract_tasks, tune
    from alt_tvm.records import best_params

    log = os.path.join(log_dir, f"{index:02d}_{cfg.family}.jsonl")
    if os.path.exists(log):
        os.remove(log)
    start = time.perf_counter()
    model, example = _importable(module, x, os.path.join(log_dir, f"{index:02d}_{cfg.family}.onnx"))
    tune(model, trials=args.trials, log=log, target=machine, example_inputs=example, seed=args.seed,
         joint_fraction=args.joint_fraction, progress=False)
    row.alt_tune_s = time.perf_counter() - start
    tasks = extract_tasks(model, target=machine, example_inputs=example)
    if len(tasks) != 1:
        raise RuntimeError(f"expected one tunable task, got {len(tasks)}")
    task = tasks[0]
    # None: the log's decision keeps the default schedule (e.g. tuned ones lost inside the model),
    # which is then what the build uses and what "tuned kernel" means; {} would not lower.
    params = best_params(log, target=machine).get(task.key)
    row.alt_params = params or {}
    compiled = build(model, target=machine, example_inputs=example, records=log)
    check_result(compiled(x.numpy())[0], reference, "alt-tvm model")
    return task, compiled, params


def _importable(module, x, onnx_path: str):
    """``(model, example_inputs)`` for alt-tvm: the torch module, or its ONNX export where TVM's
    PyTorch frontend lacks the operator (ConvTranspose3d in TVM 0.27)."""
    import torch

    from alt_tvm.graph.frontend import ModelImportError, load_model

    try:
        load_model(module, example_inputs=(x,))
        return module, (x,)
    except ModelImportError:
        torch.onnx.export(module, (x,), onnx_path, dynamo=False)
        return onnx_path, None


def _task_timed(task, params, *, seed: int) -> Timed:
    """alt-tvm's kernel for ``params`` (None: the default schedule), built once, on the arguments
    the tuner measures it with (``measure_in_process``'s)."""
    import numpy as np
    import tvm

    lowered = task.lower(params)
    module = tvm.compile(lowered.func, target=task.target.to_tvm()).jit()
    rng = np.random.default_rng(seed)
    args = []
    for i, (shape, dtype) in enumerate(lowered.arg_specs):
        data = lowered.constants.get(i)
        if data is None:
            data = rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.zeros(shape, dtype)
        args.append(tvm.runtime.tensor(data, tvm.cpu()))
    module["main"](*args)
    return tvm_timed(module, args)


def _untuned(cfg: OpConfig, weight, data, reference, *, target) -> Timed:
    """TVM's untuned build of the canonical kernel, checked."""
    import numpy as np
    import tvm

    func, _ = canonical_kernel(cfg, weight.shape, channels_last=False)
    lib = tvm.compile(func, target=target)
    args_nd = [tvm.runtime.tensor(a, tvm.cpu()) for a in (data, weight)]
    args_nd.append(tvm.runtime.tensor(np.zeros(reference.shape, "float32"), tvm.cpu()))
    lib["main"](*args_nd)
    check_result(args_nd[-1].numpy(), reference, "TVM untuned kernel")
    return tvm_timed(lib.mod, args_nd)


def _metaschedule(cfg, weight, data, reference, *, layout: str, target, trials: int, seed: int, work_dir: str):
    """Tune the canonical (or channels-last) kernel: ``(timed, tune_s, import_s)``; raises if it fails."""
    import numpy as np
    import tvm

    from alt_tvm.graph.metaschedule import tune_kernel

    func, layouts = canonical_kernel(cfg, weight.shape, channels_last=layout == "nhwc")
    shutil.rmtree(work_dir, ignore_errors=True)  # a fresh search, its database kept for inspection
    result = tune_kernel(func, target=target, trials=trials, seed=seed, work_dir=work_dir)
    if result.artifact is None:
        raise RuntimeError(f"no valid schedule in {trials} trials: {result.error}")
    lib = tvm.compile(result.artifact, target=target)
    dev = tvm.cpu()
    data_in = layouts["data"].apply(data) if layouts else data
    weight_in = layouts["weight"].apply(weight) if layouts else weight
    out_shape = layouts["out"].shape if layouts else reference.shape
    args_nd = [tvm.runtime.tensor(np.ascontiguousarray(a, dtype="float32"), dev) for a in (data_in, weight_in)]
    args_nd.append(tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev))
    lib["main"](*args_nd)
    out = layouts["out"].inverse_apply(args_nd[-1].numpy()) if layouts else args_nd[-1].numpy()
    check_result(out, reference, "MetaSchedule kernel")
    return tvm_timed(lib.mod, args_nd), result.tune_s, result.import_s


def _report_files(paths) -> int:
    """Merge the rows of earlier runs and print their tables (no measuring)."""
    meta, rows = read_runs(paths)
    if meta.get("timing"):
        print(meta["timing"])
    report(rows, trials=meta["trials"], threads=meta["threads"], peak=meta["peak_gflops"],
           ms_import_s=meta["ms_import_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
