"""The main job of the quick start: tune a small model briefly, build it, compare.

Tunes the small CNN (1x3x64x64, six conv3x3+BN+ReLU) -- the search times candidates
alone with caches flushed, then the finalists, the defaults and SConv are timed inside the
whole model and the choice is verified against the untuned model -- builds it with and
without the tuning log, checks both against ONNX Runtime, and prints their latency next
to ONNX Runtime, OpenVINO (where it is installed: ``pip install 'alt-tvm[bench]'``; checked
against alt-tvm first) and PyTorch (interleaved rounds in one process, no runtime's idle pool
spinning, the same thread count for all) and TVM's own untuned build, all measured in this run
(:mod:`alt_tvm.bench`), and names the faster of the two CPU peers with its time over alt-tvm's.
Then runs the ResNet-18 first-layer case study (scripts/r18_first_layer.py) in a process of
its own.

    python scripts/quickstart.py [--trials 48] [--threads 2] [--rounds 9] [--skip-case-study]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=48, help="tuning budget (measured candidates)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--log", default=os.path.join("logs", "small_cnn.jsonl"))
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds")
    parser.add_argument("--skip-case-study", action="store_true")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from alt_tvm.bench import quiet_tvm_pool

    quiet_tvm_pool()  # TVM's spinning pool would slow the ONNX Runtime turns timed beside it

    import numpy as np

    from alt_tvm.bench import (
        INTERVAL_CONFIDENCE,
        cpu_peers,
        faster_peer,
        time_callable,
        time_interleaved,
        torch_runner,
        tvm_default_build,
    )
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
        print(f"  {s.key.split('|')[0]:12s} x{s.weight} {s.trials:3d} trials, alone (cache flushed): "
              f"{s.default_ms:.4f} -> {s.best_ms:.4f} ms ({s.default_ms / s.best_ms:.2f}x)")
    if summaries.in_model is not None:
        print(summaries.in_model.summary())

    peers, skipped = cpu_peers(path, threads=args.threads)
    ort = peers["onnxruntime"]
    reference = ort(*arrays)
    tuned, untuned = build(path, records=args.log), build(path)
    print(tuned.report.tuning_summary())
    info = MODELS[name]
    for label, compiled in (("alt-tvm tuned", tuned), ("alt-tvm untuned", untuned)):
        got = compiled(*arrays)
        if not all(np.allclose(g, r, rtol=info.rtol, atol=info.atol) for g, r in zip(got, reference)):
            print(f"{label}: output differs from ONNX Runtime", file=sys.stderr)
            return 1
    runners = {"alt-tvm tuned": (tuned, arrays), "alt-tvm untuned": (untuned, arrays), "onnxruntime": (ort, arrays)}
    for peer, why in skipped.items():
        print(f"(no {peer} row: {why})")
    if "openvino" in peers:  # checked against alt-tvm with the tolerance alt-tvm meets against ONNX Runtime
        if all(np.allclose(g, r, rtol=info.rtol, atol=info.atol) for g, r in zip(peers["openvino"](*arrays),
                                                                                 tuned(*arrays))):
            runners["openvino"] = (peers["openvino"], arrays)
        else:
            print("(no openvino row: its outputs differ from alt-tvm's)")
    runners["pytorch"] = (torch_runner(module, threads=args.threads), inputs)
    timed = time_interleaved(runners, rounds=args.rounds, repeat=20, warmup=5)
    print(f"\n{name} at batch 1, {args.threads} thread(s), every runtime in this process (ONNX Runtime's "
          f"pool does not spin), interleaved in {args.rounds} rounds of 20 calls; median of the rounds")
    base = timed["alt-tvm tuned"][0]
    for label, (median, rounds) in timed.items():
        print(f"  {label:18s} {median:9.3f} ms (rounds {min(rounds):.3f}-{max(rounds):.3f})   "
              f"{median / base:6.2f}x the tuned time")
    medians = {label: median for label, (median, _) in timed.items()}
    rounds = {label: times for label, (_, times) in timed.items()}
    tuned_vs, untuned_vs = (faster_peer(times_ms=medians, alt_ms=medians[label], rounds_ms=rounds,
                                        alt_rounds_ms=rounds[label]) for label in ("alt-tvm tuned", "alt-tvm untuned"))
    print(f"  faster peer: {tuned_vs.peer}; its time / alt-tvm's: tuned {tuned_vs.describe()}, untuned "
          f"{untuned_vs.describe()} (above 1: alt-tvm faster; in brackets the {INTERVAL_CONFIDENCE:.0%} interval "
          f"of the median of the rounds' paired ratios)")
    if not tuned.report.changed_by_log:
        print("  (the log changed no kernel: its in-model check kept every default, so the two alt-tvm rows "
              "time the same kernels and differ only by this run's noise)")
    low, median = time_callable(tvm_default_build(load_model(path)), arrays, warmup=1, repeat=3)
    print(f"  {'tvm untuned':18s} {median:9.3f} ms (3 calls after the rounds: unscheduled, too slow to interleave)"
          f"   {median / base:6.2f}x the tuned time")
    if not args.skip_case_study:
        print(flush=True)
        case_study = Path(__file__).resolve().with_name("r18_first_layer.py")
        return subprocess.call([sys.executable, str(case_study), "--threads", str(args.threads)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
