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

Where the suite has null models (``[evaluate] p_value``: ``verdicts.family_verdicts``' table is
given), the summary reads the verdicts instead of the paper's rule: per method, the families its
verdict calls ``families_detected``, ``families_not_detected`` (missed with power) and
``families_inconclusive``, and ``families_beyond_outputs``, the families it detects where the
outputs-only control's verdict is not "detected". The ranking then sorts by families_beyond_outputs,
then families_detected, then localized_adds. Without null models it ranks by the paper's rule as
above, and ``paper_rule_basis`` says so: one seed per configuration and n references give counts,
not statistical verdicts.

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
from counteraudit.evaluate.scoring.verdicts import DETECTED, INCONCLUSIVE, NOT_DETECTED

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
# With the suite's family verdicts: what the ranking reads, after the rank
VERDICT_COUNTS = {"families_detected": DETECTED, "families_not_detected": NOT_DETECTED,
                  "families_inconclusive": INCONCLUSIVE}
VERDICT_COLUMNS = ["families_beyond_outputs", *VERDICT_COUNTS]


def verdict_counts(versus: pd.DataFrame | None, method: str, prefix: str) -> dict[str, int]:
    """How many of a method's models a paired comparison says ``adds``, ``same`` and ``less``
    (``<prefix>_adds`` ...); zeros where there is no comparison."""
    said = (versus[versus["method"] == method]["verdict"].value_counts() if versus is not None
            else pd.Series(dtype=int))
    return {f"{prefix}_{name}": int(said.get(name, 0)) for name in (ADDS, SAME, LESS)}


def zoo_summary(per_model: pd.DataFrame, localization_versus: pd.DataFrame | None,
                n_references: int, *, detection_versus: pd.DataFrame | None = None,
                baseline: str = BASELINE, controls: Sequence[str] = CONTROLS,
                not_localized: Sequence[str] = (), model_blind: Sequence[str] = (),
                families: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per method (``COLUMNS``; with ``families``, ``VERDICT_COLUMNS`` after the rank),
    ranked; controls last with ``null_rate`` = 1/(n+1), then
    the ``model_blind`` methods, unranked, their counts and McNemar test empty (module docstring).
    ``per_model``: the detection-per-model table (method, model, role, detected);
    ``localization_versus``: localization-vs-outputs-per-model (method, model, verdict), or None
    for a suite with no localizable model; ``detection_versus``: detection-vs-outputs-per-model
    (method, model, role, verdict), or None (its columns are then 0); ``not_localized``: the
    methods localization does not apply to (model-level), their ``localized_*`` columns
    ``NOT_APPLICABLE``; ``families``: the family verdicts (family, method, verdict), or None
    (the paper's rule ranks)."""
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
    columns, no_scores, order = COLUMNS, NO_SCORES, ["beyond_outputs", "detected"]
    if families is not None:
        table = table.merge(family_counts(families, baseline), on="method", how="left")
        table[VERDICT_COLUMNS] = table[VERDICT_COLUMNS].fillna(0).astype(int)
        columns = [*COLUMNS[:2], *VERDICT_COLUMNS, *COLUMNS[2:]]
        no_scores = [*VERDICT_COLUMNS, *NO_SCORES]
        order = ["families_beyond_outputs", "families_detected", "localized_adds"]
    is_blind = table["method"].isin(list(model_blind))
    is_control = table["method"].isin(list(controls)) & ~is_blind
    ranked = table[~is_control & ~is_blind].sort_values(
        [*order, "method"], ascending=[False] * len(order) + [True], kind="stable")
    # ties share the better rank: 1 + the methods strictly ahead on the ranking's keys
    keys = list(zip(*(ranked[column] for column in order)))
    ranked = ranked.assign(rank=[1 + sum(other > key for other in keys) for key in keys],
                           null_rate=np.nan)
    control_rows = table[is_control].assign(rank=pd.NA, null_rate=1 / (n_references + 1))
    blind_rows = table[is_blind].astype({c: object for c in no_scores}).assign(
        rank=pd.NA, null_rate=np.nan, note=MODEL_BLIND)
    blind_rows.loc[:, no_scores] = np.nan
    summary = pd.concat([ranked.assign(note=""), control_rows.assign(note=""), blind_rows],
                        ignore_index=True)[columns]
    if not_localized:  # counted as 0 above (no adds); said as what they are
        localized = ["localized_adds", "localized_same", "localized_less"]
        summary = summary.astype({column: object for column in localized})
        summary.loc[summary["method"].isin(list(not_localized)), localized] = NOT_APPLICABLE
    return summary


def family_counts(families: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Per method of the family verdicts (family, method, verdict): ``VERDICT_COLUMNS``, the
    families each verdict names and those it detects where ``baseline``'s verdict does not."""
    check_columns(families, ["family", "method", "verdict"], "family verdicts table")
    control = set(families[(families["method"] == baseline)
                           & (families["verdict"] == DETECTED)]["family"])
    rows = []
    for method, group in families.groupby("method", sort=False):
        found = group[group["verdict"] == DETECTED]
        rows.append({"method": method,
                     "families_beyond_outputs": int((~found["family"].isin(control)).sum()),
                     **{column: int((group["verdict"] == verdict).sum())
                        for column, verdict in VERDICT_COUNTS.items()}})
    return pd.DataFrame(rows, columns=["method", *VERDICT_COLUMNS])


def paper_rule_basis(n_references: int, seeds_per_configuration: int) -> str:
    """What a summary without null models rests on, said plainly."""
    seeds = ("one seed per configuration" if seeds_per_configuration <= 1
             else f"{seeds_per_configuration} seeds per configuration")
    return (f"{seeds} and {n_references} references: counts by the paper's rule, not statistical "
            "verdicts")


def summary_caption(distance_name: str, *, test: str | None = None,
                    basis: str | None = None) -> str:
    """What the summary table says, for the terminal and the report: ranked by the family
    verdicts of ``test`` where the suite has null models, else by the paper's rule, with
    ``basis`` (``paper_rule_basis``) said first."""
    if test is not None:
        ranking = (f"Methods ranked by the family verdicts of the {test} test against held-out "
                   "clean models: families_beyond_outputs = families the method's verdict calls "
                   "detected where the outputs-only control's does not, then families_detected, "
                   "then localized_adds (localizable models where the paired AUROC interval lies "
                   "above outputs-only's); families_not_detected = missed with power, "
                   "families_inconclusive = undecidable at this scale; ties share a rank. The "
                   "paper's rule's counts stay beside them: beyond_outputs = anomalous models "
                   "detected where outputs-only was not (detected_beyond_outputs) + "
                   "localized_adds.")
    else:
        ranking = ((f"{basis[0].upper()}{basis[1:]}. " if basis else "")
                   + "Methods ranked by the defects they find beyond the outputs-only control: "
                   "beyond_outputs = anomalous models detected where outputs-only was not "
                   "(detected_beyond_outputs) + localizable models where the paired AUROC "
                   "interval lies above outputs-only's (localized_adds); ties share a rank.")
    return (f"{ranking} Table 1's paired "
            "comparison beside it: detection_adds / same / less, anomalous models where the "
            "method's margin is above, level with or below outputs-only's on the same resampled "
            "images (95% paired bootstrap of their ratio; models neither detects are not counted), "
            "and mcnemar_p, McNemar's exact test "
            "of its detections against outputs-only's. Controls last, their "
            "detection_rate beside null_rate = 1/(n+1), what a method that sees nothing detects; "
            "then model-blind methods (note), whose maps are the same for every model: no "
            f"detection is possible, so they are not ranked ({distance_name})")
