"""ONNX's backend node test cases through ``alt_tvm.build`` and through plain TVM.

onnx >= 1.23 ships the node test *definitions* (``onnx.backend.test.case.node``), not their
data files: :func:`collect_cases` regenerates them (with NumPy's global generator seeded,
since most definitions draw from it) and keeps the cases of the operators alt-tvm has
strategies or layout rules for.

Every case runs in two modes: ``"shipped"`` (every input a runtime input) and ``"frozen"``
(every input but the first an initializer, so that the strategies, which need constant
weights, lower the operator). Each (case, mode) runs through two backends: ``"tvm"``
(``from_onnx`` + ``tvm.compile`` + the Relax VM) and ``"alt"`` (``alt_tvm.build``). The
jobs run in worker subprocesses (:func:`run_jobs`), so that a segfault or a hang in TVM is
the failure of one job, not of the caller.

The rule (:func:`violations`): a case plain TVM passes must pass through alt-tvm, and
alt-tvm is never silently wrong. ``python tests/onnx_node_suite.py`` runs every case and
prints the counts per mode (:func:`main`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: ONNX operators alt-tvm has strategies, canonicalisations or layout rules for.
OPS = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "BatchNormalization", "Add", "Mul", "Sub", "Div", "Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu",
    "HardSigmoid", "HardSwish", "Erf", "Gelu", "Sqrt", "Pow", "Exp", "LayerNormalization",
    "InstanceNormalization", "Softmax", "Pad", "Concat", "Reshape", "Transpose", "Flatten", "Einsum", "Squeeze",
    "Unsqueeze", "ReduceMean",
})
MODES = ("shipped", "frozen")
BACKENDS = ("tvm", "alt")
#: dtypes a case's first input and outputs may have (alt-tvm's strategies are for floats).
FLOAT_DTYPES = frozenset({"float32", "float64"})
#: statuses of a job: ran and matched, ran and did not match, raised, killed by a signal / exited, hung
STATUSES = ("pass", "wrong", "error", "crash", "timeout")


@dataclass(frozen=True)
class Case:
    """One ONNX node test case, reduced to its first output.

    Attributes
    ----------
    name : str
        ONNX's name for it, e.g. ``"test_conv_with_strides_padding"``.
    op : str
        The node's operator.
    model : bytes
        The serialised ``ModelProto`` (only the first output kept).
    inputs, outputs : tuple of numpy.ndarray
        The data set: the graph inputs in order, and the expected first output.
    rtol, atol : float
        ONNX's tolerances for the case.
    """

    name: str
    op: str
    model: bytes
    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...]
    rtol: float
    atol: float


@dataclass(frozen=True)
class Outcome:
    """What one backend did with one (case, mode).

    ``clear`` is meaningful for errors only: False for a raw TVM error (a ``tvm`` exception
    class or a ``Check failed`` message), True for any other exception. ``fallback`` is what
    alt-tvm's ``report.failed`` says (a strategy failed and TVM lowered its partition).
    """

    status: str
    detail: str = ""
    clear: bool = True
    fallback: str = ""
    seconds: float = 0.0


# ------------------------------------------------------------------------------------- cases
@functools.lru_cache(maxsize=1)
def collect_cases() -> tuple[tuple[Case, ...], tuple[tuple[str, str], ...]]:
    """The selected cases, and ``(name, reason)`` for each case of an operator in :data:`OPS` left out.

    Only single-node cases count (ONNX's ``_expanded`` variants are other operators); a case
    is left out when an input is not a tensor or its first input or output is not float32/64.
    """
    import onnx
    from onnx.backend.test.case.node import collect_testcases

    state = np.random.get_state()
    np.random.seed(0)  # most definitions draw from the global generator; the data must not depend on the caller
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            testcases = collect_testcases()
    finally:
        np.random.set_state(state)
    cases, skipped = [], []
    for testcase in testcases:
        nodes = testcase.model.graph.node
        if len(nodes) != 1 or nodes[0].op_type not in OPS:
            continue
        inputs, outputs = testcase.data_sets[0]
        reason = _skip_reason(testcase.model, inputs, outputs)
        if reason:
            skipped.append((testcase.name, reason))
            continue
        model = onnx.ModelProto()
        model.CopyFrom(testcase.model)
        del model.graph.output[1:], model.graph.node[0].output[1:]  # the extra outputs are all optional
        cases.append(Case(testcase.name, nodes[0].op_type, model.SerializeToString(),
                          tuple(np.asarray(a) for a in inputs), (np.asarray(outputs[0]),),
                          float(testcase.rtol), float(testcase.atol)))
    return tuple(cases), tuple(skipped)


def _skip_reason(model, inputs: Sequence, outputs: Sequence) -> str:
    kinds = {i.type.WhichOneof("value") for i in model.graph.input}
    if kinds - {"tensor_type"} or not all(isinstance(a, (np.ndarray, np.generic)) for a in [*inputs, *outputs]):
        return f"non-tensor input or output ({', '.join(sorted(kinds - {'tensor_type'})) or 'not an array'})"
    dtypes = {str(np.asarray(a).dtype) for a in [*inputs[:1], outputs[0]]}
    if not dtypes <= FLOAT_DTYPES:
        return f"dtype {'/'.join(sorted(dtypes - FLOAT_DTYPES))}: not a float32/float64 case"
    return ""


def frozen_model(case: Case):
    """``case``'s model with every graph input but the first moved into an initializer."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto()
    model.ParseFromString(case.model)
    graph = model.graph
    for value_info, array in list(zip(graph.input, case.inputs))[1:]:
        graph.initializer.append(numpy_helper.from_array(array, value_info.name))
    del graph.input[1:]
    model.ir_version = max(model.ir_version, 4)  # initializers that are not inputs need IR >= 4
    return model


def jobs_for(cases: Sequence[Case], *, modes: Sequence[str] = MODES) -> list[tuple[str, str, str]]:
    """``(case name, mode, backend)`` for every job to run; one-input cases have no frozen mode
    (it would be the shipped model again)."""
    return [(case.name, mode, backend) for case in cases for mode in modes
            if mode == "shipped" or len(case.inputs) > 1 for backend in BACKENDS]


# ------------------------------------------------------------------------------------ worker
def _compare(got: Sequence[np.ndarray], case: Case) -> Outcome:
    if len(got) < len(case.outputs):
        return Outcome("wrong", f"{len(got)} outputs, expected {len(case.outputs)}")
    for index, (out, ref) in enumerate(zip(got, case.outputs)):
        out = np.asarray(out)
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return Outcome("wrong", f"output {index}: {out.dtype}{list(out.shape)}, "
                                    f"expected {ref.dtype}{list(ref.shape)}")
        if not np.allclose(out, ref, rtol=case.rtol, atol=case.atol, equal_nan=True):
            with np.errstate(all="ignore"):
                err = float(np.nanmax(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
            return Outcome("wrong", f"output {index}: max abs error {err:.3g} (rtol={case.rtol}, atol={case.atol})")
    return Outcome("pass")


def _run_tvm(model, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], str]:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(model, keep_params_in_input=False)
    target = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(np.asarray(a), tvm.cpu()) for a in inputs])
    from alt_tvm.deploy.model import flatten_outputs  # only flattens the VM's (nested) tuples

    return flatten_outputs(result), ""


