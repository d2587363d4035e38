"""Latency with and without another process busy on one core, alt-tvm beside ONNX Runtime.

    python scripts/bench_load.py --models resnet18 mobilenet_v2 bert_tiny path/to/public.onnx ...

Per model and per TVM thread-pool setting (each in its own process, since TVM's pool reads
its settings once): alt-tvm (``alt_tvm.build``, untuned) and ONNX Runtime (2 intra-op
threads, spinning off) timed in the same process in interleaved rounds (medians), first
quiet, then while a second process busy-loops (``python -c "while True: pass"``, free to
run on any core), then quiet again. ``alt-tvm`` is the model as built: its kernels on
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
parallel kernels (each ends in a barrier of TVM's pool).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

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
    before._library, before.launcher, before._vm = built.executable, None, None
    before.thread_governor = ThreadGovernor(built._threads, set_threads=before._set_threads,
                                            get_threads=before._get_threads)
    return before


def _on_launcher(built, config: dict):
    """The same code on a library linked with a launcher of another :class:`LauncherConfig`."""
    import copy

    from alt_tvm.deploy.parallel import LauncherConfig, link_and_load

    other = copy.copy(built)
    library, launcher = link_and_load(built.executable, threads=built._threads, config=LauncherConfig(**config))
    other._library, other._vm = library, None
    other._use_launcher(launcher)
    return other


def _one(model: str, rounds: int, launcher_ab: dict | None = None) -> dict:
    """In this process (the setting is in the environment): the three phases."""
    import alt_tvm
    from alt_tvm.deploy.model import aligned
    from alt_tvm.graph.baselines import onnxruntime_session, time_interleaved
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
        ort = onnxruntime_session(path, threads=2)
        runners = {"alt-tvm": (built, arrays), "onnxruntime": (ort, arrays)}
        if built.thread_governor is not None:
            built(*arrays)  # links the library and installs the launcher, which drops the governor
            if built.thread_governor is not None:  # no launcher: the governed model, and without governor
                runners["alt-tvm all threads"] = (_all_threads(built), arrays)
            runners["tvm pool"] = (_on_tvm_pool(built), arrays)
            if launcher_ab is not None and built.launcher is not None:
                runners[f"launcher {json.dumps(launcher_ab)}"] = (_on_launcher(built, launcher_ab), arrays)
        row = {"parallel_kernels": _parallel_kernels(built.mod)}
        for phase in ("quiet", "busy", "quiet_after"):
            busy = None
            if phase == "busy":
                # With the mask this process started with: TVM's pool has pinned this thread to one
                # core by now, and a child would inherit that pin (and sit on our core).
                busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
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
            row[phase] = {label: ms for label, (ms, _) in timed.items()}
            if built.launcher is not None:
                row[f"{phase}_launcher"] = built.launcher.stats().__dict__
            if built.thread_governor is not None:
                row[f"{phase}_governor"] = {"state": built.thread_governor.state,
                                            "switches": built.thread_governor.switches}
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "bert_tiny"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--launcher-ab", type=json.loads, default=None, metavar="JSON",
                        help="also time the model on a launcher with these LauncherConfig fields, "
                             "e.g. '{\"park_us\": 0}' (an in-process A/B of a launcher setting)")
    parser.add_argument("--json", default=None, help="append one JSON line per model and setting here")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.launcher_ab is not None:
        from alt_tvm.deploy.parallel import LauncherConfig

        LauncherConfig(**args.launcher_ab)  # a bad field or value fails here, not in every worker
    if args.worker:
        print(json.dumps(_one(args.worker[0], args.rounds, args.launcher_ab)))
        return 0
    for model in args.models:
        for setting in args.settings:
            env = {**os.environ, **SETTINGS[setting]}
            command = [sys.executable, __file__, "--rounds", str(args.rounds), "--worker", model, setting]
            if args.launcher_ab is not None:
                command += ["--launcher-ab", json.dumps(args.launcher_ab)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode != 0:
                print(f"{model}: {setting}: failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(_table(os.path.basename(model), setting, row), flush=True)
            if args.json:
                with open(args.json, "a") as out:
                    out.write(json.dumps({"model": model, "setting": setting, **row}) + "\n")
    return 0


def _table(name: str, setting: str, row: dict) -> str:
    """One model and setting: each runner quiet, busy and busy/quiet; alt-tvm against the others."""
    quiet, busy = row["quiet"], row["busy"]
    parallel, total = row["parallel_kernels"]
    lines = [f"{name} ({setting}; {parallel} of {total} kernels parallel)",
             f"  {'runner':40s} {'quiet ms':>9s} {'busy ms':>9s} {'busy/quiet':>10s} "
             f"{'/alt-tvm quiet':>14s} {'busy':>6s}"]
    for label in quiet:
        lines.append(f"  {label[:40]:40s} {quiet[label]:9.3f} {busy[label]:9.3f} {busy[label] / quiet[label]:10.2f} "
                     f"{quiet[label] / quiet['alt-tvm']:14.3f} {busy[label] / busy['alt-tvm']:6.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
