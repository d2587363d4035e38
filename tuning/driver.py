"""Tune a list of tasks: spread the budget, write records, resume, re-validate, plot.

Tasks are tuned in topological order, each with its own seed (``seed + task index``).
Every measurement is appended to the log as soon as it finishes, so an interrupted run
loses nothing it finished, and ``resume=True`` skips what the log already holds. A
measurement that failed transiently (a lost board or connection:
:func:`~alt_tvm.tuning.measure.is_transient`) is not final: it is made once more in the
same run, and again by a resumed run.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alt_tvm.records import RecordWriter, TuningRecord, candidate_key, iter_records, target_key

from .measure.base import classify_exception, is_transient
from .task import Task, measure_in_process
from .tuner import Trial, TuneConfig, Tuner, TuneResult, point_key

MeasureFn = Callable[[Task, dict[str, Any]], float]


class BudgetError(ValueError):
    """``trials`` is too small for the tasks (each needs at least 2)."""


@dataclass
class TaskSummary:
    """The outcome of tuning one task.

    Attributes
    ----------
    key
        The task's workload key.
    weight
        How often the task occurs in the model.
    trials
        Measurements that count towards the task's share of ``trials``, as the log holds
        them after this run (made now or, on resume, by earlier runs): each candidate the
        search visited counts once, whether it ran or failed for a reason of its own, and
        each re-validation measurement counts once. Transient failures
        (:func:`~alt_tvm.tuning.measure.is_transient`) do not count: see ``pending``.
        ``trials + pending`` equals the task's share unless the space ran out of
        candidates or too few candidates succeeded to re-validate.
    default_ms
        Latency of the untuned point (``inf`` if it failed).
    best_ms
        The lowest median over the re-validated finalists (the one
        :func:`alt_tvm.records.choose_best` applies), else the lowest single measurement;
        ``inf`` if no candidate was measured successfully.
    pending
        Measurements still owed because their last attempt failed transiently (e.g. the
        RPC server died): a run with ``resume=True`` makes them.
    error
        If no candidate was measured successfully, the last failure (``"CODE: message"``);
        else ``""``.
    """

    key: str
    weight: int
    trials: int
    default_ms: float
    best_ms: float
    pending: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        """True if at least one candidate was measured successfully."""
        return math.isfinite(self.best_ms)


def split_budget(tasks: Sequence[Task], trials: int) -> list[int]:
    """Trials per task, proportional to how often the task occurs, at least 2 each.

    Raises
    ------
    BudgetError
        If ``trials`` is below 2 per task.
    """
    if trials < 2 * len(tasks):
        raise BudgetError(f"trials={trials} is too small for {len(tasks)} tasks: give at least {2 * len(tasks)}")
    weights = [t.weight for t in tasks]
    total = sum(weights)
    shares = [max(2, int(trials * w / total)) for w in weights]
    shares[0] += trials - sum(shares)  # rounding goes to the first task (usually the largest map)
    return shares


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_options(*, trials: int, seed: int = 0, joint_fraction: float = 0.3, batch: int = 128, top_k: int = 8,
                  revalidate: int = 3, revalidate_rounds: int = 2, features: str = "tir",
                  num_tasks: int | None = None, log: Any = "", measure: Any = None) -> None:
    """Raise if an option of :func:`tune_tasks` is invalid (cheap: call it before extracting tasks).

    Parameters
    ----------
    trials, seed, joint_fraction, batch, top_k, revalidate, revalidate_rounds, features, log, measure
        As for :func:`tune_tasks` (``log`` and ``measure`` are checked for their type only).
    num_tasks
        The number of tasks, if known: ``trials`` must be at least twice that.

    Raises
    ------
    TypeError
        For a value of the wrong type (e.g. ``trials="4"`` or ``trials=True``).
    ValueError
        For a value out of range; :class:`BudgetError` if ``trials`` is too small.
    """
    _check_int("trials", trials, 2)
    if num_tasks is not None and trials < 2 * num_tasks:
        raise BudgetError(f"trials={trials} is too small for {num_tasks} tasks: give at least {2 * num_tasks}")
    _check_int("seed", seed, 0)
    if isinstance(joint_fraction, bool) or not isinstance(joint_fraction, numbers.Real):
        raise TypeError(f"joint_fraction must be a number in [0, 1], got {joint_fraction!r} "
                        f"of type {type(joint_fraction).__name__}")
    if not 0.0 <= joint_fraction <= 1.0:  # NaN fails too
        raise ValueError(f"joint_fraction must be a number in [0, 1], got {joint_fraction!r}")
    _check_int("batch", batch, 1)
    _check_int("top_k", top_k, 1)
    _check_int("revalidate", revalidate, 0)
    _check_int("revalidate_rounds", revalidate_rounds, 0)
    if features not in ("tir", "knobs"):
        raise ValueError(f"features must be 'tir' or 'knobs', got {features!r}")
    if not isinstance(log, str | os.PathLike):
        raise TypeError(f"log must be the path of a JSON-lines file, got {type(log).__name__} {log!r}")
    if measure is not None and not callable(measure):
        raise TypeError(f"measure must be None or a function (task, params) -> ms, got {type(measure).__name__}")


def _trial_record(workload_key: str, target_json: str, trial: Trial, latency: float, error_code: str | None,
                  error: str, *, seed: int, strategy: str, revalidation: bool = False) -> TuningRecord:
    """The log line of one measurement of ``trial``'s candidate (a failure when ``error_code`` is set)."""
    candidate = {"layout": trial.layout, "loop": trial.loop, "params": trial.params, "strategy": strategy}
    if revalidation:
        candidate["revalidation"] = True
    ok = error_code is None
    return TuningRecord(workload_key=workload_key, target=target_json, candidate=candidate,
                        latencies_ms=(latency,) if ok else (), error_code=error_code,
                        error_msg="" if ok else error, trial=trial.index, seed=seed, board=trial.board,
                        build_s=trial.build_s, run_s=trial.run_s)


