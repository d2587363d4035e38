"""What deployment costs: build vs load time, artifact size, and latency loaded, built and on a board.

    python benchmarks/bench_deploy.py --models resnet18 mobilenet_v2 [--remote]

Per model: the build (``alt_tvm.build``, in this process), ``export``, the artifact's size, the
load in a fresh process (median of 3; ``import tvm`` excluded, ``import alt_tvm`` included),
and the latency of the built and the loaded model timed in interleaved rounds (they should
be equal: the same code). ``--remote`` also starts a TVM RPC tracker and server on loopback
(this machine as the "board") and times the artifact there through ``alt_tvm.load(remote=...)``
(``time_evaluator`` on the server: RPC round trips are not in the number).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fresh_load_s(artifact: Path) -> float:
    code = (f"import time, json, tvm\nt = time.perf_counter()\nimport alt_tvm\nm = alt_tvm.load({str(artifact)!r})\n"
            "print(json.dumps(time.perf_counter() - t))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return float(done.stdout)


def _loopback():
    """(tracker, server) processes and the tracker address; the key is 'loopback'."""
    from alt_tvm.rpc import tracker_problem
    from alt_tvm.target import host

    port, server_port = _free_port(), _free_port()
    env = {**os.environ, "TVM_NUM_THREADS": str(host().num_cores)}  # TVM's x86 default is half the CPUs
    start = lambda *a: subprocess.Popen([sys.executable, "-m", *a], stdout=subprocess.DEVNULL,  # noqa: E731
                                        stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    procs = [start("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)),
             start("tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", "loopback", "--host",
                   "127.0.0.1", "--port", str(server_port), "--port-end", str(server_port + 1))]
    deadline = time.monotonic() + 60
    while tracker_problem("127.0.0.1", port, "loopback", timeout_s=2) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError("the loopback RPC server did not register")
        time.sleep(0.5)
    return procs, f"127.0.0.1:{port}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--remote", action="store_true", help="also time on a loopback RPC server")
    parser.add_argument("--json", default=None,
                        help="write the rows here (default benchmarks/results/<machine kind>/deploy.json)")
    args = parser.parse_args(argv)

    import alt_tvm
    from alt_tvm.bench import quiet_tvm_pool, time_interleaved, write_results
    from alt_tvm.models import get_model

    quiet_tvm_pool()
    procs, address = _loopback() if args.remote else ([], None)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="alt_tvm_deploy_") as tmp:
            for name in args.models:
                module, inputs = get_model(name)
                started = time.perf_counter()
                built = alt_tvm.build(module, example_inputs=inputs)
                build_s = time.perf_counter() - started
                started = time.perf_counter()
                path = built.export(Path(tmp) / f"{name}.alt")
                export_s = time.perf_counter() - started
                size_mb = sum(p.stat().st_size for p in path.iterdir()) / 1e6
                load_s = statistics.median(_fresh_load_s(path) for _ in range(3))
                loaded = alt_tvm.load(path)
                arrays = [x.numpy() for x in inputs]
                same = all((a == b).all() for a, b in zip(built(*arrays), loaded(*arrays)))
                timed = time_interleaved({"built": (built, arrays), "loaded": (loaded, arrays)}, rounds=args.rounds)
                row = {"model": name, "build_s": build_s, "export_s": export_s, "artifact_mb": size_mb,
                       "load_s": load_s, "bit_exact": same, "built_ms": timed["built"][0],
                       "loaded_ms": timed["loaded"][0]}
                if address is not None:
                    with alt_tvm.load(path, remote=address, key="loopback") as board:
                        row["remote_ms"] = board.time(*arrays, number=10, repeat=args.rounds)[1]
                        row["remote_bit_exact"] = all((a == b).all() for a, b in zip(board(*arrays),
                                                                                      built(*arrays)))
                rows.append(row)
    finally:
        for proc in procs:
            os.killpg(proc.pid, 9)
    print(f"{'model':14s} {'build s':>8s} {'export s':>9s} {'MB':>6s} {'load s':>7s} {'built ms':>9s} "
          f"{'loaded ms':>10s} {'remote ms':>10s} exact")
    for r in rows:
        remote = f"{r['remote_ms']:10.3f}" if "remote_ms" in r else f"{'-':>10s}"
        print(f"{r['model']:14s} {r['build_s']:8.2f} {r['export_s']:9.2f} {r['artifact_mb']:6.1f} {r['load_s']:7.3f} "
              f"{r['built_ms']:9.3f} {r['loaded_ms']:10.3f} {remote} {r['bit_exact']}")
    print(f"results: {write_results('deploy', {'rows': rows}, path=args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
