"""End-to-end latency of the reference models at batch 1, all measured in this one run.

For each model: alt-tvm (untuned default strategies; optionally the ALT-WP / ALT-OL
variants), TVM 0.27's untuned default build (``tvm.compile`` of the imported module),
the CPU peers ONNX Runtime and OpenVINO (:mod:`alt_tvm.bench.peers`: OpenVINO's CPU plugin
with the latency hint and f32 precision; skipped, saying why, where it is not installed) and
PyTorch, on the same ONNX export and the same thread count. Every alt-tvm build is checked
against ONNX Runtime, and OpenVINO against alt-tvm, with the model's tolerance before anything
is timed. All runtimes live in this process with ONNX Runtime's pool not spinning
(``allow_spinning=0``), and are timed in ``--rounds`` interleaved rounds of ``--repeat`` calls
(each round starts with another runner); the median of the rounds' medians is reported. TVM's
untuned build is too slow to interleave and is timed after the rounds. Each alt-tvm build is
read against the faster of the CPU peers (peer ms / alt-tvm ms, above 1: alt-tvm faster), and
the run ends with their geometric mean over the models and the models where alt-tvm is behind.

With ``--trials N`` the model is also tuned: alt-tvm (``alt_tvm.tune``, N measured
trials, each variant built from that log) and TVM MetaSchedule (``tune_relax`` over the
fused kernels of TVM's own pipeline, the same N measured trials); both tuned builds are
checked against ONNX Runtime and timed here, with their tuning wall-clock times.

With ``--fast-math-compare`` only the cost of IEEE NaN semantics is measured: each model is
built with ``fast_math=False`` (the default: NaN propagates through ReLU, clip, max-pool ...)
and ``fast_math=True``, both checked against ONNX Runtime, then timed in ``--rounds``
interleaved rounds (``--repeat`` calls each); the medians and their ratio are printed.
``--compare-options JSON`` does the same for the default build against one given those
``strategy_options`` (an A/B of one fusion rule: ``'{"alt": {"fuse_norms": false}}'``).

    python benchmarks/bench_e2e.py [--models resnet18 mobilenet_v2 bert_tiny small_cnn resnet3d_18]
                                [--threads 2] [--variants alt alt-wp alt-ol] [--sconv] [--trials N] [--json out.json]
    python benchmarks/bench_e2e.py --trials N --log-dir DIR --reuse-logs [--models ...]  # time DIR's logs again
    python benchmarks/bench_e2e.py --fast-math-compare [--models ...] [--rounds 11] [--repeat 20]
    python benchmarks/bench_e2e.py --compare-options '{"alt": {"fuse_norms": false}}' --models model.onnx
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

DEFAULT_MODELS = ["small_cnn", "resnet18", "mobilenet_v2", "bert_tiny", "resnet3d_18"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variants", nargs="+", default=["alt"], choices=["alt", "alt-wp", "alt-ol"])
    parser.add_argument("--sconv", action="store_true",
                        help="also build with the SConv strategy for plain conv2d (strategies=['sconv'])")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per runner (median reported)")
    parser.add_argument("--tvm-repeat", type=int, default=3, help="timed calls for TVM's untuned build (slow)")
    parser.add_argument("--skip-tvm-default", action="store_true", help="skip TVM's untuned build")
    parser.add_argument("--trials", type=int, default=0,
                        help="tune each model with this many measured trials (alt-tvm and MetaSchedule each)")
    parser.add_argument("--skip-ms", action="store_true", help="with --trials: skip MetaSchedule")
    parser.add_argument("--log-dir", default="logs", help="with --trials: where alt-tvm's tuning logs go")
    parser.add_argument("--reuse-logs", action="store_true",
                        help="with --trials: build from the logs an earlier run with the same --trials left in "
                             "--log-dir instead of tuning again (a second timing of the same tuned builds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true",
                        help="print each alt-tvm build's report with every layout conversion's time in the model")
    parser.add_argument("--json", default=None,
                        help="write the rows here (default benchmarks/results/<machine kind>/e2e.json)")
    parser.add_argument("--fast-math-compare", action="store_true",
                        help="only compare fast_math=False (IEEE NaN semantics) with fast_math=True builds")
    parser.add_argument("--compare-options", type=json.loads, default=None, metavar="JSON",
                        help="only compare the default build with one given these strategy_options, e.g. "
                             "'{\"alt\": {\"fuse_norms\": false}}'")
    parser.add_argument("--rounds", type=int, default=11,
                        help="interleaved timing rounds (rounded up to whole designs; median reported)")

    return parser.parse_args(argv)


#: Tolerances against ONNX Runtime for an ONNX file given by path (a model we did not write).
ONNX_FILE_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}


def _model_and_reference(name: str, workdir: str, threads: int):
    """Model ``name`` (a reference model, or the path of an ONNX file): (torch module or None,
    its inputs, as arrays, ONNX path, ORT session, ORT's outputs). An ONNX file is run on
    seeded random inputs of its declared shapes."""
    from alt_tvm.bench import onnxruntime_session
    from alt_tvm.deploy.model import aligned, seeded_inputs
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.models import export_onnx, get_model

    if name.endswith(".onnx"):
        imported = load_model(name)
        arrays = seeded_inputs(shapes=imported.input_shapes, dtypes=imported.input_dtypes, seed=0)
        session = onnxruntime_session(name, threads=threads)
        return None, None, arrays, name, session, session(*arrays)
    module, inputs = get_model(name)
    arrays = [aligned(x.numpy()) for x in inputs]
    path = export_onnx(name, os.path.join(workdir, f"{name}.onnx"))
    session = onnxruntime_session(str(path), threads=threads)
    return module, inputs, arrays, path, session, session(*arrays)


def other_peers(path, arrays, want, *, threads: int, tolerance: dict, name: str) -> dict:
    """The CPU peers besides ONNX Runtime on ONNX file ``path``, label -> runner, each checked against
    alt-tvm's outputs ``want`` with ``tolerance`` (the one the model's alt-tvm builds meet against
    ONNX Runtime). A peer not installed, or computing something else, is left out with a line on
    stderr saying why: it is not timed."""
    import numpy as np

    from alt_tvm.bench import CPU_PEERS, cpu_peers

    made, skipped = cpu_peers(path, threads=threads, peers=[p for p in CPU_PEERS if p != "onnxruntime"])
    for peer, why in skipped.items():
        print(f"{name}: {peer} skipped: {why}", file=sys.stderr)
    checked = {}
    for peer, runner in made.items():
        bad = [float(np.abs(g - r).max()) for g, r in zip(runner(*arrays), want) if not np.allclose(g, r, **tolerance)]
        if bad:
            print(f"{name}: {peer} skipped: differs from alt-tvm (max abs {max(bad):.2e})", file=sys.stderr)
            continue
        checked[peer] = runner
    return checked


def faster_peer_fields(times_ms: dict, alt_ms: float, *, rounds_ms: dict | None = None,
                       alt_rounds_ms: list | None = None) -> dict:
    """alt-tvm at ``alt_ms`` against the faster CPU peer of ``times_ms`` (label -> median ms): the
    :class:`~alt_tvm.bench.peers.FasterPeer` fields of a results row, empty without a peer; with
    the rounds' times (label -> list, and alt-tvm's), also the ratio's interval."""
    from alt_tvm.bench import faster_peer

    against = faster_peer(times_ms=times_ms, alt_ms=alt_ms, rounds_ms=rounds_ms, alt_rounds_ms=alt_rounds_ms)
    return against.to_json() if against is not None else {}


