"""Issue-rate facts of this machine: measured once by an FMA micro-benchmark, then cached.

No interface reports how a core issues vector FMAs: whether an operation on half a vector
register takes a whole slot (Intel's AVX-512 cores, Zen 5) or issues at the full rate of
lanes (Zen 4, whose 512-bit operations run as two 256-bit halves), or how many independent
accumulators cover the FMA latency (latency x FMA pipes). A CPU-name table would be wrong on
the next CPU; timing a few FMA loops once is right on any. The facts are measured on the
first :func:`alt_tvm.target.host` of a machine, kept in :func:`cache_path` keyed by the
CPU's model name and flags, and overridden by the JSON file that :data:`FACTS_ENV` names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from alt_tvm.isa import CPUINFO, X86_MACHINES

__all__ = ["FACTS_ENV", "IssueFacts", "cache_path", "fma_arguments", "fma_kernel", "issue_facts", "machine_signature",
           "measure_issue_facts"]

_log = logging.getLogger(__name__)

#: Environment variable naming a JSON file of facts that replace the measured ones, e.g.
#: ``{"half_vectors_full_rate": true, "fma_chains": 8}`` (either key may be left out).
FACTS_ENV = "ALT_TVM_MACHINE_FACTS"

SCHEMA_VERSION = 1

#: A half vector issues at the full rate of lanes when its lanes per second reach this share
#: of a full vector's. Half-slot cores read about 0.5 (0.6 where 512-bit code runs at a
#: lower clock), double-pumped ones about 1.0.
FULL_RATE_SHARE = 0.8
#: Accumulators counted as covering the FMA latency once they reach this share of the rate
#: of the most accumulators tried.
SATURATED_SHARE = 0.9
#: Accumulator counts tried for :attr:`IssueFacts.fma_chains` (12 fit AVX2's 16 registers
#: beside the broadcast operand).
CHAIN_COUNTS = (2, 4, 6, 8, 10, 12)
#: What a target that was not measured declares (latency 4 x 2 FMA pipes, as on most cores).
DECLARED_FMA_CHAINS = 8


@dataclass(frozen=True)
class IssueFacts:
    """How this machine issues FP32 vector FMAs, by vector width.

    Attributes
    ----------
    lanes_per_ns : mapping of int to float
        Vector bits -> FP32 lanes multiply-added per nanosecond by one thread with enough
        accumulators (the widths this machine runs).
    chains : mapping of int to int
        Vector bits -> independent accumulators that reach :data:`SATURATED_SHARE` of that
        rate (the widest width measured).
    source : str
        ``"measured"``, ``"cache"`` or the override file's path.
    """

    lanes_per_ns: Mapping[int, float] = field(default_factory=dict)
    chains: Mapping[int, int] = field(default_factory=dict)
    source: str = "measured"

    def half_vectors_full_rate(self, vector_bits: int) -> bool:
        """Whether FMAs on ``vector_bits // 2`` bits issue at the full rate of lanes of
        ``vector_bits`` ones (False where either width was not measured)."""
        full, half = self.lanes_per_ns.get(vector_bits), self.lanes_per_ns.get(vector_bits // 2)
        return bool(full and half and half >= FULL_RATE_SHARE * full)

    def fma_chains(self, vector_bits: int) -> int:
        """Accumulators that cover the FMA latency at ``vector_bits`` (declared 8 where not measured)."""
        return int(self.chains.get(vector_bits, DECLARED_FMA_CHAINS))

    def to_json(self) -> dict[str, Any]:
        return {"lanes_per_ns": {str(k): v for k, v in sorted(self.lanes_per_ns.items())},
                "chains": {str(k): v for k, v in sorted(self.chains.items())}}

    @classmethod
    def from_json(cls, record: Mapping[str, Any], *, source: str) -> IssueFacts:
        """The facts of a cache entry.

        Raises
        ------
        ValueError
            If ``record`` lacks the two maps or holds a non-numeric entry.
        """
        try:
            return cls(lanes_per_ns={int(k): float(v) for k, v in record["lanes_per_ns"].items()},
                       chains={int(k): int(v) for k, v in record["chains"].items()}, source=source)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"not an issue-facts record: {record!r} ({err})") from None


@dataclass(frozen=True)
class _Override:
    half_vectors_full_rate: bool | None
    fma_chains: int | None
    path: str


def fma_kernel(*, threads: int, accumulators: int, lanes: int, steps: int, passes: int, target: Any):
    """A TVM module whose ``main(x, y, out)`` multiply-adds a broadcast scalar of ``y`` into
    ``accumulators`` vectors of ``lanes`` FP32 lanes per thread, ``passes`` times over the
    ``steps`` scalars: bound by FMA issue, not memory. ``threads`` workers run in parallel.
    Returns the module and the lanes it multiply-adds per call."""
    import tvm
    from tvm import te

    x = te.placeholder((threads, accumulators, lanes), name="x")
    y = te.placeholder((steps,), name="y")
    p = te.reduce_axis((0, passes), "p")
    k = te.reduce_axis((0, steps), "k")
    out = te.compute((threads, accumulators, lanes), lambda t, r, v: te.sum(x[t, r, v] * y[k], axis=[p, k]),
                     name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y, out]))
    block = sch.get_sblock("out")
    t, r, v, pp, kk = sch.get_loops(block)
    sch.reorder(t, pp, kk, r, v)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), t)
    if threads > 1:
        sch.parallel(t)
    sch.unroll(r)
    sch.vectorize(v)
    sch.decompose_reduction(block, pp)
    module = tvm.compile(sch.mod, target=target).jit()
    return module, threads * accumulators * lanes * steps * passes


def fma_arguments(*, threads: int, accumulators: int, lanes: int, steps: int) -> list:
    """Random inputs and a zero output for :func:`fma_kernel` (seed 0)."""
    import tvm

    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    return [tvm.runtime.tensor(rng.random((threads, accumulators, lanes), dtype=np.float32), dev),
            tvm.runtime.tensor(rng.random((steps,), dtype=np.float32), dev),
            tvm.runtime.tensor(np.zeros((threads, accumulators, lanes), np.float32), dev)]


def measure_issue_facts(*, vector_bits: Iterable[int], mcpu: str, steps: int = 16384, passes: int = 8,
                        rounds: int = 3) -> IssueFacts:
    """Time one-thread FMA loops at each width in ``vector_bits``, and the accumulators that
    saturate the widest one (:data:`CHAIN_COUNTS`).

    A width under the machine's widest is built with LLVM's ``prefer-<bits>-bit`` hint on x86,
    so its vectorizer does not merge two narrow accumulators into one wide register. Every
    configuration runs once per round, interleaved, and keeps its best round: a neighbour's
    burst slows a round, never speeds one.

    Raises
    ------
    ValueError
        If a width is not a multiple of 64 bits.
    """
    import tvm

    widths = sorted({int(b) for b in vector_bits})
    if not widths or any(b < 64 or b % 64 for b in widths):
        raise ValueError(f"vector_bits must be multiples of 64 bits, got {widths}")
    x86 = platform.machine().lower() in X86_MACHINES
    # The chains at the widest width; the narrower ones at the most accumulators only.
    configs = [(max(widths), acc) for acc in CHAIN_COUNTS] + [(b, max(CHAIN_COUNTS)) for b in widths[:-1]]
    runs = {}
    for bits, acc in configs:
        target = {"kind": "llvm", "mcpu": mcpu}
        if x86 and bits < max(widths) and bits in (128, 256):
            target["mattr"] = [f"+prefer-{bits}-bit"]
        lanes = bits // 32
        module, work = fma_kernel(threads=1, accumulators=acc, lanes=lanes, steps=steps, passes=passes,
                                  target=tvm.target.Target(target))
        args = fma_arguments(threads=1, accumulators=acc, lanes=lanes, steps=steps)
        module["main"](*args)
        runs[bits, acc] = (module.time_evaluator("main", tvm.cpu(), number=3, repeat=1), args, work)
    best: dict[tuple[int, int], float] = {}
    for _ in range(rounds):
        for config, (timer, args, work) in runs.items():
            rate = work / min(timer(*args).results) / 1e9
            best[config] = max(best.get(config, 0.0), rate)
    lanes_per_ns = {bits: round(max(r for (b, _), r in best.items() if b == bits), 3) for bits in widths}
    widest = max(widths)
    chains = {widest: min(acc for (b, acc), rate in best.items()
                          if b == widest and rate >= SATURATED_SHARE * lanes_per_ns[widest])}
    return IssueFacts(lanes_per_ns=lanes_per_ns, chains=chains, source="measured")


def cache_path() -> Path:
    """Where measured facts are kept: ``$XDG_CACHE_HOME/alt-tvm/machine-facts.json``
    (``~/.cache`` without the variable)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "alt-tvm" / "machine-facts.json"


