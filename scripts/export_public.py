"""Export public architecture definitions to ONNX (:mod:`alt_tvm.models.public` says which, how
they are built and with which exporter), for checks on models this project did not write.

    python scripts/export_public.py [--out-dir models/public] [--names hf_resnet50 ...] [--kind cnn]
                                    [--exporter dynamo] [--torchvision-src DIR]

``--names`` takes model names and group names (:data:`GROUPS`, e.g. ``cnn_suite``: the
torchvision CNN suite); ``--kind`` keeps the models of one kind. Where no torchvision
wheel matches the installed torch, ``--torchvision-src DIR`` loads its pure-Python model
definitions from an unpacked wheel's ``torchvision`` folder (see :func:`use_torchvision_source`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from alt_tvm.models.public import EXPORTERS, GROUPS, KINDS, export, select_or_exit, use_torchvision_source


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path("models") / "public")
    parser.add_argument("--names", nargs="+", default=None,
                        help=f"models or groups ({', '.join(sorted(GROUPS))}); default: all")
    parser.add_argument("--kind", choices=KINDS, default=None, help="only the models of this kind")
    parser.add_argument("--exporter", choices=EXPORTERS, default="torchscript")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torchvision-src", type=Path, default=None,
                        help="a torchvision package folder to take model definitions from (see above)")
    args = parser.parse_args(argv)
    names = select_or_exit(parser, args.names, args.kind)
    if args.names is None:
        names.sort()
    if args.torchvision_src is not None:
        names.sort(key=lambda name: name.startswith("tv_"))  # transformers models before the stand-in
    for name in names:
        if args.torchvision_src is not None and name.startswith("tv_") and "torchvision" not in sys.modules:
            use_torchvision_source(args.torchvision_src)
        started = time.perf_counter()
        path = export(name, args.out_dir, exporter=args.exporter, seed=args.seed)
        print(f"{name:24s} {path} ({path.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
