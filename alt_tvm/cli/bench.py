"""Time a model built by alt-tvm side by side with the runtimes a user would otherwise pick.

    alt-tvm bench resnet18 --vs onnxruntime torch tvm
    alt-tvm bench model.onnx --records logs/model.jsonl --vs onnxruntime --png bench.png
    alt-tvm bench resnet18.alt --vs onnxruntime --threads 2 --json

Fair timing: every runner gets ``--threads`` threads; ONNX Runtime's idle threads do not
spin and TVM's pool polls only briefly before its workers sleep (``TVM_THREAD_POOL_SPIN_COUNT``
= ``alt_tvm.deploy.model.POOL_SPIN_COUNT``), so no runtime's idle pool takes the cores of the
one being timed; runners are timed in interleaved rounds
(a different one first each round, a pause and an untimed call before each turn) and the
median of the rounds is reported. Every baseline's outputs are checked against alt-tvm's
first (a mismatch is an error, not a row). ``tvm`` is TVM's own untuned build of the same
Relax module (``tvm.compile``); ``torch`` needs a reference model (an ONNX file has no
PyTorch module); an artifact is compared with the model it was built from.

Exit status: 0, 1 when a baseline's outputs differ from alt-tvm's, 2 for a bad argument.
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

BASELINES = ("onnxruntime", "torch", "tvm")
#: Outputs of a baseline must match alt-tvm's within this, relative to the output's largest magnitude.
RTOL = 1e-3


def _parser():
    parser = parser_for("bench", __doc__)
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--vs", nargs="*", default=["onnxruntime"], choices=BASELINES, metavar="RUNTIME",
                        help=f"baselines to time beside alt-tvm, any of {', '.join(BASELINES)} (default onnxruntime)")
    parser.add_argument("--records", default=None, help="tuning log applied when building MODEL")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of every runtime (>= 1)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (>= 1; median reported)")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per runner and round (>= 1)")
    parser.add_argument("--png", default=None, help="also draw the latencies as a bar chart into this PNG")
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
    if name == "onnxruntime":
        from alt_tvm.graph.baselines import onnxruntime_session

        path = source.text
        if source.kind == "reference":
            from alt_tvm.models import export_onnx

            path = os.fspath(export_onnx(source.text, os.path.join(workdir, f"{source.text}.onnx")))
        return onnxruntime_session(path, threads=threads)
    if name == "torch":
        from alt_tvm.graph.baselines import torch_runner
        from alt_tvm.models import get_model

        return torch_runner(get_model(source.text)[0], threads=threads)
    from alt_tvm.graph.baselines import tvm_default_build
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.graph.prepare import prepare

    if source.kind == "reference":
        from alt_tvm.models import get_model

        module, inputs = get_model(source.text)
        imported = load_model(module, example_inputs=inputs)
    else:
        imported = load_model(source.text)
    return tvm_default_build(prepare(imported.mod))


def _mismatch(want, got) -> str | None:
    import numpy as np

    if len(want) != len(got):
        return f"{len(got)} outputs instead of {len(want)}"
    for i, (a, b) in enumerate(zip(want, got)):
        b = np.asarray(b)
        if a.shape != b.shape:
            return f"output {i} has shape {b.shape} instead of {a.shape}"
        scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-30)
        error = float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) / scale if a.size else 0.0
        if not error <= RTOL:
            return f"output {i} differs by {error:.2e} of its largest magnitude (allowed {RTOL:g})"
    return None


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
    model = checked_model(parser, args.model, args.records, artifacts=True)
    wanted = list(dict.fromkeys(args.vs))
    source = _source(model, wanted)
    if isinstance(source, str):
        parser.error(source)
    if "torch" in wanted and source.kind != "reference":
        parser.error(f"--vs torch needs a reference model (a PyTorch module); {source.text!r} is an ONNX file")
    # Before TVM's pool starts: the model's threads, and no spinning against the baselines.
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from alt_tvm.graph.baselines import quiet_tvm_pool, time_interleaved

    quiet_tvm_pool()
    configure_logging(args.verbose)

    ours = runnable(model, records=args.records)
    arrays = ours.random_inputs(seed=0)
    want = ours(*arrays)
    runners = {"alt-tvm": (ours, arrays)}
    with tempfile.TemporaryDirectory(prefix="alt_tvm_bench_") as workdir:
        for name in wanted:
            runner = _baseline(name, source, args.threads, workdir)
            problem = _mismatch(want, runner(*arrays))
            if problem is not None:
                print(f"{parser.prog}: {name}'s outputs differ from alt-tvm's: {problem}", file=sys.stderr)
                return 1
            runners[name] = (runner, arrays)
        timed = time_interleaved(runners, rounds=args.rounds, repeat=args.repeat)
    medians = {label: ms for label, (ms, _) in timed.items()}
    mine = medians["alt-tvm"]
    if args.png is not None:
        _plot(args.png, f"{model.name}, {args.threads} thread(s)", medians)
    if args.json:
        print_json({"model": model.text, "threads": args.threads, "rounds": args.rounds,
                    "runners": {label: {"median_ms": ms, "rounds_ms": rounds, "ratio_vs_alt_tvm": ms / mine}
                                for label, (ms, rounds) in timed.items()}})
        return 0
    print(f"{model.name}: {args.threads} thread(s), median of {args.rounds} interleaved rounds")
    print(f"{'runtime':14s} {'ms':>9s} {'its time / alt-tvm':>19s}")
    for label, ms in medians.items():
        print(f"{label:14s} {ms:9.3f} {ms / mine:18.2f}x")
    if args.png is not None:
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