def add_at_peak(rows: list, *, gflop: dict, peak_gflops: float) -> None:
    """Each alt-tvm row of ``rows`` that has a faster peer, read against the run's FMA peak on its
    model's ``gflop`` (model -> GFLOP; :meth:`~alt_tvm.bench.peers.AtPeak.to_json` fields)."""
    from alt_tvm.bench import AtPeak, FasterPeer

    for row in rows:
        if row.get("faster_peer_ms") and gflop.get(row.get("model")):
            against = FasterPeer(row["faster_peer"], row["faster_peer_ms"], row["median_ms"], row["ratios_vs_peers"])
            row.update(AtPeak(gflop[row["model"]], peak_gflops).to_json(against))


def summaries(rows: list) -> dict:
    """Per alt-tvm build label, alt-tvm against the faster peer over the models of ``rows``
    (:func:`~alt_tvm.bench.peers.against_faster_peer`), with the ceilings where rows have them."""
    from alt_tvm.bench import against_faster_peer

    ratios: dict = {}
    ceilings: dict = {}
    intervals: dict = {}
    for row in rows:
        if row.get("ratio_vs_faster_peer"):
            ratios.setdefault(row["runner"], {})[row["model"]] = row["ratio_vs_faster_peer"]
            if row.get("ceiling_vs_faster_peer"):
                ceilings.setdefault(row["runner"], {})[row["model"]] = row["ceiling_vs_faster_peer"]
            if row.get("ratio_interval"):
                intervals.setdefault(row["runner"], {})[row["model"]] = row["ratio_interval"]
    return {label: against_faster_peer(ratios=values, ceilings=ceilings.get(label), intervals=intervals.get(label))
            for label, values in ratios.items()}


