"""The cross-exploration tuner of one task (ALT paper §5.2, Fig. 8).

Joint stage: the layout actor proposes a layout; ``loop_rounds`` rounds of loop search
run under it (sample a batch of points by walking from the best point in directions
the loop actor draws, rank the batch with the cost model, measure the top-k); the best
latency found under the layout is the layout action's reward ``U - l``. Loop-only
stage: the best layout is fixed and loop rounds continue until the budget is spent.

Measurement is injected (``measure(params) -> latency in ms``), so the bookkeeping is
testable without timing; a failed measurement returns ``inf`` (or raises) and is
recorded with its error code and message, never retried here (the driver measures
transient failures again).

With a batch measure and ``lookahead`` > 0 the search runs ahead of the boards: the next
step is proposed and its batch sent to be built while the current one still runs, from the
cost model, actors and best point as they stand (one batch stale). The builds of batch n+1
then overlap the runs of batch n, and the tuner's own work (training, ranking) overlaps
both, so the boards never wait for the search; PPO's clipped ratio (Schulman et al. 2017)
already corrects for actions sampled from the policy before its last update.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from alt_tvm.records import candidate_key
from alt_tvm.strategies.space import Space

from .measure.base import ErrorCode, classify_exception
from .ppo import DIRECTIONS, CrossExplorationAgents, PPOConfig

MeasureFn = Callable[[dict[str, Any]], float]
Point = tuple[dict[str, Any], dict[str, Any]]  # (layout, loop)
#: a search step: yields (points, stage) batches, receives their latencies, returns at its end
Step = Generator[tuple[list[Point], str], list[float], Any]


@dataclass(frozen=True)
class TuneConfig:
    """Budget and search parameters of one task.

    Attributes
    ----------
    trials
        Measured candidates (the budget).
    joint_fraction
        Share of the budget spent in the joint stage (the paper: 300 of 1000).
    batch
        Candidates sampled per loop round and ranked by the cost model.
    top_k
        Candidates measured per loop round.
    loop_rounds
        Loop rounds per layout in the joint stage.
    seed
        Seeds every random choice (numpy and torch generators).
    lookahead
        Search steps proposed (and their batches sent to be built) before the oldest step's
        results are in; 0: strictly one batch at a time. Needs a batch measure; with the
        same seed a lookahead > 0 explores other points than 0, since it ranks with a
        one-batch-stale model.
    """

    trials: int = 64
    joint_fraction: float = 0.3
    batch: int = 128
    top_k: int = 8
    loop_rounds: int = 1
    seed: int = 0
    lookahead: int = 0

    def __post_init__(self) -> None:
        for name in ("trials", "batch", "top_k", "loop_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TuneConfig.{name} must be a positive int, got {value!r}")
        if not 0.0 <= self.joint_fraction <= 1.0:
            raise ValueError(f"TuneConfig.joint_fraction must be in [0, 1], got {self.joint_fraction!r}")
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or self.lookahead < 0:
            raise ValueError(f"TuneConfig.lookahead must be an int >= 0, got {self.lookahead!r}")
        if self.top_k > self.batch:
            raise ValueError(f"TuneConfig.top_k={self.top_k} exceeds batch={self.batch}")


@dataclass
class Trial:
    """One point the search visited.

    Attributes
    ----------
    index
        Order in which results came in (0: the default point); with a lookahead, results
        of two batches may interleave.
    layout, loop, params
        The point and the strategy parameters it decodes to.
    latency_ms
        Measured latency; ``inf`` for a failure.
    error
        The failure's message (None on success).
    stage
        ``"joint"`` or ``"loop"``.
    error_code
        The failure's :class:`~alt_tvm.tuning.measure.ErrorCode` name (None on success);
        see :func:`~alt_tvm.tuning.measure.classify_exception`.
    """

    index: int
    layout: dict[str, Any]
    loop: dict[str, Any]
    params: dict[str, Any]
    latency_ms: float
    error: str | None = None
    stage: str = "joint"
    error_code: str | None = None
    #: where and how long it was measured, when the measure function says (a batch measure does)
    board: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    #: transient failures measured again before this result (:class:`alt_tvm.tuning.fleet.Attempt`)
    retried: tuple = ()


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial | None:
        ok = [t for t in self.trials if math.isfinite(t.latency_ms)]
        return min(ok, key=lambda t: t.latency_ms) if ok else None


@dataclass
class _Batch:
    """A step's points on their way to being measured: ``left`` results still to come."""

    ident: int
    points: list[Point]
    stage: str
    latencies: list[float | None]
    new: int = 0  # points that were not measured yet (each becomes a trial)
    owned: list[int] = field(default_factory=list)  # indices into points this batch books
    sent: list[int] = field(default_factory=list)  # indices into points handed to measure_batch
    params: list[dict[str, Any]] = field(default_factory=list)
    left: int = 0
    arrived: dict[int, Trial] = field(default_factory=dict)  # index into points -> its trial, not booked yet


