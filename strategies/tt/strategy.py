"""The ``tt_einsum`` build strategy: dense layers rewritten into the TT einsum chain.

A dense layer reaches the partitioner as ``relax.matmul(x[B, N], C[N, M])`` with a constant
right-hand side (the transposed ``nn.Linear.weight`` ``W[M, N]``), usually followed by a bias
``relax.add``. When the build's ``strategy_options["tt_einsum"]`` (a :class:`TTOptions`) asks
for the layer, this strategy factorises ``W`` by TT-SVD (:mod:`.tt_decompose`) for either a
fixed solution or the cheapest DSE solution (:mod:`.tt_dse`) within an error budget, and
replaces the partition by the scheduled einsum chain of :func:`.tt_einsum.build_chain` with
the bias fused. Without options it never applies, so TT factorisation (which changes the
model's numbers) is strictly opt-in.

Epilogues: a partition ending in one ``relax.add`` of a constant ``[M]`` / ``[1, M]`` vector
has that bias fused into the chain's output stage; any other element-wise epilogue the
partitioner fuses (bias + ReLU, GELU, a residual add, ...) is built from the partition's own
TE (:meth:`PartitionContext.epilogue_te`) on the chain's output and inlined into its last
loop. Activations of any rank ``[*lead, N]`` (e.g. ``[B, S, N]`` in a transformer) are read
as ``[prod(lead), N]`` by indexing. :func:`plan_layer` shows which solution and error a
request gives for a weight, without building anything.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from tvm import relax

from alt_tvm.layout import Layout
from alt_tvm.strategies.base import (
    LoweredPartition,
    OpInfo,
    PartitionContext,
    Strategy,
    const_value,
    equivalent,
    op_name,
    static_shape,
)
from alt_tvm.strategies.registry import register_strategy

from .decompose import TTDecomposition, decompose, tt_svd
from .dse import DEFAULT_CONFIG, DSEConfig, TTSolution, einsum_flops, solutions, tt_flops, tt_params
from .einsum import build_chain

__all__ = ["TTBudgetError", "TTEinsumStrategy", "TTLayerRequest", "TTOptions", "plan_layer"]

NAME = "tt_einsum"
_LAYER_KEY = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")


def _int_tuple(name: str, value: Any, *, minimum: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of integers, got {value!r}") from None
    # bool is an int subclass; True as a factor is a typo, not 1.
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum for v in items):
        raise ValueError(f"{name} must be integers >= {minimum}, got {items}")
    return tuple(int(v) for v in items)


@dataclass(frozen=True)
class TTLayerRequest:
    """How one dense layer is factorised.

    Give ``max_error`` (search), or ``in_factors``, ``out_factors`` and ``ranks`` (a fixed
    solution), or both (the fixed solution, rejected if its error exceeds the budget).

    Parameters
    ----------
    max_error : float, optional
        Budget on the TT-SVD relative error ``||W - W_tt||_F / ||W||_F``, in ``[0, 1]``. The
        search takes the DSE solutions sorted by FLOPs and keeps the first within budget.
    in_factors, out_factors : tuple of int, optional
        ``(n_1..n_d)`` with product ``N`` and ``(m_1..m_d)`` with product ``M``, ``d >= 2``.
    ranks : tuple of int, optional
        ``(1, r_1, ..., r_{d-1}, 1)``; TT-SVD caps each rank by its cut's bound.
    candidates : int
        How many of the cheapest DSE solutions the search decomposes (each is one TT-SVD).
    config : DSEConfig
        Pruning of the DSE (vector length of the ranks, scalability rule).
    """

    max_error: float | None = None
    in_factors: tuple[int, ...] | None = None
    out_factors: tuple[int, ...] | None = None
    ranks: tuple[int, ...] | None = None
    candidates: int = 16
    config: DSEConfig = DEFAULT_CONFIG

    def __post_init__(self) -> None:
        if self.max_error is not None:
            if isinstance(self.max_error, bool) or not isinstance(self.max_error, (int, float)) \
                    or not 0.0 <= float(self.max_error) <= 1.0:
                raise ValueError(f"max_error must be a number in [0, 1], got {self.max_error!r}")
            object.__setattr__(self, "max_error", float(self.max_error))
        ins = _int_tuple("in_factors", self.in_factors, minimum=2)
        outs = _int_tuple("out_factors", self.out_factors, minimum=2)
        ranks = _int_tuple("ranks", self.ranks, minimum=1)
        given = [x is not None for x in (ins, outs, ranks)]
        if any(given) and not all(given):
            raise ValueError("a fixed solution needs all of in_factors, out_factors and ranks, got "
                             f"in_factors={ins}, out_factors={outs}, ranks={ranks}")
        if not any(given) and self.max_error is None:
            raise ValueError("a TTLayerRequest needs max_error or a fixed solution "
                             "(in_factors, out_factors, ranks)")
        if all(given):
            if len(ins) < 2 or len(outs) != len(ins):
                raise ValueError(f"in_factors {ins} and out_factors {outs} need equal length d >= 2")
            if len(ranks) != len(ins) + 1 or ranks[0] != 1 or ranks[-1] != 1:
                raise ValueError(f"ranks must be (1, r_1, ..., r_{{d-1}}, 1) of length d + 1 = {len(ins) + 1}, "
                                 f"got {ranks}")
        object.__setattr__(self, "in_factors", ins)
        object.__setattr__(self, "out_factors", outs)
        object.__setattr__(self, "ranks", ranks)
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 1:
            raise ValueError(f"candidates must be an integer >= 1, got {self.candidates!r}")
        if not isinstance(self.config, DSEConfig):
            raise ValueError(f"config must be a DSEConfig, got {type(self.config).__name__}")

    @property
    def fixed(self) -> bool:
        """True if the request names its solution."""
        return self.in_factors is not None


@dataclass(frozen=True)
class TTOptions:
    """``strategy_options["tt_einsum"]``: which dense layers become TT chains.

    Parameters
    ----------
    layers : mapping of str to TTLayerRequest
        Requests by weight shape ``"NxM"`` (``N`` inputs, ``M`` outputs, e.g. ``"512x256"``
        for ``nn.Linear(512, 256)``), or ``"*"`` for any layer.
    default : TTLayerRequest, optional
        Request for layers that ``layers`` does not name (same as a ``"*"`` entry; give one).

    Examples
    --------
    >>> opts = TTOptions(layers={"784x300": TTLayerRequest(max_error=0.2)})
    >>> opts.request_for(784, 300).max_error
    0.2
    """

    layers: Mapping[str, TTLayerRequest] = field(default_factory=dict)
    default: TTLayerRequest | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.layers, Mapping):
            raise ValueError(f"layers must be a mapping of 'NxM' or '*' to TTLayerRequest, got "
                             f"{type(self.layers).__name__}")
        for key, request in self.layers.items():
            if not isinstance(key, str) or (key != "*" and not _LAYER_KEY.match(key)):
                raise ValueError(f"layer key {key!r} must be 'NxM' (inputs x outputs, e.g. '512x256') or '*'")
            if not isinstance(request, TTLayerRequest):
                raise ValueError(f"layers[{key!r}] must be a TTLayerRequest, got {type(request).__name__}")
        if self.default is not None and not isinstance(self.default, TTLayerRequest):
            raise ValueError(f"default must be a TTLayerRequest or None, got {type(self.default).__name__}")
        if self.default is not None and "*" in self.layers:
            raise ValueError("give either default or a '*' layer entry, not both")
        # A read-only copy: the options stay what the build was given.
        object.__setattr__(self, "layers", MappingProxyType(dict(self.layers)))

    def request_for(self, n: int, m: int) -> TTLayerRequest | None:
        """The request for a layer with ``n`` inputs and ``m`` outputs, or None (keep it dense)."""
        return self.layers.get(f"{n}x{m}", self.layers.get("*", self.default))


class TTBudgetError(ValueError):
    """No solution a request allows meets its error budget.

    Attributes
    ----------
    best_error : float or None
        The smallest relative error seen (None if the DSE had no solution).
    """

    def __init__(self, message: str, *, best_error: float | None) -> None:
        super().__init__(message)
        self.best_error = best_error


def _solution_of(ins: tuple[int, ...], outs: tuple[int, ...], ranks: tuple[int, ...]) -> TTSolution:
    return TTSolution(ins, outs, ranks, tt_flops(ins, outs, ranks), tt_params(ins, outs, ranks),
                      einsum_flops(ins, outs, ranks))


def plan_layer(weight: np.ndarray, *, request: TTLayerRequest) -> tuple[TTSolution, TTDecomposition]:
    """The TT solution and decomposition that ``request`` gives for a dense weight.

    Parameters
    ----------
    weight : numpy.ndarray
        ``W[M, N]`` (``nn.Linear.weight``; the transpose of the matmul's constant ``[N, M]``).
    request : TTLayerRequest

    Returns
    -------
    solution : TTSolution
        Factors and ranks as used (TT-SVD may lower a requested rank), FLOPs, parameters.
    decomposition : TTDecomposition
        Cores ``G_1..G_d`` and ``rel_error``.

    Raises
    ------
    TTBudgetError
        If no allowed solution has ``rel_error <= request.max_error`` (a ``ValueError``).
    ValueError
        If a fixed solution's factors do not multiply to ``N`` and ``M``, or the layer is too
        small for the DSE.
    """
    weight = np.asarray(weight)
    if weight.ndim != 2:
        raise ValueError(f"weight must be a 2-D [M, N] matrix, got shape {weight.shape}")
    if not isinstance(request, TTLayerRequest):
        raise ValueError(f"request must be a TTLayerRequest, got {type(request).__name__}")
    m, n = (int(s) for s in weight.shape)
    if request.fixed:
        dec = tt_svd(weight, in_factors=request.in_factors, out_factors=request.out_factors, ranks=request.ranks)
        if request.max_error is not None and dec.rel_error > request.max_error:
            raise TTBudgetError(f"fixed solution in={dec.in_factors} out={dec.out_factors} ranks={dec.ranks} has "
                                f"relative error {dec.rel_error:.3g} > max_error {request.max_error:g}",
                                best_error=dec.rel_error)
        return _solution_of(dec.in_factors, dec.out_factors, dec.ranks), dec
    found = solutions(n, m, config=request.config)
    if not found:
        raise TTBudgetError(f"the DSE has no TT solution cheaper than the dense {n}x{m} layer", best_error=None)
    best: TTDecomposition | None = None
    # Sorted by FLOPs: the first within budget is the cheapest.
    for solution in found[: request.candidates]:
        dec = decompose(weight, solution=solution)
        if dec.rel_error <= request.max_error:
            return _solution_of(dec.in_factors, dec.out_factors, dec.ranks), dec
        if best is None or dec.rel_error < best.rel_error:
            best = dec
    raise TTBudgetError(
        f"none of the {min(len(found), request.candidates)} cheapest TT solutions of {n}x{m} meets max_error "
        f"{request.max_error:g}; best relative error {best.rel_error:.3g} (in={best.in_factors} "
        f"out={best.out_factors} ranks={best.ranks}); raise max_error or candidates", best_error=best.rel_error)


def _options(options: Any) -> TTOptions | None:
    if options is None or isinstance(options, TTOptions):
        return options
    raise ValueError(f"strategy_options['{NAME}'] must be a TTOptions, got {type(options).__name__}")


def _fused_bias(context: PartitionContext, m: int) -> np.ndarray | None:
    """The constant bias if the epilogue is exactly one bias add, zeros if there is no
    epilogue, None if the epilogue must be built as TE."""
    epilogue = context.partition.epilogue
    if not epilogue:
        return np.zeros(m, np.float32)
    anchor = context.partition.anchor.var
    if len(epilogue) == 1 and op_name(epilogue[0].value) == "relax.add":
        lhs, rhs = epilogue[0].value.args
        other = rhs if lhs.same_as(anchor) else lhs if rhs.same_as(anchor) else None
        data = const_value(other) if other is not None else None
        if data is not None and data.shape in ((m,), (1, m)):
            return np.ascontiguousarray(data.reshape(m), np.float32)
    return None


class TTEinsumStrategy(Strategy):
    """Dense layer (matmul with a constant ``[N, M]`` weight) as a TT einsum chain, on request."""

    name = NAME
    ops = ("relax.matmul",)
    # Above the dense "alt" GEMM (10): when a layer is requested, it wins; otherwise it declines.
    priority = 20
    opt_in = True
    exact = False  # a low-rank factorisation of the weight

    def __init__(self, *, cache_size: int = 8) -> None:
        # applicable() and implement() both need the plan; TT-SVD costs one SVD per core and
        # candidate, so keep the last few plans by (weight digest, request).
        self._plans: OrderedDict = OrderedDict()
        self._cache_size = cache_size

    def _plan(self, weight: np.ndarray, request: TTLayerRequest) -> tuple[TTSolution, TTDecomposition]:
        key = (hashlib.sha1(np.ascontiguousarray(weight).tobytes()).hexdigest(), weight.shape, str(weight.dtype),
               request)
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
        plan = plan_layer(weight, request=request)
        self._plans[key] = plan
        while len(self._plans) > self._cache_size:
            self._plans.popitem(last=False)
        return plan

    def applicable(self, info: OpInfo) -> str | None:
        options = _options(info.options.get(NAME))
        if options is None:
            return f"off by default (pass strategy_options={{'{NAME}': TTOptions(...)}})"
        if any(d != "float32" for d in info.input_dtypes):
            return f"dtypes {info.input_dtypes} (needs float32)"
        if 1 not in info.constants:
            return "right-hand side is not a constant"
        if len(info.input_shapes) != 2 or len(info.input_shapes[0]) < 2 or len(info.input_shapes[1]) != 2:
            return f"shapes {info.input_shapes} (needs [*lead, N] x [N, M])"
        n, m = info.input_shapes[1]
        request = options.request_for(n, m)
        if request is None:
            return f"layer {n}x{m} not requested (TTOptions layers {sorted(options.layers)}, no default)"
        explicit = f"{n}x{m}" in options.layers
        weight = info.constants[1].T
        try:
            self._plan(weight, request)
        except TTBudgetError as err:
            return str(err)
        except ValueError as err:
            if explicit:  # a request naming this layer that cannot fit it is a mistake in the options
                raise ValueError(f"TTOptions layers['{n}x{m}']: {err}") from err
            return f"layer {n}x{m}: {err}"
        return None

    def implement(self, anchor: relax.VarBinding, context: PartitionContext) -> LoweredPartition:
        call = anchor.value
        x, rhs = call.args
        x_shape = tuple(int(d) for d in static_shape(x))
        n = x_shape[-1]
        batch = int(np.prod(x_shape[:-1]))
        data = const_value(rhs)
        m = int(data.shape[1])
        request = _options(context.options).request_for(n, m)
        bias = _fused_bias(context, m)
        solution, dec = self._plan(data.T, request)
        extra: list = []
        out_shape, out_dtype = (*x_shape[:-1], m), "float32"

        def epilogue(y):
            # The partition's own element-wise epilogue on the chain's output; the placeholders
            # it creates (bias, residuals, ...) are the extra arguments, in creation order.
            nonlocal out_shape, out_dtype
            before = len(context.placeholders)
            stages = context.epilogue_te(y)
            out_shape, out_dtype = tuple(int(d) for d in stages[-1].shape), str(stages[-1].dtype)
            extra.extend(context.placeholders[before:])
            return stages, [t for _, t in context.placeholders[before:]]

        chain = build_chain(in_factors=solution.in_factors, out_factors=solution.out_factors, ranks=solution.ranks,
                            batch=batch, target=context.target, input_shape=x_shape,
                            epilogue=None if bias is not None else epilogue)
        # Every activation is read row-major: convert first if a previous partition left it in another layout.
        for source in [x, *(src for src, _ in extra)]:
            current = context.input_layouts.get(source)
            shape = static_shape(source)
            if const_value(source) is None and current is not None and not equivalent(current, None, shape):
                context.conversions[source] = Layout(tuple(int(d) for d in shape))
        cores = [relax.const(np.ascontiguousarray(c, np.float32), "float32") for c in chain.pack(dec.cores)]
        zeros = np.zeros(m, np.float32)
        args = [x, *cores, relax.const(zeros if bias is None else bias, "float32")]
        for source, _ in extra:
            value = const_value(source)
            args.append(source if value is None else relax.const(np.array(value, order="C", copy=True),
                                                                  str(value.dtype)))
        return LoweredPartition(chain.mod["main"], args, out_shape, out_dtype, None, self.name)


register_strategy(TTEinsumStrategy())
