"""Measure functions for the tuner built on :mod:`alt_tvm.tuning.measure`.

:func:`isolated_measure` builds in worker processes and runs in another one (a crashing
candidate cannot take the tuner down); :func:`rpc_measure` builds here — cross-compiled
for a board described in :mod:`alt_tvm.target` — and times on the board through TVM's
RPC tracker, a batch at a time on every board the tracker holds. Both return a
:class:`~alt_tvm.tuning.fleet.PipelinedMeasure`: ``measure(task, params) -> latency_ms``
for :func:`alt_tvm.tuning.driver.tune_tasks` (a failed candidate raises ``RuntimeError``
whose message starts with its :class:`~alt_tvm.tuning.measure.ErrorCode` name), which
measures a loop round's candidates as one batch.
"""

from __future__ import annotations

from alt_tvm.rpc import count_servers, tracker_problem
from alt_tvm.target import HardwareTarget, process_cores

from .fleet import PipelinedMeasure
from .measure import LocalBuilder, LocalRunner, RPCRunner


def isolated_measure(*, target: HardwareTarget, number: int = 10, repeat: int = 3, timeout_s: float = 30.0,
                     build_workers: int | None = None) -> PipelinedMeasure:
    """Build in a process pool and time in a separate process on this machine (its GPU for a CUDA target).

    A batch of candidates is built ``build_workers`` at a time (default: this machine's
    cores), then timed one at a time once the whole batch is built: a build beside a timed
    run disturbs the timing (3.8x on 2 cores in the fleet benchmark).
    """
    gpu = _is_gpu(target)
    build_workers = build_workers or process_cores()
    runner = LocalRunner(number=number, repeat=repeat, timeout_s=timeout_s, device="cuda" if gpu else "cpu",
                         num_cores=None if gpu else target.num_cores)
    builder = LocalBuilder(target=target, timeout_s=timeout_s, n_parallel=build_workers)
    return PipelinedMeasure(builder=builder, runner=runner, build_workers=build_workers, overlap=False)


def _is_gpu(target: HardwareTarget) -> bool:
    return target.to_tvm().kind.name == "cuda"


def rpc_measure(*, tracker_host: str, tracker_port: int, key: str, target: HardwareTarget, number: int = 10,
                repeat: int = 3, timeout_s: float = 30.0, build_workers: int | None = None,
                boards: int | None = None) -> PipelinedMeasure:
    """Cross-build for ``target`` and time on the boards registered as ``key`` with the tracker.

    Batches of candidates are built ``build_workers`` at a time (default: this machine's
    cores) and run on ``boards`` boards at once (default: every server the tracker holds for
    ``key`` now), each run started as soon as its build is done
    (:class:`~alt_tvm.tuning.fleet.PipelinedMeasure`).

    Raises
    ------
    ConnectionError
        At once, if the tracker cannot be reached or no board with ``key`` is registered.
    """
    gpu = _is_gpu(target)
    why = tracker_problem(tracker_host, tracker_port, key)
    if why is not None:
        raise ConnectionError(why)
    if boards is None:
        boards = max(1, count_servers(tracker_host, tracker_port, key))
    build_workers = build_workers or process_cores()
    runner = RPCRunner(tracker_host=tracker_host, tracker_port=tracker_port, key=key, number=number,
                       repeat=repeat, timeout_s=timeout_s, device="cuda" if gpu else "cpu",
                       threads=None if gpu else target.num_cores, n_parallel=boards)
    builder = LocalBuilder(target=target, timeout_s=timeout_s, n_parallel=build_workers)
    return PipelinedMeasure(builder=builder, runner=runner, build_workers=build_workers, boards=boards)
