"""Public-model sweep: every architecture of :mod:`alt_tvm.models.public` through both exporters.

For each model, in a child process of its own (a crash or a hang is that model's result, not
the sweep's end): export it with PyTorch's TorchScript and dynamo exporters, build each export
with ``alt_tvm.build`` (untuned), compare with ONNX Runtime on the same file, then time the two
builds and the CPU peers in interleaved rounds: ONNX Runtime (its pool not spinning) and
OpenVINO (:mod:`alt_tvm.bench.openvino`: CPU plugin, latency hint, f32 precision; checked
against alt-tvm's output first; skipped, with the reason in the row, where it is not
installed), all on the same thread count. Each export is read against the faster peer (peer
ms / alt-tvm ms, above 1: alt-tvm faster; :mod:`alt_tvm.bench.peers`) and against the FP32 FMA
peak measured in the run, on the model's convolution and matrix-product arithmetic: each one's
share of the peak, and the ceiling (the faster peer's time over that arithmetic's time at the
peak: the most any runtime could be ahead of it). The run's foot gives the geometric mean of the
ratios and of the ceilings, and the models where alt-tvm is behind.
Rows are appended to a JSON-lines journal as models finish (``--resume`` skips finished ones);
at the end the run is written to ``benchmarks/results/<machine kind>/<suite>.json``
(:mod:`alt_tvm.bench.results`; ``--suite`` defaults to ``cnn_suite`` for that group,
``transformers`` for ``transformer_suite``, else ``public_sweep``) and the table is printed.

    python benchmarks/sweep_public.py [--names hf_vit_b16 hf_swin_tiny ...] [--kind cnn] [--out sweep.jsonl]
                                      [--json FILE] [--markdown table.md] [--timeout 1200] [--resume]
                                      [--target cpu:haswell [--peer-isa AVX2]]

``--target`` builds for another description than this machine's (a board name, or
``cpu:<LLVM CPU>``: ``cpu:haswell`` is AVX2 with FMA, which an AVX-512 machine also runs),
so one machine checks the kernels of another instruction set. ``--peer-isa AVX2`` caps
OpenVINO's oneDNN kernels to that set as well (:data:`alt_tvm.bench.openvino.ISA_ENV`, set in
each model's child process), so an AVX2 build meets an AVX2 peer; each row counts OpenVINO's
kernels per instruction set (its own JIT kernels and MLAS's GEMMs are not capped), and ONNX
Runtime, which has no cap, keeps the machine's widest.

``--names`` takes model names and group names of ``alt_tvm.models.public.GROUPS`` (``cnn_suite``: the
torchvision CNN suite); ``--kind`` keeps the models of one kind.

``torchvision`` models run only where ``import torchvision`` works; where no torchvision wheel
matches the installed torch, ``--torchvision-src DIR`` loads its pure-Python model definitions
from an unpacked wheel's ``torchvision`` folder without running its package initialiser
(which loads the compiled ops these models do not use).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from alt_tvm.bench.openvino import ISA_CAPS, ISA_ENV
from alt_tvm.bench.peers import (
    CPU_PEERS,
    INTERVAL_CONFIDENCE,
    AtPeak,
    against_faster_peer,
    describe_against_faster_peer,
    describe_interval,
    faster_peer,
)
from alt_tvm.bench.results import SUITES, results_path, write_results
from alt_tvm.models.public import (
    EXPORTERS,
    GROUPS,
    KINDS,
    example_input,
    export,
    public_models,
    select_or_exit,
    use_torchvision_source,
)

#: An export matches ONNX Runtime (status ``ok``), and a peer matches alt-tvm, within this
#: largest error relative to the reference's largest magnitude.
TOLERANCE = 1e-4

#: The suite a group's run is filed under (other selections: ``public_sweep``).
GROUP_SUITES = {"cnn_suite": "cnn_suite", "transformer_suite": "transformers"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", nargs="+", default=None,
                        help=f"models or groups ({', '.join(sorted(GROUPS))}); default: all")
    parser.add_argument("--kind", choices=KINDS, default=None, help="only the models of this kind")
    parser.add_argument("--out", type=Path, default=Path("sweep_public.jsonl"),
                        help="the JSON-lines journal rows are appended to as models finish")
    parser.add_argument("--suite", choices=SUITES, default=None, help="the suite the results are filed under")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the run here (default benchmarks/results/<machine kind>/<suite>.json)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    parser.add_argument("--export-dir", type=Path, default=Path("models") / "sweep")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (0: no timing)")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per runner and round")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per model (child process)")
    parser.add_argument("--resume", action="store_true", help="skip models already in --out")
    parser.add_argument("--torchvision-src", type=Path, default=None,
                        help="a torchvision package folder to take model definitions from (see above)")
    parser.add_argument("--exporters", nargs="+", choices=EXPORTERS, default=list(EXPORTERS),
                        help="which of PyTorch's ONNX exporters to export with (default: both)")
    parser.add_argument("--target", default="host",
                        help="what to build for: 'host', a board, or 'cpu:<LLVM CPU>' (default: host)")
    parser.add_argument("--peer-isa", choices=sorted(ISA_CAPS), default=None,
                        help="cap OpenVINO's oneDNN kernels to this instruction set (default: the machine's)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process's model
    args = parser.parse_args(argv)
    if args.one is None:  # the model names, groups expanded and --kind applied
        if args.suite is None:
            groups = [GROUP_SUITES[n] for n in args.names or () if n in GROUP_SUITES]
            args.suite = groups[0] if len(groups) == 1 and len(args.names) == 1 else "public_sweep"
        args.names = select_or_exit(parser, args.names, args.kind)
    return args


def _max_error(got, want) -> float:
    """Largest absolute difference, relative to the reference's largest magnitude."""
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"output shape {got.shape} differs from ONNX Runtime's {want.shape}")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _reason(err: BaseException) -> str:
    """The error and its root cause, short (exporters wrap the cause in pages of advice)."""
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    if root is not err:
        text += f" (caused by {type(root).__name__}: {(str(root).splitlines() or [''])[0]})"
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[:400]  # no terminal colours in a table