def _run_alt(model, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], str]:
    import alt_tvm

    compiled = alt_tvm.build(model)
    # A strategy that fails leaves its partition to TVM (the output may still be right): say so.
    return compiled(*inputs), "; ".join(compiled.report.failed.values())


def _is_raw_tvm_error(err: BaseException) -> bool:
    module = type(err).__module__ or ""
    return module.split(".")[0] in ("tvm", "tvm_ffi") or "Check failed" in str(err)


def _run_job(case: Case, mode: str, backend: str) -> Outcome:
    import onnx

    if backend == "abort":  # self-check of the isolation: the worker dies
        os.abort()
    if backend == "hang":  # self-check of the time limit
        time.sleep(3600)
    if mode == "frozen":
        model, inputs = frozen_model(case), case.inputs[:1]
    else:
        model, inputs = onnx.load_from_string(case.model), case.inputs
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, fallback = (_run_tvm if backend == "tvm" else _run_alt)(model, inputs)
    except Exception as err:  # noqa: BLE001 - every failure is an outcome of the job
        message = (str(err).strip().splitlines() or [""])[0][:300]
        return Outcome("error", f"{type(err).__name__}: {message}", clear=not _is_raw_tvm_error(err))
    outcome = _compare(got, case)
    return Outcome(outcome.status, outcome.detail, fallback=fallback)


