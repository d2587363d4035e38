"""Whole models built with and without one knob of the conv template's untuned tiling, timed in one process.

Each model is built twice: as ``alt_tvm.build`` does, and with one field of
``DefaultConvTiling`` forced to a value in every untuned conv (e.g. ``prefetch_input=False``).
Both builds are checked against each other, then timed in interleaved rounds; the paired
median ratio is printed. With ``--both-orders`` the pair is built and timed again in the
other order: on the 2-vCPU guest the build made first in a process ran up to 10% faster
(docs/cnn.md, seventeenth session), so a ratio measured one way can be that bias.

    python scripts/ab_conv_knob.py --knob prefetch_input --value false --both-orders \\
        --models models/sweep/tv_resnet50.onnx models/sweep/tv_squeezenet1_1.onnx
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from typing import Any

import numpy as np

import alt_tvm
import alt_tvm.strategies.alt.conv as conv_strategy
from alt_tvm.deploy.model import use_runtime_threads
from alt_tvm.graph.baselines import time_interleaved
from alt_tvm.strategies.alt.tiling import DefaultConvTiling


def parse_value(text: str) -> Any:
    """``true``/``false``/an int/JSON, as the knob's field stores it."""
    return json.loads(text.lower() if text.lower() in ("true", "false") else text)


def build_pair(model: str, *, knob: str, value: Any, forced_first: bool) -> dict[str, Any]:
    """The default build and the one with ``knob`` forced, built in the given order."""
    fields = {f.name for f in dataclasses.fields(DefaultConvTiling)}
    if knob not in fields:
        raise ValueError(f"unknown knob {knob!r}: DefaultConvTiling has {sorted(fields)}")
    default_tiling = conv_strategy.default_conv_tiling

    def forced(*args: Any, **kwargs: Any) -> DefaultConvTiling:
        return dataclasses.replace(default_tiling(*args, **kwargs), **{knob: value})

    builds = {}
    for name in (["forced", "default"] if forced_first else ["default", "forced"]):
        conv_strategy.default_conv_tiling = forced if name == "forced" else default_tiling
        try:
            builds[name] = alt_tvm.build(model)
        finally:
            conv_strategy.default_conv_tiling = default_tiling
    return builds


def compare(builds: dict[str, Any], *, rounds: int, repeat: int, seed: int = 0) -> dict[str, float]:
    """Check the two builds agree, then time them interleaved: default / forced per round."""
    x = np.random.default_rng(seed).standard_normal(builds["default"].input_shapes[0]).astype("float32")
    ref = builds["default"](x)[0]
    np.testing.assert_allclose(builds["forced"](x)[0], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    timed = time_interleaved({name: (b, [x]) for name, b in builds.items()}, rounds=rounds, repeat=repeat)
    ratios = np.array(timed["default"][1]) / np.array(timed["forced"][1])
    return {"default_ms": timed["default"][0], "forced_ms": timed["forced"][0],
            "default_over_forced": float(np.median(ratios)), "rounds_default_faster": int((ratios < 1).sum()),
            "rounds": len(ratios)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", required=True, help="ONNX files")
    parser.add_argument("--knob", required=True, help="a DefaultConvTiling field, e.g. prefetch_input")
    parser.add_argument("--value", required=True, type=parse_value, help="the value forced, e.g. false")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--both-orders", action="store_true", help="also build and time the pair the other way")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    use_runtime_threads(args.threads)
    for model in args.models:
        for forced_first in ([False, True] if args.both_orders else [False]):
            builds = build_pair(model, knob=args.knob, value=args.value, forced_first=forced_first)
            result = compare(builds, rounds=args.rounds, repeat=args.repeat)
            order = "forced built first" if forced_first else "default built first"
            print(json.dumps({"model": model, "knob": args.knob, "value": args.value, "order": order, **result}),
                  flush=True)


if __name__ == "__main__":
    main()
