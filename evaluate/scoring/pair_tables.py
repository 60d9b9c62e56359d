"""A run's method-against-method tables (``pairwise.py``), keyed by the file names ``write_tables``
gives them: what ``counteraudit compare`` prints and writes, and the report's section "Method
against method" shows.

Every table's name says the pair set: ``compare-<methods>-vs-<against>-<table>-<distance>``.
Where a part cannot be computed (no localizable model, no localization scores, no null models),
``notes`` says why in a sentence, so nothing is left out silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.baseline import delta_table
from counteraudit.evaluate.scoring.detection import ROLE_ANOMALOUS
from counteraudit.evaluate.scoring.model_blind import (LOCALIZATION_CONSEQUENCE, blind_methods, detection_blind,
                                                       model_blind_table)
from counteraudit.evaluate.scoring.verdicts import own_verdicts
from counteraudit.evaluate.scoring.pairwise import (ADDS, LESS, NEITHER, SAME, Pair, detection_mcnemar,
                                                    detection_pairs, family_difference_caption,
                                                    family_rate_differences, localization_pairs)

VERDICT_COUNTS = (ADDS, SAME, LESS, NEITHER, "n/a")
MCNEMAR, DETECTION, DETECTION_PER_MODEL, DETECTION_COUNTS = (
    "mcnemar", "detection", "detection-per-model", "detection-counts")
LOCALIZATION, LOCALIZATION_PER_MODEL, FAMILIES = (
    "localization", "localization-per-model", "family-differences")

NO_NULLS = ("The per-family differences of detection rates need a suite with null models "
            "([evaluate] p_value and [references] held_out, e.g. `replicated`): each model's "
            "verdict comes from its p-value against them. This suite has none, so only the "
            "per-model comparisons above are shown.")
NO_REPLICATES = ("This suite has one model per configuration: each family's rate is over its "
                 "few models, so its difference says little (a suite with replicates, e.g. "
                 "`replicated`, gives each family several).")
NO_LOCALIZABLE = ("This suite has no localizable model (no backdoor, spurious, missing-class or "
                  "blurred-faces anomaly): no paired dAUROC.")
NO_LOCALIZATION_SCORES = ("This run has no localization scores for these methods (model-level "
                          "methods only, or none scored on the abnormal sets): no paired dAUROC; "
                          "`counteraudit localize` with the same options scores them.")
DETECTION_ONLY = ("--detection-only: the localizable models' abnormal sets were not explained, "
                  "so no paired dAUROC; run without it (or `counteraudit localize` with the same "
                  "options) to add it.")

MCNEMAR_CAPTION = (
    "Detection over models, per pair: the anomalous models only the method detects "
    "(n_only_method) and only the other one (n_only_against) by the paper's rule; McNemar's exact "
    "p, and p_holm, Holm-adjusted over the pairs shown")
DETECTION_CAPTION = (
    "Per anomalous model, paired: margin(method) / margin(against), with its 95% interval from "
    "resampling the detection images once for both methods and every model; adds: above 1 (the "
    "method sets the model further from the references on the same images), less: below 1, "
    "same: it holds 1; neither: neither method detects the model, so their margins compare "
    "nothing. The per-model intervals are each at 95% (no multiplicity control: read them with "
    "McNemar's test over the models)")
COUNTS_CAPTION = "Per pair, how many anomalous models each margin-ratio verdict covers"
LOCALIZATION_CAPTION = (
    "Per localizable model, paired: AUROC(method) - AUROC(against) on the same images, with its "
    "95% paired bootstrap interval; adds: the interval lies above 0, less: below, same: it holds 0")


def pair_set_label(pairs: Sequence[Pair]) -> str:
    """How a pair set is named in its tables' file names: "<a>+<b>-vs-<c>+<d>"."""
    methods = dict.fromkeys(method for method, _ in pairs)
    against = dict.fromkeys(other for _, other in pairs)
    return f"{'+'.join(methods)}-vs-{'+'.join(against)}"


def comparison_key(label: str, table: str, distance_name: str) -> str:
    return f"compare-{label}-{table}-{distance_name}"


@dataclass
class Comparison:
    """The tables of one pair set (by their file names) and, per part left out, why."""
    label: str
    pairs: list[Pair]
    distance_name: str
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    family_caption: str = ""

    def get(self, table: str) -> pd.DataFrame | None:
        return self.frames.get(comparison_key(self.label, table, self.distance_name))

    def put(self, table: str, frame: pd.DataFrame) -> None:
        self.frames[comparison_key(self.label, table, self.distance_name)] = frame


def pair_wide(versus: pd.DataFrame, **cells) -> pd.DataFrame:
    """``delta_table`` of a pair table: a row per pair ("method vs against"), a column per model,
    ``cells`` saying which value and interval fill them."""
    labelled = versus.assign(method=[f"{m} vs {a}" for m, a in zip(versus["method"],
                                                                     versus["against"])])
    return delta_table(labelled, **cells).rename(columns={"method": "pair"})


