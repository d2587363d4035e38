"""A model built here: a :class:`~alt_tvm.deploy.model.RunnableModel` that also knows the
IRModule it was compiled from and how it was built, and exports itself as an artifact."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi

from alt_tvm.deploy.model import RunnableModel
from alt_tvm.deploy.profile import KernelInfo
from alt_tvm.target import HardwareTarget, host, not_on_host

from .report import BuildReport

__all__ = ["CompiledModel"]


class CompiledModel(RunnableModel):
    """A built model: call it on NumPy arrays; ``report`` says how it was built.

    ``export(path)`` writes it as an artifact that :func:`alt_tvm.load` runs without
    rebuilding, here or (cross-compiled) on a board.
    """

    def __init__(self, executable, mod: tvm.IRModule, report: BuildReport, input_shapes, input_dtypes,
                 input_names, device=None, *, target: HardwareTarget | None = None, source: str | None = None,
                 threads: int | None = None) -> None:
        self.target = target if target is not None else host()
        why = "it needs a cross compiler" if self.target.cross_compiler else not_on_host(self.target.tvm_target)
        not_here = None if why is None else (
            f"this model was built for {self.target.name!r} ({self.target.description}), not for this machine "
            f"({why}): export it (model.export(path)) and run it there with alt_tvm.load, or through a tracker with "
            f"alt_tvm.load(path, remote='host:port', key=...)")
        super().__init__(executable, input_names=input_names, input_shapes=input_shapes, input_dtypes=input_dtypes,
                         device=device, not_here=not_here, threads=threads if not_here is None else None)
        self.mod = mod
        self.report = report
        self.source = source
        self._kernel_info: dict[str, KernelInfo] | None = None
        self._library = None

    def _runtime_module(self):
        """The model's code linked with alt-tvm's parallel launcher, loaded (at the first call)."""
        if self._library is None:
            from alt_tvm.deploy.parallel import link_and_load

            if self._threads is not None and self._threads > 1:
                self._library, launcher = link_and_load(self.executable, threads=self._threads)
                self._use_launcher(launcher)
            else:  # one thread: every launch would run inline anyway
                self._library = self.executable
        return self._library

    def export(self, path: str | os.PathLike) -> Path:
        """Write the model as an artifact directory (see :mod:`alt_tvm.deploy.artifact`).

        Cross-compiled (with the target's gcc) when the model was built for a board.
        Returns the directory.
        """
        from alt_tvm.deploy.artifact import write_artifact

        return write_artifact(path, executable=self.executable, target=self.target, input_names=self.input_names,
                              input_shapes=self.input_shapes, input_dtypes=self.input_dtypes,
                              kernels=self.kernel_info(), report=self.report.summary(), source=self.source)

    def kernel_info(self) -> dict[str, KernelInfo]:
        """Kernel name -> what it computes (operators, output layout, FLOPs, bytes), for
        every PrimFunc of the built module."""
        if self._kernel_info is None:
            emitted = {k.name: k for k in self.report.kernels}
            info = {}
            for gvar in self.mod.get_global_vars():
                func = self.mod[gvar]
                if not isinstance(func, tvm.tirx.PrimFunc):
                    continue
                # The VM reports a kernel by its symbol; a global var may have been renamed apart.
                name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs \
                    else gvar.name_hint
                kernel = emitted.get(name)
                if kernel is not None and kernel.flops is not None:
                    flops = float(kernel.flops)
                else:
                    try:
                        flops = float(tvm.s_tir.analysis.estimate_tir_flops(func.body))
                    except Exception:  # noqa: BLE001 - opaque or extern bodies: rate left at 0
                        flops = 0.0
                buffers = [param.ty for param in func.params if hasattr(param.ty, "shape")]
                size = sum(int(np.prod([int(d) for d in buf.shape])) * tvm.DataType(buf.dtype).bits // 8
                           for buf in buffers if all(hasattr(d, "value") for d in buf.shape))
                digest = f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"
                if kernel is None:
                    fused = self.report.fused.get(name) or self.report.fused.get(gvar.name_hint, "")
                    info[name] = KernelInfo("tvm", (name.removeprefix("fused_").rstrip("0123456789").rstrip("_"),),
                                            "", flops, size, digest, self.report.tuning_of(fused))
                else:
                    tuning = self.report.tuning_of(kernel.workload) if kernel.kind != "conversion" else ""
                    info[name] = KernelInfo(kernel.kind, kernel.ops, kernel.layout, flops, size, digest, tuning)
            self._kernel_info = info
        return self._kernel_info
