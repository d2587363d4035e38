"""Build a model with alt-tvm and write it as an artifact that ``alt_tvm.load`` runs without rebuilding.

    alt-tvm build resnet18                                  # writes resnet18.alt/
    alt-tvm build model.onnx --records logs/model.jsonl -o out/model.alt
    alt-tvm build resnet18 --target kirin990 -o r18-kirin.alt   # cross-compiled: an AArch64 library

Then run it: ``alt_tvm.load("resnet18.alt")(x)``, time it with ``alt-tvm bench resnet18.alt``,
or on a board: ``alt_tvm.load("r18-kirin.alt", remote="tracker:9190", key="kirin")``.

Exit status: 0 when built and written, 2 for a bad argument (one line on stderr).
"""

from __future__ import annotations

import os
import sys

from .common import (
    MODEL_HELP,
    add_output_options,
    build_model,
    checked_model,
    configure_logging,
    parser_for,
    print_json,
    target_problem,
    unwritable_directory,
)


def _parser():
    parser = parser_for("build", __doc__)
    parser.add_argument("model", help=MODEL_HELP.split(", or (bench")[0])
    parser.add_argument("--records", default=None, help="tuning log to apply (written by `alt-tvm tune`)")
    parser.add_argument("--target", default=None,
                        help="board name from alt_tvm.target or cpu:<LLVM CPU> (cpu:haswell: AVX2); default: this host")
    parser.add_argument("--priors", default="auto",
                        help="learned defaults where no tuning log applies: auto (those alt-tvm ships for this "
                             "target), none, or a file written by scripts/fit_priors.py")
    parser.add_argument("-o", "--output", default=None, help="artifact directory (default ./<model>.alt)")
    add_output_options(parser)
    return parser


def main(argv=None) -> int:
    """Run ``alt-tvm build``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    model = checked_model(parser, args.model, args.records, artifacts=False)
    output = args.output or f"{model.name}.alt"
    if args.priors not in ("auto", "none") and not os.path.isfile(args.priors):
        parser.error(f"--priors: {args.priors!r} is neither auto, none nor a priors file")
    for problem in (target_problem(args.target), unwritable_directory(output)):
        if problem is not None:
            parser.error(problem if problem.startswith("--") else f"-o: {problem}")
    configure_logging(args.verbose)

    built = build_model(model, records=args.records, target=args.target, priors=args.priors)
    path = built.export(output)
    report = built.report
    if args.json:
        print_json({"artifact": os.fspath(path), "target": built.target.name, "partitions": len(report.partitions),
                    "tuned": report.tuned, "learned": dict(report.learned), "conversions": report.conversions,
                    "fallbacks": sorted(report.fallbacks),
                    "failed": dict(report.failed), "report": report.summary()})
    else:
        print(report.summary())
        print(f"artifact: {path} (for {built.target.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
