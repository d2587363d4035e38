"""Tune a model's layouts and loops jointly and write the tuning log (and a PNG of the curves).

    alt-tvm tune small_cnn --trials 64                 # a reference model by name
    alt-tvm tune model.onnx --trials 200 --log logs/model.jsonl --resume
    alt-tvm tune model.onnx --trials 200 --build-workers 2      # built and timed in worker processes
    alt-tvm tune resnet18 --trials 300 --tracker 127.0.0.1:9190 --key rasp --target kirin990
    alt-tvm tune resnet18 --trials 2000 --tracker 127.0.0.1:9190 --key kirin --target kirin990 \
        --scheduler gradient --in-flight 2 --lookahead 1 --build-workers 16

(``python scripts/tune.py ...`` is the same command.)

Then build with the log: ``alt_tvm.build("model.onnx", records="logs/model.jsonl")``.

Exit status: 0 when every task has a successful measurement, 1 when some task has none
(each is named on stderr with its last error), 2 for a bad argument, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from alt_tvm.rpc import parse_address

from .common import Parser, parser_for, target_problem, unwritable


def _parser() -> Parser:
    parser = parser_for("tune", __doc__)
    parser.add_argument("model", help="ONNX file, or a reference model name (alt_tvm.models.MODEL_NAMES)")
    parser.add_argument("--trials", type=int, required=True,
                        help="measured candidates in total (at least 2 per tunable task)")
    parser.add_argument("--log", default=None, help="tuning log (default logs/<model>.jsonl)")
    parser.add_argument("--plot", default=None, help="PNG of the tuning curves (default next to the log)")
    parser.add_argument("--joint-fraction", type=float, default=0.3, help="budget share of the joint stage, in [0, 1]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the search (>= 0)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the log's measurements (transient failures are measured again)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="TVM threads (>= 1)")
    parser.add_argument("--tracker", default=None, help="RPC tracker host:port (measure on a remote board)")
    parser.add_argument("--key", default=None, help="RPC device key registered with the tracker")
    parser.add_argument("--target", default=None,
                        help="board name from alt_tvm.target or cpu:<LLVM CPU> (cpu:haswell: AVX2); default: this host")
    parser.add_argument("--build-workers", type=int, default=None,
                        help="candidates built at once in worker processes: with --tracker cross-built for the "
                             "boards (default: this machine's cores); without, each batch is built in parallel "
                             "here, then timed one at a time in a separate process, so a crashing candidate costs "
                             "only itself (default without: built and timed in this process, one at a time)")
    parser.add_argument("--boards", type=int, default=None,
                        help="with --tracker: candidates run at once (default: every server the tracker holds "
                             "for --key)")
    parser.add_argument("--scheduler", default="static", choices=["static", "gradient"],
                        help="how tasks share --trials: fixed shares by weight, or rounds to the task that "
                             "moves the model most")
    parser.add_argument("--shares", default="time", choices=["time", "occurrences"],
                        help="what a task's share of --trials follows: its kernels' time in the untuned model "
                             "(profiled once first, where the model runs here), or how often it occurs")
    parser.add_argument("--in-flight", type=int, default=None,
                        help="tasks tuned at once, so one task's batch builds while another's runs (default: 2 "
                             "with --tracker, else 1: here a build beside a timed run disturbs the timing)")
    parser.add_argument("--lookahead", type=int, default=None,
                        help="with --tracker: search steps of a task sent to be built before the last one's "
                             "results are in, so batch n+1 builds while batch n runs (default: 1 with "
                             "--tracker, else 0)")
    parser.add_argument("--layout-levels", type=int, default=1, choices=[1, 2],
                        help="one- or two-level layout tiling templates (paper §5.1)")
    parser.add_argument("--features", default="tir", choices=["tir", "knobs"],
                        help="what the XGBoost cost model learns from (lowered TIR, or the knob values)")
    parser.add_argument("--revalidate", type=int, default=3,
                        help="re-measure this many of each task's fastest candidates (within --trials; 0: off)")
    parser.add_argument("--no-operators", action="store_true",
                        help="tune only the strategies' partitions, not the loop knobs of the kernels no strategy "
                             "implements (pools, concatenations, element-wise chains, TVM's fused kernels)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the in-model decisions and whole-model check after the search")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """The parsed arguments; exits with status 2 and one line on stderr for a bad one."""
    return _parse(_parser(), argv)


def _parse(parser: Parser, argv) -> argparse.Namespace:
    args = parser.parse_args(argv)
    problem = _argument_problem(args)
    if problem is not None:
        parser.error(problem)
    return args


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags only this command has (threads, workers, boards, the
    tracker), which needs neither TVM nor the model (None: nothing). The search settings are
    checked by :class:`~alt_tvm.options.TuneOptions` (:func:`_tune_options`)."""
    if args.threads < 1:
        return f"--threads must be >= 1, got {args.threads}"
    for option, value in (("--build-workers", args.build_workers), ("--boards", args.boards)):
        if value is not None and value < 1:
            return f"{option} must be >= 1, got {value}"
    if (args.tracker is None) != (args.key is None):
        return "--tracker and --key go together"
    if args.tracker is not None:
        try:
            parse_address(args.tracker, what="--tracker")
        except ValueError as err:
            return str(err)
    return None


#: TuneOptions field -> the flag that sets it
_FLAGS = {"trials": "--trials", "log": "--log", "plot": "--plot", "joint_fraction": "--joint-fraction",
          "seed": "--seed", "resume": "--resume", "scheduler": "--scheduler", "shares": "--shares",
          "in_flight": "--in-flight", "lookahead": "--lookahead", "layout_levels": "--layout-levels",
          "features": "--features", "revalidate": "--revalidate", "operators": "--no-operators",
          "verify": "--no-verify", "progress": "--no-progress"}


