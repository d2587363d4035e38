"""int8 conv2d / dense on a VTA GEMM intrinsic, mapped by the CP embedding of ``alt_tvm.vta_mapping``.

``vta_conv2d`` / ``vta_dense`` pack the inputs on the host (NCHW or NHWC data), enumerate and rank
embeddings, lower the best one to a VTA program, run it on the simulator and return the result
with statistics; ``strategy="static"`` runs TVM's old static template instead (the reference).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from alt_tvm.vta_mapping.csp import Constraints, enumerate_embeddings
from alt_tvm.vta_mapping.embedding import Embedding, static_embedding
from alt_tvm.vta_mapping.polyhedral import TensorOp, conv2d_op, dense_op
from alt_tvm.vta_mapping.rewrite import lower, plan
from alt_tvm.vta_mapping.select import rank
from alt_tvm.vta_mapping.sim import Simulator, Stats, VTAConfig

__all__ = ["VTAResult", "applicable", "vta_conv2d", "vta_dense", "DEFAULT_CONSTRAINTS"]

# Stencil matches and padding allowed (the §6 setting); the swapped operand role is left out by
# default because it multiplies solve time for little gain on batch-1 layers.
DEFAULT_CONSTRAINTS = Constraints(linear_access=False, padding=True, swap_operands=False)


@dataclass
class VTAResult:
    """Output and statistics; ``pack_seconds`` is the data side only (padding, gather, per call),
    ``extra["weight_pack_seconds"]`` the weight packing a build does once."""

    output: np.ndarray
    embedding: Embedding
    stats: Stats
    solve_seconds: float
    pack_seconds: float
    candidates: int
    mac_total: int
    data_total: int
    extra: dict = field(default_factory=dict)


def applicable(op_attrs: Mapping) -> bool:
    """True for int8 conv2d (2-D, NCHW or NHWC data) and int8 dense with int32 accumulation."""
    kind = op_attrs.get("op")
    if kind not in ("conv2d", "dense"):
        return False
    if str(op_attrs.get("dtype", "")) != "int8" or str(op_attrs.get("out_dtype", "int32")) != "int32":
        return False
    if kind == "conv2d" and op_attrs.get("data_layout", "NCHW") not in ("NCHW", "NHWC"):
        return False
    return True


def _choose(op: TensorOp, config: VTAConfig, strategy: str, constraints: Constraints | None,
            weights: tuple[float, float]) -> tuple[Embedding, float, int]:
    if strategy == "static":
        return static_embedding(op, config.gemm), 0.0, 1
    if strategy != "csp":
        raise ValueError(f"strategy must be 'csp' or 'static', got {strategy!r}")
    res = enumerate_embeddings(op, shape=config.gemm, constraints=constraints or DEFAULT_CONSTRAINTS)
    ranked = rank(op, res.embeddings, weights=weights)
    if not ranked:
        return static_embedding(op, config.gemm), res.seconds, 0  # the static template always applies
    return ranked[0].embedding, res.seconds, len(ranked)


def _execute(op: TensorOp, emb: Embedding, a: np.ndarray, b: np.ndarray, config: VTAConfig):
    p = plan(op, emb)
    t0 = time.perf_counter()
    wgt_tiles = p.pack_operand(index=1, tensor=b)  # the constant: what a build would pack once
    t1 = time.perf_counter()
    data_tiles = p.pack_operand(index=0, tensor=a)
    pack_s = time.perf_counter() - t1
    g = config.gemm
    dram = {p.operand_role(0): data_tiles, p.operand_role(1): wgt_tiles,
            "out": np.zeros((p.ntiles["C"], g.batch, g.block_out), np.int32)}
    stats = Simulator(config).run(lower(p, config), dram)
    return p.unpack(dram["out"]), stats, p, pack_s, t1 - t0


def vta_conv2d(data: np.ndarray, weight: np.ndarray, *, stride: int | tuple[int, int] = 1,
               padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, groups: int = 1,
               data_layout: str = "NCHW", config: VTAConfig | None = None, strategy: str = "csp",
               constraints: Constraints | None = None, weights: tuple[float, float] = (1.0, 1.0)) -> VTAResult:
    """int8 conv2d through the mapping and the VTA simulator; output in ``data_layout``, int32.

    Parameters
    ----------
    data : np.ndarray
        int8, ``N C H W`` or ``N H W C``.
    weight : np.ndarray
        int8, ``O C/groups KH KW``.
    stride, padding, dilation, groups
        As in ``torch.nn.functional.conv2d``.
    data_layout : {"NCHW", "NHWC"}
    config : VTAConfig, optional
    strategy : {"csp", "static"}
    constraints : Constraints, optional
    weights : (float, float)
        Candidate-selection weights (MAC, data).
    """
    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"data_layout must be 'NCHW' or 'NHWC', got {data_layout!r}")
    if data.dtype != np.int8 or weight.dtype != np.int8:
        raise ValueError(f"data and weight must be int8, got {data.dtype} and {weight.dtype}")
    if data.ndim != 4 or weight.ndim != 4:
        raise ValueError(f"data and weight must be 4-D, got shapes {data.shape} and {weight.shape}")
    config = config or VTAConfig()
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    dh, dw = (dilation, dilation) if np.isscalar(dilation) else dilation
    if data_layout == "NHWC":
        n, h, w, c = data.shape
    else:
        n, c, h, w = data.shape
    k, cg, r, s = weight.shape
    if cg * groups != c:
        raise ValueError(f"weight has {cg} input channels per group, data {c} channels with groups={groups}")
    op = conv2d_op(n=n, c=c, h=h, w=w, k=k, r=r, s=s, pad_h=ph, pad_w=pw, stride_h=sh, stride_w=sw,
                   dilation_h=dh, dilation_w=dw, groups=groups)
    emb, solve_s, ncand = _choose(op, config, strategy, constraints, weights)
    # host packing: zero padding in the host layout, a canonical N C H W view of it (NHWC is read
    # in place, no layout copy), then the tile gather
    t0 = time.perf_counter()
    if data_layout == "NHWC":
        x = np.pad(data, ((0, 0), (ph, ph), (pw, pw), (0, 0))).transpose(0, 3, 1, 2)
    else:
        x = np.pad(data, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    wt = weight
    if groups > 1:
        x = x.reshape(n, groups, c // groups, *x.shape[2:])
        wt = weight.reshape(groups, k // groups, cg, r, s)
    pack_s = time.perf_counter() - t0
    out, stats, p, gather_s, weight_s = _execute(op, emb, x, wt, config)
    pack_s += gather_s
    if groups > 1:
        out = out.reshape(n, k, *out.shape[3:])
    if data_layout == "NHWC":
        out = out.transpose(0, 2, 3, 1)
    return VTAResult(np.ascontiguousarray(out), emb, stats, solve_s, pack_s, ncand, p.mac_total, p.data_total,
                     extra={"weight_pack_seconds": weight_s})


def vta_dense(data: np.ndarray, weight: np.ndarray, *, config: VTAConfig | None = None, strategy: str = "csp",
              constraints: Constraints | None = None, weights: tuple[float, float] = (1.0, 1.0)) -> VTAResult:
    """int8 dense ``out[i, j] = sum_k data[i, k] * weight[j, k]`` through the mapping and simulator."""
    if data.dtype != np.int8 or weight.dtype != np.int8:
        raise ValueError(f"data and weight must be int8, got {data.dtype} and {weight.dtype}")
    if data.ndim != 2 or weight.ndim != 2 or data.shape[1] != weight.shape[1]:
        raise ValueError(f"expected data M×K and weight N×K, got {data.shape} and {weight.shape}")
    config = config or VTAConfig()
    op = dense_op(m=data.shape[0], n=weight.shape[0], k=data.shape[1])
    emb, solve_s, ncand = _choose(op, config, strategy, constraints, weights)
    out, stats, p, pack_s, weight_s = _execute(op, emb, data, weight, config)
    return VTAResult(out, emb, stats, solve_s, pack_s, ncand, p.mac_total, p.data_total,
                     extra={"weight_pack_seconds": weight_s})
