"""One table ranking methods by the defects they find beyond the outputs-only control (issue 32's
zoo suite): per method, from Table 1's per-model rows and the paired comparison with outputs-only.

- ``detected``: anomalous models the paper's rule detects with the method;
- ``detected_beyond_outputs``: of those, the ones outputs-only does not detect (the same model);
- ``detection_adds`` / ``_same`` / ``_less``: anomalous models where the method's margin is above,
  level with or below outputs-only's on the same images (the paired interval of their ratio,
  ``baseline.detection_versus_baseline``; a model neither detects is in none), and
  ``mcnemar_p``, McNemar's exact test of the method's detections against the control's over the
  same models: Table 1's paired comparison;
- ``localized_adds`` / ``_same`` / ``_less``: localizable models where the method's AUROC is above,
  level with or below outputs-only's (the paired interval's verdict, ``baseline.verdict``);
- ``beyond_outputs`` = detected_beyond_outputs + localized_adds, what the ranking sorts by (ties:
  more detected first), ``rank`` shared by ties. A model-level method (feature synthesis) has no
  localization: its ``localized_*`` columns read "not applicable" and it ranks by detection alone.

The controls (outputs-only, random maps) are listed last, unranked, with their detection rate
beside the null rate 1/(n+1): the chance that a model exchangeable with the n references scores
above all of them, what a method that sees nothing should detect. Model-blind methods
(``model_blind.py``: maps the same for every model, every score undefined) come after them with
``note`` = ``model-blind``, no rank and no counts, McNemar test or beyond_outputs: they have no
detections or AUROCs to count or compare.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.baseline import ADDS, BASELINE, LESS, SAME, mcnemar_exact_p
from counteraudit.evaluate.scoring.detection import ROLE_ANOMALOUS, check_columns
from counteraudit.evaluate.scoring.localization import NOT_APPLICABLE
from counteraudit.evaluate.scoring.model_blind import MODEL_BLIND

RANDOM_MAP = "random_map"
CONTROLS = (BASELINE, RANDOM_MAP)
COLUMNS = ["method", "rank", "beyond_outputs", "detected", "detected_beyond_outputs",
           "detection_adds", "detection_same", "detection_less", "mcnemar_p",
           "localized_adds", "localized_same", "localized_less", "n_models", "detection_rate",
           "null_rate", "note"]
# what a model-blind method has none of: each counts or compares detections or AUROCs
NO_SCORES = ["beyond_outputs", "detected", "detected_beyond_outputs", "detection_adds",
             "detection_same", "detection_less", "mcnemar_p", "localized_adds", "localized_same",
             "localized_less", "detection_rate"]


def verdict_counts(versus: pd.DataFrame | None, method: str, prefix: str) -> dict[str, int]:
    """How many of a method's models a paired comparison says ``adds``, ``same`` and ``less``
    (``<prefix>_adds`` ...); zeros where there is no comparison."""
    said = (versus[versus["method"] == method]["verdict"].value_counts() if versus is not None
            else pd.Series(dtype=int))
    return {f"{prefix}_{name}": int(said.get(name, 0)) for name in (ADDS, SAME, LESS)}


def zoo_summary(per_model: pd.DataFrame, localization_versus: pd.DataFrame | None,
                n_references: int, *, detection_versus: pd.DataFrame | None = None,
                baseline: str = BASELINE, controls: Sequence[str] = CONTROLS,
                not_localized: Sequence[str] = (), model_blind: Sequence[str] = ()) -> pd.DataFrame:
    """One row per method (``COLUMNS``), ranked; controls last with ``null_rate`` = 1/(n+1), then
    the ``model_blind`` methods, unranked, their counts and McNemar test empty (module docstring).
    ``per_model``: the detection-per-model table (method, model, role, detected);
    ``localization_versus``: localization-vs-outputs-per-model (method, model, verdict), or None
    for a suite with no localizable model; ``detection_versus``: detection-vs-outputs-per-model
    (method, model, role, verdict), or None (its columns are then 0); ``not_localized``: the
    methods localization does not apply to (model-level), their ``localized_*`` columns
    ``NOT_APPLICABLE``."""
    check_columns(per_model, ["method", "model", "role", "detected"], "detection table")
    anomalous = per_model[per_model["role"] == ROLE_ANOMALOUS]
    detected = anomalous.assign(detected=anomalous["detected"].astype(bool))
    if baseline not in set(detected["method"]):
        raise ValueError(f"the zoo summary needs the {baseline!r} control's detections; the table "
                         f"holds {sorted(set(detected['method']))}: add {baseline!r} to the "
                         "suite's [explain] methods")
    outputs_detected = set(detected[(detected["method"] == baseline) & detected["detected"]]["model"])
    if detection_versus is not None:
        detection_versus = detection_versus[detection_versus["role"] == ROLE_ANOMALOUS]
    rows = []
    for method, group in detected.groupby("method", sort=False):
        found = group[group["detected"]]
        rows.append({"method": method, "detected": len(found),
                     "detected_beyond_outputs": int((~found["model"].isin(outputs_detected)).sum()),
                     **verdict_counts(detection_versus, method, "detection"),
                     "mcnemar_p": (np.nan if method == baseline else mcnemar_exact_p(
                         group["detected"], group["model"].isin(outputs_detected))),
                     **verdict_counts(localization_versus, method, "localized"),
                     "n_models": group["model"].nunique()})
    table = pd.DataFrame(rows)
    table["beyond_outputs"] = table["detected_beyond_outputs"] + table["localized_adds"]
    table["detection_rate"] = table["detected"] / table["n_models"]
    is_blind = table["method"].isin(list(model_blind))
    is_control = table["method"].isin(list(controls)) & ~is_blind
    ranked = table[~is_control & ~is_blind].sort_values(
        ["beyond_outputs", "detected", "method"], ascending=[False, False, True], kind="stable")
    # ties share the better rank: 1 + the methods strictly ahead on (beyond_outputs, detected)
    keys = list(zip(ranked["beyond_outputs"], ranked["detected"]))
    ranked = ranked.assign(rank=[1 + sum(other > key for other in keys) for key in keys],
                           null_rate=np.nan)
    control_rows = table[is_control].assign(rank=pd.NA, null_rate=1 / (n_references + 1))
    blind_rows = table[is_blind].astype({c: object for c in NO_SCORES}).assign(
        rank=pd.NA, null_rate=np.nan, note=MODEL_BLIND)
    blind_rows.loc[:, NO_SCORES] = np.nan
    summary = pd.concat([ranked.assign(note=""), control_rows.assign(note=""), blind_rows],
                        ignore_index=True)[COLUMNS]
    if not_localized:  # counted as 0 above (no adds); said as what they are
        localized = ["localized_adds", "localized_same", "localized_less"]
        summary = summary.astype({column: object for column in localized})
        summary.loc[summary["method"].isin(list(not_localized)), localized] = NOT_APPLICABLE
    return summary


def summary_caption(distance_name: str) -> str:
    """What the summary table says, for the terminal and the report."""
    return ("Methods ranked by the defects they find beyond the outputs-only control: "
            "beyond_outputs = anomalous models detected where outputs-only was not "
            "(detected_beyond_outputs) + localizable models where the paired AUROC interval lies "
            "above outputs-only's (localized_adds); ties share a rank. Table 1's paired "
            "comparison beside it: detection_adds / same / less, anomalous models where the "
            "method's margin is above, level with or below outputs-only's on the same resampled "
            "images (95% paired bootstrap of their ratio; models neither detects are not counted), "
            "and mcnemar_p, McNemar's exact test "
            "of its detections against outputs-only's. Controls last, their "
            "detection_rate beside null_rate = 1/(n+1), what a method that sees nothing detects; "
            "then model-blind methods (note), whose maps are the same for every model: no "
            f"detection is possible, so they are not ranked ({distance_name})")
