"""Inverted-residual blocks fused into one kernel, against the same blocks as three kernels.

Builds each model three ways: ``unfused`` (``strategy_options={"alt": {"fuse_blocks": False}}``),
``default`` (fused where the bands' recomputed rows cost little: ``block.MAX_WORK_RATIO``) and
``always`` (every block whose band fits); with ``--scale-fold`` also ``unscaled``: the default
build without squeeze-excitation scaling folded into the next conv (the multiply then runs as
a kernel of its own, as before). Every build is checked against ONNX Runtime. Then:

* per block, inside the model (``CompiledModel.profile``, median of ``--repeat`` runs): the
  fused kernel's time against the sum of the three unfused kernels (expand, depthwise,
  project) of the same block, and the traffic fusion removes;
* whole models timed interleaved (:func:`alt_tvm.bench.time_interleaved`, TVM's
  pool not spinning) beside the CPU peers on the same thread count (:mod:`alt_tvm.bench.peers`):
  ONNX Runtime (spinning off) and OpenVINO (CPU plugin, latency hint, f32 precision; checked
  against the default build's output with the tolerance the builds meet against ONNX Runtime;
  skipped, saying why, where it is not installed). Each build is read against the faster peer
  (peer ms / build ms, above 1: alt-tvm faster); the run ends with the default build's
  geometric mean over the models and the models where it is behind.

    python benchmarks/bench_blocks.py models/public/tv_mobilenet_v2.onnx [more.onnx] [--rounds 9]
        [--repeat 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

VARIANTS = {"unfused": False, "default": True, "always": "always"}

#: Largest error of a build against ONNX Runtime, and of a peer against the default build,
#: relative to the reference's largest magnitude.
TOLERANCE = 1e-3


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the whole-model timing")
    parser.add_argument("--repeat", type=int, default=30, help="profiled runs per build (median per kernel)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the rows here (default benchmarks/results/<machine kind>/blocks.json)")
    parser.add_argument("--scale-fold", action="store_true",
                        help="also build without squeeze-excitation scaling folded into the next conv")
    return parser.parse_args(argv)


def block_rows(fused, unfused, fused_profile, unfused_profile) -> list[dict]:
    """One row per fused kernel of ``fused``: its time, and its three kernels' in ``unfused``.

    A fused kernel's workload key is its expand conv's key with the tail appended; the
    unfused build emits that expand conv's kernel followed by its depthwise and project
    kernels. Blocks with equal keys are matched in program order.
    """
    fused_ms = {r.kernel: r.ms for r in fused_profile.rows()}
    unfused_ms = {r.kernel: r.ms for r in unfused_profile.rows()}
    plain = [k for k in unfused.report.kernels if k.kind == "partition"]
    seen: dict[str, int] = defaultdict(int)
    rows = []
    for kernel in fused.report.kernels:
        if kernel.kind != "partition" or "|then=nn.conv2d" not in kernel.workload:
            continue
        expand_key = kernel.workload.split("|then=")[0]
        matches = [i for i, k in enumerate(plain) if k.workload == expand_key]
        index = matches[seen[expand_key]]
        seen[expand_key] += 1
        three = plain[index:index + 3]
        parts = [unfused_ms[k.name] for k in three]
        fields = kernel.workload.split("|")
        dw = re.search(r"then=nn\.conv2d:\(\d+, 1, (\d+), (\d+)\):(\{[^}]*\})", kernel.workload)
        strides = json.loads(dw.group(3)).get("strides", [1, 1])
        rows.append({"kernel": kernel.name, "block": f"{fields[1].split(':')[0]} -> {fields[-1].split('out=')[-1]}",
                     "depthwise": f"{dw.group(1)}x{dw.group(2)}/{strides[0]}",
                     "unfused_ms": parts, "unfused_total_ms": sum(parts), "fused_ms": fused_ms[kernel.name],
                     "speedup": sum(parts) / fused_ms[kernel.name]})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import onnx

    import alt_tvm
    from alt_tvm import bench
    from alt_tvm.deploy.model import use_runtime_threads
    from alt_tvm.target import host

    bench.quiet_tvm_pool()
    machine = host()
    threads = machine.num_cores
    use_runtime_threads(threads)
    peak = bench.measure_peak_gflops(threads=threads)
    bandwidth = bench.measure_memory_bandwidth(threads=threads)
    print(f"{threads} threads; FP32 FMA peak {peak:.0f} GFLOP/s, memory bandwidth {bandwidth:.0f} GB/s, "
          f"L2 {machine.l2_bytes >> 10} KiB")
    results = []
    for path in args.models:
        model = onnx.load(str(path))
        peers, skipped = bench.cpu_peers(path, threads=threads)
        ort = peers["onnxruntime"]
        builds = {name: alt_tvm.build(model, strategy_options={"alt": {"fuse_blocks": value}})
                  for name, value in VARIANTS.items()}
        if args.scale_fold:
            builds["unscaled"] = _without_scale_folding(alt_tvm.build, model)
        rng = np.random.default_rng(0)
        unfused = builds["unfused"]
        x = [rng.standard_normal(s).astype(d) for s, d in zip(unfused.input_shapes, unfused.input_dtypes)]
        reference = ort(*x)[0]
        errors = {}
        for name, built in builds.items():
            errors[name] = _relative_error(built(*x)[0], reference)
            if errors[name] > TOLERANCE:
                raise SystemExit(f"{path.name} {name}: max relative error {errors[name]:.2e} against ONNX Runtime")
        peer_errors = {}
        for name in [p for p in peers if p != "onnxruntime"]:
            peer_errors[name] = _relative_error(peers[name](*x)[0], builds["default"](*x)[0])
            if peer_errors[name] > TOLERANCE:
                skipped[name] = f"differs from alt-tvm by {peer_errors[name]:.1e} (max relative error)"
                del peers[name]
        for name, why in skipped.items():
            print(f"{path.name}: {name} skipped: {why}")
        profiles = {name: built.profile(*x, repeat=args.repeat) for name, built in builds.items()}
        blocks = block_rows(builds["always"], unfused, profiles["always"], profiles["unfused"])
        runners = {name: (built, x) for name, built in builds.items()}
        runners.update({name: (peer, x) for name, peer in peers.items()})
        timed = bench.time_interleaved(runners, rounds=args.rounds, repeat=10)
        print(f"\n{path.name}: max relative error vs ONNX Runtime "
              + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
        print("| block (input -> output) | depthwise | unfused: expand + dw + project ms | fused ms | speed-up |"
              " fused by default |")
        print("| --- | --- | --- | --- | --- | --- |")
        for row in blocks:
            parts = " + ".join(f"{p:.3f}" for p in row["unfused_ms"])
            row["default"] = _same_block(row, builds)
            default = "yes" if row["default"] else "no"
            print(f"| {row['block']} | {row['depthwise']} | {parts} = {row['unfused_total_ms']:.3f} | "
                  f"{row['fused_ms']:.3f} | {row['speedup']:.2f}x | {default} |")
        model_ms = {n: t[0] for n, t in timed.items()}
        against = {name: bench.faster_peer(times_ms=model_ms, alt_ms=model_ms[name]) for name in builds}
        print(whole_model_table(model_ms, against))
        results.append({"model": path.name, "errors": errors, "peer_errors": peer_errors, "skipped_peers": skipped,
                        "blocks": blocks, "model_ms": model_ms,
                        "against_faster_peer": {n: a.to_json() for n, a in against.items()},
                        "peak_gflops": peak, "bandwidth_gbs": bandwidth})
    summary = summary_of(results)
    print("\n" + bench.describe_against_faster_peer(summary, what="alt-tvm (default build)"))
    written = bench.write_results("blocks", {"models": results, "against_faster_peer": summary}, path=args.json,
                                  peak_gflops=peak, threads=threads)
    print(f"results: {written}")
    return 0


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest absolute difference, relative to ``want``'s largest magnitude."""
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


