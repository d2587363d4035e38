"""``alt_tvm.build``: a Relax model to a callable module, through the strategy registry.

The flow (what ``relay.build`` with registered op strategies was, on Relax):

1. import (ONNX file/proto, torch module, Relax IRModule), weights as constants;
2. ``DecomposeOpsForInference`` + ``FoldConstant`` (batch norm to arithmetic, constant
   reshapes/transposes of weights folded);
3. :class:`AltLayoutPass`: partition into anchor + epilogue, lower each partition with
   the selected strategy into one scheduled PrimFunc (``call_tir``), propagate layouts
   along the partition and to the next partitions, insert a conversion only where a
   consumer needs another layout and no pad stage can convert for it; kernels that come
   out structurally equal share one function;
4. TVM's legalization for everything left (:func:`lower_fallbacks`); a kernel that is the
   last use of an operand it reads element by element writes over it (:mod:`.inplace`);
5. ``tvm.compile`` and the Relax VM.
"""

from __future__ import annotations

import logging
import os
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te

from alt_tvm import lowering
from alt_tvm.deploy.model import RunnableModel, use_runtime_threads
from alt_tvm.deploy.profile import KernelInfo, KernelProfile
from alt_tvm.flops import relax_flops
from alt_tvm.layout import Layout, convert_layout, rewrite
from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.native_log import tvm_output_to_log
from alt_tvm.records import RecordWarning, TunedLog, read_log
from alt_tvm.strategies import registry
from alt_tvm.strategies.base import (
    Partition,
    PartitionContext,
    Strategy,
    dtype_of,
    equivalent,
    op_name,
    static_shape,
    workload_key,
)
from alt_tvm.strategies.epilogue import epilogue_te, joinable
from alt_tvm.target import HardwareTarget, host, not_on_host, resolve

from .ieee import legalize_overrides
from .in_layout import (
    channel_blocked,
    channel_vector,
    elementwise_lanes,
    legalize_alone,
    parallelize,
    relayout,
    schedule_concat,
    schedule_in_layout,
)
from .inplace import write_in_place
from .partition import consumers, plan_partitions, tail_pieces
from .prepare import prepare

LOGGER = logging.getLogger("alt_tvm")
VARIANTS = ("alt", "alt-wp", "alt-ol")
#: PrimFunc attribute marking kernels that alt-tvm scheduled itself.
ALT_KERNEL_ATTR = "alt_tvm.kernel"


@dataclass(frozen=True)
class Kernel:
    """A kernel the build emitted itself, and what it is for.

    Attributes
    ----------
    name
        Its function name in the built module (what per-kernel timing reports). Call sites
        whose kernels are structurally equal share one function, and so one name.
    kind
        ``"partition"`` (a strategy's kernel), ``"conversion"`` (a layout conversion),
        ``"elementwise"`` (an element-wise op computed in its consumer's layout) or
        ``"operator"`` (an op without a strategy, legalized by TVM and computed in its
        operands' layouts: :mod:`alt_tvm.graph.in_layout`).
    workload
        The workload key of the partition it computes or, for a conversion, of the
        partition whose layout choice made it necessary (its consumer for an input
        conversion, its producer for a conversion back to the canonical layout); "" if none.
    detail
        For a conversion: the tensor shape and the two layouts.
    ops
        The Relax operators it computes, in program order.
    layout
        The layout of its output ("" for the canonical one).
    boundary
        For a conversion: it converts a model input or output (the user's row-major
        arrays), not a value between two kernels.
    flops
        For a partition: the FLOPs of its convolutions and matrix products
        (:func:`alt_tvm.flops.relax_flops`); None where it has none.
    """

    name: str
    kind: str
    workload: str = ""
    detail: str = ""
    ops: tuple[str, ...] = ()
    layout: str = ""
    boundary: bool = False
    flops: int | None = None


