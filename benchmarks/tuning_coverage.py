"""How much of each model's time runs in kernels a tuning space covers.

For each model, in a child process of its own (``alt-tvm profile MODEL --json``): build it
untuned, time every kernel inside whole-model runs, and sum the kernels' time by their
``tuning`` column (``default``: its strategy has a tuning space; ``-``: none does). The VM's
builtins (allocation, shape checks) are not kernels and are timed with the instrument's own
cost: their share of a run is given apart. The kernels outside every space are listed by what
they compute, the largest first: they are what the tuner cannot reach.

    python benchmarks/tuning_coverage.py [--names tv_resnet18 tv_mobilenet_v2 ...] [--threads 2]
                                         [--repeat 3] [--timeout 900] [--json FILE]

``--names`` takes export names under ``models/sweep/`` (``tv_resnet18`` for
``models/sweep/tv_resnet18.onnx``; ``python scripts/export_public.py`` writes them); the
default is every TorchScript export found there. The run is written to
``benchmarks/results/<machine kind>/tuning_coverage.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from alt_tvm.bench.results import results_path, write_results

SWEEP = Path(__file__).resolve().parents[1] / "models" / "sweep"
SUITE = "tuning_coverage"


def uncovered(kernels: list[dict]) -> list[dict]:
    """The kernels no tuning space covers, merged by kind and operators, largest share first."""
    merged: dict[tuple[str, str], float] = {}
    for kernel in kernels:
        if kernel["tuning"] in ("tuned", "learned", "default") or kernel["kernel"].startswith("vm.builtin."):
            continue
        ops = "+".join(op.removeprefix("relax.").removeprefix("nn.") for op in kernel["ops"])
        merged[kernel["kind"], ops] = merged.get((kernel["kind"], ops), 0.0) + kernel["share"]
    rows = [{"kind": kind, "ops": ops, "share": share} for (kind, ops), share in merged.items()]
    return sorted(rows, key=lambda r: -r["share"])


def profile_model(path: Path, *, threads: int, repeat: int, timeout: float) -> dict:
    """One model's coverage row; ``error`` names what failed instead."""
    command = [sys.executable, "-m", "alt_tvm.cli", "profile", str(path), "--json", "--repeat", str(repeat),
               "--threads", str(threads)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"model": path.stem, "error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"model": path.stem, "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    result = json.loads(done.stdout)
    return {"model": path.stem, "total_ms": result["total_ms"], "share_with_space": result["share_with_space"],
            "share_tuned": result["share_tuned"], "share_builtins": result["share_builtins"],
            "uncovered": uncovered(result["kernels"])[:8]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", nargs="*", default=None,
                        help="exports under models/sweep (default: all TorchScript ones)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="profiled runs per model")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    parser.add_argument("--json", default=None, help="where to write the run (default: the results folder)")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.stem for p in SWEEP.glob("*.onnx") if not p.stem.endswith(".dynamo"))
    missing = [n for n in names if not (SWEEP / f"{n}.onnx").is_file()]
    if missing:
        parser.error(f"no export {', '.join(missing)} under {SWEEP} (python scripts/export_public.py writes them)")
    rows = []
    for name in names:
        row = profile_model(SWEEP / f"{name}.onnx", threads=args.threads, repeat=args.repeat, timeout=args.timeout)
        rows.append(row)
        if "error" in row:
            print(f"{name:28s} error: {row['error']}", flush=True)
            continue
        top = ", ".join(f"{u['ops']} {u['share'] * 100:.1f}%" for u in row["uncovered"][:3])
        print(f"{name:28s} {row['share_with_space'] * 100:5.1f}% of kernel time in kernels with a space "
              f"(builtins {row['share_builtins'] * 100:.1f}% of a run); outside: {top}", flush=True)
    measured = [r for r in rows if "error" not in r]
    below = [r["model"] for r in measured if r["share_with_space"] < 0.95]
    print(f"{len(measured)} models; below 95% in kernels with a space: {len(below)} ({', '.join(below) or 'none'})")
    write_results(SUITE, {"models": rows, "threads": args.threads, "below_95": below},
                  path=args.json or results_path(SUITE), threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
