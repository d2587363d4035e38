"""Tune a list of tasks: spread the budget, write records, resume, re-validate, plot.

A :class:`~alt_tvm.tuning.scheduler.TaskScheduler` decides which task gets the next trials
(by default each task its share, in topological order); ``in_flight`` tasks are tuned at
once, each round in its own thread. Each task has its own seed (``seed + task index``).
Every measurement is appended to the log as soon as it finishes, so an interrupted run
loses nothing it finished, and ``resume=True`` skips what the log already holds. A
measurement that failed transiently (a lost board or connection:
:func:`~alt_tvm.tuning.measure.is_transient`) is not final: it is made once more in the
same run, and again by a resumed run.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from alt_tvm.options import TuneOptions, tune_options
from alt_tvm.records import RecordWriter, TuningRecord, candidate_key, iter_records, target_key

from .measure.base import classify_exception, is_transient
from .scheduler import TaskProgress, TaskScheduler, make_scheduler
from .task import Task, measure_in_process
from .tuner import Trial, TuneConfig, Tuner, TuneResult, point_key

MeasureFn = Callable[[Task, dict[str, Any]], float]
logger = logging.getLogger(__name__)


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
        With the static scheduler, ``trials + pending`` equals the task's share unless the
        space ran out of candidates or too few candidates succeeded to re-validate; with the
        gradient scheduler the shares move between tasks and only the sum is fixed.
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
    """Trials per task, at least 2 each, the rest proportional to the task's kernels' time in
    the untuned model where every task has it (:attr:`Task.time_ms`), else to how often it occurs.

    Raises
    ------
    BudgetError
        If ``trials`` is below 2 per task.
    """
    if trials < 2 * len(tasks):
        raise BudgetError(f"trials={trials} is too small for {len(tasks)} tasks: give at least {2 * len(tasks)}")
    timed = [t.time_ms for t in tasks]
    by_time = all(t is not None and math.isfinite(t) and t >= 0 for t in timed) and sum(timed) > 0
    weights = timed if by_time else [t.weight for t in tasks]
    total = sum(weights)
    shares = [max(2, int(trials * w / total)) for w in weights]
    # The floor of 2 can overspend a tight budget: take the excess from the largest shares.
    while sum(shares) > trials:
        largest = max(range(len(shares)), key=lambda i: shares[i])
        shares[largest] -= 1
    # What rounding left goes to the slowest task, or the first (usually the largest map).
    first = max(range(len(weights)), key=lambda i: weights[i]) if by_time else 0
    shares[first] += trials - sum(shares)
    return shares


def check_measure(measure: Any, options: TuneOptions) -> None:
    """Raise if ``measure`` cannot serve ``options`` (cheap: call it before extracting tasks).

    Raises
    ------
    TypeError
        For a ``measure`` that is neither None nor a function.
    ValueError
        For ``in_flight`` above 1 with a measure in this process, or a ``lookahead`` without
        a batched measure.
    """
    if measure is not None and not callable(measure):
        raise TypeError(f"measure must be None or a function (task, params) -> ms, got {type(measure).__name__}")
    if measure is None and options.in_flight > 1:
        raise ValueError(f"in_flight={options.in_flight} needs a measure that runs elsewhere (e.g. rpc_measure): "
                         "measuring in this process, a task's build would run beside another's timed run")
    if options.lookahead and getattr(measure, "measure_batch", None) is None:
        raise ValueError(f"lookahead={options.lookahead} needs a batched measure (one with measure_batch, e.g. "
                         "rpc_measure or PipelinedMeasure); this one measures a candidate at a time")


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


def tune_tasks(tasks: Sequence[Task], options: TuneOptions | None = None, *, measure: MeasureFn | None = None,
               **keywords: Any) -> list[TaskSummary]:
    """Tune ``tasks`` (all for one target) and append every measurement to ``log``.

    Parameters
    ----------
    tasks
        The tasks, e.g. from :func:`alt_tvm.integration.extract_tasks`; records are keyed
        by ``task.key`` and ``task.target``.
    options, **keywords
        The run's settings (:class:`~alt_tvm.options.TuneOptions`, or its fields as
        keywords: ``trials=``, ``log=``, ``seed=`` ...): the budget, the log (appended to;
        every measurement as it finishes), the search, re-validation and scheduling. Its
        ``build`` and in-model fields are not used here.
    measure
        ``measure(task, params) -> ms``; default: build and time in this process. A
        failure raises (``RuntimeError("<ErrorCode name>: ...")`` gives its code; an
        ``OSError`` is transient, see :func:`~alt_tvm.tuning.measure.classify_exception`)
        or returns ``inf``. A measure with a ``measure_batch`` method
        (:class:`~alt_tvm.tuning.fleet.PipelinedMeasure`) gets each loop round's ``top_k``
        candidates as one batch, built and run in parallel, each logged as it finishes.
        ``in_flight`` above 1 needs a measure that runs elsewhere (a build beside a timed
        run disturbs the timing); ``lookahead`` needs a batched one.

    Returns
    -------
    list of TaskSummary
        One per task, in order. A task whose candidates all failed is reported
        (``ok`` False, ``error`` the last failure), not raised, so the others stay usable.

    Raises
    ------
    TypeError, ValueError
        For an invalid option (:class:`~alt_tvm.options.TuneOptions`, :func:`check_measure`),
        no tasks, or tasks for several targets; :class:`BudgetError` if ``trials`` is below 2
        per task.
    """
    options = tune_options(options, caller="tune_tasks", **keywords)
    check_measure(measure, options)
    if not tasks:
        raise ValueError("no tasks to tune: the model has no partition a tunable strategy implements")
    budgets = split_budget(tasks, options.trials)  # before the log is opened: a BudgetError writes nothing
    targets = {target_key(task.target.to_tvm()) for task in tasks}
    if len(targets) != 1:
        raise ValueError(f"tasks for {len(targets)} different targets; tune one target at a time")
    scheduler = options.scheduler
    policy = make_scheduler(scheduler, round_trials=options.top_k) if isinstance(scheduler, str) else scheduler
    if not isinstance(policy, TaskScheduler):
        raise TypeError(f"scheduler must be 'static', 'gradient' or a TaskScheduler, got {scheduler!r}")
    (target_json,) = targets
    run_options = _RunOptions(target_json=target_json, seed=options.seed, joint_fraction=options.joint_fraction,
                              batch=options.batch, top_k=options.top_k, revalidate=options.revalidate,
                              revalidate_rounds=options.revalidate_rounds, features=options.features,
                              cost_model=options.cost_model, progress=options.progress, lookahead=options.lookahead,
                              measure=measure or (lambda task, params: measure_in_process(task, params)))
    log = options.log
    previous = list(iter_records(log)) if options.resume and os.path.exists(log) else []
    with RecordWriter(log) as writer:
        runs = [_TaskRun(task, index, len(tasks), budget, run_options, writer, previous)
                for index, (task, budget) in enumerate(zip(tasks, budgets))]
        _dispatch(runs, policy, options.in_flight, _Sizer(run_options.measure, options.progress))
    if options.plot is not None:
        plot_curves([run.tuner.result for run in runs],
                    [s.key.split("|")[0] + f" #{i + 1}" for i, s in enumerate(run.summary for run in runs)],
                    options.plot)
    return [run.summary for run in runs]


@dataclass(frozen=True)
class _RunOptions:
    """The options of :func:`tune_tasks` every task shares."""

    target_json: str
    seed: int
    joint_fraction: float
    batch: int
    top_k: int
    revalidate: int
    revalidate_rounds: int
    features: str
    cost_model: Any
    progress: bool
    measure: MeasureFn
    lookahead: int = 0


class _TaskRun:
    """One task being tuned: its search, its records, its progress; rounds may come from any thread."""

    def __init__(self, task: Task, index: int, count: int, budget: int, options: _RunOptions,
                 writer: RecordWriter, previous: Sequence[TuningRecord]) -> None:
        self.task, self.index, self.options, self.writer = task, index, options, writer
        self.history = _History([r for r in previous
                                 if r.workload_key == task.key and r.target == options.target_json])
        # What the search saw at each point (its first record), so a resumed search replays it.
        self.known = {key: records[0].median_ms for key, records in self.history.search.items()}
        rounds = options.revalidate_rounds
        self.finalists = min(options.revalidate, budget // 4 // rounds) if rounds else 0
        search = budget - self.finalists * rounds
        self.progress = TaskProgress(weight=task.weight, share=search)
        self.label = f"task {index + 1}/{count} {task.key.split('|')[0]}"
        self.bar: Any = None
        self.best_so_far = math.inf
        self.summary: TaskSummary | None = None
        config = TuneConfig(trials=search, joint_fraction=options.joint_fraction, seed=options.seed + index,
                            batch=options.batch, top_k=min(options.top_k, search, options.batch),
                            lookahead=options.lookahead)
        model_ = _cost_model(options.cost_model, options.seed + index)
        featurize = tir_featurizer(task) if options.features == "tir" and model_ is not None else None
        measure, batched = options.measure, getattr(options.measure, "measure_batch", None)
        self.tuner = Tuner(task.space, measure=lambda p: measure(task, p), config=config, cost_model=model_,
                           known=self.known, on_trial=self._on_trial, featurize=featurize,
                           measure_batch=None if batched is None else lambda ps: batched(task, ps))

    def write(self, trial: Trial, latency: float, code: str | None, message: str,
              revalidation: bool = False) -> TuningRecord:
        record = _trial_record(self.task.key, self.options.target_json, trial, latency, code, message,
                               seed=self.options.seed + self.index, strategy=self.task.strategy.name,
                               revalidation=revalidation)
        self.writer.write(record)  # thread-safe: one line at a time, whichever task's thread writes
        self.history.add(record)
        return record

    def _on_trial(self, trial: Trial) -> None:
        if point_key(trial.layout, trial.loop) not in self.known:  # else already in the log
            for lost in trial.retried:  # a board lost while measuring it: logged as the transient failure
                self.write(dataclasses.replace(trial, board=lost.board, build_s=lost.build_s, run_s=lost.run_s),
                           math.inf, lost.error_code, lost.error_msg)
            self.write(trial, trial.latency_ms, trial.error_code, trial.error or "")
        self.best_so_far = min(self.best_so_far, trial.latency_ms)
        self.bar.update(1)
        self.bar.set_postfix(best_ms=f"{self.best_so_far:.3f}")

    def step(self, trials: int) -> None:
        """Search ``trials`` more candidates (fewer if the space runs out)."""
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.progress.share, desc=self.label, disable=not self.options.progress,
                            leave=False)
        target = self.progress.used + trials
        if target > self.bar.total:
            self.bar.total = target
        self.tuner.run(until=target)
        self.progress.used = self.tuner.used
        self.progress.finished = self.tuner.finished or self.tuner.used < target
        best = self.tuner.result.best
        self.progress.best_ms.append(best.latency_ms if best is not None else math.inf)

    def finish(self) -> TaskSummary:
        """Measure transient failures once more, re-validate the finalists, summarise."""
        if self.bar is None:
            self.step(0)
        measure, history, result = self.options.measure, self.history, self.tuner.result
        points = [point_key(t.layout, t.loop) for t in result.trials]
        for trial, key in zip(result.trials, points):  # transient failures: once more
            if _transient(_outcome(history.search[key])):
                self.write(*_measure_once(measure, self.task, trial))
        for trial, key in zip(result.trials, points):  # each point as all its records say
            outcome = _outcome(history.search[key])
            trial.latency_ms = outcome.median_ms
            trial.error_code = outcome.error_code
            trial.error = None if outcome.ok else outcome.error_msg
        pending = sum(_transient(_outcome(history.search[key])) for key in points)
        counted = len(points) - pending
        best = result.best
        best_ms = best.latency_ms if best else math.inf
        if self.finalists and best is not None:
            median, done, missing = _revalidate(
                self.task, result.trials, count=self.finalists, rounds=self.options.revalidate_rounds,
                history=history, measure=measure, write=lambda *a: self.write(*a, revalidation=True))
            best_ms = median if math.isfinite(median) else best_ms
            counted += done
            pending += missing
            self.bar.update(done)
        self.bar.close()
        if result.trials:
            last = result.trials[-1]
            error = "" if best is not None else f"{last.error_code}: {last.error}"
            default_ms = result.trials[0].latency_ms
        else:
            error, default_ms = "no candidate was measured", math.inf
        self.summary = TaskSummary(self.task.key, self.task.weight, counted, default_ms, best_ms,
                                   pending=pending, error=error)
        return self.summary


class _Sizer:
    """Prints the expected wall time of the remaining budget, from the measure's rates (if it has them)."""

    def __init__(self, measure: MeasureFn, progress: bool, every_s: float = 60.0) -> None:
        self.estimate = getattr(measure, "expected_wall_s", None)
        self.progress, self.every_s = progress, every_s
        self.last = time.monotonic()

    def report(self, trials_left: int, *, force: bool = False) -> None:
        if self.estimate is None or trials_left <= 0 or (not force and time.monotonic() - self.last < self.every_s):
            return
        seconds = self.estimate(trials_left)
        if seconds is None:
            return
        self.last = time.monotonic()
        line = f"{trials_left} trials left: about {seconds / 60:.1f} min at the build and run rates measured so far"
        if self.progress:
            from tqdm import tqdm

            tqdm.write(line)
        else:
            logger.info(line)