@dataclass
class BuildReport:
    """What the build did: strategies per partition, fallbacks, conversions inserted."""

    partitions: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (strategy, anchor op, ops)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)  # op -> reasons no strategy applied
    conversions: int = 0
    tuned: int = 0  # partitions built with tuned parameters
    #: workload key of every partition a strategy lowered, in program order (what tuning records key)
    workloads: list[str] = field(default_factory=list)
    #: the tuning log applied (None: built with the strategies' analytic defaults)
    log: str | None = None
    #: (workload key, why the log tuned it not) for each tunable partition built untuned
    untuned: list[tuple[str, str]] = field(default_factory=list)
    #: (workload key, why) for each tunable partition the log's in-model decision keeps at the defaults
    kept_default: list[tuple[str, str]] = field(default_factory=list)
    #: workload key -> why the strategy the log chose for it was not used
    refused: dict[str, str] = field(default_factory=dict)
    #: workload key -> the strategy the log chose for it instead of the priority rule's
    chosen_strategies: dict[str, str] = field(default_factory=dict)
    #: every kernel the build emitted itself, in program order
    kernels: list[Kernel] = field(default_factory=list)
    #: workload key -> why its strategy failed; the partition was left to TVM's legalization
    failed: dict[str, str] = field(default_factory=dict)
    #: kernel calls that write their output over an operand they are the last use of
    #: (:mod:`alt_tvm.graph.inplace`)
    in_place: int = 0
    #: kernel name -> why a pass after lowering left that kernel as it was (the fallbacks'
    #: scheduling, the in-place rewrite): the build goes on without that pass's change to it
    left_as_is: dict[str, str] = field(default_factory=dict)

    @property
    def changed_by_log(self) -> bool:
        """Whether the log changed any kernel: a partition built with tuned parameters or
        with the strategy the log chose. False without a log, and where the log's in-model
        check kept every default (the build then emits the untuned build's kernels)."""
        return self.tuned > 0 or bool(self.chosen_strategies)

    def tuning_summary(self) -> str:
        """How much of the model the log tuned, and why the rest was not ("" without a log)."""
        if self.log is None:
            return ""
        total = self.tuned + len(self.untuned) + len(self.kept_default)
        line = f"{self.tuned} of {total} tunable partitions tuned from {self.log}"
        if self.kept_default:
            line += f", {len(self.kept_default)} kept at the defaults by the log's in-model decisions"
        reasons: dict[str, int] = {}
        for _, reason in self.untuned:
            reasons[reason] = reasons.get(reason, 0) + 1
        lines = [line]
        if self.chosen_strategies:
            names = sorted(set(self.chosen_strategies.values()))
            lines.append(f"{len(self.chosen_strategies)} partitions lowered with the strategy the log chose "
                         f"by in-model time ({', '.join(names)})")
        lines += [f"  {n} untuned: {reason}" for reason, n in reasons.items()]
        lines += [f"  {key.split('|')[0]}: {reason}" for key, reason in self.refused.items()]
        return "\n".join(lines)

    def summary(self, profile: KernelProfile | None = None) -> str:
        """What the build did; with a ``profile`` (:meth:`CompiledModel.profile`), every layout
        conversion is listed with its measured time in the model."""
        boundary = sum(k.boundary for k in self.kernels)
        lines = [f"{len(self.partitions)} partitions ({self.tuned} tuned), {self.conversions} layout conversions"
                 + (f" ({boundary} of model inputs/outputs)" if boundary else "")]
        in_layout = sum(k.kind == "operator" for k in self.kernels)
        if in_layout:
            lines[0] += f", {in_layout} ops without a strategy computed in their operands' layouts"
        if self.in_place:
            lines[0] += f", {self.in_place} kernel calls writing over a dead operand"
        if self.log is not None:
            lines.append(self.tuning_summary())
        for op, reasons in sorted(self.fallbacks.items()):
            lines.append(f"fell back to TVM's legalization: {op}" + (f" ({'; '.join(reasons)})" if reasons else ""))
        lines += [f"kernel {name} {why}" for name, why in sorted(self.left_as_is.items())]
        if profile is not None and self.conversions:
            rows = profile.conversions(self.kernels)
            total = sum(ms for *_, ms in rows)
            share = total / statistics.median(profile.totals_ms) * 100 if profile.totals_ms else 0.0
            lines.append(f"layout conversions in the model: {total:.3f} ms ({share:.1f}% of a run)")
            lines += [f"  {name}: {ms:.3f} ms for {op}: {detail}" for name, detail, op, ms in rows]
        return "\n".join(lines)


