"""Each dense 1x1 and 3x3 convolution's share of the FMA peak inside its model, built by alt-tvm.

The roofline question of a CNN's compute-bound convolutions, kernel by kernel: every kernel
that computes one dense convolution (groups 1) with a 1x1 or 3x3 window, alone or with its
element-wise epilogue (a fused inverted-residual block also runs a depthwise conv and is
left out, as are grouped and depthwise convs, and any conv whose FLOPs per byte at the least
traffic are below the machine balance measured first: those are bound by memory), is timed inside
the model by the VM's per-kernel instrument. Its rate, at the model's direct-convolution
FLOPs, is divided by the FP32 FMA peak measured just before and just after the profile (the
higher reading; where the two disagree by more than 10% the host changed phase during the
profile, and it is taken again, up to ``--attempts`` times). A Winograd kernel does fewer multiplications than it
is credited with, so it can read above 100%; it is marked.

    python scripts/conv_share_of_peak.py models/sweep/tv_resnet50.onnx models/sweep/tv_googlenet.onnx \\
        [--repeat 20] [--below 80] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

import numpy as np


def dense_convs(kernels) -> dict[str, dict]:
    """Kernel name -> its convolution (window, channels, output map, epilogue) for every
    partition kernel of a build's ``report.kernels`` that computes one dense 1x1 or 3x3 conv."""
    found = {}
    for kernel in kernels:
        if kernel.kind != "partition" or kernel.ops.count("relax.nn.conv2d") != 1 or not kernel.workload:
            continue
        op, operands, attrs, out, *rest = kernel.workload.split("|")
        if op != "nn.conv2d" or json.loads(attrs).get("groups", 1) != 1:
            continue
        shapes = [tuple(int(d) for d in re.findall(r"\d+", dims)) for dims in re.findall(r"\(([\d, ]+)\)", operands)]
        out_channels, in_channels, kh, kw = shapes[1]
        if (kh, kw) not in ((1, 1), (3, 3)):
            continue
        out_shape = tuple(int(d) for d in re.findall(r"\d+", out.split(":")[0]))
        # FLOPs per byte at the least traffic: each operand read once, the output written once.
        least_bytes = 4 * sum(int(np.prod(shape)) for shape in (shapes[0], shapes[1], out_shape))
        found[kernel.name] = {"window": f"{kh}x{kw}", "in": in_channels, "out": out_channels,
                              "map": out_shape, "epilogue": "|".join(rest), "flops": kernel.flops,
                              "intensity": kernel.flops / least_bytes}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="ONNX files")
    parser.add_argument("--repeat", type=int, default=20, help="profiled runs (median per kernel)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: the target's cores)")
    parser.add_argument("--below", type=float, default=80.0, help="list the kernels under this share (%%)")
    parser.add_argument("--json", default=None, help="append one JSON line per model here")
    parser.add_argument("--attempts", type=int, default=3,
                        help="profiles per model until the peak readings around one agree within 10%%")
    args = parser.parse_args(argv)

    import alt_tvm
    from alt_tvm.deploy.model import use_runtime_threads
    from alt_tvm.target import host
    from alt_tvm.timing import PeakReadings, measure_memory_bandwidth

    threads = args.threads or host().num_cores
    use_runtime_threads(threads)
    balance = PeakReadings(threads=threads).measure() / measure_memory_bandwidth(threads=threads)
    print(f"machine balance {balance:.1f} FLOP/byte: a conv below it is bound by memory and left out")
    for model in args.models:
        built = alt_tvm.build(model)
        convs = {name: conv for name, conv in dense_convs(built.report.kernels).items()
                 if conv["intensity"] >= balance}
        rng = np.random.default_rng(0)
        x = rng.standard_normal(built.input_shapes[0]).astype("float32")
        for _ in range(args.attempts):
            # A reading before and one after: on a shared host, if they disagree the profile may
            # have run in a slower phase than the best reading, so it is taken again.
            before = PeakReadings(threads=threads).measure()
            profile = built.profile(x, repeat=args.repeat)
            after = PeakReadings(threads=threads).measure()
            steady = min(before, after) >= 0.9 * max(before, after)
            if steady:
                break
        symbols = {str(func.attrs["global_symbol"]): func for _, func in built.mod.functions_items()
                   if func.attrs is not None and "global_symbol" in func.attrs}
        scripts = {name: symbols[name].script() for name in convs if name in symbols}
        rows = []
        for name, conv in convs.items():
            per_call = statistics.median(profile.per_call(name))
            share = conv["flops"] / (per_call * 1e-3) / 1e9 / max(before, after) * 100
            winograd = conv["window"] == "3x3" and "winograd" in scripts.get(name, "")
            rows.append({**conv, "kernel": name, "ms": per_call, "share": share, "winograd": winograd})
        direct = [r for r in rows if not r["winograd"]]
        below = sorted((r for r in direct if r["share"] < args.below), key=lambda r: r["share"])
        phase = "" if steady else " (disagree: the host changed phase)"
        print(f"{model}: FMA peak {before:.0f} before, {after:.0f} after the profile{phase}; "
              f"{len(direct)} direct dense 1x1/3x3 conv kernels "
              f"({len(rows) - len(direct)} Winograd), {len(below)} under {args.below:.0f}% of the peak"
              + (f" (lowest {below[0]['share']:.0f}%)" if below else
                 f" (lowest {min(r['share'] for r in direct):.0f}%)" if direct else ""))
        for r in below:
            print(f"  {r['kernel']:18s} {r['window']} {r['in']:4d} -> {r['out']:4d} on {str(r['map']):18s} "
                  f"{r['ms']:.3f} ms/call {r['share']:3.0f}%  {r['epilogue']}")
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps({"model": model, "peak_gflops": [before, after], "kernels": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
