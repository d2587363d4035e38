"""TT design-space exploration of one FC layer (Anthimopoulos et al., §4; see ``alt_tvm.strategies.tt.dse``).

Prints one JSON object: the layer, the config, the counts after each pruning step and the
surviving solutions (or their number with ``--count-only``)::

    alt-tvm dse --shape 784 300 --count-only
    alt-tvm dse --shape 4096 2048 --csv sols.csv --plot sols.png

(``python scripts/tt_dse.py ...`` is the same command.)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from alt_tvm.strategies.tt.dse import DSEConfig, TTSolution, count, dense_flops, dense_params, solutions


def write_csv(path: Path, sols: Sequence[TTSolution]) -> None:
    """Write one row per solution (factors joined by ``x``)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["d", "in_factors", "out_factors", "rank", "flops", "params", "einsum_flops"])
        for s in sols:
            w.writerow(
                [
                    s.d,
                    "x".join(map(str, s.in_factors)),
                    "x".join(map(str, s.out_factors)),
                    s.rank,
                    s.flops,
                    s.params,
                    " ".join(map(str, s.einsum_flops)),
                ]
            )


def plot(path: Path, sols: Sequence[TTSolution], *, n: int, m: int) -> None:
    """FLOPs-vs-parameters scatter coloured by combination length, dense layer marked."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on the build machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    if sols:
        sc = ax.scatter([s.params for s in sols], [s.flops for s in sols], c=[s.d for s in sols], s=6, cmap="viridis")
        fig.colorbar(sc, ax=ax, label="combination length d")
    ax.scatter([dense_params(n, m)], [dense_flops(n, m)], marker="x", color="red", label="dense layer")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters (eq. 4)")
    ax.set_ylabel("FLOPs (eq. 11)")
    ax.set_title(f"TT solutions of FC [{n}, {m}] ({len(sols)})")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="alt-tvm dse", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", nargs=2, type=int, required=True, metavar=("N", "M"), help="inputs N, outputs M")
    ap.add_argument("--vl", type=int, default=8, help="vector length in elements (default 8: 256-bit RVV f32)")
    ap.add_argument("--max-length", type=int, default=4, help="scalability rule: drop poorly scaling d > this")
    ap.add_argument("--json", action="store_true", help="compact one-line JSON (default: indented)")
    ap.add_argument("--count-only", action="store_true", help="report the number of solutions, not the list")
    ap.add_argument("--csv", type=Path, help="write the surviving solutions to this CSV file")
    ap.add_argument("--plot", type=Path, help="write a FLOPs-vs-parameters scatter (PNG) here")
    args = ap.parse_args(argv)
    n, m = args.shape
    try:
        config = DSEConfig(vl=args.vl, max_length=args.max_length)
        counts = count(n, m, config=config)
        need_list = not args.count_only or args.csv or args.plot
        sols = solutions(n, m, config=config) if need_list else []
    except ValueError as exc:
        ap.error(str(exc))
    obj = {
        "shape": {"n": n, "m": m},
        "config": {"vl": config.vl, "max_length": config.max_length, "min_heavy_flops": config.min_heavy_flops},
        "dense": {"flops": dense_flops(n, m), "params": dense_params(n, m)},
        **counts,  # the counts after each pruning step, as top-level keys (the interface)
        "solutions": counts["scalability"] if args.count_only else [s.to_dict() for s in sols],
    }
    if args.csv:
        write_csv(args.csv, sols)
    if args.plot:
        plot(args.plot, sols, n=n, m=m)
    json.dump(obj, sys.stdout, indent=None if args.json else 2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
