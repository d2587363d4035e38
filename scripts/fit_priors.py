"""Fit learned defaults from tuning logs (:mod:`alt_tvm.priors`).

    python scripts/fit_priors.py logs/reference/*.jsonl -o alt_tvm/data/priors.json
    python scripts/fit_priors.py logs/mine/*.jsonl -o my_priors.json --check [--min-logs 2]

Each log's in-model decisions (those its whole-model check kept) become decisions of the
target they were measured on. ``--check`` reads each log against the decisions of the others
(leave one log out): for how many of its decisions the others hold a neighbour of the same
kind, and how many of those agree with it (the same finding, or both keeping the defaults).
A build on that target then applies them where it has no tuning log
(``alt_tvm.build(model, priors="my_priors.json")``; the shipped file is used by default).
"""

from __future__ import annotations

import argparse
import json
import sys

from alt_tvm.priors import fit_priors


def check(logs: list[str], *, min_logs: int = 1) -> list[str]:
    """Leave-one-log-out agreement lines (the others fitted with ``min_logs``)."""
    lines = []
    for held in logs:
        others = fit_priors([log for log in logs if log != held], min_logs=min_logs)
        covered = agree = 0
        decisions = fit_priors([held]).decisions
        for decision in decisions:
            nearest = others.nearest(decision.workload, target=decision.target)
            if nearest is None:
                continue
            covered += 1
            agree += nearest.finding == decision.finding and (not decision.finding
                                                              or nearest.strategy == decision.strategy)
        lines.append(f"{held}: {len(decisions)} decisions, {covered} with a neighbour in the other logs, "
                     f"{agree} of those agree")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", help="tuning logs written by alt_tvm.tune")
    parser.add_argument("-o", "--output", required=True, help="the priors file to write")
    parser.add_argument("--check", action="store_true", help="leave-one-log-out agreement")
    parser.add_argument("--min-logs", type=int, default=1,
                        help="keep a finding only where this many logs made the same choice near it (default 1)")
    args = parser.parse_args(argv)
    if args.min_logs < 1:
        parser.error(f"--min-logs must be >= 1, got {args.min_logs}")
    try:
        priors = fit_priors(args.logs, min_logs=args.min_logs)
    except FileNotFoundError as err:
        parser.error(str(err))
    with open(args.output, "w") as out:
        json.dump(priors.to_json(), out, indent=1)
        out.write("\n")
    targets = sorted({d.target for d in priors.decisions})
    findings = sum(d.finding for d in priors.decisions)
    print(f"{len(priors.decisions)} decisions ({findings} beat the defaults) on {len(targets)} target(s) "
          f"-> {args.output}")
    if args.check:
        print("\n".join(check(args.logs, min_logs=args.min_logs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
