"""Small TIR expression utilities shared by the templates (``strategies``) and the pipeline
(:mod:`alt_tvm.lowering`)."""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import tirx

__all__ = ["substitute", "uses_var"]


def substitute(expr: Any, mapping: dict) -> Any:
    """``expr`` (an expression or a statement) with the variables of ``mapping`` replaced by their values."""
    if not mapping:
        return expr
    return tvm_ffi.structural_map(
        expr, (tvm.ir.expr.Var, lambda var: next((v for k, v in mapping.items() if k.same_as(var)), var)))


def uses_var(expr: Any, var: tirx.Var) -> bool:
    """Whether ``expr`` reads the variable ``var``."""
    used = []
    tvm_ffi.structural_walk(expr, (tvm.ir.expr.Var, lambda v: used.append(True) if v.same_as(var) else None))
    return bool(used)