class AltLayoutPass:
    """The Relax pass: lower registered operators through strategies, with layout propagation.

    Usable in a user's own pipeline: ``mod = AltLayoutPass(target=...)(mod)`` before ``tvm.compile``.
    """

    def __init__(self, *, target: HardwareTarget | str | None = None, variant: str = "alt",
                 strategies: Sequence[str] | None = None, records: TunedLog | str | os.PathLike | None = None,
                 strategy_options: dict[str, Any] | None = None, fast_math: bool = False,
                 strict: bool = False, excluded: Mapping[str, str] | None = None) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {list(VARIANTS)}")
        self.target = resolve(target)
        self.variant = variant
        self.allowed = registry.check_names(strategies)
        if records is not None and not isinstance(records, TunedLog):
            records = read_log(records, target=self.target)
        #: the tuning log's best records for this target (None: analytic defaults)
        self.records = records
        self.strategy_options = registry.check_strategy_options(strategy_options)
        #: epilogues may use max/min/clip forms that drop NaN (``alt_tvm.ops.ieee``)
        self.fast_math = bool(fast_math)
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {strict!r}")
        #: re-raise a strategy's failure instead of leaving its partition to TVM's legalization
        self.strict = strict
        #: workload key -> why: partitions left to TVM's legalization whatever their strategy
        #: (kernels that failed to compile in an earlier attempt of this build)
        self.excluded = dict(excluded or {})
        self.report = BuildReport(log=None if records is None else records.path)
        #: partition output var -> the layout its reader asked it to be written in
        self.requested: dict = {}

    def __call__(self, mod: tvm.IRModule) -> tvm.IRModule:
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            raise ValueError("the Relax module has no 'main' function")
        func = mod["main"]
        plan = plan_partitions(func, target=self.target, variant=self.variant, allowed=self.allowed,
                               strategy_options=self.strategy_options,
                               chosen=None if self.records is None or self.variant == "alt-ol"
                               else self.records.strategies)
        self.report.refused.update(plan.refused)
        self.report.chosen_strategies.update(plan.overridden)
        for name, reasons in plan.fallbacks.items():
            known = self.report.fallbacks.setdefault(name, [])
            known.extend(r for r in reasons if r not in known)
        partitions, selected = plan.partitions, plan.strategies
        backward = self._backward_layouts(func, partitions, selected) if self.variant != "alt-wp" else {}
        self.requested = self._requested_layouts(func, partitions, selected) if self.variant != "alt-wp" else {}
        mutator = _Mutator(mod, partitions, selected, self, backward, _elementwise_chains(func, backward))
        new_func = mutator.visit_expr(func)
        new_mod = mutator.builder_.get()
        new_mod["main"] = relax.analysis.remove_all_unused(new_func)
        return new_mod


    def context_for(self, partition: Partition, strategy: Strategy, input_layouts: dict, *,
                    tuned: bool = True) -> PartitionContext:
        """The context ``partition`` is lowered in: its tuned parameters (none for ALT-OL, the
        loop-only ablation keeps the analytic tiles, or when ``tuned`` is False) and the
        build's options for ``strategy``."""
        record = None
        if tuned and self.records is not None and self.variant != "alt-ol":
            record = self.records.params_for(workload_key(partition), strategy.name)
        return PartitionContext(partition, self.target, self.variant, input_layouts,
                                params=None if record is None else record.candidate["params"],
                                options=self.strategy_options.get(strategy.name), fast_math=self.fast_math,
                                output_layout=self.requested.get(partition.output))

    def lower(self, partition: Partition, strategy: Strategy, input_layouts: dict) -> tuple[PartitionContext, Any]:
        """Lower ``partition`` with ``strategy`` (tuned where the log has its workload) and
        note in the report whether it was tuned and, if not, why.

        Tuned parameters the strategy rejects (a record of another alt-tvm version, a
        hand-edited log) are skipped with a :class:`~alt_tvm.records.RecordWarning` naming
        the record's ``path:line``, and the partition is lowered with the defaults.
        """
        context = self.context_for(partition, strategy, input_layouts)
        key = context.workload_key
        self.report.workloads.append(key)
        why = ""
        if context.params is not None:
            try:
                lowered = strategy.implement(partition.anchor, context)
            except Exception as err:  # noqa: BLE001 - any failure of bad parameters falls back
                source = self.records.best[key].source
                why = f"the tuned parameters at {source} were rejected ({type(err).__name__}: {err})"
                warnings.warn(f"{source}: skipped tuned parameters for {key.split('|')[0]}: "
                              f"{type(err).__name__}: {err}", RecordWarning, stacklevel=2)
            else:
                self.report.tuned += 1
                return context, lowered
        context = self.context_for(partition, strategy, input_layouts, tuned=False)
        lowered = strategy.implement(partition.anchor, context)
        tunable = strategy.space(partition.anchor, context) is not None
        if self.records is not None and self.variant != "alt-ol" and tunable:
            if not why and key in self.records.defaults:
                self.report.kept_default.append((key, self.records.defaults[key]))
            else:
                self.report.untuned.append((key, why or self.records.why_not(key)))
        return context, lowered

    def _requested_layouts(self, func: relax.Function, partitions: list[Partition], selected: dict) -> dict:
        """Output layouts asked of partitions by the partition that reads their output
        through views (:meth:`Strategy.preferred_source_layouts`): attention asks for Q, K
        and V in their heads' blocks. Asked only where that partition is the value's only
        reader. Returns: partition output var -> Layout."""
        users = consumers(func)
        outputs = {p.output for p in partitions}
        requested: dict = {}
        for partition in partitions:
            members = {b.var for b in partition.bindings}
            for source, layout in selected[partition.anchor.var].preferred_source_layouts(partition).items():
                if source in outputs and isinstance(source, relax.DataflowVar) \
                        and all(u in members for u in users.get(source, [])):
                    requested[source] = layout
        return requested

    def _backward_layouts(self, func: relax.Function, partitions: list[Partition], selected: dict) -> dict:
        """Layouts to propagate backwards onto element-wise producers (paper §4.2, §6).

        A partition whose input would need a conversion op (no pad stage to convert) and
        whose input comes from element-wise ops outside any partition gets those ops
        computed directly in the layout it wants: the ops then convert for free, as a pad
        does. Only sequences without data-expanding primitives propagate, only along
        same-shape values with a single consumer; a binary op passes the layout to both
        operands (the §6 rule when the consumer's layout is decided first).
        """
        users = consumers(func)
        producers = {b.var: b for block in func.body.blocks for b in block.bindings}
        members = {b.var for p in partitions for b in p.bindings}
        wanted: dict = {}
        preferred: dict = {}  # var -> the layouts the partitions reading it as data prefer
        for partition in partitions:
            data = partition.anchor.value.args[0]
            strategy = selected[partition.anchor.var]
            layout = strategy.preferred_input_layout(partition.anchor, self.context_for(partition, strategy, {}))
            preferred.setdefault(data, []).append(layout)
        for data, layouts in preferred.items():
            producer = producers.get(data)
            layout = layouts[0]
            if (producer is None or data in members or layout is None or not layout.stores_each_once
                    or equivalent(layout, None, static_shape(data)) or any(other != layout for other in layouts)):
                continue
            if not _standalone_elementwise(producer, users):
                # Another op (a max pool, a concatenation): _emit_in_layout writes the layout
                # every partition reading it prefers (its other readers read any layout).
                # Not propagated further up.
                if isinstance(data, relax.DataflowVar):
                    wanted[data] = layout
                continue
            shape = static_shape(data)
            stack = [data]
            while stack:
                var = stack.pop()
                binding = producers.get(var)
                if (binding is None or var in members or var in wanted or static_shape(var) != shape
                        or not _standalone_elementwise(binding, users)):
                    continue
                wanted[var] = layout
                stack.extend(a for a in binding.value.args if isinstance(a, relax.Var))
        return wanted


def _elementwise_chains(func: relax.Function, backward: dict) -> dict:
    """The element-wise ops computed in a propagated layout, grouped into one kernel each.

    An op of ``backward`` whose only consumer is another such op (a batch norm's multiply
    and add before its ReLU) is computed inside its consumer's kernel, so the chain makes
    one pass over memory instead of one per op. Returns: last op of a chain -> the chain's
    bindings in program order (a lone op is a chain of one).
    """
    users = consumers(func)
    order = [b for block in func.body.blocks for b in block.bindings if b.var in backward and joinable(b.value)]
    producers = {b.var: b for b in order}
    inner = {var for var in producers if len(users.get(var, [])) == 1 and users[var][0] in producers}
    position = {b.var: i for i, b in enumerate(order)}
    chains: dict = {}
    for var in producers:
        if var in inner:
            continue
        chain, stack = [], [producers[var]]
        while stack:  # the members this op reads, directly or not (a tree: each has one consumer)
            binding = stack.pop()
            chain.append(binding)
            stack.extend(producers[a] for a in binding.value.args if isinstance(a, relax.Var) and a in inner)
        chains[var] = sorted(chain, key=lambda b: position[b.var])
    return chains


def _stored(layout: Layout | None) -> str:
    """A layout as the shape it stores, e.g. ``1x8x56x56x8`` ("" when canonical)."""
    return "" if layout is None or layout.is_identity else "x".join(str(int(d)) for d in layout.shape)


def _standalone_elementwise(binding: relax.VarBinding, users: dict) -> bool:
    return joinable(binding.value) and len(users.get(binding.var, [])) == 1 \
        and isinstance(binding.var, relax.DataflowVar)


