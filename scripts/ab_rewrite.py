"""Whole models built with and without one of alt-tvm's rewrites or schedule steps, timed in one process.

Each model is built twice: as ``alt_tvm.build`` does ("default") and with one rewrite turned
off ("forced"). The rewrites:

- ``in-place`` (:mod:`alt_tvm.graph.inplace`): a kernel that is the last use of a same-shaped
  operand read element by element writes its output over it.
- ``padded-operands`` (``strategies.base._pad_constants``): a constant that broadcasts along a
  padded dimension of its kernel's output (a per-channel bias of 104 channels stored in 7
  vectors of 16) is padded as well, so the epilogue reads it in bounds, unguarded.

- ``vector-pad`` (``strategies.alt.conv._schedule_whole_pad``): a conv's pad stage copied whole
  before it is vectorized over its channel tile (an image's excepted).

The two builds are checked against each other and timed as ``scripts/ab_conv_knob.py`` times
a knob: whole models or, with ``--per-kernel``, the kernels the rewrite changed against the
rest as the noise control. A rewritten kernel keeps its name, so the two builds' profiles pair
kernel by kernel. A ratio below 1 means the default build (rewrite on) is faster.

    python scripts/ab_rewrite.py --rewrite in-place --per-kernel --both-orders \\
        --models models/sweep/tv_resnet50.onnx
    python scripts/ab_rewrite.py --rewrite padded-operands --per-kernel --both-orders \\
        --models models/sweep/tv_mobilenet_v3_large.onnx
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import alt_tvm
import alt_tvm.graph.build as graph_build
import alt_tvm.strategies.alt.conv as conv_strategy
import alt_tvm.strategies.base as strategy_base
from alt_tvm.deploy.model import use_runtime_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ab_conv_knob, beside this script
import ab_conv_knob  # noqa: E402


class NothingToCompare(ValueError):
    """The rewrite leaves every kernel of the model as it was."""


_whole_pad = conv_strategy._schedule_whole_pad

#: rewrite name -> (module, the function that performs it, a stand-in without the rewrite)
REWRITES = {
    "in-place": (graph_build, "write_in_place", lambda mod, **_: (mod, 0, {})),
    "padded-operands": (strategy_base, "_pad_constants", lambda placeholders, layouts, output: None),
    "vector-pad": (conv_strategy, "_schedule_whole_pad",
                   lambda sch, source, *, lanes: _whole_pad(sch, source, lanes=False)),
}


def build_pair(model: str, *, rewrite: str, forced_first: bool) -> dict[str, Any]:
    """The default build and the one without ``rewrite`` (a key of :data:`REWRITES`), built in
    the given order. Raises :class:`NothingToCompare` when it changes no kernel of ``model``."""
    if rewrite not in REWRITES:
        raise ValueError(f"unknown rewrite {rewrite!r}; known: {sorted(REWRITES)}")
    module, attribute, off = REWRITES[rewrite]
    original = getattr(module, attribute)
    builds = {}
    for name in (["forced", "default"] if forced_first else ["default", "forced"]):
        setattr(module, attribute, original if name == "default" else off)
        try:
            builds[name] = alt_tvm.build(model)
        finally:
            setattr(module, attribute, original)
    if not ab_conv_knob.changed_kernels(builds):
        raise NothingToCompare(f"{model}: the {rewrite} rewrite changes no kernel; nothing to compare")
    return builds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ab_conv_knob.add_pair_arguments(parser)
    parser.add_argument("--rewrite", required=True, choices=sorted(REWRITES), help="the rewrite turned off")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    use_runtime_threads(args.threads)
    for model in args.models:
        for forced_first in ([False, True] if args.both_orders else [False]):
            try:
                builds = build_pair(model, rewrite=args.rewrite, forced_first=forced_first)
            except NothingToCompare as err:
                print(json.dumps({"model": model, "rewrite": args.rewrite, "skipped": str(err)}), flush=True)
                break
            result = ab_conv_knob.time_pair(builds, args)
            order = "without built first" if forced_first else "default built first"
            print(json.dumps({"model": model, "rewrite": args.rewrite, "order": order,
                              "in_place_calls": builds["default"].report.in_place, **result}), flush=True)


if __name__ == "__main__":
    main()
