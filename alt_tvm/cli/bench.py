"""Time a model built by alt-tvm side by side with the runtimes a user would otherwise pick.

    alt-tvm bench resnet18 --vs onnxruntime torch tvm
    alt-tvm bench model.onnx --records logs/model.jsonl --vs onnxruntime --png bench.png
    alt-tvm bench resnet18.alt --vs onnxruntime --threads 2 --json
    alt-tvm bench model.onnx --compare default logs/model.jsonl --per-kernel
    alt-tvm bench model.onnx --compare fast_math=false fast_math=true
    alt-tvm bench model.onnx --compare /tmp/old/model /tmp/new/model

Fair timing: every runner gets ``--threads`` threads; ONNX Runtime's idle threads do not
spin and TVM's pool polls only briefly before its workers sleep (``TVM_THREAD_POOL_SPIN_COUNT``
= ``alt_tvm.deploy.model.POOL_SPIN_COUNT``), so no runtime's idle pool takes the cores of the
one being timed; runners are timed in interleaved rounds (each first once and after every other
equally often, a pause and an untimed call before each turn) and the median of the rounds is
reported. Every baseline's outputs are checked against alt-tvm's
first (a mismatch is an error, not a row). Where a CPU peer (``onnxruntime``, ``openvino``) is
timed, the faster of them is named with its time over alt-tvm's (above 1: alt-tvm faster)
and, in brackets, the 90% interval of the median of the rounds' paired ratios: where it
reaches across 1, the run does not tell the two apart. ``tvm`` is TVM's own untuned build of the same
Relax module (``tvm.compile``); ``torch`` needs a reference model (an ONNX file has no
PyTorch module); ``openvino`` needs OpenVINO (``pip install 'alt-tvm[bench]'``); an
artifact is compared with the model it was built from.

``--compare A B`` times two build configurations of MODEL against each other instead: each
is ``default``, a tuning log, an artifact directory (e.g. one written by another version of
the code), or ``key=value`` build options joined by commas (``records``, ``fast_math``,
``variant``, ``strategies=alt+sconv``). The two are checked to compute the same, then timed
in interleaved rounds; the medians, the paired median ratio B/A and the rounds B won are
printed. ``--per-kernel`` profiles the kernels instead and sums the ones whose code differs
(by TIR digest) apart from the rest, whose ratio is the run's noise control.

Exit status: 0, 1 when a baseline's (or B's) outputs differ from alt-tvm's (A's) or a baseline
cannot run the model (one line says why: OpenVINO names the operator its frontend refused), 2
for a bad argument.
"""

from __future__ import annotations

import os
import sys
import tempfile

from .common import (
    MODEL_HELP,
    ModelArgument,
    add_output_options,
    checked_model,
    configure_logging,
    model_argument,
    parser_for,
    print_json,
    require_positive,
    runnable,
    unwritable,
)

BASELINES = ("onnxruntime", "openvino", "torch", "tvm")


def _parser():
    parser = parser_for("bench", __doc__)
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--vs", nargs="*", default=["onnxruntime"], choices=BASELINES, metavar="RUNTIME",
                        help=f"baselines to time beside alt-tvm, any of {', '.join(BASELINES)} (default onnxruntime)")
    parser.add_argument("--records", default=None, help="tuning log applied when building MODEL")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of every runtime (>= 1)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved timing rounds (>= 1; rounded up to whole designs, in which every runner "
                             "follows every other equally often; median reported)")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per runner and round (>= 1)")
    parser.add_argument("--png", default=None, help="also draw the latencies as a bar chart into this PNG")
    parser.add_argument("--compare", nargs=2, default=None, metavar=("A", "B"),
                        help="time two build configurations of MODEL instead: default, a tuning log, an artifact, "
                             "or key=value options (records, fast_math, variant, strategies)")
    parser.add_argument("--per-kernel", action="store_true",
                        help="with --compare: time the changed kernels inside the runs, the rest as noise control")
    add_output_options(parser)
    return parser