def pipeline(*, target: HardwareTarget | str | None = None, records: Any = None, variant: str = "alt",
             strategies: Sequence[str] | None = None, strategy_options: dict[str, Any] | None = None,
             fast_math: bool = False) -> tvm.ir.transform.Pass:
    """alt-tvm's build as a Relax pipeline, for ``tvm.compile`` on a module from any frontend::

        executable = tvm.compile(mod, target=host().to_tvm(), relax_pipeline=alt_tvm.pipeline(records=log),
                                 tir_pipeline=alt_tvm.lowering.PIPELINE)

    (``tir_pipeline`` keeps the kernels' small buffers on the stack, as :func:`build` does:
    :mod:`alt_tvm.lowering`.) It is what :func:`build` runs between import and code generation:
    :func:`prepare`, :class:`AltLayoutPass` (each partition lowered by the strategy the registry
    selects, with the log's parameters), :func:`lower_fallbacks`, :func:`~alt_tvm.graph.inplace.write_in_place`,
    then TVM's default Relax pipeline. So the
    executable equals ``build``'s, except that ``build`` also rebuilds without a kernel that
    fails to compile, which one pass cannot. Weights must be constants in ``mod``
    (``relax.frontend.detach_params`` + ``bind_params``, or ``keep_params_as_input=False``).
    The build summary goes to the ``alt_tvm`` logger. Parameters are :func:`build`'s.
    """
    machine = resolve(target)
    log = _tuning_log(records, machine)

    def transform(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        alt_pass = AltLayoutPass(target=machine, variant=variant, strategies=strategies, records=log,
                                 strategy_options=strategy_options, fast_math=fast_math)
        lowered = _lower(mod, alt_pass, machine, fast_math=fast_math)
        _log_report(alt_pass.report)
        return lowered

    tvm_target = machine.to_tvm()
    rest = relax.get_default_pipeline(tvm_target) if "gpu" in tvm_target.keys else relax.get_pipeline("default")
    return tvm.ir.transform.Sequential([tvm.ir.transform.module_pass(transform, opt_level=0, name="AltTvm"), rest],
                                       name="alt_tvm.pipeline")


def _tuning_log(records: Any, machine: HardwareTarget) -> TunedLog | None:
    """``records`` (a path or ``read_log``'s result) as the log to apply on ``machine``."""
    if records is None or isinstance(records, TunedLog):
        return records
    if not isinstance(records, (str, os.PathLike)):
        raise TypeError(f"records must be the path of a tuning log (or read_log's result), "
                        f"got {type(records).__name__} {records!r}")
    if not os.path.exists(records):
        raise FileNotFoundError(f"tuning log {os.fspath(records)!r} does not exist (write one with alt_tvm.tune)")
    return read_log(records, target=machine)


def _lower(mod: tvm.IRModule, alt_pass: AltLayoutPass, machine: HardwareTarget, *, fast_math: bool) -> tvm.IRModule:
    """An imported module with every partition lowered by its strategy and the rest by TVM,
    scheduled; a kernel that is the last use of an operand it can overwrite writes in place."""
    with machine.to_tvm():
        lowered = lower_fallbacks(alt_pass(prepare(mod)), cores=machine.num_cores, fast_math=fast_math,
                                  unscheduled=None if alt_pass.strict else alt_pass.report.left_as_is)
    lowered, alt_pass.report.in_place, skipped = write_in_place(lowered, attr=ALT_KERNEL_ATTR,
                                                                strict=alt_pass.strict)
    alt_pass.report.left_as_is.update(skipped)
    return lowered


@relax.expr_functor.mutator
class _Mutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, partitions: list[Partition], selected: dict, owner: AltLayoutPass,
                 backward: dict, chains: dict):
        super().__init__(mod)
        self.owner = owner
        self.backward = backward  # element-wise var -> layout its consumer wants
        self.chains = chains  # last element-wise op of a chain -> the chain's bindings
        self.chained = {b.var for chain in chains.values() for b in chain[:-1]}
        self.selected = selected
        self.final = {p.output: p for p in partitions}
        self.members = {b.var for p in partitions for b in p.bindings}
        self.layouts: dict = {}  # original var -> (new var holding the value, its Layout)
        self.owners: dict = {}  # original var -> workload key of the partition that chose its layout
        self.canonical: dict = {}  # original var -> new var in canonical layout
        self.count = 0
        self.emitted: dict[int, list[tuple[tvm.tirx.PrimFunc, relax.GlobalVar, str]]] = {}  # hash -> kernels

    # ----------------------------------------------------------------- helpers
    def _emit_call(self, func: tvm.tirx.PrimFunc, kernel: Kernel, args: list, shape, dtype: str) -> relax.Var:
        """Call ``func`` on ``args`` and record ``kernel``. A kernel structurally equal to one
        already emitted (DenseNet's 3x3 convs within a block, ResNet's repeated bottlenecks)
        calls that function instead: the module compiles each distinct kernel once."""
        # kOpaque (8): TVM's FuseOps must not merge a scheduled alt-tvm kernel with others.
        func = func.with_attr("op_pattern", 8).with_attr(ALT_KERNEL_ATTR, True)
        same = self.emitted.setdefault(tvm_ffi.structural_hash(func), [])
        gvar, symbol = next(((g, name) for f, g, name in same if tvm_ffi.structural_equal(f, func)), (None, None))
        if gvar is None:
            # The builder may rename the global var apart from a binding's name; the VM and
            # the profile know the kernel by its symbol.
            symbol = kernel.name
            gvar = self.builder_.add_func(func.with_attr("global_symbol", symbol), symbol)
            same.append((func, gvar, symbol))
        self.owner.report.kernels.append(replace(kernel, name=symbol))
        call = relax.call_tir(gvar, args, relax.TensorType(shape, dtype))
        return self.builder_.emit(call, kernel.name)

    def _convert(self, value: relax.Var, src: Layout | None, dst: Layout | None, shape, dtype: str, *,
                 workload: str, boundary: bool) -> relax.Var:
        """Emit a conversion of ``value`` (``boundary``: of a model input or output)."""
        src = src or Layout(shape)
        dst = dst or Layout(shape)
        placeholder = te.placeholder(src.shape, dtype=dtype, name="src")
        out = convert_layout(placeholder, src=src, dst=dst)
        sch = tvm.s_tir.Schedule(te.create_prim_func([placeholder, out]))
        loops = sch.get_loops(sch.get_sblock(out.op.name))
        sch.parallel(sch.fuse(*loops[: max(1, min(2, len(loops) - 1))]))
        self.owner.report.conversions += 1
        self.count += 1
        name = f"layout_convert{self.count}"
        kernel = Kernel(name, "conversion", workload, f"{tuple(shape)} {src} -> {dst}", ("layout_transform",),
                        _stored(dst), boundary=boundary)
        return self._emit_call(sch.mod["main"], kernel, [value], dst.shape, dtype)

    def _canonical_arg(self, var: relax.Var, *, boundary: bool = False) -> None:
        """Before a default (non-partition) use, make ``var`` available in canonical layout
        (``boundary``: the use is the model's output)."""
        if var not in self.layouts or var in self.canonical:
            return
        new_var, layout = self.layouts[var]
        self.canonical[var] = self._convert(new_var, layout, None, static_shape(var), dtype_of(var),
                                            workload=self.owners.get(var, ""),
                                            boundary=boundary or not isinstance(var, relax.DataflowVar))
        self.set_var_remap(var, self.canonical[var])

    # ---------------------------------------------------------------- bindings
    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var in self.members and var not in self.final:
            return  # computed inside its partition's kernel
        if var in self.final:
            self._emit_partition(self.final[var])
            return
        if var in self.chained:
            return  # computed inside the kernel of its chain's last op
        if var in self.chains:
            self._emit_elementwise(self.chains[var], self.backward[var])
            return
        name = op_name(binding.value)
        if name is not None and name not in self.owner.report.fallbacks:
            self.owner.report.fallbacks[name] = [] if name in registry.strategy_ops() else ["no alt-tvm strategy"]
        if self._emit_in_layout(binding):
            return
        for used in relax.analysis.free_vars(binding.value):
            # A tuple or an alias of values (not a call) is how the model returns them.
            self._canonical_arg(used, boundary=not isinstance(binding.value, relax.Call))
        super().visit_var_binding_(binding)

    def _emit_in_layout(self, binding: relax.VarBinding) -> bool:
        """Emit an op no strategy implements, TVM-legalized but reading its operands in the
        layouts their producers wrote (and writing the layout its consumers want): no
        conversion kernel around it. False (nothing emitted) when it cannot be."""
        var, call = binding.var, binding.value
        wanted = self.backward.get(var)
        tiled = [v for v in relax.analysis.free_vars(call) if v in self.layouts and v not in self.canonical]
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or (not tiled and wanted is None):
            return False
        leaves = not isinstance(var, relax.DataflowVar)  # a model output: written row-major, no conversion after
        if wanted is None and not leaves:
            # Forward (ALT §4.2): an output of an operand's shape keeps that operand's layout.
            wanted = next((self.layouts[v][1] for v in tiled if static_shape(v) == static_shape(var)), None)
        if wanted is None and not leaves and tiled and any(word in op_name(call) for word in ("pool", "concat")):
            # A pooled or concatenated map stays in channel vectors (NCHWc), so its window
            # loads are whole vectors; its consumers read that layout directly.
            lanes = self.owner.target.vector_lanes(dtype_of(var))
            wanted = channel_vector(static_shape(var), lanes, self.layouts[tiled[0]][1]) if "pool" in op_name(call) \
                else channel_blocked(static_shape(var), lanes)
        if not all(layout.stores_each_once for layout in [*(self.layouts[v][1] for v in tiled), wanted] if layout):
            return False
        legal = legalize_alone(call, module=self.builder_.get(), fast_math=self.owner.fast_math)
        if legal is None:
            return False
        args, inputs = [], []
        for arg in legal.args:
            current = self.layouts.get(arg) if isinstance(arg, relax.Var) and arg not in self.canonical else None
            args.append(current[0] if current else self.visit_expr(arg))
            inputs.append(current[1] if current else None)
        cores = self.owner.target.num_cores
        try:
            func = relayout(legal.func, inputs, wanted)
            concat = None
            if op_name(call) == "relax.concat" and isinstance(call.args[0], relax.Tuple):
                axis = int(call.attrs.axis) % len(static_shape(var))
                concat = schedule_concat(func, cores=cores, output=wanted, axis=axis,
                                         sizes=[static_shape(f)[axis] for f in call.args[0].fields])
            func = concat or schedule_in_layout(func, cores=cores, output=wanted, inputs=inputs)
        except Exception:  # noqa: BLE001 - a layout TIR cannot express: convert instead
            return False
        self.count += 1
        name = f"alt_{op_name(call).split('.')[-1]}_{self.count}"
        kernel = Kernel(name, "operator", ops=(op_name(call),), layout=_stored(wanted))
        shape = static_shape(var) if wanted is None else wanted.shape
        new_var = self._emit_call(func, kernel, args, shape, dtype_of(var))
        if wanted is None:
            self._rebind(var, new_var)
        else:
            self._hold(var, new_var, wanted)
        return True

    def _emit_elementwise(self, chain: list[relax.VarBinding], layout: Layout) -> None:
        """A chain of element-wise ops computed directly in ``layout`` (backward propagation),
        as one kernel: intermediate values are inlined, never stored."""
        values: dict = {}  # chain var -> its TE stage
        args, layouts, inputs = [], TensorMap(), []
        for k, binding in enumerate(chain):
            operands = []
            for j, arg in enumerate(binding.value.args):
                shape = static_shape(arg)
                if arg in values:
                    operands.append(values[arg])
                    continue
                if shape is None:
                    operands.append(None)
                    continue
                tensor = te.placeholder(shape, dtype=dtype_of(arg), name=f"in{k}_{j}")
                operands.append(tensor)
                inputs.append(tensor)
                if isinstance(arg, relax.Var) and arg in self.layouts:
                    args.append(self.layouts[arg][0])
                    layouts[tensor] = self.layouts[arg][1]
                else:
                    args.append(self.visit_expr(arg))
            values[binding.var] = epilogue_te(binding.value, operands, index=k, fast_math=self.owner.fast_math)
            layouts[values[binding.var]] = layout
        out = values[chain[-1].var]
        result = rewrite([out], layouts=layouts)
        sch = tvm.s_tir.Schedule(te.create_prim_func([*(result[t] for t in inputs), result[out]]))
        for binding in chain[:-1]:
            sch.compute_inline(sch.get_sblock(result[values[binding.var]].op.name))
        lanes = elementwise_lanes(layout, [(tensor.shape, layouts.get(tensor)) for tensor in inputs])
        inner = sch.get_loops(sch.get_sblock(result[out].op.name))[-1]
        if lanes and int(sch.get(inner).extent) % lanes == 0:
            # LLVM left the lane loop scalar: EfficientNet-B0's squeeze-excitation scale on its
            # 7x7 maps took 28-36 us a call, 5 vectorized (in the model, 2 threads).
            sch.vectorize(sch.split(inner, [None, lanes])[1] if int(sch.get(inner).extent) > lanes else inner)
        func = parallelize(sch.mod["main"], self.owner.target.num_cores)
        self.count += 1
        ops = tuple(op_name(b.value) for b in chain)
        name = f"alt_{ops[-1].split('.')[-1]}_{self.count}"
        kernel = Kernel(name, "elementwise", ops=ops, layout=_stored(layout))
        new_var = self._emit_call(func, kernel, args, layout.shape, dtype_of(chain[-1].var))
        self._hold(chain[-1].var, new_var, layout)
        for op in ops:
            self.owner.report.partitions.append(("alt", op, [op]))

    def _emit_partition(self, partition: Partition) -> None:
        strategy = self.selected[partition.anchor.var]
        input_layouts = {}
        for binding in partition.bindings:
            for used in relax.analysis.free_vars(binding.value):
                if used in self.layouts:
                    input_layouts[used] = self.layouts[used][1]
        excluded = self.owner.excluded.get(workload_key(partition))
        if excluded is not None:
            self._fall_back(partition, strategy, RuntimeError(excluded))
            return
        try:
            context, lowered = self.owner.lower(partition, strategy, input_layouts)
        except Exception as err:  # noqa: BLE001 - one partition's failure must not take the build down
            if self.owner.strict:
                raise
            self._fall_back(partition, strategy, err)
            return
        args = []
        for arg in lowered.args:
            if isinstance(arg, relax.Var):
                if arg in context.conversions:
                    current = self.layouts[arg] if arg in self.layouts else (self.visit_expr(arg), None)
                    arg = self._convert(current[0], current[1], context.conversions[arg], static_shape(arg),
                                        dtype_of(arg), workload=context.workload_key,
                                        boundary=not isinstance(arg, relax.DataflowVar))
                elif arg in self.layouts:
                    arg = self.layouts[arg][0]
                else:
                    arg = self.visit_expr(arg)
            args.append(arg)
        self.count += 1
        name = f"alt_{partition.ops[0].split('.')[-1]}_{self.count}"
        layout = lowered.output_layout
        kernel = Kernel(name, "partition", context.workload_key, ops=tuple(partition.ops), layout=_stored(layout),
                        flops=relax_flops(partition.bindings))
        out = partition.output
        if lowered.packed_func is not None:
            self.owner.report.kernels.append(kernel)
            call = relax.call_dps_packed(lowered.packed_func, args,
                                         relax.TensorType(lowered.output_shape, lowered.output_dtype))
            new_var = self.builder_.emit(call, name)
        else:
            new_var = self._emit_call(lowered.func, kernel, args, lowered.output_shape, lowered.output_dtype)
        self.owner.report.partitions.append((lowered.strategy, partition.ops[0], partition.ops))
        if lowered.output_layout is not None:
            self.owners[out] = context.workload_key
            # alt-wp: no propagation; convert back at every boundary, consumers see canonical data.
            self._hold(out, new_var, lowered.output_layout, canonical=self.owner.variant == "alt-wp")
            return
        self._rebind(out, new_var)

    def _fall_back(self, partition: Partition, strategy: Strategy, err: Exception) -> None:
        """Emit ``partition``'s ops unchanged, for TVM's legalization, after ``strategy`` failed on it."""
        report = self.owner.report
        key = workload_key(partition)
        if report.workloads and report.workloads[-1] == key:
            report.workloads.pop()  # noted by lower() before the strategy failed
        message = (str(err).strip().splitlines() or [""])[0][:300]
        if not message.startswith(type(err).__name__):
            message = f"{type(err).__name__}: {message}"
        reason = f"strategy {strategy.name!r} failed on {key.split('|')[0]} {key.split('|')[1]}: {message}"
        report.failed[key] = reason
        pieces = tail_pieces(partition)
        if pieces:
            # A fused block or norm that failed: its pieces are lowered one by one instead.
            for piece in pieces:
                if piece.anchor.var in self.selected:
                    self._emit_partition(piece)
                else:
                    for binding in piece.bindings:
                        for used in relax.analysis.free_vars(binding.value):
                            self._canonical_arg(used)
                        super().visit_var_binding_(binding)
            return
        known = report.fallbacks.setdefault(partition.ops[0], [])
        if reason not in known:
            known.append(reason)
        for binding in partition.bindings:
            for used in relax.analysis.free_vars(binding.value):
                self._canonical_arg(used)
            super().visit_var_binding_(binding)

    def _hold(self, var: relax.Var, value: relax.Var, layout: Layout, *, canonical: bool = False) -> None:
        """``value`` holds ``var`` stored in ``layout``; a value that leaves the dataflow block
        (a model output), or any with ``canonical``, is also handed on in canonical layout."""
        self.layouts[var] = (value, layout)
        if canonical or not isinstance(var, relax.DataflowVar):
            self._canonical_arg(var)
            self._rebind(var, self.canonical[var])

    def _rebind(self, original: relax.Var, value: relax.Var) -> None:
        if isinstance(original, relax.DataflowVar):
            self.set_var_remap(original, value)
        else:
            self.set_var_remap(original, self.builder_.emit_output(value, original.name))


