"""The ALT paper's layout case study on one conv2d (§7.3.3: the first layer of ResNet-18).

Pad -> conv2d -> bias -> ReLU described in TE (:func:`conv2d_graph`), its tensors' layouts for a
layout *kind* (:func:`conv2d_layouts`: NCHW, NHWC, or the tiled layouts of §5.1, the conv
output's layout propagated to bias and ReLU as in §4.2), and one register-blocked loop schedule
applied whatever the layout (:func:`schedule_conv2d`), so layouts are compared at equal loop
effort. :class:`ConvTiling` fixes the layout split factors and the loop tiling by hand. The model
build does not use this module: its conv strategy is :class:`~.conv.AltConvStrategy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import tvm
from tvm import te

from alt_tvm import ops
from alt_tvm.layout import Layout
from alt_tvm.layout.templates import (
    channels_last,
    conv_input_unfolded,
    conv_output_tiled,
    conv_weight_tiled,
    weight_channels_last,
)

__all__ = ["LAYOUT_KINDS", "R18_FIRST_LAYER", "Conv2dGraph", "Conv2dWorkload", "ConvTiling", "LayoutKind",
           "conv2d_graph", "conv2d_layouts", "schedule_conv2d"]

LayoutKind = Literal["nchw", "nhwc", "tiled"]
LAYOUT_KINDS: tuple[str, ...] = ("nchw", "nhwc", "tiled")


@dataclass(frozen=True)
class Conv2dWorkload:
    """A conv2d with bias and ReLU, batch ``n``, ``c`` -> ``o`` channels, symmetric padding."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        oh = (self.h + 2 * self.pad - self.dilation * (self.kh - 1) - 1) // self.stride + 1
        ow = (self.w + 2 * self.pad - self.dilation * (self.kw - 1) - 1) // self.stride + 1
        return oh, ow

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.n * self.o * oh * ow * self.c * self.kh * self.kw


#: The first layer of ResNet-18 (the paper's §7.3.3 case): 3x224x224, pad 3 -> 230x230, 7x7/2, 64.
R18_FIRST_LAYER = Conv2dWorkload(n=1, c=3, h=224, w=224, o=64, kh=7, kw=7, stride=2, pad=3)