def compare_builds(args: argparse.Namespace, labels: tuple[str, str], settings: tuple[dict, dict]) -> int:
    """Latency of two builds of each model (``alt_tvm.build`` keyword arguments ``settings``),
    both checked against ONNX Runtime, then timed with the CPU peers in ``--rounds`` interleaved
    rounds; prints the medians, their ratio and the second build against the faster peer.
    1 on a wrong result."""
    import numpy as np

    from alt_tvm.bench import PeakReadings, describe_against_faster_peer, time_interleaved
    from alt_tvm.graph.build import build
    from alt_tvm.models import MODELS

    peaks = PeakReadings(threads=args.threads)
    peak = peaks.measure()
    results = [{"runner": "fp32 peak", "peak_gflops": peak, "threads": args.threads}]
    workdir = tempfile.mkdtemp(prefix="alt_compare_")
    variant = args.variants[0]
    a, b = labels
    print(f"{a} vs {b}, variant {variant}, batch 1, {args.threads} thread(s), {args.rounds} interleaved rounds of "
          f"{args.repeat} calls; FP32 FMA peak measured in this run: {peak:.0f} GFLOP/s; ONNX Runtime (spinning "
          f"off) and OpenVINO timed in the same rounds")
    print(f"  {'model':24s} {a[:12]:>12s} {b[:12]:>12s} {'first/second':>13s} {'ORT ms':>8s} {'OpenVINO ms':>11s} "
          f"{'faster peer':>12s} {'peer / second':>14s} {'build s':>14s}")
    for name in args.models:
        info = MODELS.get(name)
        tolerance = ONNX_FILE_TOLERANCE if info is None else {"rtol": info.rtol, "atol": info.atol}
        _, _, arrays, path, ort_session, reference = _model_and_reference(name, workdir, args.threads)
        builds, build_s = [], []
        for label, kwargs in zip(labels, settings):
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the fallback report, printed once per build
                builds.append(build(str(path), variant=variant, **kwargs))
            build_s.append(time.perf_counter() - t0)
            for g, r in zip(builds[-1](*arrays), reference):
                if not np.allclose(g, r, **tolerance):
                    print(f"{name} {label}: differs from ONNX Runtime (max abs {np.abs(g - r).max():.2e})",
                          file=sys.stderr)
                    return 1
            if args.profile:
                print(f"{name} {label}: " + builds[-1].report.summary(builds[-1].profile(*arrays, repeat=5)))
        runners = {"first": (builds[0], arrays), "second": (builds[1], arrays), "onnxruntime": (ort_session, arrays)}
        peers = other_peers(path, arrays, builds[0](*arrays), threads=args.threads, tolerance=tolerance, name=name)
        runners.update({peer: (runner, arrays) for peer, runner in peers.items()})
        timed = time_interleaved(runners, rounds=args.rounds, repeat=args.repeat)
        medians = {key: rounds for key, (_, rounds) in timed.items()}
        times = {key: ms for key, (ms, _) in timed.items()}
        first, second, ort_ms = times["first"], times["second"], times["onnxruntime"]
        against = faster_peer_fields(times, second, rounds_ms=medians, alt_rounds_ms=medians["second"])
        openvino = f"{times['openvino']:11.3f}" if "openvino" in times else f"{'-':>11s}"
        shown = os.path.basename(name)
        print(f"  {shown[:24]:24s} {first:12.3f} {second:12.3f} {first / second:12.3f}x {ort_ms:8.3f} {openvino} "
              f"{against['faster_peer']:>12s} {against['ratio_vs_faster_peer']:13.3f}x "
              f"{build_s[0]:6.1f}/{build_s[1]:<6.1f}")
        results.append({"model": name, "variant": variant, "labels": list(labels),
                        "settings": [repr(s) for s in settings], "first_median_ms": first,
                        "second_median_ms": second, "ort_median_ms": ort_ms,
                        "openvino_median_ms": times.get("openvino"), "ratio_first_to_second": first / second,
                        "round_medians_first_ms": medians["first"], "round_medians_second_ms": medians["second"],
                        "round_medians_ort_ms": medians["onnxruntime"],
                        "round_medians_openvino_ms": medians.get("openvino"), "runner": "second",
                        **against, "threads": args.threads, "rounds": args.rounds, "repeat": args.repeat})
    peaks.measure()  # again at the end: one reading can land in a slow phase of the host
    results[0].update(peak_gflops=peaks.best, peak_readings=peaks.readings)
    summary = summaries(results)
    for label, values in summary.items():
        print(describe_against_faster_peer(values, what=f"{label} ({b})"))
    print(f"FP32 FMA peak of the run: {peaks.describe()}")
    if args.json:  # a comparison is not the suite's result: written only where asked
        _write_json(args.json, results, summary, peak_gflops=peaks.best, threads=args.threads)
    return 0


