"""The tuning-space contract a strategy offers the tuner: layout knobs and loop knobs.

A *point* is a pair of dicts ``(layout, loop)`` of knob values (ALT paper §5: layout
split factors of the §5.1 templates, then a loop space). :meth:`Space.params` decodes it
into the parameters the strategy's ``implement`` takes (``context.params``), which decode
further into layout primitives and loop primitives when the partition is lowered; invalid
combinations are rejected by :meth:`Space.check` before anything is built. A strategy
returns its space from ``Strategy.space``; the tuner (``alt_tvm.tuning``) searches it
without knowing what the knobs mean.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np


def divisors(extent: int, *, cap: int | None = None) -> tuple[int, ...]:
    cap = extent if cap is None else min(cap, extent)
    return tuple(d for d in range(1, cap + 1) if extent % d == 0)


@dataclass(frozen=True)
class Knob:
    """One tunable parameter and its ordered choices.

    ``extent`` is the dimension a layout split factor tiles (the paper's D in
    ``F = R(D * a)``); loop knobs are walked along ``choices`` by direction actions.
    """

    name: str
    choices: tuple[Any, ...]
    extent: int = 0

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"knob {self.name!r} has no choices")

    def nearest(self, value: float) -> Any:
        """The choice closest to ``value`` (R(.) of the paper, restricted to legal factors)."""
        numeric = np.asarray([float(c) for c in self.choices])
        return self.choices[int(np.argmin(np.abs(numeric - value)))]

    def index(self, value: Any) -> int:
        try:
            return self.choices.index(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a choice of knob {self.name!r}: {list(self.choices)}") from None

    def step(self, value: Any, direction: int) -> Any:
        """Move ``direction`` (-1, 0, +1) choices away from ``value``, clamped at the ends."""
        i = min(max(self.index(value) + direction, 0), len(self.choices) - 1)
        return self.choices[i]


class Space(abc.ABC):
    """The search space of one task."""

    @property
    @abc.abstractmethod
    def layout_knobs(self) -> tuple[Knob, ...]:
        """Split factors of the layout template."""

    @abc.abstractmethod
    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        """Loop knobs given a layout (their choices may depend on it, e.g. blocks of a tile)."""

    @abc.abstractmethod
    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The analytic default point (the untuned build's choice)."""

    def params(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        """The strategy parameters a valid point decodes to.

        Raises
        ------
        ValueError
            If :meth:`check` rejects the point (the message says why).
        """
        why = self.check(layout, loop)
        if why is not None:
            raise ValueError(f"invalid point: {why}")
        return self.decode(layout, loop)

    @abc.abstractmethod
    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        """The strategy parameters of a point :meth:`check` accepted."""

    def check(self, layout: dict[str, Any], loop: dict[str, Any]) -> str | None:
        """``None`` for a valid point, else why it is invalid."""
        for knob in self.layout_knobs:
            if layout.get(knob.name) not in knob.choices:
                return f"layout knob {knob.name}={layout.get(knob.name)!r} not in {list(knob.choices)}"
        for knob in self.loop_knobs(layout):
            if loop.get(knob.name) not in knob.choices:
                return f"loop knob {knob.name}={loop.get(knob.name)!r} not in {list(knob.choices)}"
        return None

    def random_loop(self, layout: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {k.name: k.choices[int(rng.integers(len(k.choices)))] for k in self.loop_knobs(layout)}

    def layout_state(self, layout: dict[str, Any]) -> np.ndarray:
        """The paper's split-primitive state: ``[D / F, F]`` per factor, normalised by D."""
        state = []
        for knob in self.layout_knobs:
            extent = max(1, knob.extent)
            factor = layout[knob.name]
            state += [extent / factor / extent, factor / extent]
        return np.asarray(state, dtype=np.float32)

    def loop_state(self, layout: dict[str, Any], loop: dict[str, Any]) -> np.ndarray:
        knobs = self.loop_knobs(layout)
        return np.asarray([k.index(loop[k.name]) / max(1, len(k.choices) - 1) for k in knobs], dtype=np.float32)
