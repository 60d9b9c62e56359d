"""Does an explanation tell more than the model's outputs alone? Every method against the
outputs-only control, and Table 1's fractions with exact intervals.

Localization: for each (method, localizable model), dAUROC = AUROC(method) - AUROC(outputs_only)
on the same images, with a *paired* percentile bootstrap interval: each resample draws abnormal
and normal images (with replacement, set sizes kept, as ``localization.bootstrap_auroc_interval``
does) and scores both methods on the very same draw, so what the two share, e.g. an image that
every model finds hard, cancels out of the difference. The verdict is ``adds`` when the interval
lies above 0, ``less`` when it lies below, and ``same`` when it holds 0: on those images the
explanation localizes no better than the outputs would.

Detection: the margin ratio margin(method) / margin(outputs_only) per anomalous model; above 1 the
method separates the model from the references by more than the outputs do. Its *paired* interval
(``detection_versus_baseline``) resamples the detection images once for both methods and for the
model and every reference alike, and recomputes both margins on each draw: the verdict is
``adds`` when the ratio's interval lies above 1, ``less`` below, ``same`` when it holds 1, and
``neither`` when neither method detects the model: a margin below 1 says where the highest
reference sits, not how far the model is from the references, so two of them compare nothing
(a random map "adds" to outputs-only wherever the outputs set a model closer to the references
than the references are to each other). Over the
anomalous models, McNemar's exact test (statsmodels) asks whether the method's detections and
the control's differ more than chance would make them (the discordant models alone count).

Table 1's fractions: a family's fraction of models detected is k of n; with n >= 2 its exact
(Clopper-Pearson) 95% interval says how little a 1 of 2 tells.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar

from counteraudit.evaluate.scoring.detection import (ROLE_ANOMALOUS, ROLE_NULL, ROLE_REFERENCE, check_columns,
                                                     detection_fractions, with_layer_column)
from counteraudit.evaluate.scoring.localization import (DEFAULT_LEVEL, DEFAULT_RESAMPLES, finite_scores,
                                                        percentile_interval)
from counteraudit.train.core.artifacts import derive_seed

BASELINE = "outputs_only"
ADDS, SAME, LESS = "adds", "same", "less"
NEITHER = "neither"  # neither method detects the model: its margins compare nothing


def _wins(abnormal: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """W[i, j] = 1 if abnormal i outscores normal j, 1/2 on a tie: AUROC = mean of W."""
    return (abnormal[:, None] > normal[None, :]) + 0.5 * (abnormal[:, None] == normal[None, :])


def paired_delta_interval(abnormal_a, normal_a, abnormal_b, normal_b, *,
                          n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                          seed: int = 0) -> tuple[float, float, float]:
    """(AUROC_a - AUROC_b, low, high): the difference of two methods' AUROCs on the same images
    (row i of ``abnormal_a`` and of ``abnormal_b`` is one image, likewise the normal ones) and
    its paired percentile bootstrap interval. Exact per resample: counts^T (W_a - W_b) counts."""
    abnormal_a, normal_a = finite_scores(abnormal_a, "abnormal"), finite_scores(normal_a, "normal")
    abnormal_b, normal_b = finite_scores(abnormal_b, "abnormal"), finite_scores(normal_b, "normal")
    if abnormal_a.shape != abnormal_b.shape or normal_a.shape != normal_b.shape:
        raise ValueError(f"paired scores need the same images for both methods; got "
                         f"{len(abnormal_a)} + {len(normal_a)} against "
                         f"{len(abnormal_b)} + {len(normal_b)} abnormal + normal images")
    n_abnormal, n_normal = len(abnormal_a), len(normal_a)
    difference = _wins(abnormal_a, normal_a) - _wins(abnormal_b, normal_b)
    rng = np.random.default_rng(seed)
    counts_abnormal = rng.multinomial(n_abnormal, np.full(n_abnormal, 1 / n_abnormal),
                                      size=n_resamples)
    counts_normal = rng.multinomial(n_normal, np.full(n_normal, 1 / n_normal), size=n_resamples)
    resampled = np.einsum("bi,ij,bj->b", counts_abnormal, difference, counts_normal) \
        / (n_abnormal * n_normal)
    low, high = percentile_interval(resampled, level)
    return float(difference.mean()), low, high


def verdict(low: float, high: float) -> str:
    return ADDS if low > 0 else LESS if high < 0 else SAME


def _image_scores(scores: pd.DataFrame, keys: Sequence[str] = ()) -> pd.DataFrame:
    """One score per (method, model, image, *keys): layered methods averaged over their layers,
    as Table 2 ranks them; flagged (NaN) images dropped."""
    by = ["method", "model", "image", *keys]
    frame = with_layer_column(scores)
    frame = frame.groupby(by, sort=False).agg(score=("score", "mean")).reset_index()
    return frame[np.isfinite(frame["score"].to_numpy(dtype=float))]


def _require_baseline(methods: Sequence[str], baseline: str) -> None:
    if baseline not in methods:
        raise ValueError(f"the comparison needs the {baseline!r} control's scores; the scores hold "
                         f"{list(methods)}: add {baseline!r} to the suite's [explain] methods")


def localization_versus_baseline(scores: pd.DataFrame, *, baseline: str = BASELINE,
                                 abnormal_column: str = "abnormal",
                                 models: Sequence[str] | None = None,
                                 n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                                 seed: int = 0) -> pd.DataFrame:
    """Per (method, model): auroc, baseline_auroc, delta_auroc with its paired interval
    (delta_low, delta_high), verdict, and n_abnormal / n_normal, the images both methods scored.

    ``scores`` is the tidy frame Table 2 comes from (``localization_scores``); images flagged for
    either method are left out of both, so the two AUROCs are on the same images."""
    check_columns(scores, ["method", "model", "image", "score", abnormal_column], "scores")
    frame = _image_scores(scores, [abnormal_column])
    if models is not None:
        frame = frame[frame["model"].isin(list(models))]
    _require_baseline(list(dict.fromkeys(frame["method"])), baseline)
    keys = ["model", "image", abnormal_column]
    reference = frame[frame["method"] == baseline]
    rows = []
    for (method, model), group in frame[frame["method"] != baseline].groupby(
            ["method", "model"], sort=False):
        paired = group.merge(reference[reference["model"] == model][[*keys, "score"]], on=keys,
                             suffixes=("", "_baseline"))
        is_abnormal = paired[abnormal_column].astype(bool).to_numpy()
        a, b = paired["score"].to_numpy(float), paired["score_baseline"].to_numpy(float)
        row = {"method": method, "model": model, "n_abnormal": int(is_abnormal.sum()),
               "n_normal": int((~is_abnormal).sum())}
        if row["n_abnormal"] == 0 or row["n_normal"] == 0:
            rows.append({**row, "auroc": np.nan, "baseline_auroc": np.nan, "delta_auroc": np.nan,
                         "delta_low": np.nan, "delta_high": np.nan, "verdict": "n/a"})
            continue
        delta, low, high = paired_delta_interval(
            a[is_abnormal], a[~is_abnormal], b[is_abnormal], b[~is_abnormal],
            n_resamples=n_resamples, level=level,
            seed=derive_seed(seed, "versus-baseline", method, model))
        auroc_a = float(_wins(a[is_abnormal], a[~is_abnormal]).mean())
        rows.append({**row, "auroc": auroc_a, "baseline_auroc": auroc_a - delta,
                     "delta_auroc": delta, "delta_low": low, "delta_high": high,
                     "verdict": verdict(low, high)})
    return pd.DataFrame(rows, columns=["method", "model", "auroc", "baseline_auroc", "delta_auroc",
                                       "delta_low", "delta_high", "verdict", "n_abnormal",
                                       "n_normal"])


def delta_table(versus: pd.DataFrame, digits: int = 2, *, value: str = "delta_auroc",
                low: str = "delta_low", high: str = "delta_high", signed: bool = True) -> pd.DataFrame:
    """Rows = method, columns = model, cells "+0.05 [-0.02, 0.11] same" (``value`` with its
    interval ``low``-``high`` and the verdict; ``signed=False`` for ratios: "1.30 [1.05, 1.61]")."""
    sign = "+" if signed else ""
    cells = versus.assign(cell=[
        "n/a" if not np.isfinite(d) else
        f"{d:{sign}.{digits}f} [{lo:{sign}.{digits}f}, {hi:{sign}.{digits}f}] {v}"
        for d, lo, hi, v in zip(versus[value], versus[low], versus[high], versus["verdict"])])
    wide = cells.pivot(index="method", columns="model", values="cell")
    wide = wide.reindex(index=list(dict.fromkeys(cells["method"])),
                        columns=list(dict.fromkeys(cells["model"])))
    wide.columns.name = None
    return wide.reset_index()


def _margins(abars: np.ndarray) -> np.ndarray:
    """Margins Abar(f) / max_i Abar(g_i) from rows [model, reference_1, ...] (last axis)."""
    highest = abars[..., 1:].max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(highest > 0, abars[..., 0] / highest, np.nan)


def paired_margin_ratio_interval(method_scores, baseline_scores, *,
                                 n_resamples: int = DEFAULT_RESAMPLES,
                                 level: float = DEFAULT_LEVEL,
                                 seed: int = 0) -> tuple[float, float, float, float, float]:
    """(margin, baseline margin, their ratio, low, high) for one model: each argument is an
    (1 + n, N) array of per-image anomaly scores, row 0 the model's, rows 1.. the references'
    leave-one-out ones, column i one detection image for both methods. Each bootstrap resample
    draws N images with replacement and recomputes both margins on that draw; the interval is the
    percentile interval of their ratio."""
    a = np.asarray(method_scores, dtype=np.float64)
    b = np.asarray(baseline_scores, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2 or a.shape[1] == 0:
        raise ValueError(f"paired margins need (1 + n references, N images) scores of the same "
                         f"images for both methods; got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("paired margins need finite scores; drop flagged images first")
    n_images = a.shape[1]
    margin, baseline_margin = _margins(a.mean(axis=1)), _margins(b.mean(axis=1))
    counts = np.random.default_rng(seed).multinomial(
        n_images, np.full(n_images, 1 / n_images), size=n_resamples) / n_images
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratios = np.log(_margins(counts @ a.T)) - np.log(_margins(counts @ b.T))
        ratio = float(margin / baseline_margin)
    log_ratios = log_ratios[np.isfinite(log_ratios)]
    if not np.isfinite(ratio) or len(log_ratios) == 0:
        return float(margin), float(baseline_margin), np.nan, np.nan, np.nan
    low, high = percentile_interval(log_ratios, level)
    return float(margin), float(baseline_margin), ratio, float(np.exp(low)), float(np.exp(high))


DETECTION_VERSUS_CAPTION = (
    "Against the outputs-only control, paired: margin(method) / margin(outputs_only) per "
    "anomalous model, with its 95% interval from resampling the detection images once for both "
    "methods and every model; adds: the interval lies above 1 (the explanation sets the model "
    "further from the references than the outputs do on the same images), less: below 1, "
    "same: it holds 1; neither: neither method detects the model, so their margins (below 1: "
    "where the highest reference sits) compare nothing")
DETECTION_VERSUS_COLUMNS = ["method", "model", "role", "detected", "baseline_detected", "margin",
                            "baseline_margin", "margin_ratio", "ratio_low", "ratio_high", "verdict",
                            "n_images"]


def detection_versus_baseline(scores: pd.DataFrame, per_model: pd.DataFrame, *,
                              baseline: str = BASELINE, n_resamples: int = DEFAULT_RESAMPLES,
                              level: float = DEFAULT_LEVEL, seed: int = 0) -> pd.DataFrame:
    """Per (method, anomalous or held-out model): both margins, their ratio with its paired
    bootstrap interval (``paired_margin_ratio_interval``) and verdict (``adds``: above 1;
    ``neither`` where neither method detects the model, module docstring), both detections,
    and n_images, the detection images every model scored finitely under both methods (images
    flagged for either are left out of both, and the margins are recomputed on those). Layered
    methods are averaged over their layers per image, as Table 2 does.

    ``scores``: the tidy frame Table 1 comes from; ``per_model``: Table 1's per-model rows (role,
    detected), which say which models are the references and which are scored."""
    check_columns(scores, ["method", "model", "image", "score"], "scores")
    check_columns(per_model, ["method", "model", "role", "detected"], "detection table")
    frame = _image_scores(scores)  # flagged images dropped: missing (NaN) in the pivot below
    methods = list(dict.fromkeys(frame["method"]))
    _require_baseline(methods, baseline)
    references = list(dict.fromkeys(per_model[per_model["role"] == ROLE_REFERENCE]["model"]))
    scored = per_model[per_model["role"].isin([ROLE_ANOMALOUS, ROLE_NULL])]
    detected = scored.set_index(["method", "model"])["detected"]
    wide = frame.pivot_table(index=["method", "model"], columns="image", values="score",
                             sort=False, dropna=False)
    rows = []
    for method in methods:
        if method == baseline:
            continue
        for model, role in dict.fromkeys(zip(scored[scored["method"] == method]["model"],
                                             scored[scored["method"] == method]["role"])):
            names = [model, *references]
            a = wide.reindex([(method, name) for name in names]).to_numpy(float)
            b = wide.reindex([(baseline, name) for name in names]).to_numpy(float)
            finite = np.isfinite(a).all(axis=0) & np.isfinite(b).all(axis=0)
            row = {"method": method, "model": model, "role": role,
                   "detected": bool(detected.get((method, model), False)),
                   "baseline_detected": bool(detected.get((baseline, model), False)),
                   "n_images": int(finite.sum())}
            if not finite.any():
                rows.append({**row, "margin": np.nan, "baseline_margin": np.nan,
                             "margin_ratio": np.nan, "ratio_low": np.nan, "ratio_high": np.nan,
                             "verdict": "n/a"})
                continue
            margin, baseline_margin, ratio, low, high = paired_margin_ratio_interval(
                a[:, finite], b[:, finite], n_resamples=n_resamples, level=level,
                seed=derive_seed(seed, "detection-versus-baseline", method, model))
            said = ("n/a" if not np.isfinite(ratio)
                    else NEITHER if not (row["detected"] or row["baseline_detected"])
                    else verdict(np.log(low), np.log(high)))
            rows.append({**row, "margin": margin, "baseline_margin": baseline_margin,
                         "margin_ratio": ratio, "ratio_low": low, "ratio_high": high,
                         "verdict": said})
    return pd.DataFrame(rows, columns=DETECTION_VERSUS_COLUMNS)


def mcnemar_exact_p(detected: Sequence[bool], baseline_detected: Sequence[bool]) -> float:
    """McNemar's exact p-value (statsmodels) for paired detections of the same models: whether
    the models only the method detects and those only the control detects differ in number by
    more than chance (1.0 when no model is discordant)."""
    a = np.asarray(detected, dtype=bool)
    b = np.asarray(baseline_detected, dtype=bool)
    table = [[int((a & b).sum()), int((a & ~b).sum())], [int((~a & b).sum()), int((~a & ~b).sum())]]
    return float(mcnemar(table, exact=True).pvalue)


def fraction_intervals(per_model: pd.DataFrame, *, level: float = DEFAULT_LEVEL) -> pd.DataFrame:
    """Table 1 with exact (Clopper-Pearson) intervals: per (family, method), n_models,
    n_detected, fraction and, where the family has two models or more, its interval."""
    long = detection_fractions(per_model)
    lows, highs = [], []
    for k, n in zip(long["n_detected"], long["n_models"]):
        if n >= 2:
            interval = binomtest(int(k), int(n)).proportion_ci(confidence_level=level,
                                                                method="exact")
            lows.append(interval.low)
            highs.append(interval.high)
        else:
            lows.append(np.nan)
            highs.append(np.nan)
    return long.assign(ci_low=lows, ci_high=highs)


def fraction_table(intervals: pd.DataFrame, family_order: Sequence[str] | None = None) -> pd.DataFrame:
    """Rows = family, columns = method, cells "0.50 [0.01, 0.99]" (just "1.00" for one model)."""
    cells = intervals.assign(cell=[
        f"{f:.2f}" if not np.isfinite(lo) else f"{f:.2f} [{lo:.2f}, {hi:.2f}]"
        for f, lo, hi in zip(intervals["fraction_detected"], intervals["ci_low"],
                             intervals["ci_high"])])
    wide = cells.pivot(index="family", columns="method", values="cell")
    wide = wide.reindex(index=[f for f in (family_order or dict.fromkeys(cells["family"]))
                               if f in wide.index],
                        columns=list(dict.fromkeys(cells["method"])))
    wide.insert(0, "n_models", cells.groupby("family")["n_models"].max())
    wide.columns.name = None
    return wide.reset_index()


def null_rate_table(rates: pd.DataFrame, *, level: float = DEFAULT_LEVEL) -> pd.DataFrame:
    """``detection.null_rates`` with the false-positive rate's exact interval: per method,
    "k/n = rate [low, high]" beside the rate exchangeability predicts."""
    cells = []
    for k, n, rate in zip(rates["n_detected"], rates["n_null"], rates["false_positive_rate"]):
        interval = binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
        cells.append(f"{int(k)}/{int(n)} = {rate:.2f} [{interval.low:.2f}, {interval.high:.2f}]")
    return pd.DataFrame({"method": rates["method"], "false_positive_rate": cells,
                         "expected_1/(n+1)": rates["expected_rate"].round(3)})
