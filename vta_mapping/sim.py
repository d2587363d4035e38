"""A functional model of VTA: SRAM buffers, 2-D DMA loads/stores, GEMM and ALU instructions.

Buffers hold whole operand tiles: the input buffer ``BATCH x BLOCK_IN`` int8 tiles, the weight
buffer ``BLOCK_OUT x BLOCK_IN`` int8 tiles, the accumulator ``BATCH x BLOCK_OUT`` int32 tiles.
DRAM tensors are arrays of tiles. Instructions run in program order (no load/compute/store
overlap: the cycle count is an upper bound on a pipelined VTA, the same for every strategy).

Cost model (cycles, all in :class:`CostModel`):

* every instruction: ``insn`` (fetch/decode/issue);
* LOAD / STORE: ``dma_setup`` per instruction + ``dma_row`` per row of the 2-D transfer +
  ``ceil(bytes / bus_bytes)`` (one AXI beat of ``bus_bytes`` per cycle);
* GEMM: ``gemm_uop`` per micro-op (one ``BATCH x BLOCK_OUT x BLOCK_IN`` tile product per cycle,
  as VTA's pipelined GEMM core); a reset GEMM costs the same per micro-op;
* ALU: ``alu_uop`` per accumulator tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dfg import GemmShape

__all__ = ["CostModel", "VTAConfig", "Load", "Store", "Gemm", "Alu", "Stats", "Simulator", "program_stats"]


@dataclass(frozen=True)
class CostModel:
    insn: int = 4
    dma_setup: int = 32
    dma_row: int = 4
    bus_bytes: int = 8
    gemm_uop: int = 1
    alu_uop: int = 1


@dataclass(frozen=True)
class VTAConfig:
    """Hardware configuration (defaults: VTA's 1x16x16 GEMM, 32/256/128 KiB inp/wgt/acc buffers)."""

    gemm: GemmShape = field(default_factory=GemmShape)
    inp_bytes: int = 32 * 1024
    wgt_bytes: int = 256 * 1024
    acc_bytes: int = 128 * 1024
    cost: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        for name in ("inp_bytes", "wgt_bytes", "acc_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"VTAConfig.{name} must be positive, got {getattr(self, name)}")
        if self.inp_cap < 1 or self.wgt_cap < 1 or self.acc_cap < 1:
            raise ValueError(f"buffers too small for one tile of {self.gemm}: caps "
                             f"{self.inp_cap}/{self.wgt_cap}/{self.acc_cap}")

    @property
    def inp_tile(self) -> int:  # bytes
        return self.gemm.batch * self.gemm.block_in

    @property
    def wgt_tile(self) -> int:
        return self.gemm.block_out * self.gemm.block_in

    @property
    def acc_tile(self) -> int:
        return self.gemm.batch * self.gemm.block_out * 4

    @property
    def inp_cap(self) -> int:
        return self.inp_bytes // self.inp_tile

    @property
    def wgt_cap(self) -> int:
        return self.wgt_bytes // self.wgt_tile

    @property
    def acc_cap(self) -> int:
        return self.acc_bytes // self.acc_tile


@dataclass(frozen=True)
class Load:
    """2-D DMA: ``y_size`` rows of ``x_size`` tiles, row ``r`` from DRAM tile ``dram + r*x_stride``."""

    buffer: str  # "inp" or "wgt"
    dram: int
    y_size: int
    x_size: int
    x_stride: int
    sram: int


@dataclass(frozen=True)
class Store:
    """2-D DMA from the accumulator to DRAM tile array ``out``."""

    sram: int
    dram: int
    y_size: int
    x_size: int
    x_stride: int


@dataclass(frozen=True, eq=False)
class Gemm:
    """Micro-ops ``acc[u0] += inp[u1] @ wgt[u2].T`` (``reset``: ``acc[u0] = 0`` instead)."""

    uops: np.ndarray  # (U, 3) int64
    reset: bool = False


@dataclass(frozen=True, eq=False)
class Alu:
    """Element-wise op on accumulator tiles: ``add``, ``shr``, ``max``, ``min`` with an immediate."""

    op: str
    acc: np.ndarray
    imm: int


@dataclass
class Stats:
    cycles: int = 0
    load_cycles: int = 0
    gemm_cycles: int = 0
    alu_cycles: int = 0
    store_cycles: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    instructions: int = 0
    gemm_uops: int = 0

    @property
    def bytes_moved(self) -> int:
        return self.bytes_loaded + self.bytes_stored


class Simulator:
    """Execute a VTA program on DRAM tile arrays ``inp [NA,X,Z]``, ``wgt [NB,Y,Z]``, ``out [NC,X,Y]``."""

    def __init__(self, config: VTAConfig) -> None:
        self.config = config
        g = config.gemm
        self.inp = np.zeros((config.inp_cap, g.batch, g.block_in), np.int8)
        self.wgt = np.zeros((config.wgt_cap, g.block_out, g.block_in), np.int8)
        self.acc = np.zeros((config.acc_cap, g.batch, g.block_out), np.int32)

    def _dma(self, y: int, x: int, tile_bytes: int) -> int:
        return _dma_cycles(self.config.cost, y, x, tile_bytes)

    def run(self, program, dram: dict[str, np.ndarray]) -> Stats:
        """Run ``program`` (a list of instructions); ``dram['out']`` receives the stores."""
        cfg = self.config
        g = cfg.gemm
        # one int8 x int8 tile product summed over BLOCK_IN stays below 2**24: exact in float32,
        # which NumPy multiplies several times faster than int32
        exact_f32 = g.block_in * 128 * 128 < 2**24
        for ins in program:
            if isinstance(ins, Load):
                buf, cap = (self.inp, cfg.inp_cap) if ins.buffer == "inp" else (self.wgt, cfg.wgt_cap)
                if ins.buffer not in ("inp", "wgt"):
                    raise ValueError(f"LOAD buffer must be 'inp' or 'wgt', got {ins.buffer!r}")
                if ins.sram + ins.y_size * ins.x_size > cap:
                    raise ValueError(f"LOAD overflows the {ins.buffer} buffer: {ins}")
                src = dram[ins.buffer]
                rows = ins.dram + np.arange(ins.y_size)[:, None] * ins.x_stride + np.arange(ins.x_size)[None, :]
                buf[ins.sram:ins.sram + rows.size] = src[rows.ravel()]
            elif isinstance(ins, Store):
                rows = ins.dram + np.arange(ins.y_size)[:, None] * ins.x_stride + np.arange(ins.x_size)[None, :]
                dram["out"][rows.ravel()] = self.acc[ins.sram:ins.sram + rows.size]
            elif isinstance(ins, Gemm):
                u = ins.uops
                if ins.reset:
                    self.acc[np.unique(u[:, 0])] = 0
                    continue
                for lo in range(0, len(u), 1 << 16):  # bounded temporaries
                    part = u[lo:lo + (1 << 16)]
                    if exact_f32:
                        prod = np.einsum("uxz,uyz->uxy", self.inp[part[:, 1]].astype(np.float32),
                                         self.wgt[part[:, 2]].astype(np.float32)).astype(np.int32)
                    else:
                        prod = np.einsum("uxz,uyz->uxy", self.inp[part[:, 1]].astype(np.int32),
                                         self.wgt[part[:, 2]].astype(np.int32))
                    accs = part[:, 0]
                    if len(accs) > 1 and np.all(accs[1:] >= accs[:-1]):
                        starts = np.flatnonzero(np.r_[True, accs[1:] != accs[:-1]])
                        self.acc[accs[starts]] += np.add.reduceat(prod, starts, axis=0)
                    else:
                        np.add.at(self.acc, accs, prod)
            elif isinstance(ins, Alu):
                a = self.acc[ins.acc]
                if ins.op == "add":
                    a = a + np.int32(ins.imm)
                elif ins.op == "shr":
                    a = a >> np.int32(ins.imm)
                elif ins.op == "max":
                    a = np.maximum(a, np.int32(ins.imm))
                elif ins.op == "min":
                    a = np.minimum(a, np.int32(ins.imm))
                else:
                    raise ValueError(f"unknown ALU op {ins.op!r}; expected add, shr, max or min")
                self.acc[ins.acc] = a
            else:
                raise ValueError(f"unknown instruction {ins!r}")
        return program_stats(program, cfg)


def _dma_cycles(c: CostModel, y: int, x: int, tile_bytes: int) -> int:
    return c.insn + c.dma_setup + c.dma_row * y + -(-(y * x * tile_bytes) // c.bus_bytes)


def program_stats(program, config: VTAConfig) -> Stats:
    """Cycles and bytes of a program under the cost model, without executing it.

    The counts depend only on the instruction stream (not on data), so they equal what
    :meth:`Simulator.run` reports; used to count programs whose numerics are not re-run.

    Parameters
    ----------
    program : list
        VTA instructions.
    config : VTAConfig

    Returns
    -------
    Stats
    """
    c, st = config.cost, Stats()
    for ins in program:
        st.instructions += 1
        if isinstance(ins, Load):
            tb = config.inp_tile if ins.buffer == "inp" else config.wgt_tile
            st.load_cycles += _dma_cycles(c, ins.y_size, ins.x_size, tb)
            st.bytes_loaded += ins.y_size * ins.x_size * tb
        elif isinstance(ins, Store):
            st.store_cycles += _dma_cycles(c, ins.y_size, ins.x_size, config.acc_tile)
            st.bytes_stored += ins.y_size * ins.x_size * config.acc_tile
        elif isinstance(ins, Gemm):
            if not ins.reset:
                st.gemm_uops += len(ins.uops)
            st.gemm_cycles += c.insn + c.gemm_uop * len(ins.uops)
        elif isinstance(ins, Alu):
            st.alu_cycles += c.insn + c.alu_uop * len(ins.acc)
        else:
            raise ValueError(f"unknown instruction {ins!r}")
    st.cycles = st.load_cycles + st.gemm_cycles + st.alu_cycles + st.store_cycles
    return st
