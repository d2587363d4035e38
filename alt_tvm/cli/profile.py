"""Time every kernel of a model inside whole-model runs: time, share, layout, GFLOP/s.

    alt-tvm profile resnet18
    alt-tvm profile resnet18.alt --limit 15
    alt-tvm profile model.onnx --records logs/model.jsonl --json

A kernel's time here is what it costs inside the model (after its producer, with the
caches that left), not alone with hot caches. ``GFLOP/s`` is against the kernel's own
arithmetic; compare it with the machine's FMA peak. ``tuning`` says whether a tuning log
tuned the kernel (``tuned``), whether its strategy has a tuning space it was not tuned in
(``default``), or that no space covers it (``-``); the last line gives the share of the
kernels' time in kernels with a space and in tuned ones, and the VM builtins' share of a run.

Exit status: 0, 2 for a bad argument (one line on stderr).
"""

from __future__ import annotations

import os
import statistics
import sys

from .common import (
    MODEL_HELP,
    add_output_options,
    checked_model,
    configure_logging,
    parser_for,
    print_json,
    require_positive,
    runnable,
)


def _parser():
    parser = parser_for("profile", __doc__)
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--records", default=None, help="tuning log applied when building MODEL")
    parser.add_argument("--repeat", type=int, default=5, help="profiled runs of the whole model (>= 1)")
    parser.add_argument("--limit", type=int, default=None, help="print only the N slowest kernels (>= 1)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="TVM threads (>= 1)")
    parser.add_argument("--roof", action="store_true",
                        help="measure this machine's FMA peak and memory bandwidth first and add a column "
                             "with each kernel's share of the nearer roof")
    add_output_options(parser)
    return parser


def main(argv=None) -> int:
    """Run ``alt-tvm profile``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    require_positive(parser, {"--repeat": args.repeat, "--limit": args.limit, "--threads": args.threads})
    model = checked_model(parser, args.model, args.records, artifacts=True)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    configure_logging(args.verbose)

    compiled = runnable(model, records=args.records)
    from alt_tvm.bench.peak import PeakReadings, measure_memory_bandwidth

    # The peak is read before and after the profile: one reading can land in a slow phase.
    peak = PeakReadings(threads=args.threads)
    if args.roof:
        peak.measure()
    profile = compiled.profile(*compiled.random_inputs(seed=0), repeat=args.repeat)
    roofs = {"peak_gflops": peak.measure(), "bandwidth_gbs": measure_memory_bandwidth(threads=args.threads)} \
        if args.roof else {}
    rows = profile.rows()[: args.limit]
    if args.json:
        print_json({"model": model.text, "threads": args.threads, **roofs,
                    "total_ms": statistics.median(profile.totals_ms),
                    "kernels": [{"kernel": r.kernel, "kind": r.kind, "ops": list(r.ops), "layout": r.layout,
                                 "ms": r.ms, "calls": r.calls, "share": r.share, "gflops": r.gflops,
                                 "gbytes": r.gbytes, "tuning": r.tuning}
                                for r in rows],
                    **dict(zip(("share_with_space", "share_tuned"), profile.tuning_shares())),
                    "share_builtins": profile.builtin_share()})
    else:
        if roofs:
            print(f"FMA peak {roofs['peak_gflops']:.0f} GFLOP/s, memory bandwidth {roofs['bandwidth_gbs']:.1f} GB/s "
                  f"({args.threads} thread(s), measured now)")
        print(profile.table(limit=args.limit, **roofs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
