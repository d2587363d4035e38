"""Latency with and without another process busy on one core, alt-tvm beside the CPU peers.

    python benchmarks/bench_load.py --models resnet18 mobilenet_v2 bert_tiny path/to/public.onnx ...

Per model and per TVM thread-pool setting (each in its own process, since TVM's pool reads
its settings once): alt-tvm (``alt_tvm.build``, untuned) and the CPU peers on
:data:`PEER_THREADS` threads each (:mod:`alt_tvm.bench.peers`: ONNX Runtime, spinning off, and
OpenVINO, CPU plugin with the latency hint and f32 precision, skipped with the reason where it
is not installed; each peer's outputs checked against alt-tvm's first, and one that differs is
not timed) timed in the same process in interleaved rounds (medians), first
quiet, then while a second process busy-loops in Python (:data:`BUSY_LOOP`, free to
run on any core), then quiet again. With ``--cycles N`` the quiet and busy phases alternate N
times (ending quiet) and each busy phase is set against the quiet phases on either side of it
(their geometric mean), so a host whose speed drifts during the run moves both sides of a
ratio; the table gives the median of the N ratios. ``alt-tvm`` is the model as built: its kernels on
alt-tvm's parallel launcher (``alt_tvm.deploy.parallel``), its calls sized by the thread
governor (``alt_tvm.deploy.threads``); ``alt-tvm all threads`` is the same model with the
governor off, on all threads every call; ``tvm pool`` is the same code run the way it ran
before the launcher (TVM's JIT module on TVM's thread pool, with the governor): the quiet
A/B of the launcher; ``--launcher-ab JSON`` adds the same code on a launcher with other
:class:`~alt_tvm.deploy.parallel.LauncherConfig` fields (the A/B of a launcher setting, e.g.
``'{"avoid_caller_cpu": false}'``: workers placed by the OS alone). Settings: ``default``
(TVM's pool as ``alt_tvm.build`` leaves it: polling
workers for ``POOL_SPIN_COUNT`` polls, not bound to cores since ``use_runtime_threads`` sets ``TVM_BIND_THREADS=0``),
``spin0`` (``TVM_THREAD_POOL_SPIN_COUNT=0``), ``tvmspin`` (300000: TVM's own default, which
alt-tvm's short poll replaced), ``nobind`` (``TVM_BIND_THREADS=0``), ``bind``
(``TVM_BIND_THREADS=1``, TVM's own default), ``threads1`` (``TVM_NUM_THREADS=1``). Also counts the model's
parallel kernels (each ends in a barrier of TVM's pool). alt-tvm is read against the faster peer
in the quiet and the busy phases (peer ms / alt-tvm ms, above 1: alt-tvm faster), and the run
ends, per setting and phase, with the geometric mean over the models and the models where
alt-tvm is behind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: The load: one process busy in Python, given its parent's pid as its argument, which stops
#: when that parent is gone (a worker killed mid-phase must not leave it running into the next
#: measurement).
BUSY_LOOP = ("import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n"
             "    for _ in range(100_000):\n        pass\n")

#: Threads of every peer, ONNX Runtime and OpenVINO alike.
PEER_THREADS = 2

SETTINGS = {"default": {}, "spin0": {"TVM_THREAD_POOL_SPIN_COUNT": "0"},
            "tvmspin": {"TVM_THREAD_POOL_SPIN_COUNT": "300000"}, "nobind": {"TVM_BIND_THREADS": "0"},
            "bind": {"TVM_BIND_THREADS": "1"}, "threads1": {"TVM_NUM_THREADS": "1"}}


def _parallel_kernels(mod) -> tuple[int, int]:
    """(PrimFuncs with a parallel loop, all PrimFuncs) of a built module."""
    import tvm

    parallel = total = 0
    for gvar in mod.get_global_vars():
        func = mod[gvar]
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        total += 1
        parallel += _has_parallel_loop(func)
    return parallel, total


def _has_parallel_loop(func) -> bool:
    return "T.parallel(" in func.script()  # TVM 0.27's tirx has no Python statement visitor


def _all_threads(built):
    """The same model without its thread governor, on all of its threads every call."""
    import copy

    fixed = copy.copy(built)
    fixed.thread_governor = None
    cores = built._threads

    def call(*arrays):
        if fixed._get_threads() != cores:  # the governed model may have left them at one
            fixed._set_threads(cores)
        return fixed(*arrays)

    return call


def _on_tvm_pool(built):
    """The same code as before alt-tvm's launcher: TVM's JIT module on TVM's pool, governed."""
    import copy

    from alt_tvm.deploy.threads import ThreadGovernor

    before = copy.copy(built)
    before._library, before.launcher = built.executable, None
    before._drop_vms()
    before.thread_governor = ThreadGovernor(built._threads, set_threads=before._set_threads,
                                            get_threads=before._get_threads)
    return before


