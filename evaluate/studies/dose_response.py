"""Dose-response: how strong must a defect be before a method sees it? (issue 17)

A suite's ``[[sweeps]]`` (train/core/suite.py) train one family at several strengths with one seed and
recipe. For each sweep this module lines up, strength by strength, the implant figure (the figure
the family's implant check reads), each method's detection margin (Table 1's rule: detected when
the margin exceeds 1) and each method's localization AUROC with its 95% bootstrap band over
images, and names each method's threshold: the weakest strength it detects (localization: the
weakest whose AUROC band lies above 0.5, chance).

Inputs are the tables ``evaluate.pipeline`` already makes: the per-model detection table
(``detection.detection_table``) and the per-model localization table
(``localization.localization_table``), and the stored implant records.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from counteraudit.anomalies import FAMILIES
from counteraudit.evaluate.scoring.detection import check_columns, detection_table
from counteraudit.evaluate.scoring.localization import localization_table

CHANCE_AUROC = 0.5
NOT_REACHED = np.inf  # the threshold no strength of the sweep reaches


def dose_table(sweeps: Sequence, detection: pd.DataFrame, localization: pd.DataFrame | None,
               implants: dict[str, dict | None]) -> pd.DataFrame:
    """Long form, one row per (sweep, strength, method): sweep, family, parameter, strength,
    model, implant_figure, implant_value, implant_reference, implant_passed, method, margin,
    detected, auroc, auroc_low, auroc_high (NaN where the family does not localize).

    ``sweeps``: the suite's ``Sweep``s; ``detection``: per-model detection rows (method, model,
    margin, detected); ``localization``: per-model localization rows (method, model, auroc, ci_low,
    ci_high) or None; ``implants``: model name -> its implant record or None."""
    check_columns(detection, ["method", "model", "margin", "detected"], "detection table")
    by_model = detection.set_index(["model", "method"])
    located = (localization.set_index(["model", "method"])
               if localization is not None and len(localization) else None)
    methods = list(dict.fromkeys(detection["method"]))
    rows = []
    for sweep in sweeps:
        family = FAMILIES.get(sweep.family)
        for strength, model in zip(sweep.values, sweep.models):
            record = implants.get(model)
            figure = family.implant_figure(record) if record else None
            implant = {"implant_figure": figure[0] if figure else "",
                       "implant_value": figure[1] if figure else np.nan,
                       "implant_reference": figure[2] if figure else np.nan,
                       "implant_passed": bool(record["passed"]) if record else np.nan}
            for method in methods:
                if (model, method) not in by_model.index:
                    raise KeyError(f"the detection table has no row for model {model!r} and "
                                   f"method {method!r}; score the sweep's models (evaluate/dose.py "
                                   "runs every missing stage)")
                detected = by_model.loc[(model, method)]
                row = {"sweep": sweep.name, "family": sweep.family, "parameter": sweep.parameter,
                       "strength": float(strength), "model": model, **implant, "method": method,
                       "margin": float(detected["margin"]), "detected": bool(detected["detected"]),
                       "auroc": np.nan, "auroc_low": np.nan, "auroc_high": np.nan}
                if located is not None and (model, method) in located.index:
                    cell = located.loc[(model, method)]
                    row.update(auroc=float(cell["auroc"]), auroc_low=float(cell["ci_low"]),
                               auroc_high=float(cell["ci_high"]))
                rows.append(row)
    return pd.DataFrame(rows)


def suite_dose(suite, detection_scores: pd.DataFrame, localization_scores: pd.DataFrame | None,
               implants: dict[str, dict | None]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(``dose_table``, ``thresholds``) of a suite's sweeps from its tidy score frames (the
    detection set's, and the localization frame or None) and its implant records."""
    swept = {m for sweep in suite.sweeps for m in sweep.models}
    detection = detection_table(detection_scores, [s.name for s in suite.references],
                                families={s.name: s.family for s in suite.anomalies})
    localization = None
    if localization_scores is not None:
        localization = localization_table(localization_scores, models=sorted(
            swept & set(localization_scores["model"])))
    dose = dose_table(suite.sweeps, detection, localization, implants)
    return dose, thresholds(dose)


