"""Tune a model's layouts and loops jointly and write the tuning log (and a PNG of the curves).

    alt-tvm tune small_cnn --trials 64                 # a reference model by name
    alt-tvm tune model.onnx --trials 200 --log logs/model.jsonl --resume
    alt-tvm tune resnet18 --trials 300 --tracker 127.0.0.1:9190 --key rasp --target kirin990

(``python scripts/tune.py ...`` is the same command.)

Then build with the log: ``alt_tvm.build("model.onnx", records="logs/model.jsonl")``.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="alt-tvm tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="ONNX file, or a reference model name (alt_tvm.models.MODEL_NAMES)")
    parser.add_argument("--trials", type=int, required=True, help="measured candidates in total")
    parser.add_argument("--log", default=None, help="tuning log (default logs/<model>.jsonl)")
    parser.add_argument("--plot", default=None, help="PNG of the tuning curves (default next to the log)")
    parser.add_argument("--joint-fraction", type=float, default=0.3, help="budget share of the joint stage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="reuse the log's measurements")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tracker", default=None, help="RPC tracker host:port (measure on a remote board)")
    parser.add_argument("--key", default=None, help="RPC device key registered with the tracker")
    parser.add_argument("--target", default=None, help="board name from alt_tvm.target (default: this host)")
    parser.add_argument("--layout-levels", type=int, default=1, choices=[1, 2],
                        help="one- or two-level layout tiling templates (paper §5.1)")
    parser.add_argument("--features", default="tir", choices=["tir", "knobs"],
                        help="what the XGBoost cost model learns from (lowered TIR, or the knob values)")
    parser.add_argument("--revalidate", type=int, default=3,
                        help="re-measure this many of each task's fastest candidates (within --trials; 0: off)")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    from alt_tvm.integration import tune
    from alt_tvm.models import MODEL_NAMES, get_model
    from alt_tvm.target import board, host

    if (args.tracker is None) != (args.key is None):
        raise SystemExit("--tracker and --key go together")
    if args.model in MODEL_NAMES:
        model, inputs = get_model(args.model)
        name = args.model
    elif os.path.isfile(args.model):
        model, inputs = args.model, None
        name = os.path.splitext(os.path.basename(args.model))[0]
    else:
        raise SystemExit(f"{args.model!r} is neither a file nor a reference model ({', '.join(MODEL_NAMES)})")
    log = args.log or os.path.join("logs", f"{name}.jsonl")
    plot = args.plot or os.path.splitext(log)[0] + ".png"
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    target = board(args.target) if args.target else host()
    measure = None
    if args.tracker:
        from alt_tvm.tuning.remote import rpc_measure

        host_name, _, port = args.tracker.rpartition(":")
        if not host_name or not port.isdigit():
            raise SystemExit(f"--tracker must be host:port, got {args.tracker!r}")
        measure = rpc_measure(tracker_host=host_name, tracker_port=int(port), key=args.key, target=target)
    summaries = tune(model, trials=args.trials, log=log, target=target, seed=args.seed,
                     joint_fraction=args.joint_fraction, example_inputs=inputs, resume=args.resume,
                     measure=measure, progress=not args.no_progress, plot=plot,
                     layout_levels=args.layout_levels, features=args.features, revalidate=args.revalidate)
    print(f"{'task':60s} {'x':>3s} {'trials':>6s} {'default ms':>10s} {'best ms':>9s} {'speedup':>8s}")
    for s in summaries:
        print(f"{s.key[:60]:60s} {s.weight:3d} {s.trials:6d} {s.default_ms:10.3f} {s.best_ms:9.3f} "
              f"{s.default_ms / s.best_ms:7.2f}x")
    print(f"log: {log}\nplot: {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
