"""Map one conv2d layer onto the VTA GEMM intrinsic: ranked embeddings, the choice, and the simulator's
cycles / bytes against TVM's old static template.

Example: python scripts/vta_map.py --c 3 --h 56 --w 56 --k 64 --r 3 --s 3 --pad 1 --stride 2
"""

from __future__ import annotations

import argparse

import numpy as np

from alt_tvm.strategies.vta.gemm import DEFAULT_CONSTRAINTS, vta_conv2d
from alt_tvm.vta_mapping.csp import Constraints, enumerate_embeddings
from alt_tvm.vta_mapping.dfg import GemmShape
from alt_tvm.vta_mapping.embedding import static_embedding
from alt_tvm.vta_mapping.polyhedral import conv2d_op
from alt_tvm.vta_mapping.rewrite import layout_rewrites
from alt_tvm.vta_mapping.select import rank
from alt_tvm.vta_mapping.sim import VTAConfig
from alt_tvm.vta_mapping.tir import conv2d_tir, intrinsic_calls, register_numpy_gemm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, d in dict(n=1, c=64, h=56, w=56, k=64, r=3, s=3, pad=1, stride=1, dilation=1, groups=1).items():
        ap.add_argument(f"--{k}", type=int, default=d)
    ap.add_argument("--gemm", default="1,16,16", help="BATCH,BLOCK_OUT,BLOCK_IN")
    ap.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--swap", action="store_true", help="also try the weight as operand A (slower)")
    ap.add_argument("--weights", default="1,1", help="candidate-selection weights MAC,data")
    ap.add_argument("--tir", action="store_true",
                    help="also emit the tensorized TIR, build it for llvm with a NumPy GEMM block and check it "
                         "(one Python call per GEMM call: small layers only)")
    a = ap.parse_args()
    gemm = GemmShape(*[int(v) for v in a.gemm.split(",")])
    wts = tuple(float(v) for v in a.weights.split(","))
    cfg = VTAConfig(gemm=gemm)
    op = conv2d_op(n=a.n, c=a.c, h=a.h, w=a.w, k=a.k, r=a.r, s=a.s, pad_h=a.pad, pad_w=a.pad, stride_h=a.stride,
                   stride_w=a.stride, dilation_h=a.dilation, dilation_w=a.dilation, groups=a.groups)
    print(op.describe())
    cons = Constraints(**{**DEFAULT_CONSTRAINTS.__dict__, "swap_operands": a.swap})
    res = enumerate_embeddings(op, shape=gemm, constraints=cons)
    ranked = rank(op, res.embeddings, weights=wts)
    print(f"\n{len(res.embeddings)} embeddings ({'complete' if res.complete else 'truncated'}) in {res.seconds:.2f} s; "
          f"top {min(a.top, len(ranked))} by w={wts}:")
    print(f"{'#':>3} {'score':>12} {'MAC ovh':>12} {'data ovh':>10}  embedding")
    for i, c in enumerate(ranked[: a.top]):
        print(f"{i:>3} {c.score:>12.0f} {c.mac_overhead:>12} {c.data_overhead:>10}  {c.embedding}")
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (a.n, a.c, a.h, a.w), dtype=np.int8)
    if a.layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    wt = rng.integers(-128, 128, (a.k, a.c // a.groups, a.r, a.s), dtype=np.int8)
    kw = dict(stride=a.stride, padding=a.pad, dilation=a.dilation, groups=a.groups, data_layout=a.layout,
              config=cfg, weights=wts)
    csp = vta_conv2d(x, wt, strategy="csp", constraints=cons, **kw)
    ref = vta_conv2d(x, wt, strategy="static", **kw)
    same = np.array_equal(csp.output, ref.output)
    print(f"\nchosen:  {csp.embedding}\n  rewrites: {'; '.join(layout_rewrites(op, csp.embedding))}")
    print(f"static:  {static_embedding(op, gemm)}")
    print(f"\n{'strategy':<8} {'cycles':>12} {'bytes moved':>12} {'MACs':>12} {'packed elems':>12} {'pack ms':>8}")
    for name, r in (("csp", csp), ("static", ref)):
        print(f"{name:<8} {r.stats.cycles:>12} {r.stats.bytes_moved:>12} {r.mac_total:>12} {r.data_total:>12} "
              f"{r.pack_seconds * 1e3:>8.2f}")
    print(f"speed-up (cycles) {ref.stats.cycles / csp.stats.cycles:.2f}x; results identical: {same}")
    if a.tir:
        counter = register_numpy_gemm()
        out, kern = conv2d_tir(data=x, weight=wt, embedding=csp.embedding, stride=(a.stride, a.stride),
                               padding=(a.pad, a.pad), dilation=(a.dilation, a.dilation), groups=a.groups,
                               data_layout=a.layout, gemm=gemm)
        print(f"\nTIR: intrinsic {kern.intrin}, {intrinsic_calls(kern.func)} call site(s), executed "
              f"{counter['calls']} times ({kern.plan.calls} GEMM calls); packed A/B/C {kern.shapes['A']} "
              f"{kern.shapes['B']} {kern.shapes['C']}; equals the simulator: {np.array_equal(out, csp.output)}")


if __name__ == "__main__":
    main()
