"""Lowering after the propagation pass: TVM's legalization for what no strategy took, with a
minimal schedule, and kernels that overwrite a dead operand.

:func:`lower` is what :func:`~alt_tvm.graph.build.build` and
:func:`~alt_tvm.graph.build.pipeline` run between import and code generation:
:func:`~alt_tvm.graph.prepare.prepare`, :class:`~alt_tvm.graph.propagate.AltLayoutPass`,
:func:`lower_fallbacks`, then :func:`~alt_tvm.graph.inplace.write_in_place`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tvm
from tvm import relax

from .ieee import legalize_overrides
from .in_layout import OperatorKernel, operator_key, schedule_operator
from .inplace import write_in_place
from .prepare import prepare
from .propagate import AltLayoutPass
from .report import ALT_KERNEL_ATTR, BuildReport

__all__ = ["log_report", "lower", "lower_fallbacks"]

LOGGER = logging.getLogger("alt_tvm")


def lower(mod: tvm.IRModule, alt_pass: AltLayoutPass) -> tvm.IRModule:
    """An imported module with every partition lowered by its strategy (``alt_pass``, whose
    report records what happened) and the rest by TVM, scheduled; a kernel that is the last
    use of an operand it can overwrite writes in place."""
    options = alt_pass.options
    machine = options.target
    with machine.to_tvm():
        lowered = lower_fallbacks(alt_pass(prepare(mod)), cores=machine.num_cores, fast_math=options.fast_math,
                                  unscheduled=None if options.strict else alt_pass.report.left_as_is,
                                  schedule=alt_pass.schedule_fused)
    lowered, alt_pass.report.in_place, skipped = write_in_place(lowered, attr=ALT_KERNEL_ATTR,
                                                                strict=options.strict)
    alt_pass.report.left_as_is.update(skipped)
    return lowered


def lower_fallbacks(mod: tvm.IRModule, *, cores: int, fast_math: bool = False,
                    unscheduled: dict[str, str] | None = None,
                    schedule: Callable[[OperatorKernel, str], tvm.tirx.PrimFunc] | None = None) -> tvm.IRModule:
    """TVM's legalization for everything no strategy took, fused, with a minimal schedule.

    ``tvm.compile``'s default CPU pipeline neither fuses nor schedules legalized ops, so a
    max-pool or a softmax would run single-threaded, one kernel per op. Here they are fused
    (FuseOps/FuseTIR; alt-tvm kernels are marked opaque and stay alone) and every unscheduled
    kernel gets :func:`~alt_tvm.graph.in_layout.schedule_in_layout`'s schedule: a fused chain
    of reshapes and transposes becomes one loop nest instead of one pass over memory per op,
    inner loops vectorised, outer loops parallel. Unless ``fast_math``, ReLU, clip,
    maximum/minimum, max pooling and max/min reductions are legalized by
    :func:`alt_tvm.graph.ieee.legalize_overrides`, which propagate NaN. Where ``unscheduled``
    is given, a kernel the schedule cannot be applied to is left as TVM legalized it and
    ``unscheduled`` receives its name and why; without it the error propagates (a strict build).
    Each such kernel is an :class:`~alt_tvm.graph.in_layout.OperatorKernel`: ``schedule(kernel,
    name)`` schedules it (the propagation pass's, which applies tuned knobs); without it, its
    defaults.
    """
    seq = tvm.ir.transform.Sequential([
        relax.transform.LegalizeOps(customize_legalize_map=legalize_overrides(fast_math=fast_math)),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        # A kernel that is a reshape alone (after attention writes the heads back) becomes
        # the VM's reshape, a view of the same memory, instead of a copy.
        relax.transform.RewriteDataflowReshape(),
    ])
    mod = seq(mod)
    for gvar in mod.get_global_vars():
        func = mod[gvar]
        if not isinstance(func, tvm.tirx.PrimFunc) or (func.attrs is not None and ALT_KERNEL_ATTR in func.attrs):
            continue
        try:
            ops = (gvar.name_hint.removeprefix("fused_").rstrip("0123456789").rstrip("_"),)
            kernel = OperatorKernel(operator_key(ops, func), "operator", func, cores)
            mod[gvar] = schedule(kernel, gvar.name_hint) if schedule is not None else schedule_operator(kernel)
        except Exception as err:  # noqa: BLE001 - TVM's verifier and primitives raise several types
            if unscheduled is None:
                raise
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [repr(err)]
            unscheduled[gvar.name_hint] = f"left unscheduled: {lines[-1][:200]}"
    return mod


def log_report(report: BuildReport) -> None:
    """The build summary through the ``alt_tvm`` logger: INFO normally; WARNING when a strategy
    failed on a partition or the log given does not tune every tunable partition."""
    LOGGER.info("%s", report.summary())
    for key, why in report.failed.items():
        LOGGER.warning("strategy failed on %s, left to TVM's legalization: %s", key.split("|")[0], why)
    for name, why in report.left_as_is.items():
        LOGGER.warning("kernel %s %s", name, why)
    if report.untuned:
        LOGGER.warning("%s", report.tuning_summary())
