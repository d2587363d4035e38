"""The ``vta_gemm`` strategy: int8 conv2d / dense of a model run on the VTA model.

For the ``vta`` board (:data:`alt_tvm.target.BOARDS`), ``relax.nn.conv2d`` and ``relax.matmul``
calls with int8 inputs, int32 results and a constant weight are mapped at build time with the CP
embedding of :mod:`alt_tvm.vta_mapping` (the same choice as :func:`alt_tvm.strategies.vta.gemm.vta_conv2d`)
and lowered once to a VTA program. The partition becomes a ``relax.call_dps_packed`` of a Python
function registered in TVM's global function table (name ``alt_tvm.vta_gemm.<op>_<n>``, unique per
partition in the process); on every call it packs the input on the host as the embedding says,
runs the program on :class:`alt_tvm.vta_mapping.sim.Simulator` and writes the int32 result.

Epilogue ops fused after the anchor (bias add, ReLU, clip, residual add ...) run in NumPy inside
the same function, after the simulated GEMM (VTA's ALU is not used for them); a non-constant
operand (a residual) becomes an extra argument of the packed function. Ops outside
:data:`EPILOGUE_OPS` make ``implement`` raise ``ValueError``.

Statistics: each packed function is a :class:`VTAKernel` whose :class:`VTAStats` accumulates the
simulated cycles and bytes of every call. Kernels are kept in a module-level table by packed
function name (TVM's global function table holds them for the life of the process anyway);
:func:`model_stats` returns those of one compiled model, :func:`kernel` one by name.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm_ffi
from tvm import relax

from alt_tvm.layout import Layout
from alt_tvm.strategies.base import (
    LoweredPartition,
    OpInfo,
    Strategy,
    attrs_dict,
    const_value,
    dtype_of,
    op_name,
    static_shape,
)
from alt_tvm.strategies.registry import register_strategy
from alt_tvm.strategies.vta.gemm import DEFAULT_CONSTRAINTS, _choose
from alt_tvm.strategies.vta.gemm import applicable as vta_applicable
from alt_tvm.vta_mapping.csp import Constraints
from alt_tvm.vta_mapping.embedding import Embedding
from alt_tvm.vta_mapping.polyhedral import TensorOp, conv2d_op, dense_op
from alt_tvm.vta_mapping.rewrite import Plan, lower, plan
from alt_tvm.vta_mapping.sim import Simulator, Stats, VTAConfig

__all__ = ["EPILOGUE_OPS", "VTAGemmOptions", "VTAGemmStrategy", "VTAKernel", "VTAStats", "kernel",
           "model_stats", "PACKED_PREFIX"]

#: Prefix of the packed function names this strategy registers.
PACKED_PREFIX = "alt_tvm.vta_gemm."
#: The target (``HardwareTarget.name``) this strategy builds for.
VTA_TARGET = "vta"


@dataclass(frozen=True)
class VTAGemmOptions:
    """``strategy_options={"vta_gemm": VTAGemmOptions(...)}`` of :func:`alt_tvm.build`.

    Attributes
    ----------
    config : VTAConfig
        GEMM shape, buffer sizes and cost model of the simulated VTA.
    mapping : {"csp", "static"}
        The CP embedding (best ranked) or TVM's old static template.
    constraints : Constraints
        CSP constraint set (``mapping="csp"`` only).
    weights : (float, float)
        Candidate-selection weights (MAC, data) of Rieber et al., §4.4.
    """

    config: VTAConfig = field(default_factory=VTAConfig)
    mapping: str = "csp"
    constraints: Constraints = DEFAULT_CONSTRAINTS
    weights: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        if self.mapping not in ("csp", "static"):
            raise ValueError(f"VTAGemmOptions.mapping must be 'csp' or 'static', got {self.mapping!r}")


@dataclass
class VTAStats:
    """Simulated totals over every call of one kernel (mutable: the kernel adds to it per call)."""

    calls: int = 0
    cycles: int = 0
    gemm_uops: int = 0
    instructions: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    pack_seconds: float = 0.0  # host packing + unpacking, measured

    @property
    def bytes_moved(self) -> int:
        return self.bytes_loaded + self.bytes_stored

    def add(self, stats: Stats, pack_seconds: float) -> None:
        self.calls += 1
        self.cycles += stats.cycles
        self.gemm_uops += stats.gemm_uops
        self.instructions += stats.instructions
        self.bytes_loaded += stats.bytes_loaded
        self.bytes_stored += stats.bytes_stored
        self.pack_seconds += pack_seconds


# ------------------------------------------------------------------------------ epilogue in NumPy
def _clip(x: np.ndarray, call: relax.Call) -> np.ndarray:
    lo, hi = (_scalar(a) for a in call.args[1:3])
    return np.clip(x, lo, hi)


def _scalar(value: Any) -> float:
    inner = getattr(value, "value", value)
    return float(getattr(inner, "value", inner))


#: Epilogue ops evaluated in NumPy: unary ``f(x, call)`` or binary ``f(x, y)``.
UNARY: dict[str, Callable[[np.ndarray, relax.Call], np.ndarray]] = {
    "relax.nn.relu": lambda x, _: np.maximum(x, 0),
    "relax.nn.relu6": lambda x, _: np.clip(x, 0, 6),
    "relax.clip": _clip,
    "relax.negative": lambda x, _: np.negative(x),
    "relax.abs": lambda x, _: np.abs(x),
}
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.maximum": np.maximum, "relax.minimum": np.minimum,
}
#: Every epilogue op ``vta_gemm`` supports (integer division is left out: TVM floors, NumPy's
#: ``//`` too, but ``divide`` on int32 is rarely what a quantized model means).
EPILOGUE_OPS = tuple(sorted({*UNARY, *BINARY}))


@dataclass(frozen=True)
class _EpilogueStep:
    op: str
    call: relax.Call
    dtype: str
    #: per tensor operand: "chain" (the previous stage), ("const", array) or ("arg", index)
    operands: tuple


def _apply_epilogue(steps: tuple[_EpilogueStep, ...], value: np.ndarray, extra: list[np.ndarray]) -> np.ndarray:
    for step in steps:
        if step.op in UNARY:
            value = UNARY[step.op](value, step.call)
        else:
            a, b = (value if o == "chain" else o[1] if o[0] == "const" else extra[o[1]] for o in step.operands)
            value = BINARY[step.op](np.asarray(a, step.dtype), np.asarray(b, step.dtype))
        value = np.asarray(value).astype(step.dtype, copy=False)
    return value


# ------------------------------------------------------------------------------ the packed kernel
class VTAKernel:
    """One partition's packed function: ``f(data, *epilogue_inputs, out)`` in destination-passing style.

    Attributes
    ----------
    name : str
        Its global function name.
    op : TensorOp
        The mapped operator; ``embedding``, ``candidates`` and ``solve_seconds`` say how it was mapped.
    stats : VTAStats
        Simulated cycles and bytes accumulated over its calls (``pack_seconds``: data packing and
        output unpacking per call only).
    weight_pack_seconds : float
        Host time to pack the constant weight into its tile array, spent once at build time.
    """

    def __init__(self, *, name: str, op: TensorOp, embedding: Embedding, candidates: int, solve_seconds: float,
                 config: VTAConfig, weight: np.ndarray, prepare: Callable[[np.ndarray], np.ndarray],
                 finish: Callable[[np.ndarray], np.ndarray], epilogue: tuple[_EpilogueStep, ...]) -> None:
        self.name = name
        self.op = op
        self.embedding = embedding
        self.candidates = candidates
        self.solve_seconds = solve_seconds
        self.config = config
        self.stats = VTAStats()
        self._prepare = prepare  # data -> canonical operand A (zero padding; NHWC read in place)
        self._finish = finish  # canonical output -> the Relax call's output
        self._epilogue = epilogue
        # The plan and program depend only on shapes: lowered once here, reused by every call.
        self._plan: Plan = plan(op, embedding)
        self._program = lower(self._plan, config)
        # The weight is a constant: packed into its DRAM tile array once, at build time.
        t0 = time.perf_counter()
        self._weight_role = self._plan.operand_role(1)
        self._weight_tiles = self._plan.pack_operand(index=1, tensor=weight)
        self.weight_pack_seconds = time.perf_counter() - t0

    def run(self, data: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        """The partition's result for NumPy inputs (what the packed function writes)."""
        g = self.config.gemm
        t0 = time.perf_counter()
        data_tiles = self._plan.pack_operand(index=0, tensor=self._prepare(data))  # only the data per call
        pack_s = time.perf_counter() - t0
        dram = {self._weight_role: self._weight_tiles, self._plan.operand_role(0): data_tiles,
                "out": np.zeros((self._plan.ntiles["C"], g.batch, g.block_out), np.int32)}
        stats = Simulator(self.config).run(self._program, dram)
        t0 = time.perf_counter()
        out = self._finish(self._plan.unpack(dram["out"]))
        self.stats.add(stats, pack_s + time.perf_counter() - t0)
        return _apply_epilogue(self._epilogue, out, list(extra))

    def __call__(self, *tensors: Any) -> None:
        *inputs, out = tensors
        result = self.run(*(t.numpy() for t in inputs))
        out.copyfrom(np.ascontiguousarray(result, dtype=str(out.dtype)))


