"""Benchmark TT-factorised FC layers and the Table 3 einsum kernels (Anthimopoulos et al., §6.3-6.4).

For each layer: the TT chain built by alt-tvm (packed, vectorised, register-blocked), the
same chain in PyTorch (``torch.einsum`` + reshapes, Listing 1), the naive TE chain (no packing,
no schedule) and the uncompressed dense layer (``torch.nn.functional.linear``). For each
Table 3 kernel (``--kernels``): alt-tvm vs naive TE vs ``torch.einsum`` vs IREE (llvm-cpu,
``--iree-llvmcpu-target-cpu=host``, local-task driver), every output checked against NumPy
first. Variants are timed interleaved; medians and minima over ``--repeat`` rounds.

IREE runs in one worker process per thread count (``--iree-threads``; the local-task driver
reads its worker count, ``--task_topology_group_count``, once per process). The main process
waits while a worker times a round, so the rounds stay interleaved. A worker with more
threads than the CPUs this process may use widens its affinity to all CPUs, so "best of 1
and 2 threads" gives IREE the whole machine even under ``taskset -c 1``. Each einsum is given
to IREE in two forms and the faster counts: ``linalg.generic`` on the canonical layouts, and
``linalg.matmul`` on ``X[bt, n*k]`` and a core packed offline to ``[n*k, m*r]`` (as alt-tvm
packs its core offline) followed by a ``linalg.transpose`` to ``[m, bt, r]``. Without IREE
installed (``pip install iree-base-compiler iree-base-runtime``) its columns are skipped.

    python benchmarks/bench_tt.py --threads 2 --repeat 5
    taskset -c 1 python benchmarks/bench_tt.py --threads 1 --layers '' --kernels all --repeat 7
    python benchmarks/bench_tt.py --threshold-sweep
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Any


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
    p.add_argument("--no-naive", action="store_true", help="skip the naive TE kernels (slow on big shapes)")
    p.add_argument("--iree", choices=("auto", "off"), default="auto",
                   help="auto: compare with IREE when installed, else skip with a message")
    p.add_argument("--iree-threads", default="1,2", help="IREE local-task worker counts to try (best counts)")
    p.add_argument("--iree-forms", default="generic,matmul", help="IREE formulations to try (best counts)")
    p.add_argument("--threshold-sweep", action="store_true", help="measure 1 vs 2 threads vs einsum FLOPs")
    p.add_argument("--json", default="",
                   help="write the results here (default benchmarks/results/<machine kind>/tt.json)")
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

    from alt_tvm.bench import run_interleaved
    from alt_tvm.strategies.tt.decompose import tt_svd
    from alt_tvm.strategies.tt.einsum import TABLE3, EinsumShape, build_chain, build_einsum, plan_einsum
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

    def local_timer(fn):
        def timer(number: int, warm: int) -> float:
            # Untimed calls first: the previous variant's thread pool may still be spinning.
            time_round(fn, warm)
            return time_round(fn, number)
        timer.is_timer = True
        return timer

    def bench(variants: dict) -> dict:
        """``variants``: name -> callable (a plain function) or a timer ``(number, warm) -> ms``."""
        timers = {name: v if getattr(v, "is_timer", False) else local_timer(v) for name, v in variants.items()}
        numbers = {}
        for name, timer in timers.items():
            t = timer(1, 1)
            numbers[name] = max(1, min(2000, int(0.03 / max(t * 1e-3, 1e-7))))
        names = list(timers)
        runs = run_interleaved(len(names), rounds=args.repeat,
                               run=lambda i: timers[names[i]](numbers[names[i]], max(1, numbers[names[i]] // 4)))
        samples = dict(zip(names, runs))
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
    for cb in ids:
        if cb not in TABLE3:
            print(f"unknown kernel id {cb!r}; known: {', '.join(TABLE3)}", file=sys.stderr)
            return 2
    workers: dict[int, IreeWorker] = {}
    forms = [f for f in args.iree_forms.split(",") if f]
    for form in forms:
        if form not in IREE_FORMS:
            print(f"unknown IREE form {form!r}; known: {', '.join(IREE_FORMS)}", file=sys.stderr)
            return 2
    if ids and args.iree == "auto":
        missing = iree_missing()
        if missing:
            print(f"# IREE skipped: {missing}")
        else:
            for th in sorted({int(t) for t in args.iree_threads.split(",") if t}):
                workers[th] = IreeWorker(threads=th)
            from importlib.metadata import version

            print(f"# IREE {version('iree-base-compiler')} llvm-cpu (host CPU), local-task, "
                  f"threads {sorted(workers)}, forms {forms}")
    if ids:
        print(f"\nTable 3 kernels (bt capped at {args.max_kernel_batch}); GFLOP/s at the median")
        print(f"{'id':4s} {'kind':7s} {'m':>4s} {'bt':>6s} {'n':>4s} {'alt-tvm':>8s} {'naive':>8s} {'torch':>8s} "
              f"{'IREE':>8s} {'IREE cfg':>12s} {'vs naive':>9s} {'vs torch':>9s} {'vs IREE':>9s}")
    try:
        for cb in ids:
            for kind, full in TABLE3[cb].items():
                s = EinsumShape(m=full.m, bt=min(full.bt, args.max_kernel_batch), n=full.n, r_out=full.r_out,
                                r_in=full.r_in)
                g = rng.standard_normal(s.core_shape).astype(np.float32)
                xx = rng.standard_normal(s.input_shape).astype(np.float32)
                ref = np.einsum("rnmk,bnk->mbr", g.astype(np.float64), xx.astype(np.float64))
                tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
                variants = {}
                for name, opt in (("alt-tvm", True), ("naive", False)):
                    if name == "naive" and args.no_naive:
                        continue
                    plan = plan_einsum(s, target=target, threads=force) if opt else None
                    kern = build_einsum(s, plan=plan, optimized=opt)
                    targs = [tvm.runtime.tensor(xx, dev), tvm.runtime.tensor(kern.pack(g), dev),
                             tvm.runtime.tensor(np.zeros(s.output_shape, np.float32), dev)]
                    fn = tvm_runner(kern.compile(target), targs)
                    fn()
                    _check(f"{cb} {kind} {name}", targs[-1].numpy(), ref, tol)
                    variants[name] = local_timer(fn)
                tg, tx = torch.from_numpy(g), torch.from_numpy(xx)
                with torch.inference_mode():
                    _check(f"{cb} {kind} torch", torch.einsum("rnmk,bnk->mbr", tg, tx).numpy(), ref, tol)
                variants["torch"] = local_timer(lambda tg=tg, tx=tx: torch.einsum("rnmk,bnk->mbr", tg, tx))
                for worker in workers.values():
                    worker.reset()
                for form in forms if workers else ():
                    try:
                        vmfb = iree_compile(shape=s, form=form)
                    except Exception as err:  # a compiler failure drops this form, not the run
                        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                        print(f"# IREE {form} failed to compile {cb} {kind}: {first}", file=sys.stderr)
                        continue
                    packed = iree_pack(g, shape=s, form=form)
                    for th, worker in workers.items():
                        key = f"{cb}-{kind}-{form}"
                        _check(f"{cb} {kind} IREE {form} {th}t", worker.load(key=key, vmfb=vmfb, x=xx, g=packed),
                               ref, tol)
                        variants[f"iree-{form}-{th}t"] = worker.timer(key=key)
                with torch.inference_mode():
                    times = bench(variants)
                gf = {k: s.flops / v[0] / 1e6 for k, v in times.items()}
                iree = {k: v for k, v in gf.items() if k.startswith("iree-")}
                best = max(iree, key=iree.get) if iree else None
                row = {"id": cb, "kind": kind, "shape": [s.m, s.bt, s.n, s.r_out, s.r_in], "flops": s.flops,
                       "gflops": gf, "times_ms": {k: {"median": v[0], "min": v[1]} for k, v in times.items()}}
                if best:
                    gf["iree"] = iree[best]
                    row["iree_best"] = best
                ratio = {k: gf["alt-tvm"] / gf[k] for k in ("naive", "torch", "iree") if k in gf}
                row["speedup"] = ratio
                results["kernels"].append(row)
                cols = " ".join(_fmt(gf.get(k), 8) for k in ("alt-tvm", "naive", "torch", "iree"))
                rats = " ".join(_fmt(ratio.get(k), 8, "x") for k in ("naive", "torch", "iree"))
                cfg = (best or "-").removeprefix("iree-")
                print(f"{cb:4s} {kind:7s} {s.m:4d} {s.bt:6d} {s.n:4d} {cols} {cfg:>12s} {rats}", flush=True)
    finally:
        for worker in workers.values():
            worker.close()
    if ids:
        geo = {}
        for key in ("torch", "iree", "naive"):
            sp = [k["speedup"][key] for k in results["kernels"] if key in k["speedup"]]
            if sp:
                geo[key] = float(np.exp(np.mean(np.log(sp))))
        results["geomean_speedup"] = geo
        print("geomean speedup of alt-tvm: " + ", ".join(f"vs {k} {v:.2f}x" for k, v in geo.items()))

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
    from alt_tvm.bench.results import write_results

    print(f"results: {write_results('tt', results, path=args.json or None)}")
    return 0


def _fmt(value: float | None, width: int, suffix: str = "") -> str:
    return f"{value:{width}.2f}{suffix}" if value is not None else f"{'-':>{width + len(suffix)}s}"


def _check(what: str, got: Any, ref: Any, tol: float) -> None:
    import numpy as np

    err = float(np.abs(np.asarray(got, np.float64) - ref).max())
    if not err <= tol:
        raise SystemExit(f"{what}: max abs error {err:.3g} vs NumPy einsum exceeds {tol:.3g}")


# --------------------------------------------------------------------------- IREE

#: The ways an einsum is handed to IREE (see the module docstring).
IREE_FORMS = ("generic", "matmul")


def iree_missing() -> str:
    """Empty if IREE's compiler and runtime import, else why not (for the skip message)."""
    try:
        import iree.compiler  # noqa: F401
        import iree.runtime  # noqa: F401
    except ImportError as err:
        return f"{err} (pip install iree-base-compiler iree-base-runtime)"
    return ""


