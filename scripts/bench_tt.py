"""Benchmark TT-factorised FC layers and the Table 3 einsum kernels (seed 000, §6.3-6.4).

For each layer: the TT chain built by alt-tvm (packed, vectorised, register-blocked), the
same chain in PyTorch (``torch.einsum`` + reshapes, Listing 1), the naive TE chain (no packing,
no schedule) and the uncompressed dense layer (``torch.nn.functional.linear``). For each
Table 3 kernel (``--kernels``): alt-tvm vs naive TE vs ``torch.einsum``. Variants are timed
interleaved in one process; medians and minima over ``--repeat`` rounds.

    python scripts/bench_tt.py --threads 2 --repeat 5
    python scripts/bench_tt.py --kernels CB0,CB1 --threads 1
    python scripts/bench_tt.py --threshold-sweep
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="threads for TVM and PyTorch")
    p.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    p.add_argument("--batch", type=int, default=1, help="batch of the FC layers (the paper: 1)")
    p.add_argument("--rank", type=int, default=8, help="uniform TT rank of the layers")
    p.add_argument("--layers", default="resnet,vgg,alexnet,gpt2m",
                   help=f"comma list of layers, '' for none (known: {','.join(LAYERS)})")
    p.add_argument("--kernels", default="", help="Table 3 ids (e.g. CB0,CB3) or 'all'; '' for none")
    p.add_argument("--max-kernel-batch", type=int, default=4096,
                   help="cap bt of Table 3 kernels (keeps naive runs short)")
    p.add_argument("--threshold-sweep", action="store_true", help="measure 1 vs 2 threads vs einsum FLOPs")
    p.add_argument("--json", default="", help="write results to this file")
    return p.parse_args()


#: §6.4's rank-r solutions (aligned: n non-decreasing, m non-increasing): (N, M), n factors, m factors.
LAYERS = {
    "resnet": ((32, 64), (100, 10)),      # [2048, 1000]
    "vgg": ((16, 32), (32, 16)),          # [512, 512]
    "alexnet": ((64, 64), (64, 32)),      # [4096, 2048]
    "gpt2m": ((16, 64), (64, 64)),        # [1024, 4096]
}


def main() -> int:
    args = _parse()
    # The TVM thread pool reads this once, at first use.
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import torch
    import tvm
    from alt_tvm.strategies.tt_decompose import tt_svd
    from alt_tvm.strategies.tt_einsum import TABLE3, EinsumShape, build_chain, build_einsum, plan_einsum

    from alt_tvm.target import host

    torch.set_num_threads(args.threads)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    target = host()
    force = 1 if args.threads == 1 else None

    def tvm_runner(executable, tvm_args):
        fn = executable.jit()["main"]
        return lambda: fn(*tvm_args)

    def time_round(fn, number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number * 1e3

    def bench(variants: dict) -> dict:
        numbers = {}
        for name, fn in variants.items():
            fn()
            t = time_round(fn, 1)
            numbers[name] = max(1, min(2000, int(0.03 / max(t * 1e-3, 1e-7))))
        samples = {name: [] for name in variants}
        for _ in range(args.repeat):
            for name, fn in variants.items():
                # Untimed calls first: the previous variant's thread pool may still be spinning.
                time_round(fn, max(1, numbers[name] // 4))
                samples[name].append(time_round(fn, numbers[name]))
        return {name: (float(np.median(s)), float(np.min(s))) for name, s in samples.items()}

    results: dict = {"threads": args.threads, "target": target.description, "layers": [], "kernels": [],
                     "sweep": []}
    print(f"# {target.description}; {args.threads} thread(s); shared machine, interleaved rounds: {args.repeat}")

    # ------------------------------------------------------------------ layers
    for key in [k for k in args.layers.split(",") if k]:
        if key not in LAYERS:
            print(f"unknown layer {key!r}; known: {', '.join(LAYERS)}", file=sys.stderr)
            return 2
        ins, outs = LAYERS[key]
        n, m = int(np.prod(ins)), int(np.prod(outs))
        ranks = (1,) + (args.rank,) * (len(ins) - 1) + (1,)
        w = rng.standard_normal((m, n)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        dec = tt_svd(w, in_factors=ins, out_factors=outs, ranks=ranks)
        x = rng.standard_normal((args.batch, n)).astype(np.float32)
        variants, flops = {}, {}
        for name, opt in (("alt-tvm TT", True), ("naive TE TT", False)):
            chain = build_chain(in_factors=ins, out_factors=outs, ranks=dec.ranks, batch=args.batch,
                                optimized=opt, threads=force)
            out = np.zeros((args.batch, m), np.float32)
            tvm_args = ([tvm.runtime.tensor(x, dev)] + [tvm.runtime.tensor(g, dev) for g in chain.pack(dec.cores)]
                        + [tvm.runtime.tensor(bias, dev), tvm.runtime.tensor(out, dev)])
            variants[name] = tvm_runner(chain.compile(target), tvm_args)
            flops[name] = chain.flops
            # Check before timing: every TT variant must compute the same layer.
            variants[name]()
            err = np.abs(tvm_args[-1].numpy() - _torch_chain(torch, dec.cores, bias, x)).max()
            if err > 1e-3 * max(1.0, float(np.abs(tvm_args[-1].numpy()).max())):
                print(f"{key}: {name} disagrees with torch.einsum by {err}", file=sys.stderr)
                return 1
        tx, tb, tw = torch.from_numpy(x), torch.from_numpy(bias), torch.from_numpy(w)
        tcores = [torch.from_numpy(np.ascontiguousarray(c, np.float32)) for c in dec.cores]
        variants["torch.einsum TT"] = lambda c=tcores, b=tb, x=tx: _torch_chain_t(torch, c, b, x)
        flops["torch.einsum TT"] = flops["alt-tvm TT"]
        variants["dense F.linear"] = lambda x=tx, w=tw, b=tb: torch.nn.functional.linear(x, w, b)
        flops["dense F.linear"] = args.batch * (2 * m * n + m)
        with torch.inference_mode():
            times = bench(variants)
        base = times["alt-tvm TT"][0]
        print(f"\n{key} [{n}, {m}] -> n{ins} m{outs} rank {args.rank}, batch {args.batch}, "
              f"TT rel. error of random W {dec.rel_error:.3f}")
        print(f"{'variant':18s} {'median ms':>10s} {'min ms':>9s} {'GFLOP/s':>8s} {'time/alt-tvm':>12s}")
        for name, (med, mn) in times.items():
            print(f"{name:18s} {med:10.4f} {mn:9.4f} {flops[name] / med / 1e6:8.2f} {med / base:11.2f}x")
        results["layers"].append({"layer": key, "n": n, "m": m, "in_factors": ins, "out_factors": outs,
                                  "rank": args.rank, "batch": args.batch,
                                  "times_ms": {k: {"median": v[0], "min": v[1]} for k, v in times.items()},
                                  "flops": flops})

    # ------------------------------------------------------------------ Table 3 kernels
    ids = list(TABLE3) if args.kernels == "all" else [k for k in args.kernels.split(",") if k]
    if ids:
        print(f"\nTable 3 kernels (bt capped at {args.max_kernel_batch}); GFLOP/s at the median")
        print(f"{'id':4s} {'kind':7s} {'m':>4s} {'bt':>6s} {'n':>4s} {'alt-tvm':>8s} {'naive':>8s} {'torch':>8s} "
              f"{'vs naive':>9s} {'vs torch':>9s}")
    for cb in ids:
        if cb not in TABLE3:
            print(f"unknown kernel id {cb!r}; known: {', '.join(TABLE3)}", file=sys.stderr)
            return 2
        for kind, full in TABLE3[cb].items():
            s = EinsumShape(m=full.m, bt=min(full.bt, args.max_kernel_batch), n=full.n, r_out=full.r_out,
                            r_in=full.r_in)
            g = rng.standard_normal(s.core_shape).astype(np.float32)
            xx = rng.standard_normal(s.input_shape).astype(np.float32)
            variants = {}
            for name, opt in (("alt-tvm", True), ("naive", False)):
                plan = plan_einsum(s, target=target, threads=force) if opt else None
                kern = build_einsum(s, plan=plan, optimized=opt)
                targs = [tvm.runtime.tensor(xx, dev), tvm.runtime.tensor(kern.pack(g), dev),
                         tvm.runtime.tensor(np.zeros(s.output_shape, np.float32), dev)]
                variants[name] = tvm_runner(kern.compile(target), targs)
            tg, tx = torch.from_numpy(g), torch.from_numpy(xx)
            variants["torch"] = lambda tg=tg, tx=tx: torch.einsum("rnmk,bnk->mbr", tg, tx)
            with torch.inference_mode():
                times = bench(variants)
            gf = {k: s.flops / v[0] / 1e6 for k, v in times.items()}
            print(f"{cb:4s} {kind:7s} {s.m:4d} {s.bt:6d} {s.n:4d} {gf['alt-tvm']:8.2f} {gf['naive']:8.2f} "
                  f"{gf['torch']:8.2f} {gf['alt-tvm'] / gf['naive']:8.2f}x {gf['alt-tvm'] / gf['torch']:8.2f}x")
            results["kernels"].append({"id": cb, "kind": kind, "shape": [s.m, s.bt, s.n, s.r_out, s.r_in],
                                       "gflops": gf})
    if ids:
        sp = [k["gflops"]["alt-tvm"] / k["gflops"]["torch"] for k in results["kernels"]]
        sn = [k["gflops"]["alt-tvm"] / k["gflops"]["naive"] for k in results["kernels"]]
        print(f"geomean speedup: vs torch.einsum {np.exp(np.mean(np.log(sp))):.2f}x, "
              f"vs naive TE {np.exp(np.mean(np.log(sn))):.2f}x")

    # ------------------------------------------------------------------ thread thresholds
    if args.threshold_sweep:
        print("\nthread sweep: middle einsum m=16 n=8 r=k=8, bt varied (median ms, 1 vs 2 threads)")
        for bt in (2, 8, 32, 64, 128, 512, 2048):
            s = EinsumShape(m=16, bt=bt, n=8, r_out=8, r_in=8)
            g = rng.standard_normal(s.core_shape).astype(np.float32)
            xx = rng.standard_normal(s.input_shape).astype(np.float32)
            variants = {}
            for th in (1, 2):
                kern = build_einsum(s, plan=plan_einsum(s, target=target, threads=th))
                targs = [tvm.runtime.tensor(xx, dev), tvm.runtime.tensor(kern.pack(g), dev),
                         tvm.runtime.tensor(np.zeros(s.output_shape, np.float32), dev)]
                variants[th] = tvm_runner(kern.compile(target), targs)
            times = bench(variants)
            print(f"FLOPs {s.flops:10.3e}: 1 thread {times[1][0]:.4f} ms, 2 threads {times[2][0]:.4f} ms "
                  f"({times[1][0] / times[2][0]:.2f}x)")
            results["sweep"].append({"flops": s.flops, "t1_ms": times[1][0], "t2_ms": times[2][0]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def _torch_chain_t(torch, cores, bias, x):
    """Listing 1 in PyTorch: reshape, einsum per core (last core first), bias."""
    batch = x.shape[0]
    cur = x.reshape(-1)
    for core in reversed(cores):
        _, n, _, r_in = core.shape
        cur = torch.einsum("rnmk,bnk->mbr", core, cur.reshape(-1, n, r_in)).reshape(-1)
    return cur.reshape(-1, batch).T + bias


def _torch_chain(torch, cores, bias, x):
    with torch.inference_mode():
        tc = [torch.from_numpy(c.astype("float32")) for c in cores]
        return _torch_chain_t(torch, tc, torch.from_numpy(bias), torch.from_numpy(x)).numpy()


if __name__ == "__main__":
    sys.exit(main())