def _measure_once(measure: MeasureFn, task: Task, trial: Trial) -> tuple[Trial, float, str | None, str]:
    """One more measurement of ``trial``'s candidate: (the trial as measured, latency, error code or None, message).

    A batched measure reports where and how long it measured; the returned trial carries that.
    """
    batched = getattr(measure, "measure_batch", None)
    if batched is not None:
        ((_, outcome),) = list(batched(task, [trial.params]))
        where = dataclasses.replace(trial, board=outcome.board, build_s=outcome.build_s, run_s=outcome.run_s)
        return where, outcome.latency_ms, outcome.error_code, outcome.error_msg
    try:
        latency = float(measure(task, trial.params))
    except Exception as err:  # noqa: BLE001 - a failing candidate is data, not a crash of the run
        code, message = classify_exception(err)
        return trial, math.inf, code.name, message
    if not math.isfinite(latency):
        return trial, math.inf, "RUN_ERROR", f"the measure function returned {latency}"
    return trial, latency, None, ""


def _transient(record: TuningRecord) -> bool:
    return not record.ok and is_transient(record.error_code, record.error_msg)


def _outcome(records: Sequence[TuningRecord]) -> TuningRecord:
    """What a candidate's measurements amount to: its first success, else its last failure."""
    return next((r for r in records if r.ok), records[-1])


class _History:
    """One task's records (from the log and this run), per search point and per re-validated candidate."""

    def __init__(self, records: Sequence[TuningRecord]) -> None:
        self.search: dict[str, list[TuningRecord]] = {}  # point_key -> records, in log order
        self.revalidation: dict[str, list[TuningRecord]] = {}  # candidate_key(params) -> records
        for record in records:
            self.add(record)

    def add(self, record: TuningRecord) -> None:
        candidate = record.candidate
        if candidate.get("revalidation"):
            if "params" in candidate:
                self.revalidation.setdefault(candidate_key(candidate["params"]), []).append(record)
        elif "layout" in candidate and "loop" in candidate:
            self.search.setdefault(point_key(candidate["layout"], candidate["loop"]), []).append(record)