def tuning_log(args: argparse.Namespace, name: str) -> str:
    """Where ``--trials`` puts (and ``--reuse-logs`` reads) model ``name``'s tuning log."""
    return os.path.join(args.log_dir, f"e2e_{os.path.basename(name)}_{args.trials}.jsonl")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.trials < 0:
        raise SystemExit(f"--trials must be >= 0, got {args.trials}")
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if args.reuse_logs and not args.trials:
        raise SystemExit("--reuse-logs needs --trials N: the logs are named by their trial count")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from alt_tvm.bench import quiet_tvm_pool

    quiet_tvm_pool()  # TVM's spinning pool would slow the ONNX Runtime turns timed beside it
    from alt_tvm.models import MODEL_NAMES

    unknown = [m for m in args.models if m not in MODEL_NAMES and not (m.endswith(".onnx") and os.path.isfile(m))]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; choose from {list(MODEL_NAMES)} or give ONNX files")
    logs = [tuning_log(args, m) for m in args.models] if args.reuse_logs else []
    missing = [log for log in logs if not os.path.isfile(log)]
    if missing:
        raise SystemExit(f"--reuse-logs: no tuning logs {missing} (a run without --reuse-logs, with the same "
                         f"--trials {args.trials} and --log-dir, writes them)")
    if args.fast_math_compare:
        return compare_builds(args, ("fast_math=False (IEEE)", "fast_math=True"),
                              ({"fast_math": False}, {"fast_math": True}))
    if args.compare_options is not None:
        return compare_builds(args, ("default options", "given options"),
                              ({}, {"strategy_options": args.compare_options}))

    import numpy as np

    from alt_tvm.bench import (
        INTERVAL_CONFIDENCE,
        AtPeak,
        PeakReadings,
        TVMRunner,
        describe_against_faster_peer,
        describe_interval,
        time_callable,
        time_interleaved,
        torch_runner,
        tvm_default_build,
    )
    from alt_tvm.bench.onnx_flops import count_flops
    from alt_tvm.graph.build import build
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.graph.metaschedule import tune_model
    from alt_tvm.graph.prepare import prepare
    from alt_tvm.integration import tune
    from alt_tvm.models import MODELS
    from alt_tvm.target import host
    from alt_tvm.tuning.driver import BudgetError

    # The ceiling of this run (machine states differ between days): FP32 FMA peak, read again at
    # the end (one reading can land in a slow phase of the host).
    peaks = {"threads_1": PeakReadings(threads=1), f"threads_{args.threads}": PeakReadings(threads=args.threads)}
    peak = {key: readings.measure() for key, readings in peaks.items()}
    print("FP32 FMA peak measured in this run: " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} GFLOP/s"
                                                               for k, v in peak.items()))
    results = [{"runner": "fp32 peak", "peak_gflops": peak}]
    gflop: dict = {}  # model -> its convolution and matrix-product GFLOP
    tune_s: dict = {}
    workdir = tempfile.mkdtemp(prefix="alt_e2e_")
    for name in args.models:
        info = MODELS.get(name)
        module, inputs, arrays, path, ort, reference = _model_and_reference(name, workdir, args.threads)
        gflop[name] = count_flops(str(path)) / 1e9
        tolerance = ONNX_FILE_TOLERANCE if info is None else {"rtol": info.rtol, "atol": info.atol}
        rows = {}

        def check(label: str, runner, arrays=arrays, reference=reference, tolerance=tolerance, name=name) -> bool:
            for g, r in zip(runner(*arrays), reference):
                if not np.allclose(g, r, **tolerance):
                    print(f"{name} {label}: differs from ONNX Runtime (max abs {np.abs(g - r).max():.2e})",
                          file=sys.stderr)
                    return False
            return True

        log = None
        if args.trials:
            log = tuning_log(args, name)
            if not args.reuse_logs:
                os.makedirs(args.log_dir, exist_ok=True)
                if os.path.exists(log):
                    os.remove(log)
                t0 = time.perf_counter()
                try:
                    outcome = tune(str(path), trials=args.trials, log=log, seed=args.seed, progress=False)
                except BudgetError as err:  # this model has too many tasks: time it untuned, go on
                    print(f"{name}: not tuned: {err}", file=sys.stderr)
                    results.append({"model": name, "runner": "tuning alt-tvm", "error": str(err),
                                    "trials": args.trials})
                    log = None
                else:
                    tune_s[(name, "alt-tvm")] = time.perf_counter() - t0
                    if outcome.in_model is not None:
                        print(outcome.in_model.summary())
        tuned_build = None  # the first variant built from the log
        for variant in args.variants:
            for records in ([None, log] if log else [None]):
                t0 = time.perf_counter()
                compiled = build(str(path), variant=variant, records=records)
                build_s = time.perf_counter() - t0
                label = f"alt-tvm ({variant}{', tuned' if records else ''})"
                if not check(label, compiled):
                    return 1
                rows[label] = ((compiled, arrays), build_s)
                if records and variant == args.variants[0]:
                    tuned_build = compiled
                if args.profile:
                    print(f"{name} {label}: " + compiled.report.summary(compiled.profile(*arrays, repeat=5)))
        if args.sconv:
            t0 = time.perf_counter()
            compiled = build(str(path), strategies=["sconv"], records=log)
            build_s = time.perf_counter() - t0
            if not check("alt-tvm (sconv)", compiled):
                return 1
            rows["alt-tvm (sconv)"] = ((compiled, arrays), build_s)
        if args.trials and not args.skip_ms:
            result = tune_model(prepare(load_model(str(path)).mod), target=host().to_tvm(), trials=args.trials,
                                seed=args.seed)
            tune_s[(name, "metaschedule")] = result.tune_s
            ms_runner = TVMRunner(result.artifact)
            if not check("MetaSchedule", ms_runner):
                return 1
            rows["tvm metaschedule"] = ((ms_runner, arrays), None)
        rows["onnxruntime"] = ((ort, arrays), None)
        first_build = next(runner for label, ((runner, _), _) in rows.items() if label.startswith("alt-tvm"))
        for peer, runner in other_peers(path, arrays, first_build(*arrays), threads=args.threads,
                                        tolerance=tolerance, name=name).items():
            rows[peer] = ((runner, arrays), None)
        if module is not None:
            rows["pytorch"] = ((torch_runner(module, threads=args.threads), inputs), None)
        timed = time_interleaved({label: runner for label, (runner, _) in rows.items()}, rounds=args.rounds,
                                 repeat=args.repeat)
        table = {label: (min(timed[label][1]), timed[label][0], build_s) for label, (_, build_s) in rows.items()}
        if not args.skip_tvm_default:
            t0 = time.perf_counter()
            default = tvm_default_build(load_model(str(path)))
            build_s = time.perf_counter() - t0
            table["tvm untuned"] = (*time_callable(default, arrays, warmup=1, repeat=args.tvm_repeat), build_s)
        alt_ms = table[f"alt-tvm ({args.variants[0]}{', tuned' if log else ''})"][1]
        description = info.description if info else "ONNX file"
        print(f"\n{name} ({description}), batch 1, {args.threads} thread(s), {args.rounds} interleaved rounds "
              f"of {args.repeat} calls (ONNX Runtime not spinning); 'min ms' is the fastest round's median")
        # A reading per model, so that each table reads against the best so far (the JSON against the run's best).
        peak[f"threads_{args.threads}"] = peaks[f"threads_{args.threads}"].measure()
        at_peak = AtPeak(gflop[name], peak[f"threads_{args.threads}"])
        print(f"  {'runner':22s} {'median ms':>10s} {'min ms':>9s} {'build s':>8s} {'time / alt':>11s} "
              f"{'% of peak':>9s}")
        medians = {runner: med for runner, (_, med, _) in table.items()}
        rounds = {label: times for label, (_, times) in timed.items()}
        for runner, (low, med, build_s) in table.items():
            built = f"{build_s:8.1f}" if build_s is not None else " " * 8
            print(f"  {runner:22s} {med:10.3f} {low:9.3f} {built} {med / alt_ms:10.2f}x "
                  f"{100 * at_peak.share(med):8.0f}%")
            against = faster_peer_fields(medians, med, rounds_ms=rounds, alt_rounds_ms=rounds.get(runner)) \
                if runner.startswith("alt-tvm") else {}
            results.append({"model": name, "runner": runner, "median_ms": med, "min_ms": low, "build_s": build_s,
                            "ratio_to_alt": med / alt_ms, **against, "threads": args.threads,
                            "trials": args.trials})
        against = faster_peer_fields(medians, alt_ms)
        print(f"  faster peer: {against['faster_peer']}; " + ", ".join(
            f"{r['runner']} {r['ratio_vs_faster_peer']:.2f}x{describe_interval(r.get('ratio_interval'))}"
            for r in results if r.get("model") == name and "ratio_vs_faster_peer" in r)
            + f" (peer ms / alt-tvm ms; in brackets the {INTERVAL_CONFIDENCE:.0%} interval of the median of the "
            "rounds' paired ratios)")
        print(f"  {gflop[name]:.2f} GFLOP of convolutions and matrix products; at the run's FP32 FMA peak a runtime "
              f"would be {at_peak.ceiling(medians[against['faster_peer']]):.2f}x the faster peer")
        if log:
            untuned = table[f"alt-tvm ({args.variants[0]})"][1]
            same = "" if tuned_build is None or tuned_build.report.changed_by_log else \
                " (the log changed no kernel: both builds are the same)"
            print(f"  tuned vs untuned: {untuned / alt_ms:.2f}x{same}; tuned vs the faster peer "
                  f"({against['faster_peer']} ms / alt-tvm ms): {against['ratio_vs_faster_peer']:.2f}x")
        for (model, tuner), seconds in tune_s.items():
            if model == name:
                print(f"  tuning wall time {tuner}: {seconds:.0f} s for {args.trials} trials")
                results.append({"model": name, "runner": f"tuning {tuner}", "tune_s": seconds,
                                "trials": args.trials})
        add_at_peak(results, gflop=gflop, peak_gflops=peak[f"threads_{args.threads}"])
        _write_json(args.json, results, summaries(results))  # each finished model, in case a later one fails
    for key, readings in peaks.items():
        readings.measure()
        peak[key] = readings.best
    results[0]["peak_readings"] = {key: readings.readings for key, readings in peaks.items()}
    add_at_peak(results, gflop=gflop, peak_gflops=peak[f"threads_{args.threads}"])
    summary = summaries(results)
    print()
    for label, values in summary.items():
        print(describe_against_faster_peer(values, what=label))
    print("FP32 FMA peak of the run: " + ", ".join(f"{k.replace('_', ' ')} {r.describe()}" for k, r in peaks.items()))
    _write_json(args.json, results, summary, peak_gflops=peak[f"threads_{args.threads}"], threads=args.threads)
    return 0


def _write_json(path: str | None, results: list, summary: dict, *, peak_gflops: float | None = None,
                threads: int | None = None) -> None:
    """Write ``results`` and ``summary`` (:func:`summaries`) to ``path`` (default
    ``benchmarks/results/<machine kind>/e2e.json``), replacing what an earlier call wrote."""
    from alt_tvm.bench import write_results

    write_results("e2e", {"rows": results, "against_faster_peer": summary}, path=path, peak_gflops=peak_gflops,
                  threads=threads)


if __name__ == "__main__":
    sys.exit(main())
