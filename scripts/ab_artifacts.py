"""Two exported builds of each model (two commits, two build options) profiled in one process.

A change to the code cannot be A/B-tested inside one build process the way a knob can
(``scripts/ab_conv_knob.py``, ``scripts/ab_rewrite.py``): the two versions are separate
packages. Export the models with each version (``alt-tvm build MODEL -o DIR/NAME`` or
``CompiledModel.export``), then this script loads both artifacts of each model into one
process, checks they agree, and profiles them in interleaved rounds (the other version first
every other round). It prints, per model, the paired median ratio of the runs' totals
(``b / a``: below 1, ``b`` is faster) and every kernel's median time in each. Kernels are
paired by name, so it reads best when the two versions name their kernels alike.

Two artifacts of the same code loaded into one process do not run alike: two identical
MobileNet-V2 builds ran 0.90x apart, in 14 of 15 rounds, on the 2-vCPU guest. So the kernels
whose code is the same in both (same name and TIR digest, ``KernelInfo.digest``) are summed
apart from the changed ones: their ratio is the run's noise control, and a change is read
only where the changed kernels move beyond it.

    alt-tvm build models/sweep/tv_regnet_y_400mf.onnx -o /tmp/a/tv_regnet_y_400mf   # old code
    alt-tvm build models/sweep/tv_regnet_y_400mf.onnx -o /tmp/b/tv_regnet_y_400mf   # new code
    python scripts/ab_artifacts.py --a /tmp/a --b /tmp/b --names tv_regnet_y_400mf
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

import alt_tvm
from alt_tvm.deploy.model import use_runtime_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ab_conv_knob, beside this script
import ab_conv_knob  # noqa: E402


def compare(models: dict[str, Any], *, rounds: int, repeat: int, seed: int = 0) -> dict[str, Any]:
    """``models`` (``{"a": ..., "b": ...}``, loaded artifacts of one model) checked against each
    other on a seeded input, then profiled in interleaved rounds."""
    names = list(models)
    if names != ["a", "b"]:
        raise ValueError(f"compare takes the two versions as 'a' and 'b', got {names}")
    shapes = [tuple(m.input_shapes[0]) for m in models.values()]
    if shapes[0] != shapes[1]:
        raise ValueError(f"the two artifacts take different inputs: {shapes[0]} and {shapes[1]}")
    x = np.random.default_rng(seed).standard_normal(shapes[0]).astype("float32")
    ref = models["a"](x)[0]
    np.testing.assert_allclose(models["b"](x)[0], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    for model in models.values():  # the first runs after loading are slower (page faults, a cold pool)
        model.profile(x, repeat=2)
    totals, kernels = ab_conv_knob.profile_pair(models, x, rounds=rounds, repeat=repeat)
    ratios = np.array(totals["b"]) / np.array(totals["a"])
    changed = changed_kernels(models)
    parts = {} if changed is None else {
        f"{part}_b_over_a": ab_conv_knob.summed_ratio(kernels, top="b", bottom="a", rounds=rounds,
                                                       keep=lambda k, wanted=wanted: (k in changed) == wanted)
        for part, wanted in (("changed", True), ("unchanged", False))}
    return {"a_ms": statistics.median(totals["a"]), "b_ms": statistics.median(totals["b"]),
            "b_over_a": float(np.median(ratios)), "rounds_b_faster": int((ratios < 1).sum()), "rounds": rounds,
            "changed_kernels": sorted(changed) if changed is not None else None, **parts,
            "kernels": {kernel: [statistics.median(kernels["a"].get(kernel, [0.0])),
                                 statistics.median(kernels["b"].get(kernel, [0.0]))]
                        for kernel in sorted(kernels["a"].keys() | kernels["b"].keys())}}


def changed_kernels(models: dict[str, Any]) -> set[str] | None:
    """Kernels whose code differs between the two artifacts (or that one lacks), by their TIR
    digests; None when an artifact records no digests (written before they were)."""
    a, b = (models[name].kernel_info() for name in ("a", "b"))
    if not all(info.digest for info in [*a.values(), *b.values()]):
        return None
    return {name for name in a.keys() | b.keys() if name not in a or name not in b or a[name].digest != b[name].digest}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, type=Path, help="directory of the first version's artifacts")
    parser.add_argument("--b", required=True, type=Path, help="directory of the second version's artifacts")
    parser.add_argument("--names", nargs="+", required=True, help="artifact names present in both directories")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    use_runtime_threads(args.threads)
    for name in args.names:
        models = {"a": alt_tvm.load(args.a / name), "b": alt_tvm.load(args.b / name)}
        print(json.dumps({"model": name, **compare(models, rounds=args.rounds, repeat=args.repeat)}), flush=True)


if __name__ == "__main__":
    main()
