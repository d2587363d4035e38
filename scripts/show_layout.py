"""Print the TIR of the ALT paper's Fig. 3: a conv2d whose output is tiled 2x2 in space
(with the input unfolded into overlapping tiles) and whose output channels are split by o_t.

    python scripts/show_layout.py [--size 8] [--channels 4] [--out-channels 16] [--ot 4]
"""

from __future__ import annotations

import argparse

from alt_tvm.layout.examples import fig3_prim_func


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=8, help="output height and width (even)")
    parser.add_argument("--channels", type=int, default=4, help="input channels I")
    parser.add_argument("--out-channels", type=int, default=16, help="output channels O")
    parser.add_argument("--ot", type=int, default=4, help="output-channel tile o_t")
    args = parser.parse_args()
    func, layouts = fig3_prim_func(size=args.size, channels=args.channels, out_channels=args.out_channels, ot=args.ot)
    for tensor, layout in layouts.items():
        print(f"# {tensor.op.name}: {layout}\n#   shape {layout.orig_shape} -> {layout.shape}")
    print(func.script())


if __name__ == "__main__":
    main()
