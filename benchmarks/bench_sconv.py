"""Benchmark SConv against im2col + BLAS GEMM on every convolution of five CNNs (Ferrari et al., §7).

For each convolution (batch 1 unless a config says otherwise), in one process and run:

* **SConv** — ``alt_tvm.strategies.sconv.kernel`` (CSA-chosen tiling, VBP on), and with VBP off;
* **Base** — the paper's baseline: explicit im2col in NumPy (into a preallocated padded
  buffer and column matrix) followed by one sgemm through ``numpy.matmul`` (NumPy's
  bundled OpenBLAS; see the printed configuration);
* **GEMM** — for pointwise (1x1, stride 1, no padding) convolutions, the plain sgemm
  ``W[K, C] @ X[C, H*W]`` with no im2col;
* **PyTorch** — ``torch.nn.functional.conv2d`` (oneDNN), as a further reference.

Printed: per-convolution times and speedups, the share of convolutions where SConv beats
Base, geometric-mean speedups per model and overall (and over GEMM on pointwise ones), and
the time share spent packing: im2col in Base (GEMM's own internal packing cannot be
separated), phase image + tile packing in SConv (timed separately, an over-estimate).

Usage::

    python benchmarks/bench_sconv.py --threads 1 [--models resnet18,vgg16] [--limit 5]
    python benchmarks/bench_sconv.py --configs my_layers.json --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

MODELS = ("resnet18", "resnet50", "vgg16", "squeezenet1_1", "googlenet")


@dataclass(frozen=True)
class Conv:
    """One convolution layer: batch, channels, input size, filters, window, padding, stride."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    pad_h: int = 0
    pad_w: int = 0
    stride_h: int = 1
    stride_w: int = 1
    name: str = ""


def _conv(name: str, c: int, hw: int, k: int, r: int, *, stride: int = 1, pad: int | None = None) -> Conv:
    pad = r // 2 if pad is None else pad
    return Conv(1, c, hw, hw, k, r, r, pad, pad, stride, stride, name)


def _out(hw: int, r: int, stride: int, pad: int) -> int:
    return (hw + 2 * pad - r) // stride + 1


# ------------------------------------------------------------------ layer tables (224x224)
def resnet18() -> list[Conv]:
    layers = [_conv("conv1", 3, 224, 64, 7, stride=2)]
    hw, c = 56, 64
    for stage, width in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            layers.append(_conv(f"layer{stage}.{block}.conv1", c, hw, width, 3, stride=stride))
            if stride == 2 or c != width:
                layers.append(_conv(f"layer{stage}.{block}.downsample", c, hw, width, 1, stride=stride))
            hw = _out(hw, 3, stride, 1)
            layers.append(_conv(f"layer{stage}.{block}.conv2", width, hw, width, 3))
            c = width
    return layers


def resnet50() -> list[Conv]:
    layers = [_conv("conv1", 3, 224, 64, 7, stride=2)]
    hw, c = 56, 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for block in range(blocks):
            stride = 2 if stage > 1 and block == 0 else 1
            layers.append(_conv(f"layer{stage}.{block}.conv1", c, hw, width, 1))
            layers.append(_conv(f"layer{stage}.{block}.conv2", width, hw, width, 3, stride=stride))
            out_hw = _out(hw, 3, stride, 1)
            layers.append(_conv(f"layer{stage}.{block}.conv3", width, out_hw, 4 * width, 1))
            if block == 0:
                layers.append(_conv(f"layer{stage}.{block}.downsample", c, hw, 4 * width, 1, stride=stride))
            hw, c = out_hw, 4 * width
    return layers


def vgg16() -> list[Conv]:
    cfg = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
    layers, c, hw = [], 3, 224
    for item in cfg:
        if item == "M":
            hw //= 2
        else:
            layers.append(_conv(f"conv{len(layers) + 1}", c, hw, item, 3))
            c = item
    return layers