# ------------------------------------------------------------------------------ build
class CompiledModel(RunnableModel):
    """A built model: call it on NumPy arrays; ``report`` says how it was built.

    ``export(path)`` writes it as an artifact that :func:`alt_tvm.load` runs without
    rebuilding, here or (cross-compiled) on a board.
    """

    def __init__(self, executable, mod: tvm.IRModule, report: BuildReport, input_shapes, input_dtypes,
                 input_names, device=None, *, target: HardwareTarget | None = None, source: str | None = None,
                 threads: int | None = None) -> None:
        self.target = target if target is not None else host()
        why = "it needs a cross compiler" if self.target.cross_compiler else not_on_host(self.target.tvm_target)
        not_here = None if why is None else (
            f"this model was built for {self.target.name!r} ({self.target.description}), not for this machine "
            f"({why}): export it (model.export(path)) and run it there with alt_tvm.load, or through a tracker with "
            f"alt_tvm.load(path, remote='host:port', key=...)")
        super().__init__(executable, input_names=input_names, input_shapes=input_shapes, input_dtypes=input_dtypes,
                         device=device, not_here=not_here, threads=threads if not_here is None else None)
        self.mod = mod
        self.report = report
        self.source = source
        self._kernel_info: dict[str, KernelInfo] | None = None
        self._library = None

    def _runtime_module(self):
        """The model's code linked with alt-tvm's parallel launcher, loaded (at the first call)."""
        if self._library is None:
            from alt_tvm.deploy.parallel import link_and_load

            if self._threads is not None and self._threads > 1:
                self._library, launcher = link_and_load(self.executable, threads=self._threads)
                self._use_launcher(launcher)
            else:  # one thread: every launch would run inline anyway
                self._library = self.executable
        return self._library

    def export(self, path: str | os.PathLike) -> Path:
        """Write the model as an artifact directory (see :mod:`alt_tvm.deploy.artifact`).

        Cross-compiled (with the target's gcc) when the model was built for a board.
        Returns the directory.
        """
        from alt_tvm.deploy.artifact import write_artifact

        return write_artifact(path, executable=self.executable, target=self.target, input_names=self.input_names,
                              input_shapes=self.input_shapes, input_dtypes=self.input_dtypes,
                              kernels=self.kernel_info(), report=self.report.summary(), source=self.source)

    def kernel_info(self) -> dict[str, KernelInfo]:
        """Kernel name -> what it computes (operators, output layout, FLOPs, bytes), for
        every PrimFunc of the built module."""
        if self._kernel_info is None:
            emitted = {k.name: k for k in self.report.kernels}
            info = {}
            for gvar in self.mod.get_global_vars():
                func = self.mod[gvar]
                if not isinstance(func, tvm.tirx.PrimFunc):
                    continue
                # The VM reports a kernel by its symbol; a global var may have been renamed apart.
                name = str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs \
                    else gvar.name_hint
                kernel = emitted.get(name)
                if kernel is not None and kernel.flops is not None:
                    flops = float(kernel.flops)
                else:
                    try:
                        flops = float(tvm.s_tir.analysis.estimate_tir_flops(func.body))
                    except Exception:  # noqa: BLE001 - opaque or extern bodies: rate left at 0
                        flops = 0.0
                buffers = [param.ty for param in func.params if hasattr(param.ty, "shape")]
                size = sum(int(np.prod([int(d) for d in buf.shape])) * tvm.DataType(buf.dtype).bits // 8
                           for buf in buffers if all(hasattr(d, "value") for d in buf.shape))
                digest = f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"
                if kernel is None:
                    info[name] = KernelInfo("tvm", (name.removeprefix("fused_").rstrip("0123456789").rstrip("_"),),
                                            "", flops, size, digest)
                else:
                    info[name] = KernelInfo(kernel.kind, kernel.ops, kernel.layout, flops, size, digest)
            self._kernel_info = info
        return self._kernel_info

