"""Benchmarking: fair timing, the peers' sessions, the machine's ceilings, and where results go.

One package that the benchmarks (``benchmarks/``), the CLI (``alt-tvm bench``) and the
in-model stage (:mod:`alt_tvm.in_model`) share, shaped like MetaSchedule's runners: a small
contract (:mod:`.base`: a :class:`Runner` names itself, runs inputs, says its threads) and
one peer per module:

- :mod:`.onnxruntime` -- ONNX Runtime's CPU session, ``threads`` intra-op threads, no spinning
- :mod:`.openvino` -- OpenVINO's CPU plugin, ``threads`` threads, latency and f32 hints (optional)
- :mod:`.torch` -- PyTorch eager in inference mode
- :mod:`.tvm` -- TVM's own untuned build of the same Relax module

:mod:`.peers` makes the CPU peers (ONNX Runtime, and OpenVINO where installed) on one thread
count and reads alt-tvm against the faster of them per model and over a run, and both against
the run's FP32 FMA peak (:class:`AtPeak`).

:mod:`.timing` holds the fair timing (the tuner's :class:`TimingPolicy`, interleaved rounds
and their medians, a quiet TVM pool), :mod:`.peak` the FP32 FMA peak and memory bandwidth,
:mod:`.results` the results' place and format, :mod:`.compare` the A/B comparison of two
builds of one model (``alt-tvm bench --compare``), :mod:`.ops` the single-operator suite's
configurations and harness, :mod:`.onnx_flops` the FLOPs of an ONNX model's nodes. Importing this package imports no
build code (the graph's frontend is imported only when an untuned TVM build is made).
"""

from .base import Runner, check_threads
from .onnxruntime import ORTRunner, onnxruntime_session
from .openvino import OpenVINORunner, openvino_available, openvino_kernel_isas, openvino_session
from .peak import PeakReadings, measure_memory_bandwidth, measure_peak_gflops
from .peers import (
    CPU_PEERS,
    INTERVAL_CONFIDENCE,
    AtPeak,
    FasterPeer,
    against_faster_peer,
    cpu_peers,
    describe_against_faster_peer,
    describe_interval,
    faster_peer,
    median_interval,
)
from .results import machine_kind, results_path, write_results
from .timing import (
    Timing,
    TimingPolicy,
    balanced_rounds,
    quiet_tvm_pool,
    round_order,
    run_interleaved,
    time_callable,
    time_compiled,
    time_interleaved,
)
from .torch import TorchRunner, torch_runner
from .tvm import TVMRunner, tvm_default_build

__all__ = ["CPU_PEERS", "INTERVAL_CONFIDENCE", "AtPeak", "FasterPeer", "ORTRunner", "OpenVINORunner", "PeakReadings",
           "Runner", "TVMRunner", "Timing", "TimingPolicy", "TorchRunner", "against_faster_peer", "balanced_rounds",
           "check_threads", "cpu_peers", "describe_against_faster_peer", "describe_interval", "faster_peer",
           "machine_kind", "measure_memory_bandwidth", "measure_peak_gflops", "median_interval",
           "onnxruntime_session", "openvino_available", "openvino_kernel_isas", "openvino_session", "quiet_tvm_pool",
           "results_path", "round_order", "run_interleaved", "time_callable", "time_compiled", "time_interleaved",
           "torch_runner", "tvm_default_build", "write_results"]