@dataclass
class _InFlight:
    """A search step waiting for its batch."""

    step: Step
    batch: _Batch | None = None
    measured: bool = False  # it recorded at least one trial


def _failed_as_inf(trial: Trial) -> Trial:
    """``trial`` with a failure's latency ``inf`` (NaN too: failures sort last) and its code and message set."""
    if trial.error_code is not None or not math.isfinite(trial.latency_ms):
        trial.latency_ms = math.inf
        trial.error_code = trial.error_code or ErrorCode.RUN_ERROR.name
        trial.error = trial.error or "no latency"
    return trial


def point_key(layout: dict[str, Any], loop: dict[str, Any]) -> str:
    """Canonical identity of a point: the records' :func:`~alt_tvm.records.candidate_key` of it."""
    return candidate_key({"layout": layout, "loop": loop})


class Tuner:
    """Cross-exploration over one task's :class:`~alt_tvm.strategies.space.Space`.

    Parameters
    ----------
    space
        The task's space.
    measure
        ``measure(params) -> latency_ms``; ``inf`` or an exception marks a failure.
    config
        Budget and search parameters.
    cost_model
        Object with ``update(features, latencies_ms)`` and ``predict(features)`` (higher =
        faster), e.g. ``alt_tvm.tuning.cost_model.XGBCostModel``; None ranks at random.
    featurize
        ``featurize(params) -> 1-D array`` for the cost model (defaults to the knob values).
    on_trial
        Called with every :class:`Trial` as soon as it is measured (write records here).
    known
        Latencies already measured (``point_key -> ms``, from a log being resumed):
        those points are not measured again but count toward the budget.
    measure_batch
        ``measure_batch(list of params) -> iterator of (index, Outcome)`` (see
        :class:`alt_tvm.tuning.fleet.PipelinedMeasure`): a loop round's top-k candidates are
        then measured as one batch, each recorded as its result arrives; None: one at a
        time with ``measure``.
    """

    def __init__(self, space: Space, *, measure: MeasureFn, config: TuneConfig = TuneConfig(),
                 cost_model: Any = None, featurize: Callable[[dict[str, Any]], np.ndarray] | None = None,
                 on_trial: Callable[[Trial], None] | None = None, known: dict[str, float] | None = None,
                 ppo: PPOConfig | None = None, measure_batch: Callable[[list], Iterator] | None = None) -> None:
        self.space = space
        if config.lookahead and measure_batch is None:
            raise ValueError(f"TuneConfig.lookahead={config.lookahead} needs a batch measure (measure_batch); "
                             "measuring one candidate at a time the search cannot run ahead")
        self.measure_fn = measure
        self.measure_batch = measure_batch
        self.config = config
        self.cost_model = cost_model
        self.featurize = featurize or self._knob_features
        self.on_trial = on_trial
        self.known = dict(known or {})
        self.rng = np.random.default_rng(config.seed)
        layout0, loop0 = space.default()
        self.agents = CrossExplorationAgents(
            layout_state=len(space.layout_state(layout0)), loop_state=len(space.loop_state(layout0, loop0)),
            layout_knobs=len(space.layout_knobs), loop_knobs=len(space.loop_knobs(layout0)), seed=config.seed,
            config=ppo or PPOConfig())
        self.result = TuneResult()
        self.measured: dict[str, float] = {}
        self._features: list[np.ndarray] = []
        self._latencies: list[float] = []
        self.upper = None  # U of the reward r = U - l, set from the first latency
        self.rejected = 0  # layouts rejected by Space.check before building
        self._stalled = 0  # steps in a row that measured nothing new
        self._loop_stage = False
        self._reserved: set[str] = set()  # points of batches started, not booked yet
        self._batches: dict[int, _Batch] = {}
        self._idents = itertools.count()
        self._numbers = itertools.count()  # Trial.index, in the order trials are made
        self._arrivals: queue.SimpleQueue = queue.SimpleQueue()  # (batch ident, index, Outcome or exception)
        self._closing = threading.Event()

    # ---------------------------------------------------------------- helpers
    def _knob_features(self, params: dict[str, Any]) -> np.ndarray:
        values = []
        for value in params.values():
            values.extend(value if isinstance(value, list) else [value])
        return np.log2(np.asarray([float(v) + 1.0 for v in values], dtype=np.float64))

    @property
    def used(self) -> int:
        return len(self.result.trials)

    def _state(self, layout: dict[str, Any], loop: dict[str, Any]) -> torch.Tensor:
        return torch.as_tensor(np.concatenate([self.space.layout_state(layout), self.space.loop_state(layout, loop)]))

    def _reward(self, latency: float) -> float:
        if not math.isfinite(latency):
            return -1.0
        return (self.upper - latency) / self.upper

    @property
    def _committed(self) -> int:
        """Trials recorded or on their way (the budget counts both)."""
        return len(self.result.trials) + len(self._reserved)

    def _taken(self, key: str) -> bool:
        return key in self.measured or key in self._reserved

    def _measure(self, layout: dict[str, Any], loop: dict[str, Any], stage: str) -> float:
        key = point_key(layout, loop)
        if key in self.measured:
            return self.measured[key]
        if self.measure_batch is not None and key not in self.known:
            return self._settle(self._start([(layout, loop)], stage))[0]  # a batch of one: it reports its board
        if key in self.known:
            return self._record(self._known_trial(layout, loop, stage))
        params = self.space.params(layout, loop)
        error = code = None
        try:
            latency = float(self.measure_fn(params))
            if not math.isfinite(latency):
                code, error = ErrorCode.RUN_ERROR.name, f"the measure function returned {latency}"
        except Exception as err:  # a failing candidate is data, not a crash of the tuner
            latency = math.inf
            failure, error = classify_exception(err)
            code = failure.name
        return self._record(Trial(next(self._numbers), dict(layout), dict(loop), params, latency, error, stage,
                                  code))

    def _known_trial(self, layout: dict[str, Any], loop: dict[str, Any], stage: str) -> Trial:
        latency = self.known[point_key(layout, loop)]
        error = code = None
        if not math.isfinite(latency):
            code, error = ErrorCode.RUN_ERROR.name, "failed when measured before (see the log)"
        return Trial(next(self._numbers), dict(layout), dict(loop), self.space.params(layout, loop), latency,
                     error, stage, code)

    def _start(self, points: list[Point], stage: str) -> _Batch:
        """Start measuring ``points``: the new ones not in the log are sent as one batch.

        Measuring one candidate at a time, every point is measured (and booked) here.
        """
        batch = _Batch(next(self._idents), points, stage, [None] * len(points))
        for i, (layout, loop) in enumerate(points):
            key = point_key(layout, loop)
            batch.new += not self._taken(key)
            if self.measure_batch is None:
                batch.latencies[i] = self._measure(layout, loop, stage)
            elif not self._taken(key):
                self._reserved.add(key)
                batch.owned.append(i)
                if key not in self.known:
                    batch.sent.append(i)
        if batch.sent:
            batch.params = [self.space.params(*points[i]) for i in batch.sent]
            batch.left = len(batch.sent)
            self._batches[batch.ident] = batch
            threading.Thread(target=self._forward, args=(batch.ident, batch.params), daemon=True,
                             name="alt_tvm_batch").start()
        return batch

    def _forward(self, ident: int, params: list[dict[str, Any]]) -> None:
        """Hand a batch's results (or the measure's exception) to the search's thread as they come."""
        results = self.measure_batch(params)
        try:
            for index, outcome in results:
                self._arrivals.put((ident, index, outcome))
                if self._closing.is_set():
                    break
        except BaseException as err:  # noqa: BLE001 - re-raised in the search's thread
            self._arrivals.put((ident, None, err))
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # stops handing out the rest of an abandoned batch

    def _settle(self, batch: _Batch) -> list[float]:
        """Wait for ``batch``'s results and book them; the latencies of its points.

        Every result is handed to ``on_trial`` (the log) as it arrives, whichever batch it
        belongs to; the search books a batch only here, in the batch's order, so what it
        proposes next does not depend on which board finished first (and a resumed search,
        booking the log's results at the same places, proposes the same points).
        """
        while batch.left:
            ident, index, outcome = self._arrivals.get()
            if index is None:
                raise outcome
            owner = self._batches[ident]
            i = owner.sent[index]
            layout, loop = owner.points[i]
            trial = _failed_as_inf(Trial(
                next(self._numbers), dict(layout), dict(loop), owner.params[index], outcome.latency_ms,
                outcome.error_msg or None, owner.stage, outcome.error_code, outcome.board, outcome.build_s,
                outcome.run_s, outcome.retried))
            owner.arrived[i] = trial
            owner.left -= 1
            if self.on_trial is not None:
                self.on_trial(trial)
        self._batches.pop(batch.ident, None)
        if self.measure_batch is None:
            return batch.latencies  # type: ignore[return-value]  # measured and booked when started
        for i in batch.owned:
            trial = batch.arrived.get(i) or self._known_trial(*batch.points[i], batch.stage)
            self._book(trial)
            if i not in batch.arrived and self.on_trial is not None:
                self.on_trial(trial)
        for i, point in enumerate(batch.points):
            batch.latencies[i] = self.measured[point_key(*point)]
        if batch.owned:
            self._train()  # once per batch: the next batch is ranked with all of this one
        return batch.latencies  # type: ignore[return-value]

    def _train(self) -> None:
        if self.cost_model is not None and self._latencies:
            self.cost_model.update(np.stack(self._features), np.asarray(self._latencies))

    def _book(self, trial: Trial) -> float:
        """Add a measured trial to the search's history; its latency."""
        latency = _failed_as_inf(trial).latency_ms
        key = point_key(trial.layout, trial.loop)
        self._reserved.discard(key)
        self.measured[key] = latency
        self.result.trials.append(trial)
        if self.upper is None and math.isfinite(latency):
            self.upper = 2.0 * latency
        self._features.append(self.featurize(trial.params))
        self._latencies.append(latency)
        return latency

    def _record(self, trial: Trial) -> float:
        """Book a trial measured on its own, train the cost model, hand it to ``on_trial``; its latency."""
        latency = self._book(trial)
        self._train()
        if self.on_trial is not None:
            self.on_trial(trial)
        return latency

    # ------------------------------------------------------------ loop search
    def _loop_round(self, layout: dict[str, Any], start: dict[str, Any], stage: str, budget: int, *,
                    with_start: bool = False) -> Generator[tuple[list[Point], str], list[float],
                                                           tuple[dict[str, Any], bool]]:
        """One loop round from ``start`` (a step); returns the best loop point seen under ``layout``
        and whether the round chose anything to measure.

        ``with_start`` measures ``start`` too (if new), in the same batch as the round's top-k.
        Points already measured or on their way are not chosen again.
        """
        knobs = self.space.loop_knobs(layout)
        state = self._state(layout, start)
        picks, logps = self.agents.loop.sample(state, self.agents.generator, self.config.batch)
        candidates, seen = [], set()
        for pick, logp in zip(picks, logps):
            loop = {k.name: k.step(start[k.name], DIRECTIONS[int(d)]) for k, d in zip(knobs, pick)}
            key = point_key(layout, loop)
            if key in seen:
                continue
            seen.add(key)
            candidates.append((loop, pick, logp))
        # A few random points keep the walk from getting stuck (the paper samples a batch first).
        for _ in range(max(1, self.config.batch // 8)):
            loop = self.space.random_loop(layout, self.rng)
            key = point_key(layout, loop)
            if key not in seen:
                seen.add(key)
                candidates.append((loop, None, None))
        fresh = [c for c in candidates
                 if not self._taken(point_key(layout, c[0])) and self.space.check(layout, c[0]) is None]
        # Once the walk's neighbourhood is mostly measured, random points fill the round up to
        # top-k, so a batch keeps every board busy (bounded: a small space may have no more).
        for _ in range(4 * self.config.batch):
            if len(fresh) >= min(self.config.top_k, budget):
                break
            loop = self.space.random_loop(layout, self.rng)
            key = point_key(layout, loop)
            if key not in seen and not self._taken(key) and self.space.check(layout, loop) is None:
                seen.add(key)
                fresh.append((loop, None, None))
        order = self._rank([self.space.params(layout, c[0]) for c in fresh])
        head = [(start, None, None)] if with_start and not self._taken(point_key(layout, start)) else []
        chosen = head + [fresh[i] for i in order[: max(0, min(self.config.top_k, budget) - len(head))]
                         if fresh[i][0] != start or not head]
        if not chosen:
            return start, False
        states, actions, old, rewards = [], [], [], []
        latencies = yield [(layout, loop) for loop, _, _ in chosen], stage
        best_loop, best = start, self.measured.get(point_key(layout, start), math.inf)
        for (loop, pick, logp), latency in zip(chosen, latencies):
            if latency < best:
                best_loop, best = loop, latency
            if pick is not None:
                states.append(state.numpy())
                actions.append(pick)
                old.append(logp)
                rewards.append(self._reward(latency))
        if rewards and self.upper is not None:
            self.agents.update(self.agents.loop, np.stack(states), torch.as_tensor(np.stack(actions)),
                               np.asarray(old), np.asarray(rewards))
        return best_loop, True

    def _rank(self, params: list[dict[str, Any]]) -> np.ndarray:
        if not params:
            return np.zeros(0, dtype=int)
        trained = self.cost_model is not None and sum(math.isfinite(x) for x in self._latencies) >= 4
        if not trained:
            return self.rng.permutation(len(params))
        scores = np.asarray(self.cost_model.predict(np.stack([self.featurize(p) for p in params])))
        return np.argsort(-scores, kind="stable")

    # ---------------------------------------------------------------- driver
    def _layout_episode(self, best_layout: dict[str, Any], best_loop: dict[str, Any], stage: str,
                        limit: int) -> Step:
        """Cross-exploration step: a layout from the layout actor, loop rounds under it, reward back."""
        state = self._state(best_layout, best_loop)
        actions, raw, logp = self.agents.layout.sample(state, self.agents.generator)
        layout = {k.name: k.nearest(max(1.0, k.extent * float(a))) for k, a in zip(self.space.layout_knobs, actions)}
        # Map the best loop point into this layout's loop space (choices may differ).
        start = {k.name: k.nearest(float(best_loop.get(k.name, k.choices[0]))) for k in self.space.loop_knobs(layout)}
        if self.space.check(layout, start) is not None:
            # Rejected before building: no trial spent, the actor learns it is a bad action.
            self.rejected += 1
            if self.upper is not None:
                self.agents.update(self.agents.layout, state.numpy()[None], raw[None], np.asarray([logp]),
                                   np.asarray([-1.0]))
            return
        # Batched, the layout's first point goes into its first loop round's batch (a batch of
        # one would leave every board but one idle).
        with_start = self.measure_batch is not None
        if self._committed < limit and not with_start:
            yield [(layout, start)], stage
        for _ in range(self.config.loop_rounds):
            if self._committed >= limit:
                break
            start, _ = yield from self._loop_round(layout, start, stage, limit - self._committed,
                                                   with_start=with_start)
            with_start = False
        layout_best = min((self.measured[k] for k in self.measured if json.loads(k)["layout"] == layout),
                          default=math.inf)
        if self.upper is not None:
            self.agents.update(self.agents.layout, state.numpy()[None], raw[None], np.asarray([logp]),
                               np.asarray([self._reward(layout_best)]))

    def _best_point(self, fallback: tuple[dict[str, Any], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        best = self.result.best
        return (best.layout, best.loop) if best is not None else fallback

    @property
    def finished(self) -> bool:
        """True once the loop-only stage stalled: 16 steps in a row found no unmeasured point."""
        return self._loop_stage and self._stalled >= 16

    def _loop_step(self, until: int, default: Point) -> Step:
        """Loop-only step: a loop round from the best point; a new layout once its neighbourhood is spent."""
        layout, loop = self._best_point(default)
        _, chose = yield from self._loop_round(layout, loop, "loop", until - self._committed)
        if not chose:
            yield from self._layout_episode(layout, loop, "loop", until)

    def _next_step(self, until: int, default: Point, *, busy: bool) -> Step | None:
        """The step to start next; None when the budget (counting trials on their way) is spent,
        or when the stage ends and the steps still in flight (``busy``) must finish first."""
        joint_target = int(round(self.config.trials * self.config.joint_fraction))
        if not self._loop_stage:
            limit = min(until, joint_target)
            if self._committed < limit and self._stalled < 16:
                return self._layout_episode(*self._best_point(default), "joint", limit)
            if busy or not (self.used >= joint_target or self._stalled >= 16):
                return None
            self._loop_stage, self._stalled = True, 0
        if self._committed < until and not self.finished:
            return self._loop_step(until, default)
        return None

    def _advance(self, flight: _InFlight, latencies: list[float] | None) -> bool:
        """Run ``flight``'s step to its next batch (started) or its end; False at its end."""
        try:
            points, stage = flight.step.send(latencies)
        except StopIteration:
            self._stalled = 0 if flight.measured else self._stalled + 1
            return False
        flight.batch = self._start(points, stage)
        flight.measured |= flight.batch.new > 0
        return True

    def run(self, *, until: int | None = None) -> TuneResult:
        """Spend the budget; returns every trial (``.best`` is the winner).

        ``until`` stops after that many trials in all (default ``config.trials``); calling
        ``run`` again goes on where the search stopped, so a task scheduler can hand a task
        its trials a round at a time. The stage split (joint, then loop-only) follows
        ``config.trials`` whatever ``until`` is, and ``until`` may exceed it (more loop rounds).
        Every step started is finished before ``run`` returns (``config.lookahead`` runs
        ahead within one call).
        """
        until = self.config.trials if until is None else until
        default = self.space.default()
        flights: collections.deque[_InFlight] = collections.deque()
        try:
            if not self.result.trials and until > 0:
                self._measure(*default, "joint")  # the untuned choice is the baseline to beat
            while True:
                while len(flights) <= self.config.lookahead:
                    step = self._next_step(until, default, busy=bool(flights))
                    if step is None:
                        break
                    flight = _InFlight(step)
                    if self._advance(flight, None):
                        flights.append(flight)
                if not flights:
                    return self.result
                flight = flights.popleft()
                if self._advance(flight, self._settle(flight.batch)):
                    flights.append(flight)
        except BaseException:
            self._closing.set()  # batches still out stop handing out work
            raise
