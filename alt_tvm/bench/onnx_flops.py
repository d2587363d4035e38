"""The arithmetic of an ONNX model: FLOPs of its convolutions and matrix products, node by node.

2 FLOPs per multiply-add, direct convolution; elementwise ops are left out. The ceiling a
runtime's time is read against (``scripts/count_flops.py``, ``scripts/profile_peer.py``,
:class:`alt_tvm.bench.peers.AtPeak`).
"""

from __future__ import annotations

__all__ = ["FUSED_AFTER", "count_flops", "kernel_flops", "node_flops"]

#: ONNX ops a runtime fuses into the Conv, Gemm or MatMul before them (ONNX Runtime, OpenVINO):
#: the fused kernel may carry the name of one of them, or of the tensor it writes.
FUSED_AFTER = ("Relu", "Add", "Sum", "Clip", "Sigmoid", "Mul", "HardSigmoid", "HardSwish", "LeakyRelu", "Div",
               "Erf", "Tanh")


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

    from alt_tvm.flops import conv_flops, matmul_flops

    from .onnxruntime import onnxruntime_session

    model = onnx.load(path)
    graph = model.graph
    counted = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    known = {t.name: list(t.dims) for t in graph.initializer}
    wanted = {name for n in counted for name in (n.input[0], n.input[1], n.output[0]) if name not in known}
    present = {o.name for o in graph.output}
    for name in sorted(wanted - present):
        graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = onnxruntime_session(model, threads=1, optimize=False).session  # every node kept
    rng = np.random.default_rng(0)

    def feed(value) -> np.ndarray:  # token ids for an integer input (BERT's), else normal floats
        shape = [d if isinstance(d, int) else 1 for d in value.shape]
        if "int" in value.type:
            return rng.integers(0, 100, shape).astype(np.int64 if "int64" in value.type else np.int32)
        return rng.standard_normal(shape).astype(np.float32)

    feeds = {i.name: feed(i) for i in session.get_inputs()}
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


def kernel_flops(path: str, names: list[str]) -> dict[str, int]:
    """The FLOPs of each of a runtime's kernels in ``names`` that computes a Conv, Gemm or MatMul
    of the ONNX model at ``path``: found by its name (an ONNX node's, or the tensor it writes,
    with ONNX Runtime's ``_nchwc`` or OpenVINO's ``/WithoutBiases`` after it), then back through
    fused element-wise ops (:data:`FUSED_AFTER`) to the nearest product. Names that compute none
    are left out."""
    import onnx

    products = node_flops(path)
    graph = onnx.load(path, load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}
    by_node = {node.name: node.output[0] for node in graph.node if node.name and node.output}
    found = {}
    for name in names:
        tensor = name.removesuffix("_nchwc").removesuffix("/WithoutBiases")
        frontier = [tensor if tensor in producers else by_node.get(tensor)]
        for _ in range(4):  # breadth first: the product nearest the kernel's output
            hit = next((t for t in frontier if t in products), None)
            if hit is not None:
                found[name] = products[hit]
                break
            frontier = [i for t in frontier if t in producers and producers[t].op_type in FUSED_AFTER
                        for i in producers[t].input]
    return found
