"""Whole models built with and without one knob of the conv template's untuned tiling, timed in one process.

Each model is built twice: as ``alt_tvm.build`` does, and with one field of
``DefaultConvTiling`` forced to a value in every untuned conv (e.g. ``prefetch_input=False``),
or only in its dense or depthwise convs (``--convs``). Both builds are checked against each
other, then timed in interleaved rounds; the paired median ratio is printed. With
``--both-orders`` the pair is built and timed again in the other order: on the 2-vCPU guest
the build made first in a process ran up to 10% faster (docs/cnn.md, seventeenth session), so
a ratio measured one way can be that bias.

``--per-kernel`` times the kernels instead of the whole models: each round profiles both
builds (the VM's per-kernel instrument), and the kernels the knob changed (their functions
differ between the builds) are summed apart from the rest. The rest is the same code in both
builds, so its ratio is the run's noise: a change is only read where that control stays near 1.
On the shared guest the unchanged kernels of two builds have run 12-18% apart in one process
(docs/cnn.md, nineteenth session), more than most knobs change.

    python scripts/ab_conv_knob.py --knob prefetch_input --value false --both-orders \\
        --models models/sweep/tv_resnet50.onnx models/sweep/tv_squeezenet1_1.onnx
    python scripts/ab_conv_knob.py --knob unroll_window --value true --convs depthwise --per-kernel \\
        --models models/sweep/tv_mnasnet1_0.onnx
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from typing import Any

import numpy as np
import tvm
import tvm_ffi

import alt_tvm
import alt_tvm.strategies.alt.conv as conv_strategy
from alt_tvm.deploy.model import use_runtime_threads
from alt_tvm.graph.baselines import run_interleaved, time_interleaved
from alt_tvm.strategies.alt.tiling import DefaultConvTiling, is_depthwise

#: Which untuned convs the knob is forced in.
CONV_KINDS = ("all", "dense", "depthwise")


def parse_value(text: str) -> Any:
    """``true``/``false``/an int/JSON, as the knob's field stores it."""
    return json.loads(text.lower() if text.lower() in ("true", "false") else text)


def build_pair(model: str, *, knob: str, value: Any, forced_first: bool, convs: str = "all") -> dict[str, Any]:
    """The default build and the one with ``knob`` forced in its ``convs`` (one of
    :data:`CONV_KINDS`), built in the given order."""
    fields = {f.name for f in dataclasses.fields(DefaultConvTiling)}
    if knob not in fields:
        raise ValueError(f"unknown knob {knob!r}: DefaultConvTiling has {sorted(fields)}")
    if convs not in CONV_KINDS:
        raise ValueError(f"convs must be one of {CONV_KINDS}, got {convs!r}")
    default_tiling = conv_strategy.default_conv_tiling

    def forced(out_shape: Any, in_per_group: int, out_per_group: int, **kwargs: Any) -> DefaultConvTiling:
        tiling = default_tiling(out_shape, in_per_group, out_per_group, **kwargs)
        if convs != "all" and is_depthwise(in_per_group, out_per_group) != (convs == "depthwise"):
            return tiling
        return dataclasses.replace(tiling, **{knob: value})

    builds = {}
    for name in (["forced", "default"] if forced_first else ["default", "forced"]):
        conv_strategy.default_conv_tiling = forced if name == "forced" else default_tiling
        try:
            builds[name] = alt_tvm.build(model)
        finally:
            conv_strategy.default_conv_tiling = default_tiling
    return builds


