"""The ALT paper's §7.1 single-operator suite on this machine, all baselines measured in this run.

Nine operator families (C2D, GRP, DEP, DIL, C3D, C1D, GMM, T2D, T3D); configurations are
drawn with a fixed seed from ranges sized for a 2-core CPU (the paper's: batch 1–16,
input channels 3–1280, 10 per family, 1000 trials). For every configuration, at the same
number of **measured trials**:

* alt-tvm: ``alt_tvm.tune`` of the one-operator model (joint layout + loop stage, then
  loop-only), the best record lowered and timed as a kernel (its input/weight/output in the
  tuned layouts, as inside a model where layouts propagate), plus the whole one-op model
  built from the log (with the layout conversions at its boundary, through the VM);
* TVM MetaSchedule (``tvm.s_tir.meta_schedule``, Ansor's successor) on the same operator in
  NCHW-style and channels-last layouts (the paper reports the best layout for tuners), each
  with the same trial budget;
* PyTorch (oneDNN) and TVM's untuned build of the canonical kernel.

Every kernel is checked against PyTorch before it is timed. Speedups are geometric means
per family and overall. Each configuration's kernels are timed together right after it is
tuned (three interleaved rounds, median), and the JSON is rewritten after every
configuration, so an interrupted run keeps what it finished.

    python scripts/bench_ops.py [--trials 24] [--per-family 1] [--families C2D DEP ...]
                                [--threads 2] [--seed 0] [--json docs/bench_ops.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

FAMILIES = ("C2D", "GRP", "DEP", "DIL", "C3D", "C1D", "GMM", "T2D", "T3D")


@dataclass(frozen=True)
class OpConfig:
    """One operator configuration: ``family`` and its shape parameters."""

    family: str
    batch: int
    in_channels: int
    out_channels: int
    spatial: tuple[int, ...]  # input spatial extents; GMM: (M,) rows, in_channels = K, out_channels = N
    kernel: int = 1
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1

    @property
    def rank(self) -> int:
        return len(self.spatial)

    def describe(self) -> str:
        if self.family == "GMM":
            return f"M={self.batch * self.spatial[0]} K={self.in_channels} N={self.out_channels}"
        size = "x".join(map(str, self.spatial))
        extra = "".join([f" s{self.stride}" if self.stride > 1 else "", f" d{self.dilation}" if self.dilation > 1
                         else "", f" g{self.groups}" if self.groups > 1 else ""])
        return f"b{self.batch} {self.in_channels}->{self.out_channels} {size} k{self.kernel} p{self.padding}{extra}"


def out_spatial(cfg: OpConfig) -> tuple[int, ...]:
    k_eff = cfg.dilation * (cfg.kernel - 1) + 1
    if cfg.family in ("T2D", "T3D"):
        return tuple((s - 1) * cfg.stride - 2 * cfg.padding + k_eff for s in cfg.spatial)
    return tuple((s + 2 * cfg.padding - k_eff) // cfg.stride + 1 for s in cfg.spatial)


def flops(cfg: OpConfig) -> float:
    if cfg.family == "GMM":
        return 2.0 * cfg.batch * cfg.spatial[0] * cfg.in_channels * cfg.out_channels
    if cfg.family in ("T2D", "T3D"):  # every input point scatters into a kernel window
        points = cfg.batch * math.prod(cfg.spatial)
        return 2.0 * points * cfg.in_channels * (cfg.out_channels // cfg.groups) * cfg.kernel ** cfg.rank
    points = cfg.batch * math.prod(out_spatial(cfg))
    return 2.0 * points * cfg.out_channels * (cfg.in_channels // cfg.groups) * cfg.kernel ** cfg.rank


def draw_configs(*, families, per_family: int, seed: int) -> list[OpConfig]:
    """``per_family`` configurations per family, drawn reproducibly, 5 MFLOP .. 1.5 GFLOP each."""
    import numpy as np

    configs = []
    for family in families:
        # One generator per family: a family's configurations do not depend on which others run.
        rng = np.random.default_rng([seed, FAMILIES.index(family)])
        pick = lambda xs, rng=rng: xs[int(rng.integers(len(xs)))]  # noqa: E731
        found = 0
        while found < per_family:
            batch = pick([1, 1, 2])
            cin, cout = pick([3, 16, 32, 64, 128, 256]), pick([16, 32, 64, 128, 256])
            if family in ("C2D", "DIL", "GRP"):
                kernel = pick([1, 3, 3, 5]) if family == "C2D" else 3
                size = pick([7, 14, 28, 56])
                stride = pick([1, 1, 2]) if family != "DIL" else 1
                dilation = 2 if family == "DIL" else 1
                groups = pick([2, 4, 8]) if family == "GRP" else 1
                if family == "GRP":
                    cin, cout = pick([32, 64, 128, 256]), pick([32, 64, 128, 256])
                cfg = OpConfig(family, batch, cin, cout, (size, size), kernel, stride,
                               dilation * (kernel // 2), dilation, groups)
            elif family == "DEP":
                channels, kernel = pick([32, 64, 96, 144, 256, 512]), pick([3, 3, 5])
                size = pick([7, 14, 28, 56, 112])
                cfg = OpConfig(family, batch, channels, channels, (size, size), kernel, pick([1, 1, 2]),
                               kernel // 2, 1, channels)
            elif family == "C3D":
                kernel, size, depth = 3, pick([14, 28, 56]), pick([4, 8, 16])
                cfg = OpConfig(family, batch, pick([3, 16, 32, 64]), pick([16, 32, 64]), (depth, size, size),
                               kernel, pick([1, 1, 2]), 1)
            elif family == "C1D":
                kernel = pick([3, 5, 7])
                cfg = OpConfig(family, batch, cin, cout, (pick([64, 128, 256, 512, 1024]),), kernel,
                               pick([1, 1, 2]), kernel // 2)
            elif family == "GMM":
                cfg = OpConfig(family, 1, pick([256, 512, 768, 1024]), pick([256, 512, 768, 1024]),
                               (pick([1, 16, 64, 128, 256]),))
            elif family == "T2D":
                cfg = OpConfig(family, batch, pick([16, 32, 64, 128]), pick([16, 32, 64]),
                               (pick([7, 14, 28]),) * 2, pick([3, 4]), 2, 1)
            elif family == "T3D":
                cfg = OpConfig(family, batch, pick([16, 32, 64]), pick([16, 32]),
                               (pick([4, 8]), pick([7, 14]), pick([7, 14])), pick([3, 4]), 2, 1)
            else:
                raise SystemExit(f"unknown family {family!r}; choose from {list(FAMILIES)}")
            if family == "GRP" and (cfg.in_channels % cfg.groups or cfg.out_channels % cfg.groups):
                continue
            if 5e6 <= flops(cfg) <= 1.5e9 and min(out_spatial(cfg)) >= 1 and cfg not in configs:
                configs.append(cfg)
                found += 1
    return configs


def torch_module(cfg: OpConfig, seed: int):
    """The one-operator PyTorch model and its input."""
    import torch

    torch.manual_seed(seed)
    kw = dict(kernel_size=cfg.kernel, stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation,
              groups=cfg.groups, bias=False)
    if cfg.family == "GMM":
        module = torch.nn.Linear(cfg.in_channels, cfg.out_channels, bias=False)
        x = torch.randn(cfg.batch * cfg.spatial[0], cfg.in_channels)
    else:
        cls = {"C1D": torch.nn.Conv1d, "C3D": torch.nn.Conv3d, "T2D": torch.nn.ConvTranspose2d,
               "T3D": torch.nn.ConvTranspose3d}.get(cfg.family, torch.nn.Conv2d)
        module = cls(cfg.in_channels, cfg.out_channels, **kw)
        x = torch.randn(cfg.batch, cfg.in_channels, *cfg.spatial)
    return module.eval(), x


def canonical_kernel(cfg: OpConfig, weight_shape, *, channels_last: bool):
    """The operator as TVM users write it (``alt_tvm.ops``), NCHW-style or channels-last."""
    from tvm import te

    from alt_tvm import ops
    from alt_tvm.layout import create_prim_func
    from alt_tvm.layout.templates import channels_last as cl
    from alt_tvm.layout.templates import weight_channels_last

    if cfg.family == "GMM":
        data = te.placeholder((cfg.batch * cfg.spatial[0], cfg.in_channels), name="data")
        weight = te.placeholder(tuple(weight_shape), name="weight")
        out = ops.dense(data, weight)
        return create_prim_func([data, weight, out], layouts={}), {}
    data = te.placeholder((cfg.batch, cfg.in_channels, *cfg.spatial), name="data")
    weight = te.placeholder(tuple(weight_shape), name="weight")
    kw = dict(stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation, groups=cfg.groups)
    fn = {"C1D": ops.conv1d, "C3D": ops.conv3d, "T2D": ops.conv_transpose2d,
          "T3D": ops.conv_transpose3d}.get(cfg.family, ops.conv2d)
    out = fn(data, weight, **kw)
    if not channels_last:
        return create_prim_func([data, weight, out], layouts={}), {}
    shape = lambda t: tuple(int(s) for s in t.shape)  # noqa: E731
    layouts = {data: cl(shape(data)), out: cl(shape(out)), weight: weight_channels_last(shape(weight))}
    source = out.op.input_tensors[0]  # the pad / dilate stage between data and the window reads
    if isinstance(source.op, te.ComputeOp):
        layouts[source] = cl(shape(source))
    return create_prim_func([data, weight, out], layouts=layouts), {"data": layouts[data], "weight": layouts[weight],
                                                                     "out": layouts[out]}


@dataclass
class Row:
    """One configuration's measurements (ms) and tuning wall times (s)."""

    config: OpConfig
    gflop: float
    torch_ms: float = math.nan
    tvm_untuned_ms: float = math.nan
    ms_ms: dict = field(default_factory=dict)  # layout -> best kernel ms
    ms_tune_s: dict = field(default_factory=dict)
    alt_kernel_ms: float = math.nan
    alt_default_ms: float = math.nan
    alt_model_ms: float = math.nan
    alt_tune_s: float = math.nan
    alt_params: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)

    @property
    def ms_best_ms(self) -> float:
        good = [v for v in self.ms_ms.values() if math.isfinite(v)]
        return min(good) if good else math.nan


