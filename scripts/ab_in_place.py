"""Whole models built with and without in-place kernels (alt_tvm.graph.inplace), timed in one process.

Each model is built twice: as ``alt_tvm.build`` does ("default": a kernel that is the last
use of a same-shaped operand read element by element writes its output over it) and with
that rewrite off ("forced"). The two builds are checked against each other and timed as
``scripts/ab_conv_knob.py`` times a knob: whole models or, with ``--per-kernel``, the
kernels the rewrite changed against the rest as the noise control. An in-place kernel keeps
its name, so the two builds' profiles pair kernel by kernel. A ratio below 1 means the
in-place build is faster.

    python scripts/ab_in_place.py --per-kernel --both-orders --models models/sweep/tv_resnet50.onnx
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
from alt_tvm.deploy.model import use_runtime_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ab_conv_knob, beside this script
import ab_conv_knob  # noqa: E402


def build_pair(model: str, *, forced_first: bool) -> dict[str, Any]:
    """The default build and the one without in-place kernels, built in the given order."""
    rewrite = graph_build.write_in_place
    builds = {}
    for name in (["forced", "default"] if forced_first else ["default", "forced"]):
        graph_build.write_in_place = rewrite if name == "default" else (lambda mod, *, attr: (mod, 0))
        try:
            builds[name] = alt_tvm.build(model)
        finally:
            graph_build.write_in_place = rewrite
    if builds["default"].report.in_place == 0:
        raise ValueError(f"{model}: no kernel of the default build writes in place; nothing to compare")
    return {"default": builds["default"], "forced": builds["forced"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ab_conv_knob.add_pair_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    use_runtime_threads(args.threads)
    for model in args.models:
        for forced_first in ([False, True] if args.both_orders else [False]):
            builds = build_pair(model, forced_first=forced_first)
            result = ab_conv_knob.time_pair(builds, args)
            order = "without built first" if forced_first else "in-place built first"
            print(json.dumps({"model": model, "in_place_calls": builds["default"].report.in_place, "order": order,
                              **result}), flush=True)


if __name__ == "__main__":
    main()
