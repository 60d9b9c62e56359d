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

from counteraudit.evaluate.scoring.detection import detection_fractions
from counteraudit.evaluate.scoring.localization import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from counteraudit.evaluate.scoring.pairwise import (ADDS, BASELINE, LESS, NEITHER, SAME, detection_pairs,
                                                    localization_pairs, mcnemar_exact_p,
                                                    paired_delta_interval, paired_margin_ratio_interval,
                                                    pairs_for, scored_methods, verdict)

# what the outputs-only comparison has always offered, now made by pairwise.py
__all__ = ["ADDS", "BASELINE", "LESS", "NEITHER", "SAME", "mcnemar_exact_p", "paired_delta_interval",
           "paired_margin_ratio_interval", "verdict", "localization_versus_baseline", "delta_table",
           "DETECTION_VERSUS_CAPTION", "DETECTION_VERSUS_COLUMNS", "detection_versus_baseline",
           "fraction_intervals", "fraction_table", "null_rate_table"]

# the pair tables' columns named for the control, as the outputs-only tables always named them
AS_BASELINE = {"against_auroc": "baseline_auroc", "against_detected": "baseline_detected",
               "against_margin": "baseline_margin"}


def _require_baseline(methods: Sequence[str], baseline: str) -> None:
    if baseline not in methods:
        raise ValueError(f"the comparison needs the {baseline!r} control's scores; the scores hold "
                         f"{list(methods)}: add {baseline!r} to the suite's [explain] methods")


def _versus(methods: Sequence[str], baseline: str) -> list[tuple[str, str]]:
    """Every scored method but the control, against it (none when the control is alone)."""
    _require_baseline(methods, baseline)
    others = [method for method in methods if method != baseline]
    return pairs_for(others, baseline) if others else []


def localization_versus_baseline(scores: pd.DataFrame, *, baseline: str = BASELINE,
                                 abnormal_column: str = "abnormal",
                                 models: Sequence[str] | None = None,
                                 n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                                 seed: int = 0) -> pd.DataFrame:
    """Per (method, model): auroc, baseline_auroc, delta_auroc with its paired interval
    (delta_low, delta_high), verdict, and n_abnormal / n_normal, the images both methods scored:
    ``pairwise.localization_pairs`` of every method against the control.

    ``scores`` is the tidy frame Table 2 comes from (``localization_scores``); images flagged for
    either method are left out of both, so the two AUROCs are on the same images."""
    chosen = scores if models is None else scores[scores["model"].isin(list(models))]
    pairs = _versus(scored_methods(chosen), baseline)
    versus = localization_pairs(scores, pairs, abnormal_column=abnormal_column, models=models,
                                n_resamples=n_resamples, level=level, seed=seed)
    return versus.drop(columns="against").rename(columns=AS_BASELINE)


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
    bootstrap interval and verdict (``adds``: above 1; ``neither`` where neither method detects
    the model, module docstring), both detections, and n_images, the detection images every
    model scored finitely under both methods: ``pairwise.detection_pairs`` of every method
    against the control.

    ``scores``: the tidy frame Table 1 comes from; ``per_model``: Table 1's per-model rows (role,
    detected), which say which models are the references and which are scored."""
    pairs = _versus(scored_methods(scores), baseline)
    versus = detection_pairs(scores, per_model, pairs, n_resamples=n_resamples, level=level,
                             seed=seed)
    return versus.drop(columns="against").rename(columns=AS_BASELINE)[DETECTION_VERSUS_COLUMNS]


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
