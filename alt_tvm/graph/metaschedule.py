"""TVM MetaSchedule (the successor of Ansor) as a tuned baseline, for kernels and whole models.

Two things make MetaSchedule usable on a small CPU box, both about TVM 0.27's defaults:

* its default builder imports ``tvm.s_tir.tensor_intrin`` in every (single-use) worker,
  which takes ~65 s here, so with the 30 s build timeout *every* candidate fails with
  "Timeout". :func:`build_candidate` builds without that import (FP32 LLVM kernels use no
  tensor intrinsic) and is what our builder runs;
* ``TuneContext`` imports the intrinsics once in the main process (~65 s): that one-time
  cost is reported separately from tuning time (``import_s``), not hidden.

A "trial" here is one candidate measured on the machine, the unit alt-tvm's budgets use.
When no candidate builds and runs, MetaSchedule only writes why to its task logs;
:func:`tune_kernel` reads the first such error back (:func:`first_candidate_error`) so a
failed baseline says why.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

__all__ = ["MSResult", "build_candidate", "first_candidate_error", "tune_kernel", "tune_model"]


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
    ``import_s`` the one-time intrinsic import it paid first; ``error``, when a kernel's
    ``artifact`` is None, why (the first candidate error MetaSchedule logged).
    """

    artifact: Any
    trials: int
    tune_s: float
    import_s: float
    error: str | None = None


def _check_trials(trials: int) -> int:
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}")
    return trials


def _import_intrinsics() -> float:
    start = time.perf_counter()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (TuneContext needs them; do it once, timed)

    return time.perf_counter() - start


def _builder_runner(*, number: int, repeat: int, timeout_s: float, build_workers: int = 1) -> tuple[Any, Any]:
    from tvm.s_tir import meta_schedule as ms

    if isinstance(build_workers, bool) or not isinstance(build_workers, int) or build_workers < 1:
        raise ValueError(f"build_workers must be a positive int, got {build_workers!r}")
    builder = ms.builder.LocalBuilder(f_build=build_candidate, max_workers=build_workers, timeout_sec=timeout_s)
    runner = ms.runner.LocalRunner(
        evaluator_config=ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=0,
                                                   enable_cpu_cache_flush=False),
        timeout_sec=timeout_s)
    return builder, runner


def tune_kernel(func: tvm.tirx.PrimFunc, *, target: tvm.target.Target, trials: int, seed: int = 0,
                work_dir: str | os.PathLike[str] | None = None, per_iter: int = 16, number: int = 3,
                repeat: int = 3, timeout_s: float = 60.0, build_workers: int = 1) -> MSResult:
    """Tune one TE/TIR kernel with MetaSchedule, ``trials`` measured candidates at most.

    ``build_workers`` candidates are compiled at once (1 on a CPU target, where builds
    would disturb the timings; a GPU target's runs do not share the host's cores).

    Returns
    -------
    MSResult
        ``artifact`` is the best scheduled ``IRModule``, or None if no candidate built
        and ran (MetaSchedule then has nothing to apply); ``error`` then says why.
    """
    from tvm.s_tir import meta_schedule as ms

    trials = _check_trials(trials)
    import_s = _import_intrinsics()
    builder, runner = _builder_runner(number=number, repeat=repeat, timeout_s=timeout_s, build_workers=build_workers)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tempfile.TemporaryDirectory() as scratch:
        work = str(work_dir) if work_dir is not None else scratch
        start = time.perf_counter()
        database = ms.tune_tir(mod, target, work_dir=work, max_trials_global=trials,
                               num_trials_per_iter=min(per_iter, trials), builder=builder, runner=runner,
                               seed=seed)
        tune_s = time.perf_counter() - start
        schedule = ms.tir_integration.compile_tir(database, mod, target)
        error = None
        if schedule is None:  # read the logs before a scratch work_dir goes away
            error = first_candidate_error(work) or f"no candidate of {trials} built and ran (no error logged)"
    return MSResult(schedule.mod if schedule is not None else None, trials, tune_s, import_s, error)


# MetaSchedule's task log: "[Task #0: main] Trial #3: Error in building:" then the message
# (a traceback, or e.g. "LocalBuilder: Timeout, killed after 30 seconds"), then the candidate's script.
_TRIAL_ERROR = re.compile(r"Trial #\d+: Error in (building|running):\s*$")
_LOG_LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} \[")


def first_candidate_error(work_dir: str | os.PathLike[str]) -> str | None:
    """The first candidate failure in a MetaSchedule ``work_dir``'s task logs, one line.

    Parameters
    ----------
    work_dir : str or os.PathLike
        The ``work_dir`` a tuning run wrote (its ``logs/*.log``).

    Returns
    -------
    str or None
        ``"building failed: <exception line>"`` (or ``running``): the exception a
        traceback ends with, else the first line of the message; None if no candidate
        failure was logged.
    """
    for log in sorted(Path(work_dir, "logs").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            match = _TRIAL_ERROR.search(line)
            if match is None:
                continue
            block = []
            for text in lines[i + 1:]:
                if _LOG_LINE.match(text) or text.startswith("# from tvm.script"):
                    break  # the next log record, or the failed candidate's TVMScript
                block.append(text)
            return f"{match.group(1)} failed: {_exception_line(block)}"
    return None


def _exception_line(block: list[str]) -> str:
    """The exception a traceback in ``block`` ends with, else its first non-empty line."""
    starts = [i for i, text in enumerate(block) if text.startswith("Traceback")]
    if starts:
        for text in block[starts[-1] + 1:]:
            if text.strip() and not text[0].isspace():
                return text.strip()
    return next((text.strip() for text in block if text.strip()), "(empty message)")


def tune_model(mod: tvm.IRModule, *, target: tvm.target.Target, trials: int, seed: int = 0,
               work_dir: str | os.PathLike[str] | None = None, per_iter: int | None = None, number: int = 3,
               repeat: int = 3, timeout_s: float = 60.0) -> MSResult:
    """Tune every fused kernel of a Relax model (``trials`` in total) and compile it.

    ``mod`` is the model after :func:`alt_tvm.graph.prepare.prepare` (operators decomposed,
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
