"""The main job of the quick start: tune a small model briefly, build it, compare.

Tunes the small CNN (1x3x64x64, six conv3x3+BN+ReLU), builds it with and
without the tuning log, checks both against ONNX Runtime, and prints their latency next
to ONNX Runtime, PyTorch and TVM's own untuned build, all measured in this run. Then
runs the ResNet-18 first-layer case study (scripts/r18_first_layer.py).

    python scripts/quickstart.py [--trials 48] [--threads 2] [--skip-case-study]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=48, help="tuning budget (measured candidates)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--log", default=os.path.join("logs", "small_cnn.jsonl"))
    parser.add_argument("--skip-case-study", action="store_true")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np

    from alt_tvm.graph.baselines import onnxruntime_session, time_callable, torch_runner, tvm_default_build
    from alt_tvm.graph.build import build
    from alt_tvm.graph.frontend import load_model
    from alt_tvm.integration import tune
    from alt_tvm.models import MODELS, export_onnx, get_model

    name = "small_cnn"
    module, inputs = get_model(name)
    arrays = [x.numpy() for x in inputs]
    path = str(export_onnx(name, os.path.join(tempfile.mkdtemp(prefix="alt_quick_"), f"{name}.onnx")))
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    print(f"tuning {name} for {args.trials} trials -> {args.log}")
    summaries = tune(path, trials=args.trials, log=args.log, resume=True,
                     plot=os.path.splitext(args.log)[0] + ".png")
    for s in summaries:
        print(f"  {s.key.split('|')[0]:12s} x{s.weight} {s.trials:3d} trials: "
              f"{s.default_ms:.3f} -> {s.best_ms:.3f} ms ({s.default_ms / s.best_ms:.2f}x)")

    ort = onnxruntime_session(path, threads=args.threads)
    reference = ort(*arrays)
    runners = {"alt-tvm tuned": build(path, records=args.log), "alt-tvm untuned": build(path)}
    info = MODELS[name]
    for label, compiled in runners.items():
        got = compiled(*arrays)
        if not all(np.allclose(g, r, rtol=info.rtol, atol=info.atol) for g, r in zip(got, reference)):
            print(f"{label}: output differs from ONNX Runtime", file=sys.stderr)
            return 1
    runners["onnxruntime"] = ort
    runners["pytorch"] = torch_runner(module, threads=args.threads)
    runners["tvm untuned"] = tvm_default_build(load_model(path))
    print(f"\n{name} at batch 1, {args.threads} thread(s): median of repeated calls, all in this run")
    base = None
    for label, runner in runners.items():
        call_args = inputs if label == "pytorch" else arrays
        repeat = 3 if label == "tvm untuned" else 50
        low, median = time_callable(runner, call_args, warmup=1 if label == "tvm untuned" else 5, repeat=repeat)
        base = base or median
        print(f"  {label:18s} {median:9.3f} ms (min {low:.3f})   {median / base:6.2f}x the tuned time")
    if not args.skip_case_study:
        print()
        from r18_first_layer import main as case_study

        return case_study(["--threads", str(args.threads)])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
