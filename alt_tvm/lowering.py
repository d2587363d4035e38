"""How alt-tvm compiles its kernels: TVM's default TIR pipeline, with small buffers kept on the stack.

TVM's ``LowerTVMBuiltin`` leaves on the stack only CPU buffers of global scope under 1 KiB
(``runtime::kMaxStackAlloca``); every other buffer comes from the runtime's workspace pool
(``TVMBackendAllocWorkspace``), inside a parallel loop's body once per task. The conv
template's per-task tiles are such buffers: a task's output tile between the accumulators'
write-back and the epilogue (2 rows x 28 positions x 32 channels: 7 KiB), the reduction-outer
order's 7x7 channel tile (6 KiB), a depthwise conv's padded window. From the pool each is a
pointer LLVM knows nothing about: its zeroing is a ``memset`` call, the epilogue loads back what
was just stored, and each task pays the pool's allocation and free. A profile of MNASNet on one
thread spends 2% of its time in ``memset`` and 1.7% in the pool.

:func:`keep_on_stack` marks each allocation of a constant size up to :data:`STACK_BYTES` on a
CPU target ``disable_lower_builtin``, which ``LowerTVMBuiltin`` leaves as a stack ``alloca``.
That makes the kernels of MobileNet-V2, ResNet-50, SqueezeNet 1.1 and MNASNet 7-13% faster
in sum. Larger buffers (a fused block's
bands) stay in the pool: a thread's stack is 8 MiB by default, and what fits the L1 gains most.

A register block whose loop does not divide its extent (7 positions on a 32-wide tile) has a
partial last block, and the split guards each of its accumulators with the block's bound
(``if w_o * 7 + w_i < 32``) inside the reduction loop. LLVM does not unswitch those guards: it
keeps the guarded accumulators in registers but stores them to the stack at every step of the
reduction (12 stores per 28 FMAs in SegFormer-B0's 1x1 conv with 7-position blocks, which then
takes 1.6-2.2x the time of 4-position ones). :func:`peel_partial_blocks` runs the serial loop of
such blocks over its full blocks with no guard and the last one after it: MobileNet-V2's first
fused inverted residual then takes 0.71x the time, the whole model 0.945x (EfficientNet-B0,
MNASNet, MobileNet-V3-L 0.98x). Where the blocks are tasks of a parallel loop (a GEMM's row
blocks fused with its weight panels) the loop is not split, which would make two launches:
each task runs a copy of the body without the guards when they hold for it. SegFormer-B0's
``4096 x 32 x 256`` GEMM in 6-row blocks (a partial last one) then takes 1.03x the time of
4-row blocks, against 1.55x guarded.

:data:`PIPELINE` names the pipeline for ``tvm.compile(..., tir_pipeline=...)``; :func:`compile`
is ``tvm.compile`` with it, which every compile of an alt-tvm kernel goes through (model builds,
the tuner's builders, the SConv and TT kernels). Baselines (TVM's default build, MetaSchedule)
keep TVM's own pipeline.

On a RISC-V target with the V extension, TVM 0.27's ``VectorizeLoop`` rewrites a vectorized
loop of constant extent as a scalable one (``vscale * 4`` lanes, masked to the extent) unless
its body holds a call (``if_then_else``, ``reinterpret``), which stays fixed-width. A buffer
stored by one kind and loaded by the other gets a fixed vector element type from
``StorageRewrite`` and its scalable accesses no longer type-check: a depthwise conv's padded
window (stored under ``if_then_else``, read by the FMA loop) and Winograd's input rows fail to
compile. The templates also size their tiles in whole registers of ``vector_lanes`` lanes,
and ``vscale * 4`` float32 is a group of two registers (LMUL 2), half masked off for an 8-lane
tile. So the pipeline shows the vectorizer such a target with ``-v``
(:func:`fixed_vector_target`): every vectorized loop becomes a fixed-width LLVM vector, which
LLVM lowers to RVV instructions (``vsetivli 8, e32, m1``), as the functions get their own
target back before code generation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir.pipeline import default_s_tir_pipeline
from tvm.sym import Analyzer
from tvm.target import Target
from tvm.target.codegen import target_has_features

from .tir import substitute, uses_var

__all__ = ["PIPELINE", "STACK_BYTES", "compile", "fixed_vector_target", "keep_on_stack", "peel_partial_blocks"]

#: Largest allocation (bytes) kept on the stack: half the L1 data cache of the machines here
#: (32 KiB), far below a thread's default stack (8 MiB).
STACK_BYTES = 16 * 1024
#: The registered name of alt-tvm's TIR pipeline.
PIPELINE = "alt_tvm"
#: ``LowerTVMBuiltin``'s annotation: leave the allocation as it is (a stack ``alloca`` on a CPU).
_ON_STACK = "disable_lower_builtin"
#: Target kinds whose kernels run on a CPU thread's stack.
_CPU_KINDS = ("llvm",)


def keep_on_stack(func: tirx.PrimFunc, *, limit: int = STACK_BYTES) -> tirx.PrimFunc:
    """``func`` with each allocation of a constant size up to ``limit`` bytes marked to stay on
    the stack (see the module docstring). A function for a target that is not a CPU, or without
    a target, is returned as it is.

    Raises
    ------
    ValueError
        If ``limit`` is not a non-negative int.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a non-negative int (bytes), got {limit!r}")
    target = func.attrs.get("target") if func.attrs is not None else None
    if target is None or target.kind.name not in _CPU_KINDS:
        return func

    def mark(alloc: tirx.AllocBuffer) -> tirx.AllocBuffer:
        nbytes = _constant_bytes(alloc.buffer)
        if nbytes is None or nbytes > limit or _ON_STACK in alloc.annotations:
            return alloc
        return tirx.AllocBuffer(alloc.buffer, {**alloc.annotations, _ON_STACK: tirx.IntImm("bool", 1)}, alloc.span)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.AllocBuffer, mark)))


