"""Kernels that write their output over an operand whose last use they are.

A residual block's last kernel reads the shortcut tensor element by element and writes an
output of the same shape (``relu(conv(x) + b + shortcut)``). When nothing reads the
shortcut afterwards, the kernel can store each output element where it just read the
shortcut's: the cache lines it writes are the lines it has just loaded, so the store
needs no read-for-ownership from memory, and the model needs one tensor fewer. In
ResNet-50's first stage those are 3.2 MB tensors that no longer fit the L2 cache.

The rewrite is Relax's ``call_tir_inplace``; the kernel's output parameter is bound to the
operand's buffer (``PrimFunc.specialize``). It is made only where it is safe:

* in the Relax function, the operand is a ``DataflowVar`` computed by a ``call_tir`` (its
  own allocation, never a view of another tensor), every use of it is a plain tensor
  argument of a ``call_tir``, this call is the last, and the call passes it once;
* in the kernel, one block writes the output and reads no output element; that block is
  the only reader of the operand, and reads it at exactly the element it writes (the same
  point region). So every element is read before it is overwritten, and never after. A
  guarded store (``if_then_else``: an epilogue over padded channels) is left alone: its
  code gets slower in place (:func:`_overwritable`).

A kernel the analysis cannot read (TVM refuses to schedule it) is left as it is, and the
reason is returned: the pass never fails a build.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.sym.analyzer import Analyzer

_CALL_TIR = ("relax.call_tir", "relax.call_tir_inplace")


def write_in_place(mod: tvm.IRModule, *, attr: str, strict: bool = False) -> tuple[tvm.IRModule, int, dict[str, str]]:
    """``mod`` with the kernels marked ``attr`` that can write over an operand at every call
    made in-place (module doc).

    A kernel is rewritten only where all its calls can overwrite the same operand: it keeps
    its name, so per-kernel timing and a build's report still name it.

    Parameters
    ----------
    mod : tvm.IRModule
        A module whose kernels are scheduled PrimFuncs called by ``call_tir``.
    attr : str
        The PrimFunc attribute of the kernels that may be rewritten (others are left as
        they are: TVM's own fused kernels may still be fused or rescheduled later).
    strict : bool
        Raise where the analysis cannot read a kernel, instead of leaving it.

    Returns
    -------
    tuple[tvm.IRModule, int, dict[str, str]]
        The module (``mod`` itself if no kernel can be rewritten), how many calls now write
        in place, and kernel name -> why the analysis left that kernel as it is.
    """
    sites: dict[relax.GlobalVar, list[set[int]]] = {}  # kernel -> per call, the operands it may overwrite
    functions = {gvar: func for gvar, func in mod.functions_items()
                 if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr)}
    memo: dict = {}
    skipped: dict[str, str] = {}
    dead = {(gvar, i): _dead_operands(mod, block, attr, memo, None if strict else skipped)
            for gvar, func in functions.items()
            for i, block in enumerate(func.body.blocks) if isinstance(block, relax.DataflowBlock)}
    for found in dead.values():
        for kernel, operands in found.values():
            sites.setdefault(kernel, []).append(operands)
    references = _references(functions.values())
    chosen = {}
    for kernel, calls in sites.items():
        common = set.intersection(*calls)
        if common and len(calls) == references[kernel]:
            chosen[kernel] = min(common)
    if not chosen:
        return mod, 0, skipped
    # A kernel's global var carries its signature: the rewritten kernel gets a new one, same name.
    kept = {gvar: func for gvar, func in mod.functions_items() if gvar not in chosen}
    builder = relax.BlockBuilder(tvm.IRModule(kept, attrs=mod.attrs, global_infos=mod.global_infos))
    renamed = {}
    for kernel, index in chosen.items():
        func = mod[kernel]
        renamed[kernel] = (builder.add_func(func.specialize({func.params[-1]: func.params[index]}), kernel.name_hint),
                           index)
    for gvar, func in functions.items():
        blocks = [_rewrite_block(block, dead[(gvar, i)], renamed) if (gvar, i) in dead else block
                  for i, block in enumerate(func.body.blocks)]
        if any(not new.same_as(old) for new, old in zip(blocks, func.body.blocks)):
            builder.update_func(gvar, relax.Function(func.params, relax.SeqExpr(blocks, func.body.body),
                                                     func.ret_ty, func.is_pure, func.attrs, func.span))
    return builder.get(), sum(references[kernel] for kernel in chosen), skipped


def _rewrite_block(block: relax.DataflowBlock, found: dict, renamed: dict) -> relax.DataflowBlock:
    """``block`` with the calls of the ``renamed`` kernels (kernel -> its in-place global var and
    the operand it overwrites) made in-place; ``found`` is :func:`_dead_operands` of the block."""
    bindings = list(block.bindings)
    for position, (kernel, _) in found.items():
        if kernel in renamed:
            binding = bindings[position]
            in_place, index = renamed[kernel]
            call = relax.call_tir_inplace(in_place, list(binding.value.args[1]), [index], binding.var.ty)
            bindings[position] = relax.VarBinding(binding.var, call)
    return relax.DataflowBlock(bindings, block.span)


def _references(functions) -> dict[relax.GlobalVar, int]:
    """How many calls of any kind the Relax ``functions`` make to each global var."""
    counts: dict[relax.GlobalVar, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.Call):
            for arg in expr.args:
                if isinstance(arg, relax.GlobalVar):
                    counts[arg] = counts.get(arg, 0) + 1

    for func in functions:
        relax.analysis.post_order_visit(func, visit)
    return counts


def _dead_operands(mod: tvm.IRModule, block: relax.DataflowBlock, attr: str, memo: dict,
                   skipped: dict[str, str] | None) -> dict[int, tuple]:
    """Binding position -> (kernel, operands it may overwrite) for each ``call_tir`` of a kernel
    marked ``attr`` in ``block`` (module doc: the Relax and the kernel conditions). ``memo``
    keeps the kernel analysis per (kernel, operand); ``skipped`` receives kernel name -> why
    the analysis could not read it (None: the error propagates)."""
    bindings = list(block.bindings)
    produced = {b.var for b in bindings if _call_name(b.value) in _CALL_TIR}
    uses: dict[relax.Var, list[int]] = {}
    escapes: set[relax.Var] = set()
    for position, binding in enumerate(bindings):
        value = binding.value
        direct = list(value.args[1]) if _call_name(value) in _CALL_TIR else []
        for var in relax.analysis.free_vars(value):
            uses.setdefault(var, []).append(position)
            if not any(arg.same_as(var) for arg in direct):
                escapes.add(var)  # used in a tuple, a view or any other op: it may have aliases
    found = {}
    for position, binding in enumerate(bindings):
        value = binding.value
        if _call_name(value) != "relax.call_tir" or not isinstance(value.args[0], relax.GlobalVar):
            continue
        kernel = mod[value.args[0]]
        if not isinstance(kernel, tvm.tirx.PrimFunc) or kernel.attrs is None or attr not in kernel.attrs:
            continue
        args = list(value.args[1])
        found[position] = (value.args[0], {
            index for index, arg in enumerate(args)
            if isinstance(arg, relax.DataflowVar) and arg in produced and arg not in escapes
            and uses[arg][-1] == position and sum(a.same_as(arg) for a in args) == 1
            and tvm_ffi.structural_equal(arg.ty, binding.var.ty)
            and _memo(memo, kernel, index, value.args[0].name_hint, skipped)})
    return found


def _memo(memo: dict, kernel: tvm.tirx.PrimFunc, index: int, name: str, skipped: dict[str, str] | None) -> bool:
    key = (kernel, index)
    if key not in memo:
        try:
            memo[key] = _overwritable(kernel, index)
        except Exception as err:  # noqa: BLE001 - TVM raises its verifier's findings as several types
            if skipped is None:
                raise
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [repr(err)]
            skipped[name] = f"left as it is: the in-place analysis could not read it ({lines[-1][:200]})"
            memo[key] = False
    return memo[key]


def _overwritable(kernel: tvm.tirx.PrimFunc, index: int) -> bool:
    """Whether ``kernel`` reads parameter ``index`` only at the element it is about to write
    to its output (the last parameter), in one block, before writing it (module doc)."""
    sch = tvm.s_tir.Schedule(kernel)
    params = sch.mod["main"].params
    operand, output = params[index], params[-1]  # by identity: stages may share a parameter's name
    if index == len(params) - 1 or getattr(operand.ty, "shape", None) is None:
        return False
    writers, readers = [], []
    stack = list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        block = stack.pop()
        stack.extend(sch.get_child_blocks(block))
        stmt = sch.get(block)
        if any(r.source.same_as(output) for r in stmt.reads):
            return False  # accumulates into the output: it would read overwritten operand data
        if any(w.source.same_as(output) for w in stmt.writes):
            writers.append(stmt)
        if any(r.source.same_as(operand) for r in stmt.reads):
            readers.append(stmt)
    if len(writers) != 1 or len(readers) != 1 or not writers[0].same_as(readers[0]):
        return False
    if writers[0].init is not None or any(int(v.iter_type) != 0 for v in writers[0].iter_vars):
        return False  # a reduction into the output reads it (implicitly: not in the block's reads)
    if _guarded(writers[0].body):
        # A guarded store (padded channels) is scalarized by TVM and vectorized again by LLVM,
        # which with one buffer read and written emits scatters: RegNet-Y's 104-channel conv
        # runs 1.22x slower in place.
        return False
    written = [w for w in writers[0].writes if w.source.same_as(output)]
    read = [r for r in writers[0].reads if r.source.same_as(operand)]
    if len(written) != 1 or len(read) != 1:
        return False
    analyzer = Analyzer()
    for iter_var in writers[0].iter_vars:
        analyzer.bind(iter_var.var, iter_var.dom)
    return len(read[0].region) == len(written[0].region) and all(
        _is_one(a.extent) and _is_one(b.extent) and analyzer.can_prove_equal(a.min, b.min)
        for a, b in zip(read[0].region, written[0].region))


def _guarded(body) -> bool:
    """Whether ``body`` has an ``if_then_else`` (a store guarded by a condition)."""
    guard, found = tvm.ir.Op.get("prim.if_then_else"), []
    tvm_ffi.structural_walk(body, (tvm.ir.expr.Call, lambda call: found.append(call.op.same_as(guard))))
    return any(found)


def _is_one(extent) -> bool:
    return isinstance(extent, tvm.tirx.IntImm) and int(extent) == 1


def _call_name(value) -> str | None:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None
