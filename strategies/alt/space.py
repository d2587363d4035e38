"""The tuning spaces of the ALT CPU templates (ALT paper §5.1): conv, fused block and GEMM.

Every knob offers the values that divide its extent, so a decoded layout needs no
padding and propagates (paper §4.2), and the analytic default (whose channel tiles may be
padded: :func:`~alt_tvm.strategies.alt.tiling.channel_tile`). :meth:`ConvSpace.decode` gives
:class:`~alt_tvm.strategies.alt.conv.DefaultConvTiling` JSON, :meth:`GemmSpace.decode`
the ``{"nt", "mt", "vec", "kt"}`` of the GEMM strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from alt_tvm.strategies.space import Knob, Space, divisors

from .block import BlockGeometry, BlockTiling
from .tiling import RESERVED_REGISTERS, DefaultConvTiling, is_depthwise, reduction_block
from .vectors import vector_registers


def register_blocks(extent: int, cap: int) -> tuple[int, ...]:
    """Register blocks along a loop of ``extent`` with at most ``cap`` accumulators: the even
    splits into 1, 2, ... blocks (the last one may be partial)."""
    return tuple(sorted({-(-extent // count) for count in range(1, extent + 1)} & set(range(1, max(1, cap) + 1))))


class ConvSpace(Space):
    """The C2D family template (any spatial rank): ``ht, wt, ot, it, ot', it'`` and loop knobs.

    Parameters
    ----------
    out_shape
        Conv output ``N O S...``.
    in_channels_per_group, out_channels_per_group
        Channel extents the channel tiles split (within a group).
    default
        The strategy's analytic tiling (:class:`DefaultConvTiling` JSON), as the starting point.
    registers
        Vector registers: register blocks above all but ``RESERVED_REGISTERS`` of them are not offered.
    lanes
        Vector lanes (a block of ``ot`` needs :func:`.vectors.vector_registers` per position).
    levels
        1: the one-level template; 2: the two-level one (adds ``s<d>_outer`` and
        ``ot_outer``, tiles of tiles stored contiguously; 1 = no outer tiling).
    winograd
        The Winograd output tile the untuned build uses for this conv (0: none). The loop
        knob ``winograd`` then chooses between it (the default point) and the direct
        template; a Winograd point has no other knobs (its tiles are the transform's).
    """

    OUTER_CHOICES = (1, 2, 4, 8)

    def __init__(self, *, out_shape: Sequence[int], in_channels_per_group: int, out_channels_per_group: int,
                 default: dict[str, Any], registers: int, lanes: int, levels: int = 1, winograd: int = 0) -> None:
        if levels not in (1, 2):
            raise ValueError(f"levels must be 1 or 2 (layout tiling levels), got {levels!r}")
        self.out_shape = tuple(int(s) for s in out_shape)
        spatial = self.out_shape[2:]
        self.rank = len(spatial)
        self.registers = registers
        self.lanes = lanes
        self.levels = levels
        self.winograd = winograd
        self._default = default
        depthwise = is_depthwise(in_channels_per_group, out_channels_per_group)
        o_extent = self.out_shape[1] if depthwise else out_channels_per_group
        i_extent = self.out_shape[1] if depthwise else in_channels_per_group
        knobs = [Knob(f"s{d}", divisors(s, cap=4 if d < self.rank - 1 else 64), s) for d, s in enumerate(spatial)]
        # The divisors, and the analytic tiles (a padded channel tile need not divide).
        o_tiles = tuple(sorted({*divisors(o_extent, cap=4 * lanes), int(default["ot"])}))
        i_tiles = tuple(sorted({*divisors(i_extent, cap=4 * lanes), int(default["it"])}))
        knobs += [Knob("ot", o_tiles, o_extent), Knob("it", i_tiles, i_extent),
                  Knob("weight_ot", o_tiles, o_extent), Knob("weight_it", i_tiles, i_extent)]
        if levels == 2:
            knobs += [Knob(f"s{d}_outer", self.OUTER_CHOICES, self.OUTER_CHOICES[-1]) for d in range(self.rank)]
            knobs += [Knob("ot_outer", self.OUTER_CHOICES, self.OUTER_CHOICES[-1])]
        self._layout = tuple(knobs)
        self._o_extent = o_extent
        self._i_extent = i_extent
        # One input channel per group: no channel blocks for the reduction-outer order to run.
        self._reduction_orders = (False, True) if levels == 1 and in_channels_per_group > 1 else (False,)
        # A depthwise conv reads its input through a per-tile window copy: no input tile to prefetch.
        self._input_prefetches = (False, True) if levels == 1 and not depthwise else (False,)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        last = layout[f"s{self.rank - 1}"]
        outer = int(np.prod([layout[f"s{d}"] for d in range(self.rank - 1)])) if self.rank > 1 else 1
        vectors = vector_registers(layout["ot"], self.lanes)
        budget = max(1, self.registers - RESERVED_REGISTERS) // max(1, outer * vectors)
        # Even blocks with a partial last one (register_block) as well as the divisors.
        return (Knob("reg", register_blocks(last, budget)),
                Knob("rc_split", divisors(self._i_extent, cap=4 * self.lanes)),
                Knob("parallel_channels", (False, True)),
                Knob("unroll_window", (False, True)),
                Knob("window_outer", (False, True)),
                Knob("epilogue_in_block", (False, True)),
                # The reduction-outer loop order exists for the one-level template only.
                Knob("reduction_outer", self._reduction_orders),
                Knob("prefetch", self._reduction_orders),
                Knob("prefetch_input", self._input_prefetches),
                Knob("winograd", (0, self.winograd) if self.winograd else (0,)))

    def check(self, layout: dict[str, Any], loop: dict[str, Any]) -> str | None:
        why = super().check(layout, loop)
        if why is None and loop.get("winograd"):
            default_layout, default_loop = self.default()
            if layout != default_layout or {**loop, "winograd": 0} != {**default_loop, "winograd": 0}:
                return "a Winograd point has no other knobs: its tiles are the transform's (the default's)"
        if why is None and loop["reduction_outer"] and (loop["window_outer"] or
                                                        not 1 < loop["rc_split"] < self._i_extent):
            return (f"reduction_outer needs window_outer=False (got {loop['window_outer']}) and rc_split "
                    f"splitting the {self._i_extent} input channels (got {loop['rc_split']})")
        if why is None and loop["reduction_outer"] and loop["epilogue_in_block"]:
            return ("reduction_outer needs epilogue_in_block=False: its register blocks hold partial sums, so the "
                    "epilogue runs once per channel tile")
        if why is None and loop.get("prefetch") and not loop["reduction_outer"]:
            return "prefetch needs reduction_outer (it fetches that loop order's next weight block)"
        if why is None and loop.get("prefetch_input") and loop["reduction_outer"]:
            return "prefetch_input needs reduction_outer=False (that order's parallel tasks share an input tile)"
        if why is not None or self.levels == 1:
            return why
        # An outer tile groups whole inner tiles: it must divide the number of them.
        extents = [*self.out_shape[2:], self._o_extent]
        names = [*(f"s{d}" for d in range(self.rank)), "ot"]
        for name, extent in zip(names, extents):
            blocks = extent // layout[name]
            if blocks % layout[f"{name}_outer"]:
                return (f"{name}_outer={layout[f'{name}_outer']} does not divide the {blocks} tiles of "
                        f"{name}={layout[name]}")
        return None

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = DefaultConvTiling.from_json(self._default)
        layout = {f"s{k}": v for k, v in enumerate(d.spatial)}
        layout.update(ot=d.ot, it=d.it, weight_ot=d.weight_ot or d.ot, weight_it=d.weight_it or d.it)
        loop = {"reg": d.reg, "rc_split": d.rc_split or reduction_block(self._i_extent, d.it),
                "parallel_channels": bool(d.parallel_channels),
                "unroll_window": d.unroll_window, "window_outer": d.window_outer,
                "epilogue_in_block": d.epilogue_in_block, "reduction_outer": d.reduction_outer,
                "prefetch": d.prefetch, "prefetch_input": d.prefetch_input, "winograd": self.winograd}
        if self.levels == 2:
            layout.update({f"s{k}_outer": 1 for k in range(self.rank)}, ot_outer=1)
        # The analytic choice is always in the space; clamp into it if a knob's cap cut it.
        for knob in self.layout_knobs:
            layout[knob.name] = knob.nearest(layout[knob.name])
        for knob in self.loop_knobs(layout):
            if knob.name != "winograd":
                loop[knob.name] = knob.nearest(float(loop[knob.name]))
        return layout, loop

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        two_level = self.levels == 2
        return {**self._direct(layout, loop, two_level), "winograd": int(loop.get("winograd", 0))}

    def _direct(self, layout: dict[str, Any], loop: dict[str, Any], two_level: bool) -> dict[str, Any]:
        return DefaultConvTiling(
            spatial=tuple(layout[f"s{d}"] for d in range(self.rank)), ot=layout["ot"], it=layout["it"],
            reg=loop["reg"], weight_ot=layout["weight_ot"], weight_it=layout["weight_it"], rc_split=loop["rc_split"],
            parallel_channels=bool(loop["parallel_channels"]), unroll_window=bool(loop["unroll_window"]),
            window_outer=bool(loop["window_outer"]), epilogue_in_block=bool(loop["epilogue_in_block"]),
            reduction_outer=bool(loop["reduction_outer"]),
            # Points written before the knob existed ran without it.
            prefetch=bool(loop.get("prefetch", False)), prefetch_input=bool(loop.get("prefetch_input", False)),
            outer_spatial=tuple(layout[f"s{d}_outer"] for d in range(self.rank)) if two_level else (),
            outer_ot=layout["ot_outer"] if two_level else 0).to_json()


class BlockSpace(Space):
    """The fused inverted-residual block (:mod:`.block`): the output's tiles ``s0, s1, ot``
    and the expanded maps' channel vector ``mt``; loops: rows per parallel band and the
    three stages' register blocks. A block that ends at its depthwise conv has no ``ot``
    (its map is written in ``mt`` vectors) and no ``dw_reg`` beyond 0.

    Parameters
    ----------
    geometry
        The block's shapes.
    default
        The untuned build's :class:`BlockTiling`.
    registers, lanes
        Vector registers and lanes: register blocks above all but ``RESERVED_REGISTERS``
        registers are not offered.
    cores, l2_bytes
        Bands leave at least one per core, and their buffers fit the L2 cache (the untuned
        rule keeps them in half of it: the tuner may try more).
    """

    def __init__(self, *, geometry: BlockGeometry, default: BlockTiling, registers: int, lanes: int, cores: int,
                 l2_bytes: int) -> None:
        g = self.geometry = geometry
        self._default = default
        self.registers, self.lanes, self.cores, self.l2_bytes = registers, lanes, cores, l2_bytes
        # Channel tiles of more than a quarter vector. Narrower output tiles time fast alone (MNASNet's
        # stem: 2 of 16 channels, 0.78x the default's time) but slow in the model, where the next
        # block reads them (1.5x), so they would only spend trials.
        def tiles(extent: int, default_tile: int) -> tuple[int, ...]:
            return tuple(sorted({d for d in divisors(extent, cap=4 * lanes) if 4 * d > lanes} | {default_tile}))

        # A block that ends at its depthwise conv writes that map in its channel vectors: ot is mt.
        output_tile = (Knob("ot", tiles(g.o, default.ot), g.o),) if g.project else ()
        self._layout = (Knob("s0", tuple(sorted({*divisors(g.oh, cap=4), default.spatial[0]})), g.oh),
                        Knob("s1", tuple(sorted({*divisors(g.ow, cap=64), default.spatial[1]})), g.ow),
                        *output_tile, Knob("mt", tiles(g.m, default.mt), g.m))

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        g = self.geometry
        budget = max(1, self.registers - RESERVED_REGISTERS)
        rows = [r for r in range(layout["s0"], g.oh + 1, layout["s0"])
                if not g.oh % r and g.n * g.oh // r >= self.cores and g.band_bytes(r) <= self.l2_bytes]
        maps = budget // vector_registers(layout["mt"], self.lanes)  # accumulators per position: mt's vectors
        output = budget // (layout["s0"] * vector_registers(self._output_tile(layout), self.lanes))  # rows x ot's
        # A block that ends at its depthwise conv has no depthwise rows buffered (dw_reg 0).
        return (Knob("band_rows", tuple(rows) or (layout["s0"],)),
                Knob("expand_reg", register_blocks(g.padded_w, maps)),
                Knob("dw_reg", register_blocks(g.ow, maps) if g.project else (0,)),
                Knob("project_reg", register_blocks(layout["s1"], output)))

    def check(self, layout: dict[str, Any], loop: dict[str, Any]) -> str | None:
        why = super().check(layout, loop)
        if why is None:
            try:
                self._tiling(layout, loop).check(self.geometry)
            except ValueError as err:
                return str(err)
        return why

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self._default
        layout = {"s0": d.spatial[0], "s1": d.spatial[1], "mt": d.mt}
        if self.geometry.project:
            layout["ot"] = d.ot
        loop = {"band_rows": d.band_rows, "expand_reg": d.expand_reg, "dw_reg": d.dw_reg,
                "project_reg": d.project_reg}
        for knob in self.loop_knobs(layout):  # the analytic choice is in the space unless a cap cut it
            loop[knob.name] = knob.nearest(loop[knob.name])
        return layout, loop

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        return self._tiling(layout, loop).to_json()

    @staticmethod
    def _output_tile(layout: dict[str, Any]) -> int:
        """``ot``: a layout knob, or ``mt`` for a block that ends at its depthwise conv."""
        return layout.get("ot", layout["mt"])

    def _tiling(self, layout: dict[str, Any], loop: dict[str, Any]) -> BlockTiling:
        return BlockTiling(spatial=(layout["s0"], layout["s1"]), ot=self._output_tile(layout), mt=layout["mt"],
                           band_rows=loop["band_rows"], expand_reg=loop["expand_reg"], dw_reg=loop["dw_reg"],
                           project_reg=loop["project_reg"])


class GemmSpace(Space):
    """The GMM template: ``nt`` (packed-weight tile) and loops ``mt``, ``kt``, vector width,
    whether weight panels or row blocks are the outer loop, the chunk ``kc`` of ``k`` a
    panel is used by every row block in, and whether chunks run per panel or per group of
    panels, one group per core (``panel_groups``), and whether the chunk needed next is
    prefetched (``prefetch``)."""

    def __init__(self, *, m: int, n: int, default: dict[str, Any], lanes: int, k: int = 1, cores: int = 1) -> None:
        self.m, self.n, self.k, self.lanes, self.cores = m, n, k, lanes, cores
        self._default = default
        self._layout = (Knob("nt", divisors(n, cap=8 * lanes), n),)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        # Row blocks need not divide M (the last one is partial): M is often prime (197 tokens).
        rows = set(divisors(self.m, cap=8)) | {t for t in (2, 4, 8, self._default["mt"]) if t <= self.m}
        groups = (0, self.cores) if self.cores > 1 and (self.n // layout["nt"]) % self.cores == 0 else (0,)
        return (Knob("mt", tuple(sorted(rows))), Knob("vec", divisors(layout["nt"], cap=self.lanes)),
                Knob("kt", divisors(self.k, cap=8)), Knob("panels_outer", (0, 1)),
                # The rule's chunk (from the L1 size: 32 on a 32 KiB L1) is a choice, so the
                # default point is the build's kernel.
                Knob("kc", tuple(sorted({0, int(self._default.get("kc", 0)),
                                         *(c for c in (64, 128, 256, 512) if c < self.k and self.k % c == 0)}))),
                Knob("panel_groups", groups), Knob("prefetch", (0, 1)))

    def check(self, layout: dict[str, Any], loop: dict[str, Any]) -> str | None:
        why = super().check(layout, loop)
        chunked = loop["panels_outer"] and loop["kc"] and loop["kt"] == 1
        if why is None and not chunked and (loop.get("panel_groups") or loop.get("prefetch")):
            # Without chunks these knobs have no loop to act on: the same program as with 0.
            return (f"panel_groups={loop.get('panel_groups')} and prefetch={loop.get('prefetch')} need the chunked "
                    f"order (panels_outer=1, kc > 0, kt=1; got {loop['panels_outer']}, {loop['kc']}, {loop['kt']})")
        return why

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self._default
        layout = {"nt": self._layout[0].nearest(d["nt"])}
        knobs = {k.name: k for k in self.loop_knobs(layout)}
        return layout, {"mt": knobs["mt"].nearest(d["mt"]), "vec": knobs["vec"].nearest(d["vec"]),
                        "kt": knobs["kt"].nearest(d.get("kt", 1)), "panels_outer": int(d.get("panels_outer", 0)),
                "kc": knobs["kc"].nearest(d.get("kc", 0)),
                "panel_groups": knobs["panel_groups"].nearest(d.get("panel_groups", 0)),
                "prefetch": int(d.get("prefetch", 0))}

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        return {"nt": layout["nt"], "mt": loop["mt"], "vec": loop["vec"], "kt": loop["kt"],
                "panels_outer": int(loop["panels_outer"]), "kc": int(loop["kc"]),
                # Points written before the knob existed: panels one by one, as they ran then.
                "panel_groups": int(loop.get("panel_groups", 0)), "prefetch": int(loop.get("prefetch", 0))}


#: Rows of a fused GEMM + norm kernel's parallel group, as multiples of the rule's
#: (:func:`.gemm_norm.group_blocks`): fewer groups read the weight fewer times, more balance
#: the cores and keep the row buffers in cache.
GROUP_SCALES = (0.5, 1.0, 2.0)


class GemmNormSpace(Space):
    """A GEMM fused with a layer norm before or after it (:mod:`.gemm_norm`): the packed
    weight's panel ``nt``, the register block's rows ``mt`` and vector width ``vec``, the unroll
    ``kt`` of ``k``, and the rows of a parallel group as a multiple of the rule's
    (``group_scale``, :data:`GROUP_SCALES`)."""

    def __init__(self, *, rows: int, n: int, k: int, lanes: int, default: dict[str, Any]) -> None:
        self.rows, self.n, self.k, self.lanes = rows, n, k, lanes
        self._default = default
        self._layout = (Knob("nt", divisors(n, cap=8 * lanes), n),)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        rows = tuple(sorted({t for t in (1, 2, 3, 4, 6, 8, self._default["mt"]) if t <= self.rows}))
        return (Knob("mt", rows), Knob("vec", divisors(layout["nt"], cap=self.lanes)),
                Knob("kt", divisors(self.k, cap=8)), Knob("group_scale", GROUP_SCALES))

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self._default
        layout = {"nt": self._layout[0].nearest(d["nt"])}
        knobs = {k.name: k for k in self.loop_knobs(layout)}
        return layout, {"mt": knobs["mt"].nearest(d["mt"]), "vec": knobs["vec"].nearest(d["vec"]),
                        "kt": knobs["kt"].nearest(d.get("kt", 1)), "group_scale": 1.0}

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        return {"nt": layout["nt"], "mt": loop["mt"], "vec": loop["vec"], "kt": loop["kt"],
                "group_scale": float(loop["group_scale"])}


class BatchMatmulSpace(Space):
    """A product of two activations (:mod:`.batch_matmul`), and attention fused around it:
    the register block's columns ``nt`` (whole vectors of keys; ``N`` is padded to a multiple)
    and rows ``mt``, its vector width ``vec``; for attention also the context's register
    block (``column`` of ``Dv``, ``column_vec``) and whether heads alone run in parallel
    (``per_entry``)."""

    def __init__(self, *, m: int, n: int, lanes: int, default: dict[str, Any], dv: int = 0) -> None:
        self.m, self.n, self.dv, self.lanes = m, n, dv, lanes
        self._default = default
        columns = {default["nt"], *(lanes * v for v in (1, 2, 3, 4) if lanes * v <= max(n, lanes))}
        layout = [Knob("nt", tuple(sorted(columns)), n)]
        if dv:
            layout.append(Knob("column", tuple(sorted({default["column"], *divisors(dv, cap=4 * lanes)})), dv))
        self._layout = tuple(layout)

    @property
    def attention(self) -> bool:
        return bool(self.dv)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return self._layout

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        # Divisors of M as well: a block with no partial last one (Swin's 49 queries: 7).
        rows = tuple(sorted({t for t in (1, 2, 3, 4, 6, 8) if t <= self.m} | set(divisors(self.m, cap=8))
                            | {self._default["mt"]}))
        knobs = [Knob("mt", rows), Knob("vec", divisors(layout["nt"], cap=self.lanes))]
        if self.attention:
            knobs += [Knob("column_vec", divisors(layout["column"], cap=self.lanes)),
                      Knob("per_entry", (False, True))]
        return tuple(knobs)

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        d = self._default
        layout = {knob.name: knob.nearest(d[knob.name]) for knob in self._layout}
        knobs = {k.name: k for k in self.loop_knobs(layout)}
        loop = {"mt": knobs["mt"].nearest(d["mt"]), "vec": knobs["vec"].nearest(d["vec"])}
        if self.attention:
            loop.update(column_vec=knobs["column_vec"].nearest(d["column_vec"]), per_entry=bool(d["per_entry"]))
        return layout, loop

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        return {**layout, **loop}


class RowSpace(Space):
    """A row kernel (softmax, layer norm: :mod:`.rows`): rows per parallel task (``rows``; 1:
    the rule's, one row per iteration of the parallel loop) and the vector width of its padded
    rows and lane partials (``lanes``: the target's, or half of it; ``default_lanes``, the
    rule's: :func:`.rows.row_lanes`)."""

    def __init__(self, *, rows: int, lanes: int, default_lanes: int | None = None) -> None:
        self.rows, self.lanes = rows, lanes
        self.default_lanes = lanes if default_lanes is None else default_lanes
        self._lanes = (Knob("lanes", tuple(sorted({lanes, self.default_lanes,
                                                   *((lanes // 2,) if lanes >= 8 else ())}))),)

    @property
    def layout_knobs(self) -> tuple[Knob, ...]:
        return ()

    def loop_knobs(self, layout: dict[str, Any]) -> tuple[Knob, ...]:
        return (Knob("rows", tuple(r for r in (1, 2, 4, 8, 16) if r <= max(1, self.rows))), *self._lanes)

    def default(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"rows": 1, "lanes": self.default_lanes}

    def decode(self, layout: dict[str, Any], loop: dict[str, Any]) -> dict[str, Any]:
        return {"rows": int(loop["rows"]), "lanes": int(loop["lanes"])}