def whole_model_table(model_ms: dict, against: dict) -> str:
    """The whole-model table: each build's and peer's median ms, builds against the unfused build and
    against the faster peer (``against``: build -> :class:`~alt_tvm.bench.peers.FasterPeer`)."""
    lines = ["", "| runner | model ms | vs unfused | faster peer | peer / build |", "| --- | --- | --- | --- | --- |"]
    for name, ms in model_ms.items():
        peer = against.get(name)
        faster = f"{peer.peer} | {peer.ratio:.2f}x" if peer is not None else " | "
        lines.append(f"| {name} | {ms:.3f} | {model_ms['unfused'] / ms:.3f}x | {faster} |")
    return "\n".join(lines)


def summary_of(results: list[dict]) -> dict:
    """The default build against the faster peer over the models of ``results``
    (:func:`~alt_tvm.bench.peers.against_faster_peer`)."""
    from alt_tvm.bench import against_faster_peer

    return against_faster_peer(ratios={r["model"]: r["against_faster_peer"]["default"]["ratio_vs_faster_peer"]
                                       for r in results})


def _without_scale_folding(build, model):
    """``build(model)`` with the conv strategy not absorbing squeeze-excitation multiplies."""
    from alt_tvm.strategies.alt.conv import AltConvStrategy
    from alt_tvm.strategies.alt.patterns import CHANNEL_SCALE

    declared = AltConvStrategy.patterns
    AltConvStrategy.patterns = tuple(p for p in declared if p.name != CHANNEL_SCALE.name)
    try:
        return build(model)
    finally:
        AltConvStrategy.patterns = declared


def _same_block(row: dict, builds: dict) -> bool:
    """Whether the default build fused the block of ``row`` (same expand key and tail)."""
    always = {k.name: k.workload for k in builds["always"].report.kernels}
    return always[row["kernel"]] in {k.workload for k in builds["default"].report.kernels}


if __name__ == "__main__":
    sys.exit(main())