def _revalidate(task: Task, trials: Sequence[Trial], *, count: int, rounds: int, history: _History,
                measure: MeasureFn, write: Callable[[Trial, float, str | None, str], TuningRecord]
                ) -> tuple[float, int, int]:
    """Measure the ``count`` fastest distinct candidates until each has ``rounds`` more measurements.

    Single measurements on a shared machine swing by tens of percent, so the fastest one
    is often a lucky draw; the median over the rounds decides. Measurements are
    interleaved; those already in the log count (a resumed run makes only the missing
    ones), and candidates a previous run re-validated stay finalists. A transient failure
    does not count and is measured once more. Returns the best median, the measurements
    that count and those still missing.
    """
    fastest: dict[str, Trial] = {}
    for trial in sorted((t for t in trials if math.isfinite(t.latency_ms)), key=lambda t: t.latency_ms):
        fastest.setdefault(candidate_key(trial.params), trial)
    done = {key: [r for r in history.revalidation.get(key, []) if not _transient(r)] for key in fastest}
    finalists = [key for key in fastest if done[key]][:count]
    finalists += [key for key in fastest if not done[key]][: count - len(finalists)]
    finalists.sort(key=lambda key: fastest[key].latency_ms)
    samples = {key: [fastest[key].latency_ms] + [r.median_ms for r in done[key]] for key in finalists}
    missing = {key: max(0, rounds - len(done[key])) for key in finalists}
    for _attempt in range(2):  # the second pass retries transient failures once
        todo = dict(missing)
        while any(todo.values()):
            for key in finalists:
                if not todo[key]:
                    continue
                todo[key] -= 1
                measured, latency, code, message = _measure_once(measure, task, fastest[key])
                if not _transient(write(measured, latency, code, message)):
                    missing[key] -= 1
                    samples[key].append(latency)
    medians = [float(np.median(v)) for v in samples.values()]
    counted = sum(len(v) - 1 for v in samples.values())
    return min(medians, default=math.inf), counted, sum(missing.values())


