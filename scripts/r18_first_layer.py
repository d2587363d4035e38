"""The ALT paper's §7.3.3 case study on this machine: the first layer of ResNet-18.

pad to 230x230 -> conv 7x7 stride 2, 3 -> 64 channels -> bias -> ReLU, batch 1. Each
variant below runs the *same* loop schedule (strategies/alt_conv.py: register-blocked,
vectorised, parallel, epilogue fused); only the data layouts differ:

  tiled        the paper's template N.H/ht.W/wt.O/ot.ht.wt.ot, input unfolded (ht, wt)
  nchw         canonical layouts, vectors along output channels (same loops as tiled)
  nchw-wvec    canonical layouts, vectors along width (NCHW's natural contiguous axis)
  nhwc         channels-last data/output, HWIO weights

Every variant is checked against PyTorch before it is timed; all are timed in this one
process, interleaved, and reported as ratios against the tiled layout. PyTorch (oneDNN)
is printed as the reference users would reach for.

    python scripts/r18_first_layer.py [--threads 2] [--repeat 7] [--ht 4 --wt 16 --ot 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="worker threads for TVM and PyTorch")
    parser.add_argument("--repeat", type=int, default=7, help="timing repeats per variant (median reported)")
    parser.add_argument("--number", type=int, default=10, help="calls per timing repeat")
    parser.add_argument("--ht", type=int, default=4)
    parser.add_argument("--wt", type=int, default=16)
    parser.add_argument("--ot", type=int, default=16)
    parser.add_argument("--w-reg", type=int, default=4, help="register block along width")
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="FP32 peak to report %% of (default: measured now with an FMA-bound kernel)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    # The TVM runtime reads its thread count once, at first use.
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import torch
    import tvm
    from tvm import te

    from alt_tvm.bench import measure_peak_gflops, run_interleaved, time_compiled
    from alt_tvm.layout import rewrite
    from alt_tvm.strategies.alt.case_study import (
        R18_FIRST_LAYER,
        ConvTiling,
        conv2d_graph,
        conv2d_layouts,
        schedule_conv2d,
    )
    from alt_tvm.target import host

    torch.set_num_threads(args.threads)
    wl = R18_FIRST_LAYER
    target = host().to_tvm()
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((wl.n, wl.c, wl.h, wl.w), dtype=np.float32)
    w = rng.standard_normal((wl.o, wl.c, wl.kh, wl.kw), dtype=np.float32) * 0.1
    b = rng.standard_normal((wl.o,), dtype=np.float32)
    xt, wt, bt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
    with torch.no_grad():
        ref = torch.relu(torch.nn.functional.conv2d(xt, wt, bt, stride=wl.stride, padding=wl.pad)).numpy()

    tiling_o = ConvTiling(ht=args.ht, wt=args.wt, ot=args.ot, w_reg=args.w_reg, vec_axis="o")
    tiling_w = ConvTiling(ht=args.ht, wt=args.wt, ot=args.ot, o_reg=4, vec_axis="w")
    variants = [("tiled", "tiled", tiling_o), ("nchw", "nchw", tiling_o),
                ("nchw-wvec", "nchw", tiling_w), ("nhwc", "nhwc", tiling_o)]

    built = {}
    for name, kind, tiling in variants:
        graph = conv2d_graph(wl)
        result = rewrite([graph.out], layouts=conv2d_layouts(graph, wl, kind=kind, tiling=tiling))
        func = te.create_prim_func(result.args(graph.args))
        t0 = time.perf_counter()
        executable = tvm.compile(schedule_conv2d(func, graph, kind=kind, tiling=tiling), target=target)
        compile_s = time.perf_counter() - t0
        out_layout = result.layout_of(graph.out)
        # Weights are constants: their layout is packed once, offline (not timed).
        tensors = [tvm.runtime.tensor(a, dev) for a in
                   (x, result.layout_of(graph.weight).apply(w), b, np.zeros(out_layout.shape, np.float32))]
        executable.jit()["main"](*tensors)
        got = out_layout.inverse_apply(tensors[-1].numpy())
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        if not err < 1e-4:
            print(f"{name}: result differs from PyTorch (max relative error {err:.2e})", file=sys.stderr)
            return 1
        built[name] = (executable, tensors, compile_s, err, out_layout)

    def torch_call(memory_format):
        xx, ww = xt.contiguous(memory_format=memory_format), wt.contiguous(memory_format=memory_format)

        def run():
            with torch.no_grad():
                torch.relu(torch.nn.functional.conv2d(xx, ww, bt, stride=wl.stride, padding=wl.pad))
        return run

    def time_torch(fn):
        for _ in range(3):
            fn()
        samples = []
        for _ in range(args.number):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return min(samples)

    torch_fns = {"pytorch (NCHW)": torch_call(torch.contiguous_format),
                 "pytorch (channels_last)": torch_call(torch.channels_last)}
    turns = {name: (lambda e=executable, t=tensors: time_compiled(e, t, number=args.number, repeat=1).min_ms)
             for name, (executable, tensors, *_rest) in built.items()}
    turns.update({name: (lambda fn=fn: time_torch(fn)) for name, fn in torch_fns.items()})
    names = list(turns)
    # Interleaved (a different variant first each round) so machine noise hits all of them alike.
    samples = dict(zip(names, run_interleaved(len(names), rounds=args.repeat, run=lambda i: turns[names[i]]())))

    peak = args.peak_gflops or measure_peak_gflops(threads=args.threads, target=target)
    base = float(np.median(samples["tiled"]))
    print(f"ResNet-18 first layer (pad 3, conv 7x7/2, 3->64, bias, ReLU), batch 1, {args.threads} thread(s), "
          f"target {target.attrs.get('mcpu', target.kind.name)}")
    print(f"tiled layout: ht={args.ht} wt={args.wt} ot={args.ot} it=1, w_reg={args.w_reg}; "
          f"{wl.flops / 1e6:.0f} MFLOP; FP32 FMA peak {peak:.0f} GFLOP/s "
          f"({'given' if args.peak_gflops else 'measured in this run'})")
    print(f"{'variant':26s} {'median ms':>10s} {'min ms':>8s} {'GFLOP/s':>8s} {'% peak':>7s} {'time / tiled':>13s}")
    rows = []
    for name, values in samples.items():
        med, low = float(np.median(values)), float(np.min(values))
        gflops = wl.flops / (med * 1e-3) / 1e9
        rows.append({"variant": name, "median_ms": med, "min_ms": low, "gflops": gflops, "ratio_to_tiled": med / base})
        print(f"{name:26s} {med:10.3f} {low:8.3f} {gflops:8.1f} {100 * gflops / peak:6.1f}% {med / base:12.2f}x")
    speedup = float(np.median(samples["nchw"])) / base
    print(f"\nSame loop schedule, tiled layout vs NCHW: {speedup:.2f}x faster "
          f"(vs NCHW with width vectors: {float(np.median(samples['nchw-wvec'])) / base:.2f}x)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": args.threads, "peak_gflops": peak, "tiling": vars(tiling_o), "results": rows},
                      fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