def _source(model: ModelArgument, wanted: list[str]) -> ModelArgument | str:
    """The ONNX file or reference model the baselines run (for an artifact: the one it was built from)."""
    if model.kind != "artifact" or not wanted:
        return model
    from alt_tvm.deploy.artifact import ArtifactError, read_metadata

    try:
        source = read_metadata(model.text).get("source")
    except ArtifactError as err:
        return str(err)
    if source is None:
        return f"artifact {model.text!r} does not say what model it was built from: bench it without --vs"
    found = model_argument(source, artifacts=False)
    if isinstance(found, str):
        return f"artifact {model.text!r} was built from {source!r}, which is not here: {found}"
    return found


def _baseline(name: str, source: ModelArgument, threads: int, workdir: str):
    """A callable on NumPy arrays running ``source`` with baseline ``name``."""
    if name in ("onnxruntime", "openvino"):
        from alt_tvm.bench import onnxruntime_session, openvino_session

        path = source.text
        if source.kind == "reference":
            from alt_tvm.models import export_onnx

            path = os.fspath(export_onnx(source.text, os.path.join(workdir, f"{source.text}.onnx")))
        session = onnxruntime_session if name == "onnxruntime" else openvino_session
        return session(path, threads=threads)
    if name == "torch":
        from alt_tvm.bench import torch_runner
        from alt_tvm.models import get_model

        return torch_runner(get_model(source.text)[0], threads=threads)
    from alt_tvm.bench import tvm_default_build
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.graph.prepare import prepare

    if source.kind == "reference":
        from alt_tvm.models import get_model

        module, inputs = get_model(source.text)
        imported = load_model(module, example_inputs=inputs)
    else:
        imported = load_model(source.text)
    return tvm_default_build(prepare(imported.mod))


