"""The options of a build and of a tuning run, each decided and validated in one place.

:class:`BuildOptions` is what :func:`alt_tvm.build`, :func:`alt_tvm.pipeline`,
:class:`~alt_tvm.graph.propagate.AltLayoutPass`, :func:`alt_tvm.integration.extract_tasks`
and the in-model stage share: the target, the variant, the strategies and their options,
the NaN rule and the tuning log applied. :class:`TuneOptions` is a tuning run's search
settings, with the :class:`BuildOptions` of the model being tuned and the in-model stage's
:class:`InModelConfig`. Both are frozen and validated when made, so a bad value fails with
a message naming it and what is allowed, before any work; the functions that take them
also take their fields as keywords (a thin layer making one object). Importing this module
imports no TVM: the command line can check its arguments first.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BuildOptions", "InModelConfig", "LAYOUT_LEVELS", "SCHEDULERS", "TuneOptions", "VARIANTS",
           "build_options", "tune_options"]

#: ``"alt"``: layouts propagated; ``"alt-wp"``: layouts, converted back at every partition
#: boundary; ``"alt-ol"``: loop-only (channels-last, the analytic tiles, no tuned layouts).
VARIANTS = ("alt", "alt-wp", "alt-ol")
#: The depths of the layout templates (ALT paper §5.1): one- or two-level tiling.
LAYOUT_LEVELS = (1, 2)
#: The task schedulers :func:`alt_tvm.tuning.scheduler.make_scheduler` makes by name.
SCHEDULERS = ("static", "gradient")
#: What a task's share of the trials is proportional to: its kernels' time in the untuned
#: model (one profile before the search), or how often it occurs.
SHARES = ("time", "occurrences")
#: The cost model's inputs: the lowered TIR's features, or the candidate's knob values.
FEATURES = ("tir", "knobs")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_layout_levels(value: Any) -> int:
    """``value`` if it is a layout-template depth (:data:`LAYOUT_LEVELS`), else a ValueError naming it."""
    if isinstance(value, bool) or value not in LAYOUT_LEVELS:
        raise ValueError(f"layout_levels must be 1 or 2, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class BuildOptions:
    """How a model is built: the decisions :func:`alt_tvm.build` and its relatives share.

    Attributes
    ----------
    target
        An :class:`alt_tvm.target.HardwareTarget`, a board name (``"cpu:NAME"`` for an LLVM
        CPU of this architecture), or None for this host; held resolved.
    variant
        One of :data:`VARIANTS`: ``"alt"`` (layouts propagated), ``"alt-wp"`` (layouts,
        conversions at every boundary) or ``"alt-ol"`` (loop-only, channels-last).
    strategies
        Restrict (and thereby force) the strategies used, by registered name; None: the
        registry's priority rule over every strategy that is not opt-in.
    strategy_options
        Options per strategy name (e.g. which layers ``tt_einsum`` factorises), handed to
        the strategy's ``applicable`` (``OpInfo.options``) and ``implement``
        (``context.options``); held as a dict, empty when None.
    fast_math
        False: NaN propagates through ReLU, ReLU6, clip, maximum/minimum, max pooling and
        max/min reductions, and overflow gives ``inf``, as in ONNX Runtime and PyTorch.
        True: those ops may use forms that turn NaN into a finite value (``alt_tvm.ops.ieee``).
    strict
        False: a partition whose strategy fails is left to TVM's legalization
        (``report.failed`` says why) and a kernel a later pass cannot handle is left as it
        was (``report.left_as_is``). True: the exception propagates (for developing strategies).
    records
        A tuning log (written by :func:`alt_tvm.tune`) as a path or
        :func:`alt_tvm.records.read_log`'s result; held as the log's best records for
        ``target`` (None: the strategies' analytic defaults).
    priors
        Learned defaults (:mod:`alt_tvm.priors`): where the build has no tuning log,
        ``"auto"`` applies the decisions tuning kept on this very target in the logs alt-tvm
        ships (none for a target they were not measured on); a path applies a priors file
        (``scripts/fit_priors.py`` writes one from any tuning logs), a
        :class:`~alt_tvm.priors.Priors` those decisions; None the strategies' analytic
        defaults alone. ``ALT_TVM_PRIORS=0`` turns ``"auto"`` off.

    Raises
    ------
    TypeError, ValueError
        For a value of the wrong type or out of range, naming it and what is allowed.
    FileNotFoundError
        For a ``records`` path that does not exist.
    """

    target: Any = None
    variant: str = "alt"
    strategies: Sequence[str] | None = None
    strategy_options: Mapping[str, Any] | None = None
    fast_math: bool = False
    strict: bool = False
    records: Any = None
    priors: Any = "auto"

    def __post_init__(self) -> None:
        from alt_tvm.strategies.registry import check_names, check_strategy_options
        from alt_tvm.target import resolve

        target = resolve(self.target)
        object.__setattr__(self, "target", target)
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose from {list(VARIANTS)}")
        object.__setattr__(self, "strategies", check_names(self.strategies))
        object.__setattr__(self, "strategy_options", check_strategy_options(self.strategy_options))
        _check_bool("fast_math", self.fast_math)
        _check_bool("strict", self.strict)
        object.__setattr__(self, "records", _tuning_log(self.records, target))
        _check_priors(self.priors)

    @property
    def log_path(self) -> str | None:
        """The path of the tuning log applied (None without one)."""
        return None if self.records is None else self.records.path

    @property
    def learned(self) -> Any:
        """The learned decisions this build applies (:class:`~alt_tvm.priors.Priors` of its
        target), or None: with a tuning log, or ``priors=None``, or none for this target."""
        from alt_tvm.priors import Priors, shipped_priors
        from alt_tvm.records import target_key

        if self.priors is None or (self.priors == "auto" and self.records is not None):
            return None
        priors = self.priors
        if priors == "auto":
            priors = shipped_priors()
        elif not isinstance(priors, Priors):
            priors = Priors.read(priors)
        mine = priors.for_target(target_key(self.target))
        return mine if mine.decisions else None


def _check_priors(priors: Any) -> None:
    """``priors`` is "auto", None, a priors file's path or a Priors; else a TypeError/FileNotFoundError naming it."""
    from alt_tvm.priors import Priors

    if priors is None or priors == "auto" or isinstance(priors, Priors):
        return
    if not isinstance(priors, (str, os.PathLike)):
        raise TypeError(f"priors must be 'auto', None, the path of a priors file or an alt_tvm.priors.Priors, "
                        f"got {type(priors).__name__} {priors!r}")
    if not os.path.exists(priors):
        raise FileNotFoundError(f"priors file {os.fspath(priors)!r} does not exist "
                                f"(scripts/fit_priors.py writes one from tuning logs)")


def _tuning_log(records: Any, target: Any) -> Any:
    """``records`` (a path or ``read_log``'s result) as the log to apply on ``target``."""
    from alt_tvm.records import TunedLog, read_log

    if records is None or isinstance(records, TunedLog):
        return records
    if not isinstance(records, (str, os.PathLike)):
        raise TypeError(f"records must be the path of a tuning log (or read_log's result), "
                        f"got {type(records).__name__} {records!r}")
    if not os.path.exists(records):
        raise FileNotFoundError(f"tuning log {os.fspath(records)!r} does not exist (write one with alt_tvm.tune)")
    return read_log(records, target=target)


@dataclass(frozen=True)
class InModelConfig:
    """How the in-model stage decides (:func:`alt_tvm.in_model.decide_in_model`).

    Attributes
    ----------
    finalists
        Tuned candidates per workload timed in the model: its best by the log's ranking among
        those the search measured faster than the defaults.
    alternatives
        Also time the defaults of every other exact strategy that applies to a workload
        (e.g. SConv for a convolution the ALT template lowers by default), after its finalists.
    unfused
        Also time a fused workload (a pattern with pieces: an inverted-residual block, a GEMM
        with its layer norm) built as its pieces at their defaults, after its best finalist:
        whether a fusion pays depends on the machine beyond the rule that fuses it.
    copies
        Copies of the model built to time the candidates, the defaults' copy included: a
        workload's candidates beyond it (finalists first, then alternatives) are not timed.
        Each copy is a whole build, the stage's main cost. None: one batch of builds, i.e.
        ``build_workers`` copies (at least 2; at least 3 where a fused workload's pieces are a
        candidate).
    rounds
        Interleaved rounds of per-kernel timing (each copy runs once per round).
    model_rounds
        Interleaved rounds of whole-model timing, tuned against untuned.
    margin
        Relative gain over the default a choice must show (median of the paired
        per-round ratios below ``1 - margin``); the same margin decides the model check.
        Two builds of the same model differ by up to 4% per workload in 7 rounds on a
        2-core VM, hence 3%.
    seed
        Seed of the random model inputs.
    build_workers
        Copies built at once, each in a worker process
        (:class:`~alt_tvm.graph.variants.VariantBuilder`); None: the cores this process may
        use. A copy is a whole single-threaded build, so this divides the stage's build time.
    """

    finalists: int = 2
    alternatives: bool = True
    unfused: bool = True
    rounds: int = 7
    model_rounds: int = 9
    margin: float = 0.03
    seed: int = 0
    build_workers: int | None = None
    copies: int | None = None

    def __post_init__(self) -> None:
        if self.copies is not None and (isinstance(self.copies, bool) or not isinstance(self.copies, int)
                                        or self.copies < 1):
            raise ValueError(f"InModelConfig.copies must be an int >= 1 or None, got {self.copies!r}")
        if self.build_workers is not None and (isinstance(self.build_workers, bool)
                                               or not isinstance(self.build_workers, int) or self.build_workers < 1):
            raise ValueError(f"InModelConfig.build_workers must be an int >= 1 or None, got {self.build_workers!r}")
        for name, low in (("finalists", 0), ("rounds", 1), ("model_rounds", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"InModelConfig.{name} must be an int >= {low}, got {value!r}")
        if not isinstance(self.alternatives, bool):
            raise TypeError(f"InModelConfig.alternatives must be a bool, got {self.alternatives!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int | float) or not 0 <= self.margin < 1:
            raise ValueError(f"InModelConfig.margin must be a number in [0, 1), got {self.margin!r}")


@dataclass(frozen=True)
class TuneOptions:
    """A tuning run: the search settings, the model's build options and the in-model stage.

    Attributes
    ----------
    trials
        Total measurements, spread over the tasks (an int, at least 2 per task).
    log
        JSON-lines tuning log, appended to (``alt_tvm.build(records=log)`` applies it).
    build
        The build options of the model being tuned (:class:`BuildOptions`; its ``records``
        must be None: the run writes ``log``).

    Search
        ``seed``: the search's seed (an int >= 0; task ``i`` uses ``seed + i``).
        ``joint_fraction``: share of each task's search in the joint layout+loop stage, in
        [0, 1]. ``layout_levels``: 1 or 2, the one- or two-level layout templates (ALT
        paper §5.1) for the strategies that have both. ``cost_model``: ``"xgb"`` (XGBoost),
        None, or an object with ``update`` and ``predict``. ``features``: what the cost
        model learns from, ``"tir"`` (features of each candidate's lowered TIR, ~0.1 s a
        candidate to lower) or ``"knobs"`` (the candidate's parameters; free). ``batch``,
        ``top_k``: candidates ranked by the cost model per loop round, and how many of them
        are measured (ints >= 1).
    Re-validation
        ``revalidate``, ``revalidate_rounds``: after each task, its ``revalidate`` fastest
        candidates are measured ``revalidate_rounds`` more times, interleaved, and the best
        record is chosen by the median (:func:`alt_tvm.records.choose_best`); within
        ``trials`` (at most a quarter of a task's budget). 0 turns it off.
    Scheduling
        ``scheduler``: how the tasks share ``trials``, one of :data:`SCHEDULERS` or a
        :class:`~alt_tvm.tuning.scheduler.TaskScheduler`. ``in_flight``: tasks tuned at once
        (an int >= 1; more than 1 needs a measure that runs elsewhere). ``lookahead``:
        search steps of a task sent to be built before the oldest step's results are in
        (an int >= 0; needs a batched measure). ``shares``: what a task's share of the
        trials is proportional to, one of :data:`SHARES`: ``"time"``, its kernels' time
        in the untuned model, profiled once before the search (where the model runs here,
        with ``verify``; otherwise, and with ``"occurrences"``, how often it occurs).
    Bookkeeping
        ``resume``: reuse the log's measurements of the same target (transient failures
        are measured again). ``progress``: progress bars and INFO lines. ``plot``: write a
        PNG of the tuning curves here (None: none).
    Operator kernels
        ``operators``: also tune the loop knobs of the kernels no strategy implements
        (:mod:`alt_tvm.operator_tasks`: pools, concatenations, means, element-wise chains,
        kernels TVM fused), the ones moving the most bytes first: as many as leave each
        strategy task 2 trials, at most ``trials // 8``. The tasks share ``trials`` by ``shares``.
    In-model stage
        ``verify``: after the search, decide each workload inside the whole model and
        verify the model against the untuned one (:mod:`alt_tvm.in_model`), configured by
        ``in_model`` (:class:`InModelConfig`).

    Raises
    ------
    TypeError, ValueError
        For a value of the wrong type or out of range, naming it and what is allowed.
    """

    trials: int
    log: str | os.PathLike[str]
    build: BuildOptions = field(default_factory=BuildOptions)
    seed: int = 0
    joint_fraction: float = 0.3
    layout_levels: int = 1
    cost_model: Any = "xgb"
    features: str = "tir"
    batch: int = 128
    top_k: int = 8
    revalidate: int = 3
    revalidate_rounds: int = 2
    scheduler: Any = "static"
    in_flight: int = 1
    lookahead: int = 0
    shares: str = "time"
    resume: bool = True
    progress: bool = True
    plot: str | os.PathLike[str] | None = None
    operators: bool = True
    verify: bool = True
    in_model: InModelConfig = field(default_factory=InModelConfig)

    def __post_init__(self) -> None:
        for name, minimum in (("trials", 2), ("seed", 0), ("batch", 1), ("top_k", 1), ("revalidate", 0),
                              ("revalidate_rounds", 0), ("in_flight", 1), ("lookahead", 0)):
            _check_int(name, getattr(self, name), minimum)
            object.__setattr__(self, name, int(getattr(self, name)))  # a NumPy int too, held as an int
        if not isinstance(self.log, str | os.PathLike):
            raise TypeError(f"log must be the path of a JSON-lines file, got {type(self.log).__name__} {self.log!r}")
        if not isinstance(self.build, BuildOptions):
            raise TypeError(f"build must be an alt_tvm.options.BuildOptions, got {type(self.build).__name__}")
        if self.build.records is not None:
            raise ValueError(f"build.records must be None when tuning: the run writes its log ({self.log!r}), "
                             f"got the log {self.build.records.path!r}")
        if isinstance(self.joint_fraction, bool) or not isinstance(self.joint_fraction, numbers.Real):
            raise TypeError(f"joint_fraction must be a number in [0, 1], got {self.joint_fraction!r} "
                            f"of type {type(self.joint_fraction).__name__}")
        if not 0.0 <= self.joint_fraction <= 1.0:  # NaN fails too
            raise ValueError(f"joint_fraction must be a number in [0, 1], got {self.joint_fraction!r}")
        check_layout_levels(self.layout_levels)
        if isinstance(self.cost_model, str) and self.cost_model != "xgb":
            raise ValueError(f"cost_model must be 'xgb', None or a model object, got {self.cost_model!r}")
        if self.features not in FEATURES:
            raise ValueError(f"features must be 'tir' or 'knobs', got {self.features!r}")
        if isinstance(self.scheduler, str) and self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be 'static' or 'gradient', got {self.scheduler!r}")
        if self.shares not in SHARES:
            raise ValueError(f"shares must be one of {list(SHARES)}, got {self.shares!r}")
        _check_bool("resume", self.resume)
        _check_bool("progress", self.progress)
        if self.plot is not None and not isinstance(self.plot, str | os.PathLike):
            raise TypeError(f"plot must be None or the path of a PNG file, got {type(self.plot).__name__} "
                            f"{self.plot!r}")
        _check_bool("operators", self.operators)
        _check_bool("verify", self.verify)
        if not isinstance(self.in_model, InModelConfig):
            raise TypeError(f"in_model must be an alt_tvm.options.InModelConfig, got {type(self.in_model).__name__}")


_BUILD_FIELDS = tuple(f.name for f in dataclasses.fields(BuildOptions))
_TUNE_FIELDS = tuple(f.name for f in dataclasses.fields(TuneOptions))


def build_options(options: BuildOptions | None = None, /, *, caller: str = "build", **keywords: Any) -> BuildOptions:
    """``options`` with ``keywords`` (fields of :class:`BuildOptions`) replacing its fields;
    without ``options``, the options the keywords give.

    The keyword layer of every function taking a :class:`BuildOptions`: the keywords become
    one validated object, and the function goes on with it alone.

    Raises
    ------
    TypeError
        For ``options`` that is neither a :class:`BuildOptions` nor a target (a
        ``HardwareTarget`` or its name, taken as ``target=``), or a keyword that is not a field
        (naming the ``caller`` and the fields).
    """
    from alt_tvm.target import HardwareTarget

    if isinstance(options, (str, HardwareTarget)):
        # The target alone, the one option most calls set: build(model, "cpu:haswell").
        if "target" in keywords:
            raise TypeError(f"{caller}: the target is given twice, as {options!r} and as target={keywords['target']!r}")
        options, keywords = None, {**keywords, "target": options}
    if options is not None and not isinstance(options, BuildOptions):
        raise TypeError(f"{caller}: options must be an alt_tvm.options.BuildOptions or a target (a HardwareTarget "
                        f"or its name), got {type(options).__name__} {options!r}")
    unknown = sorted(set(keywords) - set(_BUILD_FIELDS))
    if unknown:
        raise TypeError(f"{caller}: unexpected keyword(s) {unknown}; the build options are {list(_BUILD_FIELDS)}")
    if options is None:
        return BuildOptions(**keywords)
    return dataclasses.replace(options, **keywords) if keywords else options


def tune_options(options: TuneOptions | None = None, /, *, caller: str = "tune", **keywords: Any) -> TuneOptions:
    """``options`` with ``keywords`` replacing its fields; without ``options``, the options the
    keywords give. Keywords may be :class:`TuneOptions` fields or :class:`BuildOptions` fields
    (those of ``build``).

    Raises
    ------
    TypeError
        For ``options`` that is not a :class:`TuneOptions`, a keyword that is neither's field,
        a :class:`BuildOptions` field given beside ``build=``, or no ``trials`` and ``log``.
    """
    if options is not None and not isinstance(options, TuneOptions):
        raise TypeError(f"{caller}: options must be an alt_tvm.options.TuneOptions, got "
                        f"{type(options).__name__} {options!r}")
    unknown = sorted(set(keywords) - set(_TUNE_FIELDS) - set(_BUILD_FIELDS))
    if unknown:
        raise TypeError(f"{caller}: unexpected keyword(s) {unknown}; the tuning options are {list(_TUNE_FIELDS)} "
                        f"and the build options {list(_BUILD_FIELDS)}")
    build_keywords = {name: keywords.pop(name) for name in _BUILD_FIELDS if name in keywords}
    if build_keywords:
        if "build" in keywords:
            raise TypeError(f"{caller}: give the build options either as build=BuildOptions(...) or as keywords "
                            f"({sorted(build_keywords)}), not both")
        base = options.build if options is not None else None
        keywords["build"] = build_options(base, caller=caller, **build_keywords)
    if options is None:
        missing = [name for name in ("trials", "log") if name not in keywords]
        if missing:
            raise TypeError(f"{caller}: missing the tuning option(s) {missing} (or an alt_tvm.options.TuneOptions)")
        return TuneOptions(**keywords)
    return dataclasses.replace(options, **keywords) if keywords else options