def run_one(name: str, args: argparse.Namespace) -> dict:
    """Export, build, check and time one model; its row."""
    import warnings

    import alt_tvm
    from alt_tvm.bench import onnxruntime_session, time_interleaved
    from alt_tvm.bench.onnx_flops import count_flops
    from alt_tvm.deploy.model import aligned
    from alt_tvm.target import resolve

    warnings.simplefilter("ignore")
    model = public_models()[name]
    target = resolve(args.target)
    row = {"model": name, "kind": model.kind, "threads": args.threads,
           "target": target.tvm_target.get("mcpu", target.name), "exporters": {}}
    x = aligned(example_input(model, seed=1).numpy())  # read in place by alt-tvm's calls, as ORT reads any array
    runners = {}
    for exporter in args.exporters:
        entry = row["exporters"][exporter] = {}
        try:
            started = time.perf_counter()
            path = export(name, args.export_dir, exporter=exporter)
            entry["export_s"] = round(time.perf_counter() - started, 1)
        except Exception as err:  # noqa: BLE001 - a row reports it
            entry.update(status="export failed", error=_reason(err))
            continue
        ort_runner = onnxruntime_session(path, threads=args.threads)
        want = ort_runner(x)[0]
        try:
            started = time.perf_counter()
            built = alt_tvm.build(str(path), target)
            entry["build_s"] = round(time.perf_counter() - started, 1)
            got = built(x)
            got = got[0] if isinstance(got, (list, tuple)) else got
            entry["max_rel_error"] = _max_error(got, want)
        except Exception as err:  # noqa: BLE001 - a row reports it
            entry.update(status="build failed", error=_reason(err))
            continue
        report = built.report
        strategies: dict[str, int] = {}
        for strategy, _, _ in report.partitions:
            strategies[strategy] = strategies.get(strategy, 0) + 1
        entry.update(status="ok" if entry["max_rel_error"] < TOLERANCE else "mismatch", partitions=strategies,
                     fallbacks=sorted(report.failed.values()), conversions=report.conversions,
                     left_as_is=sorted(report.left_as_is.values()))
        runners[f"alt-tvm {exporter}"] = (built, (x,))
        if "onnxruntime" not in runners:  # one runner per peer, on the first export
            runners["onnxruntime"] = (ort_runner, (x,))
            runners.update(other_peers(row, path, x, got, threads=args.threads))
            try:
                row["gflop"] = count_flops(str(path)) / 1e9
            except Exception as err:  # noqa: BLE001 - the row goes on without its share of the peak
                row["gflop_error"] = _reason(err)
    if args.rounds and runners:
        times = time_interleaved(runners, rounds=args.rounds, repeat=args.repeat, warmup=2)
        row["ms"] = {label: round(ms, 3) for label, (ms, _) in times.items()}
        row["rounds_ms"] = {label: [round(t, 4) for t in rounds] for label, (_, rounds) in times.items()}
        add_faster_peer(row)
    return row


