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
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from alt_tvm.records import candidate_key
from alt_tvm.strategies.space import Space

from .measure.base import ErrorCode, classify_exception
from .ppo import DIRECTIONS, CrossExplorationAgents, PPOConfig

MeasureFn = Callable[[dict[str, Any]], float]


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
    """

    trials: int = 64
    joint_fraction: float = 0.3
    batch: int = 128
    top_k: int = 8
    loop_rounds: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("trials", "batch", "top_k", "loop_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TuneConfig.{name} must be a positive int, got {value!r}")
        if not 0.0 <= self.joint_fraction <= 1.0:
            raise ValueError(f"TuneConfig.joint_fraction must be in [0, 1], got {self.joint_fraction!r}")
        if self.top_k > self.batch:
            raise ValueError(f"TuneConfig.top_k={self.top_k} exceeds batch={self.batch}")


@dataclass
class Trial:
    """One point the search visited.

    Attributes
    ----------
    index
        Position in the search (0: the default point).
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

    def _measure(self, layout: dict[str, Any], loop: dict[str, Any], stage: str) -> float:
        key = point_key(layout, loop)
        if key in self.measured:
            return self.measured[key]
        if self.measure_batch is not None and key not in self.known:
            return self._measure_all([(layout, loop)], stage)[0]  # a batch of one: it reports its board
        params = self.space.params(layout, loop)
        error = code = None
        latency = math.inf
        if key in self.known:
            latency = self.known[key]
            if not math.isfinite(latency):
                code, error = ErrorCode.RUN_ERROR.name, "failed when measured before (see the log)"
        else:
            try:
                latency = float(self.measure_fn(params))
                if not math.isfinite(latency):
                    code, error = ErrorCode.RUN_ERROR.name, f"the measure function returned {latency}"
            except Exception as err:  # a failing candidate is data, not a crash of the tuner
                failure, error = classify_exception(err)
                code = failure.name
        return self._record(Trial(self.used, dict(layout), dict(loop), params, latency, error, stage, code))

    def _measure_all(self, points: list[tuple[dict[str, Any], dict[str, Any]]], stage: str) -> list[float]:
        """Latencies of ``points``; the new ones as one batch when the tuner has ``measure_batch``."""
        latencies: list[float | None] = [None] * len(points)
        todo = []
        for i, (layout, loop) in enumerate(points):
            key = point_key(layout, loop)
            if self.measure_batch is None or key in self.measured or key in self.known:
                latencies[i] = self._measure(layout, loop, stage)
            else:
                todo.append(i)
        if todo:
            params = [self.space.params(*points[i]) for i in todo]
            for j, outcome in self.measure_batch(params):
                layout, loop = points[todo[j]]
                latencies[todo[j]] = self._record(Trial(
                    self.used, dict(layout), dict(loop), params[j], outcome.latency_ms, outcome.error_msg or None,
                    stage, outcome.error_code, outcome.board, outcome.build_s, outcome.run_s, outcome.retried),
                    train=False)
            self._train()  # once per batch: the next batch is ranked with all of this one
        return latencies  # type: ignore[return-value]

    def _train(self) -> None:
        if self.cost_model is not None and self._latencies:
            self.cost_model.update(np.stack(self._features), np.asarray(self._latencies))

    def _record(self, trial: Trial, *, train: bool = True) -> float:
        """Book a measured trial: history, cost model (unless ``train`` is False), ``on_trial``; its latency."""
        if trial.error_code is not None or not math.isfinite(trial.latency_ms):
            trial.latency_ms = math.inf  # NaN too: failures sort last
            trial.error_code = trial.error_code or ErrorCode.RUN_ERROR.name
            trial.error = trial.error or "no latency"
        latency, params = trial.latency_ms, trial.params
        self.measured[point_key(trial.layout, trial.loop)] = latency
        self.result.trials.append(trial)
        if self.upper is None and math.isfinite(latency):
            self.upper = 2.0 * latency
        self._features.append(self.featurize(params))
        self._latencies.append(latency)
        if train:
            self._train()
        if self.on_trial is not None:
            self.on_trial(trial)
        return latency

    # ------------------------------------------------------------ loop search
    def _loop_round(self, layout: dict[str, Any], start: dict[str, Any], stage: str, budget: int, *,
                    with_start: bool = False) -> dict[str, Any]:
        """One loop round from ``start``; returns the best loop point seen under ``layout``.

        ``with_start`` measures ``start`` too (if new), in the same batch as the round's top-k.
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
                 if point_key(layout, c[0]) not in self.measured and self.space.check(layout, c[0]) is None]
        # Once the walk's neighbourhood is mostly measured, random points fill the round up to
        # top-k, so a batch keeps every board busy (bounded: a small space may have no more).
        for _ in range(4 * self.config.batch):
            if len(fresh) >= min(self.config.top_k, budget):
                break
            loop = self.space.random_loop(layout, self.rng)
            key = point_key(layout, loop)
            if key not in seen and key not in self.measured and self.space.check(layout, loop) is None:
                seen.add(key)
                fresh.append((loop, None, None))
        order = self._rank([self.space.params(layout, c[0]) for c in fresh])
        head = [(start, None, None)] if with_start and point_key(layout, start) not in self.measured else []
        chosen = head + [fresh[i] for i in order[: max(0, min(self.config.top_k, budget) - len(head))]
                         if fresh[i][0] != start or not head]
        states, actions, old, rewards = [], [], [], []
        latencies = self._measure_all([(layout, loop) for loop, _, _ in chosen], stage)
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
        return best_loop

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
                        limit: int) -> None:
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
        if self.used < limit and not with_start:
            self._measure(layout, start, stage)
        for _ in range(self.config.loop_rounds):
            if self.used >= limit:
                break
            start = self._loop_round(layout, start, stage, limit - self.used, with_start=with_start)
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

    def run(self, *, until: int | None = None) -> TuneResult:
        """Spend the budget; returns every trial (``.best`` is the winner).

        ``until`` stops after that many trials in all (default ``config.trials``); calling
        ``run`` again goes on where the search stopped, so a task scheduler can hand a task
        its trials a round at a time. The stage split (joint, then loop-only) follows
        ``config.trials`` whatever ``until`` is, and ``until`` may exceed it (more loop rounds).
        """
        trials = self.config.trials
        until = trials if until is None else until
        default = self.space.default()
        if not self.result.trials and until > 0:
            self._measure(*default, "joint")  # the untuned choice is the baseline to beat
        joint_target = int(round(trials * self.config.joint_fraction))
        if not self._loop_stage:
            while self.used < min(until, joint_target) and self._stalled < 16:
                before = self.used
                self._layout_episode(*self._best_point(default), "joint", min(until, joint_target))
                self._stalled = self._stalled + 1 if self.used == before else 0
            if self.used >= joint_target or self._stalled >= 16:
                self._loop_stage, self._stalled = True, 0
        while self._loop_stage and self.used < until and not self.finished:
            before = self.used
            layout, loop = self._best_point(default)
            self._loop_round(layout, loop, "loop", until - self.used)
            if self.used == before:
                # The best layout's loop neighbourhood is exhausted: explore layouts again.
                self._layout_episode(layout, loop, "loop", until)
            self._stalled = self._stalled + 1 if self.used == before else 0
        return self.result