def peel_partial_blocks(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its partial register blocks run apart from the full ones, whose guards
    are dropped.

    A serial loop whose last iteration alone fails a guard is peeled: it runs its other
    iterations with the guards dropped, then the last one on its own. A loop qualifies when
    every ``if`` under it that reads its variable holds for all but the last iteration (for
    every value of the loops inside it), and at least one of those ``if`` lies inside a further
    loop (a guard evaluated once per iteration costs nothing worth a copy of the body). That
    is the shape a split that does not divide its extent leaves: a partial last register
    block (see the module docstring).

    A parallel loop (a GEMM's row blocks fused with its weight panels: the partial block is
    one task in every panel's) keeps its one launch: its body is versioned, each task taking
    a copy with the guards that read only the loop's variable dropped when they all hold, the
    body as it was otherwise. Again at least one of them must lie inside a further loop.
    """
    analyzer = Analyzer()

    def guards(loop: tirx.For) -> tuple[list[tuple[Any, bool]], list]:
        """The ``if`` conditions under ``loop`` that read its variable, each with whether it is
        inside a further loop, and the loops under it (variable, range)."""
        found, inner = [], []

        def visit(node: Any, depth: int) -> None:
            if isinstance(node, tirx.For):
                inner.append((node.loop_var, tvm.ir.Range.from_min_extent(node.min, node.extent)))
                visit(node.body, depth + 1)
            elif isinstance(node, tirx.IfThenElse):
                if uses_var(node.condition, loop.loop_var):
                    found.append((node.condition, depth > 0))
                visit(node.then_case, depth)
                if node.else_case is not None:
                    visit(node.else_case, depth)
            elif isinstance(node, tirx.SeqStmt):
                for child in node.seq:
                    visit(child, depth)
            elif isinstance(getattr(node, "body", None), tirx.Stmt):
                visit(node.body, depth)

        visit(loop.body, 0)
        return found, inner

    def drop(body: Any, held: Callable[[Any], bool]) -> Any:
        """``body`` with each ``if`` whose condition ``held`` accepts replaced by its then-case."""
        return tvm_ffi.structural_map(body, (tirx.IfThenElse, lambda node: node.then_case if held(node.condition)
                                             else node))

    def version(loop: tirx.For) -> Any:
        found, inner = guards(loop)
        # The guards that read the task index alone: those decide per task.
        local = [(condition, nested) for condition, nested in found
                 if not any(uses_var(condition, var) for var, _ in inner)]
        if not any(nested for _, nested in local):
            return loop
        distinct: list = []
        for condition, _ in local:
            if not any(tvm_ffi.structural_equal(condition, seen) for seen in distinct):
                distinct.append(condition)
        held = functools.reduce(tirx.And, distinct)
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent), allow_override=True)
        if analyzer.can_prove(held) or analyzer.can_prove(tirx.Not(held)):
            return loop
        full = drop(loop.body, lambda c: any(tvm_ffi.structural_equal(c, d) for d in distinct))
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.IfThenElse(held, full, loop.body),
                        loop.thread_binding, loop.annotations)

    def peel(loop: tirx.For) -> Any:
        if loop.kind == tirx.ForKind.PARALLEL:
            return version(loop)
        if (loop.kind != tirx.ForKind.SERIAL or not isinstance(loop.extent, tirx.IntImm)
                or not isinstance(loop.min, tirx.IntImm) or int(loop.extent) < 2):
            return loop
        found, inner = guards(loop)
        if not any(nested for _, nested in found):
            return loop
        first, extent = int(loop.min), int(loop.extent)
        for var, rng in inner:
            analyzer.bind(var, rng, allow_override=True)
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(first, extent - 1), allow_override=True)
        if not all(analyzer.can_prove(condition) for condition, _ in found):
            return loop
        full = tirx.For(loop.loop_var, loop.min, extent - 1, loop.kind,
                        drop(loop.body, lambda c: uses_var(c, loop.loop_var) and analyzer.can_prove(c)),
                        loop.thread_binding, loop.annotations)
        last = substitute(loop.body, {loop.loop_var: tirx.const(first + extent - 1, str(loop.loop_var.ty))})
        return tirx.SeqStmt([full, last])

    body = tvm_ffi.structural_map(func.body, (tirx.For, peel))
    return func if body.same_as(func.body) else func.with_body(body)


def _constant_bytes(buffer: tirx.Buffer) -> int | None:
    """The buffer's size in bytes, or None when its shape is not constant."""
    elements = 1
    for extent in buffer.shape:
        if not isinstance(extent, tirx.IntImm):
            return None
        elements *= int(extent)
    return elements * buffer.dtype.bits * buffer.dtype.lanes // 8


_keep_on_stack_pass = tirx.transform.prim_func_pass(lambda func, _mod, _ctx: keep_on_stack(func), opt_level=0,
                                                    name="alt_tvm.KeepOnStack")
_peel_pass = tirx.transform.prim_func_pass(lambda func, _mod, _ctx: peel_partial_blocks(func), opt_level=0,
                                           name="alt_tvm.PeelPartialBlocks")


def fixed_vector_target(target: Target) -> Target:
    """``target`` as alt-tvm's pipeline shows it to TVM's vectorizer: an LLVM target with the
    RISC-V V extension with ``-v`` added to its ``mattr`` (and its host's), so that vectorized
    loops become fixed-width vectors (see the module docstring); any other target as it is.

    Raises
    ------
    TypeError
        If ``target`` is not a ``tvm.target.Target``.
    """
    if not isinstance(target, Target):
        raise TypeError(f"target must be a tvm.target.Target, got {type(target).__name__}")
    host = fixed_vector_target(target.host) if target.host is not None else None
    if target.kind.name not in _CPU_KINDS or not target_has_features("v", target):
        return target if host is None or host.same_as(target.host) else target.with_host(host)
    attrs = {key: value for key, value in target.export().items() if key != "host"}
    attrs["mattr"] = [str(a) for a in attrs.get("mattr", ()) if str(a) not in ("+v", "-v")] + ["-v"]
    return Target(attrs, host=host)


def _with_fixed_vectors(mod: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, Target]]:
    """``mod`` with each function's target replaced by :func:`fixed_vector_target`'s, and the
    originals by the replacements' text (with and without a host)."""
    originals: dict[str, Target] = {}
    functions = {}
    for gvar, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tirx.PrimFunc) and func.attrs is not None else None
        shown = fixed_vector_target(target) if target is not None else None
        if shown is not None and not shown.same_as(target):
            originals[str(shown)] = target
            if shown.host is not None:
                originals[str(shown.host)] = target.host
            func = func.with_attr("target", shown)
        functions[gvar] = func
    if not originals:
        return mod, originals
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos), originals