def squeezenet1_1() -> list[Conv]:
    layers = [_conv("conv1", 3, 224, 64, 3, stride=2, pad=0)]  # -> 111, max-pool (ceil) -> 55
    fires = ((64, 16, 64), (128, 16, 64), "M", (128, 32, 128), (256, 32, 128), "M",
             (256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256))
    hw, index = 55, 2
    for fire in fires:
        if fire == "M":
            hw = math.ceil((hw - 3) / 2) + 1
            continue
        c, squeeze, expand = fire
        layers += [_conv(f"fire{index}.squeeze", c, hw, squeeze, 1),
                   _conv(f"fire{index}.expand1x1", squeeze, hw, expand, 1),
                   _conv(f"fire{index}.expand3x3", squeeze, hw, expand, 3)]
        index += 1
    layers.append(_conv("classifier", 512, hw, 1000, 1))
    return layers


def googlenet() -> list[Conv]:
    """GoogLeNet as in Szegedy et al. (5x5 branch convolutions, as in the ONNX model zoo)."""
    layers = [_conv("conv1", 3, 224, 64, 7, stride=2), _conv("conv2", 64, 56, 64, 1), _conv("conv3", 64, 56, 192, 3)]
    blocks = (("3a", 192, 28, (64, 96, 128, 16, 32, 32)), ("3b", 256, 28, (128, 128, 192, 32, 96, 64)),
              ("4a", 480, 14, (192, 96, 208, 16, 48, 64)), ("4b", 512, 14, (160, 112, 224, 24, 64, 64)),
              ("4c", 512, 14, (128, 128, 256, 24, 64, 64)), ("4d", 512, 14, (112, 144, 288, 32, 64, 64)),
              ("4e", 528, 14, (256, 160, 320, 32, 128, 128)), ("5a", 832, 7, (256, 160, 320, 32, 128, 128)),
              ("5b", 832, 7, (384, 192, 384, 48, 128, 128)))
    for name, c, hw, (b1, b2r, b2, b3r, b3, b4) in blocks:
        layers += [_conv(f"inception{name}.b1", c, hw, b1, 1), _conv(f"inception{name}.b2a", c, hw, b2r, 1),
                   _conv(f"inception{name}.b2b", b2r, hw, b2, 3), _conv(f"inception{name}.b3a", c, hw, b3r, 1),
                   _conv(f"inception{name}.b3b", b3r, hw, b3, 5), _conv(f"inception{name}.b4", c, hw, b4, 1)]
    return layers


TABLES = {"resnet18": resnet18, "resnet50": resnet50, "vgg16": vgg16, "squeezenet1_1": squeezenet1_1,
          "googlenet": googlenet}


def load_configs(path: str) -> list[Conv]:
    """Convolutions from a JSON list of {n, c, h, w, k, r, s, pad_h, pad_w, stride_h, stride_w}."""
    with open(path) as handle:
        items = json.load(handle)
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of convolution objects, got {type(items).__name__}")
    keys = ("n", "c", "h", "w", "k", "r", "s", "pad_h", "pad_w", "stride_h", "stride_w")
    convs = []
    for i, item in enumerate(items):
        missing = [k for k in keys if k not in item]
        if missing:
            raise ValueError(f"{path}: configuration {i} lacks {missing}")
        bad = [k for k in keys if not isinstance(item[k], int) or isinstance(item[k], bool)]
        if bad:
            raise ValueError(f"{path}: configuration {i} has non-integer {bad}")
        convs.append(Conv(*(item[k] for k in keys), name=item.get("name", f"config{i}")))
    return convs


# ----------------------------------------------------------------------------- measuring
def _interleaved_ms(fns: dict, *, repeat: int, min_time: float = 0.03) -> dict[str, tuple[float, float]]:
    """(min, median) per-call milliseconds of each function, timed in interleaved rounds.

    The machine is shared, so every round times each function once, in a balanced order
    (:func:`alt_tvm.bench.run_interleaved`), and the minimum over rounds is what the
    speedups use (the median is kept in the JSON).
    """
    import statistics

    from alt_tvm.bench import run_interleaved

    numbers = {}
    for name, fn in fns.items():
        fn()  # warm-up
        start = time.perf_counter()
        fn()
        numbers[name] = max(1, min(50, int(min_time / max(time.perf_counter() - start, 1e-6))))
    names = list(fns)

    def turn(i: int) -> float:
        fn, number = fns[names[i]], numbers[names[i]]
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number * 1e3

    samples = dict(zip(names, run_interleaved(len(names), rounds=repeat, run=turn)))
    return {name: (min(v), statistics.median(v)) for name, v in samples.items()}