def checked_input(builds: dict[str, Any], *, seed: int) -> np.ndarray:
    """A seeded input on which the two builds agree (else AssertionError)."""
    x = np.random.default_rng(seed).standard_normal(builds["default"].input_shapes[0]).astype("float32")
    ref = builds["default"](x)[0]
    np.testing.assert_allclose(builds["forced"](x)[0], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    return x


def compare(builds: dict[str, Any], *, rounds: int, repeat: int, seed: int = 0) -> dict[str, float]:
    """Check the two builds agree, then time them interleaved: default / forced per round."""
    x = checked_input(builds, seed=seed)
    timed = time_interleaved({name: (b, [x]) for name, b in builds.items()}, rounds=rounds, repeat=repeat)
    ratios = np.array(timed["default"][1]) / np.array(timed["forced"][1])
    return {"default_ms": timed["default"][0], "forced_ms": timed["forced"][0],
            "default_over_forced": float(np.median(ratios)), "rounds_default_faster": int((ratios < 1).sum()),
            "rounds": len(ratios)}


def _functions(built: Any) -> dict[str, Any]:
    """The build's kernels by the symbol its profile names them with."""
    functions = {}
    for gvar, func in built.mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            symbol = func.attrs.get("global_symbol", gvar.name_hint) if func.attrs is not None else gvar.name_hint
            functions[str(symbol)] = func
    return functions


def changed_kernels(builds: dict[str, Any]) -> set[str]:
    """Kernels whose function differs between the two builds, or that only one of them has."""
    default, forced = _functions(builds["default"]), _functions(builds["forced"])
    return {name for name in default.keys() | forced.keys()
            if name not in default or name not in forced or not tvm_ffi.structural_equal(default[name], forced[name])}


def profile_pair(builds: dict[str, Any], x: np.ndarray, *, rounds: int, repeat: int
                 ) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """Profile the builds on ``x`` in interleaved rounds (a different one first each round):
    per build, each round's median run total and each kernel's median time (ms)."""
    names = list(builds)
    runs = run_interleaved(len(names), rounds=rounds, run=lambda i: builds[names[i]].profile(x, repeat=repeat))
    totals = {name: [float(np.median(p.totals_ms)) for p in profiles] for name, profiles in zip(names, runs)}
    kernels: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for name, profiles in zip(names, runs):
        for profile in profiles:
            for kernel in profile.times_ms:
                kernels[name].setdefault(kernel, []).append(profile.median(kernel))
    return totals, kernels


def summed_times(kernels: dict[str, list[float]], *, rounds: int, keep: Any) -> np.ndarray:
    """Per round, the summed time of the kernels ``keep(name)`` selects (one build's samples)."""
    return np.array([sum(samples[r] for kernel, samples in kernels.items() if keep(kernel)) for r in range(rounds)])


def summed_ratio(kernels: dict[str, dict[str, list[float]]], *, top: str, bottom: str, rounds: int,
                 keep: Any) -> float:
    """Median over rounds of the summed time of the kernels ``keep(name)`` selects in build
    ``top`` over build ``bottom`` (NaN when ``bottom`` has none of them)."""
    upper, lower = (summed_times(kernels[name], rounds=rounds, keep=keep) for name in (top, bottom))
    return float(np.median(upper / lower)) if lower.all() else float("nan")


def compare_kernels(builds: dict[str, Any], *, rounds: int, repeat: int, seed: int = 0) -> dict[str, Any]:
    """Check the two builds agree, then profile them in interleaved rounds: per round the summed
    time of the changed kernels and of the others (the control) in each build, default / forced."""
    x = checked_input(builds, seed=seed)
    changed = changed_kernels(builds)
    _, kernels = profile_pair(builds, x, rounds=rounds, repeat=repeat)
    parts = {"changed": lambda k: k in changed, "unchanged": lambda k: k not in changed}

    def median_ms(name: str, part: str) -> float:
        return float(np.median(summed_times(kernels[name], rounds=rounds, keep=parts[part])))

    def ratio(part: str) -> float:
        return summed_ratio(kernels, top="default", bottom="forced", rounds=rounds, keep=parts[part])

    return {"changed_kernels": len(changed), "rounds": rounds,
            "changed_default_ms": median_ms("default", "changed"), "changed_forced_ms": median_ms("forced", "changed"),
            "changed_default_over_forced": ratio("changed"),
            "unchanged_ms": median_ms("default", "unchanged"), "unchanged_default_over_forced": ratio("unchanged"),
            "kernels": {kernel: [float(np.median(kernels["default"].get(kernel, [0.0]))),
                                 float(np.median(kernels["forced"].get(kernel, [0.0])))] for kernel in sorted(changed)}}


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of an A/B of two builds per model: models, threads, rounds, orders, per kernel."""
    parser.add_argument("--models", nargs="+", required=True, help="ONNX files")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--both-orders", action="store_true", help="also build and time the pair the other way")
    parser.add_argument("--per-kernel", action="store_true",
                        help="time the changed kernels inside the models (the rest as the noise control)")


def time_pair(builds: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``builds`` timed as ``args`` (:func:`add_pair_arguments`) asks: per kernel or whole."""
    timing = compare_kernels if args.per_kernel else compare
    return timing(builds, rounds=args.rounds, repeat=args.repeat)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_arguments(parser)
    parser.add_argument("--knob", required=True, help="a DefaultConvTiling field, e.g. prefetch_input")
    parser.add_argument("--value", required=True, type=parse_value, help="the value forced, e.g. false")
    parser.add_argument("--convs", choices=CONV_KINDS, default="all", help="which untuned convs get the knob")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    use_runtime_threads(args.threads)
    for model in args.models:
        for forced_first in ([False, True] if args.both_orders else [False]):
            builds = build_pair(model, knob=args.knob, value=args.value, forced_first=forced_first, convs=args.convs)
            result = time_pair(builds, args)
            order = "forced built first" if forced_first else "default built first"
            print(json.dumps({"model": model, "knob": args.knob, "value": args.value, "convs": args.convs,
                              "order": order, **result}), flush=True)


if __name__ == "__main__":
    main()
