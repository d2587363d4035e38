"""Digests of the kernels a build emits, to show that a change of the code's shape leaves the
generated code as it was.

A model's digest is the sorted list of SHA-256 digests of its PrimFuncs' TVMScript, with each
function's own name replaced (names depend on emission order, not on the code). The target is
pinned (:data:`PINNED`), so the digests are the same on every machine.

    python tests/kernel_digests.py --models models/sweep/*.onnx --out tests/data/public_kernels.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from alt_tvm.target import HardwareTarget

KIB = 1024

# Two CPUs pinned whole (cores and caches too): every strategy rule reads these facts only.
PINNED = {
    isa: HardwareTarget(
        name=f"pinned-{isa}", description=f"pinned {mcpu} description for kernel digests",
        tvm_target={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu},
        num_cores=2, vector_bits=bits, vector_registers=regs, l1d_bytes=32 * KIB, l2_bytes=1024 * KIB,
        l3_bytes=32 * 1024 * KIB, cache_line_bytes=64)
    for isa, mcpu, bits, regs in (("avx2", "haswell", 256, 16), ("avx512", "skylake-avx512", 512, 32))
}


def kernel_digests(model: str | Path, *, isa: str) -> list[str]:
    """The sorted digests of the PrimFuncs that ``alt_tvm.build`` emits for ``model`` on the
    pinned ``isa`` description."""
    import tvm

    import alt_tvm

    built = alt_tvm.build(str(model), target=PINNED[isa])
    digests = []
    for gvar in built.mod.get_global_vars():
        func = built.mod[gvar]
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        text = re.sub(rf"\b{re.escape(gvar.name_hint)}\b", "KERNEL", func.script())
        digests.append(hashlib.sha256(text.encode()).hexdigest()[:16])
    return sorted(digests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", type=Path, required=True)
    parser.add_argument("--isa", choices=sorted(PINNED), default="avx512")
    parser.add_argument("--out", type=Path, required=True, help="JSON file, updated model by model")
    args = parser.parse_args(argv)
    table = json.loads(args.out.read_text()) if args.out.exists() else {}
    for path in args.models:
        key = f"{path.name}:{args.isa}"
        if key in table:
            continue
        try:
            table[key] = kernel_digests(path, isa=args.isa)
        except Exception as err:  # noqa: BLE001 - a model that does not build is recorded as such
            table[key] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(key, len(table[key]) if isinstance(table[key], list) else table[key], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
