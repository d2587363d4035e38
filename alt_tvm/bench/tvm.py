"""TVM's own untuned build as a peer: the same Relax module through ``tvm.compile``.

The graph code (the frontend's :class:`~alt_tvm.graph.frontend.ImportedModel`) is imported
only when a build is asked for: importing :mod:`alt_tvm.bench` pulls in no build code.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import tvm
from tvm import relax

from alt_tvm.deploy.model import flatten_outputs
from alt_tvm.native_log import tvm_output_to_log

__all__ = ["Pipeline", "TVMRunner", "tvm_default_build"]

Pipeline = Literal["default", "zero", "cpu"]


class TVMRunner:
    """A compiled Relax module on the CPU through ``relax.VirtualMachine``; call with NumPy arrays.

    Attributes
    ----------
    executable : tvm.runtime.Executable
        What ``tvm.compile`` returned.
    vm : tvm.relax.VirtualMachine
        The virtual machine running ``main``.
    """

    name = "tvm"

    def __init__(self, executable: Any, device: Any | None = None, *, threads: int | None = None) -> None:
        self._threads = threads
        self.device = device if device is not None else tvm.cpu()
        self.executable = executable
        with tvm_output_to_log():
            self.vm = relax.VirtualMachine(executable, self.device)
        self._main = self.vm["main"]

    @property
    def threads(self) -> int:
        """Threads of TVM's pool (read when asked: reading it starts the pool)."""
        if self._threads is None:
            from alt_tvm.deploy.threads import tvm_pool_threads

            self._threads = tvm_pool_threads()
        return self._threads

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        # not np.ascontiguousarray: it turns a 0-d input into shape (1,), which the VM rejects
        tensors = [tvm.runtime.tensor(np.asarray(a, order="C"), self.device) for a in args]
        return flatten_outputs(self._main(*tensors))


def tvm_default_build(mod: Any, target: Any | None = None, *,
                      pipeline: Pipeline = "default") -> TVMRunner:
    """Build a Relax module with TVM's own, untuned flow and return a runner for it.

    Parameters
    ----------
    mod : tvm.IRModule or ImportedModel
        The Relax module (weights bound as constants), e.g. ``load_model(...).mod``.
    target : tvm.target.Target or dict or str, optional
        Compilation target; the host's LLVM target (``alt_tvm.target.host().to_tvm()``) if omitted.
    pipeline : {"default", "zero", "cpu"}
        Which of TVM 0.27's stock Relax pipelines runs before code generation:

        * ``"default"`` -- the untuned default, i.e. exactly ``tvm.compile(mod, target)``:
          ``relax_pipeline="default"`` is ``relax.pipeline.default_build_pipeline()`` on CPU
          targets (DispatchSampling, DispatchSortScan, LegalizeOps, then the VM lowering passes
          RewriteDataflowReshape ... AttachGlobalSymbol), with *no* FoldConstant and *no*
          operator fusion; ``tir_pipeline="default"`` lowers the legalised PrimFuncs with no
          schedule (no parallel loops, no explicit vectorisation).
        * ``"zero"`` -- ``relax.get_pipeline("zero")`` first (LegalizeOps,
          AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR), then ``tvm.compile``: the
          flow that MetaSchedule tuning starts from, untuned.
        * ``"cpu"`` -- ``relax.get_default_pipeline(target)``, the cpu_generic backend pipeline
          (library dispatch, legalize + fold + fuse, lowering) that ``tvm.compile`` uses only
          for GPU targets.

    Returns
    -------
    TVMRunner
        Callable on NumPy arrays returning the outputs as a list of NumPy arrays.
    """
    from alt_tvm.graph.frontend import ImportedModel

    if isinstance(mod, ImportedModel):
        mod = mod.mod
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule or an ImportedModel, got {type(mod).__name__}")
    if target is None:
        from alt_tvm.target import host

        target = host().to_tvm()
    target = tvm.target.Target(target)
    if pipeline not in ("default", "zero", "cpu"):
        raise ValueError(f"pipeline must be 'default', 'zero' or 'cpu', got {pipeline!r}")
    with tvm_output_to_log():
        if pipeline == "default":
            executable = tvm.compile(mod, target)
        elif pipeline == "zero":
            with target:
                mod = relax.get_pipeline("zero")(mod)
            executable = tvm.compile(mod, target)
        else:
            executable = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    return TVMRunner(executable)
