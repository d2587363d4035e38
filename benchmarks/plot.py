"""Plot the benchmark results kept under ``benchmarks/results/<machine kind>/<suite>.json``.

Usage::

    python benchmarks/plot.py [--results benchmarks/results]

Writes ``<suite>.png`` beside every ``<suite>.json`` whose suite it knows how to plot and says
which it skipped. Every ratio is drawn so that above 1 means alt-tvm is faster: a peer's time
divided by alt-tvm's time, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Ratios = dict[str, dict[str, float]]
#: Model -> series -> ``(low, high)``: a ratio's interval where the results give one.
Intervals = dict[str, dict[str, tuple[float, float]]]
"""Model (or layer) -> series name -> ratio; above 1 means alt-tvm is faster."""


def load_results(*, path: str) -> Any:
    """Read one results file.

    Parameters
    ----------
    path
        A ``<suite>.json`` file (a JSON list or object).

    Returns
    -------
    The run's results: the file's ``"results"`` where it is written by
    ``alt_tvm.bench.results.write_results`` (beside the machine's facts), else the whole value.
    """
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and "suite" in data and "results" in data:
        return data["results"]
    return data


def _rows(data: Any) -> Sequence[Mapping[str, Any]]:
    """A list of rows, whether the results are the list itself or hold it under ``"rows"``."""
    if isinstance(data, Mapping):
        return data.get("rows", [])
    return data


def short_model_name(*, model: str) -> str:
    """The model's name without folder, extension or the sweep's source prefix.

    Parameters
    ----------
    model
        A model name or path, e.g. ``models/sweep/tv_resnet18.onnx``.
    """
    name = os.path.splitext(os.path.basename(model))[0]
    for prefix in ("tv_", "hf_", "timm_", "nn_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def suite_ratios(*, rows: Sequence[Mapping[str, Any]], intervals: Intervals | None = None) -> Ratios:
    """Peer time over alt-tvm time per model, from the suite scripts' rows.

    Each row has ``model`` and ``ms``: runner -> median ms, where alt-tvm's runners are
    named ``alt-tvm <exporter>``. Every peer is divided by every alt-tvm runner; where the row's
    export entry names the faster peer (``ratio_vs_faster_peer``), that ratio is a series too.

    Parameters
    ----------
    rows
        The rows of ``cnn_suite``, ``transformers`` or ``public_sweep``.
    intervals
        Filled with the faster-peer series' ``ratio_interval`` where an entry has one.
    """
    out: Ratios = {}
    for row in rows:
        ms = row.get("ms") or {}
        alts = {k: v for k, v in ms.items() if k.startswith("alt-tvm") and v}
        peers = {k: v for k, v in ms.items() if not k.startswith("alt-tvm") and v}
        series: dict[str, float] = {}
        for alt_name, alt_ms in alts.items():
            exporter = alt_name[len("alt-tvm"):].strip()
            suffix = f" ({exporter})" if len(alts) > 1 else ""
            for peer, peer_ms in peers.items():
                series[f"{peer} / alt-tvm{suffix}"] = peer_ms / alt_ms
            entry = (row.get("exporters") or {}).get(exporter, {})
            if entry.get("ratio_vs_faster_peer"):
                series[f"faster peer / alt-tvm{suffix}"] = entry["ratio_vs_faster_peer"]
                _add_interval(intervals, row["model"], f"faster peer / alt-tvm{suffix}", entry)
        if series:
            out[short_model_name(model=row["model"])] = series
    return out


def _add_interval(intervals: Intervals | None, model: str, series: str, row: Mapping[str, Any]) -> None:
    if intervals is not None and row.get("ratio_interval"):
        low, high = row["ratio_interval"]
        intervals.setdefault(short_model_name(model=model), {})[series] = (float(low), float(high))


def runner_ratios(*, rows: Sequence[Mapping[str, Any]], intervals: Intervals | None = None) -> Ratios:
    """Every runner's median time over alt-tvm's per model, from ``bench_e2e``-style rows.

    The reference is ``alt-tvm (alt, tuned)`` where a model has it, else ``alt-tvm (alt)``,
    else the first ``alt-tvm`` runner; rows without ``median_ms`` (the peak, tuning times)
    are left out. Where the reference's row names the faster peer (``ratio_vs_faster_peer``),
    that ratio is a series too.

    Parameters
    ----------
    rows
        Rows with ``model``, ``runner`` and ``median_ms``.
    intervals
        Filled with the faster-peer series' ``ratio_interval`` where the reference's row has one.
    """
    by_model: dict[str, dict[str, float]] = {}
    faster: dict[str, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        if "model" not in row or not row.get("median_ms"):
            continue
        by_model.setdefault(row["model"], {})[row["runner"]] = float(row["median_ms"])
        if row.get("ratio_vs_faster_peer"):
            faster.setdefault(row["model"], {})[row["runner"]] = row
    out: Ratios = {}
    for model, times in by_model.items():
        alts = [r for r in times if r.startswith("alt-tvm")]
        if not alts:
            continue
        ref = next((r for r in ("alt-tvm (alt, tuned)", "alt-tvm (alt)") if r in times), alts[0])
        series = {f"{runner} / {ref}": ms / times[ref] for runner, ms in times.items() if runner != ref}
        if ref in faster.get(model, {}):
            series[f"faster peer / {ref}"] = float(faster[model][ref]["ratio_vs_faster_peer"])
            _add_interval(intervals, model, f"faster peer / {ref}", faster[model][ref])
        out[short_model_name(model=model)] = series
    return out


def gpu_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Peer time over tuned alt-tvm time per layer, from ``bench_gpu``'s rows.

    Parameters
    ----------
    data
        The ``gpu`` suite: ``{"device": ..., "rows": [...]}``.
    """
    out: Ratios = {}
    for row in data["rows"]:
        alt = row.get("alt_tuned_ms")
        if not alt:
            continue
        series = {}
        for key, label in (("cudnn_fp32_ms", "cuDNN FP32"), ("ms_tuned_ms", "MetaSchedule tuned"),
                           ("alt_default_ms", "alt-tvm untuned")):
            if row.get(key):
                series[f"{label} / alt-tvm tuned"] = row[key] / alt
        out[row["layer"]] = series
    return out


def gpu_model_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Peer time over alt-tvm's time per model and batch, from ``bench_gpu_models``'s rows.

    Parameters
    ----------
    data
        The ``gpu_models`` suite: ``{"env": ..., "rows": [...]}``.
    """
    out: Ratios = {}
    for row in data["rows"]:
        ms = row.get("ms", {})
        alt = ms.get("alt-tvm")
        if not alt or not row.get("ok"):
            continue
        out[f"{short_model_name(model=row['model'])} b{row['batch']}"] = {
            f"{peer} / alt-tvm": ms[peer] / alt for peer in ("pytorch fp32", "pytorch tf32", "ort-cuda fp32")
            if ms.get(peer)}
    return out


def ops_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Peer time over tuned alt-tvm kernel time per operator configuration (``bench_ops``).

    MetaSchedule's time is its best layout's.

    Parameters
    ----------
    data
        The ``ops`` suite: ``{"rows": [...], ...}``.
    """
    out: Ratios = {}
    for row in data["rows"]:
        alt = row.get("alt_kernel_ms")
        if not alt:
            continue
        cfg = row["config"]
        name = f"{cfg['family']} b{cfg.get('batch', 1)}"
        series = {}
        ms_times = [v for v in (row.get("ms_ms") or {}).values() if v]
        if ms_times:
            series["MetaSchedule / alt-tvm"] = min(ms_times) / alt
        if row.get("torch_ms"):
            series["PyTorch / alt-tvm"] = row["torch_ms"] / alt
        out[name] = series
    return out


def load_ratios(*, rows: Sequence[Mapping[str, Any]]) -> Ratios:
    """Latency beside one busy process over quiet latency, per model and runner (``bench_load``).

    Here lower is better (1 = the busy process costs nothing).

    Parameters
    ----------
    rows
        Rows with ``model``, ``setting``, ``quiet`` and ``busy`` (runner -> ms).
    """
    out: Ratios = {}
    for row in rows:
        if row.get("setting", "default") != "default":
            continue
        quiet, busy = row.get("quiet") or {}, row.get("busy") or {}
        out[row["model"]] = {r: busy[r] / quiet[r] for r in quiet if busy.get(r) and quiet[r]}
    return out


def r18_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Time of each layout over the tiled layout's on the ResNet-18 first layer.

    Parameters
    ----------
    data
        The ``r18_first_layer`` suite: ``{"results": [{"variant", "ratio_to_tiled"}, ...]}``.
    """
    return {r["variant"]: {"time / tiled": r["ratio_to_tiled"]} for r in data["results"]}


def lookahead_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Best time found with the search a round ahead over without, per layer and seed.

    Parameters
    ----------
    data
        The ``lookahead`` suite: ``{"rows": [{"layer", "seed", "ratio"}, ...]}``.
    """
    return {f"{r['layer']} s{r['seed']}": {"lookahead 1 / lookahead 0": r["ratio"]} for r in data["rows"]}


def vta_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Geometric-mean simulated speed-up of the CP-SAT mapping over the static one, per layer kind.

    Parameters
    ----------
    data
        The ``vta`` suite: ``{"layers": [...], "summary": {intrinsic: {...}}}``.
    """
    out: Ratios = {}
    for intrinsic, summary in data["summary"].items():
        for kind in ("standard", "low-channel", "depthwise", "dilated"):
            if isinstance(summary.get(kind), dict):
                out.setdefault(kind, {})[f"{intrinsic} static / CP-SAT"] = summary[kind]["geomean_speedup"]
    return out


def sconv_ratios(*, data: Mapping[str, Any]) -> Ratios:
    """Geometric-mean speed-up of SConv over im2col + sgemm and over PyTorch, per model and threads.

    Parameters
    ----------
    data
        The ``sconv`` suite: ``{"threads_1": [...], "threads_2": [...]}``.
    """
    out: Ratios = {}
    for threads_key, rows in data.items():
        groups: dict[str, dict[str, list[float]]] = {}
        for row in rows:
            for key, label in (("speedup_vs_base", "im2col+sgemm / SConv"), ("speedup_vs_torch", "PyTorch / SConv")):
                if row.get(key):
                    per_model = groups.setdefault(row.get("model", "?"), {})
                    per_model.setdefault(f"{label}, {threads_key}", []).append(row[key])
        for model, series in groups.items():
            for label, values in series.items():
                out.setdefault(model, {})[label] = math.exp(sum(math.log(v) for v in values) / len(values))
    return out


def fleet_lines(*, data: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Share of linear scaling against the number of simulated boards, per setting (``bench_fleet``).

    Parameters
    ----------
    data
        The ``fleet`` suite: ``simulation`` (and ``simulation_lookahead_1``) with rows per board count.
    """
    lines: dict[str, list[tuple[float, float]]] = {}
    for key in ("simulation", "simulation_lookahead_1"):
        for row in (data.get(key) or {}).get("rows", []):
            for setting, value in row.items():
                if isinstance(value, dict) and "of_linear" in value:
                    lines.setdefault(setting.replace("_", " "), []).append((row["boards"], value["of_linear"]))
    return lines


def bar_chart(*, ratios: Ratios, title: str, ylabel: str, path: str, log_scale: bool = False,
              intervals: Intervals | None = None) -> None:
    """Draw grouped bars, one group per model, one bar per series, with a line at 1, and a
    whisker over each bar that has an interval (a ratio's, from the rounds' paired ratios).

    Parameters
    ----------
    ratios
        Model -> series -> value.
    title, ylabel
        Text of the chart.
    path
        The PNG to write.
    log_scale
        A logarithmic value axis (for ratios spanning orders of magnitude).
    intervals
        Model -> series -> ``(low, high)``, for the bars that have one.
    """
    models = list(ratios)
    series = sorted({s for v in ratios.values() for s in v})
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(models) * max(1, len(series)) + 2), 4.5))
    for i, name in enumerate(series):
        xs = [m + (i - (len(series) - 1) / 2) * width for m in range(len(models))]
        ax.bar(xs, [ratios[m].get(name, 0.0) for m in models], width, label=name)
        spans = [(x, (intervals or {}).get(m, {}).get(name)) for x, m in zip(xs, models)]
        spans = [(x, span) for x, span in spans if span is not None]
        if spans:
            ax.vlines([x for x, _ in spans], [lo for _, (lo, _) in spans], [hi for _, (_, hi) in spans],
                      color="black", linewidth=1.2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, rotation=40, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log_scale:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def line_chart(*, lines: Mapping[str, Sequence[tuple[float, float]]], title: str, xlabel: str,
               ylabel: str, path: str) -> None:
    """Draw one line per series.

    Parameters
    ----------
    lines
        Series -> (x, y) points.
    title, xlabel, ylabel
        Text of the chart.
    path
        The PNG to write.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, points in lines.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_FASTER = "peer time / alt-tvm time (above 1: alt-tvm faster)"
_RUNNER = "runner time / alt-tvm time"

# suite -> (data -> values, chart kind, title, axis label, log scale)
def _suite(data: Any, intervals: Intervals) -> Ratios:
    return suite_ratios(rows=_rows(data), intervals=intervals)


def _runners(data: Any, intervals: Intervals) -> Ratios:
    return runner_ratios(rows=_rows(data), intervals=intervals)


#: Suite -> (extract(data, intervals to fill), chart kind, title, value label, log scale).
_PLOTS: dict[str, tuple[Callable[[Any, Intervals], Any], str, str, str, bool]] = {
    "cnn_suite": (_suite, "bar", "CNNs, untuned", _FASTER, False),
    "transformers": (_suite, "bar", "Transformers, untuned", _FASTER, False),
    "public_sweep": (_suite, "bar", "Public architectures, untuned", _FASTER, False),
    "cnn_tuned": (_runners, "bar", "CNNs, tuned", _RUNNER, False),
    "transformers_tuned": (_runners, "bar", "Transformers, tuned",
                           _RUNNER, False),
    "public_tuned": (_runners, "bar", "Public architectures, tuned", _RUNNER, False),
    "e2e": (_runners, "bar", "Whole models, untuned", _RUNNER, True),
    "e2e_tuned": (_runners, "bar", "Whole models, tuned", _RUNNER, True),
    "e2e_sconv": (_runners, "bar", "ResNet-18 through SConv",
                  _RUNNER, False),
    "gpu": (lambda d, _: gpu_ratios(data=d), "bar", "ResNet-18 layers on the GPU", _FASTER, False),
    "gpu_models": (lambda d, _: gpu_model_ratios(data=d), "bar", "Whole models on the GPU, untuned", _FASTER, True),
    "ops": (lambda d, _: ops_ratios(data=d), "bar", "Operators, tuned (ALT paper §7.1)", _FASTER, True),
    "load": (lambda d, _: load_ratios(rows=_rows(d)), "bar", "Beside one busy process",
             "busy latency / quiet latency (lower is better)", False),
    "r18_first_layer": (lambda d, _: r18_ratios(data=d), "bar", "ResNet-18 first layer, one schedule, four layouts",
                        "time / tiled layout's time", True),
    "lookahead": (lambda d, _: lookahead_ratios(data=d), "bar", "Search quality a round ahead",
                  "best ms with lookahead / without (below 1: better)", False),
    "vta": (lambda d, _: vta_ratios(data=d), "bar", "VTA mappings, simulated cycles", "static cycles / CP-SAT cycles",
            True),
    "sconv": (lambda d, _: sconv_ratios(data=d), "bar", "SConv per model (geometric mean over its convs)",
              "time / SConv time", False),
    "fleet": (lambda d, _: fleet_lines(data=d), "line", "Tuning on simulated boards", "share of linear scaling", False),
}


def plot_suite(*, path: str) -> str | None:
    """Plot one results file beside itself.

    Parameters
    ----------
    path
        ``.../<machine kind>/<suite>.json``.

    Returns
    -------
    The PNG written, or None when the suite has no plot here.
    """
    suite = os.path.splitext(os.path.basename(path))[0]
    if suite not in _PLOTS:
        return None
    extract, kind, title, label, log_scale = _PLOTS[suite]
    machine_kind = os.path.basename(os.path.dirname(path))
    intervals: Intervals = {}
    values = extract(load_results(path=path), intervals)
    if not values:
        return None
    out = os.path.splitext(path)[0] + ".png"
    full_title = f"{title} ({machine_kind})"
    if kind == "line":
        line_chart(lines=values, title=full_title, xlabel="boards", ylabel=label, path=out)
    else:
        bar_chart(ratios=values, title=full_title, ylabel=label, path=out, log_scale=log_scale, intervals=intervals)
    return out


def plot_all(*, results: str) -> tuple[list[str], list[str]]:
    """Plot every ``<machine kind>/<suite>.json`` under ``results``.

    Parameters
    ----------
    results
        The results folder.

    Returns
    -------
    The PNGs written and the JSON files skipped.
    """
    if not os.path.isdir(results):
        raise FileNotFoundError(f"results folder {results!r} does not exist")
    written, skipped = [], []
    for kind in sorted(os.listdir(results)):
        folder = os.path.join(results, kind)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json"):
                continue
            path = os.path.join(folder, name)
            png = plot_suite(path=path)
            (written if png else skipped).append(png or path)
    return written, skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                        help="the results folder (default: benchmarks/results)")
    args = parser.parse_args(argv)
    try:
        written, skipped = plot_all(results=args.results)
    except FileNotFoundError as error:
        parser.error(str(error))
    for png in written:
        print(f"wrote {png}")
    for path in skipped:
        print(f"skipped {path}: no plot for this suite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
