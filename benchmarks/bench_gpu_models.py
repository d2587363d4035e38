"""Whole models on a CUDA GPU: alt-tvm against PyTorch eager (cuDNN/cuBLAS) and ONNX Runtime's
CUDA execution provider, every output checked against ONNX Runtime on the CPU.

Needs a CUDA GPU that TVM sees and ``nvcc``. For each model (public architecture
definitions with seeded weights, :mod:`alt_tvm.models.public`) and batch, in this run, on
the GPU found (``alt_tvm.target.detect_cuda``):

* the model is exported to ONNX (TorchScript exporter) at that batch and built whole for the
  GPU by ``alt_tvm.build`` (its strategies' CUDA templates; every other kernel by TVM's GPU
  rules, :mod:`alt_tvm.graph.gpu`); its output on seeded inputs must match ONNX Runtime's on
  the CPU to ``--rtol`` of the output's largest magnitude (FP32 throughout);
* **alt-tvm untuned** (and **tuned** with ``--trials``: the model's tasks tuned on the GPU,
  at batch 1, then built from the log);
* **PyTorch eager** on the GPU in FP32 with TF32 off (the arithmetic alt-tvm's kernels do) and
  with TF32 on for convolutions and matrix products (tensor cores, 10-bit mantissas);
* **ONNX Runtime CUDA** (TF32 off) where the installed ONNX Runtime has the CUDA provider.

Every runner is timed with CUDA events around back-to-back calls on inputs already on the GPU
(``alt_tvm.bench.cuda.cuda_events_ms``), the runners interleaved in ``--rounds`` rounds;
medians are reported with each model's share of the FP32 and TF32 matrix rates measured in
the same run (cuBLAS, 8192^3). ``--profile`` adds alt-tvm's per-kernel times at batch 1.

    python benchmarks/bench_gpu_models.py [--models tv_resnet50 ...] [--image-batches 1 32]
        [--text-batches 1 8] [--rounds 5] [--trials 0] [--profile] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tvm

import alt_tvm
from alt_tvm.bench.cuda import cuda_events_ms, matmul_rate_tflops, nvidia_driver
from alt_tvm.bench.onnx_flops import count_flops
from alt_tvm.bench.onnxruntime import onnxruntime_cuda_session, onnxruntime_session
from alt_tvm.bench.results import write_results
from alt_tvm.models.public import example_input, export, instantiate, public_models
from alt_tvm.target import detect_cuda

MODELS = ("tv_resnet50", "tv_mobilenet_v2", "hf_bert_base", "tv_vit_b_16")


def allow_tf32(on: bool) -> None:
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref|; inf where ``out`` has a NaN."""
    if out.shape != ref.shape:
        raise AssertionError(f"output shape {out.shape}, reference {ref.shape}")
    if np.isnan(out).any():
        return float("inf")
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def alt_runner(model: alt_tvm.CompiledModel, x: np.ndarray):
    """alt-tvm's VM on an input already on the GPU (the call's output stays there)."""
    vm = model.vm
    args = [tvm.runtime.tensor(x, model.device)]
    main = vm["main"]
    return lambda: main(*args)


def ort_cuda_runner(path: Path, x: np.ndarray, name: str):
    """ONNX Runtime's CUDA provider with the input bound on the GPU (no host copies timed)."""
    import onnxruntime as ort

    session = onnxruntime_cuda_session(path).session
    binding = session.io_binding()
    binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")
    return lambda: session.run_with_iobinding(binding)


def tuned_build(path: Path, target, *, trials: int, log: Path, seed: int):
    """The model's tasks tuned on the GPU (``trials`` in all), then the model built from the log."""
    from alt_tvm.integration import extract_tasks
    from alt_tvm.tuning.driver import tune_tasks
    from alt_tvm.tuning.remote import isolated_measure

    tasks = extract_tasks(str(path), target=target)
    tune_tasks(tasks, trials=trials, log=str(log), seed=seed, measure=isolated_measure(target=target),
               progress=False)
    return alt_tvm.build(str(path), target=target, records=str(log))


