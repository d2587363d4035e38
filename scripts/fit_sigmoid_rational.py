"""Fit the rational sigmoid of ``alt_tvm.ops.elementwise`` and check it in float32.

``sigmoid(x) - 1/2 = tanh(x / 2) / 2`` is odd, so it is fitted as ``x A(x^2) / B(x^2)`` on
``[0, bound]`` with ``B(0) = 1``, minimising the largest relative error: a linearised
weighted least-squares problem solved repeatedly, each pass dividing by the last
denominator (Loeb) and scaling each point's weight by its error (Lawson). The variable is
``x^2 / bound^2`` during the fit, so the columns stay of one size.

The float32 check evaluates ``A`` and ``B`` by Horner's rule with fused multiply-adds (one
float32 rounding each, emulated in float64), the result clamped to 1/2 as the kernels do,
over every normal float32 in ``[0, clamp]`` (about 1.1e9 numbers; ``--stride`` takes every
k-th). Past the fit's bound the rational grows beyond 1/2; the input clamp is placed where
it has passed 1/2 by a few ulps, so every larger input gives exactly 1.

    python scripts/fit_sigmoid_rational.py                     # fit, then check every float
    python scripts/fit_sigmoid_rational.py --stride 64 --terms 5 5
"""

from __future__ import annotations

import argparse

import numpy as np


def fit(*, bound: float, terms: tuple[int, int], passes: int = 60) -> tuple[np.ndarray, np.ndarray, float]:
    """Coefficients of ``A`` and ``B`` in powers of ``x^2`` (lowest first) and the fit's largest
    relative error in float64 on a dense grid of ``(0, bound]``."""
    x = np.sort(np.concatenate([np.linspace(1e-4, bound, 40000), np.geomspace(1e-6, 1e-4, 50)]))
    g = 0.5 * np.tanh(x / 2)
    t = (x / bound) ** 2
    na, nb = terms
    weight, previous = np.ones_like(x), np.ones_like(x)
    best = (np.inf, None, None)
    for _ in range(passes):
        columns = [x * t**k for k in range(na)] + [-g * t**k for k in range(1, nb)]
        scale = np.sqrt(weight) / (g * previous)
        solution, *_ = np.linalg.lstsq(np.stack(columns, 1) * scale[:, None], g * scale, rcond=None)
        a, b = solution[:na], np.concatenate([[1.0], solution[na:]])
        numerator, previous = np.polyval(a[::-1], t), np.polyval(b[::-1], t)
        error = np.abs(x * numerator / previous - g) / g
        if error.max() < best[0]:
            best = (error.max(), a / bound ** (2 * np.arange(na)), b / bound ** (2 * np.arange(nb)))
        weight = weight * error
        weight /= weight.mean()
    return best[1], best[2], float(best[0])


def _fma(a: np.ndarray, b: np.ndarray, c: np.float32) -> np.ndarray:
    return (a.astype(np.float64) * b + c).astype(np.float32)


def centred_sigmoid_f32(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x A(x^2) / B(x^2)`` as the vector code computes it (float32, fused multiply-adds)."""
    x2 = (x * x).astype(np.float32)
    p, q = np.full_like(x, np.float32(a[-1])), np.full_like(x, np.float32(b[-1]))
    for coef in a[-2::-1]:
        p = _fma(p, x2, np.float32(coef))
    for coef in b[-2::-1]:
        q = _fma(q, x2, np.float32(coef))
    return ((x * p).astype(np.float32) / q).astype(np.float32)


def check(*, a: np.ndarray, b: np.ndarray, clamp: float, stride: int) -> dict[str, float]:
    """Largest float32 errors of ``1/2 + min(x A(x^2) / B(x^2), 1/2)`` over every ``stride``-th
    normal float32 in ``[0, clamp]``, and how far the rational passes 1/2 at ``clamp`` (above
    0: every input past the clamp gives exactly 1)."""
    first, last = int(np.finfo(np.float32).tiny.view(np.int32)), int(np.float32(clamp).view(np.int32))
    worst = {"relative": 0.0, "sigmoid_ulps": 0.0}
    for start in range(first, last + 1, stride << 22):
        x = np.arange(start, min(start + (stride << 22), last + 1), stride, dtype=np.int32).view(np.float32)
        g = np.minimum(centred_sigmoid_f32(x, a, b), np.float32(0.5))
        exact = 0.5 * np.tanh(x.astype(np.float64) / 2)
        sigmoid, exact_sigmoid = (g + np.float32(0.5)).astype(np.float32), (0.5 + exact).astype(np.float32)
        worst["relative"] = max(worst["relative"], float((np.abs(g - exact) / exact).max()))
        worst["sigmoid_ulps"] = max(worst["sigmoid_ulps"],
                                    float((np.abs(sigmoid - exact_sigmoid) / np.spacing(exact_sigmoid)).max()))
    worst["past_half_at_clamp"] = float(centred_sigmoid_f32(np.float32([clamp]), a, b)[0]) - 0.5
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bound", type=float, default=18.0, help="fit on [0, bound]")
    parser.add_argument("--clamp", type=float, default=19.0, help="check on [0, clamp], where the input is clamped")
    parser.add_argument("--terms", type=int, nargs=2, default=(5, 5), metavar=("A", "B"),
                        help="coefficients in the numerator and the denominator")
    parser.add_argument("--stride", type=int, default=1, help="check every k-th float32 (1: all of them)")
    args = parser.parse_args()
    if args.stride < 1 or min(args.terms) < 1 or not 0 < args.bound <= args.clamp:
        parser.error(f"need --stride >= 1 (got {args.stride}), --terms of at least 1 (got {args.terms}) and "
                     f"0 < --bound <= --clamp (got {args.bound} and {args.clamp})")
    a, b, error = fit(bound=args.bound, terms=tuple(args.terms))
    print(f"fit: largest relative error {error:.3g} (float64)")
    print("numerator  ", ", ".join(repr(float(c)) for c in a))
    print("denominator", ", ".join(repr(float(c)) for c in b))
    for key, value in check(a=a, b=b, clamp=args.clamp, stride=args.stride).items():
        print(f"float32 {key}: {value:.4g}")


if __name__ == "__main__":
    main()
