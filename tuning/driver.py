"""Tune a list of tasks: spread the budget, write records, resume, re-validate, plot.

Tasks are tuned in topological order, each with its own seed (``seed + task index``).
Every measurement is appended to the log as soon as it finishes, so an interrupted run
loses nothing it finished, and ``resume=True`` skips what the log already holds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alt_tvm.records import RecordWriter, TuningRecord, candidate_key, iter_records, target_key

from .task import Task, measure_in_process
from .tuner import Trial, TuneConfig, Tuner, TuneResult, point_key


@dataclass
class TaskSummary:
    key: str
    weight: int
    trials: int
    default_ms: float
    best_ms: float


def split_budget(tasks: Sequence[Task], trials: int) -> list[int]:
    """Trials per task, proportional to how often the task occurs, at least 2 each."""
    if trials < 2 * len(tasks):
        raise ValueError(f"trials={trials} is too small for {len(tasks)} tasks: give at least {2 * len(tasks)}")
    weights = [t.weight for t in tasks]
    total = sum(weights)
    shares = [max(2, int(trials * w / total)) for w in weights]
    shares[0] += trials - sum(shares)  # rounding goes to the first task (usually the largest map)
    return shares


def _trial_record(workload_key: str, target_json: str, trial: Trial, latency: float, error: str, *, seed: int,
                  revalidation: bool = False) -> TuningRecord:
    """The log line of one measurement of ``trial``'s candidate (a failure when ``latency`` is inf)."""
    ok = math.isfinite(latency)
    candidate = {"layout": trial.layout, "loop": trial.loop, "params": trial.params}
    if revalidation:
        candidate["revalidation"] = True
    return TuningRecord(workload_key=workload_key, target=target_json, candidate=candidate,
                        latencies_ms=(latency,) if ok else (), error_code=None if ok else "RUN_ERROR",
                        error_msg="" if ok else error, trial=trial.index, seed=seed)


def _revalidate(task: Task, trials: Sequence[Trial], *, count: int, rounds: int,
                measure: Callable[[Task, dict[str, Any]], float], write: Callable[[Trial, float, str], None]) -> float:
    """Measure the ``count`` fastest distinct candidates ``rounds`` more times, interleaved.

    Single measurements on a shared machine swing by tens of percent, so the fastest one
    is often a lucky draw; the median over the rounds decides. Returns the best median.
    """
    finished = sorted((t for t in trials if math.isfinite(t.latency_ms)), key=lambda t: t.latency_ms)
    finalists, seen = [], set()
    for trial in finished:
        key = candidate_key(trial.params)
        if key not in seen:
            seen.add(key)
            finalists.append(trial)
        if len(finalists) == count:
            break
    samples = {id(t): [t.latency_ms] for t in finalists}
    for _ in range(rounds):
        for trial in finalists:
            try:
                latency, error = float(measure(task, trial.params)), ""
            except Exception as err:  # a failing re-measurement drops the candidate, not the run
                latency, error = math.inf, f"{type(err).__name__}: {err}"
            write(trial, latency, error)
            samples[id(trial)].append(latency)
    medians = [float(np.median(v)) for v in samples.values()]
    return min(medians, default=math.inf)