def machine_signature(cpuinfo_path: Path | str = CPUINFO) -> str:
    """A key for this CPU: a digest of its model name, flags and architecture (not its name
    alone: a guest may show a model name and hide some of its features)."""
    model, flags = "", ""
    try:
        for line in Path(cpuinfo_path).read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "uarch", "cpu part") and not model:
                model = value.strip()
            elif key in ("flags", "features", "isa") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    text = f"{platform.machine()}|{model}|{flags}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        return {}
    machines = data.get("machines")
    return machines if isinstance(machines, dict) else {}


def _write_cache(path: Path, key: str, facts: IssueFacts) -> None:
    """Adds ``key``'s facts to the cache file (atomically: a concurrent reader sees the old or
    the new file, never half of one); a cache that cannot be written is only logged."""
    machines = _read_cache(path)
    machines[key] = {**facts.to_json(), "platform": platform.machine(), "measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
            json.dump({"schema_version": SCHEMA_VERSION, "machines": machines}, out, indent=1, sort_keys=True)
        os.replace(out.name, path)
    except OSError as err:
        _log.warning("could not cache the machine's issue facts in %s: %s", path, err)


def _read_override() -> _Override | None:
    """The facts the :data:`FACTS_ENV` file sets, or None where the variable is unset.

    Raises
    ------
    ValueError
        If the file cannot be read, is not a JSON object, or holds an unknown key or a value
        of the wrong type (the message names it and what is allowed).
    """
    name = os.environ.get(FACTS_ENV, "").strip()
    if not name:
        return None
    try:
        data = json.loads(Path(name).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{FACTS_ENV}={name!r}: cannot read a JSON object from it ({err})") from None
    allowed = {"half_vectors_full_rate": bool, "fma_chains": int}
    if not isinstance(data, dict) or set(data) - set(allowed):
        raise ValueError(f"{FACTS_ENV}={name!r} holds {data!r}; allowed: an object with keys "
                         f"{sorted(allowed)} (half_vectors_full_rate: true/false, fma_chains: int >= 1)")
    full_rate, chains = data.get("half_vectors_full_rate"), data.get("fma_chains")
    if full_rate is not None and not isinstance(full_rate, bool):
        raise ValueError(f"{FACTS_ENV}={name!r}: half_vectors_full_rate must be true or false, got {full_rate!r}")
    if chains is not None and (isinstance(chains, bool) or not isinstance(chains, int) or chains < 1):
        raise ValueError(f"{FACTS_ENV}={name!r}: fma_chains must be an int >= 1, got {chains!r}")
    return _Override(full_rate, chains, name)


def issue_facts(*, vector_bits: int, mcpu: str, cpuinfo_path: Path | str = CPUINFO,
                cache: Path | None = None) -> tuple[bool, int, str]:
    """``(half_vectors_full_rate, fma_chains, source)`` for this machine at ``vector_bits``.

    From the :data:`FACTS_ENV` file where set; else from the cache; else measured now
    (:func:`measure_issue_facts` at ``vector_bits`` and half of it, about two seconds) and
    cached. A machine where the measurement cannot run (no LLVM) gets the declared facts
    (half vectors at half rate, :data:`DECLARED_FMA_CHAINS`) and a warning.

    Raises
    ------
    ValueError
        For a bad :data:`FACTS_ENV` file.
    """
    override = _read_override()
    path = cache or cache_path()
    key = f"{machine_signature(cpuinfo_path)}:{mcpu}:{vector_bits}"
    facts = None
    if override is None or override.half_vectors_full_rate is None or override.fma_chains is None:
        entry = _read_cache(path).get(key)
        if entry is not None:
            try:
                facts = IssueFacts.from_json(entry, source="cache")
            except ValueError:
                facts = None
        if facts is None:
            try:
                facts = measure_issue_facts(vector_bits=(vector_bits, vector_bits // 2), mcpu=mcpu)
            except Exception as err:  # noqa: BLE001 - any LLVM/runtime failure leaves the declared facts
                _log.warning("could not measure this machine's FMA issue facts (%s); using the declared ones", err)
                facts = IssueFacts(source="declared")
            else:
                _write_cache(path, key, facts)
    full_rate = facts.half_vectors_full_rate(vector_bits) if facts else False
    chains = facts.fma_chains(vector_bits) if facts else DECLARED_FMA_CHAINS
    source = facts.source if facts else "declared"
    if override is not None:
        if override.half_vectors_full_rate is not None:
            full_rate = override.half_vectors_full_rate
        if override.fma_chains is not None:
            chains = override.fma_chains
        source = override.path
    return full_rate, chains, source
