"""Kernels no strategy implements, scheduled for a GPU by TVM's ``dlight`` rules.

On a CPU target such kernels get :mod:`alt_tvm.graph.in_layout`'s loop nests (parallel outer
loops, vector inner loops). On a GPU those would be host loops over device memory, so there
every such kernel (a pool or a mean computed in its operands' layouts, a softmax, a norm, a
batched matmul of attention, a reshape) gets the first of TVM's ``dlight`` GPU rules that
applies: a tiled matmul, a GEMV, a row reduction with its threads cooperating, a general
reduction (softmax, layer norm), else the fallback that binds the spatial loops to blocks
and threads. They are the rules of TVM's own CUDA pipeline
(``tvm.relax.backend.cuda.pipeline``), applied here because alt-tvm schedules its fallback
kernels itself.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight

__all__ = ["SCHEDULED_ATTR", "gpu_rules", "is_gpu", "schedule_on_gpu"]

#: The attribute TVM's default-schedule pass reads to leave a kernel as it is.
SCHEDULED_ATTR = "tirx.is_scheduled"


def is_gpu(target: tvm.target.Target | None) -> bool:
    """Whether ``target`` (a TVM target, or None) is a GPU."""
    return target is not None and "gpu" in target.keys


def gpu_rules() -> tuple:
    """The ``dlight`` rules, first match wins: matmul, GEMV, row reduction, general
    reduction, fallback (TVM's CUDA pipeline's order)."""
    return (dlight.gpu.Matmul(), dlight.gpu.GEMV(), dlight.gpu.Reduction(), dlight.gpu.GeneralReduction(),
            dlight.gpu.Fallback())


def schedule_on_gpu(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """``func`` scheduled for the GPU ``target`` by the first ``dlight`` rule that applies,
    marked scheduled so TVM's pipeline leaves it.

    Raises
    ------
    ValueError
        If ``target`` is not a GPU, or no rule applies (the fallback applies to any kernel
        TVM's legalization writes, so this names a kernel of another shape).
    """
    if not is_gpu(target):
        raise ValueError(f"target {target} is not a GPU (its keys are {list(target.keys)}); "
                         "schedule_on_gpu schedules for CUDA, ROCm, Vulkan or Metal targets")
    with target:
        for rule in gpu_rules():
            sch = rule.apply(func, target, False)
            if sch is None:
                continue
            if isinstance(sch, list):
                sch = sch[0]
            return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)
    raise ValueError(f"no dlight GPU rule applies to {func.attrs.get('global_symbol', 'this kernel')}")
