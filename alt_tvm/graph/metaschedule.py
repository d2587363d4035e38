"""TVM MetaSchedule (the successor of Ansor) as a tuned baseline, for kernels and whole models.

Two things make MetaSchedule usable on a small CPU box, both about TVM 0.27's defaults:

* its default builder imports ``tvm.s_tir.tensor_intrin`` in every (single-use) worker,
  which takes ~65 s here, so with the 30 s build timeout *every* candidate fails with
  "Timeout". :func:`build_candidate` builds without that import (FP32 LLVM kernels use no
  tensor intrinsic) and is what our builder runs;
* ``TuneContext`` imports the intrinsics once in the main process (~65 s): that one-time
  cost is reported separately from tuning time (``import_s``), not hidden.

A "trial" here is one candidate measured on the machine, the unit alt-tvm's budgets use.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import tvm

__all__ = ["MSResult", "build_candidate", "tune_kernel", "tune_model"]


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> Any:
    """MetaSchedule's default build, minus the ~65 s tensor-intrinsic import (see module doc)."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    from tvm.driver import build

    return build(mod, target=target)


@dataclass(frozen=True)
class MSResult:
    """What a MetaSchedule run produced.

    ``artifact`` is the scheduled ``IRModule`` (kernel) or the compiled ``Executable``
    (model); ``tune_s`` the wall-clock time of the search (building + measuring);
    ``import_s`` the one-time intrinsic import it paid first.
    """

    artifact: Any
    trials: int
    tune_s: float
    import_s: float


def _check_trials(trials: int) -> int:
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}")
    return trials


def _import_intrinsics() -> float:
    start = time.perf_counter()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (TuneContext needs them; do it once, timed)

    return time.perf_counter() - start


def _builder_runner(*, number: int, repeat: int, timeout_s: float) -> tuple[Any, Any]:
    from tvm.s_tir import meta_schedule as ms

    builder = ms.builder.LocalBuilder(f_build=build_candidate, max_workers=1, timeout_sec=timeout_s)
    runner = ms.runner.LocalRunner(
        evaluator_config=ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=0,
                                                   enable_cpu_cache_flush=False),
        timeout_sec=timeout_s)
    return builder, runner


def tune_kernel(func: tvm.tirx.PrimFunc, *, target: tvm.target.Target, trials: int, seed: int = 0,
                work_dir: str | os.PathLike[str] | None = None, per_iter: int = 16, number: int = 3,
                repeat: int = 3, timeout_s: float = 60.0) -> MSResult:
    """Tune one TE/TIR kernel with MetaSchedule, ``trials`` measured candidates at most.

    Returns
    -------
    MSResult
        ``artifact`` is the best scheduled ``IRModule``, or None if no candidate built
        and ran (MetaSchedule then has nothing to apply).
    """
    from tvm.s_tir import meta_schedule as ms

    trials = _check_trials(trials)
    import_s = _import_intrinsics()
    builder, runner = _builder_runner(number=number, repeat=repeat, timeout_s=timeout_s)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tempfile.TemporaryDirectory() as scratch:
        work = str(work_dir) if work_dir is not None else scratch
        start = time.perf_counter()
        database = ms.tune_tir(mod, target, work_dir=work, max_trials_global=trials,
                               num_trials_per_iter=min(per_iter, trials), builder=builder, runner=runner,
                               seed=seed)
        tune_s = time.perf_counter() - start
        schedule = ms.tir_integration.compile_tir(database, mod, target)
    return MSResult(schedule.mod if schedule is not None else None, trials, tune_s, import_s)


def tune_model(mod: tvm.IRModule, *, target: tvm.target.Target, trials: int, seed: int = 0,
               work_dir: str | os.PathLike[str] | None = None, per_iter: int | None = None, number: int = 3,
               repeat: int = 3, timeout_s: float = 60.0) -> MSResult:
    """Tune every fused kernel of a Relax model (``trials`` in total) and compile it.

    ``mod`` is the model after :func:`alt_tvm.graph.build.prepare` (operators decomposed,
    constants folded); TVM's CPU pipeline legalizes and fuses it, MetaSchedule tunes the
    fused kernels and the compiled ``Executable`` applies the best schedule of each.
    ``per_iter`` (candidates measured per task per round) defaults to what lets every
    task get a round within ``trials`` (1..16): MetaSchedule's task scheduler warms every
    task up with one round first, and a kernel it never reaches stays unscheduled.
    """
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    trials = _check_trials(trials)
    import_s = _import_intrinsics()
    builder, runner = _builder_runner(number=number, repeat=repeat, timeout_s=timeout_s)
    with tempfile.TemporaryDirectory() as scratch:
        work = str(work_dir) if work_dir is not None else scratch
        start = time.perf_counter()
        fused = _fuse(mod, target)
        if per_iter is None:
            tasks = ms.relax_integration.extract_tasks(fused, target)
            per_iter = max(1, min(16, trials // max(1, len(tasks))))
        database = ms.relax_integration.tune_relax(
            mod=fused, params={}, target=target, work_dir=work, max_trials_global=trials,
            num_trials_per_iter=min(per_iter, trials), builder=builder, runner=runner, seed=seed)
        tune_s = time.perf_counter() - start
        with target, database, tvm.transform.PassContext(opt_level=3):
            applied = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(fused)
        executable = tvm.compile(applied, target=target)
    return MSResult(executable, trials, tune_s, import_s)


def _fuse(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's "zero" pipeline (legalize, fold, fuse): the fused kernels are MetaSchedule's tasks."""
    from tvm import relax

    with target, tvm.transform.PassContext(opt_level=3):
        return relax.get_pipeline("zero")(mod)