def weakest(strengths: np.ndarray, hits: np.ndarray) -> tuple[float, bool]:
    """(the weakest strength with a hit, inf when none hits; whether every stronger strength hits
    too)."""
    order = np.argsort(strengths)
    strengths, hits = np.asarray(strengths)[order], np.asarray(hits, dtype=bool)[order]
    if not hits.any():
        return NOT_REACHED, True
    first = int(np.argmax(hits))
    return float(strengths[first]), bool(hits[first:].all())


def thresholds(dose: pd.DataFrame) -> pd.DataFrame:
    """Per (sweep, method): detection_threshold, the weakest strength the method detects, and
    localization_threshold, the weakest whose AUROC band lies above chance (lower end > 0.5), each
    with ``*_monotone``: False when a stronger model of the sweep is missed again (then the
    threshold is not a clean cut). A threshold no strength reaches is inf; NaN: the family does not
    localize."""
    rows = []
    for (sweep, method), group in dose.groupby(["sweep", "method"], sort=False):
        strengths = group["strength"].to_numpy(float)
        detect, detect_clean = weakest(strengths, group["detected"].to_numpy(bool))
        localizes = np.isfinite(group["auroc_low"].to_numpy(float)).any()
        locate, locate_clean = (weakest(strengths, group["auroc_low"].to_numpy(float) > CHANCE_AUROC)
                                if localizes else (np.nan, True))
        rows.append({"sweep": sweep, "family": group["family"].iloc[0],
                     "parameter": group["parameter"].iloc[0], "method": method,
                     "detection_threshold": detect, "detection_monotone": detect_clean,
                     "localization_threshold": locate if localizes else np.nan,
                     "localization_monotone": locate_clean if localizes else np.nan})
    return pd.DataFrame(rows)


def threshold_text(value: Any, monotone: Any) -> str:
    """"0.05", "0.05 (not monotone)", "none" (no strength reaches it) or "n/a" (not localizable)."""
    if value == NOT_REACHED:
        return "none"
    if not np.isfinite(value):
        return "n/a"
    return f"{value:g}" + ("" if monotone in (True, np.True_) else " (not monotone)")


def sweep_table(dose: pd.DataFrame, sweep: str) -> pd.DataFrame:
    """One sweep, wide: a row per strength with the implant figure (model, references, took),
    each method's margin ("1.23*" when detected) and AUROC "0.91 [0.80, 0.99]"."""
    group = dose[dose["sweep"] == sweep]
    first = group.drop_duplicates("strength").sort_values("strength")
    parameter = first["parameter"].iloc[0]
    figure = first["implant_figure"].iloc[0] or "implant figure"
    table = pd.DataFrame({
        parameter: first["strength"].map(lambda v: f"{v:g}").to_numpy(),
        f"{figure} (refs)": [f"{v:.3f} ({r:.3f})" if np.isfinite(v) else "n/a"
                             for v, r in zip(first["implant_value"], first["implant_reference"])],
        "took": ["yes" if p is True else "NO" if p is False else "n/a"
                 for p in first["implant_passed"]]})
    localizes = np.isfinite(group["auroc"].to_numpy(float)).any()
    for method, rows in group.groupby("method", sort=False):
        rows = rows.sort_values("strength")
        table[f"margin {method}"] = [f"{m:.2f}{'*' if d else ''}" if np.isfinite(m) else "n/a"
                                     for m, d in zip(rows["margin"], rows["detected"])]
        if localizes:
            table[f"AUROC {method}"] = [f"{a:.2f} [{lo:.2f}, {hi:.2f}]" if np.isfinite(a) else "n/a"
                                        for a, lo, hi in zip(rows["auroc"], rows["auroc_low"],
                                                             rows["auroc_high"])]
    return table
