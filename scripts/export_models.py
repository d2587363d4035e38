"""Export the reference models to ONNX (fixed batch) and check each one against PyTorch with ORT.

    python scripts/export_models.py [--out-dir models/] [--names resnet18 bert_tiny ...] [--batch 1]
                                    [--seed 0] [--opset 17] [--fold-batchnorm] [--no-check]

Writes ``<out-dir>/<name>.onnx`` for each model. Unless ``--no-check`` is given, every file is
run with ONNX Runtime on the model's seeded example inputs and compared with the PyTorch
module (rtol/atol 1e-4, BERT 1e-3); the exit status is 1 if any model does not match.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from alt_tvm.models import MODEL_NAMES, check_onnx, export_onnx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path("models"), help="folder for the .onnx files")
    parser.add_argument("--names", nargs="+", default=list(MODEL_NAMES), choices=MODEL_NAMES, metavar="NAME",
                        help=f"models to export (default: all of {', '.join(MODEL_NAMES)})")
    parser.add_argument("--batch", type=int, default=1, help="fixed batch size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and example inputs")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (>= 17)")
    parser.add_argument("--fold-batchnorm", action="store_true",
                        help="fold BatchNorm into Conv at export (default: keep it for the compiler to fold)")
    parser.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime vs PyTorch check")
    args = parser.parse_args(argv)

    failed = []
    for name in args.names:
        start = time.perf_counter()
        path = export_onnx(name, args.out_dir / f"{name}.onnx", batch=args.batch, seed=args.seed, opset=args.opset,
                           fold_batchnorm=args.fold_batchnorm)
        line = f"{name:<14} {path} ({path.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - start:.1f} s)"
        if not args.no_check:
            check = check_onnx(name, path, batch=args.batch, seed=args.seed)
            verdict = "ok" if check.ok else "MISMATCH"
            line += f"  ORT vs PyTorch max |err| {check.max_abs_error:.2e} (rtol/atol {check.rtol:g}): {verdict}"
            if not check.ok:
                failed.append(name)
        print(line, flush=True)
    if failed:
        print(f"ONNX Runtime does not match PyTorch for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