def _on_launcher(built, config: dict):
    """The same code on a library linked with a launcher of another :class:`LauncherConfig`."""
    import copy

    from alt_tvm.deploy.parallel import LauncherConfig, link_and_load

    other = copy.copy(built)
    library, launcher = link_and_load(built.executable, threads=built._threads, config=LauncherConfig(**config))
    other._library = library
    other._drop_vms()
    other._use_launcher(launcher)
    return other


def phase_names(cycles: int) -> list[str]:
    """The phases of a run: quiet and busy alternating ``cycles`` times, then quiet."""
    if cycles < 1:
        raise ValueError(f"cycles must be at least 1, got {cycles}")
    return ["quiet", "busy"] * cycles + ["quiet"]


def cycle_ratios(phases: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per runner, each busy phase's time over the geometric mean of the quiet phases beside it.

    ``phases`` are the runners' times per phase in the order of :func:`phase_names`.
    """
    if len(phases) < 3 or len(phases) % 2 == 0:
        raise ValueError(f"expected quiet, busy, ..., quiet phases (an odd count >= 3), got {len(phases)}")
    return {label: [phases[i][label] / (phases[i - 1][label] * phases[i + 1][label]) ** 0.5
                    for i in range(1, len(phases), 2)]
            for label in phases[0]}


def phase_medians(phases: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Per runner, the median over the quiet phases and over the busy phases of :func:`phase_names`."""
    return tuple({label: statistics.median(p[label] for p in phases[start::2]) for label in phases[0]}
                 for start in (0, 1))


def against_peers(phases: list[dict[str, float]]) -> dict[str, dict]:
    """alt-tvm against the faster peer in the quiet and in the busy phases (their medians): per phase,
    the :class:`~alt_tvm.bench.peers.FasterPeer` fields; a phase without a peer is left out."""
    from alt_tvm.bench import faster_peer

    out = {}
    for phase, times in zip(("quiet", "busy"), phase_medians(phases)):
        against = faster_peer(times_ms=times, alt_ms=times["alt-tvm"])
        if against is not None:
            out[phase] = against.to_json()
    return out


def summaries(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """Per setting and phase, alt-tvm against the faster peer over the models of ``rows``
    (:func:`~alt_tvm.bench.peers.against_faster_peer`)."""
    from alt_tvm.bench import against_faster_peer

    ratios: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows:
        for phase, fields in (row.get("against_faster_peer") or {}).items():
            ratios.setdefault(row["setting"], {}).setdefault(phase, {})[row["model"]] = fields["ratio_vs_faster_peer"]
    return {setting: {phase: against_faster_peer(ratios=values) for phase, values in phases.items()}
            for setting, phases in ratios.items()}


def _checked_peers(path: str, built, arrays) -> tuple[dict, dict]:
    """The CPU peers on ``path``, each checked against alt-tvm's outputs
    (:func:`~alt_tvm.bench.compare.output_mismatch`): label -> runner, and label -> why for
    the peers left out (not installed, or computing something else)."""
    from alt_tvm.bench import cpu_peers
    from alt_tvm.bench.compare import output_mismatch

    made, skipped = cpu_peers(path, threads=PEER_THREADS)
    want = built(*arrays)
    for name, runner in list(made.items()):
        if (problem := output_mismatch(want, runner(*arrays))) is not None:
            skipped[name] = f"outputs differ from alt-tvm's: {problem}"
            del made[name]
    return made, skipped


def _one(model: str, rounds: int, launcher_ab: dict | None = None, cycles: int = 1) -> dict:
    """In this process (the setting is in the environment): the phases of :func:`phase_names`."""
    import alt_tvm
    from alt_tvm.bench import time_interleaved
    from alt_tvm.deploy.model import aligned
    from alt_tvm.models import MODEL_NAMES, export_onnx, get_model

    start_mask = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory() as tmp:
        if model in MODEL_NAMES:
            module, inputs = get_model(model)
            built = alt_tvm.build(module, example_inputs=inputs)
            arrays = [aligned(x.numpy()) for x in inputs]  # read in place, as random_inputs' are
            path = str(export_onnx(model, os.path.join(tmp, "m.onnx")))
        else:
            built, path = alt_tvm.build(model), model
            arrays = built.random_inputs(seed=0)
        runners = {"alt-tvm": (built, arrays)}
        peers, skipped = _checked_peers(path, built, arrays)
        runners.update({name: (peer, arrays) for name, peer in peers.items()})
        if built.thread_governor is not None:
            built(*arrays)  # links the library and installs the launcher, which drops the governor
            if built.thread_governor is not None:  # no launcher: the governed model, and without governor
                runners["alt-tvm all threads"] = (_all_threads(built), arrays)
            runners["tvm pool"] = (_on_tvm_pool(built), arrays)
            if launcher_ab is not None and built.launcher is not None:
                runners[f"launcher {json.dumps(launcher_ab)}"] = (_on_launcher(built, launcher_ab), arrays)
        row = {"parallel_kernels": _parallel_kernels(built.mod), "skipped_peers": skipped}
        phases = []
        for index, phase in enumerate(phase_names(cycles)):
            busy = None
            if phase == "busy":
                # With the mask this process started with: TVM's pool has pinned this thread to one
                # core by now, and a child would inherit that pin (and sit on our core).
                busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(os.getpid())],
                                        preexec_fn=lambda: os.sched_setaffinity(0, start_mask))
                time.sleep(0.5)
            if built.launcher is not None:
                built.launcher.stats()  # counted from here: the whole phase's calls
            try:
                timed = time_interleaved(runners, rounds=rounds, repeat=10)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            phases.append({label: ms for label, (ms, _) in timed.items()})
            # The first quiet and busy phases and the last quiet one keep the names of a one-cycle run.
            key = {0: "quiet", 1: "busy", 2 * cycles: "quiet_after"}.get(index)
            if key is None:
                continue
            row[key] = phases[-1]
            if built.launcher is not None:
                row[f"{key}_launcher"] = built.launcher.stats().__dict__
            if built.thread_governor is not None:
                row[f"{key}_governor"] = {"state": built.thread_governor.state,
                                          "switches": built.thread_governor.switches}
        row["phases"] = phases
        row["busy_over_quiet"] = {label: statistics.median(ratios)
                                  for label, ratios in cycle_ratios(phases).items()}
        row["against_faster_peer"] = against_peers(phases)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "bert_tiny"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--launcher-ab", type=json.loads, default=None, metavar="JSON",
                        help="also time the model on a launcher with these LauncherConfig fields, "
                             "e.g. '{\"park_us\": 0}' (an in-process A/B of a launcher setting)")
    parser.add_argument("--cycles", type=int, default=1,
                        help="quiet and busy phases alternate this many times (then quiet); the ratio "
                             "busy/quiet is the median over the cycles, each against the quiet phases beside it")
    parser.add_argument("--json", default=None,
                        help="write the rows here (default benchmarks/results/<machine kind>/load.json)")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.launcher_ab is not None:
        from alt_tvm.deploy.parallel import LauncherConfig

        LauncherConfig(**args.launcher_ab)  # a bad field or value fails here, not in every worker
    phase_names(args.cycles)  # a bad count fails here, not in every worker
    if args.worker:
        print(json.dumps(_one(args.worker[0], args.rounds, args.launcher_ab, args.cycles)))
        return 0
    from alt_tvm.bench.results import write_results

    rows = []
    for model in args.models:
        for setting in args.settings:
            env = {**os.environ, **SETTINGS[setting]}
            command = [sys.executable, __file__, "--rounds", str(args.rounds), "--cycles", str(args.cycles),
                       "--worker", model, setting]
            if args.launcher_ab is not None:
                command += ["--launcher-ab", json.dumps(args.launcher_ab)]
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=900 * (args.cycles + 1))
            if done.returncode != 0:
                print(f"{model}: {setting}: failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(_table(os.path.basename(model), setting, row), flush=True)
            rows.append({"model": model, "setting": setting, **row})
            # rewritten after every model and setting: an interrupted run keeps what it finished
            written = write_results("load", {"rows": rows, "against_faster_peer": summaries(rows)}, path=args.json)
    from alt_tvm.bench import describe_against_faster_peer

    for setting, phases in summaries(rows).items():
        for phase, summary in phases.items():
            print(describe_against_faster_peer(summary, what=f"alt-tvm ({setting}, {phase})"))
    if rows:
        print(f"results: {written}")
    return 0


def _table(name: str, setting: str, row: dict) -> str:
    """One model and setting: each runner quiet, busy and busy/quiet; alt-tvm against the others.

    Quiet and busy are the medians over the phases; busy/quiet is the median of the cycles' ratios.
    """
    phases = row["phases"]
    quiet, busy = phase_medians(phases)
    ratio = row["busy_over_quiet"]
    parallel, total = row["parallel_kernels"]
    cycles = len(phases) // 2
    lines = [f"{name} ({setting}; {parallel} of {total} kernels parallel; {cycles} quiet/busy cycles)",
             f"  {'runner':40s} {'quiet ms':>9s} {'busy ms':>9s} {'busy/quiet':>10s} "
             f"{'/alt-tvm quiet':>14s} {'busy':>6s}"]
    for label in quiet:
        lines.append(f"  {label[:40]:40s} {quiet[label]:9.3f} {busy[label]:9.3f} {ratio[label]:10.2f} "
                     f"{quiet[label] / quiet['alt-tvm']:14.3f} {busy[label] / busy['alt-tvm']:6.3f}")
    against = row.get("against_faster_peer") or {}
    if against:
        lines.append("  alt-tvm against the faster peer (peer ms / alt-tvm ms): " + ", ".join(
            f"{phase} {fields['faster_peer']} {fields['ratio_vs_faster_peer']:.2f}x"
            for phase, fields in against.items()))
    lines += [f"  {peer} skipped: {why}" for peer, why in (row.get("skipped_peers") or {}).items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
