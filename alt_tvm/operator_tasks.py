"""Tuning tasks for the kernels no strategy implements: operators computed in their operands'
layouts, element-wise chains computed in their consumer's layout, and kernels TVM fused from
the rest (:class:`~alt_tvm.graph.in_layout.OperatorKernel`).

Their schedules are rules (:mod:`alt_tvm.graph.in_layout`) with loop knobs: how many parallel
chunks per core the outer loops are cut into, how wide the vectorised inner piece is, where a pool's
padded copy is computed, the vector width of an element-wise chain
(:class:`~alt_tvm.graph.in_layout.OperatorSchedule`). :class:`OperatorSpace` lets the tuner
search them as it searches a strategy's loop space (ALT paper §5.2: the loop space of an
operator whose layout is fixed by propagation, §4.2). A task's kernel is taken from a lowering
of the whole model, so it reads exactly the layouts its producers write in the untuned build;
its records are named :data:`~alt_tvm.graph.in_layout.OPERATOR_STRATEGY` and the build applies
them where a kernel's workload key (its function's structure) matches.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi

from alt_tvm.graph.in_layout import OPERATOR_STRATEGY, OperatorKernel, schedule_operator
from alt_tvm.graph.lower import lower
from alt_tvm.graph.propagate import AltLayoutPass
from alt_tvm.options import BuildOptions
from alt_tvm.strategies.space import Knob, Space
from alt_tvm.tuning.task import Lowered, Task

__all__ = ["OperatorSpace", "OperatorTask", "operator_tasks"]

_CHUNKS = (0, 1, 2, 4, 8, 16)
_SPLITS = (8, 16, 32, 64)


class OperatorSpace(Space):
    """The loop knobs of one operator kernel (no layout knobs: propagation fixed its layouts).

    ``chunks`` for every kind (0: the rule's parallel loop);
    ``split`` and ``pad_at`` for a legalized operator; ``lanes`` (the rule's width, half of it,
    or LLVM's choice) for an element-wise chain. Each knob keeps the choices that, the others
    at the defaults, schedule the kernel differently (a 7x7 map has no 64-wide piece to split),
    and a knob left with one choice is dropped. The default point is the untuned rule's.
    """

    def __init__(self, kernel: OperatorKernel) -> None:
        self.kind = kernel.kind
        self._default = kernel.default
        candidates: dict[str, tuple] = {"chunks": _CHUNKS}
        if kernel.kind == "operator":
            candidates.update(split=_SPLITS, pad_at=(True, False))
        if kernel.kind == "elementwise" and kernel.lanes:
            candidates["lanes"] = tuple(sorted({0, kernel.lanes, *((kernel.lanes // 2,) if kernel.lanes >= 8 else ())}))
        fields = dataclasses.asdict(self._default)
        if fields["lanes"] is None:
            fields["lanes"] = kernel.lanes
        self._fields = fields
        knobs = []
        for name, choices in candidates.items():
            seen: dict[int, Any] = {}
            for choice in (fields[name], *(c for c in choices if c != fields[name])):
                try:
                    func = schedule_operator(kernel, dataclasses.replace(self._default, **{name: choice}))
                except Exception:  # noqa: BLE001 - a choice this kernel's loops cannot take
                    continue
                seen.setdefault(tvm_ffi.structural_hash(func), choice)
            kept = tuple(c for c in choices if c in seen.values())
            if len(kept) > 1:
                knobs.append(Knob(name, kept))
        self._knobs = tuple(knobs)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return ()

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        return self._knobs

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {knob.name: self._fields[knob.name] for knob in self._knobs}

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        return {knob.name: loop[knob.name] for knob in self._knobs}


@dataclass
class OperatorTask(Task):
    """A tuning task for one operator kernel (``partition`` is None; ``strategy`` names the
    operator schedule, :data:`~alt_tvm.graph.in_layout.OPERATOR_STRATEGY`)."""

    kernel: OperatorKernel | None = None

    def lower(self, params: dict[str, Any] | None) -> Lowered:
        """The kernel scheduled with the knobs ``params`` (None: its defaults)."""
        kernel = self.kernel
        schedule = kernel.default if params is None else dataclasses.replace(kernel.default, **params)
        # Compiled alone, it is the module's entry (a legalized or fused function has no symbol).
        func = schedule_operator(kernel, schedule).with_attr("global_symbol", "main")
        specs = [(tuple(int(d) for d in p.ty.shape), str(p.ty.dtype)) for p in func.params]
        constants = dict(kernel.constants)
        conversions = {i: layout for i, layout in enumerate(kernel.inputs)
                       if layout is not None and not layout.is_identity and i not in constants}
        output = kernel.output if kernel.output is not None and not kernel.output.is_identity else None
        return Lowered(func, specs, constants, conversions, output)


@dataclass(frozen=True)
class _OperatorSchedules:
    """What stands for a strategy in an operator task: the name its records carry."""

    name: str = OPERATOR_STRATEGY
    exact: bool = False


def operator_tasks(mod: Any, options: BuildOptions, *, limit: int | None = None) -> list[OperatorTask]:
    """The tasks of the operator kernels of the imported Relax module ``mod`` built with
    ``options``: one per distinct kernel with a knob that changes its schedule (``weight``: its
    call sites), those moving the most bytes per model run first (buffer sizes x call sites:
    these kernels are bound by memory), at most ``limit`` of them (None: all). The model is
    lowered once (no code generation) to find them."""
    alt_pass = AltLayoutPass(options)
    lower(mod, alt_pass)
    kernels: dict[str, list] = {}  # key -> [kernel, call sites]
    for kernel in alt_pass.operators:
        kernels.setdefault(kernel.key, [kernel, 0])[1] += 1
    tasks: list[OperatorTask] = []
    for kernel, weight in sorted(kernels.values(), key=lambda kw: -kw[1] * _bytes(kw[0].func)):
        if limit is not None and len(tasks) >= limit:
            break
        space = OperatorSpace(kernel)
        if space.loop_knobs({}):
            tasks.append(OperatorTask(kernel.key, _OperatorSchedules(), None, options.target, space, weight,
                                      variant=options.variant, kernel=kernel))
    return tasks


def _bytes(func: Any) -> int:
    """The bytes of a PrimFunc's buffers (what a memory-bound kernel moves per call)."""
    return sum(math.prod(int(d) for d in p.ty.shape) * tvm.DataType(p.ty.dtype).bits // 8 for p in func.params)