def _worker(jobs_path: str, results_path: str) -> None:
    """Run the pickled jobs in order, appending a ``start`` line and then a result line per job."""
    with open(jobs_path, "rb") as f:
        jobs = pickle.load(f)
    with open(results_path, "a") as out:
        for fields, mode, backend in jobs:
            case = Case(**fields)
            key = [case.name, mode, backend]
            out.write(json.dumps({"start": key}) + "\n")
            out.flush()
            begin = time.monotonic()
            outcome = dataclasses.replace(_run_job(case, mode, backend), seconds=round(time.monotonic() - begin, 3))
            out.write(json.dumps({"key": key, **vars(outcome)}) + "\n")
            out.flush()


# ------------------------------------------------------------------------------------ driver
def run_jobs(jobs: Sequence[tuple[str, str, str]], *, cases: Sequence[Case] | None = None, workers: int = 2,
             chunk: int = 40, job_timeout: float = 120.0) -> dict[tuple[str, str, str], Outcome]:
    """Run ``(case name, mode, backend)`` jobs in worker subprocesses, ``workers`` at a time.

    Parameters
    ----------
    jobs
        What to run (:func:`jobs_for`); backends ``"abort"`` and ``"hang"`` check the isolation.
    cases
        The cases the jobs name (default: :func:`collect_cases`).
    workers
        Subprocesses running at once (each runs TVM with one thread).
    chunk
        Jobs per subprocess, so that one import of TVM serves many jobs.
    job_timeout
        Seconds one job may take before its worker is killed (outcome ``"timeout"``).

    Returns
    -------
    dict
        Job -> :class:`Outcome`; a worker that dies or hangs fails only the job it was running,
        and the rest of its chunk goes on in a new worker.
    """
    by_name = {case.name: case for case in (collect_cases()[0] if cases is None else cases)}
    missing = sorted({name for name, _, _ in jobs} - set(by_name))
    if missing:
        raise ValueError(f"no such case(s): {missing}")
    chunks = [list(jobs[i:i + chunk]) for i in range(0, len(jobs), chunk)]
    results: dict[tuple[str, str, str], Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="onnx_node_suite_") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        tasks = [pool.submit(_run_chunk, part, by_name, os.path.join(tmp, str(i)), job_timeout)
                 for i, part in enumerate(chunks)]
        for task in tasks:
            results.update(task.result())
    return results


def _run_chunk(jobs: list, by_name: dict, stem: str, job_timeout: float) -> dict:
    results: dict = {}
    attempt = 0
    while jobs:
        attempt += 1
        jobs_path, results_path = f"{stem}.{attempt}.pkl", f"{stem}.{attempt}.jsonl"
        with open(jobs_path, "wb") as f:
            # plain dicts: the worker's module is not this one when this one runs as __main__
            pickle.dump([(vars(by_name[name]), mode, backend) for name, mode, backend in jobs], f)
        env = dict(os.environ, TVM_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
                f"import onnx_node_suite as s; s._worker({jobs_path!r}, {results_path!r})")
        with open(f"{stem}.{attempt}.err", "w+") as err:
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=err, env=env)
            timed_out, last, lines = False, time.monotonic(), 0
            while proc.poll() is None:
                time.sleep(0.1)
                lines_now = _read_lines(results_path)
                if len(lines_now) != lines:
                    lines, last = len(lines_now), time.monotonic()
                if time.monotonic() - last > job_timeout:
                    proc.kill()
                    proc.wait()
                    timed_out = True
            err.seek(0)
            stderr = err.read().strip().splitlines()
        done, running = set(), None
        for line in _read_lines(results_path):
            if "start" in line:
                running = tuple(line["start"])
            else:
                key = tuple(line["key"])
                results[key] = Outcome(**{k: v for k, v in line.items() if k != "key"})
                done.add(key)
                running = None
        if running is not None:
            why = f"no result within {job_timeout:.0f} s" if timed_out else \
                f"worker exited with {proc.returncode}: {stderr[-1][:200] if stderr else 'no message'}"
            results[running] = Outcome("timeout" if timed_out else "crash", why, clear=False)
            done.add(running)
        elif len(done) < len(jobs):  # died or hung outside any job (e.g. importing): fail them all
            why = f"worker started no job within {job_timeout:.0f} s" if timed_out else \
                f"worker exited with {proc.returncode} before running: {stderr[-1][:200] if stderr else ''}"
            status = "timeout" if timed_out else "crash"
            results.update({tuple(j): Outcome(status, why, clear=False) for j in jobs if tuple(j) not in done})
            return results
        jobs = [j for j in jobs if tuple(j) not in done]
    return results