def _tune_options(parser: Parser, args: argparse.Namespace, *, log: str, plot: str) -> Any:
    """The one :class:`~alt_tvm.options.TuneOptions` the flags give; a value it refuses exits
    with a one-line error naming the flag."""
    from alt_tvm.options import BuildOptions, TuneOptions

    try:
        options = TuneOptions(
            trials=args.trials, log=log, plot=plot, build=BuildOptions(target=args.target), seed=args.seed,
            joint_fraction=args.joint_fraction, resume=args.resume, progress=not args.no_progress,
            layout_levels=args.layout_levels, features=args.features, revalidate=args.revalidate,
            scheduler=args.scheduler, shares=args.shares, in_flight=_default(args.in_flight, 2 if args.tracker else 1),
            lookahead=_default(args.lookahead, 1 if args.tracker else 0), operators=not args.no_operators,
            verify=not args.no_verify)
    except (TypeError, ValueError) as err:
        message = str(err)
        field = next((name for name in _FLAGS if message.startswith(name + " ")), None)
        parser.error(message if field is None else _FLAGS[field] + message[len(field):])
    for option, value, alone in (("--boards", args.boards, None), ("--in-flight", args.in_flight, 1),
                                 ("--lookahead", args.lookahead, 0)):
        if value is not None and value != alone and args.tracker is None:
            parser.error(f"{option} needs --tracker (measuring on this machine builds and runs one at a time)")
    return options


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def _number(value: float, width: int, digits: int = 3, *, suffix: str = "", missing: str = "failed") -> str:
    text = f"{value:.{digits}f}{suffix}" if math.isfinite(value) else missing
    return f"{text:>{width}s}"


def main(argv=None) -> int:
    """Run ``alt-tvm tune``; returns the exit status (see the module docstring)."""
    parser = _parser()
    args = _parse(parser, argv)
    name = os.path.splitext(os.path.basename(args.model))[0]
    log = args.log or os.path.join("logs", f"{name}.jsonl")
    plot = args.plot or os.path.splitext(log)[0] + ".png"
    for option, path in (("--log", log), ("--plot", plot)):
        why = unwritable(path)
        if why is not None:
            parser.error(f"{option}: {why}")
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    problem = target_problem(args.target)
    if problem is not None:
        parser.error(problem)
    options = _tune_options(parser, args, log=log, plot=plot)
    if not os.path.isfile(args.model):
        from alt_tvm.models import MODEL_NAMES

        if args.model not in MODEL_NAMES:
            parser.error(f"{args.model!r} is neither a file nor a reference model ({', '.join(MODEL_NAMES)})")

    from alt_tvm.integration import tune
    from alt_tvm.models import MODEL_NAMES, get_model
    from alt_tvm.tuning.driver import BudgetError

    model, inputs = get_model(args.model) if args.model in MODEL_NAMES else (args.model, None)
    for path in (log, plot):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    target = options.build.target
    measure = None
    if args.build_workers is not None and not args.tracker:
        from alt_tvm.target import runs_on_host
        from alt_tvm.tuning.remote import isolated_measure

        if not runs_on_host(target):
            parser.error(f"--build-workers without --tracker builds and times here, but --target {args.target} "
                         "does not run here: add --tracker and --key")
        measure = isolated_measure(target=target, build_workers=args.build_workers)
    elif args.tracker:
        from alt_tvm.tuning.remote import rpc_measure

        host_name, port = parse_address(args.tracker, what="--tracker")
        try:
            measure = rpc_measure(tracker_host=host_name, tracker_port=port, key=args.key, target=target,
                                  build_workers=args.build_workers, boards=args.boards)
        except ConnectionError as err:
            parser.error(f"--tracker: {err}")
    try:
        summaries = tune(model, options=options, example_inputs=inputs, measure=measure)
    except BudgetError as err:
        parser.error(f"--trials: {err}")
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted; {log} keeps every finished measurement: run again with --resume",
              file=sys.stderr)
        return 130
    finally:
        if measure is not None:
            measure.close()
    if measure is not None:
        print(f"candidates per board ({measure.boards} at once, {measure.build_workers} build workers):")
        print(measure.board_report() or "none ran")
    from alt_tvm.records import is_emulated

    emulated = is_emulated(target)
    if emulated:
        # An emulator's times rank candidates for this target only: no speed-up is claimed from them.
        print(f"target {target.name} is emulated: its times measure the emulator, not the board's speed "
              "(no speed-up shown; the log's target says \"model\":\"qemu\")")
    print(f"{'task':60s} {'x':>3s} {'trials':>6s} {'default ms':>10s} {'best ms':>9s} {'speedup':>8s}")
    for s in summaries:
        speedup = s.default_ms / s.best_ms if s.ok and math.isfinite(s.default_ms) and not emulated else math.nan
        print(f"{s.key[:60]:60s} {s.weight:3d} {s.trials:6d} {_number(s.default_ms, 10)} {_number(s.best_ms, 9)} "
              f"{_number(speedup, 8, 2, suffix='x', missing='-')}")
    if getattr(summaries, "in_model", None) is not None:
        print(summaries.in_model.summary())
    print(f"log: {log}\nplot: {plot}")
    failed = 0
    for i, s in enumerate(summaries, start=1):
        op = s.key.split("|")[0]
        if not s.ok:
            failed += 1
            print(f"{parser.prog}: task {i} ({op}): no candidate measured successfully; last error: {s.error}",
                  file=sys.stderr)
        if s.pending:
            print(f"{parser.prog}: task {i} ({op}): {s.pending} measurement(s) failed transiently "
                  f"(RPC, connection, remote timeout); run again with --resume to make them", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