def geomean(values) -> float:
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--per-family", type=int, default=1, help="configurations per family")
    parser.add_argument("--trials", type=int, default=24, help="measured trials per operator, for each tuner")
    parser.add_argument("--joint-fraction", type=float, default=0.3, help="alt-tvm's joint-stage share (paper 0.3)")
    parser.add_argument("--ms-layouts", nargs="+", default=["nchw", "nhwc"], choices=["nchw", "nhwc"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per kernel per timing round")
    parser.add_argument("--skip-ms", action="store_true", help="skip MetaSchedule (e.g. for a quick run)")
    parser.add_argument("--log-dir", default=None,
                        help="keep alt-tvm's logs and MetaSchedule's databases here (default: temporary)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--report", nargs="+", default=None, metavar="JSON",
                        help="only print the tables of earlier runs' JSON files (a later file's row replaces an "
                             "earlier row of the same configuration, e.g. a re-measurement)")
    args = parser.parse_args(argv)
    for name in ("per_family", "trials", "threads", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        return _report_files(args.report)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import torch
    import tvm

    from alt_tvm.graph.build import build
    from alt_tvm.integration import extract_tasks, tune
    from alt_tvm.records import best_params
    from alt_tvm.target import host
    from alt_tvm.timing import measure_peak_gflops
    from alt_tvm.tuning.task import measure_in_process

    torch.set_num_threads(args.threads)
    machine = host()
    target = machine.to_tvm()
    dev = tvm.cpu()
    configs = draw_configs(families=args.families, per_family=args.per_family, seed=args.seed)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="alt_bench_ops_")
    os.makedirs(log_dir, exist_ok=True)
    rows: list[Row] = []
    ms_import_s = 0.0
    peak = measure_peak_gflops(threads=args.threads)
    print(f"measured FP32 peak: {peak:.0f} GFLOP/s on {args.threads} thread(s)", flush=True)
    for index, cfg in enumerate(configs):
        kernels = []  # (row, label, callable timing it), timed once this configuration is tuned
        row = Row(cfg, flops(cfg) / 1e9)
        rows.append(row)
        print(f"[{index + 1}/{len(configs)}] {cfg.family} {cfg.describe()} ({row.gflop:.3f} GFLOP)", flush=True)
        module, x = torch_module(cfg, args.seed + index)
        with torch.no_grad():
            reference = module(x).numpy()
        weight = module.weight.detach().numpy()
        kernels.append((row, "torch", _torch_timer(module, x, args.repeat)))

        # alt-tvm: tune the one-op model, then lower the best record as a kernel.
        log = os.path.join(log_dir, f"{index:02d}_{cfg.family}.jsonl")
        if os.path.exists(log):
            os.remove(log)
        start = time.perf_counter()
        model, example = _importable(module, x, os.path.join(log_dir, f"{index:02d}_{cfg.family}.onnx"))
        tune(model, trials=args.trials, log=log, example_inputs=example, seed=args.seed,
             joint_fraction=args.joint_fraction, progress=False)
        row.alt_tune_s = time.perf_counter() - start
        tasks = extract_tasks(model, target=machine, example_inputs=example)
        if len(tasks) != 1:
            raise SystemExit(f"{cfg.describe()}: expected one tunable task, got {len(tasks)}")
        task = tasks[0]
        row.alt_params = best_params(log, target=machine).get(task.key, {})
        compiled = build(model, example_inputs=example, records=log)
        error = _rel_error(compiled(x.numpy())[0], reference)
        if error > 1e-3:
            row.errors.append(f"alt-tvm model differs from PyTorch: relative error {error:.2e}")
        else:
            kernels.append((row, "alt_kernel", _task_timer(measure_in_process, task, row.alt_params, args.repeat)))
            kernels.append((row, "alt_default", _task_timer(measure_in_process, task, None, args.repeat)))
            kernels.append((row, "alt_model", _model_timer(compiled, x.numpy(), args.repeat)))

        # TVM untuned and MetaSchedule on the canonical kernel (and channels-last).
        func, _ = canonical_kernel(cfg, weight.shape, channels_last=False)
        untuned = tvm.compile(func, target=target)
        data_nd, weight_nd = x.numpy(), weight
        args_nd = [tvm.runtime.tensor(a, dev) for a in (data_nd, weight_nd)]
        args_nd.append(tvm.runtime.tensor(np.zeros(reference.shape, "float32"), dev))
        untuned["main"](*args_nd)
        if _rel_error(args_nd[-1].numpy(), reference) > 1e-3:
            row.errors.append("TVM untuned kernel differs from PyTorch")
        kernels.append((row, "tvm_untuned", _kernel_timer(untuned.mod, args_nd, number=1, repeat=2)))
        if not args.skip_ms:
            for layout in args.ms_layouts:
                if cfg.family == "GMM" and layout == "nhwc":
                    continue
                work_dir = os.path.join(log_dir, f"{index:02d}_{cfg.family}_ms_{layout}")
                ms_ms = _metaschedule(cfg, weight, data_nd, reference, layout=layout, target=target, work_dir=work_dir,
                                      trials=args.trials, seed=args.seed, row=row)
                if ms_ms is not None:
                    timer, tune_s, import_s = ms_ms
                    row.ms_tune_s[layout] = tune_s
                    ms_import_s = max(ms_import_s, import_s)
                    kernels.append((row, f"ms_{layout}", timer))

        # Time this configuration's kernels back to back (all tuned), in rounds, median per kernel.
        samples: dict = {}
        for _ in range(3):
            for _row, label, timer in kernels:
                samples.setdefault(label, []).append(timer())
        for label, values in samples.items():
            value = float(np.median(values))
            if label == "torch":
                row.torch_ms = value
            elif label == "tvm_untuned":
                row.tvm_untuned_ms = value
            elif label.startswith("ms_"):
                row.ms_ms[label[3:]] = value
            else:
                setattr(row, f"{label}_ms", value)
        print(f"    torch {row.torch_ms:.3f} ms | MS {row.ms_ms} | alt {row.alt_kernel_ms:.3f} ms "
              f"(default {row.alt_default_ms:.3f}, with conversions {row.alt_model_ms:.3f})", flush=True)
        if args.json:  # rewritten after every configuration: an interrupted run keeps what it finished
            _write_json(args.json, rows, args, peak, ms_import_s, machine)
    _report(rows, args, peak, ms_import_s)
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any(r.errors for r in rows) else 0


def _write_json(path, rows, args, peak, ms_import_s, machine) -> None:
    with open(path, "w") as fh:
        json.dump({"date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:], "threads": args.threads,
                   "trials": args.trials, "peak_gflops": peak, "ms_import_s": ms_import_s,
                   "machine": {"name": machine.name, "cores": machine.num_cores, "l1d": machine.l1d_bytes,
                               "l2": machine.l2_bytes},
                   "rows": [dict(asdict(r), ms_best_ms=r.ms_best_ms) for r in rows]}, fh, indent=1, default=str)


def _importable(module, x, onnx_path: str):
    """``(model, example_inputs)`` for alt-tvm: the torch module, or its ONNX export where TVM's
    PyTorch frontend lacks the operator (ConvTranspose3d in TVM 0.27)."""
    import torch

    from alt_tvm.graph.frontend import ModelImportError, load_model

    try:
        load_model(module, example_inputs=(x,))
        return module, (x,)
    except ModelImportError:
        torch.onnx.export(module, (x,), onnx_path, dynamo=False)
        return onnx_path, None


def _rel_error(got, want) -> float:
    import numpy as np

    return float(np.abs(got - want).max() / max(1e-6, float(np.abs(want).max())))


def _torch_timer(module, x, repeat: int):
    import torch

    from alt_tvm.graph.baselines import time_callable

    def run() -> float:
        with torch.no_grad():
            return time_callable(module, [x], repeat=repeat)[0]
    return run


def _model_timer(compiled, x, repeat: int):
    return lambda: compiled.time(x, number=5, repeat=repeat)[0]


def _task_timer(measure, task, params, repeat: int):
    return lambda: measure(task, params, number=5, repeat=repeat)


def _kernel_timer(lib, args_nd, *, number: int, repeat: int):
    import numpy as np
    import tvm

    def run() -> float:
        evaluator = lib.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
        return float(np.median(evaluator(*args_nd).results) * 1e3)
    return run


def _metaschedule(cfg, weight, data, reference, *, layout: str, target, trials: int, seed: int, row: Row,
                  work_dir: str):
    """Tune the canonical (or channels-last) kernel; a timer for the best, or None with the error noted."""
    import numpy as np
    import tvm

    from alt_tvm.graph.metaschedule import tune_kernel

    func, layouts = canonical_kernel(cfg, weight.shape, channels_last=layout == "nhwc")
    shutil.rmtree(work_dir, ignore_errors=True)  # a fresh search, its database kept for inspection
    result = tune_kernel(func, target=target, trials=trials, seed=seed, work_dir=work_dir)
    if result.artifact is None:
        row.errors.append(f"MetaSchedule ({layout}) found no valid schedule in {trials} trials")
        return None
    lib = tvm.compile(result.artifact, target=target)
    dev = tvm.cpu()
    data_in = layouts["data"].apply(data) if layouts else data
    weight_in = layouts["weight"].apply(weight) if layouts else weight
    out_shape = layouts["out"].shape if layouts else reference.shape
    args_nd = [tvm.runtime.tensor(np.ascontiguousarray(a, dtype="float32"), dev) for a in (data_in, weight_in)]
    args_nd.append(tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev))
    lib["main"](*args_nd)
    out = layouts["out"].inverse_apply(args_nd[-1].numpy()) if layouts else args_nd[-1].numpy()
    error = _rel_error(out, reference)
    if error > 1e-3:
        row.errors.append(f"MetaSchedule ({layout}) kernel differs from PyTorch: relative error {error:.2e}")
        return None
    return _kernel_timer(lib.mod, args_nd, number=5, repeat=20), result.tune_s, result.import_s


def _report(rows: list[Row], args, peak: float, ms_import_s: float) -> None:
    header = (f"{'family':6} {'configuration':38} {'GFLOP':>7} {'torch':>8} {'tvm-unt':>9} {'MS':>8} "
              f"{'alt-def':>8} {'alt':>8} {'alt+cvt':>8} {'vsMS':>6} {'vsTorch':>7} {'alt%pk':>6}")
    print("\n" + header)
    for r in rows:
        alt = r.alt_kernel_ms
        print(f"{r.config.family:6} {r.config.describe()[:38]:38} {r.gflop:7.3f} {r.torch_ms:8.3f} "
              f"{r.tvm_untuned_ms:9.2f} {r.ms_best_ms:8.3f} {r.alt_default_ms:8.3f} {alt:8.3f} "
              f"{r.alt_model_ms:8.3f} {r.ms_best_ms / alt:6.2f} {r.torch_ms / alt:7.2f} "
              f"{100 * r.gflop / (alt / 1e3) / peak:5.0f}%")
        for error in r.errors:
            print(f"    ! {error}")
    print(f"\ngeometric-mean speedup of alt-tvm (tuned kernel) — {args.trials} trials each, {args.threads} threads, "
          f"measured peak {peak:.0f} GFLOP/s")
    print(f"{'family':8} {'vs MS':>7} {'vs torch':>9} {'vs TVM-untuned':>15} {'vs alt-default':>15} "
          f"{'vs MS (incl. cvt)':>18}")
    groups = {}
    for r in rows:
        groups.setdefault(r.config.family, []).append(r)
    groups["overall"] = rows
    for name, group in groups.items():
        print(f"{name:8} {geomean([r.ms_best_ms / r.alt_kernel_ms for r in group]):7.2f} "
              f"{geomean([r.torch_ms / r.alt_kernel_ms for r in group]):9.2f} "
              f"{geomean([r.tvm_untuned_ms / r.alt_kernel_ms for r in group]):15.1f} "
              f"{geomean([r.alt_default_ms / r.alt_kernel_ms for r in group]):15.2f} "
              f"{geomean([r.ms_best_ms / r.alt_model_ms for r in group]):18.2f}")
    alt_s = sum(r.alt_tune_s for r in rows)
    ms_s = sum(sum(r.ms_tune_s.values()) for r in rows)
    print(f"\ntuning wall time: alt-tvm {alt_s:.0f} s, MetaSchedule {ms_s:.0f} s "
          f"(+ {ms_import_s:.0f} s one-time intrinsic import)")


def _report_files(paths) -> int:
    """Merge the rows of earlier runs and print their tables (no measuring)."""
    merged: dict = {}
    meta = None
    for path in paths:
        with open(path) as fh:
            run = json.load(fh)
        meta = meta or run
        for raw in run["rows"]:
            cfg = dict(raw["config"])
            cfg["spatial"] = tuple(cfg["spatial"])
            raw = {k: v for k, v in raw.items() if k not in ("config", "ms_best_ms")}
            row = Row(OpConfig(**cfg), **raw)
            merged[row.config] = row
    args = argparse.Namespace(trials=meta["trials"], threads=meta["threads"])
    _report(list(merged.values()), args, meta["peak_gflops"], meta["ms_import_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