def other_peers(row: dict, path, x, got, *, threads: int) -> dict:
    """The CPU peers besides ONNX Runtime on ``path``, as runners of :func:`time_interleaved`, each
    checked against alt-tvm's output ``got`` first (:data:`TOLERANCE`: a peer that computes
    something else is not timed). ``row["peers"]`` says per peer: ok or mismatch with its error,
    or skipped or failed and why."""
    from alt_tvm.bench import cpu_peers

    notes = row.setdefault("peers", {})
    others = [p for p in CPU_PEERS if p != "onnxruntime"]
    try:
        made, skipped = cpu_peers(path, threads=threads, peers=others)
    except Exception as err:  # noqa: BLE001 - a peer that cannot load the model is a note, not the row's end
        notes.update({p: {"status": "failed", "reason": _reason(err)} for p in others})
        return {}
    notes.update({name: {"status": "skipped", "reason": why} for name, why in skipped.items()})
    if "openvino" in made and os.environ.get(ISA_ENV):
        from alt_tvm.bench import openvino_kernel_isas

        row["peer_isa"] = {"cap": os.environ[ISA_ENV], "openvino_kernels": openvino_kernel_isas(path, threads=threads),
                           "onnxruntime": "uncapped (no instruction-set cap): the machine's widest"}
    timed = {}
    for name, runner in made.items():
        try:
            error = _max_error(runner(x)[0], got)
        except Exception as err:  # noqa: BLE001 - as above
            notes[name] = {"status": "failed", "reason": _reason(err)}
            continue
        notes[name] = {"status": "ok" if error < TOLERANCE else "mismatch", "max_rel_error": error}
        if error < TOLERANCE:
            timed[name] = (runner, (x,))
    return timed


def add_faster_peer(row: dict, *, peak_gflops: float | None = None) -> dict:
    """Each timed export's entry of ``row`` with alt-tvm against the faster peer of ``row["ms"]``
    (:meth:`~alt_tvm.bench.peers.FasterPeer.to_json` fields) and, given the run's peak and the
    row's ``gflop``, both read against that peak (:meth:`~alt_tvm.bench.peers.AtPeak.to_json`);
    ``row`` itself."""
    ms, rounds = row.get("ms") or {}, row.get("rounds_ms") or {}
    at_peak = AtPeak(row["gflop"], peak_gflops) if peak_gflops and row.get("gflop") else None
    for exporter, entry in row.get("exporters", {}).items():
        alt = ms.get(f"alt-tvm {exporter}")
        against = faster_peer(times_ms=ms, alt_ms=alt, rounds_ms=rounds,
                              alt_rounds_ms=rounds.get(f"alt-tvm {exporter}")) if alt else None
        if against is not None:
            entry.update(against.to_json(), **(at_peak.to_json(against) if at_peak else {}))
    return row


def summary(rows: list[dict]) -> dict:
    """Per exporter, alt-tvm against the faster peer over the models whose export is ``ok``
    (:func:`~alt_tvm.bench.peers.against_faster_peer`)."""
    ratios: dict[str, dict[str, float]] = {}
    ceilings: dict[str, dict[str, float]] = {}
    intervals: dict[str, dict[str, list]] = {}
    for row in rows:
        for exporter, entry in row.get("exporters", {}).items():
            if entry.get("status") == "ok" and entry.get("ratio_vs_faster_peer"):
                ratios.setdefault(exporter, {})[row["model"]] = entry["ratio_vs_faster_peer"]
                if entry.get("ceiling_vs_faster_peer"):
                    ceilings.setdefault(exporter, {})[row["model"]] = entry["ceiling_vs_faster_peer"]
                if entry.get("ratio_interval"):
                    intervals.setdefault(exporter, {})[row["model"]] = entry["ratio_interval"]
    return {exporter: against_faster_peer(ratios=values, ceilings=ceilings.get(exporter),
                                          intervals=intervals.get(exporter))
            for exporter, values in ratios.items()}


def run_in_child(name: str, args: argparse.Namespace) -> dict:
    """:func:`run_one` in a child process with ``args.timeout``; a crash or hang is the row's error."""
    command = [sys.executable, __file__, "--one", name, "--export-dir", str(args.export_dir), "--threads",
               str(args.threads), "--rounds", str(args.rounds), "--repeat", str(args.repeat),
               "--exporters", *args.exporters, "--target", args.target]
    if args.torchvision_src is not None:
        command += ["--torchvision-src", str(args.torchvision_src)]
    env = {**os.environ, ISA_ENV: args.peer_isa} if args.peer_isa else None
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "error": f"timed out after {args.timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"model": name, "error": f"child exited with {done.returncode}: {tail}"}
    row = json.loads(lines[-1])
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def _peer_cell(row: dict, peer: str) -> str:
    """A peer's time in the table, or why it has none."""
    ms = (row.get("ms") or {}).get(peer)
    if ms is not None:
        return str(ms)
    note = (row.get("peers") or {}).get(peer) or {}
    if note.get("status") == "mismatch":
        return f"mismatch {note['max_rel_error']:.1e}"
    return note.get("status", "")


