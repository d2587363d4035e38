"""Where a benchmark's results go, and what they record about the machine.

The latest run of each suite on each kind of machine is kept, one file per suite:
``benchmarks/results/<machine kind>/<suite>.json`` (history is git's). The machine kind is
the host's LLVM CPU name (``znver4``, ``cascadelake``, ...): a folder label only, never a
rule anything depends on.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "SUITES", "machine_facts", "machine_kind", "results_path", "write_results"]

#: ``benchmarks/results`` of this checkout.
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

#: The suites benchmarks write; one JSON file (and its plot) each per machine kind.
SUITES = ("cnn_suite", "cnn_tuned", "public_sweep", "transformers", "transformers_tuned", "ops", "tuning", "fleet",
          "load", "serving", "e2e", "e2e_sconv", "e2e_tuned", "sconv", "tt", "vta", "gpu", "blocks", "deploy",
          "lookahead", "r18_first_layer", "tuning_coverage", "gpu_models")


def machine_kind() -> str:
    """The host's LLVM CPU name (``alt_tvm.target.host().tvm_target["mcpu"]``), e.g. ``"znver4"``;
    ``"generic"`` where LLVM names none."""
    from alt_tvm.target import host

    return str(host().tvm_target.get("mcpu") or "generic")


def results_path(suite: str, *, kind: str | None = None, root: str | os.PathLike | None = None) -> Path:
    """``<root>/<kind>/<suite>.json``: where a run of ``suite`` on this machine writes its results.

    Parameters
    ----------
    suite : str
        One of :data:`SUITES`.
    kind : str, optional
        The machine kind (default :func:`machine_kind`).
    root : path, optional
        The results folder (default :data:`RESULTS_DIR`).

    Raises
    ------
    ValueError
        If ``suite`` is not one of :data:`SUITES`.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    return Path(root if root is not None else RESULTS_DIR) / (kind or machine_kind()) / f"{suite}.json"


def machine_facts(*, threads: int | None = None) -> dict[str, Any]:
    """What a result file says about the machine it was measured on."""
    from alt_tvm.target import host

    machine = host()
    facts: dict[str, Any] = {"kind": machine_kind(), "description": machine.description, "cores": machine.num_cores,
                             "vector_bits": machine.vector_bits, "platform": platform.platform()}
    if threads is not None:
        facts["threads"] = threads
    return facts


def write_results(suite: str, results: Mapping[str, Any], *, path: str | os.PathLike | None = None,
                  peak_gflops: float | None = None, threads: int | None = None) -> Path:
    """Write one run of ``suite`` as JSON with the machine's facts and its FP32 FMA peak.

    Parameters
    ----------
    suite : str
        The suite's name (:data:`SUITES`).
    results : mapping
        The run's own results (JSON-serialisable); kept under ``"results"``.
    path : path, optional
        Where to write (default :func:`results_path`); its folder is created.
    peak_gflops : float, optional
        The run's measured FP32 FMA peak (:class:`~alt_tvm.bench.peak.PeakReadings`), the
        ceiling its kernels are read against.
    threads : int, optional
        The threads every runtime got.

    Returns
    -------
    pathlib.Path
        The file written.
    """
    target = Path(path) if path is not None else results_path(suite)
    target.parent.mkdir(parents=True, exist_ok=True)
    document = {"suite": suite, "machine": machine_facts(threads=threads), "peak_gflops": peak_gflops,
                "results": dict(results)}
    target.write_text(json.dumps(document, indent=1, default=str) + "\n")
    return target
