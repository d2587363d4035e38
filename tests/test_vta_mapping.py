"""VTA mapping: representation from TE, the CP-SAT embedding CSP and candidate selection."""

import pytest
from tvm import te

import alt_tvm.ops as ops
from alt_tvm.vta_mapping.csp import Constraints, enumerate_embeddings
from alt_tvm.vta_mapping.dfg import GemmShape, gemm_dfg
from alt_tvm.vta_mapping.embedding import static_embedding
from alt_tvm.vta_mapping.polyhedral import batch_matmul_op, conv2d_op, dense_op, from_te
from alt_tvm.vta_mapping.select import rank

PAPER = Constraints(swap_operands=False)


def _sig(op):
    return ([(d.extent, d.kind) for d in op.dims],
            [(a.shape, [dict(e.coeffs) for e in a.index]) for a in (op.output, *op.inputs)])


@pytest.mark.parametrize("stride,dilation,groups", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 4), (2, 1, 8)])
def test_conv2d_from_te_matches_explicit(stride, dilation, groups):
    d = te.placeholder((2, 8, 10, 10), name="data", dtype="int8")
    w = te.placeholder((16, 8 // groups, 3, 3), name="weight", dtype="int8")
    t = from_te(ops.conv2d(d, w, stride=stride, padding=1, dilation=dilation, groups=groups, out_dtype="int32"))
    e = conv2d_op(n=2, c=8, h=10, w=10, k=16, r=3, s=3, pad_h=1, pad_w=1, stride_h=stride, stride_w=stride,
                  dilation_h=dilation, dilation_w=dilation, groups=groups)
    assert _sig(t) == _sig(e)
    assert t.static == e.static
    assert t.in_dtype == "int8" and t.acc_dtype == "int32"


def test_dense_and_batch_matmul_from_te():
    a, b = te.placeholder((4, 32), dtype="int8"), te.placeholder((16, 32), dtype="int8")
    assert _sig(from_te(ops.dense(a, b, out_dtype="int32"))) == _sig(dense_op(m=4, n=16, k=32))
    a, b = te.placeholder((2, 4, 32), dtype="int8"), te.placeholder((2, 32, 16), dtype="int8")
    t = from_te(ops.batch_matmul(a, b, out_dtype="int32"))
    assert _sig(t) == _sig(batch_matmul_op(b=2, m=4, n=16, k=32, transpose_b=False))


def test_bad_input_raises():
    with pytest.raises(ValueError, match="divisible by groups"):
        conv2d_op(n=1, c=6, h=8, w=8, k=8, r=3, s=3, groups=4)
    with pytest.raises(ValueError, match="block_in"):
        GemmShape(1, 16, 0)
    with pytest.raises(ValueError, match="max_solutions"):
        enumerate_embeddings(dense_op(m=1, n=4, k=4), max_solutions=0)


def test_dfg_shape():
    g = gemm_dfg(GemmShape(2, 4, 8))
    assert len(g.of_kind("mul")) == 64 and len(g.of_kind("A")) == 16 and len(g.of_kind("B")) == 32
    assert len(g.of_kind("add")) == 8
    assert sum(e.kind == "spatial" for e in g.edges) == 7  # star of the 8 add nodes


@pytest.mark.parametrize("layer", [
    dict(n=1, c=64, h=56, w=56, k=64, r=3, s=3, pad_h=1, pad_w=1),
    dict(n=1, c=128, h=28, w=28, k=256, r=1, s=1, stride_h=2, stride_w=2),
    dict(n=1, c=256, h=14, w=14, k=256, r=3, s=3, pad_h=1, pad_w=1),
])
def test_csp_finds_static_mapping(layer):
    op = conv2d_op(**layer)
    static = static_embedding(op, GemmShape()).key()
    for cons in (PAPER, Constraints(linear_access=False), Constraints(linear_access=False, padding=True,
                                                                       swap_operands=False)):
        res = enumerate_embeddings(op, constraints=cons)
        assert res.complete
        assert static in {e.key() for e in res.embeddings}
    # the paper's constraint set leaves exactly the reference
    assert [e.key() for e in enumerate_embeddings(op, constraints=PAPER).embeddings] == [static]


def test_dense_static_found():
    op = dense_op(m=1, n=64, k=128)
    keys = {e.key() for e in enumerate_embeddings(op).embeddings}
    assert static_embedding(op, GemmShape()).key() in keys


def test_constraints_prune_counts():
    """Counts of node assignments with and without hyper-rectangle / fixed origin (dense 1x4x4, GEMM 1x2x2)."""
    op, sh = dense_op(m=1, n=4, k=4), GemmShape(1, 2, 2)

    def count(**kw):
        res = enumerate_embeddings(op, shape=sh, constraints=Constraints(swap_operands=False, **kw))
        assert res.complete
        return len(res.embeddings)

    free = count(hyper_rectangle=False, fixed_origin=False)
    rect = count(fixed_origin=False)
    origin = count(hyper_rectangle=False)
    both = count()
    assert (free, rect, origin, both) == (144, 9, 9, 1)
    # non-dense rectangles: strides allowed, still pruned by the fixed origin
    assert count(dense=False, fixed_origin=False) > count(dense=False) > both


def test_conv_prune_counts_small():
    # Small enough that even the unconstrained enumeration completes (~8 s): exact counts.
    op = conv2d_op(n=1, c=2, h=3, w=3, k=2, r=2, s=1)
    sh = GemmShape(1, 2, 2)
    kw = dict(linear_access=False, swap_operands=False)
    free = enumerate_embeddings(op, shape=sh, constraints=Constraints(hyper_rectangle=False, fixed_origin=False,
                                                                      **kw))
    rect = enumerate_embeddings(op, shape=sh, constraints=Constraints(fixed_origin=False, **kw))
    both = enumerate_embeddings(op, shape=sh, constraints=Constraints(**kw))
    assert free.complete and rect.complete and both.complete
    assert (len(free.embeddings), len(rect.embeddings), len(both.embeddings)) == (192, 30, 2)


def test_all_different_matters():
    """Without injectivity, overlapping stencil matches (y<-w, z<-rw) appear."""
    op = conv2d_op(n=1, c=16, h=8, w=9, k=16, r=1, s=2)
    sh = GemmShape(1, 2, 2)
    with_ad = enumerate_embeddings(op, shape=sh, constraints=Constraints(linear_access=False)).embeddings
    without = enumerate_embeddings(op, shape=sh, constraints=Constraints(linear_access=False,
                                                                          all_different=False)).embeddings
    assert len(without) > len(with_ad)


def test_rank_prefers_less_padding_low_channel():
    op = conv2d_op(n=1, c=3, h=16, w=16, k=16, r=3, s=3, pad_h=1, pad_w=1)
    res = enumerate_embeddings(op, constraints=Constraints(linear_access=False, padding=True, swap_operands=False))
    ranked = rank(op, res.embeddings)
    static = static_embedding(op, GemmShape()).key()
    assert static in {c.embedding.key() for c in ranked}
    best = ranked[0]
    st = next(c for c in ranked if c.embedding.key() == static)
    assert best.mac_overhead < st.mac_overhead
    assert best.score <= st.score
    with pytest.raises(ValueError, match="weights"):
        rank(op, res.embeddings, weights=(1.0, -1.0))
