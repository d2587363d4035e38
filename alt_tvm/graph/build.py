"""``alt_tvm.build`` and ``alt_tvm.pipeline``: a model to a callable module, through the
strategy registry.

The flow (what ``relay.build`` with registered op strategies was, on Relax):

1. import (ONNX file/proto, torch module, Relax IRModule), weights as constants
   (:mod:`alt_tvm.graph.frontend`);
2. inference simplifications and one canonical graph (:func:`~alt_tvm.graph.prepare.prepare`);
3. :class:`~alt_tvm.graph.propagate.AltLayoutPass`: each partition lowered by its strategy,
   layouts propagated between them (:mod:`alt_tvm.graph.propagate`);
4. TVM's legalization for everything left, scheduled, and kernels writing over a dead
   operand (:mod:`alt_tvm.graph.lower`);
5. ``tvm.compile`` and the Relax VM (:class:`~alt_tvm.graph.compiled.CompiledModel`).

Every step takes one :class:`~alt_tvm.options.BuildOptions`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from alt_tvm import lowering
from alt_tvm.deploy.model import use_runtime_threads
from alt_tvm.native_log import tvm_output_to_log
from alt_tvm.options import BuildOptions, build_options

from .compiled import CompiledModel
from .gpu import is_gpu
from .lower import log_report, lower
from .propagate import AltLayoutPass
from .report import BuildReport

__all__ = ["build", "pipeline"]


def build(model: Any, options: BuildOptions | None = None, *, example_inputs: Sequence[Any] | None = None,
          input_shapes: Mapping[str, Sequence[int]] | None = None, **keywords: Any) -> CompiledModel:
    """Build ``model`` to a callable module with alt-tvm's strategies.

    Parameters
    ----------
    model
        Path to an ONNX file, an ``onnx.ModelProto``, a ``torch.nn.Module`` (with
        ``example_inputs``), a ``torch.export.ExportedProgram`` or a Relax ``IRModule``.
    options
        How to build it (:class:`~alt_tvm.options.BuildOptions`: target, variant,
        strategies, strategy options, NaN rule, strictness, tuning log); default: this host,
        the analytic defaults.
    example_inputs
        Inputs to trace a torch module with (their shapes fix the model's).
    input_shapes
        Input name -> shape, for an ONNX model with dynamic dimensions.
    **keywords
        Fields of :class:`~alt_tvm.options.BuildOptions` (``target=``, ``records=``,
        ``variant=``, ``strategies=``, ``strategy_options=``, ``fast_math=``, ``strict=``),
        replacing those of ``options``. With ``records``, the best record of each workload
        measured on this target with this TVM version replaces the strategy's analytic
        defaults; ``.report`` says how many tunable partitions it tuned and why the others
        were not, and a warning says so too when the log does not tune them all. Not
        ``strict``, a partition whose strategy fails is left to TVM's legalization
        (``report.failed``), and a kernel the compiler rejects is found alone and the model
        built again without its strategy.

    Returns
    -------
    CompiledModel
        Call it on NumPy arrays; ``.report`` lists partitions and fallbacks.
    """
    from .frontend import load_model

    options = build_options(options, caller="build", **keywords)
    machine = options.target
    gpu = is_gpu(machine.to_tvm())
    # A GPU model's host code is the VM alone: TVM's CPU pool is not sized for the device's SMs.
    threads = None if gpu else use_runtime_threads(machine.num_cores)
    imported = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes)
    alt_pass = AltLayoutPass(options)
    with tvm_output_to_log():
        lowered = lower(imported.mod, alt_pass)
        report = alt_pass.report
        try:
            executable = lowering.compile(lowered, target=machine.to_tvm())
        except Exception as err:
            if options.strict:
                raise
            # Find the kernels that do not compile on their own and build again without them.
            excluded = _uncompilable_partitions(lowered, report, machine.to_tvm())
            if not excluded:
                raise
            alt_pass = AltLayoutPass(options, excluded=excluded)
            lowered = lower(imported.mod, alt_pass)
            report = alt_pass.report
            try:
                executable = lowering.compile(lowered, target=machine.to_tvm())
            except Exception:
                raise err from None
    log_report(report)
    return CompiledModel(executable, lowered, report, imported.input_shapes, imported.input_dtypes,
                         imported.input_names, device=tvm.device(machine.tvm_target["kind"]) if gpu else None,
                         target=machine, threads=threads,
                         source=os.fspath(model) if isinstance(model, (str, os.PathLike)) else None)


def pipeline(options: BuildOptions | None = None, **keywords: Any) -> tvm.ir.transform.Pass:
    """alt-tvm's build as a Relax pipeline, for ``tvm.compile`` on a module from any frontend::

        executable = tvm.compile(mod, target=host().to_tvm(), relax_pipeline=alt_tvm.pipeline(records=log),
                                 tir_pipeline=alt_tvm.lowering.PIPELINE)

    (``tir_pipeline`` keeps the kernels' small buffers on the stack, as :func:`build` does:
    :mod:`alt_tvm.lowering`.) It is what :func:`build` runs between import and code
    generation (:func:`alt_tvm.graph.lower.lower`), then TVM's default Relax pipeline. So the
    executable equals ``build``'s, except that ``build`` also rebuilds without a kernel that
    fails to compile, which one pass cannot. Weights must be constants in ``mod``
    (``relax.frontend.detach_params`` + ``bind_params``, or ``keep_params_as_input=False``).
    The build summary goes to the ``alt_tvm`` logger. ``options`` and ``keywords`` are
    :func:`build`'s.
    """
    options = build_options(options, caller="pipeline", **keywords)

    def transform(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        alt_pass = AltLayoutPass(options)
        lowered = lower(mod, alt_pass)
        log_report(alt_pass.report)
        return lowered

    tvm_target = options.target.to_tvm()
    rest = relax.get_default_pipeline(tvm_target) if is_gpu(tvm_target) else relax.get_pipeline("default")
    return tvm.ir.transform.Sequential([tvm.ir.transform.module_pass(transform, opt_level=0, name="AltTvm"), rest],
                                       name="alt_tvm.pipeline")


def _uncompilable_partitions(mod: tvm.IRModule, report: BuildReport, target: Any) -> dict[str, str]:
    """Workload key -> the compiler's error, for each partition kernel that fails to compile alone."""
    failing = {}
    for kernel in report.kernels:
        if kernel.kind != "partition" or not kernel.workload or kernel.workload in failing:
            continue
        gvar = next((g for g in mod.get_global_vars() if g.name_hint == kernel.name), None)
        if gvar is None or not isinstance(mod[gvar], tvm.tirx.PrimFunc):
            continue
        try:
            lowering.compile(tvm.IRModule({"main": mod[gvar].with_attr("global_symbol", "main")}), target=target)
        except Exception as err:  # noqa: BLE001 - the error becomes the partition's fallback reason
            lines = [line.strip() for line in str(err).splitlines() if len(line.strip()) > 3]
            message = next((line for line in lines if "rror" in line), lines[-1] if lines else "")[:200]
            failing[kernel.workload] = f"its kernel {kernel.name} does not compile: {type(err).__name__}: {message}"
    return failing
