"""Serving a model: throughput of concurrent callers against ONNX Runtime, and the cold start.

    python benchmarks/bench_serving.py --models resnet18 mobilenet_v2 [--concurrency 1 2 4]
                                       [--seconds 3] [--rounds 3] [--json FILE]
    python benchmarks/bench_serving.py --models --batch-models tv_resnet50 tv_mobilenet_v2 --batches 8 32

**Throughput.** ``N`` Python threads call one model at batch 1 for ``--seconds``, each call on
``cores // N`` threads (at least one): alt-tvm's built model with ``model.set_threads``, ONNX
Runtime's one session with that many intra-op threads, its ``run`` called by the ``N`` threads
at once (its pool does not spin). The two runtimes take turns, ``--rounds`` times; the table
gives the median calls per second and the ratio. Every output is checked against ONNX
Runtime's before any timing.

**Cold start.** A fresh process per reading, each step timed: ``import numpy``, ``import
alt_tvm``, ``alt_tvm.load`` (the metadata and checksums, TVM's runtime library, the model's
library) and the first call; the median of ``--rounds`` processes, and whether the process
loaded TVM's compiler, PyTorch or any build code (it must not).

The results go to ``benchmarks/results/<machine kind>/serving.json`` unless ``--json`` says
where (:mod:`alt_tvm.bench.results`).

**Batches.** Public models (:mod:`alt_tvm.models.public` names) exported at each of
``--batches``, built by alt-tvm (untuned: the defaults were fitted at batch 1) and timed in
interleaved rounds against the CPU peers on all cores (:mod:`alt_tvm.bench.peers`: ONNX
Runtime, and OpenVINO with FP32, the latency hint, not pinned, skipped saying why where it is
not installed), every output checked against ONNX Runtime's first; images per second, the
faster peer per model and batch (its time / alt-tvm's, above 1: alt-tvm faster), and their
geometric mean with the rows where alt-tvm is behind.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

_COLD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import alt_tvm
t2 = time.perf_counter()
model = alt_tvm.load(sys.argv[1])
t3 = time.perf_counter()
x = np.load(sys.argv[2])
model(x)
t4 = time.perf_counter()
heavy = sorted(m for m in sys.modules if m == "tvm" or m.startswith(("tvm.", "torch", "alt_tvm.graph",
                                                                    "alt_tvm.strategies", "alt_tvm.tuning")))
compiler = any("libtvm_compiler" in line for line in open("/proc/self/maps"))
print(json.dumps({"import numpy": t1 - t0, "import alt_tvm": t2 - t1, "alt_tvm.load": t3 - t2,
                  "first call": t4 - t3, "total": t4 - t0, "heavy_modules": heavy, "compiler_loaded": compiler}))
"""


def cold_start(artifact: Path, x: np.ndarray, *, readings: int) -> dict:
    """Median seconds per step of a fresh process that loads ``artifact`` and calls it once."""
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "x.npy", x)
        runs = []
        for _ in range(readings):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", _COLD, str(artifact), str(Path(tmp) / "x.npy")],
                                  capture_output=True, text=True, check=True, timeout=300)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["process"] = time.perf_counter() - started  # interpreter start-up included
            runs.append(run)
    steps = [k for k, v in runs[0].items() if isinstance(v, float)]
    out = {step: statistics.median(r[step] for r in runs) for step in steps}
    out["heavy_modules"] = sorted({m for r in runs for m in r["heavy_modules"]})
    out["compiler_loaded"] = any(r["compiler_loaded"] for r in runs)
    return out


def throughput(call, x: np.ndarray, *, callers: int, seconds: float) -> float:
    """Calls per second of ``callers`` threads calling ``call(x)`` for ``seconds``."""
    counts = [0] * callers
    stop = threading.Event()
    start = threading.Barrier(callers + 1)

    def work(t: int) -> None:
        start.wait()
        while not stop.is_set():
            call(x)
            counts[t] += 1

    threads = [threading.Thread(target=work, args=(t,)) for t in range(callers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def batch_table(names: list[str], batches: list[int], *, cores: int, rounds: int) -> list[dict]:
    """Images per second of alt-tvm, ONNX Runtime and OpenVINO at each batch (module doc)."""
    import torch

    import alt_tvm
    from alt_tvm.bench import cpu_peers, faster_peer, time_interleaved
    from alt_tvm.deploy.model import aligned
    from alt_tvm.models.public import instantiate, public_models

    rows = []
    with tempfile.TemporaryDirectory(prefix="alt_tvm_batch_") as tmp:
        for name in names:
            model = public_models()[name]
            module = instantiate(model)
            for batch in batches:
                generator = torch.Generator().manual_seed(batch)
                x = torch.randn(batch, *model.input_shape[1:], generator=generator)
                path = Path(tmp) / f"{name}_b{batch}.onnx"
                torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17)
                started = time.perf_counter()
                built = alt_tvm.build(str(path))
                build_s = time.perf_counter() - started
                x = aligned(x.numpy())
                peers, skipped = cpu_peers(path, threads=cores)
                for peer, why in skipped.items():
                    print(f"{peer} skipped: {why}", flush=True)
                runners = {"alt-tvm": built, **peers}
                want = runners["onnxruntime"](x)[0]
                errors = {label: float(np.abs(run(x)[0] - want).max() / max(np.abs(want).max(), 1e-30))
                          for label, run in runners.items() if label != "onnxruntime"}
                if max(errors.values()) > 1e-3:
                    raise SystemExit(f"{name} at batch {batch}: outputs differ from ONNX Runtime's: {errors}")
                timed = time_interleaved({label: (run, (x,)) for label, run in runners.items()}, rounds=rounds,
                                         repeat=3, warmup=1)
                row = {"model": name, "batch": batch, "build_s": build_s, "max_rel_error": errors,
                       **{f"{label} images/s": batch / ms * 1e3 for label, (ms, _) in timed.items()}}
                times = {label: ms for label, (ms, _) in timed.items()}
                row.update(faster_peer(times_ms=times, alt_ms=times["alt-tvm"]).to_json())
                rows.append(row)
                print(f"{name} batch {batch}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()
                                                            if k.endswith("images/s"))
                      + f" ({row['ratio_vs_faster_peer']:.2f}x the faster peer, {row['faster_peer']})", flush=True)
    return rows


