"""Which task of a model gets the next trials.

A model's tasks share one budget. :class:`StaticScheduler` gives each task a fixed share
(proportional to how often it occurs) and tunes the tasks in order.
:class:`GradientScheduler` hands trials out a round at a time to the task whose next round
is expected to cut the most off the whole model's latency: the gradient of the model's
latency with respect to the task's trials, estimated from the task's recent improvement
and an optimistic forward step (Zheng et al., Ansor, OSDI 2020, §6 "Task scheduler"; the
same estimate drives MetaSchedule's ``GradientBased`` task scheduler, with α = 0.2 and a
backward window of 3 rounds).

A scheduler only decides; the driver runs the rounds (several tasks in flight at once
when asked) and reports each round back in :class:`TaskProgress`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence, Set
from dataclasses import dataclass, field

__all__ = ["GradientScheduler", "StaticScheduler", "TaskProgress", "TaskScheduler", "make_scheduler"]


@dataclass
class TaskProgress:
    """What the driver tells a scheduler about one task.

    Attributes
    ----------
    weight
        How often the task occurs in the model.
    share
        The task's proportional share of the search trials.
    used
        Search trials spent on it so far.
    best_ms
        The best latency after each of its rounds (``inf`` while nothing succeeded).
    finished
        The task's search has nothing left to measure.
    """

    weight: float
    share: int
    used: int = 0
    best_ms: list[float] = field(default_factory=list)
    finished: bool = False


class TaskScheduler(abc.ABC):
    """Chooses the next (task, trials) to run; :meth:`final` says when a task is done."""

    name: str

    @abc.abstractmethod
    def pick(self, tasks: Sequence[TaskProgress], busy: Set[int], left: int) -> tuple[int, int] | None:
        """The task to run next (not one in ``busy``) and its trials, or None for none now.

        ``left`` is the search budget not yet spent or handed out.
        """

    def final(self, task: TaskProgress) -> bool:
        """True when ``task`` gets no more trials (its results can be finalised now)."""
        return task.finished


class StaticScheduler(TaskScheduler):
    """Each task its share, in order (the share is spent in one go)."""

    name = "static"

    def pick(self, tasks: Sequence[TaskProgress], busy: Set[int], left: int) -> tuple[int, int] | None:
        for index, task in enumerate(tasks):
            if index not in busy and not self.final(task):
                return index, task.share - task.used
        return None

    def final(self, task: TaskProgress) -> bool:
        return task.finished or task.used >= task.share


@dataclass(frozen=True)
class GradientScheduler(TaskScheduler):
    """A round of ``round_trials`` at a time to the task with the largest expected gain.

    Every task first gets one round; then task ``i`` with weight ``w``, best latency ``b``
    after ``n`` rounds and ``b'`` ``window`` rounds earlier has priority
    ``w * (alpha * (b' - b) / window + (1 - alpha) * b / n)``: a mix of the improvement it
    just made and the optimistic guess that its next round takes another ``1/n`` off.
    A task whose every candidate failed goes last.
    """

    round_trials: int = 8
    alpha: float = 0.2
    window: int = 3
    name: str = "gradient"

    def __post_init__(self) -> None:
        if isinstance(self.round_trials, bool) or not isinstance(self.round_trials, int) or self.round_trials < 1:
            raise ValueError(f"round_trials must be an int >= 1, got {self.round_trials!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an int >= 1, got {self.window!r}")

    def priority(self, task: TaskProgress) -> float:
        """Expected cut of the model's latency (ms x occurrences) from one more round of ``task``."""
        if not task.best_ms:
            return math.inf
        best = task.best_ms[-1]
        if not math.isfinite(best):
            return -1.0
        back = min(self.window, len(task.best_ms) - 1)
        backward = (task.best_ms[-1 - back] - best) / back if back else 0.0
        backward = backward if math.isfinite(backward) else best  # from "all failed" to a result
        forward = best / len(task.best_ms)
        return task.weight * (self.alpha * backward + (1.0 - self.alpha) * forward)

    def pick(self, tasks: Sequence[TaskProgress], busy: Set[int], left: int) -> tuple[int, int] | None:
        if left <= 0:
            return None
        ready = [i for i, task in enumerate(tasks) if i not in busy and not task.finished]
        if not ready:
            return None
        fresh = [i for i in ready if not tasks[i].best_ms]
        if fresh:  # first rounds, in order, no bigger than a share: every task gets one
            return fresh[0], min(self.round_trials, tasks[fresh[0]].share, left)
        index = max(ready, key=lambda i: (self.priority(tasks[i]), -i))
        return index, min(self.round_trials, left)


def make_scheduler(name: str, *, round_trials: int) -> TaskScheduler:
    """The scheduler called ``name`` (``"static"`` or ``"gradient"``)."""
    if name == "static":
        return StaticScheduler()
    if name == "gradient":
        return GradientScheduler(round_trials=round_trials)
    raise ValueError(f"scheduler must be 'static' or 'gradient', got {name!r}")