def measure(conv: Conv, *, threads: int, repeat: int) -> dict:
    import numpy as np
    import torch
    import tvm

    from alt_tvm.strategies.sconv.csa import ConvShape
    from alt_tvm.strategies.sconv.kernel import SConvOptions, build_sconv, build_sconv_packing

    shape = ConvShape(conv.n, conv.c, conv.h, conv.w, conv.k, conv.r, conv.s, conv.stride_h, conv.stride_w,
                      conv.pad_h, conv.pad_w, conv.pad_h, conv.pad_w)
    oh, ow = shape.out_h, shape.out_w
    rng = np.random.default_rng(0)
    x = rng.standard_normal((conv.n, conv.c, conv.h, conv.w), dtype=np.float32)
    wt = rng.standard_normal((conv.k, conv.c, conv.r, conv.s), dtype=np.float32)
    dev = tvm.cpu()
    result: dict = {"config": asdict(conv), "gflop": shape.flops / 1e9, "pointwise": shape.pointwise}

    # SConv, with and without Vector-Based Packing.
    tx = tvm.runtime.tensor(x, dev)
    ty = tvm.runtime.tensor(np.empty((conv.n, conv.k, oh, ow), np.float32), dev)
    compile_start = time.perf_counter()
    kernels = {vbp: build_sconv(shape, wt, options=SConvOptions(vbp=vbp, threads=threads)) for vbp in (True, False)}
    result["compile_s"] = (time.perf_counter() - compile_start) / 2
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), stride=(conv.stride_h, conv.stride_w),
                                     padding=(conv.pad_h, conv.pad_w)).numpy()
    # Each TVM function is looked up once: `module["main"]` costs 10-20 us per lookup in TVM
    # 0.27's FFI, a third of a small convolution's time; a compiled model resolves it once too.
    fns = {}
    for vbp, kernel in kernels.items():
        kernel.main(tx, kernel.packed_weight, ty)
        err = float(np.abs(ty.numpy() - ref).max() / max(1e-6, np.abs(ref).max()))
        if err > 1e-4:
            raise RuntimeError(f"SConv (vbp={vbp}) differs from PyTorch on {conv}: relative error {err:.2e}")
        fns["sconv" if vbp else "sconv_novbp"] = lambda f=kernel.main, w=kernel.packed_weight: f(tx, w, ty)
    plan = kernels[True].plan
    result["plan"] = plan.summary()

    # SConv packing (phase image + tiles x repacks), estimated from packing-only functions.
    repacks = {}
    for vbp in (True, False):
        funcs = build_sconv_packing(shape, options=SConvOptions(vbp=vbp, threads=threads))
        repacks[vbp] = funcs.repacks
        tk = tvm.runtime.tensor(np.empty(funcs.pack_shape, np.float32), dev)
        suffix = "" if vbp else "_novbp"
        if funcs.phase is not None:  # (pointwise: tiles are packed from the input, no phase image)
            tp = tvm.runtime.tensor(np.empty(funcs.phase_shape, np.float32), dev)
            fns["phase" + suffix] = lambda f=funcs.phase["main"], o=tp: f(tx, o)
        fns["pack" + suffix] = lambda f=funcs.pack["main"], o=tk: f(tx, o)

    # Base: im2col (Caffe-style, padding included) + one OpenBLAS sgemm per image.
    xp = np.zeros((conv.c, conv.h + 2 * conv.pad_h, conv.w + 2 * conv.pad_w), np.float32)
    cols = np.empty((conv.c, conv.r, conv.s, oh, ow), np.float32)
    wmat = wt.reshape(conv.k, -1)
    out = np.empty((conv.k, oh * ow), np.float32)
    st = xp.strides
    view = np.lib.stride_tricks.as_strided(
        xp, shape=(conv.c, conv.r, conv.s, oh, ow),
        strides=(st[0], st[1], st[2], st[1] * conv.stride_h, st[2] * conv.stride_w), writeable=False)

    def im2col(i: int) -> None:
        xp[:, conv.pad_h:conv.pad_h + conv.h, conv.pad_w:conv.pad_w + conv.w] = x[i]
        np.copyto(cols, view)

    def base() -> None:
        for i in range(conv.n):
            im2col(i)
            np.matmul(wmat, cols.reshape(-1, oh * ow), out=out)

    base()
    if not np.allclose(out.reshape(conv.k, oh, ow), ref[-1], rtol=1e-3, atol=1e-3 * np.abs(ref).max()):
        raise RuntimeError(f"Base (im2col + GEMM) differs from PyTorch on {conv}")
    fns["base"] = base
    fns["base_im2col"] = lambda: [im2col(i) for i in range(conv.n)]
    if shape.pointwise:
        flat = [x[i].reshape(conv.c, -1) for i in range(conv.n)]
        fns["gemm"] = lambda: [np.matmul(wmat, f, out=out) for f in flat]
    xt, wt_t = torch.from_numpy(x), torch.from_numpy(wt)

    def torch_conv() -> None:
        with torch.no_grad():
            torch.nn.functional.conv2d(xt, wt_t, stride=(conv.stride_h, conv.stride_w),
                                       padding=(conv.pad_h, conv.pad_w))

    fns["torch"] = torch_conv
    times = _interleaved_ms(fns, repeat=repeat)
    for name, (best, median) in times.items():
        result[f"{name}_ms"] = best
        result[f"{name}_median_ms"] = median
    for vbp, suffix in ((True, ""), (False, "_novbp")):
        phase_ms, all_ms = result.get(f"phase{suffix}_ms", 0.0), result[f"pack{suffix}_ms"]
        result[f"sconv_pack{suffix}_ms"] = phase_ms + max(0.0, all_ms - phase_ms) * repacks[vbp]
    result["speedup_vs_base"] = result["base_ms"] / result["sconv_ms"]
    if shape.pointwise:
        result["speedup_vs_gemm"] = result["gemm_ms"] / result["sconv_ms"]
    result["speedup_vs_torch"] = result["torch_ms"] / result["sconv_ms"]
    return result


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summarize(groups: dict[str, list[dict]]) -> list[str]:
    lines = ["", f"{'model':<14} {'convs':>5} {'faster':>7} {'geo/Base':>9} {'sum/Base':>9} {'geo/GEMM pw':>12} "
             f"{'geo/torch':>10} {'pack Base':>10} {'pack SConv':>11} {'no-VBP':>8} {'pack no-VBP':>12}"]
    everything = [r for rows in groups.values() for r in rows]
    for name, rows in [*groups.items(), ("all", everything)]:
        if not rows:
            continue
        faster = sum(r["speedup_vs_base"] > 1 for r in rows) / len(rows)
        pw = [r["speedup_vs_gemm"] for r in rows if "speedup_vs_gemm" in r]
        base_total = sum(r["base_ms"] for r in rows)
        sconv_total = sum(r["sconv_ms"] for r in rows)
        lines.append(
            f"{name:<14} {len(rows):>5} {faster:>7.0%} {_geomean(r['speedup_vs_base'] for r in rows):>8.2f}x "
            f"{base_total / sconv_total:>8.2f}x "
            f"{(f'{_geomean(pw):.2f}x ({len(pw)})' if pw else '-'):>12} "
            f"{_geomean(r['speedup_vs_torch'] for r in rows):>9.2f}x "
            f"{sum(r['base_im2col_ms'] for r in rows) / base_total:>10.0%} "
            f"{min(1.0, sum(r['sconv_pack_ms'] for r in rows) / sconv_total):>11.0%} "
            f"{sum(r['sconv_novbp_ms'] for r in rows) / sconv_total:>7.2f}x "
            f"{sum(r['sconv_pack_novbp_ms'] for r in rows) / sum(r['sconv_pack_ms'] for r in rows):>11.2f}x")
    lines.append("faster: share of convolutions where SConv beats Base; geo: geometric mean of per-conv speedups; "
                 "sum: total-time ratio; pw: pointwise convs vs plain GEMM; pack: packing share of each "
                 "method's total (Base: im2col only; SConv: estimate); no-VBP: SConv time without VBP / with; "
                 "pack no-VBP: SConv packing time without VBP / with.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--configs", help="JSON list of convolution configurations (replaces --models)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many convolutions per model (0: all)")
    parser.add_argument("--repeat", type=int, default=5, help="timed batches per measurement (median)")
    parser.add_argument("--json", help="write the rows here (default benchmarks/results/<machine kind>/sconv.json)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.limit < 0:
        parser.error("--limit must be >= 0")
    # Thread pools read these when the libraries load, so set them before importing.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    if args.threads > 1:
        # Three thread pools take turns on the same cores. Idle workers spin-wait by default
        # (OpenBLAS ~2^28 cycles, libgomp, TVM's pool), stealing the cores from whichever
        # library is timed next: multi-threaded times came out 5-100x too slow. Make them
        # sleep as soon as they are idle.
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    import numpy as np
    import torch

    from alt_tvm.target import host

    torch.set_num_threads(args.threads)
    if args.configs:
        groups = {"configs": load_configs(args.configs)}
    else:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in names if m not in TABLES]
        if unknown:
            parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
        groups = {m: TABLES[m]() for m in names}
    if args.limit:
        groups = {m: convs[:args.limit] for m, convs in groups.items()}
    blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    from alt_tvm.bench import measure_peak_gflops, write_results

    peaks = {t: measure_peak_gflops(threads=t) for t in sorted({1, args.threads})}
    print(f"target: {host().description}; threads: {args.threads}; FP32 FMA peak measured now: "
          + ", ".join(f"{t} thread(s) {peak:.0f} GFLOP/s" for t, peak in peaks.items()))
    print(f"Base BLAS: NumPy {np.__version__} with {blas.get('name', '?')} {blas.get('version', '')}; "
          f"PyTorch {torch.__version__} conv2d (oneDNN)")
    cache: dict = {}
    results: dict[str, list[dict]] = {}
    header = (f"{'model':<14} {'layer':<26} {'C>K HxW RxS/s':<24} {'SConv ms':>9} {'Base ms':>9} {'GEMM ms':>8} "
              f"{'torch ms':>9} {'vs Base':>8} {'vs GEMM':>8} {'schedule':<8}")
    print(header)
    for model, convs in groups.items():
        results[model] = []
        for conv in convs:
            key = asdict(conv) | {"name": ""}
            key = tuple(sorted(key.items()))
            if key not in cache:  # identical layers are measured once
                cache[key] = measure(conv, threads=args.threads, repeat=args.repeat)
            row = dict(cache[key], config=asdict(conv), model=model)
            results[model].append(row)
            gemm = f"{row['gemm_ms']:.3f}" if "gemm_ms" in row else "-"
            vs_gemm = f"{row['speedup_vs_gemm']:.2f}x" if "speedup_vs_gemm" in row else "-"
            desc = f"{conv.c}>{conv.k} {conv.h}x{conv.w} {conv.r}x{conv.s}/{conv.stride_h}"
            print(f"{model:<14} {conv.name:<26} {desc:<24} {row['sconv_ms']:>9.3f} {row['base_ms']:>9.3f} "
                  f"{gemm:>8} {row['torch_ms']:>9.3f} {row['speedup_vs_base']:>7.2f}x {vs_gemm:>8} "
                  f"{row['plan'][:2]:<8}", flush=True)
    for line in summarize(results):
        print(line)
    written = write_results("sconv", {"rows": [r for rows in results.values() for r in rows]}, path=args.json,
                            peak_gflops=peaks[args.threads], threads=args.threads)
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