def iree_mlir(*, shape: Any, form: str) -> str:
    """MLIR (``func`` + ``linalg``) of one einsum ``"rnmk,bnk->mbr"`` for IREE.

    Parameters
    ----------
    shape : EinsumShape
    form : {"generic", "matmul"}
        ``"generic"``: ``main(X[bt, n, k], G[r, n, m, k])`` as one ``linalg.generic``;
        ``"matmul"``: ``main(X[bt, n, k], Gp[n*k, m*r])`` (core packed by :func:`iree_pack`) as
        ``linalg.matmul`` and a ``linalg.transpose`` of ``[bt, m, r]`` to ``[m, bt, r]``.

    Returns
    -------
    str
    """
    if form not in IREE_FORMS:
        raise ValueError(f"form must be one of {IREE_FORMS}, got {form!r}")
    m, bt, n, r, k = shape.m, shape.bt, shape.n, shape.r_out, shape.r_in
    ty_x, ty_y = f"tensor<{bt}x{n}x{k}xf32>", f"tensor<{m}x{bt}x{r}xf32>"
    if form == "generic":
        ty_g = f"tensor<{r}x{n}x{m}x{k}xf32>"
        return f"""
#map_g = affine_map<(m, b, r, n, k) -> (r, n, m, k)>
#map_x = affine_map<(m, b, r, n, k) -> (b, n, k)>
#map_y = affine_map<(m, b, r, n, k) -> (m, b, r)>
func.func @main(%x: {ty_x}, %g: {ty_g}) -> {ty_y} {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : {ty_y}
  %init = linalg.fill ins(%zero : f32) outs(%empty : {ty_y}) -> {ty_y}
  %y = linalg.generic {{indexing_maps = [#map_g, #map_x, #map_y],
                       iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}}
      ins(%g, %x : {ty_g}, {ty_x}) outs(%init : {ty_y}) {{
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }} -> {ty_y}
  return %y : {ty_y}
}}
"""
    j, mr = n * k, m * r
    ty_xf, ty_g, ty_p, ty_p3 = (f"tensor<{bt}x{j}xf32>", f"tensor<{j}x{mr}xf32>", f"tensor<{bt}x{mr}xf32>",
                                f"tensor<{bt}x{m}x{r}xf32>")
    return f"""
func.func @main(%x: {ty_x}, %g: {ty_g}) -> {ty_y} {{
  %zero = arith.constant 0.0 : f32
  %xf = tensor.collapse_shape %x [[0], [1, 2]] : {ty_x} into {ty_xf}
  %empty = tensor.empty() : {ty_p}
  %init = linalg.fill ins(%zero : f32) outs(%empty : {ty_p}) -> {ty_p}
  %p = linalg.matmul ins(%xf, %g : {ty_xf}, {ty_g}) outs(%init : {ty_p}) -> {ty_p}
  %p3 = tensor.expand_shape %p [[0], [1, 2]] output_shape [{bt}, {m}, {r}] : {ty_p} into {ty_p3}
  %empty_y = tensor.empty() : {ty_y}
  %y = linalg.transpose ins(%p3 : {ty_p3}) outs(%empty_y : {ty_y}) permutation = [1, 0, 2]
  return %y : {ty_y}
}}
"""