def verdict_counts(versus: pd.DataFrame, pairs: Sequence[Pair]) -> pd.DataFrame:
    """Per pair, the number of anomalous models of each margin-ratio verdict."""
    rows = []
    for method, against in pairs:
        said = versus[(versus["method"] == method) & (versus["against"] == against)]["verdict"]
        rows.append({"method": method, "against": against,
                     **{name: int((said == name).sum()) for name in VERDICT_COUNTS}})
    return pd.DataFrame(rows, columns=["method", "against", *VERDICT_COUNTS])


def _usable(pairs: Sequence[Pair], blind: Mapping[str, str], part: str,
            notes: dict[str, str]) -> list[Pair]:
    """The pairs without a model-blind method; the blind ones' sentences in ``notes[part]``."""
    dropped = [name for name in dict.fromkeys(n for pair in pairs for n in pair) if name in blind]
    if dropped:
        notes[part] = " ".join(blind[name] for name in dropped) + " Its pairs are not compared."
    return [pair for pair in pairs if not set(pair) & set(dropped)]


def comparison_tables(suite, tables: Mapping[str, pd.DataFrame], detection: pd.DataFrame,
                      localization: pd.DataFrame | None, pairs: Sequence[Pair],
                      distance_name: str, *, localizable: bool, plan=None,
                      seed: int = 0) -> Comparison:
    """The comparison of every pair on a run: ``tables`` are the run's detection tables
    (``stored_detection_tables``: Table 1's per-model rows, and with a null ``plan`` the per-model
    verdicts), ``detection`` and ``localization`` its scores (``localization`` None: not scored;
    ``localizable``: whether the suite has a localizable model)."""
    comparison = Comparison(label=pair_set_label(pairs), pairs=list(pairs),
                            distance_name=distance_name)
    notes = comparison.notes
    per_model = tables[f"detection-per-model-{distance_name}"]
    kept = _usable(pairs, detection_blind(tables, distance_name), DETECTION, notes)
    if kept:
        versus = detection_pairs(detection, per_model, kept, seed=seed)
        anomalous = versus[versus["role"] == ROLE_ANOMALOUS]
        comparison.put(MCNEMAR, detection_mcnemar(per_model, kept))
        comparison.put(DETECTION_COUNTS, verdict_counts(anomalous, kept))
        comparison.put(DETECTION_PER_MODEL, versus)
        comparison.put(DETECTION, pair_wide(anomalous, value="margin_ratio", low="ratio_low",
                                            high="ratio_high", signed=False))
    if not localizable:
        notes[LOCALIZATION] = NO_LOCALIZABLE
    elif localization is None or localization.empty:
        notes[LOCALIZATION] = NO_LOCALIZATION_SCORES
    else:
        blind = blind_methods(model_blind_table(localization), LOCALIZATION_CONSEQUENCE)
        kept_here = _usable(pairs, blind, LOCALIZATION, notes)
        scored = set(localization["method"])
        kept_here = [pair for pair in kept_here if set(pair) <= scored]
        if kept_here:
            versus = localization_pairs(localization, kept_here, seed=seed)
            comparison.put(LOCALIZATION_PER_MODEL, versus)
            comparison.put(LOCALIZATION, pair_wide(versus))
        else:
            notes.setdefault(LOCALIZATION, NO_LOCALIZATION_SCORES)
    verdicts = tables.get(f"detection-verdicts-per-model-{distance_name}")
    if plan is None or verdicts is None:
        notes[FAMILIES] = NO_NULLS
    else:  # each method's verdicts from its own table, as its record has them
        own = own_verdicts(per_model, plan,
                           configurations=dict(zip(verdicts["model"], verdicts["configuration"])),
                           implants_passed={model: None if pd.isna(passed) else bool(passed)
                                            for model, passed in zip(verdicts["model"],
                                                                     verdicts["implant_passed"])})
        differences = family_rate_differences(own, kept, alpha=plan.alpha)
        comparison.put(FAMILIES, differences)
        comparison.family_caption = family_difference_caption(plan.alpha, len(differences))
        if not any(spec.replicate is not None for spec in suite.anomalies):
            notes[FAMILIES] = NO_REPLICATES
    return comparison


def significant_lines(differences: pd.DataFrame) -> list[str]:
    """One sentence per pair: the families whose rate difference is significant after Holm."""
    lines = []
    for (method, against), rows in differences.groupby(["method", "against"], sort=False):
        chosen = rows[rows["significant"].astype(bool)]
        said = ", ".join(f"{row.family} ({row.difference:+.2f} [{row.low:+.2f}, {row.high:+.2f}])"
                         for row in chosen.itertuples(index=False))
        # the approximate interval excludes 0 where the exact test, which decides, does not
        disagree = rows[~rows["significant"].astype(bool) & ((rows["low"] > 0) | (rows["high"] < 0))]
        lines.append(f"{method} vs {against}: "
                     + (f"significant in {said}" if len(chosen) else
                        f"no family's difference is significant after Holm "
                        f"(smallest p_holm {np.nanmin(rows['p_holm']):.3g})")
                     + "".join(f"; {row.family}'s interval [{row.low:+.2f}, {row.high:+.2f}] "
                               f"excludes 0 but its exact p_holm is {row.p_holm:.3g}: not "
                               "significant" for row in disagree.itertuples(index=False)))
    return lines