def _with_targets(mod: tvm.IRModule, originals: dict[str, Target]) -> tvm.IRModule:
    """``mod`` with each function target that :func:`_with_fixed_vectors` replaced given back."""
    if not originals:
        return mod
    functions = {}
    for gvar, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tirx.PrimFunc) and func.attrs is not None else None
        if target is not None and str(target) in originals:
            func = func.with_attr("target", originals[str(target)])
        functions[gvar] = func
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _pipeline_factory() -> tuple:
    default, finalize_host, finalize_device = default_s_tir_pipeline()

    @tvm.transform.module_pass(opt_level=0, name="alt_tvm.TIRPipeline")
    def pipeline(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        # The default passes see RVV targets without V (fixed-width vectors), code generation
        # sees them as they are.
        mod, originals = _with_fixed_vectors(mod)
        # After the default passes: the buffers are flattened and placed where they are used,
        # and LowerTVMBuiltin (a finalizing pass) has not yet moved them to the pool.
        # Peeled after unrolling, whose copies give each guard constant offsets; the last block's
        # copy gets its own variables (ConvertSSA), then its guards fold to true or false.
        peeled = tirx.transform.StmtSimplify()(tirx.transform.ConvertSSA()(_peel_pass(default(mod))))
        return _keep_on_stack_pass(_with_targets(peeled, originals))

    return pipeline, finalize_host, finalize_device


tvm.tirx.register_tir_pipeline(PIPELINE, _pipeline_factory)


def compile(mod: Any, *, target: Any, **kwargs: Any) -> Any:  # noqa: A001 - mirrors tvm.compile
    """``tvm.compile(mod, target=target, tir_pipeline=PIPELINE, **kwargs)``."""
    return tvm.compile(mod, target=target, tir_pipeline=PIPELINE, **kwargs)