def iree_pack(core: Any, *, shape: Any, form: str) -> Any:
    """The core as :func:`iree_mlir`'s ``form`` takes it (``[n*k, m*r]`` for ``"matmul"``)."""
    import numpy as np

    core = np.asarray(core, np.float32)
    if core.shape != shape.core_shape:
        raise ValueError(f"core has shape {core.shape}, the einsum expects {shape.core_shape}")
    if form == "generic":
        return np.ascontiguousarray(core)
    if form == "matmul":
        # (r, n, m, k) -> (n, k, m, r)
        return np.ascontiguousarray(core.transpose(1, 3, 2, 0).reshape(shape.n * shape.r_in, shape.m * shape.r_out))
    raise ValueError(f"form must be one of {IREE_FORMS}, got {form!r}")


def iree_compile(*, shape: Any, form: str) -> bytes:
    """VM flatbuffer of :func:`iree_mlir` for llvm-cpu on this CPU (``--iree-llvmcpu-target-cpu=host``)."""
    import iree.compiler

    return bytes(iree.compiler.compile_str(iree_mlir(shape=shape, form=form), target_backends=["llvm-cpu"],
                                           extra_args=["--iree-llvmcpu-target-cpu=host"]))


def _iree_serve(conn: Any, threads: int) -> None:
    """Worker loop: one local-task device with ``threads`` workers; see :class:`IreeWorker`."""
    if threads > len(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, range(os.cpu_count() or threads))
    import iree.runtime as rt

    # Read when the local-task driver is created, i.e. once per process.
    rt.flags.parse_flags(f"--task_topology_group_count={threads}")
    config = rt.Config(driver_name="local-task")
    loaded: dict = {}
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "quit":
                conn.send(None)
                return
            if msg[0] == "reset":
                loaded.clear()
                conn.send(None)
            elif msg[0] == "load":
                _, key, vmfb, x, g = msg
                ctx = rt.SystemContext(config=config)
                ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
                fn = ctx.modules.module["main"]
                args = (rt.asdevicearray(config.device, x), rt.asdevicearray(config.device, g))
                loaded[key] = (ctx, fn, args)
                conn.send(fn(*args).to_host())
            elif msg[0] == "time":
                _, key, number, warm = msg
                _, fn, args = loaded[key]
                for _ in range(warm):
                    fn(*args)
                t0 = time.perf_counter()
                for _ in range(number):
                    fn(*args)
                conn.send((time.perf_counter() - t0) / number * 1e3)
            else:
                raise ValueError(f"unknown request {msg[0]!r}")
        except Exception as err:  # reported to the parent, which raises
            conn.send(err)


