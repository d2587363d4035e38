"""The ``sconv`` build strategy: SConv direct convolution for ``relax.nn.conv2d`` partitions."""

from __future__ import annotations

from typing import Any

from alt_tvm.layout import Layout
from alt_tvm.strategies.base import OpInfo, Strategy, attrs_dict
from alt_tvm.strategies.registry import register_strategy

from .csa import ConvShape, analyze
from .kernel import SConvOptions, micro_kernel, schedule_sconv, sconv_geometry, sconv_te, sconv_weight_layout

__all__ = ["SConvStrategy"]


class SConvStrategy(Strategy):
    """SConv for ``relax.nn.conv2d`` (NCHW/OIHW, float32, constant weight, groups 1, no dilation).

    Priority 5, below ``alt`` (10): a build uses it only when selected, e.g.
    ``AltLayoutPass(strategies=["sconv"])``. No tuning: CSA decides the tiling. The output
    is NCHW, so neighbouring SConv partitions need no layout conversions.
    """

    name = "sconv"
    ops = ("relax.nn.conv2d",)
    priority = 5
    opt_in = True

    def applicable(self, info: OpInfo) -> str | None:
        attrs = info.attrs
        if attrs.get("data_layout", "NCHW") != "NCHW" or attrs.get("kernel_layout", "OIHW") != "OIHW":
            return f"layouts {attrs.get('data_layout')}/{attrs.get('kernel_layout')} (needs NCHW/OIHW)"
        if attrs.get("out_layout", "NCHW") not in ("NCHW", "", None):
            return f"out_layout {attrs.get('out_layout')} (needs NCHW)"
        if info.input_dtypes[0] != "float32" or info.output_dtype != "float32":
            return f"dtype {info.input_dtypes[0]} -> {info.output_dtype} (needs float32)"
        if int(attrs.get("groups", 1)) != 1:
            return f"groups={attrs.get('groups')} (needs 1)"
        if list(attrs.get("dilation", [1, 1])) != [1, 1]:
            return f"dilation {attrs.get('dilation')} (needs 1)"
        if 1 not in info.constants:
            return "weight is not a constant"
        return None

    def implement(self, anchor: Any, context: Any) -> Any:
        call = anchor.value
        attrs = attrs_dict(call.attrs)
        data = context.te_input(call.args[0], "data")
        weight = context.te_input(call.args[1], "weight")
        strides = [int(x) for x in attrs.get("strides", [1, 1])]
        pads = [int(x) for x in attrs.get("padding", [0, 0, 0, 0])]
        if len(pads) == 2:
            pads = pads * 2
        n, c, h, w = (int(x) for x in data.shape)
        k, _, r, s = (int(x) for x in weight.shape)
        shape = ConvShape(n, c, h, w, k, r, s, strides[0], strides[1], pads[0], pads[1], pads[2], pads[3])
        machine = context.target
        plan = analyze(shape, machine, micro=micro_kernel(shape, machine, SConvOptions()))
        geometry = sconv_geometry(plan)
        out = sconv_te(data, weight, geometry)
        stages = context.epilogue_te(out)
        final = stages[-1] if stages else out
        context.require_layout(data, Layout((n, c, h, w)))  # read NCHW directly
        options = SConvOptions(threads=machine.num_cores)
        return context.finish(
            output=final, layouts={weight: sconv_weight_layout(geometry)}, strategy=self.name,
            schedule=lambda f: schedule_sconv(f, geometry, final=final.op.name,
                                              inline=tuple(st.op.name for st in stages[:-1]), options=options,
                                              lanes=machine.vector_lanes("float32")))


register_strategy(SConvStrategy())
