"""Shared test helpers: the host LLVM target and a build-and-run helper for TE tensors."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import platform
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tvm
from tvm import te

from alt_tvm.target import HardwareTarget, describe_cpu, host, not_on_host

#: The x86 instruction sets the kernel tests build for, as LLVM CPUs: AVX2 with FMA (16 vector
#: registers of 8 floats) and AVX-512 (32 of 16). Code for either runs on any host that has its
#: features (an AVX-512 machine runs both), whatever this machine's own CPU is.
X86_CPUS = {"avx2": "haswell", "avx512": "skylake-avx512"}


# Tests pin their expectations to the strategies' rules, on any machine kind: the learned
# defaults that ship for some targets (alt_tvm.priors) are tested with explicit priors.
os.environ.setdefault("ALT_TVM_PRIORS", "0")

# torchvision's Python model code (installed without its pinned torch) loads beside this torch
# once its meta registrations of compiled ops are skipped; transformers imports it when present.
sys.modules.setdefault("torchvision._meta_registrations", ModuleType("torchvision._meta_registrations"))


@functools.lru_cache(maxsize=1)
def host_target() -> tvm.target.Target:
    """LLVM target for this machine as :func:`alt_tvm.target.host` describes it (its CPU, or the
    one ``ALT_TVM_HOST_CPU`` names; cores from the affinity mask)."""
    return host().to_tvm()


def x86_description(isa: str) -> HardwareTarget:
    """This machine described as the :data:`X86_CPUS` CPU of ``isa`` (skips on a non-x86 host)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"the {isa} description is an x86 CPU; this machine is {platform.machine()}")
    return describe_cpu(X86_CPUS[isa])


def runnable(target: HardwareTarget) -> HardwareTarget:
    """``target``, or a skip naming the features this machine lacks to run its code."""
    why = not_on_host(target.tvm_target)
    if why is not None:
        pytest.skip(f"built for {target.name}, which cannot run here: {why}")
    return target


@pytest.fixture(params=sorted(X86_CPUS))
def x86_target(request) -> HardwareTarget:
    """Each x86 description of :data:`X86_CPUS` in turn (build-only checks: no need to run)."""
    return x86_description(request.param)


@pytest.fixture(params=sorted(X86_CPUS))
def x86_runnable(request) -> HardwareTarget:
    """Each x86 description this machine can run the code of (AVX2 on every x86-64 machine of
    the last decade; AVX-512 skipped, with the reason, where the host lacks it)."""
    return runnable(x86_description(request.param))


@pytest.fixture(scope="session")
def llvm_target() -> tvm.target.Target:
    """The host LLVM target."""
    return host_target()


def build_and_run(
    tensors_in: Sequence[te.Tensor],
    tensors_out: Sequence[te.Tensor],
    inputs_np: Sequence[np.ndarray],
    target: tvm.target.Target | None = None,
) -> list[np.ndarray]:
    """Compile ``tensors_in -> tensors_out`` as one PrimFunc (no schedule) and run it on CPU.

    Outputs are allocated with the shapes and dtypes of ``tensors_out`` and returned as NumPy.
    """
    func = te.create_prim_func([*tensors_in, *tensors_out])
    rt = tvm.compile(tvm.IRModule({"main": func}), target=target or host_target())
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs_np]
    outs = [tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], dtype=str(t.dtype)), dev) for t in tensors_out]
    rt["main"](*args, *outs)
    return [o.numpy() for o in outs]


@contextlib.contextmanager
def build_messages() -> Iterator[list[str]]:
    """Collect what a build says: its Python warnings and the ``alt_tvm`` logger's records (INFO and up)."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("alt_tvm")
    handler, level = _Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    messages.extend(str(w.message) for w in caught)


def torch_to_onnx(model, inputs: tuple, path, *, dynamo: bool) -> None:
    """``model`` exported to ONNX at ``path`` by one of PyTorch's two exporters (TorchScript at
    opset 17, or dynamo), their warnings silenced."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(model, inputs, str(path), dynamo=True)
        else:
            torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17)