def run_case(name: str, batch: int, args, target, work: Path, rates: dict) -> dict[str, Any]:
    spec = public_models()[name]
    row: dict[str, Any] = {"model": name, "batch": batch, "errors": []}
    path = export(name, work, batch=batch)
    flops = count_flops(str(path))
    row["gflop"] = flops / 1e9
    x_t = example_input(spec, seed=1, batch=batch)
    x = x_t.numpy()
    ref = onnxruntime_session(path, threads=8)(x)[0]
    started = time.perf_counter()
    model = alt_tvm.build(str(path), target=target)
    row["build_s"] = time.perf_counter() - started
    row["report"] = model.report.summary().splitlines()[0]
    row["alt_error"] = relative_error(model(x)[0], ref)
    runners = {"alt-tvm": alt_runner(model, x)}
    if args.trials and batch == 1:
        try:
            tuned = tuned_build(path, target, trials=args.trials, log=work / f"{name}.tuned.jsonl", seed=args.seed)
            row["tuned_error"] = relative_error(tuned(x)[0], ref)
            runners["alt-tvm tuned"] = alt_runner(tuned, x)
            row["tuned_report"] = tuned.report.summary().splitlines()[0]
        except Exception as err:  # noqa: BLE001 - reported in the row; the other runners go on
            row["errors"].append(f"tuning: {type(err).__name__}: {err}")
    module = instantiate(spec, seed=0).cuda()
    x_gpu = x_t.cuda()
    with torch.inference_mode():
        allow_tf32(False)
        row["torch_error"] = relative_error(module(x_gpu).float().cpu().numpy(), ref)
    runners["pytorch fp32"] = lambda: module(x_gpu)
    runners["pytorch tf32"] = lambda: module(x_gpu)
    try:
        runners["ort-cuda fp32"] = ort_cuda_runner(path, x, spec.input_name)
    except Exception as err:  # noqa: BLE001 - not every ONNX Runtime has the CUDA provider
        row["ort_cuda"] = f"{type(err).__name__}: {err}"
    times: dict[str, list[float]] = {k: [] for k in runners}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for key, fn in runners.items():
                allow_tf32(key == "pytorch tf32")
                try:
                    times[key].append(cuda_events_ms(fn, repeat=args.repeat, min_ms=args.min_ms))
                except Exception as err:  # noqa: BLE001
                    row["errors"].append(f"{key}: {type(err).__name__}: {err}")
                    times[key].append(float("nan"))
        allow_tf32(False)
    row["ms"] = {k: statistics.median(v) for k, v in times.items()}
    row["fp32_share"] = {k: flops / (ms * 1e-3) / (rates["fp32_tflops"] * 1e12) for k, ms in row["ms"].items()}
    if args.profile and batch == 1:
        profile = model.profile(x, repeat=5)
        info = model.kernel_info()
        top = sorted(profile.times_ms.items(), key=lambda kv: -statistics.median(kv[1]))[:args.profile_top]
        row["profile_total_ms"] = statistics.median(profile.totals_ms)
        row["profile"] = [{"kernel": k, "ms": statistics.median(v), "ops": list(info[k].ops) if k in info else [],
                           "gflops": info[k].flops / statistics.median(v) / 1e6 if k in info and statistics.median(v)
                           else None} for k, v in top]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(public_models()))
    parser.add_argument("--image-batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--text-batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--min-ms", type=float, default=20.0)
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per model at batch 1 (0: untuned only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    target = detect_cuda()
    rates = {"fp32_tflops": matmul_rate_tflops(repeat=5), "tf32_tflops": matmul_rate_tflops(repeat=5, tf32=True)}
    env = {"gpu": torch.cuda.get_device_name(0), "target": target.description, "driver": nvidia_driver(),
           "tvm": tvm.__version__, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), **rates}
    print(env, flush=True)
    rows = []
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_models_"))
    for name in args.models:
        text = public_models()[name].input_dtype == "int64"
        for batch in args.text_batches if text else args.image_batches:
            try:
                row = run_case(name, batch, args, target, work, rates)
            except Exception as err:  # noqa: BLE001 - one model's failure is reported, the others run
                row = {"model": name, "batch": batch, "errors": [f"{type(err).__name__}: {err}"],
                       "traceback": traceback.format_exc()[-3000:]}
            errors = [row[k] for k in ("alt_error", "tuned_error") if k in row]
            row["ok"] = bool(errors) and all(e <= args.rtol for e in errors)
            torch.cuda.empty_cache()
            rows.append(row)
            print({k: v for k, v in row.items() if k not in ("profile", "traceback")}, flush=True)
            if args.json is not None:
                write_results("gpu_models", {"env": env, "rows": rows}, path=args.json)
    print(f"\n{'model':<18}{'batch':>6}{'alt-tvm':>10}{'tuned':>10}{'pt fp32':>10}{'pt tf32':>10}{'ort-cuda':>10}"
          f"{'err':>10}{'%fp32':>7}")
    for row in rows:
        ms = row.get("ms", {})
        cell = [f"{ms[k]:10.3f}" if k in ms else f"{'-':>10}" for k in
                ("alt-tvm", "alt-tvm tuned", "pytorch fp32", "pytorch tf32", "ort-cuda fp32")]
        share = row.get("fp32_share", {}).get("alt-tvm")
        print(f"{row['model']:<18}{row['batch']:>6}{''.join(cell)}{row.get('alt_error', float('nan')):10.1e}"
              f"{(share or 0) * 100:7.1f}" + ("" if row["ok"] else "  FAILED: " + "; ".join(row["errors"])[:300]))


if __name__ == "__main__":
    main()
