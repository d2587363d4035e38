"""The tuner's XGBoost cost model (ALT §5.2.3): predicts which candidates are fast, trained online.

The tuner samples a batch of candidates (128 by default), extracts their program
features (:mod:`alt_tvm.tuning.features`), asks :meth:`XGBCostModel.rank` for the top-k
(8 by default), measures only those, and feeds the latencies back with
:meth:`XGBCostModel.update`.

What the model predicts, and why
--------------------------------
A regression (``reg:squarederror``) of the score ``log(best_latency / latency)`` of
each measurement, where ``best_latency`` is the fastest finite measurement of the same
workload (group) seen so far. Higher is faster; the best is 0.

* Logarithm: latencies of candidates span orders of magnitude (a bad layout is 30x
  slower); on a linear scale the error of the slow ones would drown the differences
  between the fast ones that the tuner must tell apart, and a ratio is what "faster"
  means.
* Per-workload normalisation (as Ansor and MetaSchedule normalise throughput per task):
  one model serves every workload of a model; without it a small conv's candidates
  would all look better than a large conv's. The targets are recomputed from the raw
  latencies at every refit, so a new best re-scores the old data.
* A regressor rather than a pairwise ranker: with the few dozen measurements of an
  early tuning run, it uses every sample's magnitude (a 30x-slow candidate is much worse,
  not just worse), and its predictions are comparable across batches.

Failed measurements (``inf`` or ``nan`` latency: build error, timeout, wrong result) get
the worst score of their group minus ``XGBParams.failure_margin``, so the model learns
to avoid what broke. They are re-scored at each refit too.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb

__all__ = ["XGBCostModel", "XGBParams", "scores_from_latencies"]

#: Version of the file written by :meth:`XGBCostModel.save`.
FORMAT_VERSION = 1
_DEFAULT_GROUP = ""


@dataclass(frozen=True)
class XGBParams:
    """Booster settings of :class:`XGBCostModel`.

    ``nthread`` defaults to 1: the data are small (hundreds to thousands of rows), the
    machine is shared with the measurements, and one thread is bit-for-bit reproducible.
    """

    max_depth: int = 6
    eta: float = 0.2
    num_rounds: int = 200
    min_child_weight: float = 1.0
    subsample: float = 1.0
    colsample_bytree: float = 1.0
    gamma: float = 0.0
    reg_lambda: float = 1.0
    nthread: int = 1
    failure_margin: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_depth", "num_rounds", "nthread"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"XGBParams.{name} must be a positive int, got {value!r}")
        for name in ("eta", "subsample", "colsample_bytree"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"XGBParams.{name} must be in (0, 1], got {value!r}")
        for name in ("min_child_weight", "gamma", "reg_lambda", "failure_margin"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"XGBParams.{name} must be >= 0, got {value!r}")

    def booster_params(self, seed: int) -> dict[str, Any]:
        """The ``xgboost.train`` parameter dict."""
        return {
            "objective": "reg:squarederror", "tree_method": "hist", "max_depth": self.max_depth,
            "eta": self.eta, "min_child_weight": self.min_child_weight, "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree, "gamma": self.gamma, "lambda": self.reg_lambda,
            "nthread": self.nthread, "seed": seed, "verbosity": 0,
        }


def scores_from_latencies(latencies_ms: np.ndarray, groups: Sequence[str], *,
                          failure_margin: float = 1.0) -> np.ndarray:
    """Training targets: ``log(best / latency)`` per group; failures get the group's worst minus a margin.

    Parameters
    ----------
    latencies_ms : numpy.ndarray
        Positive latencies, ``inf``/``nan`` for failed measurements.
    groups : sequence of str
        Workload key of each latency; scores are relative within a key.
    failure_margin : float
        How far (in natural-log units, 1.0 = e times slower) below the group's slowest
        success a failure is scored.

    Returns
    -------
    numpy.ndarray
        ``float64`` scores, ``<= 0``; 0 is the best of its group.
    """
    latencies = np.asarray(latencies_ms, dtype=np.float64)
    groups = np.asarray(list(groups), dtype=object)
    scores = np.empty_like(latencies)
    for key in dict.fromkeys(groups.tolist()):
        mask = groups == key
        lat = latencies[mask]
        ok = np.isfinite(lat)
        group_scores = np.empty_like(lat)
        if ok.any():
            group_scores[ok] = np.log(lat[ok].min() / lat[ok])
            worst = group_scores[ok].min()
        else:
            worst = 0.0
        group_scores[~ok] = worst - failure_margin
        scores[mask] = group_scores
    return scores


class XGBCostModel:
    """XGBoost regressor on program features; higher predicted score = faster.

    Parameters
    ----------
    seed : int
        Seed of the booster (row/column subsampling); with the same seed, data and
        ``XGBParams`` two models predict identically.
    params : XGBParams, optional
        Booster settings; defaults to ``XGBParams()``.

    Notes
    -----
    Each :meth:`update` appends to the training data and refits from scratch on all of
    it: the data stay small (one row per measurement), a full refit costs well under a
    second, and unlike boosting more rounds onto the old booster it lets re-scored old
    rows (a new best, see :func:`scores_from_latencies`) take effect.
    """

    def __init__(self, *, seed: int = 0, params: XGBParams | None = None) -> None:
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if params is not None and not isinstance(params, XGBParams):
            raise ValueError(f"params must be an XGBParams, got {type(params).__name__}")
        self.seed = int(seed)
        self.params = params or XGBParams()
        self._features = np.zeros((0, 0), dtype=np.float64)
        self._latencies = np.zeros(0, dtype=np.float64)
        self._groups: list[str] = []
        self._booster: xgb.Booster | None = None

    # -- data -----------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Measurements the model has been trained on."""
        return int(self._latencies.shape[0])

    @property
    def num_features(self) -> int | None:
        """Feature vector length, fixed by the first :meth:`update` (``None`` before)."""
        return int(self._features.shape[1]) if self.num_samples else None

    @property
    def is_trained(self) -> bool:
        """Whether a booster has been fit."""
        return self._booster is not None

    def training_data(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Copies of the accumulated features, latencies (ms, ``inf`` = failed) and groups."""
        return self._features.copy(), self._latencies.copy(), list(self._groups)

    # -- learning ---------------------------------------------------------------------

    def update(self, features: np.ndarray, latencies_ms: np.ndarray, *,
               groups: Sequence[str] | str | None = None) -> None:
        """Add measurements and refit.

        Parameters
        ----------
        features : numpy.ndarray
            ``(n, d)`` feature vectors (``d`` fixed across calls).
        latencies_ms : numpy.ndarray
            ``(n,)`` measured latencies; ``inf`` or ``nan`` for a failed measurement.
        groups : sequence of str or str, optional
            Workload key per row (or one key for all rows); scores are normalised per key.
            Default: one shared group.

        Raises
        ------
        ValueError
            On mismatched shapes, a changed feature length, infinite features (NaN is a
            missing value, as for XGBoost), or a latency that is zero or negative.
        """
        x = self._check_features(features, "update")
        lat = np.asarray(latencies_ms, dtype=np.float64).reshape(-1) if np.ndim(latencies_ms) else None
        if lat is None or lat.shape[0] != x.shape[0]:
            raise ValueError(f"update: latencies_ms must have one entry per feature row ({x.shape[0]}), "
                             f"got shape {np.shape(latencies_ms)}")
        bad = np.isfinite(lat) & (lat <= 0)
        if bad.any():
            raise ValueError(f"update: latencies must be > 0 (or inf/nan for failures); "
                             f"row {int(np.argmax(bad))} is {lat[bad][0]}")
        lat = np.where(np.isnan(lat), np.inf, lat)  # one marker for failures
        if groups is None or isinstance(groups, str):
            keys = [groups or _DEFAULT_GROUP] * x.shape[0]
        else:
            keys = [str(g) for g in groups]
            if len(keys) != x.shape[0]:
                raise ValueError(f"update: groups must have one entry per feature row ({x.shape[0]}), "
                                 f"got {len(keys)}")
        if x.shape[0] == 0:
            return
        self._features = x if self.num_samples == 0 else np.vstack([self._features, x])
        self._latencies = np.concatenate([self._latencies, lat])
        self._groups.extend(keys)
        self._fit()

    def _fit(self) -> None:
        targets = scores_from_latencies(self._latencies, self._groups,
                                        failure_margin=self.params.failure_margin)
        data = xgb.DMatrix(self._features, label=targets, nthread=self.params.nthread)
        self._booster = xgb.train(self.params.booster_params(self.seed), data,
                                  num_boost_round=self.params.num_rounds)

    # -- inference --------------------------------------------------------------------

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted scores (higher = faster), one per row.

        Before any :meth:`update` there is nothing to learn from: every score is 0, so
        :meth:`rank` keeps the explorer's order.
        """
        x = self._check_features(features, "predict")
        if self._booster is None:
            return np.zeros(x.shape[0], dtype=np.float64)
        return self._booster.predict(xgb.DMatrix(x, nthread=self.params.nthread)).astype(np.float64)

    def rank(self, features: np.ndarray, *, top_k: int) -> np.ndarray:
        """Indices of the ``top_k`` rows with the highest predicted score, best first.

        Ties keep the earlier row first (a stable sort), so the result is deterministic.
        With fewer than ``top_k`` rows, all of them are returned.
        """
        if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"rank: top_k must be a positive int, got {top_k!r}")
        scores = self.predict(features)
        order = np.argsort(-scores, kind="stable")
        return order[: int(top_k)]

    def _check_features(self, features: np.ndarray, where: str) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1:
            x = x.reshape(1, -1) if x.size else x.reshape(0, self.num_features or 0)
        if x.ndim != 2:
            raise ValueError(f"{where}: features must be a 2-D (n, d) array, got shape {x.shape}")
        if self.num_features is not None and x.shape[1] != self.num_features:
            raise ValueError(f"{where}: features have {x.shape[1]} columns, the model was trained on "
                             f"{self.num_features}")
        if np.isinf(x).any():  # NaN is a missing value (XGBoost's own), an infinity a bug of the featurizer
            raise ValueError(f"{where}: features contain inf (row {int(np.argmax(np.isinf(x).any(1)))}); "
                             "use nan for a missing value")
        return x

    # -- persistence ------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the booster, its training data and settings to one file (a NumPy ``.npz``).

        The file is written to a temporary name and renamed, so an interrupted save
        leaves the previous model intact.
        """
        path = Path(path)
        meta = {"format_version": FORMAT_VERSION, "seed": self.seed, "params": asdict(self.params),
                "xgboost_version": xgb.__version__}
        booster = np.frombuffer(bytes(self._booster.save_raw("ubj")), dtype=np.uint8) \
            if self._booster is not None else np.zeros(0, dtype=np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                 features=self._features, latencies_ms=self._latencies,
                 groups=np.asarray(self._groups, dtype=np.str_), booster=booster)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> XGBCostModel:
        """Read a model written by :meth:`save`; it predicts as before and keeps learning.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            If the file is not a readable cost-model file (corrupt, truncated, another
            format, or a newer format version).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"XGBCostModel.load: no model file at {str(path)!r}")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in ("meta", "features", "latencies_ms", "groups", "booster")}
            meta = json.loads(arrays["meta"].tobytes().decode())
            if meta.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
            model = cls(seed=int(meta["seed"]), params=XGBParams(**meta["params"]))
            features = np.asarray(arrays["features"], dtype=np.float64)
            latencies = np.asarray(arrays["latencies_ms"], dtype=np.float64)
            groups = [str(g) for g in arrays["groups"].tolist()]
            if features.ndim != 2 or latencies.shape != (features.shape[0],) or len(groups) != features.shape[0]:
                raise ValueError(f"inconsistent training data: features {features.shape}, "
                                 f"latencies {latencies.shape}, groups {len(groups)}")
            model._features, model._latencies, model._groups = features, latencies, groups
            if arrays["booster"].size:
                booster = xgb.Booster(params={"nthread": model.params.nthread})
                booster.load_model(bytearray(arrays["booster"].tobytes()))
                model._booster = booster
        except (OSError, EOFError, KeyError, ValueError, TypeError, json.JSONDecodeError, zipfile.BadZipFile,
                xgb.core.XGBoostError) as err:
            raise ValueError(f"XGBCostModel.load: {str(path)!r} is not a valid cost-model file: {err}") from err
        return model

    def __repr__(self) -> str:
        return (f"XGBCostModel(seed={self.seed}, samples={self.num_samples}, "
                f"features={self.num_features}, trained={self.is_trained})")

