"""How far each CNN of a sweep is from the FMA peak, for ONNX Runtime and alt-tvm.

    python scripts/count_flops.py --sweep docs/cnn_suite_2026-11-26c_zen4.jsonl --models-dir models/sweep \
        --peak 229

Counts the arithmetic of each ONNX model's convolutions and matrix products (2 FLOPs per
multiply-add, direct convolution; the elementwise ops are left out), then reads the times of a
``sweep_public.py`` run and prints, per model: each runtime's GFLOP/s as a share of the FP32
FMA peak, their ratio, and ``ORT / floor``, the ratio alt-tvm would reach if it ran the model
at the peak (the direct-convolution FLOPs at the peak; Winograd convolutions do fewer
multiplications and can read above 100%). ``--peak`` is the peak measured in that sweep's run
(its log prints it); without it the peak is measured here, on 2 threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


def count_flops(path: str) -> int:
    """FLOPs of one inference of the ONNX model at ``path``: its Conv, Gemm and MatMul nodes
    (:func:`node_flops`)."""
    return sum(node_flops(path).values())


def node_flops(path: str) -> dict[str, int]:
    """FLOPs of each Conv, Gemm and MatMul node of the ONNX model at ``path``, by the name of
    the tensor it writes.

    The shapes are the ones ONNX Runtime computes on a random input (shape inference does not
    follow every export through its Split and Reshape nodes); a dynamic input dimension is 1.
    """
    import numpy as np
    import onnx
    import onnxruntime

    from alt_tvm.flops import conv_flops, matmul_flops

    model = onnx.load(path)
    graph = model.graph
    counted = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    known = {t.name: list(t.dims) for t in graph.initializer}
    wanted = {name for n in counted for name in (n.input[0], n.input[1], n.output[0]) if name not in known}
    present = {o.name for o in graph.output}
    for name in sorted(wanted - present):
        graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
             for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    known.update((name, list(value.shape)) for name, value in zip(names, session.run(names, feeds)))
    flops = {}
    for node in counted:
        if node.op_type == "Conv":  # ONNX weights are OIHW
            flops[node.output[0]] = conv_flops(output_shape=known[node.output[0]], weight_shape=known[node.input[1]])
        else:
            a = known[node.input[0]]
            trans_a = any(x.name == "transA" and x.i for x in node.attribute)
            flops[node.output[0]] = matmul_flops(output_shape=known[node.output[0]],
                                                 reduction=a[-2] if trans_a else a[-1])
    return flops


def rows(sweep: list[dict], *, models_dir: str, peak_gflops: float, exporter: str = "torchscript") -> list[dict]:
    """One row per model of the sweep whose ONNX file is in ``models_dir``."""
    out = []
    for record in sweep:
        path = os.path.join(models_dir, f"{record['model']}.onnx")
        times = record.get("ms", {})
        ort, alt = times.get("onnxruntime"), times.get(f"alt-tvm {exporter}")
        if not os.path.exists(path) or ort is None or alt is None:
            continue
        flops = count_flops(path)
        floor_ms = flops / (peak_gflops * 1e9) * 1e3
        out.append({"model": record["model"], "gflop": flops / 1e9, "ort_ms": ort, "alt_ms": alt,
                    "ort_peak": floor_ms / ort, "alt_peak": floor_ms / alt, "ort_over_alt": ort / alt,
                    "ort_over_floor": ort / floor_ms})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, help="a sweep_public.py JSON-lines file")
    parser.add_argument("--models-dir", required=True, help="where the sweep's <model>.onnx files are")
    parser.add_argument("--peak", type=float, default=None, help="FP32 GFLOP/s (default: measured here)")
    parser.add_argument("--exporter", default="torchscript", choices=["torchscript", "dynamo"])
    args = parser.parse_args(argv)
    if args.peak is not None and args.peak <= 0:
        parser.error(f"--peak must be positive, got {args.peak}")
    if args.peak is None:
        from alt_tvm.timing import measure_peak_gflops

        args.peak = measure_peak_gflops(threads=2)
    try:
        with open(args.sweep) as f:
            sweep = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        parser.error(f"--sweep {args.sweep}: not a readable JSON-lines file ({err})")
    table = rows(sweep, models_dir=args.models_dir, peak_gflops=args.peak, exporter=args.exporter)
    if not table:
        print(f"no model of {args.sweep} has an ONNX file in {args.models_dir} and both times", file=sys.stderr)
        return 2
    print(f"FP32 peak {args.peak:.0f} GFLOP/s; alt-tvm: the {args.exporter} export")
    print("| model | GFLOP | ORT ms | alt-tvm ms | ORT % of peak | alt-tvm % of peak | ORT / alt-tvm | ORT / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in table:
        print(f"| {r['model']} | {r['gflop']:.2f} | {r['ort_ms']:.2f} | {r['alt_ms']:.2f} | {100 * r['ort_peak']:.0f}% "
              f"| {100 * r['alt_peak']:.0f}% | {r['ort_over_alt']:.2f} | {r['ort_over_floor']:.2f} |")

    def geomean(key: str) -> float:
        return math.exp(sum(math.log(r[key]) for r in table) / len(table))

    print(f"geometric mean: ORT / alt-tvm {geomean('ort_over_alt'):.3f}, ORT / floor {geomean('ort_over_floor'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