def lower_fallbacks(mod: tvm.IRModule, *, cores: int, fast_math: bool = False,
                    unscheduled: dict[str, str] | None = None) -> tvm.IRModule:
    """TVM's legalization for everything no strategy took, fused, with a minimal schedule.

    ``tvm.compile``'s default CPU pipeline neither fuses nor schedules legalized ops, so
    a max-pool or a softmax would run single-threaded, one kernel per op. Here they are
    fused (FuseOps/FuseTIR; alt-tvm kernels are marked opaque and stay alone) and every
    unscheduled kernel gets :func:`~alt_tvm.graph.in_layout.schedule_in_layout`'s schedule:
    a fused chain of reshapes and transposes becomes one loop nest instead of one pass over
    memory per op (torchvision ViT's split of the packed QKV projection: 0.34 -> 0.11 ms),
    inner loops vectorised, outer loops parallel. Unless
    ``fast_math``, ReLU, clip, maximum/minimum, max pooling and max/min reductions are
    legalized by :func:`alt_tvm.graph.ieee.legalize_overrides`, which propagate NaN. Where
    ``unscheduled`` is given, a kernel the schedule cannot be applied to is left as TVM
    legalized it and ``unscheduled`` receives its name and why; without it the error
    propagates (a strict build).
    """
    seq = tvm.ir.transform.Sequential([
        relax.transform.LegalizeOps(customize_legalize_map=legalize_overrides(fast_math=fast_math)),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        # A kernel that is a reshape alone (after attention writes the heads back) becomes
        # the VM's reshape, a view of the same memory, instead of a copy.
        relax.transform.RewriteDataflowReshape(),
    ])
    mod = seq(mod)
    for gvar in mod.get_global_vars():
        func = mod[gvar]
        if not isinstance(func, tvm.tirx.PrimFunc) or (func.attrs is not None and ALT_KERNEL_ATTR in func.attrs):
            continue
        try:
            mod[gvar] = schedule_in_layout(func, cores=cores)
        except Exception as err:  # noqa: BLE001 - TVM's verifier and primitives raise several types
            if unscheduled is None:
                raise
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [repr(err)]
            unscheduled[gvar.name_hint] = f"left unscheduled: {lines[-1][:200]}"
    return mod