def _dispatch(runs: Sequence[_TaskRun], policy: TaskScheduler, in_flight: int, sizer: _Sizer) -> None:
    """Run the scheduler's rounds, ``in_flight`` tasks at a time, then finish every task.

    Rounds of different tasks run in their own threads, so one task's batch builds while
    another's runs; a task is never in two rounds at once.
    """
    progress = [run.progress for run in runs]
    left = sum(p.share for p in progress)  # search trials not yet handed out
    busy: dict[Any, tuple[int, int, int]] = {}  # future -> (task, trials granted, trials used before)

    def owed() -> int:
        granted = sum(trials - (runs[i].tuner.used - before) for i, trials, before in busy.values())
        reserve = sum(r.finalists * r.options.revalidate_rounds for r in runs if r.summary is None)
        return left + max(0, granted) + reserve

    def finish(out_of_work: bool) -> None:
        """Hand out the finishing (re-validation) of the tasks that get no more search rounds."""
        for index, run in enumerate(runs):
            if (len(busy) < in_flight and run.summary is None and all(i != index for i, _, _ in busy.values())
                    and (out_of_work or policy.final(run.progress))):
                busy[pool.submit(run.finish)] = (index, 0, run.progress.used)

    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="alt_tvm_task") as pool:
        while True:
            finish(out_of_work=False)  # first, so a task's log is complete before the next one starts
            while len(busy) < in_flight:
                choice = policy.pick(progress, {i for i, _, _ in busy.values()}, left)
                if choice is None:
                    break
                index, trials = choice
                left -= trials
                busy[pool.submit(runs[index].step, trials)] = (index, trials, runs[index].progress.used)
            if not any(trials for _, trials, _ in busy.values()) and policy.pick(progress, set(), left) is None:
                finish(out_of_work=True)  # the budget is spent
            if not busy:
                break
            done, _ = wait(busy, return_when=FIRST_COMPLETED)
            for future in done:
                index, trials, before = busy.pop(future)
                future.result()  # a crash of the search itself is a bug: raise it
                left += max(0, trials - (runs[index].progress.used - before))  # a space that ran out
                sizer.report(owed(), force=not trials)  # after each finished task, and every minute


def tir_featurizer(task: Task) -> Callable[[dict[str, Any]], np.ndarray]:
    """``params -> features of the lowered TIR`` for ``task``, cached per candidate.

    A candidate that fails to lower gets all-NaN features (XGBoost treats them as missing);
    its measurement then records the error. A program the feature extractor cannot read
    gets the same, with a warning naming the error: the search goes on without its features.
    """
    from .features import extract_features, feature_names

    cache: dict[str, np.ndarray] = {}
    width = len(feature_names())

    def featurize(params: dict[str, Any]) -> np.ndarray:
        key = candidate_key(params)
        if key not in cache:
            cache[key] = np.full(width, np.nan)
            try:
                func = task.lower(params).func
            except Exception:  # noqa: BLE001 - a bad candidate is data for the search, not a crash
                return cache[key]
            try:
                cache[key] = extract_features(func)
            except Exception as err:  # noqa: BLE001 - a gap of the extractor costs the model one row
                logger.warning("%s: no TIR features for %s (%s: %s); the cost model takes them as missing",
                               task.key, key, type(err).__name__, err)
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
