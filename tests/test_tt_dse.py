"""TT design-space exploration (Anthimopoulos et al., §2, §4): formulas, pruning counts, Tables 1-2."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alt_tvm.strategies.tt.dse import (
    STAGES,
    DSEConfig,
    count,
    dense_flops,
    dense_params,
    einsum_flops,
    solutions,
    tt_flops,
    tt_params,
)

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- brute force


def _ordered_factorizations(x: int) -> list[tuple[int, ...]]:
    if x == 1:
        return [()]
    return [(f,) + rest for f in range(2, x + 1) if x % f == 0 for rest in _ordered_factorizations(x // f)]


def _chain_flops(ins, outs, ranks) -> list[int]:
    """FLOPs of Listing 1 by following the tensor sizes through the reshapes (t = d first)."""
    size, flops = math.prod(ins), [0] * len(ins)
    for t in reversed(range(len(ins))):
        b = size // (ins[t] * ranks[t + 1])  # reshape to (b, n_t, r_t)
        flops[t] = 2 * outs[t] * b * ranks[t] * ins[t] * ranks[t + 1]  # Listing 2 loop nest
        size = outs[t] * b * ranks[t]
    assert size == math.prod(outs)
    return flops


def _brute_force(n: int, m: int, config: DSEConfig) -> dict[str, int]:
    """Materialise every (shape, ranks) and filter it step by step."""
    pool = []
    for outs in _ordered_factorizations(m):
        for ins in _ordered_factorizations(n):
            d = len(ins)
            if d != len(outs) or d < 2:
                continue
            bounds = []
            for t in range(1, d):
                a = math.prod(outs[:t]) * math.prod(ins[:t])
                bounds.append(min(a, m * n // a))
            for mid in itertools.product(*(range(1, b + 1) for b in bounds)):
                pool.append((ins, outs, (1, *mid, 1)))
    counts = {"all": len(pool)}
    pool = [s for s in pool if list(s[1]) == sorted(s[1], reverse=True) and list(s[0]) == sorted(s[0])]
    counts["alignment"] = len(pool)
    pool = [s for s in pool if len(set(s[2][1:-1])) == 1 and s[2][1] % config.vl == 0]
    counts["vectorization"] = len(pool)
    fl = {s: _chain_flops(*s) for s in pool}
    pool = [s for s in pool if m + sum(fl[s]) < 2 * m * n + m and tt_params(*s) < m * n + m]
    counts["initial_layer"] = len(pool)
    pool = [s for s in pool if not (len(s[0]) > config.max_length and max(fl[s]) < config.min_heavy_flops)]
    counts["scalability"] = len(pool)
    return counts


SMALL = [(4, 4), (8, 12), (16, 16), (12, 36), (24, 18), (32, 16), (36, 24)]


@pytest.mark.parametrize("n,m", SMALL)
@pytest.mark.parametrize("vl", [1, 2, 4])
def test_counts_match_brute_force(n, m, vl):
    # A low heavy-einsum threshold and max_length 2 make the scalability step bite on tiny layers.
    cfg = DSEConfig(vl=vl, max_length=2, min_heavy_flops=200)
    assert count(n, m, config=cfg) == _brute_force(n, m, cfg)


@pytest.mark.parametrize("n,m", [(16, 16), (64, 48), (120, 84)])
def test_solutions_agree_with_counts(n, m):
    cfg = DSEConfig(vl=2, max_length=2, min_heavy_flops=500)
    c = count(n, m, config=cfg)
    for stage in STAGES[2:]:
        sols = solutions(n, m, config=cfg, stage=stage)
        assert len(sols) == c[stage]
        assert len(set(sols)) == len(sols)
    for s in sols:
        assert math.prod(s.in_factors) == n and math.prod(s.out_factors) == m
        assert s.ranks[0] == s.ranks[-1] == 1 and s.rank % cfg.vl == 0
        assert s.flops == tt_flops(s.in_factors, s.out_factors, s.ranks) < dense_flops(n, m)
        assert s.params == tt_params(s.in_factors, s.out_factors, s.ranks) < dense_params(n, m)
        assert not (s.d > 2 and max(s.einsum_flops) < 500)


def test_paper_example_lenet300():
    # §2: [N, M] = [784, 300], n = [2,2,2,7,14], m = [5,5,3,2,2], R = 10 (the cores listed there).
    ins, outs, ranks = (2, 2, 2, 7, 14), (5, 5, 3, 2, 2), (1, 10, 10, 10, 10, 1)
    cores = [1 * 2 * 5 * 10, 10 * 2 * 5 * 10, 10 * 2 * 3 * 10, 10 * 7 * 2 * 10, 10 * 14 * 2 * 1]
    assert tt_params(ins, outs, ranks) == 300 + sum(cores)
    assert list(einsum_flops(ins, outs, ranks)) == _chain_flops(ins, outs, ranks)
    assert tt_flops(ins, outs, ranks) == 300 + sum(_chain_flops(ins, outs, ranks))


def test_paper_memory_example_fig8():
    # §4.1: m = [10,10,5,2], n = [2,8,8,32], R = 8 -> memory 9352 (bias M = 1000 included).
    assert tt_params((2, 8, 8, 32), (10, 10, 5, 2), (1, 8, 8, 8, 1)) == 9352


# --------------------------------------------------------------------------- alignment


_factor_lists = st.lists(st.integers(2, 7), min_size=2, max_size=4)


@settings(max_examples=60, deadline=None)
@given(ins=_factor_lists, outs=_factor_lists, r=st.integers(1, 12))
def test_aligned_permutation_minimises_flops(ins, outs, r):
    d = min(len(ins), len(outs))
    ins, outs = ins[:d], outs[:d]
    ranks = (1,) + (r,) * (d - 1) + (1,)
    aligned = tt_flops(sorted(ins), sorted(outs, reverse=True), ranks)
    best = min(
        tt_flops(pi, po, ranks) for pi in set(itertools.permutations(ins)) for po in set(itertools.permutations(outs))
    )
    assert aligned == best


@settings(max_examples=30, deadline=None)
@given(ins=_factor_lists, outs=_factor_lists, r=st.integers(1, 12))
def test_chain_flops_equal_eq13(ins, outs, r):
    d = min(len(ins), len(outs))
    ranks = (1,) + (r,) * (d - 1) + (1,)
    assert list(einsum_flops(ins[:d], outs[:d], ranks)) == _chain_flops(ins[:d], outs[:d], ranks)


# --------------------------------------------------------------------------- Tables 1-2

# (N, M): paper's "all, alignment, vectorization, initial layer, scalability" (vl = 8).
# Extracted from Tables 1-2 of the seed; duplicate layers (same shape in several models) once.
TABLE_ROWS = {
    (400, 120): "9.5E+08 1.2E+07 1.0E+03 2.2E+02 2.2E+02",
    (120, 84): "5.4E+06 1.1E+05 3.3E+02 5.6E+01 5.6E+01",
    (784, 300): "1.2E+10 6.8E+07 2.4E+03 5.7E+02 5.6E+02",
    (300, 100): "1.1E+07 2.1E+05 4.5E+02 8.9E+01 8.9E+01",
    (4096, 2048): "5.4E+20 5.4E+19 9.1E+03 4.1E+03 3.1E+03",
    (2048, 2048): "1.3E+19 1.9E+18 6.2E+03 2.6E+03 2.0E+03",
    (2048, 100): "1.4E+08 2.5E+06 6.0E+02 1.1E+02 1.1E+02",
    (9216, 4096): "2.5E+25 3.5E+23 7.7E+04 3.9E+04 2.8E+04",
    (4096, 4096): "4.1E+22 6.6E+21 1.5E+04 6.5E+03 4.9E+03",
    (4096, 1000): "2.3E+14 6.5E+11 7.1E+03 2.2E+03 2.1E+03",
    (512, 512): "1.1E+13 1.8E+12 1.1E+03 3.8E+02 3.2E+02",
    # VGG [512, 256] prints 1.3E+02 (CIFAR10) and 1.9E+02 (CIFAR100) for the same layer; 1.9 is ours.
    (512, 256): "4.2E+11 5.0E+10 6.3E+02 2.1E+02 1.9E+02",
    (256, 100): "4.9E+06 1.7E+05 2.1E+02 4.1E+01 4.1E+01",
    (25088, 4096): "1.5E+26 2.8E+24 8.6E+04 3.6E+04 2.7E+04",
    (2048, 1000): "3.6E+13 1.5E+11 4.6E+03 1.5E+03 1.5E+03",
    (1024, 1000): "5.3E+12 3.5E+10 3.3E+03 1.0E+03 9.8E+02",
    (1024, 1024): "9.0E+15 1.6E+15 2.8E+03 1.0E+03 8.5E+02",
    (1024, 4096): "8.2E+18 5.6E+17 6.1E+03 2.4E+03 1.9E+03",
    (4096, 1024): "8.2E+18 5.6E+17 6.1E+03 2.4E+03 1.9E+03",
    (1024, 50257): "3.6E+04 1.7E+04 2.1E+03 1.0E+02 1.0E+02",
    (1280, 1280): "5.3E+16 2.5E+15 9.7E+03 3.6E+03 3.0E+03",
    (1280, 5120): "4.6E+19 9.5E+17 2.3E+04 9.2E+03 7.5E+03",
    (5120, 1280): "4.6E+19 9.5E+17 2.3E+04 9.2E+03 7.5E+03",
    (1280, 50257): "6.9E+04 3.2E+04 3.9E+03 1.7E+02 1.7E+02",
    (1600, 1600): "3.1E+16 4.1E+14 1.8E+04 6.1E+03 5.4E+03",
    (1600, 6400): "2.1E+19 1.1E+17 4.7E+04 1.7E+04 1.4E+04",
    (6400, 1600): "2.1E+19 1.1E+17 4.7E+04 1.7E+04 1.4E+04",
    (1600, 50257): "8.5E+04 3.9E+04 4.9E+03 2.2E+02 2.2E+02",
    (768, 768): "3.7E+15 5.9E+13 6.7E+03 2.7E+03 2.3E+03",
    (768, 3072): "2.4E+18 2.1E+16 1.6E+04 7.0E+03 5.6E+03",
    (3072, 768): "2.4E+18 2.1E+16 1.6E+04 7.0E+03 5.6E+03",
    (768, 50257): "5.4E+04 2.5E+04 3.1E+03 1.3E+02 1.3E+02",
    (2048, 8192): "2.4E+22 2.1E+21 1.4E+04 5.9E+03 4.4E+03",
    (8192, 2048): "2.4E+22 2.1E+21 1.4E+04 5.9E+03 4.4E+03",
    (2048, 50257): "5.0E+04 2.3E+04 2.9E+03 1.8E+02 1.8E+02",
    (12288, 12288): "4.9E+29 5.3E+27 2.5E+05 1.3E+05 1.3E+05",
    (12288, 49152): "4.9E+33 2.9E+31 5.1E+05 2.6E+05 2.6E+05",
    (49152, 12288): "4.9E+33 2.9E+31 5.1E+05 2.6E+05 2.6E+05",
    (12288, 50257): "2.7E+05 1.3E+05 1.2E+01 1.2E+01 1.2E+01",
}

# Columns (indices into STAGES) we do NOT reproduce, and why. Every other cell matches.
#  * Scalability on 6 large layers is off by one in the second digit (ours higher): the printed
#    column also applies the §4.2.3 thread-selection step, whose effect on counts is not specified;
#    with d > 5 instead of d > 4 these rows (and many matching ones) move further away.
#  * [12288, 49152]: vectorization 5.55E+05 vs 5.1E+05 (hence the later columns). All and
#    alignment match, so the shapes agree; the paper must cap R somewhere we cannot infer (a cap
#    of 3064, the largest rank of §4.1's benchmark, gives 4.3E+05, not 5.1E+05 either).
#  * [12288, 50257]: 50257 = 29 * 1733 leaves only d = 2 shapes; the rank bounds give 1.6E+04
#    vectorized solutions, the paper prints 12 (likely another rank cap or a typo).
MISMATCH = {
    (9216, 4096): {4},
    (4096, 4096): {4},
    (25088, 4096): {4},
    (1600, 6400): {4},
    (6400, 1600): {4},
    (2048, 8192): {4},
    (8192, 2048): {4},
    (12288, 12288): {4},
    (12288, 49152): {2, 3, 4},
    (49152, 12288): {2, 3, 4},
    (12288, 50257): {2, 3, 4},
}


def _sci2(x: int) -> str:
    """Two significant digits, half up, like the tables (565 -> 5.7E+02)."""
    d = Decimal(x)
    e = d.adjusted()
    q = (d / Decimal(10) ** e).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    if q >= 10:
        q, e = q / 10, e + 1
    return f"{q}E{e:+03d}"


# The two largest layers take ~0.3 s each; all rows together stay under ~3 s.
@pytest.mark.parametrize("shape", list(TABLE_ROWS), ids=[f"{n}x{m}" for n, m in TABLE_ROWS])
def test_paper_tables(shape):
    counts = count(*shape)
    ours = [_sci2(counts[k]) for k in STAGES]
    paper = TABLE_ROWS[shape].split()
    bad = MISMATCH.get(shape, set())
    for i, (a, b) in enumerate(zip(ours, paper)):
        if i in bad:
            assert a != b, f"{shape} {STAGES[i]} now matches the paper: update MISMATCH"
        else:
            assert a == b, f"{shape} {STAGES[i]}: ours {a}, paper {b}"


def test_scalability_rule_d5_differs():
    # The alternative reading (drop d > 5) misses rows that d > 4 reproduces.
    assert _sci2(count(784, 300, config=DSEConfig(max_length=5))["scalability"]) != "5.6E+02"
    assert _sci2(count(512, 512, config=DSEConfig(max_length=5))["scalability"]) != "3.2E+02"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "n,m,match",
    [(3, 16, "n=3"), (16, 2, "m=2"), (17, 16, "n=17"), (16, 13, "m=13"), (16, 16.0, "16.0")],
)
def test_bad_layer_raises(n, m, match):
    with pytest.raises(ValueError, match=match):
        count(n, m)
    with pytest.raises(ValueError, match=match):
        solutions(n, m)


@pytest.mark.parametrize("vl", [0, -8, True, 2.5])
def test_bad_vl_raises(vl):
    with pytest.raises(ValueError, match="vl"):
        DSEConfig(vl=vl)


def test_bad_stage_and_shapes_raise():
    with pytest.raises(ValueError, match="stage"):
        solutions(16, 16, stage="all")
    with pytest.raises(ValueError, match="ranks"):
        tt_params((2, 2), (2, 2), (1, 1))


# --------------------------------------------------------------------------- script


STEPS = ("all", "alignment", "vectorization", "initial_layer", "scalability")


def test_script_json_and_outputs(tmp_path):
    csv, png = tmp_path / "s.csv", tmp_path / "s.png"
    cmd = [sys.executable, str(ROOT / "scripts" / "tt_dse.py"), "--shape", "400", "120", "--json"]
    out = subprocess.run(cmd + ["--csv", str(csv), "--plot", str(png)], capture_output=True, text=True, check=True)
    obj = json.loads(out.stdout)
    assert {k: obj[k] for k in STEPS} == count(400, 120)
    assert len(obj["solutions"]) == obj["scalability"]
    assert csv.read_text().count("\n") == len(obj["solutions"]) + 1
    assert png.stat().st_size > 0
    out = subprocess.run(cmd + ["--count-only", "--vl", "16"], capture_output=True, text=True, check=True)
    obj = json.loads(out.stdout)
    assert obj["solutions"] == obj["scalability"] == count(400, 120, config=DSEConfig(vl=16))["scalability"]
    bad = subprocess.run(cmd[:-1] + ["--vl", "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "vl" in bad.stderr