@dataclass(frozen=True)
class ConvTiling:
    """Layout tile sizes (ht, wt, ot, it) and the register block of the loop schedule.

    The micro-kernel keeps ``ht x w_reg`` accumulators of one vector (``vec`` lanes)
    each; ``vec_axis`` says whether vectors run along output channels or along width.
    """

    ht: int = 4
    wt: int = 16
    ot: int = 16
    it: int = 1
    w_reg: int = 4
    o_reg: int = 4
    vec_axis: Literal["o", "w"] = "o"

    def __post_init__(self) -> None:
        for name in ("ht", "wt", "ot", "it", "w_reg", "o_reg"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ConvTiling.{name} must be a positive int, got {value!r}")
        if self.wt % self.w_reg:
            raise ValueError(f"ConvTiling.w_reg={self.w_reg} must divide wt={self.wt}")
        if self.ot % self.o_reg:
            raise ValueError(f"ConvTiling.o_reg={self.o_reg} must divide ot={self.ot}")
        if self.vec_axis not in ("o", "w"):
            raise ValueError(f"ConvTiling.vec_axis must be 'o' or 'w', got {self.vec_axis!r}")


@dataclass(frozen=True)
class Conv2dGraph:
    """The TE tensors of pad -> conv2d -> bias_add -> relu."""

    data: te.Tensor
    weight: te.Tensor
    bias: te.Tensor
    padded: te.Tensor
    conv: te.Tensor
    biased: te.Tensor
    out: te.Tensor

    @property
    def args(self) -> list[te.Tensor]:
        return [self.data, self.weight, self.bias, self.out]


def conv2d_graph(workload: Conv2dWorkload, *, dtype: str = "float32") -> Conv2dGraph:
    """Build the canonical (NCHW) TE graph of ``workload``."""
    wl = workload
    data = te.placeholder((wl.n, wl.c, wl.h, wl.w), dtype=dtype, name="data")
    weight = te.placeholder((wl.o, wl.c, wl.kh, wl.kw), dtype=dtype, name="weight")
    bias = te.placeholder((wl.o,), dtype=dtype, name="bias")
    conv = ops.conv2d(data, weight, stride=wl.stride, padding=wl.pad, dilation=wl.dilation)
    padded = conv.op.input_tensors[0]
    if wl.pad == 0:
        raise ValueError("conv2d_graph: the template expects a padded convolution (pad > 0)")
    biased = ops.bias_add(conv, bias)
    out = ops.relu(biased)
    return Conv2dGraph(data, weight, bias, padded, conv, biased, out)


def conv2d_layouts(graph: Conv2dGraph, workload: Conv2dWorkload, *, kind: LayoutKind,
                   tiling: ConvTiling) -> dict[te.Tensor, Layout]:
    """Layouts of the graph's tensors for ``kind``.

    The conv output's layout is propagated to the element-wise bias and ReLU outputs
    (paper §4.2), and the padding stage writes the conv's input layout directly, so the
    only conversion left is the one pad performs anyway.
    """
    wl = workload
    shape = {t: tuple(int(s) for s in t.shape) for t in (graph.padded, graph.conv, graph.weight)}
    if kind == "nchw":
        return {}
    if kind == "nhwc":
        out = channels_last(shape[graph.conv])
        return {graph.padded: channels_last(shape[graph.padded]), graph.conv: out, graph.biased: out,
                graph.out: out, graph.weight: weight_channels_last(shape[graph.weight])}
    if kind == "tiled":
        tiles = [tiling.ht, tiling.wt]
        out = conv_output_tiled(shape[graph.conv], spatial_tiles=tiles, channel_tile=tiling.ot)
        inp = conv_input_unfolded(shape[graph.padded], spatial_tiles=tiles, channel_tile=tiling.it,
                                  kernel=[wl.kh, wl.kw], strides=[wl.stride] * 2, dilation=[wl.dilation] * 2)
        weight = conv_weight_tiled(shape[graph.weight], out_tile=tiling.ot, in_tile=tiling.it)
        return {graph.padded: inp, graph.conv: out, graph.biased: out, graph.out: out, graph.weight: weight}
    raise ValueError(f"unknown layout kind {kind!r}; known: {list(LAYOUT_KINDS)}")


def schedule_conv2d(func: tvm.tirx.PrimFunc, graph: Conv2dGraph, *, kind: LayoutKind,
                    tiling: ConvTiling) -> tvm.IRModule:
    """Register-blocked, vectorised, parallel schedule; identical loop structure for every layout.

    Loops after scheduling (outer to inner)::

        parallel(n, h/ht, w/wt) . o/ot . [w or o register blocks] . rc . rh . rw . ht . reg . vec

    For the canonical layouts the output loops are split to the same tiles the tiled
    layout stores, so only the data layout differs between the variants.
    """
    sch = tvm.s_tir.Schedule(func)
    conv = sch.get_sblock(graph.conv.op.name)
    loops = sch.get_loops(conv)
    if kind == "tiled":
        n, ho, wo, oo, hi, wi, oi, rc, rh, rw = loops
    else:
        if kind == "nchw":
            n, o, h, w, rc, rh, rw = loops
        elif kind == "nhwc":
            n, h, w, o, rc, rh, rw = loops
        else:
            raise ValueError(f"unknown layout kind {kind!r}; known: {list(LAYOUT_KINDS)}")
        oo, oi = sch.split(o, [None, tiling.ot])
        ho, hi = sch.split(h, [None, tiling.ht])
        wo, wi = sch.split(w, [None, tiling.wt])
    if tiling.vec_axis == "o":
        wio, wii = sch.split(wi, [None, tiling.w_reg])
        sch.reorder(n, ho, wo, oo, wio, rc, rh, rw, hi, wii, oi)
        reg, vec = wii, oi
    else:
        oio, oii = sch.split(oi, [None, tiling.o_reg])
        sch.reorder(n, ho, wo, oo, oio, rc, rh, rw, hi, oii, wi)
        reg, vec = oii, wi
    sch.parallel(sch.fuse(n, ho, wo))
    sch.vectorize(vec)
    sch.unroll(reg)
    sch.unroll(hi)
    sch.decompose_reduction(conv, rc)
    # Epilogue: bias + ReLU computed right after each output tile, while it is in cache.
    sch.compute_inline(sch.get_sblock(graph.biased.op.name))
    relu = sch.get_sblock(graph.out.op.name)
    sch.reverse_compute_at(relu, oo)
    sch.vectorize(sch.get_loops(relu)[-1])
    pad_loops = sch.get_loops(sch.get_sblock(graph.padded.op.name))
    sch.parallel(sch.fuse(*pad_loops[:3]) if kind == "tiled" else sch.fuse(*pad_loops[:2]))
    return sch.mod