_KERNELS: dict[str, VTAKernel] = {}
_COUNTER = itertools.count()


def kernel(name: str) -> VTAKernel:
    """The kernel registered under packed function ``name``.

    Raises
    ------
    ValueError
        If no ``vta_gemm`` kernel has that name.
    """
    try:
        return _KERNELS[name]
    except KeyError:
        raise ValueError(f"no vta_gemm kernel named {name!r}; known: {sorted(_KERNELS)}") from None


def model_stats(model: Any) -> dict[str, VTAStats]:
    """Simulated statistics of every ``vta_gemm`` kernel of a compiled model, by packed function name.

    Parameters
    ----------
    model
        An :class:`alt_tvm.graph.compiled.CompiledModel` (or a Relax ``IRModule``) built for ``vta``.
    """
    mod = getattr(model, "mod", model)
    names: list[str] = []

    def visit(expr: Any) -> None:
        if op_name(expr) == "relax.call_dps_packed":
            symbol = str(getattr(expr.args[0], "global_symbol", ""))
            if symbol.startswith(PACKED_PREFIX) and symbol not in names:
                names.append(symbol)

    for gvar in mod.get_global_vars():
        func = mod[gvar]
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return {n: _KERNELS[n].stats for n in names if n in _KERNELS}


# ------------------------------------------------------------------------------ the strategy
def _conv_geometry(attrs: Mapping[str, Any]) -> tuple[str, tuple[int, int], tuple[int, int], tuple[int, int], int]:
    pads = [int(p) for p in attrs.get("padding", [0, 0, 0, 0])]
    if len(pads) == 2:
        pads = pads * 2
    return (str(attrs.get("data_layout", "NCHW")), tuple(int(s) for s in attrs.get("strides", [1, 1])),
            (pads[0], pads[1]), tuple(int(d) for d in attrs.get("dilation", [1, 1])), int(attrs.get("groups", 1)))