class IreeWorker:
    """An IREE runtime in a child process with a fixed local-task worker count.

    Parameters
    ----------
    threads : int
        ``--task_topology_group_count``.
    """

    def __init__(self, *, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        self.threads = threads
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_iree_serve, args=(child, threads), daemon=True)
        self._proc.start()

    def _ask(self, *msg: Any) -> Any:
        self._conn.send(msg)
        out = self._conn.recv()
        if isinstance(out, Exception):
            raise RuntimeError(f"IREE worker ({self.threads} threads): {out}") from out
        return out

    def load(self, *, key: str, vmfb: bytes, x: Any, g: Any) -> Any:
        """Load a compiled einsum (replacing the previous one), run it once, return its output."""
        return self._ask("load", key, vmfb, x, g)

    def reset(self) -> None:
        """Drop every loaded kernel."""
        self._ask("reset")

    def timer(self, *, key: str) -> Any:
        """A ``(number, warm) -> ms per call`` timer of the loaded kernel ``key``."""
        def timer(number: int, warm: int) -> float:
            return self._ask("time", key, number, warm)
        timer.is_timer = True
        return timer

    def close(self) -> None:
        """Stop the worker."""
        if self._proc.is_alive():
            try:
                self._ask("quit")
            except (OSError, EOFError):
                pass
            self._proc.join(timeout=10)


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