def tune_tasks(tasks: Sequence[Task], *, trials: int, log: str | os.PathLike[str], seed: int = 0,
               joint_fraction: float = 0.3, resume: bool = True, measure: MeasureFn | None = None,
               cost_model: Any = "xgb", progress: bool = True, plot: str | os.PathLike[str] | None = None,
               features: str = "tir", batch: int = 128, top_k: int = 8, revalidate: int = 3,
               revalidate_rounds: int = 2) -> list[TaskSummary]:
    """Tune ``tasks`` (all for one target) and append every measurement to ``log``.

    Parameters
    ----------
    tasks
        The tasks, e.g. from :func:`alt_tvm.integration.extract_tasks`; records are keyed
        by ``task.key`` and ``task.target``.
    trials
        Total measurements, spread over the tasks (an int, at least 2 per task).
    log
        JSON-lines tuning log (appended to; ``alt_tvm.build(..., records=log)`` applies it).
    seed
        Seed of the search (an int >= 0); task ``i`` uses ``seed + i``.
    joint_fraction
        Share of each task's search in the joint layout+loop stage, in [0, 1].
    resume
        Reuse the log's measurements of the same target instead of measuring them again;
        transient failures among them (:func:`~alt_tvm.tuning.measure.is_transient`) are
        measured again, and missing re-validation measurements are made.
    measure
        ``measure(task, params) -> ms``; default: build and time in this process. A
        failure raises (``RuntimeError("<ErrorCode name>: ...")`` gives its code; an
        ``OSError`` is transient, see :func:`~alt_tvm.tuning.measure.classify_exception`)
        or returns ``inf``. A measure with a ``measure_batch`` method
        (:class:`~alt_tvm.tuning.fleet.PipelinedMeasure`) gets each loop round's ``top_k``
        candidates as one batch, built and run in parallel, each logged as it finishes.
    cost_model
        ``"xgb"`` (XGBoost on the candidates' parameters), None, or an object with
        ``update`` and ``predict``.
    plot
        Write a PNG of the tuning curves (best latency so far per task) here.
    features
        What the cost model learns from: ``"tir"`` (features of each candidate's lowered
        TIR: loops, annotations, access strides, arithmetic; ~0.1 s per candidate to
        lower) or ``"knobs"`` (the candidate's parameters; free).
    batch, top_k
        Candidates ranked by the cost model per loop round, and how many of them are
        measured (ints >= 1).
    revalidate, revalidate_rounds
        After each task, its ``revalidate`` fastest candidates are measured
        ``revalidate_rounds`` more times, interleaved, and the best record is chosen by the
        median (:func:`alt_tvm.records.choose_best`). These measurements count towards
        ``trials`` (at most a quarter of a task's budget: fewer finalists, or none, on small
        budgets) and are logged as records whose candidate has ``"revalidation": true``.
        0 turns it off.

    Returns
    -------
    list of TaskSummary
        One per task, in order. A task whose candidates all failed is reported
        (``ok`` False, ``error`` the last failure), not raised, so the others stay usable.

    Raises
    ------
    TypeError, ValueError
        For an invalid option (:func:`check_options`), no tasks, or tasks for several targets.
    """
    check_options(trials=trials, seed=seed, joint_fraction=joint_fraction, batch=batch, top_k=top_k,
                  revalidate=revalidate, revalidate_rounds=revalidate_rounds, features=features,
                  num_tasks=len(tasks), log=log, measure=measure)
    if not tasks:
        raise ValueError("no tasks to tune: the model has no partition a tunable strategy implements")
    targets = {target_key(task.target.to_tvm()) for task in tasks}
    if len(targets) != 1:
        raise ValueError(f"tasks for {len(targets)} different targets; tune one target at a time")
    from tqdm import tqdm

    (target_json,) = targets
    trials, seed, batch, top_k = int(trials), int(seed), int(batch), int(top_k)
    revalidate, revalidate_rounds = int(revalidate), int(revalidate_rounds)
    budgets = split_budget(tasks, trials)
    measure = measure or (lambda task, params: measure_in_process(task, params))
    batched = getattr(measure, "measure_batch", None)
    previous = list(iter_records(log)) if resume and os.path.exists(log) else []
    summaries, curves = [], []
    with RecordWriter(log) as writer:
        for index, (task, budget) in enumerate(zip(tasks, budgets)):
            history = _History([r for r in previous if r.workload_key == task.key and r.target == target_json])
            # What the search saw at each point (its first record), so a resumed search replays it.
            known = {key: records[0].median_ms for key, records in history.search.items()}
            bar = tqdm(total=budget, desc=f"task {index + 1}/{len(tasks)} {task.key.split('|')[0]}",
                       disable=not progress, leave=False)

            def write(trial: Trial, latency: float, code: str | None, message: str, revalidation: bool = False,
                      task: Task = task, index: int = index, history: _History = history) -> TuningRecord:
                record = _trial_record(task.key, target_json, trial, latency, code, message, seed=seed + index,
                                       strategy=task.strategy.name, revalidation=revalidation)
                writer.write(record)
                history.add(record)
                return record

            best_so_far = [math.inf]

            def on_trial(trial: Trial, bar: Any = bar, best_so_far: list = best_so_far, known: dict = known,
                         write: Callable = write) -> None:
                if point_key(trial.layout, trial.loop) not in known:  # else already in the log
                    for lost in trial.retried:  # a board lost while measuring it: logged as the transient failure
                        write(dataclasses.replace(trial, board=lost.board, build_s=lost.build_s, run_s=lost.run_s),
                              math.inf, lost.error_code, lost.error_msg)
                    write(trial, trial.latency_ms, trial.error_code, trial.error or "")
                best_so_far[0] = min(best_so_far[0], trial.latency_ms)
                bar.update(1)
                bar.set_postfix(best_ms=f"{best_so_far[0]:.3f}")

            finalists = min(revalidate, budget // 4 // revalidate_rounds) if revalidate_rounds else 0
            search = budget - finalists * revalidate_rounds
            config = TuneConfig(trials=search, joint_fraction=joint_fraction, seed=seed + index,
                                batch=batch, top_k=min(top_k, search, batch))
            model_ = _cost_model(cost_model, seed + index)
            featurize = tir_featurizer(task) if features == "tir" and model_ is not None else None
            batch_fn = None if batched is None else lambda ps, task=task, b=batched: b(task, ps)
            result = Tuner(task.space, measure=lambda p, task=task: measure(task, p), config=config,
                           cost_model=model_, known=known, on_trial=on_trial, featurize=featurize,
                           measure_batch=batch_fn).run()
            points = [point_key(t.layout, t.loop) for t in result.trials]
            for trial, key in zip(result.trials, points):  # transient failures: once more
                if _transient(_outcome(history.search[key])):
                    write(*_measure_once(measure, task, trial))
            for trial, key in zip(result.trials, points):  # each point as all its records say
                outcome = _outcome(history.search[key])
                trial.latency_ms = outcome.median_ms
                trial.error_code = outcome.error_code
                trial.error = None if outcome.ok else outcome.error_msg
            pending = sum(_transient(_outcome(history.search[key])) for key in points)
            counted = len(points) - pending
            best = result.best
            best_ms = best.latency_ms if best else math.inf
            if finalists and best is not None:
                median, done, missing = _revalidate(
                    task, result.trials, count=finalists, rounds=revalidate_rounds, history=history,
                    measure=measure, write=lambda *a, write=write: write(*a, revalidation=True))
                best_ms = median if math.isfinite(median) else best_ms
                counted += done
                pending += missing
                bar.update(done)
            bar.close()
            last = result.trials[-1]
            error = "" if best is not None else f"{last.error_code}: {last.error}"
            summaries.append(TaskSummary(task.key, task.weight, counted, result.trials[0].latency_ms, best_ms,
                                         pending=pending, error=error))
            curves.append(result)
    if plot is not None:
        plot_curves(curves, [s.key.split("|")[0] + f" #{i + 1}" for i, s in enumerate(summaries)], plot)
    return summaries


def tir_featurizer(task: Task) -> Callable[[dict[str, Any]], np.ndarray]:
    """``params -> features of the lowered TIR`` for ``task``, cached per candidate.

    A candidate that fails to lower gets all-NaN features (XGBoost treats them as missing);
    its measurement then records the error.
    """
    from .features import extract_features, feature_names

    cache: dict[str, np.ndarray] = {}
    width = len(feature_names())

    def featurize(params: dict[str, Any]) -> np.ndarray:
        key = candidate_key(params)
        if key not in cache:
            try:
                cache[key] = extract_features(task.lower(params).func)
            except Exception:  # noqa: BLE001 - a bad candidate is data for the search, not a crash
                cache[key] = np.full(width, np.nan)
        return cache[key]
    return featurize


def _cost_model(spec: Any, seed: int) -> Any:
    if spec is None or not isinstance(spec, str):
        return spec
    if spec != "xgb":
        raise ValueError(f"cost_model must be 'xgb', None or a model object, got {spec!r}")
    from .cost_model import XGBCostModel

    return XGBCostModel(seed=seed)


def plot_curves(results: Sequence[TuneResult], labels: Sequence[str], path: str | os.PathLike[str]) -> None:
    """PNG of best-latency-so-far against trials, one line per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for result, label in zip(results, labels):
        best, curve = math.inf, []
        for trial in result.trials:
            best = min(best, trial.latency_ms)
            curve.append(best)
        ax.plot(range(1, len(curve) + 1), curve, label=label)
    ax.set_xlabel("measured trials")
    ax.set_ylabel("best latency so far (ms)")
    ax.set_title("alt-tvm tuning curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