def markdown(rows: list[dict]) -> str:
    """The sweep's table: per export, alt-tvm's time, the peers', and the faster peer's over alt-tvm's."""
    head = ("| model | kind | built for | exporter | status | build s | partitions | fallbacks | conversions "
            f"| max rel. error | alt-tvm ms | ORT ms | OpenVINO ms | faster peer | peer / alt-tvm "
            f"[{INTERVAL_CONFIDENCE:.0%} interval] "
            "| % of FP32 peak: alt-tvm, peer |\n" + "|---" * 16 + "|\n")
    blank = " |" * 11
    lines = []
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | | | | {row['error']} |" + blank)
            continue
        ms = row.get("ms", {})
        for exporter, entry in row["exporters"].items():
            if entry.get("status") not in ("ok", "mismatch"):
                lines.append(f"| {row['model']} | {row['kind']} | {row.get('target', '')} | {exporter} | "
                             f"{entry.get('status')}: {entry.get('error', '')} |" + blank)
                continue
            parts = ", ".join(f"{k} {v}" for k, v in sorted(entry["partitions"].items())) or "none"
            alt = ms.get(f"alt-tvm {exporter}")
            peer = entry.get("faster_peer", "")
            ratio = (f"{entry['ratio_vs_faster_peer']:.2f}x{describe_interval(entry.get('ratio_interval'))}"
                     if "ratio_vs_faster_peer" in entry else "")
            shares = (f"{100 * entry['alt_share_of_peak']:.0f}, {100 * entry['peer_share_of_peak']:.0f}"
                      if "alt_share_of_peak" in entry else "")
            lines.append(
                f"| {row['model']} | {row['kind']} | {row.get('target', '')} | {exporter} | {entry['status']} "
                f"| {entry['build_s']} | {parts} "
                f"| {len(entry['fallbacks'])} | {entry['conversions']} | {entry['max_rel_error']:.1e} "
                f"| {alt if alt is not None else ''} | {_peer_cell(row, 'onnxruntime')} "
                f"| {_peer_cell(row, 'openvino')} | {peer} | {ratio} | {shares} |")
    return head + "\n".join(lines) + "\n"


def foot(rows: list[dict]) -> str:
    """The run's lines under the table: per exporter, alt-tvm against the faster peer, and the
    peers skipped and why."""
    lines = [describe_against_faster_peer(s, what=f"alt-tvm ({exporter})") for exporter, s in summary(rows).items()]
    reasons = {f"{peer} {note['status']}: {note['reason']}" for row in rows
               for peer, note in (row.get("peers") or {}).items() if note.get("reason")}
    return "\n".join(lines + sorted(reasons)) + ("\n" if lines or reasons else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one is not None:
        from alt_tvm.bench import quiet_tvm_pool

        quiet_tvm_pool()  # before TVM's pool starts: a spinning pool slows ONNX Runtime's turns
        if args.torchvision_src is not None and args.one.startswith("tv_"):
            # Only there: transformers reads torchvision's version, which this stand-in lacks.
            use_torchvision_source(args.torchvision_src)
        print(json.dumps(run_one(args.one, args)), flush=True)
        return 0
    names = args.names
    from alt_tvm.bench import PeakReadings
    from alt_tvm.deploy.model import use_runtime_threads

    use_runtime_threads(args.threads)  # TVM's pool is sized when its first parallel kernel runs
    # The ceiling of this run (machine states differ between days), before any model loads it.
    peaks = PeakReadings(threads=args.threads)
    print(f"FP32 FMA peak measured in this run: {peaks.measure():.0f} GFLOP/s on {args.threads} threads", flush=True)
    done = {}
    if args.resume and args.out.exists():
        done = {row["model"]: row for row in map(json.loads, args.out.read_text().splitlines()) if row}
    rows = []
    for name in names:
        if name in done:
            rows.append(add_faster_peer(done[name]))  # a row journalled before these fields gets them too
            continue
        row = run_in_child(name, args)
        rows.append(row)
        with args.out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(markdown([row]).splitlines()[-1] if "error" in row else "\n".join(markdown([row]).splitlines()[2:]),
              flush=True)
    peaks.measure()  # again at the end: one reading can land in a slow phase of the host
    for row in rows:
        add_faster_peer(row, peak_gflops=peaks.best)
    table = (f"FP32 FMA peak measured in this run: {peaks.describe()} on {args.threads} threads.\n\n"
             + markdown(rows) + "\n" + foot(rows))
    if args.markdown is not None:
        args.markdown.write_text(table)
    print(table)
    written = write_results(args.suite, {"peaks_gflops": peaks.readings, "rows": rows,
                                         "against_faster_peer": summary(rows),
                                         **({"peer_isa": args.peer_isa} if args.peer_isa else {})},
                            path=args.json or results_path(args.suite), peak_gflops=peaks.best, threads=args.threads)
    print(f"results: {written}")
    failed = [r["model"] for r in rows if "error" in r or any(
        e.get("status") != "ok" for e in r["exporters"].values())]
    if failed:
        print(f"not ok: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