def build(model: Any, target: Any = None, *, records: Any = None, variant: str = "alt",
          strategies: Sequence[str] | None = None, example_inputs: Sequence[Any] | None = None,
          input_shapes: dict | None = None, strategy_options: dict[str, Any] | None = None,
          fast_math: bool = False, strict: bool = False) -> CompiledModel:
    """Build ``model`` to a callable module with alt-tvm's strategies.

    Parameters
    ----------
    model
        Path to an ONNX file, an ``onnx.ModelProto``, a ``torch.nn.Module`` (with
        ``example_inputs``), a ``torch.export.ExportedProgram`` or a Relax ``IRModule``.
    target
        An :class:`alt_tvm.target.HardwareTarget`, a board name, or None for this host.
    records
        A tuning log (``alt_tvm.tune``), as a path or :func:`alt_tvm.records.read_log`'s
        result: the best record of each workload measured on this target with this TVM
        version replaces the strategy's analytic defaults. ``.report`` says how many
        tunable partitions it tuned and why the others were not; a warning says so too
        when the log does not tune them all.
    variant
        ``"alt"`` (layouts propagated), ``"alt-wp"`` (layouts, conversions at every
        boundary) or ``"alt-ol"`` (loop-only, channels-last).
    strategies
        Restrict (and thereby force) the strategies used, by name.
    strategy_options
        Options per strategy name (e.g. which layers ``tt_einsum`` factorises), handed to
        the strategy's ``applicable`` (``OpInfo.options``) and ``implement`` (``context.options``).
    fast_math
        False (default): NaN propagates through ReLU, ReLU6, clip, maximum/minimum, max
        pooling and max/min reductions, and overflow gives ``inf``, as in ONNX Runtime and
        PyTorch. True: those ops may use forms that turn NaN into a finite value
        (``alt_tvm.ops.ieee``).
    strict
        False (default): a partition whose strategy fails to lower it is left to TVM's
        legalization (``report.failed`` says why), a kernel a later pass cannot handle is
        left as it was (``report.left_as_is``), and the build goes on. True: the strategy's
        or the pass's exception propagates (for developing strategies).

    Returns
    -------
    CompiledModel
        Call it on NumPy arrays; ``.report`` lists partitions and fallbacks.
    """
    from .frontend import load_model

    machine = resolve(target)
    records = _tuning_log(records, machine)
    threads = use_runtime_threads(machine.num_cores)
    imported = load_model(model, example_inputs=example_inputs, input_shapes=input_shapes)
    options = dict(target=machine, variant=variant, strategies=strategies, records=records,
                   strategy_options=strategy_options, fast_math=fast_math, strict=strict)
    alt_pass = AltLayoutPass(**options)
    with tvm_output_to_log():
        lowered = _lower(imported.mod, alt_pass, machine, fast_math=fast_math)
        report = alt_pass.report
        try:
            executable = lowering.compile(lowered, target=machine.to_tvm())
        except Exception as err:
            if strict:
                raise
            # Find the kernels that do not compile on their own and build again without them.
            excluded = _uncompilable_partitions(lowered, report, machine.to_tvm())
            if not excluded:
                raise
            alt_pass = AltLayoutPass(**options, excluded=excluded)
            lowered = _lower(imported.mod, alt_pass, machine, fast_math=fast_math)
            report = alt_pass.report
            try:
                executable = lowering.compile(lowered, target=machine.to_tvm())
            except Exception:
                raise err from None
    _log_report(report)
    return CompiledModel(executable, lowered, report, imported.input_shapes, imported.input_dtypes,
                         imported.input_names, target=machine, threads=threads,
                         source=os.fspath(model) if isinstance(model, (str, os.PathLike)) else None)


