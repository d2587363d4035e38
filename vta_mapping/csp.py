"""Embedding the intrinsic DFG into an operator as a CSP, solved with OR-Tools CP-SAT (Rieber et al., §4).

Variables (§4.1): one linearised-instance variable per intrinsic node (64-bit domain: the node's
position in the operator's instance set, or in the tensor for data nodes), channelled to one
coordinate variable per dimension. Constraints (§4.2), each switchable through
:class:`Constraints`:

* dataflow edges (subgraph isomorphism): for every intrinsic edge ``A[x,z] -> mul[x,y,z]`` the
  multiply's access to the operator's ``A`` input must land on the ``A`` node, likewise for ``B``
  and for ``mul -> add`` (the output access), so multiplies that share an intrinsic operand share
  the operator's element;
* all-different: distinct operator instances for distinct multiplies, and distinct tensor elements
  for distinct data / add nodes (injectivity);
* axis-parallel hyper-rectangle: the points of each intrinsic axis form a lexicographically
  ordered rectangle over distinct operator dimensions. CP-SAT has no custom propagators, so the
  paper's inference (Fig. 3) is encoded declaratively: booleans ``u[axis, dim, P, f]`` choose the
  level of the axis with period ``P`` and factor ``f`` (a chain ``1 = P_1, P_2 = f_1, ...`` up to
  the axis size), and node coordinates are linear in them;
* fixed origin: the first multiply at the origin of the instance set;
* dense: unit stride on every mapped dimension;
* linear memory access: mapped dimensions must index every input tensor alone, with coefficient 1
  (no stencils, no strides);
* padding: a mapped dimension may be padded (factor not dividing it, or one tile larger than it).

All solutions are enumerated (``enumerate_all_solutions``); selection is in :mod:`.select`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from .dfg import GemmShape, IntrinsicDFG, gemm_dfg
from .embedding import Embedding
from .polyhedral import Access, TensorOp

__all__ = ["Constraints", "SolveResult", "enumerate_embeddings"]


@dataclass(frozen=True)
class Constraints:
    """Which constraints of §4.2 to post (defaults: the paper's §5 set, plus both operand roles)."""

    all_different: bool = True
    hyper_rectangle: bool = True
    fixed_origin: bool = True
    dense: bool = True
    linear_access: bool = True
    padding: bool = False
    swap_operands: bool = True


@dataclass(frozen=True)
class SolveResult:
    embeddings: tuple[Embedding, ...]
    seconds: float
    complete: bool  # False when max_solutions or the time limit cut the enumeration


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _allowed_factor(extent: int, f: int, size: int, padding: bool) -> bool:
    if not padding:
        return extent % f == 0
    if extent == 1:
        return f == size  # only the static-style "pad the whole axis" for unit dims
    if f <= extent or f == size:
        return True
    # one tile that covers the whole dimension: the smallest candidate factor >= extent
    return f == min(c for c in _divisors(size) if c >= extent) if size >= extent else False


def _tensor_bounds(acc: Access, ub: dict[str, int]) -> list[tuple[int, int]]:
    out = []
    for e in acc.index:
        lo = e.const + sum(min(0, c * ub[d]) for d, c in e.coeffs)
        hi = e.const + sum(max(0, c * ub[d]) for d, c in e.coeffs)
        out.append((lo, hi))
    return out


class _Collector(cp_model.CpSolverSolutionCallback):
    def __init__(self, fn, limit: int):
        super().__init__()
        self.fn, self.limit, self.found, self.hit_limit = fn, limit, [], False

    def on_solution_callback(self) -> None:
        self.found.append(self.fn(self))
        if len(self.found) >= self.limit:
            self.hit_limit = True
            self.StopSearch()


def _solve_role(op: TensorOp, dfg: IntrinsicDFG, cons: Constraints, swapped: bool, *, max_solutions: int,
                time_limit: float, keep_nodes: bool) -> tuple[list[Embedding], bool]:
    shape = dfg.shape
    acc_a, acc_b = (op.inputs[1], op.inputs[0]) if swapped else op.inputs
    acc_o = op.output
    dims = [d.name for d in op.dims]
    ext = op.extents
    sizes = shape.axes
    linear = {d: acc_a.is_linear_in(d) and acc_b.is_linear_in(d) for d in dims}
    m = cp_model.CpModel()

    # candidate levels (d, P, f) per axis
    levels: dict[str, dict[tuple[str, int, int], cp_model.IntVar]] = {}
    ub = {d: ext[d] - 1 for d in dims}
    for a, size in sizes.items():
        levels[a] = {}
        if size == 1 or not cons.hyper_rectangle:
            continue
        for d in dims:
            if cons.linear_access and not linear[d]:
                continue
            for p in _divisors(size):
                for f in _divisors(size // p):
                    if f < 2 or not _allowed_factor(ext[d], f, size, cons.padding):
                        continue
                    levels[a][d, p, f] = m.NewBoolVar(f"u_{a}_{d}_{p}_{f}")
                    if cons.padding:
                        ub[d] = max(ub[d], f - 1)
    if cons.padding and not cons.hyper_rectangle:
        for d in dims:
            ub[d] = max(ub[d], max(sizes.values()) - 1)

    # strides and origin
    stride = {}
    for d in dims:
        used = [v for a in levels for k, v in levels[a].items() if k[0] == d]
        if cons.hyper_rectangle and len(used) > 1:
            m.Add(sum(used) <= 1)  # every operator dimension is used by at most one level
        if cons.dense or not used:
            stride[d] = 1
        else:
            t = m.NewIntVar(1, max(1, ext[d]), f"t_{d}")
            m.Add(t == 1).OnlyEnforceIf([v.Not() for v in used])  # unused: fix it, no duplicates
            stride[d] = t
    if cons.fixed_origin or not cons.hyper_rectangle:
        origin = {d: 0 for d in dims}  # without the rectangle the origin is just mul[0,0,0]
    else:
        origin = {d: m.NewIntVar(0, ub[d], f"o_{d}") for d in dims}

    # chain structure of each axis (the declarative form of the Fig. 3 inference)
    offset_terms: dict[tuple[str, str, int], list] = {}
    for a, size in sizes.items():
        if not levels[a]:
            if size > 1 and cons.hyper_rectangle:
                return [], True  # no dimension can carry this axis
            continue
        at = {}
        for (_d, p, _f), v in levels[a].items():
            at.setdefault(p, []).append(v)
        for p in _divisors(size):
            if p == size:
                continue
            ends = [v for (d, q, f), v in levels[a].items() if q * f == p]
            starts = at.get(p, [])
            reach = 1 if p == 1 else sum(ends)
            m.Add(sum(starts) == reach)
        m.Add(sum(v for (d, q, f), v in levels[a].items() if q * f == size) == 1)
        for (d, p, f), v in levels[a].items():
            if isinstance(stride[d], int):
                w = v
            else:
                w = m.NewIntVar(0, ext[d], f"w_{a}_{d}_{p}_{f}")
                m.Add(w == stride[d]).OnlyEnforceIf(v)
                m.Add(w == 0).OnlyEnforceIf(v.Not())
            for k in range(size):
                digit = (k // p) % f
                if digit:
                    offset_terms.setdefault((a, d, k), []).append(digit * w)

    # node variables
    def box_id(coords: dict[str, object], names: list[str], bound: dict[str, tuple[int, int]], tag: str):
        span, mult, expr = 1, {}, 0
        for nm in reversed(names):
            mult[nm] = span
            span *= bound[nm][1] - bound[nm][0] + 1
        for nm in names:
            expr = expr + mult[nm] * (coords[nm] - bound[nm][0])
        v = m.NewIntVar(0, span - 1, tag)  # 64-bit: CP-SAT domains are int64
        m.Add(v == expr)
        return v

    mul = {}
    mul_ids = []
    for node in dfg.of_kind("mul"):
        x, y, z = node.pos
        c = {}
        for d in dims:
            if cons.hyper_rectangle:
                # linear in the level booleans: no coordinate variable needed
                off = sum(t for a, k in (("x", x), ("y", y), ("z", z)) for t in offset_terms.get((a, d, k), []))
                c[d] = origin[d] + off
            else:
                c[d] = m.NewIntVar(0, ub[d], f"c{node.pos}_{d}")
        mul[node.pos] = c
        mul_ids.append(box_id(c, dims, {d: (0, ub[d]) for d in dims}, f"id{node.pos}"))
    if not cons.hyper_rectangle:
        first = mul[(0, 0, 0)]
        for d in dims:
            if cons.fixed_origin:
                m.Add(first[d] == 0)
            if cons.linear_access and not linear[d]:
                for c in mul.values():
                    m.Add(c[d] == first[d])

    # data / add nodes: coordinates are the access of one consuming (producing) multiply; the other
    # dataflow edges of the node then require every other multiply's access to agree with it
    data_nodes: dict = {}
    data_ids: dict[str, list] = {"A": [], "B": [], "add": []}
    accs = {"A": acc_a, "B": acc_b, "add": acc_o}
    for kind, acc in accs.items():
        bounds = _tensor_bounds(acc, ub)
        names = [f"t{j}" for j in range(len(acc.index))]
        for node in dfg.of_kind(kind):
            data_nodes[node] = None
            data_ids[kind].append((node, names, bounds))
    for edge in dfg.edges:
        if edge.kind != "sequential" or edge.src == edge.dst:
            continue
        tnode, mpos = (edge.src, edge.dst.pos) if edge.src.kind in ("A", "B") else (edge.dst, edge.src.pos)
        acc = accs[tnode.kind]
        here = [e.eval(mul[mpos]) for e in acc.index]
        if data_nodes[tnode] is None:
            data_nodes[tnode] = here
        else:
            for lhs, rhs in zip(data_nodes[tnode], here):
                m.Add(lhs == rhs)
    for kind in data_ids:
        data_ids[kind] = [
            box_id(dict(zip(names, data_nodes[node])), names, dict(zip(names, bounds)), f"{kind}id{node.pos}")
            for node, names, bounds in data_ids[kind]
        ]

    if cons.all_different:
        m.AddAllDifferent(mul_ids)
        for ids in data_ids.values():
            if len(ids) > 1:
                m.AddAllDifferent(ids)

    # branch on the outputs first and propagate backwards (§4.3)
    order = [v for a in ("z", "y", "x") for v in levels[a].values()]
    if order:
        m.AddDecisionStrategy(order, cp_model.CHOOSE_FIRST, cp_model.SELECT_MAX_VALUE)

    def extract(cb) -> Embedding:
        axes = []
        for a, _size in sizes.items():
            chosen = sorted((p, d, f) for (d, p, f), v in levels[a].items() if cb.BooleanValue(v))
            axes.append((a, tuple((d, f, cb.Value(stride[d]) if not isinstance(stride[d], int) else 1)
                                  for p, d, f in chosen)))
        org = tuple((d, origin[d] if isinstance(origin[d], int) else cb.Value(origin[d])) for d in dims)
        nodes = None
        if keep_nodes or not cons.hyper_rectangle:
            nodes = {pos: tuple(cb.Value(c[d]) for d in dims) for pos, c in mul.items()}
        return Embedding(shape, tuple(axes), swapped=swapped, origin=org, nodes=nodes)

    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1  # enumeration is single-threaded; the machine is shared
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.search_branching = cp_model.FIXED_SEARCH
    cb = _Collector(extract, max_solutions)
    status = solver.Solve(m, cb)
    complete = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and not cb.hit_limit
    return cb.found, complete


def enumerate_embeddings(
    op: TensorOp,
    *,
    shape: GemmShape | None = None,
    constraints: Constraints | None = None,
    max_solutions: int = 20000,
    time_limit: float = 30.0,
    keep_nodes: bool = False,
) -> SolveResult:
    """Enumerate all distinct embeddings of the GEMM intrinsic into ``op``.

    Parameters
    ----------
    op : TensorOp
        The operator (see :mod:`.polyhedral`).
    shape : GemmShape, optional
        Intrinsic shape, default ``(1, 16, 16)``.
    constraints : Constraints, optional
        Which constraints to post; default the paper's §5 set.
    max_solutions : int
        Stop after this many solutions per operand role (``complete`` is then False).
    time_limit : float
        Seconds per operand role.
    keep_nodes : bool
        Keep every multiply node's coordinates in each :class:`Embedding` (always kept when the
        hyper-rectangle constraint is off: the structure is then unknown).

    Returns
    -------
    SolveResult
    """
    if max_solutions < 1:
        raise ValueError(f"max_solutions must be >= 1, got {max_solutions}")
    if time_limit <= 0:
        raise ValueError(f"time_limit must be > 0, got {time_limit}")
    shape = shape or GemmShape()
    cons = constraints or Constraints()
    dfg = gemm_dfg(shape)
    t0 = time.perf_counter()
    found, complete = [], True
    for swapped in (False, True) if cons.swap_operands else (False,):
        sols, ok = _solve_role(op, dfg, cons, swapped, max_solutions=max_solutions, time_limit=time_limit,
                               keep_nodes=keep_nodes)
        found += sols
        complete = complete and ok
    return SolveResult(tuple(found), time.perf_counter() - t0, complete)
