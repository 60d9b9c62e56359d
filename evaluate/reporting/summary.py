"""The report's opening summary: what the run found, in sentences generated from its tables.

Pure functions, tables in and sentences out, so a test can check every sentence against a table it
builds: which defect families each method detects (Table 1), which models each method localizes
(Table 2's per-model AUROCs), and where an explanation tells more than the model's outputs alone
(the outputs-only control: Table 1's fractions side by side, and the paired AUROC difference).
"""
from __future__ import annotations

from html import escape
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from counteraudit.anomalies.base import FAMILIES
from counteraudit.evaluate.scoring.baseline import ADDS, BASELINE, LESS
from counteraudit.evaluate.scoring.detection import NULL_FAMILY
from counteraudit.evaluate.scoring.model_blind import DETECTION_CONSEQUENCE, MODEL_BLIND, blind_methods

SECTION_ID = "summary"
# Table 2 counts a localization as a success from this AUROC (the paper's reading).
LOCALIZED_AUROC = 0.7
TABLE1_KEYS = ("family", "n_models")


def _join(names: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _count(fraction: float, n_models: int) -> int:
    return int(round(float(fraction) * n_models))


def compared_methods(table1: pd.DataFrame, model_blind: Sequence[str]) -> list[str]:
    """Table 1's explanation methods the sentences compare: not the outputs-only control, and
    not a model-blind method (named in ``model_blind`` or its cells reading so), which has no
    detections to count (scoring/model_blind.py)."""
    return [c for c in table1.columns if c not in TABLE1_KEYS and c != BASELINE
            and c not in model_blind and not (table1[c] == MODEL_BLIND).any()]


def detection_sentences(table1: pd.DataFrame, model_blind: Sequence[str] = ()) -> list[str]:
    """One sentence per family of Table 1 (``family``, ``n_models``, one fraction column per
    method): which methods detect all, some or none of its models, then the outputs-only
    control's count. The held-out references' row (a false-positive rate) is left out, and so
    are ``model_blind`` methods (never "missed by": they cannot detect)."""
    methods = compared_methods(table1, model_blind)
    sentences = []
    for row in table1.to_dict("records"):
        if row["family"] == NULL_FAMILY:
            continue
        n = int(row["n_models"])
        counts = {m: _count(row[m], n) for m in methods if np.isfinite(float(row[m]))}
        every = [m for m, k in counts.items() if k == n]
        none = [m for m, k in counts.items() if k == 0]
        some = [m for m, k in counts.items() if 0 < k < n]
        parts = []
        if len(every) == len(counts) and counts:
            parts.append("detected by " + (every[0] if len(every) == 1 else "both explanation methods"
                                           if len(every) == 2 else f"all {len(every)} explanation methods"))
        else:
            if every:
                parts.append(f"detected by {_join(every)}"
                             + (f" ({n}/{n})" if n > 1 else "") + (" only" if len(every) == 1
                                                                    and not some else ""))
            if some:
                parts.append("partly by " + _join([f"{m} ({counts[m]}/{n})" for m in some]))
            if none and len(none) == len(counts):
                parts.append("missed by every explanation method")
            elif none:
                parts.append(f"missed by {_join(none)}")
        if BASELINE in row and np.isfinite(float(row[BASELINE])):
            k = _count(row[BASELINE], n)
            parts.append("the outputs-only control "
                         + ("detects it too" if k == n and n == 1 else "misses it" if k == 0 and n == 1
                            else f"detects {k}/{n}"))
        sentences.append(f"{row['family']} ({_plural(n, 'model')}): " + "; ".join(parts) + ".")
    return sentences


def detection_beyond_outputs(table1: pd.DataFrame, model_blind: Sequence[str] = ()) -> str | None:
    """Families some explanation method (not a ``model_blind`` one) detects more often than the
    outputs-only control does (None: the table has no control column)."""
    if BASELINE not in table1.columns:
        return None
    methods = compared_methods(table1, model_blind)
    beyond = []
    for row in table1.to_dict("records"):
        if row["family"] == NULL_FAMILY:
            continue
        n, control = int(row["n_models"]), _count(row[BASELINE], int(row["n_models"]))
        better = [m for m in methods if np.isfinite(float(row[m])) and _count(row[m], n) > control]
        if better:
            counts = ", ".join(f"{m} {_count(row[m], n)}/{n}" for m in better)
            beyond.append(f"{row['family']} ({counts}; the control {control}/{n})")
    if not beyond:
        return ("Detection beyond the outputs: no explanation method detects any family more "
                "often than the outputs-only control.")
    return "Detection beyond the outputs: " + "; ".join(beyond) + "."


def localization_sentences(per_model: pd.DataFrame, *, target: float = LOCALIZED_AUROC,
                           model_blind: Sequence[str] = ()) -> list[str]:
    """One sentence per localizable model of the per-model localization table (``method``,
    ``model``, ``auroc``): the methods whose AUROC reaches ``target``, with their AUROCs, and the
    outputs-only control's AUROC. ``model_blind`` methods (no AUROC) are not counted."""
    sentences = []
    per_model = per_model[~per_model["method"].isin(list(model_blind))]
    for model, rows in per_model.groupby("model", sort=False):
        auroc = dict(zip(rows["method"], rows["auroc"].astype(float)))
        control = auroc.pop(BASELINE, None)
        reached = [f"{m} {a:.2f}" for m, a in auroc.items() if np.isfinite(a) and a >= target]
        if reached:
            text = (f"localized by {len(reached)} of {_plural(len(auroc), 'method')} "
                    f"(AUROC \u2265 {target:g}): {', '.join(reached)}")
        else:
            best = max(auroc.items(), key=lambda item: -np.inf if not np.isfinite(item[1])
                       else item[1]) if auroc else None
            text = (f"localized by no method (AUROC \u2265 {target:g})"
                    + (f"; the best, {best[0]}, reaches {best[1]:.2f}" if best
                       and np.isfinite(best[1]) else ""))
        if control is not None and np.isfinite(control):
            text += f"; the outputs-only control: {control:.2f}"
        sentences.append(f"{model}: {text}.")
    return sentences


def localization_beyond_outputs(versus: pd.DataFrame) -> str:
    """From the paired comparison with the outputs-only control (``method``, ``model``,
    ``delta_auroc``, ``verdict``): the (method, model) pairs where the explanation localizes
    better, and how many are no better or worse."""
    better = versus[versus["verdict"] == ADDS]
    worse = int((versus["verdict"] == LESS).sum())
    same = len(versus) - len(better) - worse
    tail = (f"of the other pairs, {same} localize no better and {worse} worse than the "
            "outputs alone (paired bootstrap 95% interval of the AUROC difference)")
    if better.empty:
        return ("Localization beyond the outputs: no explanation localizes any model better than "
                f"the outputs-only control; {tail}.")
    by_model = [f"{model} (" + ", ".join(f"{m} {d:+.2f}" for m, d in
                                        zip(rows["method"], rows["delta_auroc"].astype(float)))
                + ")" for model, rows in better.groupby("model", sort=False)]
    return ("Localization beyond the outputs (AUROC gained over the control): "
            + "; ".join(by_model) + f"; {tail}.")


def sanity_sentences(table1: pd.DataFrame, sanity_families: Sequence[str],
                     model_blind: Sequence[str] = ()) -> list[str]:
    """For each sanity-check family of Table 1 (a model that learnt nothing of the task): the
    explanation methods that miss any of its models, which do not depend on the model
    (``model_blind`` ones are said apart, in the summary's first topic)."""
    methods = compared_methods(table1, model_blind)
    sentences = []
    for row in table1.to_dict("records"):
        if row["family"] not in sanity_families:
            continue
        n = int(row["n_models"])
        blind = [m for m in methods if np.isfinite(float(row[m])) and _count(row[m], n) < n]
        sentences.append(
            f"{row['family']}: " + (f"missed by {_join(blind)}, which therefore do not depend on "
                                    "the model enough to tell it from one that learnt nothing"
                                    if blind else "every explanation method detects it") + ".")
    return sentences


def summary_sentences(table1: pd.DataFrame, localization: pd.DataFrame | None = None,
                      versus: pd.DataFrame | None = None, *,
                      target: float = LOCALIZED_AUROC,
                      sanity_families: Sequence[str] = (),
                      model_blind: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The summary's sentences by topic: "Model-blind methods (not ranked)" first (when one ran:
    ``model_blind``, method -> its sentence, ``model_blind.blind_methods``), "Detection (Table
    1)", "Localization (Table 2)" (when the suite has localizable models) and "Beyond the outputs"
    (when the outputs-only control ran). ``localization`` is the per-model localization table,
    ``versus`` the per-model comparison with the outputs-only control."""
    blind = dict(model_blind or {})
    topics = ({"Model-blind methods (not ranked)": [f"{line}." for line in blind.values()]}
              if blind else {})
    topics["Detection (Table 1)"] = detection_sentences(table1, list(blind))
    if localization is not None and len(localization):
        topics["Localization (Table 2)"] = localization_sentences(localization, target=target,
                                                                  model_blind=list(blind))
    beyond = [line for line in [detection_beyond_outputs(table1, list(blind)),
                                localization_beyond_outputs(versus)
                                if versus is not None and len(versus) else None] if line]
    if beyond:
        topics["Beyond the outputs"] = beyond
    sanity = sanity_sentences(table1, sanity_families, list(blind))
    if sanity:
        topics["Sanity checks (Adebayo et al. 2018)"] = sanity
    return topics


def summary_section(report) -> str:
    """The report's summary, from the tables the report shows ("" without a Table 1)."""
    if report.optional_table("detection") is None:
        return ""
    localization = versus = None
    if report.localizable:
        localization = report.table("localization-per-model")
        versus = report.optional_table("localization-vs-outputs-per-model")
    sanity = [name for name in FAMILIES.names() if FAMILIES.get(name).sanity_check]
    topics = summary_sentences(report.table("detection"), localization, versus,
                               sanity_families=sanity, model_blind=blind_methods(
                                   report.optional_table("detection-model-blind"),
                                   DETECTION_CONSEQUENCE))
    blocks = "".join(f"<h3>{escape(topic)}</h3><ul>"
                     + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"
                     for topic, lines in topics.items())
    return (f'<section id="{SECTION_ID}"><h2>What this run found</h2>'
            '<p class="note">A method detects a model when the model\'s mean anomaly score exceeds '
            "every reference's (Table 1); it localizes a model when abnormal inputs score higher "
            f"than normal ones with AUROC at least {LOCALIZED_AUROC:g} (Table 2). The "
            "outputs-only control scores the model's outputs alone: an explanation adds "
            "something only where it beats that control.</p>" + blocks + "</section>")