def batch_summary(rows: list[dict]) -> dict:
    """alt-tvm against the faster peer over the batch table's rows, each ``model batch N``
    (:func:`~alt_tvm.bench.peers.against_faster_peer`)."""
    from alt_tvm.bench import against_faster_peer

    return against_faster_peer(ratios={f"{r['model']} batch {r['batch']}": r["ratio_vs_faster_peer"] for r in rows})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["resnet18"], help="reference models timed as served")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=3.0, help="per runtime, level and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; cold-start processes")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the results here (default benchmarks/results/<machine kind>/serving.json)")
    parser.add_argument("--batch-models", nargs="*", default=[], help="public models timed at --batches")
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.concurrency) or args.seconds <= 0 or args.rounds < 1:
        parser.error("--concurrency values, --seconds and --rounds must be positive")

    import torch

    import alt_tvm
    from alt_tvm.bench import PeakReadings, onnxruntime_session, quiet_tvm_pool, run_interleaved, write_results
    from alt_tvm.deploy.model import aligned, use_runtime_threads
    from alt_tvm.models import get_model
    from alt_tvm.target import host

    quiet_tvm_pool()
    cores = host().num_cores
    use_runtime_threads(cores)  # TVM's pool is sized when its first parallel kernel runs
    peaks = PeakReadings(threads=cores)  # the ceiling of this run, before any model loads the machine
    print(f"FP32 FMA peak measured in this run: {peaks.measure():.0f} GFLOP/s on {cores} threads "
          f"({host().description})", flush=True)
    results = {"machine": host().description, "cores": cores, "models": {}}
    with tempfile.TemporaryDirectory(prefix="alt_tvm_serving_") as tmp:
        for name in args.models:
            module, inputs = get_model(name)
            onnx_path = Path(tmp) / f"{name}.onnx"
            torch.onnx.export(module, tuple(inputs), str(onnx_path), dynamo=False, opset_version=17)
            x = aligned(inputs[0].numpy())
            built = alt_tvm.build(str(onnx_path))
            artifact = built.export(Path(tmp) / f"{name}.alt")
            want = onnxruntime_session(onnx_path, threads=cores)(x)[0]
            got = built(x)[0]
            error = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            if error > 1e-4:
                raise SystemExit(f"{name}: alt-tvm differs from ONNX Runtime by {error:.1e}")
            rows = []
            for callers in args.concurrency:
                per_call = max(1, cores // callers)
                built.set_threads(per_call)
                ort = onnxruntime_session(onnx_path, threads=per_call)
                served = (("alt-tvm", built), ("onnxruntime", ort))

                def turn(i: int, served=served, x=x, callers: int = callers) -> float:
                    served[i][1](x)  # warm
                    return throughput(served[i][1], x, callers=callers, seconds=args.seconds)

                samples = run_interleaved(len(served), rounds=args.rounds, run=turn)
                readings = {label: values for (label, _), values in zip(served, samples)}
                row = {"callers": callers, "threads_per_call": per_call,
                       **{f"{k} calls/s": statistics.median(v) for k, v in readings.items()}}
                row["ratio"] = row["alt-tvm calls/s"] / row["onnxruntime calls/s"]
                rows.append(row)
                print(f"{name} {callers} callers x {per_call} threads: alt-tvm {row['alt-tvm calls/s']:.1f}/s, "
                      f"ONNX Runtime {row['onnxruntime calls/s']:.1f}/s ({row['ratio']:.2f}x)", flush=True)
            cold = cold_start(artifact, x, readings=args.rounds)
            print(f"{name} cold start: " + ", ".join(f"{k} {v:.3f} s" for k, v in cold.items()
                                                     if isinstance(v, float)), flush=True)
            results["models"][name] = {"max_rel_error": error, "throughput": rows, "cold_start": cold,
                                       "artifact_mb": sum(p.stat().st_size for p in artifact.iterdir()) / 1e6}
    if args.batch_models:
        results["batches"] = batch_table(args.batch_models, args.batches, cores=cores, rounds=args.rounds)
        results["against_faster_peer"] = batch_summary(results["batches"])
        from alt_tvm.bench import describe_against_faster_peer

        print(describe_against_faster_peer(results["against_faster_peer"]), flush=True)
    peaks.measure()  # again at the end: one reading can land in a slow phase of the host
    results["peak_gflops"] = peaks.describe()
    print(f"FP32 FMA peak of this run: {peaks.describe()} on {cores} threads", flush=True)
    written = write_results("serving", results, path=args.json, peak_gflops=peaks.best, threads=cores)
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
