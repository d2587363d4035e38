"""How far each CNN of a sweep is from the FMA peak, for ONNX Runtime and alt-tvm.

    python scripts/count_flops.py --sweep benchmarks/results/znver4/cnn_suite.json --models-dir models/sweep \
        --peak 229

Counts the arithmetic of each ONNX model's convolutions and matrix products (2 FLOPs per
multiply-add, direct convolution; the elementwise ops are left out), then reads the times of a
``sweep_public.py`` run and prints, per model: each runtime's GFLOP/s as a share of the FP32
FMA peak, their ratio, and ``ORT / floor``, the ratio alt-tvm would reach if it ran the model
at the peak (the direct-convolution FLOPs at the peak; Winograd convolutions do fewer
multiplications and can read above 100%). ``--peak`` is the peak measured in that sweep's run
(its log prints it); without it the peak is measured here, on 2 threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from alt_tvm.bench.onnx_flops import count_flops, node_flops

__all__ = ["count_flops", "main", "node_flops", "read_sweep", "rows"]


def read_sweep(path: str) -> list[dict]:
    """The rows of a sweep: a results file (``benchmarks/results/<kind>/<suite>.json``) or a
    ``sweep_public.py`` JSON-lines journal."""
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict) and "results" in data:
        data = data["results"]
    if isinstance(data, dict):  # the results' rows, or a journal of one row
        return data["rows"] if "rows" in data else [data]
    return data


def rows(sweep: list[dict], *, models_dir: str, peak_gflops: float, exporter: str = "torchscript") -> list[dict]:
    """One row per model of the sweep whose ONNX file is in ``models_dir``."""
    out = []
    for record in sweep:
        path = os.path.join(models_dir, f"{record['model']}.onnx")
        times = record.get("ms", {})
        ort, alt = times.get("onnxruntime"), times.get(f"alt-tvm {exporter}")
        if not os.path.exists(path) or ort is None or alt is None:
            continue
        flops = count_flops(path)
        floor_ms = flops / (peak_gflops * 1e9) * 1e3
        out.append({"model": record["model"], "gflop": flops / 1e9, "ort_ms": ort, "alt_ms": alt,
                    "ort_peak": floor_ms / ort, "alt_peak": floor_ms / alt, "ort_over_alt": ort / alt,
                    "ort_over_floor": ort / floor_ms})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True,
                        help="a sweep's results (benchmarks/results/<kind>/<suite>.json) or JSON-lines journal")
    parser.add_argument("--models-dir", required=True, help="where the sweep's <model>.onnx files are")
    parser.add_argument("--peak", type=float, default=None, help="FP32 GFLOP/s (default: measured here)")
    parser.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    args = parser.parse_args(argv)
    if args.peak is not None and args.peak <= 0:
        parser.error(f"--peak must be positive, got {args.peak}")
    if args.peak is None:
        from alt_tvm.bench import measure_peak_gflops

        args.peak = measure_peak_gflops(threads=2)
    try:
        sweep = read_sweep(args.sweep)
    except (OSError, json.JSONDecodeError) as err:
        parser.error(f"--sweep {args.sweep}: not a readable results or JSON-lines file ({err})")
    table = rows(sweep, models_dir=args.models_dir, peak_gflops=args.peak, exporter=args.exporter)
    if not table:
        print(f"no model of {args.sweep} has an ONNX file in {args.models_dir} and both times", file=sys.stderr)
        return 2
    print(f"FP32 peak {args.peak:.0f} GFLOP/s; alt-tvm: the {args.exporter} export")
    print("| model | GFLOP | ORT ms | alt-tvm ms | ORT % of peak | alt-tvm % of peak | ORT / alt-tvm | ORT / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in table:
        print(f"| {r['model']} | {r['gflop']:.2f} | {r['ort_ms']:.2f} | {r['alt_ms']:.2f} | {100 * r['ort_peak']:.0f}% "
              f"| {100 * r['alt_peak']:.0f}% | {r['ort_over_alt']:.2f} | {r['ort_over_floor']:.2f} |")

    def geomean(key: str) -> float:
        return math.exp(sum(math.log(r[key]) for r in table) / len(table))

    print(f"geometric mean: ORT / alt-tvm {geomean('ort_over_alt'):.3f}, ORT / floor {geomean('ort_over_floor'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