def _read_lines(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


# ------------------------------------------------------------------------------------ verdict
def violations(results: dict[tuple[str, str, str], Outcome]) -> list[str]:
    """Every breach of the rule, one line each: alt-tvm fails a (case, mode) that plain TVM
    passes, alt-tvm's output is wrong (whatever TVM did), or a strategy failed on the case
    (the build then leaves its partition to TVM: right, but not what alt-tvm claims to do)."""
    out = []
    for (name, mode, backend), alt in sorted(results.items()):
        if backend != "alt":
            continue
        tvm = results.get((name, mode, "tvm"))
        if alt.status == "wrong":
            out.append(f"{name} [{mode}]: alt-tvm silently wrong: {alt.detail}")
        elif alt.status != "pass" and tvm is not None and tvm.status == "pass":
            out.append(f"{name} [{mode}]: TVM passes, alt-tvm {alt.status}: {alt.detail}")
        elif alt.fallback:
            out.append(f"{name} [{mode}]: {alt.fallback}")
    return out


def counts(results: dict[tuple[str, str, str], Outcome]) -> dict[str, dict[str, int]]:
    """Per mode: cases, TVM passes, alt-tvm passes, alt-tvm failures where TVM passes, alt-tvm
    silent wrongs, TVM silent wrongs, alt-tvm raw TVM errors or crashes, alt-tvm builds where a
    strategy failed (and TVM lowered its partition)."""
    table = {}
    for mode in MODES:
        row = dict.fromkeys(("cases", "tvm_pass", "alt_pass", "alt_fail_tvm_pass", "alt_wrong", "tvm_wrong",
                             "alt_raw_error", "alt_fallback"), 0)
        for (name, job_mode, backend), alt in results.items():
            if job_mode != mode or backend != "alt":
                continue
            tvm = results.get((name, mode, "tvm"), Outcome("error"))
            row["cases"] += 1
            row["tvm_pass"] += tvm.status == "pass"
            row["alt_pass"] += alt.status == "pass"
            row["alt_fail_tvm_pass"] += alt.status != "pass" and tvm.status == "pass"
            row["alt_wrong"] += alt.status == "wrong"
            row["tvm_wrong"] += tvm.status == "wrong"
            row["alt_raw_error"] += alt.status != "pass" and not alt.clear
            row["alt_fallback"] += bool(alt.fallback)
        table[mode] = row
    return table


def format_counts(table: dict[str, dict[str, int]]) -> str:
    """:func:`counts` as a Markdown table."""
    header = ("mode", "cases", "TVM pass", "alt-tvm pass", "alt-tvm fail, TVM pass", "alt-tvm silently wrong",
              "TVM silently wrong", "alt-tvm raw TVM error", "alt-tvm strategy failed (TVM fallback)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode, row in table.items():
        lines.append(f"| {mode} | " + " | ".join(str(v) for v in row.values()) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every selected case (or ``--cases``), print the counts and every outcome that is not
    a pass; the exit status is 1 if the rule is broken."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", help="case names (default: all selected cases)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--job-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    start = time.monotonic()
    cases, skipped = collect_cases()
    chosen = [c for c in cases if not args.cases or c.name in args.cases]
    results = run_jobs(jobs_for(chosen), cases=cases, workers=args.workers, job_timeout=args.job_timeout)
    for (name, mode, backend), outcome in sorted(results.items()):
        if outcome.status != "pass" or outcome.fallback:
            print(f"{outcome.status:8s} {backend:4s} {mode:8s} {name}: {outcome.detail} {outcome.fallback}")
    print(f"\n{len(skipped)} cases of the operators left out:")
    for name, reason in skipped:
        print(f"  {name}: {reason}")
    broken = violations(results)
    print(f"\n{format_counts(counts(results))}\n\n{len(broken)} breaches of the rule; "
          f"{time.monotonic() - start:.0f} s")
    for line in broken:
        print(f"  {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
