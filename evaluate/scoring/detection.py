"""Detection (SPEC "Detection"): does a method's mean anomaly score single out the anomalous model?

Abar(f, E) = mean of A over the images (for layered methods such as Caricatures: mean over images
per layer, then mean over layers). E detects f when Abar(f) is above every reference's own Abar
(each reference scored leave-one-out). Reported with it: the margin Abar(f) / max_i Abar(g_i) and a
rank p-value (1 + #{i: Abar(g_i) >= Abar(f)}) / (n + 1), the chance that a model exchangeable with
the references ranks at least as high. Table 1 is the fraction of each family's models detected.

Input is the tidy frame of ``evaluate.scores.anomaly_scores`` with a ``method`` column (and a
``layer`` column for layered methods) added via its ``labels``.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.scores import FLAG_OK

ROLE_REFERENCE = "reference"
ROLE_ANOMALOUS = "anomalous"
ROLE_NULL = "null"  # a held-out reference, scored as if anomalous ([references] held_out)
NULL_FAMILY = "null (held-out references)"
NO_LAYER = ""  # the layer value of single-layer methods
UNLABELLED_FAMILY = "(no family)"


def with_layer_column(scores: pd.DataFrame) -> pd.DataFrame:
    if "layer" not in scores.columns:
        return scores.assign(layer=NO_LAYER)
    return scores.assign(layer=scores["layer"].fillna(NO_LAYER).astype(str))


def check_columns(frame: pd.DataFrame, needed: Sequence[str], what: str) -> None:
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise KeyError(f"{what} lacks columns {missing} (has {list(frame.columns)}); add them with "
                       f"anomaly_scores(..., labels={{'method': ...}})")


def mean_scores(scores: pd.DataFrame, *, by: Sequence[str] = ("method",),
                per_layer: bool = False) -> pd.DataFrame:
    """Abar per (by..., [layer,] model), with n_images (scores used) and n_flagged (NaN, skipped).

    Flagged images (NaN scores) are left out of the mean and counted, never averaged as 0 or inf.
    """
    by = list(by)
    check_columns(scores, [*by, "model", "score", "flag"], "scores")
    frame = with_layer_column(scores)
    per_layer_means = (frame.groupby([*by, "layer", "model"], sort=False, dropna=False)
                       .agg(abar=("score", "mean"), n_images=("score", "count"),
                            n_flagged=("flag", lambda flags: int((flags != FLAG_OK).sum())))
                       .reset_index())
    if per_layer:
        return per_layer_means
    return (per_layer_means.groupby([*by, "model"], sort=False, dropna=False)
            .agg(abar=("abar", "mean"), n_images=("n_images", "sum"), n_flagged=("n_flagged", "sum"),
                 n_layers=("layer", "nunique"))
            .reset_index())


def detection_rule(abar: float, reference_abars: Sequence[float]) -> dict:
    """Detected (strictly above every reference), margin and rank p-value for one model."""
    reference_abars = np.asarray(reference_abars, dtype=np.float64)
    if len(reference_abars) == 0 or not np.all(np.isfinite(reference_abars)) or not np.isfinite(abar):
        return {"max_reference_abar": float(np.nanmax(reference_abars)) if np.isfinite(reference_abars).any()
                else np.nan, "margin": np.nan, "p_value": np.nan, "detected": False,
                "detection_flag": "undefined_abar"}
    highest = float(reference_abars.max())
    return {
        "max_reference_abar": highest,
        "margin": abar / highest if highest > 0 else np.nan,
        "p_value": (1 + int((reference_abars >= abar).sum())) / (len(reference_abars) + 1),
        "detected": bool(abar > highest),
        "detection_flag": FLAG_OK,
    }


def paper_rule_caution(n_references: int) -> str:
    """What a "detected" by the paper's rule is worth where no null population gives p-values: a
    model exchangeable with the n references scores above all of them with probability 1/(n+1),
    so a method that sees nothing flags that share of the models (the rank p-value's floor)."""
    return ("the paper's rule, not a statistical verdict: a method that sees nothing flags "
            f"1 model in {n_references + 1}")


# Digits a margin prints with: two, or as many more as it takes (up to the last) for the printed
# value to sit on the same side of 1 as the margin and agree with the verdict.
MARGIN_DIGITS = (2, 8)


def margin_text(margin: float, detected: bool) -> str:
    """A margin as a table prints it, never contradicting its verdict: 1.0004 and not "1.00" for
    a detected model, 0.9996 for a missed one; where no digits can show it (a margin that is 1.0
    as a float while Abar is above by less), the verdict is written beside it."""
    if not np.isfinite(margin):
        return "n/a"
    low, high = MARGIN_DIGITS
    for digits in range(low, high + 1):
        text = f"{margin:.{digits}f}"
        if np.sign(float(text) - 1) == np.sign(margin - 1) and (float(text) > 1) == bool(detected):
            return text
    return f"{margin:.{low}f} ({'detected' if detected else 'not detected'})"


def margin_wide(rows: pd.DataFrame, columns: str = "method") -> pd.DataFrame:
    """Anomalous models' margins as text (``margin_text``), a row per (family, model) and a column
    per ``columns`` value."""
    texts = rows.assign(margin_text=[margin_text(m, d) for m, d in
                                     zip(rows["margin"].astype(float), rows["detected"])])
    wide = texts.pivot_table(index=["family", "model"], columns=columns, values="margin_text",
                             aggfunc="first", sort=False).reset_index()
    wide.columns.name = None
    return wide


def detection_table(scores: pd.DataFrame, references: Sequence[str], *,
                    families: Mapping[str, str] | None = None, by: Sequence[str] = ("method",),
                    per_layer: bool = False, null_models: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (by..., [layer,] model): family, role, abar, max_reference_abar, margin, p_value,
    detected, n_images, n_flagged. Reference rows carry their own Abar and no verdict (NaN).
    ``null_models`` (held-out references) get the anomalous models' verdict, role ``null`` and
    family ``NULL_FAMILY``: how often the rule flags a normal model."""
    by = list(by)
    references = list(references)
    null_models = set(null_models)
    families = dict(families or {})
    abars = mean_scores(scores, by=by, per_layer=per_layer)
    group_keys = [*by, "layer"] if per_layer else by
    rows = []
    for key, group in abars.groupby(group_keys, sort=False, dropna=False) if group_keys else [((), abars)]:
        reference_rows = group[group["model"].isin(references)]
        missing = sorted(set(references) - set(reference_rows["model"]))
        if missing:
            where = dict(zip(group_keys, np.atleast_1d(key)))
            raise ValueError(f"no scores for references {missing} in group {where}; "
                             f"score the references too (anomaly_scores scores every model by default)")
        reference_abars = reference_rows.set_index("model")["abar"].reindex(references).to_numpy()
        for record in group.to_dict("records"):
            is_reference = record["model"] in references
            verdict = ({"max_reference_abar": np.nan, "margin": np.nan, "p_value": np.nan,
                        "detected": np.nan, "detection_flag": FLAG_OK} if is_reference
                       else detection_rule(record["abar"], reference_abars))
            is_null = record["model"] in null_models
            rows.append({**record,
                         "family": NULL_FAMILY if is_null else families.get(
                             record["model"], ROLE_REFERENCE if is_reference else UNLABELLED_FAMILY),
                         "role": ROLE_REFERENCE if is_reference else ROLE_NULL if is_null
                         else ROLE_ANOMALOUS, **verdict})
    columns = [*group_keys, "model", "family", "role", "abar", "max_reference_abar", "margin", "p_value",
               "detected", "n_images", "n_flagged", *(["n_layers"] if not per_layer else []), "detection_flag"]
    return pd.DataFrame(rows, columns=columns)


def detection_fractions(detections: pd.DataFrame, *, by: Sequence[str] = ("method",),
                        role: str = ROLE_ANOMALOUS) -> pd.DataFrame:
    """Long form of Table 1: (family, by..., [layer]) -> n_models, n_detected, fraction_detected
    (of the anomalous models; ``role=ROLE_NULL``: of the null models, the rule's false-positive
    rate)."""
    keys = ["family", *by, *(["layer"] if "layer" in detections.columns else [])]
    anomalous = detections[detections["role"] == role]
    return (anomalous.assign(detected=anomalous["detected"].astype(bool))
            .groupby(keys, sort=False, dropna=False)
            .agg(n_models=("model", "nunique"), n_detected=("detected", "sum"),
                 fraction_detected=("detected", "mean"))
            .reset_index())


def table1(detections: pd.DataFrame, *, by: Sequence[str] = ("method",),
           family_order: Sequence[str] | None = None) -> pd.DataFrame:
    """Table 1: rows = family (with its model count), columns = method (method/layer for per-layer
    detections), values = fraction of the family's models detected."""
    long = detection_fractions(detections, by=by)
    column_keys = [*by, *(["layer"] if "layer" in long.columns else [])]
    long = long.assign(column=long[column_keys].astype(str).agg(
        lambda parts: " ".join(p for p in parts if p), axis=1))
    wide = long.pivot_table(index="family", columns="column", values="fraction_detected", sort=False)
    wide.columns.name = None
    wide.insert(0, "n_models", long.groupby("family", sort=False)["n_models"].max())
    if family_order is not None:
        wide = wide.reindex([f for f in family_order if f in wide.index])
    return wide.reset_index()


def null_rates(detections: pd.DataFrame, n_references: int, *,
               by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Per method: n_null (held-out references scored), n_detected, false_positive_rate (the
    fraction the rule flagged) and expected_rate = 1 / (n + 1), the chance that one model
    exchangeable with the n references scores above all of them."""
    rates = detection_fractions(detections, by=by, role=ROLE_NULL).rename(columns={
        "n_models": "n_null", "fraction_detected": "false_positive_rate"})
    return rates.drop(columns="family").assign(expected_rate=1 / (n_references + 1))