def tune_tasks(tasks: Sequence[Task], *, trials: int, log: str | os.PathLike[str], seed: int = 0,
               joint_fraction: float = 0.3, resume: bool = True,
               measure: Callable[[Task, dict[str, Any]], float] | None = None, cost_model: Any = "xgb",
               progress: bool = True, plot: str | os.PathLike[str] | None = None, features: str = "tir",
               batch: int = 128, top_k: int = 8, revalidate: int = 3,
               revalidate_rounds: int = 2) -> list[TaskSummary]:
    """Tune ``tasks`` (all for one target) and append every measurement to ``log``.

    Parameters
    ----------
    tasks
        The tasks, e.g. from :func:`alt_tvm.integration.extract_tasks`; records are keyed
        by ``task.key`` and ``task.target``.
    trials
        Total measured candidates, spread over the tasks.
    log
        JSON-lines tuning log (appended to; ``alt_tvm.build(..., records=log)`` applies it).
    resume
        Reuse the log's measurements of the same target instead of measuring them again.
    measure
        ``measure(task, params) -> ms``; default: build and time in this process.
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
        Candidates ranked by the cost model per loop round, and how many of them are measured.
    revalidate, revalidate_rounds
        After each task, its ``revalidate`` fastest candidates are measured
        ``revalidate_rounds`` more times, interleaved, and the best record is chosen by the
        median (:func:`alt_tvm.records.choose_best`). These measurements count towards
        ``trials`` (at most a quarter of a task's budget: fewer finalists, or none, on small
        budgets) and are logged as records whose candidate has ``"revalidation": true``.
        0 turns it off.
    """
    if features not in ("tir", "knobs"):
        raise ValueError(f"features must be 'tir' or 'knobs', got {features!r}")
    if revalidate < 0 or revalidate_rounds < 0:
        raise ValueError(f"revalidate and revalidate_rounds must be >= 0, got {revalidate}, {revalidate_rounds}")
    if not tasks:
        raise ValueError("no tasks to tune: the model has no partition a tunable strategy implements")
    targets = {target_key(task.target.to_tvm()) for task in tasks}
    if len(targets) != 1:
        raise ValueError(f"tasks for {len(targets)} different targets; tune one target at a time")
    from tqdm import tqdm

    (target_json,) = targets
    budgets = split_budget(tasks, trials)
    measure = measure or (lambda task, params: measure_in_process(task, params))
    previous = list(iter_records(log)) if resume and os.path.exists(log) else []
    summaries, curves = [], []
    with RecordWriter(log) as writer:
        for index, (task, budget) in enumerate(zip(tasks, budgets)):
            logged = [r for r in previous if r.workload_key == task.key and r.target == target_json]
            known = {point_key(r.candidate["layout"], r.candidate["loop"]): (r.median_ms if r.ok else math.inf)
                     for r in logged  # the search's own draws, so a resumed search replays it
                     if "layout" in r.candidate and not r.candidate.get("revalidation")}
            bar = tqdm(total=budget, desc=f"task {index + 1}/{len(tasks)} {task.key.split('|')[0]}",
                       disable=not progress, leave=False)

            best_so_far = [math.inf]

            def record(trial: Trial, task: Task = task, bar: Any = bar, best_so_far: list = best_so_far,
                       known: dict = known, index: int = index) -> None:
                key = point_key(trial.layout, trial.loop)
                if key not in known:  # already in the log
                    writer.write(_trial_record(task.key, target_json, trial, trial.latency_ms, trial.error or "",
                                               seed=seed + index))
                best_so_far[0] = min(best_so_far[0], trial.latency_ms)
                bar.update(1)
                bar.set_postfix(best_ms=f"{best_so_far[0]:.3f}")

            finalists = min(revalidate, budget // 4 // revalidate_rounds) if revalidate_rounds else 0
            search = budget - finalists * revalidate_rounds
            revalidated_before = any(r.candidate.get("revalidation") for r in logged)
            config = TuneConfig(trials=search, joint_fraction=joint_fraction, seed=seed + index,
                                batch=batch, top_k=min(top_k, search, batch))
            model_ = _cost_model(cost_model, seed + index)
            featurize = tir_featurizer(task) if features == "tir" and model_ is not None else None
            result = Tuner(task.space, measure=lambda p, task=task: measure(task, p), config=config,
                           cost_model=model_, known=known, on_trial=record, featurize=featurize).run()
            best_ms = result.best.latency_ms if result.best else math.inf
            measured = len(result.trials)
            if finalists and not revalidated_before:
                def write(trial: Trial, latency: float, error: str, task: Task = task, index: int = index) -> None:
                    writer.write(_trial_record(task.key, target_json, trial, latency, error, seed=seed + index,
                                               revalidation=True))

                best_ms = _revalidate(task, result.trials, count=finalists, rounds=revalidate_rounds,
                                      measure=measure, write=write)
                bar.update(finalists * revalidate_rounds)
                measured += finalists * revalidate_rounds
            bar.close()
            summaries.append(TaskSummary(task.key, task.weight, measured, result.trials[0].latency_ms,
                                         best_ms))
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