def one_record_log(log: Path, task, params: dict, *, target=None) -> str:
    """A tuning log at ``log`` holding one record of ``params`` for ``task`` on ``target`` (a
    HardwareTarget; default the host); its path."""
    from alt_tvm.records import RecordWriter, TuningRecord, target_key
    with RecordWriter(log) as writer:
        writer.write(TuningRecord(workload_key=task.key, target=target_key((target or host()).to_tvm()),
                                  candidate={"layout": {}, "loop": {}, "params": params}, latencies_ms=(1.0,)))
    return str(log)


def load_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` or ``scripts/<name>.py`` imported as module ``name`` (registered
    in ``sys.modules``: a script's dataclasses resolve their string annotations through it)."""
    root = Path(__file__).resolve().parents[1]
    path = next(p for folder in ("benchmarks", "scripts") if (p := root / folder / f"{name}.py").is_file())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def unpinned() -> None:
    """``preexec_fn`` for a child process: the CPU mask this process started with.

    Once a TVM kernel has run here, TVM's pool has pinned the main thread to one core, and
    a child would inherit that mask (and detect a one-core host, another target).
    """
    import alt_tvm.target

    os.sched_setaffinity(0, alt_tvm.target._AFFINITY_AT_IMPORT)


@pytest.fixture(scope="module")
def loopback():
    """A TVM RPC tracker with one server on 127.0.0.1 (:class:`rpc_loopback.Loopback`), one per test module.

    Starting one takes ~20 s here, so a module's tests share it: its server runs TVM with one
    thread (what the tests of that warning need), and a test that kills it comes last in its module.
    """
    from rpc_loopback import start_loopback

    try:
        loop = start_loopback(server_threads=1)
    except RuntimeError as err:
        pytest.fail(str(err))
    try:
        yield loop
    finally:
        loop.close()


#: Tests that took 10 s or more in the default run on a 2-vCPU machine and whose path another
#: default test also covers: they run with the slow ones (``make test-all``), which keeps the
#: default run within CI's budget.
SLOW_IN_DEFAULT_RUN = frozenset({
    "tests/test_cli_deploy.py::test_reference_logs_apply_here_or_say_they_are_for_another_target",
    "tests/test_cli_deploy.py::test_a_clean_python_build_of_resnet18_prints_nothing",
    "tests/test_fleet.py::test_three_boards_behind_one_tracker_each_run_candidates_and_a_killed_one_costs_only_its_own",
    "tests/test_fleet.py::test_the_cli_tunes_on_every_board_reports_each_and_sizes_the_rest",
    "tests/test_e2e_models.py::test_reference_model_matches_onnxruntime[mobilenet_v2-alt]",
    "tests/test_models.py::test_torch_import_tvm_build_matches_ort[mobilenet_v2]",
    "tests/test_tuning_driver.py::test_tuning_through_isolated_workers_writes_real_latencies",
    "tests/test_block_space.py::test_every_knob_changes_the_kernel_and_random_points_compute_the_same_block[short]",
    "tests/test_e2e_models.py::test_reference_model_matches_onnxruntime[resnet3d_18-alt]",
    "tests/test_tt_dse.py::test_script_json_and_outputs",
    "tests/test_exporters.py::test_every_exporter_builds_to_the_same_partitions_and_outputs[resnet]",
    "tests/test_onnx_node_suite.py::test_a_worker_that_dies_or_hangs_fails_only_the_job_it_was_running",
    "tests/test_tt_einsum.py::test_chain_matches_dense_tt_layer[ins0-outs0-8-1-True]",
    "tests/test_models.py::test_onnx_import_tvm_build_matches_ort[mobilenet_v2]",
    "tests/test_alt_conv.py::test_convs_and_a_block_in_tiles_of_one_and_a_half_vectors_match_pytorch[True]",
    "tests/test_exporters.py::test_every_exporter_builds_to_the_same_partitions_and_outputs[vit]",
    "tests/test_tuning_cost_model.py::test_model_ranks_held_out_measured_variants",
    "tests/test_block_space.py::test_every_knob_changes_the_kernel_and_random_points_compute_the_same_block[stem]",
    "tests/test_cli.py::test_tune_with_build_workers_builds_batches_in_workers_and_times_them_here",
    "tests/test_e2e_models.py::test_reference_model_matches_onnxruntime[resnet18-alt-ol]",
    "tests/test_onnx_node_suite.py::test_the_selection_covers_every_operator_and_gives_a_reason_for_each_case_left_out",
    "tests/test_e2e_models.py::test_reference_model_matches_onnxruntime[resnet18-alt-wp]",
    "tests/test_block_fusion.py::test_a_short_tail_that_fails_is_lowered_as_two_kernels",
    "tests/test_build_records.py::test_a_log_that_does_not_apply_says_why[other-tvm]",
    "tests/test_onnx_fold.py::test_public_swin_builds_where_tvms_importer_alone_fails",
    "tests/test_tt_strategy.py::test_budget_picks_the_cheapest_solution_within_the_error",
    "tests/test_tuning_measure.py::test_build_and_run_timeouts",
    "tests/test_scheduler.py::test_two_tasks_in_flight_overlap_their_batches_and_log_everything",
    "tests/test_measure_flush.py::test_local_runner_worker_flushes_and_runs_the_models_thread_count",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW_IN_DEFAULT_RUN:
            item.add_marker(pytest.mark.slow)


def check_space(task, *, points: int = 4, seed: int = 0, loop_knobs: bool = True) -> None:
    """Assert that ``task``'s tuning space starts at the untuned kernel, that each layout knob's
    second choice (with the nearest loop knobs) and, with ``loop_knobs``, each loop knob's second
    choice gives another kernel, and that ``points`` random valid points compute what the
    untuned kernel computes (on random activations)."""
    space = task.space
    assert space.check(*space.default()) is None
    assert str(task.lower(space.params(*space.default())).func) == str(task.lower(None).func)
    rng = np.random.default_rng(seed)
    lowered = task.lower(None)
    acts = [np.asarray(rng.standard_normal(lowered.conversions[i].orig_shape if i in lowered.conversions else shape),
                       dtype="float32")
            for i, (shape, _) in enumerate(lowered.arg_specs[:-1]) if i not in lowered.constants]

    def run(params):
        point = task.lower(params)
        return point.run(tvm.compile(point.func, task.target.to_tvm())["main"], acts, tvm.cpu()), str(point.func)

    ref, default_ir = run(None)
    layout, loop = space.default()
    for knob in space.layout_knobs:
        other = next((c for c in knob.choices if c != layout[knob.name]), None)
        if other is not None:
            moved = {**layout, knob.name: other}
            nearest = {k.name: k for k in space.loop_knobs(moved)}
            point = space.params(moved, {k: nearest[k].nearest(v) for k, v in loop.items() if k in nearest})
            assert str(task.lower(point).func) != default_ir, knob.name
    for knob in space.loop_knobs(layout) if loop_knobs else ():
        other = next((c for c in knob.choices if c != loop[knob.name]), None)
        if other is not None and space.check(layout, {**loop, knob.name: other}) is None:
            assert str(task.lower(space.params(layout, {**loop, knob.name: other})).func) != default_ir, knob.name
    checked = 0
    for _ in range(10 * points):
        layout = {k.name: k.choices[int(rng.integers(len(k.choices)))] for k in space.layout_knobs}
        loop = space.random_loop(layout, rng)
        if space.check(layout, loop) is None:
            out, _ = run(space.params(layout, loop))
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=f"{layout} {loop}")
            checked += 1
        if checked == points:
            break
    assert checked == points


def block_net():
    """A stem conv, then an inverted-residual block (expand 1x1, depthwise 3x3, project 1x1,
    residual add): the smallest model with a fused block and a partition beside it."""
    import torch

    class BlockNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.expand = torch.nn.Conv2d(16, 64, 1)
            self.dw = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)
            self.project = torch.nn.Conv2d(64, 16, 1)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            return x + self.project(torch.relu(self.dw(torch.relu(self.expand(x)))))

    return BlockNet().eval()
