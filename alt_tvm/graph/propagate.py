"""The propagation pass: partitions lowered by their strategies, layouts carried between them.

:class:`AltLayoutPass` partitions a Relax function (:func:`~alt_tvm.graph.partition.plan_partitions`),
lowers each partition with its strategy into one scheduled PrimFunc (``call_tir``) and
propagates the layout each kernel writes to the kernels that read it (ALT paper §4.2): a
conversion is inserted only where a consumer needs another layout and no pad stage can
convert for it. Element-wise producers of such a consumer are computed directly in the
layout it wants, as one kernel per chain (backward propagation, §6); ops without a strategy
read their operands' layouts (:mod:`alt_tvm.graph.in_layout`). Kernels that come out
structurally equal share one function.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import tvm
import tvm_ffi
from tvm import relax, te

from alt_tvm.flops import relax_flops
from alt_tvm.layout import Layout, convert_layout, rewrite
from alt_tvm.layout.rewrite import TensorMap
from alt_tvm.options import BuildOptions, build_options
from alt_tvm.priors import apply_switches
from alt_tvm.records import RecordWarning, target_key
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
from alt_tvm.strategies.constants import const_value
from alt_tvm.strategies.epilogue import epilogue_te, joinable
from alt_tvm.strategies.views import renaming_layout

from .gpu import SCHEDULED_ATTR, is_gpu
from .in_layout import (
    OPERATOR_STRATEGY,
    OperatorKernel,
    channel_blocked,
    channel_vector,
    elementwise_lanes,
    legalize_alone,
    operator_key,
    relayout,
    schedule_concat,
    schedule_operator,
)
from .partition import consumers, plan_partitions, tail_pieces
from .report import ALT_KERNEL_ATTR, BuildReport, Kernel

__all__ = ["AltLayoutPass"]

#: Ops on a tiled map whose result, of another shape, is written in channel vectors.
_CHANNEL_VECTOR_OPS = ("pool", "concat", "resize")


class AltLayoutPass:
    """The Relax pass: lower registered operators through strategies, with layout propagation.

    Usable in a user's own pipeline: ``mod = AltLayoutPass(target=...)(mod)`` before
    ``tvm.compile``. ``options`` (a :class:`~alt_tvm.options.BuildOptions`) or its fields as
    keywords say how; ``excluded`` maps workload keys to why their partitions are left to
    TVM's legalization whatever their strategy (kernels that failed to compile in an earlier
    attempt of the same build). ``report`` says what the pass did.
    """

    def __init__(self, options: BuildOptions | None = None, *, excluded: Mapping[str, str] | None = None,
                 **keywords: Any) -> None:
        #: the build's options (target resolved, tuning log read)
        self.options = build_options(options, caller="AltLayoutPass", **keywords)
        self.excluded = dict(excluded or {})
        self.report = BuildReport(log=self.options.log_path)
        #: partition output var -> the layout its reader asked it to be written in
        self.requested: dict = {}
        #: permute_dims / reshape results kept as their input's buffer in a layout (no kernel)
        self.views: set = set()
        #: every operator kernel emitted, before its schedule (what tuning tasks are made of)
        self.operators: list[OperatorKernel] = []
        #: whether the target is a GPU (operator kernels get TVM's GPU rules, no tuning knobs)
        self.gpu = is_gpu(self.options.target.to_tvm())

    def __call__(self, mod: tvm.IRModule) -> tvm.IRModule:
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            raise ValueError("the Relax module has no 'main' function")
        func = mod["main"]
        options = self.options
        decided = options.records is not None and options.variant != "alt-ol"
        chosen = options.records.strategies if decided else None
        unfused = options.records.unfused if decided else None
        plan = plan_partitions(func, target=options.target, variant=options.variant, allowed=options.strategies,
                               strategy_options=options.strategy_options, chosen=chosen, unfused=unfused)
        learned = self._learned_strategies(plan.partitions)
        # The log's decisions (its defaults included) take precedence over the learned ones.
        learned_split = self._learned_unfused(plan.partitions) - set(chosen or {})
        if learned or learned_split:
            plan = plan_partitions(func, target=options.target, variant=options.variant, allowed=options.strategies,
                                   strategy_options=options.strategy_options, chosen={**learned, **(chosen or {})},
                                   unfused={*(unfused or ()), *learned_split})
            for key in learned:
                # A learned choice that does not apply here is no fault of the build: it keeps the rule's.
                plan.refused.pop(key, None)
                if key in plan.overridden:
                    self.report.learned[key] = f"strategy {plan.overridden.pop(key)} ({self._learned_source(key)})"
            for key in learned_split & plan.split:
                plan.split.discard(key)
                self.report.learned[key] = f"built as its pieces ({self._learned_source(key)})"
        self.report.refused.update(plan.refused)
        self.report.chosen_strategies.update(plan.overridden)
        self.report.unfused.update(plan.split)
        for name, reasons in plan.fallbacks.items():
            known = self.report.fallbacks.setdefault(name, [])
            known.extend(r for r in reasons if r not in known)
        partitions, selected = plan.partitions, plan.strategies
        self.views = set()
        backward = self._backward_layouts(func, partitions, selected) if self.options.variant != "alt-wp" else {}
        self.requested = self._requested_layouts(func, partitions, selected) if self.options.variant != "alt-wp" else {}
        mutator = _Mutator(mod, partitions, selected, self, backward, _elementwise_chains(func, backward),
                           plan.pieces_of)
        new_func = mutator.visit_expr(func)
        new_mod = mutator.builder_.get()
        new_mod["main"] = relax.analysis.remove_all_unused(new_func)
        return new_mod

    @functools.cached_property
    def _priors(self) -> Any:
        """The learned decisions for this build's target (None: none apply; ALT-OL keeps its tiles)."""
        return None if self.options.variant == "alt-ol" else self.options.learned

    def _learned_strategies(self, partitions: list[Partition]) -> dict[str, str]:
        if self._priors is None:
            return {}
        return self._priors.strategies([workload_key(p) for p in partitions], target=target_key(self.options.target))

    def _learned_unfused(self, partitions: list[Partition]) -> set[str]:
        if self._priors is None:
            return set()
        return self._priors.unfused([workload_key(p) for p in partitions if p.pattern is not None],
                                    target=target_key(self.options.target))

    def _learned_source(self, key: str) -> str:
        decision = self._priors.nearest(key, target=target_key(self.options.target))
        return f"{decision.ratio:.2f}x the defaults' time at {decision.source}"

    def _learned_params(self, partition: Partition, strategy: Strategy, context: PartitionContext) -> Any:
        """The parameters the learned on/off loop knobs give ``partition`` (None: none apply)."""
        if self._priors is None:
            return None
        decision = self._priors.nearest(context.workload_key, target=target_key(self.options.target))
        if decision is None or not decision.finding or decision.strategy != strategy.name or not decision.switches:
            return None
        space = strategy.space(partition.anchor, context)
        return None if space is None else apply_switches(space, decision.switches)

    def context_for(self, partition: Partition, strategy: Strategy, input_layouts: dict, *,
                    tuned: bool = True) -> PartitionContext:
        """The context ``partition`` is lowered in: its tuned parameters (none for ALT-OL, the
        loop-only ablation keeps the analytic tiles, or when ``tuned`` is False) and the
        build's options for ``strategy``."""
        record = None
        if tuned and self.options.records is not None and self.options.variant != "alt-ol":
            record = self.options.records.params_for(workload_key(partition), strategy.name)
        options = self.options
        return PartitionContext(partition, options.target, options.variant, input_layouts,
                                params=None if record is None else record.candidate["params"],
                                options=options.strategy_options.get(strategy.name), fast_math=options.fast_math,
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
                source = self.options.records.best[key].source
                why = f"the tuned parameters at {source} were rejected ({type(err).__name__}: {err})"
                warnings.warn(f"{source}: skipped tuned parameters for {key.split('|')[0]}: "
                              f"{type(err).__name__}: {err}", RecordWarning, stacklevel=2)
            else:
                self.report.tuned += 1
                self.report.tuned_workloads.add(key)
                self.report.tunable.add(key)
                return context, lowered
        context = self.context_for(partition, strategy, input_layouts, tuned=False)
        params = None if why else self._learned_params(partition, strategy, context)
        if params is not None:
            try:
                lowered = strategy.implement(partition.anchor, replace(context, params=params))
            except Exception as err:  # noqa: BLE001 - a learned point the strategy refuses keeps the defaults
                warnings.warn(f"learned loop knobs for {key.split('|')[0]} not applied: {type(err).__name__}: {err}",
                              RecordWarning, stacklevel=2)
            else:
                self.report.tunable.add(key)
                decision = self._priors.nearest(key, target=target_key(self.options.target))
                switches = ", ".join(f"{k}={v}" for k, v in sorted(decision.switches.items()) if params.get(k) == v)
                self.report.learned[key] = f"loop knobs {switches} ({self._learned_source(key)})"
                return context, lowered
        lowered = strategy.implement(partition.anchor, context)
        tunable = strategy.space(partition.anchor, context) is not None
        if tunable:
            self.report.tunable.add(key)
        if self.options.records is not None and self.options.variant != "alt-ol" and tunable:
            if not why and key in self.options.records.defaults:
                self.report.kept_default.append((key, self.options.records.defaults[key]))
            else:
                self.report.untuned.append((key, why or self.options.records.why_not(key)))
        return context, lowered

    def schedule(self, operator: OperatorKernel) -> tvm.tirx.PrimFunc:
        """``operator`` scheduled with the log's tuned knobs for its workload, else its defaults;
        noted in the report (its workload is tunable). Knobs the schedule rejects are skipped with
        a :class:`~alt_tvm.records.RecordWarning`. On a GPU: TVM's GPU rules, not tunable here."""
        if self.gpu:
            with self.options.target.to_tvm():
                return schedule_operator(operator)
        record = None
        if self.options.records is not None and self.options.variant != "alt-ol":
            record = self.options.records.params_for(operator.key, OPERATOR_STRATEGY)
        func = None
        if record is not None:
            try:
                func = schedule_operator(operator, replace(operator.default, **record.candidate["params"]))
            except Exception as err:  # noqa: BLE001 - bad knobs fall back to the defaults
                warnings.warn(f"{record.source}: skipped tuned knobs for {operator.key.split('|')[0]}: "
                              f"{type(err).__name__}: {err}", RecordWarning, stacklevel=2)
            else:
                self.report.tuned_workloads.add(operator.key)
        func = func if func is not None else schedule_operator(operator)
        self.operators.append(operator)
        self.report.tunable.add(operator.key)
        return func

    def schedule_fused(self, operator: OperatorKernel, name: str) -> tvm.tirx.PrimFunc:
        """:meth:`schedule` for a kernel TVM fused from ops no strategy took, named ``name``."""
        func = self.schedule(operator)
        self.report.fused[name] = operator.key
        return func

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
            if _is_conv(partition) \
                    and any(int(p) for p in getattr(partition.anchor.value.attrs, "padding", None) or ()):
                # A padded conv's pad stage copies its input into the conv's layout: it reads
                # through the renamings instead of after a transpose kernel.
                self.views.update(_renamings_read_by(partition.anchor, producers, users, members))
        for data, layouts in preferred.items():
            producer = producers.get(data)
            layout = layouts[0]
            if (producer is None or data in members or layout is None or not layout.stores_each_once
                    or equivalent(layout, None, static_shape(data)) or any(other != layout for other in layouts)):
                continue
            if not _standalone_elementwise(producer, users):
                # Another op (a max pool, a concatenation): _emit_in_layout writes the layout
                # every partition reading it prefers (its other readers read any layout).
                if isinstance(data, relax.DataflowVar):
                    wanted[data] = layout
                    for operand, part in _concat_operand_layouts(producer, layout).items():
                        # Each operand computed by an op of its own, read by the concatenation
                        # alone, is written in its slice of the layout: the concatenation then
                        # copies whole tiles, and the op converts for free.
                        if (operand in producers and operand not in members and operand not in wanted
                                and isinstance(operand, relax.DataflowVar) and len(users.get(operand, [])) == 1):
                            _propagate_elementwise(operand, part, producers, users, members, wanted, first=True)
                            self.views.update(_renamings_read_by(producers[operand], producers, users, members))
                continue
            _propagate_elementwise(data, layout, producers, users, members, wanted)
        tiled = {p.output for p in partitions if _is_conv(p)}
        for binding in (b for block in func.body.blocks for b in block.bindings):
            transposed = _transposed_source(binding, producers, users, tiled)
            if transposed is not None and transposed[0] not in wanted and binding.var not in members:
                # The op before a transpose writes its result transposed: the transpose is then
                # its own inverse read back, and its readers get row-major rows, no copy.
                wanted[transposed[0]] = transposed[1]
                self.views.add(binding.var)
        return wanted


def _is_conv(partition: Partition) -> bool:
    return "conv" in (op_name(partition.anchor.value) or "")


def _propagate_elementwise(data: relax.Var, layout: Layout, producers: dict, users: dict, members: set,
                           wanted: dict, *, first: bool = False) -> None:
    """Give ``layout`` to ``data`` and up its chain of same-shape, single-consumer element-wise
    producers outside partitions (``first``: ``data`` itself whatever op computes it)."""
    shape = static_shape(data)
    stack = [data]
    while stack:
        var = stack.pop()
        binding = producers.get(var)
        if (binding is None or var in members or var in wanted or static_shape(var) != shape
                or not (first and var is data or _standalone_elementwise(binding, users))):
            continue
        wanted[var] = layout
        stack.extend(a for a in binding.value.args if isinstance(a, relax.Var))


def _transposed_source(binding: relax.VarBinding, producers: dict, users: dict, tiled: set
                       ) -> tuple[relax.Var, Layout] | None:
    """``(x, layout)`` for a ``permute_dims`` of ``x = reshape(map)``, ``map`` a conv's output
    (in ``tiled``) and ``x`` read by the transpose alone: ``layout`` stores ``x`` as the
    transpose's row-major result, so the reshape, which copies the map out of its tiles anyway,
    writes the transposed rows. None otherwise."""
    call = binding.value
    if op_name(call) != "relax.permute_dims" or not isinstance(binding.var, relax.DataflowVar):
        return None
    source = call.args[0]
    producer = producers.get(source)
    if (producer is None or not isinstance(source, relax.DataflowVar) or len(users.get(source, [])) != 1
            or op_name(producer.value) != "relax.reshape" or producer.value.args[0] not in tiled):
        return None
    layout = renaming_layout(binding)  # the transpose's result -> its source
    return None if layout is None else (source, layout.inverse())


def _renamings_read_by(binding: relax.VarBinding, producers: dict, users: dict, members: set) -> set:
    """The chain of ``permute_dims`` / ``reshape`` results that only ``binding`` (an op computed
    in layout) reads, through each other: the op reads the chain's source through their
    composed layout (:func:`~alt_tvm.strategies.views.renaming_layout`) instead of a copy."""
    found = set()
    var = binding.value.args[0] if isinstance(binding.value, relax.Call) and binding.value.args else None
    while (isinstance(var, relax.DataflowVar) and var in producers and var not in members
           and len(users.get(var, [])) == 1 and op_name(producers[var].value) in ("relax.permute_dims", "relax.reshape")
           and renaming_layout(producers[var]) is not None):
        found.add(var)
        var = producers[var].value.args[0]
    return found


def _concat_operand_layouts(binding: relax.VarBinding, layout: Layout) -> dict:
    """For a concatenation written in ``layout``: each operand variable -> the layout of its
    slice (:meth:`Layout.with_extent`), where that layout stores each element once. Empty for
    another op."""
    call = binding.value
    if op_name(call) != "relax.concat" or not isinstance(call.args[0], relax.Tuple):
        return {}
    axis = int(call.attrs.axis) % len(layout.orig_shape)
    found = {}
    for field in call.args[0].fields:
        shape = static_shape(field)
        part = None if shape is None or not isinstance(field, relax.Var) else layout.with_extent(axis, shape[axis])
        if part is not None and part.stores_each_once:
            found[field] = part
    return found


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


def _constants(args) -> tuple:
    """``(index, array)`` of each constant among a kernel's inputs ``args``."""
    found = []
    for index, arg in enumerate(args):
        data = const_value(arg)
        if data is not None:
            found.append((index, data))
    return tuple(found)


def _stored(layout: Layout | None) -> str:
    """A layout as the shape it stores, e.g. ``1x8x56x56x8`` ("" when canonical)."""
    return "" if layout is None or layout.is_identity else "x".join(str(int(d)) for d in layout.shape)


def _standalone_elementwise(binding: relax.VarBinding, users: dict) -> bool:
    return joinable(binding.value) and len(users.get(binding.var, [])) == 1 \
        and isinstance(binding.var, relax.DataflowVar)


@relax.expr_functor.mutator
class _Mutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, partitions: list[Partition], selected: dict, owner: AltLayoutPass,
                 backward: dict, chains: dict, pieces_of: dict):
        super().__init__(mod)
        self.owner = owner
        self.pieces_of = pieces_of  # a piece's anchor var -> the key of the fusion a decision split
        self.backward = backward  # element-wise var -> layout its consumer wants
        self.chains = chains  # last element-wise op of a chain -> the chain's bindings
        self.chained = {b.var for chain in chains.values() for b in chain[:-1]}
        self.selected = selected
        self.final = {p.output: p for p in partitions}
        self.members = {b.var for p in partitions for b in p.bindings}
        self.layouts: dict = {}  # original var -> (new var holding the value, its Layout)
        #: original var -> workload key of the partition that chose its layout (of the fusion a
        #: piece was split from: the in-model stage times the pieces as that workload)
        self.owners: dict = {}
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
        if self.owner.gpu:  # TVM's GPU pipeline must not schedule it again
            func = func.with_attr(SCHEDULED_ATTR, True)
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
        if var in self.owner.views and self._hold_view(binding):
            return
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
        if wanted is None and not leaves and tiled and any(word in op_name(call) for word in _CHANNEL_VECTOR_OPS):
            # A pooled, concatenated or resized map stays in channel vectors (NCHWc), so its
            # window loads are whole vectors; its consumers read that layout directly (a
            # row-major map read by a tiled kernel's epilogue is a gather per vector).
            lanes = self.owner.options.target.vector_lanes(dtype_of(var))
            wanted = channel_vector(static_shape(var), lanes, self.layouts[tiled[0]][1]) if "pool" in op_name(call) \
                else channel_blocked(static_shape(var), lanes)
        if not all(layout.stores_each_once for layout in [*(self.layouts[v][1] for v in tiled), wanted] if layout):
            return False
        legal = legalize_alone(call, module=self.builder_.get(), fast_math=self.owner.options.fast_math)
        if legal is None:
            return False
        args, inputs = [], []
        for arg in legal.args:
            current = self.layouts.get(arg) if isinstance(arg, relax.Var) and arg not in self.canonical else None
            args.append(current[0] if current else self.visit_expr(arg))
            inputs.append(current[1] if current else None)
        cores = self.owner.options.target.num_cores
        try:
            func = relayout(legal.func, inputs, wanted)
            operator = OperatorKernel(operator_key([op_name(call)], func), "operator", func, cores, tuple(inputs),
                                      wanted, _constants(legal.args))
            if op_name(call) == "relax.concat" and isinstance(call.args[0], relax.Tuple):
                axis = int(call.attrs.axis) % len(static_shape(var))
                sizes = tuple(static_shape(f)[axis] for f in call.args[0].fields)
                if schedule_concat(func, cores=cores, output=wanted, axis=axis, sizes=sizes) is not None:
                    operator = replace(operator, kind="concat", axis=axis, sizes=sizes)
            func = self.owner.schedule(operator)
        except Exception:  # noqa: BLE001 - a layout TIR cannot express: convert instead
            return False
        self.count += 1
        name = f"alt_{op_name(call).split('.')[-1]}_{self.count}"
        kernel = Kernel(name, "operator", operator.key, ops=(op_name(call),), layout=_stored(wanted))
        shape = static_shape(var) if wanted is None else wanted.shape
        new_var = self._emit_call(func, kernel, args, shape, dtype_of(var))
        if wanted is None:
            self._rebind(var, new_var)
        else:
            self._hold(var, new_var, wanted)
        return True

    def _hold_view(self, binding: relax.VarBinding) -> bool:
        """Keep a renaming's result as its input's buffer in the composed layout: no kernel."""
        source = binding.value.args[0]
        if source in self.layouts and source not in self.canonical:
            value, inner = self.layouts[source]
        else:
            value, inner = self.visit_expr(source), Layout(static_shape(source))
        outer = renaming_layout(binding)
        layout = Layout(outer.orig_shape, (*outer.primitives, *inner.primitives))
        if equivalent(layout, None, static_shape(binding.var)):
            self._rebind(binding.var, value)  # written transposed by its producer: row-major here
            return True
        if source in self.layouts and source not in self.canonical and source not in self.owner.views:
            return False  # a tiled map: its readers read the layout its op writes instead
        if not layout.stores_each_once:
            return False
        self._hold(binding.var, value, layout)
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
            values[binding.var] = epilogue_te(binding.value, operands, index=k, fast_math=self.owner.options.fast_math)
            layouts[values[binding.var]] = layout
        out = values[chain[-1].var]
        result = rewrite([out], layouts=layouts)
        unscheduled = te.create_prim_func([*(result[t] for t in inputs), result[out]])
        ops = tuple(op_name(b.value) for b in chain)
        operator = OperatorKernel(
            operator_key(ops, unscheduled), "elementwise", unscheduled, self.owner.options.target.num_cores,
            tuple(layouts.get(t) for t in inputs), layout, _constants(args),
            inline=tuple(result[values[b.var]].op.name for b in chain[:-1]),
            lanes=elementwise_lanes(layout, [(tensor.shape, layouts.get(tensor)) for tensor in inputs]))
        func = self.owner.schedule(operator)
        self.count += 1
        name = f"alt_{ops[-1].split('.')[-1]}_{self.count}"
        kernel = Kernel(name, "elementwise", operator.key, ops=ops, layout=_stored(layout))
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
            if self.owner.options.strict:
                raise
            self._fall_back(partition, strategy, err)
            return
        workload = self.pieces_of.get(partition.anchor.var, context.workload_key)
        args = []
        for arg in lowered.args:
            if isinstance(arg, relax.Var):
                if arg in context.conversions:
                    current = self.layouts[arg] if arg in self.layouts else (self.visit_expr(arg), None)
                    arg = self._convert(current[0], current[1], context.conversions[arg], static_shape(arg),
                                        dtype_of(arg), workload=workload,
                                        boundary=not isinstance(arg, relax.DataflowVar))
                elif arg in self.layouts:
                    arg = self.layouts[arg][0]
                else:
                    arg = self.visit_expr(arg)
            args.append(arg)
        self.count += 1
        name = f"alt_{partition.ops[0].split('.')[-1]}_{self.count}"
        layout = lowered.output_layout
        kernel = Kernel(name, "partition", workload, ops=tuple(partition.ops), layout=_stored(layout),
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
            self.owners[out] = workload
            # alt-wp: no propagation; convert back at every boundary, consumers see canonical data.
            self._hold(out, new_var, lowered.output_layout, canonical=self.owner.options.variant == "alt-wp")
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