def _log_report(report: BuildReport) -> None:
    """The build summary through the ``alt_tvm`` logger: INFO normally; WARNING when a strategy
    failed on a partition or the log given does not tune every tunable partition."""
    LOGGER.info("%s", report.summary())
    for key, why in report.failed.items():
        LOGGER.warning("strategy failed on %s, left to TVM's legalization: %s", key.split("|")[0], why)
    for name, why in report.left_as_is.items():
        LOGGER.warning("kernel %s %s", name, why)
    if report.untuned:
        LOGGER.warning("%s", report.tuning_summary())


def _uncompilable_partitions(mod: tvm.IRModule, report: BuildReport, target: Any) -> dict[str, str]:
    """Workload key -> the compiler's error, for each partition kernel that fails to compile alone."""
    failing = {}
    for kernel in report.kernels:
        if kernel.kind != "partition" or not kernel.workload or kernel.workload in failing:
            continue
        gvar = next((g for g in mod.get_global_vars() if g.name_hint == kernel.name), None)
        if gvar is None or not isinstance(mod[gvar], tvm.tirx.PrimFunc):
            continue
        try:
            lowering.compile(tvm.IRModule({"main": mod[gvar].with_attr("global_symbol", "main")}), target=target)
        except Exception as err:  # noqa: BLE001 - the error becomes the partition's fallback reason
            lines = [line.strip() for line in str(err).splitlines() if len(line.strip()) > 3]
            message = next((line for line in lines if "rror" in line), lines[-1] if lines else "")[:200]
            failing[kernel.workload] = f"its kernel {kernel.name} does not compile: {type(err).__name__}: {message}"
    return failing