def _options(value: Any) -> VTAGemmOptions:
    if value is None:
        return VTAGemmOptions()
    if not isinstance(value, VTAGemmOptions):
        raise ValueError(f"strategy_options['vta_gemm'] must be a VTAGemmOptions, got {type(value).__name__}")
    return value


class VTAGemmStrategy(Strategy):
    """int8 ``relax.nn.conv2d`` / ``relax.matmul`` (constant weight) on the simulated VTA.

    Priority 30 (above ``alt``): on the ``vta`` target an int8 layer goes to the accelerator
    whenever the mapping applies. Other targets never get it (``applicable`` says why).
    """

    name = "vta_gemm"
    ops = ("relax.nn.conv2d", "relax.matmul")
    target_kinds = ("llvm",)
    priority = 30
    opt_in = True

    def applicable(self, info: OpInfo) -> str | None:
        if info.target_name != VTA_TARGET:
            return f"target {info.target_name!r} has no VTA (needs board 'vta')"
        if len(info.input_dtypes) != 2 or any(d != "int8" for d in info.input_dtypes):
            return f"input dtypes {info.input_dtypes} (needs int8 data and weight)"
        if info.output_dtype != "int32":
            return f"output dtype {info.output_dtype!r} (needs out_dtype='int32')"
        if 1 not in info.constants:
            return "weight is not a constant"
        try:
            _options(info.options.get(self.name))
        except ValueError as err:
            return str(err)
        attrs = info.attrs
        if info.op == "relax.matmul":
            a, b = info.input_shapes
            if len(b) != 2 or len(a) < 2 or a[-1] != b[0]:
                return f"shapes {info.input_shapes} (needs [..., M, K] x [K, N])"
            mapped = {"op": "dense", "dtype": "int8", "out_dtype": "int32"}
        else:
            layout, _, _, _, _ = _conv_geometry(attrs)
            kernel_layout = str(attrs.get("kernel_layout", "OIHW"))
            if sorted(kernel_layout) != sorted("OIHW"):
                return f"kernel_layout {kernel_layout!r} (needs a permutation of OIHW)"
            if str(attrs.get("out_layout", layout) or layout) != layout:
                return f"out_layout {attrs.get('out_layout')!r} differs from data_layout {layout!r}"
            pads = [int(p) for p in attrs.get("padding", [0, 0, 0, 0])]
            if len(pads) == 4 and pads[:2] != pads[2:]:
                return f"asymmetric padding {pads} (needs top == bottom and left == right)"
            mapped = {"op": "conv2d", "dtype": "int8", "out_dtype": "int32", "data_layout": layout}
        if not vta_applicable(mapped):
            return f"the VTA mapping does not apply to {mapped}"
        return None

    def implement(self, anchor: Any, context: Any) -> LoweredPartition:
        options = _options(context.options)
        call = anchor.value
        data_expr = call.args[0]
        weight = const_value(call.args[1])
        if weight is None:
            raise ValueError(f"vta_gemm needs a constant weight for {op_name(call)}")
        shape = static_shape(data_expr)
        # The simulator reads canonical data: have a propagated producer layout converted first.
        context.require_layout(context.te_input(data_expr, "data"), Layout(shape))
        kind = "dense" if op_name(call) == "relax.matmul" else "conv2d"
        if kind == "dense":
            op, b, prepare, finish = self._dense(shape, weight)
        else:
            op, b, prepare, finish = self._conv2d(shape, weight, attrs_dict(call.attrs))
        t0 = time.perf_counter()
        emb, _, ncand = _choose(op, options.config, options.mapping, options.constraints, options.weights)
        solve_s = time.perf_counter() - t0  # CP solve + ranking
        extra_args: list[relax.Expr] = []
        epilogue = self._epilogue(anchor, context, extra_args)
        name = f"{PACKED_PREFIX}{kind}_{next(_COUNTER)}"
        runner = VTAKernel(name=name, op=op, embedding=emb, candidates=ncand, solve_seconds=solve_s,
                           config=options.config, weight=b, prepare=prepare, finish=finish, epilogue=epilogue)
        tvm_ffi.register_global_func(name, runner, override=True)
        _KERNELS[name] = runner
        out = context.partition.output
        return LoweredPartition(func=None, args=[data_expr, *extra_args], output_shape=static_shape(out),
                                output_dtype=dtype_of(out), output_layout=None, strategy=self.name,
                                packed_func=name)

    @staticmethod
    def _dense(shape: tuple[int, ...], weight: np.ndarray):
        *lead, m, k = shape
        rows = int(np.prod(lead, dtype=np.int64)) * m
        op = dense_op(m=rows, n=weight.shape[1], k=k)
        b = np.ascontiguousarray(weight.T)  # matmul's [K, N] weight is dense's [N, K] operand B
        return (op, b, lambda x: x.reshape(rows, k),
                lambda y: y.reshape(*lead, m, weight.shape[1]))

    @staticmethod
    def _conv2d(shape: tuple[int, ...], weight: np.ndarray, attrs: Mapping[str, Any]):
        layout, (sh, sw), (ph, pw), (dh, dw), groups = _conv_geometry(attrs)
        kernel_layout = str(attrs.get("kernel_layout", "OIHW"))
        wt = np.ascontiguousarray(weight.transpose([kernel_layout.index(a) for a in "OIHW"]))
        if layout == "NHWC":
            n, h, w, c = shape
        else:
            n, c, h, w = shape
        k, cg, r, s = wt.shape
        op = conv2d_op(n=n, c=c, h=h, w=w, k=k, r=r, s=s, pad_h=ph, pad_w=pw, stride_h=sh, stride_w=sw,
                       dilation_h=dh, dilation_w=dw, groups=groups)
        if groups > 1:
            wt = wt.reshape(groups, k // groups, cg, r, s)

        def prepare(x: np.ndarray) -> np.ndarray:
            # Zero padding in the host layout, then a canonical N C H W *view* (no layout copy:
            # the tile gather reads NHWC memory in place); groups as a leading axis.
            if layout == "NHWC":
                x = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0))).transpose(0, 3, 1, 2)
            else:
                x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
            return x.reshape(n, groups, c // groups, *x.shape[2:]) if groups > 1 else x

        def finish(y: np.ndarray) -> np.ndarray:
            y = y.reshape(n, k, *y.shape[3:]) if groups > 1 else y
            return y.transpose(0, 2, 3, 1) if layout == "NHWC" else y

        return op, wt, prepare, finish

    @staticmethod
    def _epilogue(anchor: Any, context: Any, extra_args: list) -> tuple[_EpilogueStep, ...]:
        steps = []
        chain = anchor.var
        for binding in context.partition.epilogue:
            call = binding.value
            name = op_name(call)
            if name not in UNARY and name not in BINARY:
                raise ValueError(f"vta_gemm: epilogue op {name} after {op_name(anchor.value)} is not supported "
                                 f"(supported: {list(EPILOGUE_OPS)})")
            operands = []
            if name in BINARY:
                for j, arg in enumerate(call.args[:2]):
                    if arg.same_as(chain):
                        operands.append("chain")
                    elif const_value(arg) is not None:
                        operands.append(("const", const_value(arg)))
                    else:  # e.g. a residual: an extra input of the packed function, in canonical layout
                        shape = static_shape(arg)
                        if shape is None:
                            raise ValueError(f"vta_gemm: operand {j} of epilogue op {name} has no static shape")
                        context.require_layout(context.te_input(arg, f"ep{len(steps)}_{j}"), Layout(shape))
                        operands.append(("arg", len(extra_args)))
                        extra_args.append(arg)
            steps.append(_EpilogueStep(name, call, dtype_of(binding.var), tuple(operands)))
            chain = binding.var
        return tuple(steps)


register_strategy(VTAGemmStrategy())