def _plot(path: str, title: str, medians: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(1.6 + 1.2 * len(medians), 3.2))
    bars = axes.bar(list(medians), list(medians.values()), color=["#2a6f97"] + ["#b0b0b0"] * (len(medians) - 1))
    axes.bar_label(bars, fmt="%.2f")
    axes.set_ylabel("latency, ms (median of rounds)")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv=None) -> int:
    """Run ``alt-tvm bench``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    require_positive(parser, {"--threads": args.threads, "--rounds": args.rounds, "--repeat": args.repeat})
    if args.png is not None and (why := unwritable(args.png)):
        parser.error(f"--png: {why}")
    if args.per_kernel and args.compare is None:
        parser.error("--per-kernel applies with --compare A B")
    if args.compare is not None:
        return _compare(parser, args)
    model = checked_model(parser, args.model, args.records, artifacts=True)
    wanted = list(dict.fromkeys(args.vs))
    source = _source(model, wanted)
    if isinstance(source, str):
        parser.error(source)
    if "torch" in wanted and source.kind != "reference":
        parser.error(f"--vs torch needs a reference model (a PyTorch module); {source.text!r} is an ONNX file")
    if "openvino" in wanted:
        from alt_tvm.bench import openvino_available

        if why := openvino_available():
            parser.error(f"--vs openvino: {why}")
    # Before TVM's pool starts: the model's threads, and no spinning against the baselines.
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from alt_tvm.bench import quiet_tvm_pool, time_interleaved
    from alt_tvm.bench.compare import output_mismatch

    quiet_tvm_pool()
    configure_logging(args.verbose)

    ours = runnable(model, records=args.records)
    arrays = ours.random_inputs(seed=0)
    want = ours(*arrays)
    runners = {"alt-tvm": (ours, arrays)}
    with tempfile.TemporaryDirectory(prefix="alt_tvm_bench_") as workdir:
        for name in wanted:
            try:
                runner = _baseline(name, source, args.threads, workdir)
            except RuntimeError as err:  # a baseline that cannot run the model
                print(f"{parser.prog}: --vs {name}: {err}", file=sys.stderr)
                return 1
            problem = output_mismatch(want, runner(*arrays))
            if problem is not None:
                print(f"{parser.prog}: {name}'s outputs differ from alt-tvm's: {problem}", file=sys.stderr)
                return 1
            runners[name] = (runner, arrays)
        timed = time_interleaved(runners, rounds=args.rounds, repeat=args.repeat)
    medians = {label: ms for label, (ms, _) in timed.items()}
    mine = medians["alt-tvm"]
    from alt_tvm.bench import INTERVAL_CONFIDENCE, faster_peer

    against = faster_peer(times_ms=medians, alt_ms=mine, rounds_ms={label: r for label, (_, r) in timed.items()},
                          alt_rounds_ms=timed["alt-tvm"][1])
    if args.png is not None:
        _plot(args.png, f"{model.name}, {args.threads} thread(s)", medians)
    if args.json:
        print_json({"model": model.text, "threads": args.threads, "rounds": args.rounds,
                    "runners": {label: {"median_ms": ms, "rounds_ms": rounds, "ratio_vs_alt_tvm": ms / mine}
                                for label, (ms, rounds) in timed.items()},
                    "against_faster_peer": against.to_json() if against is not None else None})
        return 0
    print(f"{model.name}: {args.threads} thread(s), median of {args.rounds} interleaved rounds")
    print(f"{'runtime':14s} {'ms':>9s} {'its time / alt-tvm':>19s}")
    for label, ms in medians.items():
        print(f"{label:14s} {ms:9.3f} {ms / mine:18.2f}x")
    if against is not None:
        print(f"faster peer: {against.peer}, its time / alt-tvm's {against.describe()} (above 1: alt-tvm faster; "
              f"in brackets the {INTERVAL_CONFIDENCE:.0%} interval of the rounds' paired ratios' median)")
    if args.png is not None:
        print(f"chart: {args.png}")
    return 0


def _build_config(model: ModelArgument, config: dict, threads: int):
    """MODEL built (or the artifact loaded) as one configuration of ``--compare`` says."""
    import alt_tvm

    if "artifact" in config:
        return alt_tvm.load(config["artifact"])
    if model.kind == "reference":
        from alt_tvm.models import get_model

        module, inputs = get_model(model.text)
        return alt_tvm.build(module, example_inputs=inputs, **config)
    return alt_tvm.build(model.text, **config)


def _compare(parser, args) -> int:
    """``--compare A B``: two configurations of MODEL, checked, then timed interleaved."""
    from alt_tvm.bench import INTERVAL_CONFIDENCE
    from alt_tvm.bench.compare import compare_builds, parse_config

    configs = []
    for text in args.compare:
        try:
            configs.append(parse_config(text))
        except ValueError as err:
            parser.error(f"--compare: {err}")
    if args.records is not None:
        parser.error("--records does not apply with --compare: give each configuration its log")
    if all("artifact" in c for c in configs):
        model = ModelArgument(args.model, "artifact")
    else:
        model = checked_model(parser, args.model, None, artifacts=False)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from alt_tvm.bench import quiet_tvm_pool

    quiet_tvm_pool()
    configure_logging(args.verbose)
    a, b = (_build_config(model, config, args.threads) for config in configs)
    try:
        result = compare_builds(a, b, labels=tuple(args.compare), rounds=args.rounds, repeat=args.repeat,
                                per_kernel=args.per_kernel)
    except ValueError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 1
    if args.png is not None:
        _plot(args.png, f"{model.name}, {args.threads} thread(s)", {"A": result.a_ms, "B": result.b_ms})
    if args.json:
        print_json({"model": model.text, "threads": args.threads, **result.to_json()})
        return 0
    what = "profiled run totals" if args.per_kernel else "whole-model calls"
    print(f"{model.name}: {args.threads} thread(s), {result.rounds} interleaved rounds of {what}")
    print(f"  A {args.compare[0]}: {result.a_ms:9.3f} ms (median)")
    print(f"  B {args.compare[1]}: {result.b_ms:9.3f} ms (median)")
    interval = result.b_over_a_interval
    within = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval is not None else ""
    print(f"  B/A {result.b_over_a:.3f}{within} (paired median; in brackets its {INTERVAL_CONFIDENCE:.0%} "
          f"interval), B faster in {result.rounds_b_faster} of {result.rounds} rounds")
    if result.changed is not None:
        print(f"  kernels whose code differs: {len(result.changed)}")
    if args.per_kernel and result.changed_b_over_a is not None:
        print(f"  changed kernels B/A {result.changed_b_over_a:.3f}; unchanged (noise control) "
              f"B/A {result.unchanged_b_over_a:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
