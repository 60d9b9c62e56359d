"""The report's opening summary: what the run found, in sentences generated from its tables.

Pure functions, tables in and sentences out, so a test can check every sentence against a table it
builds: which defect families each method detects (Table 1), which models each method localizes
(Table 2's per-model AUROCs), and where an explanation tells more than the model's outputs alone
(the outputs-only control: Table 1's fractions side by side, and the paired AUROC difference).

It claims only what the data supports. With null models (the family verdicts of
``scoring/verdicts.py``) the detection sentences read the verdicts and name their test; without,
they count by the paper's rule and say so beside every "detected" (``paper_rule_caution``: a
method that sees nothing flags 1 model in n+1). A model is localized only where the AUROC reaches
the paper's 0.7 AND lies above that model's own chance band (``localization_call``).
"""
from __future__ import annotations

from html import escape
from typing import Mapping, Sequence

import re

import numpy as np
import pandas as pd

from counteraudit.anomalies.base import FAMILIES
from counteraudit.evaluate.scoring.baseline import ADDS, BASELINE, LESS
from counteraudit.evaluate.reporting.html import VERDICTS, legend
from counteraudit.evaluate.scoring.detection import NULL_FAMILY, check_columns, paper_rule_caution
from counteraudit.evaluate.scoring.localization import (LOCALIZED, PAPER_SUCCESS_AUROC, WITHIN_CHANCE,
                                                        localization_call)
from counteraudit.evaluate.scoring.model_blind import DETECTION_CONSEQUENCE, MODEL_BLIND, blind_methods
from counteraudit.evaluate.scoring.tables import seeds_per_configuration
from counteraudit.evaluate.scoring.verdicts import (DETECTED, FINDING_WORDS, INCONCLUSIVE, NOT_DETECTED,
                                                    findings, rate_text)
from counteraudit.evaluate.scoring.zoo import paper_rule_basis

SECTION_ID = "summary"
# Table 2 counts a localization as a success from this AUROC (the paper's reading), above the
# model's own chance band
LOCALIZED_AUROC = PAPER_SUCCESS_AUROC
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


def _cautioned(clause: str, caution: str) -> str:
    """``clause`` with the caution beside it: inside its closing parenthesis if it has one."""
    return f"{clause[:-1]}; {caution})" if clause.endswith(")") else f"{clause} ({caution})"


def detection_sentences(table1: pd.DataFrame, model_blind: Sequence[str] = (), *,
                        n_references: int) -> list[str]:
    """One sentence per family of Table 1 (``family``, ``n_models``, one fraction column per
    method): which methods detect all, some or none of its models, then the outputs-only
    control's count. Every sentence that reports a detection says beside it that it is the
    paper's rule (``paper_rule_caution`` with the suite's ``n_references``). The held-out
    references' row (a false-positive rate) is left out, and so are ``model_blind`` methods
    (never "missed by": they cannot detect)."""
    methods = compared_methods(table1, model_blind)
    caution = paper_rule_caution(n_references)
    sentences = []
    for row in table1.to_dict("records"):
        if row["family"] == NULL_FAMILY:
            continue
        n = int(row["n_models"])
        counts = {m: _count(row[m], n) for m in methods if np.isfinite(float(row[m]))}
        every = [m for m, k in counts.items() if k == n]
        none = [m for m, k in counts.items() if k == 0]
        some = [m for m, k in counts.items() if 0 < k < n]
        parts, claimed = [], False

        def claim(clause: str) -> str:
            nonlocal claimed
            first, claimed = not claimed, True
            return _cautioned(clause, caution) if first else clause
        if len(every) == len(counts) and counts:
            parts.append(claim("detected by " + (
                every[0] if len(every) == 1 else "both explanation methods" if len(every) == 2
                else f"all {len(every)} explanation methods")))
        else:
            if every:
                parts.append(claim(f"detected by {_join(every)}"
                                   + (f" ({n}/{n})" if n > 1 else "")
                                   + (" only" if len(every) == 1 and not some else "")))
            if some:
                parts.append(claim(("detected " if not every else "")
                                   + "partly by " + _join([f"{m} ({counts[m]}/{n})" for m in some])))
            if none and len(none) == len(counts):
                parts.append("missed by every explanation method")
            elif none:
                parts.append(f"missed by {_join(none)}")
        if BASELINE in row and np.isfinite(float(row[BASELINE])):
            k = _count(row[BASELINE], n)
            control = ("the outputs-only control "
                       + ("detects it too" if k == n and n == 1 else "misses it" if k == 0 and n == 1
                          else f"detects {k}/{n}"))
            parts.append(claim(control) if k else control)
        sentences.append(f"{row['family']} ({_plural(n, 'model')}): " + "; ".join(parts) + ".")
    return sentences


def verdict_sentences(families: pd.DataFrame, model_blind: Sequence[str] = ()) -> list[str]:
    """One sentence per family from the family verdicts (``verdicts.family_verdicts``: family,
    method, n_models, rate, ci_low, ci_high, verdict): the methods its verdict detects, misses
    with power, or cannot decide, each with its rate and exact interval, then the outputs-only
    control's verdict. ``model_blind`` methods are left out."""
    check_columns(families, ["family", "method", "n_models", "rate", "ci_low", "ci_high",
                             "verdict"], "family verdicts table")
    methods = [m for m in dict.fromkeys(families["method"])
               if m != BASELINE and m not in model_blind]
    lines = findings(families, rates=True, methods=methods)
    control = families[families["method"] == BASELINE].set_index("family")
    sentences = []
    for family, line in zip(dict.fromkeys(families[families["method"].isin(methods)]["family"]),
                            lines):
        if family in control.index:
            row = control.loc[family]
            line = (f"{line[:-1]}; the outputs-only control: {FINDING_WORDS[row['verdict']]} "
                    f"{rate_text(row['rate'], row['ci_low'], row['ci_high'])}.")
        sentences.append(line)
    return sentences


def detection_beyond_outputs(table1: pd.DataFrame, model_blind: Sequence[str] = (), *,
                             n_references: int) -> str | None:
    """Families some explanation method (not a ``model_blind`` one) detects more often than the
    outputs-only control does, by the paper's rule (said beside them; None: the table has no
    control column)."""
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
    lead = f"Detection beyond the outputs ({paper_rule_caution(n_references)})"
    if not beyond:
        return (f"{lead}: no explanation method detects any family more often than the "
                "outputs-only control.")
    return f"{lead}: " + "; ".join(beyond) + "."


def verdicts_beyond_outputs(families: pd.DataFrame, model_blind: Sequence[str] = ()) -> str | None:
    """Families an explanation method's verdict detects where the outputs-only control's does
    not (None: the verdicts have no control)."""
    control = families[families["method"] == BASELINE].set_index("family")["verdict"]
    if control.empty:
        return None
    test = str(families["test"].iloc[0]) if "test" in families else "null"
    seen = families[(families["verdict"] == DETECTED) & (families["method"] != BASELINE)
                    & ~families["method"].isin(list(model_blind))]
    beyond = [f"{family} (" + ", ".join(f"{r.method} {rate_text(r.rate, r.ci_low, r.ci_high)}"
                                        for r in rows.itertuples(index=False))
              + f"; the control {FINDING_WORDS[control[family]]})"
              for family, rows in seen.groupby("family", sort=False)
              if control.get(family) != DETECTED]
    lead = f"Detection beyond the outputs (verdicts of the {test} test)"
    if not beyond:
        return (f"{lead}: no explanation method's verdict detects a family the outputs-only "
                "control's does not.")
    return f"{lead}: " + "; ".join(beyond) + "."


def localization_sentences(per_model: pd.DataFrame, *, target: float = LOCALIZED_AUROC,
                           model_blind: Sequence[str] = ()) -> list[str]:
    """One sentence per localizable model of the per-model localization table (``method``,
    ``model``, ``auroc``, ``chance_low``, ``chance_high``): the methods that localize it (AUROC at
    least ``target`` and above that model's own chance band, ``localization_call``) with their
    AUROCs; those that reach ``target`` but lie within the band, said as such; and the
    outputs-only control's AUROC. ``model_blind`` methods (no AUROC) are not counted."""
    check_columns(per_model, ["method", "model", "auroc", "chance_low", "chance_high"],
                  "per-model localization table")
    sentences = []
    per_model = per_model[~per_model["method"].isin(list(model_blind))]
    for model, rows in per_model.groupby("model", sort=False):
        rows = rows.assign(auroc=rows["auroc"].astype(float))
        calls = {m: (a, localization_call(a, low, high, target=target), low, high)
                 for m, a, low, high in zip(rows["method"], rows["auroc"], rows["chance_low"],
                                            rows["chance_high"])}
        control = calls.pop(BASELINE, None)
        reached = [f"{m} {a:.2f}" for m, (a, call, _, _) in calls.items() if call == LOCALIZED]
        in_band = [f"{m} {a:.2f}, within its chance band [{low:.2f}, {high:.2f}]"
                   for m, (a, call, low, high) in calls.items()
                   if call == WITHIN_CHANCE and a >= target]
        rule = f"AUROC \u2265 {target:g} and above the model's chance band"
        if reached:
            text = (f"localized by {len(reached)} of {_plural(len(calls), 'method')} ({rule}): "
                    + ", ".join(reached))
        else:
            finite = {m: v[0] for m, v in calls.items() if np.isfinite(v[0])}
            best = max(finite.items(), key=lambda item: item[1]) if finite else None
            text = (f"localized by no method ({rule})"
                    + (f"; the best, {best[0]}, reaches {best[1]:.2f}" if best and not in_band
                       else ""))
        if in_band:
            text += "; not localized: " + "; ".join(in_band)
        if control is not None and np.isfinite(control[0]):
            text += f"; the outputs-only control: {control[0]:.2f}"
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
                     model_blind: Sequence[str] = (), *, n_references: int) -> list[str]:
    """For each sanity-check family of Table 1 (a model that learnt nothing of the task): the
    explanation methods that miss any of its models, which do not depend on the model
    (``model_blind`` ones are said apart, in the summary's first topic); "detects it" is the
    paper's rule, said beside it."""
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
                                    if blind else "every explanation method detects it "
                                    f"({paper_rule_caution(n_references)})") + ".")
    return sentences


def summary_sentences(table1: pd.DataFrame, localization: pd.DataFrame | None = None,
                      versus: pd.DataFrame | None = None, *, n_references: int,
                      families: pd.DataFrame | None = None,
                      target: float = LOCALIZED_AUROC,
                      sanity_families: Sequence[str] = (),
                      model_blind: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The summary's sentences by topic: "Model-blind methods (not ranked)" first (when one ran:
    ``model_blind``, method -> its sentence, ``model_blind.blind_methods``), detection (from the
    family verdicts ``families`` where the suite has null models, naming their test; else Table
    1 by the paper's rule, with ``paper_rule_caution`` for the suite's ``n_references`` beside
    every detection), "Localization (Table 2)" (when the suite has localizable models) and
    "Beyond the outputs" (when the outputs-only control ran). ``localization`` is the per-model
    localization table, ``versus`` the per-model comparison with the outputs-only control."""
    blind = dict(model_blind or {})
    topics = ({"Model-blind methods (not ranked)": [f"{line}." for line in blind.values()]}
              if blind else {})
    verdicts = families is not None and len(families) > 0
    if verdicts:
        test = str(families["test"].iloc[0]) if "test" in families else "null"
        topics[f"Detection (verdicts of the {test} test)"] = verdict_sentences(families, list(blind))
    else:
        topics["Detection (Table 1, the paper's rule)"] = detection_sentences(
            table1, list(blind), n_references=n_references)
    if localization is not None and len(localization):
        topics["Localization (Table 2)"] = localization_sentences(localization, target=target,
                                                                  model_blind=list(blind))
    detection_beyond = (verdicts_beyond_outputs(families, list(blind)) if verdicts
                        else detection_beyond_outputs(table1, list(blind),
                                                      n_references=n_references))
    beyond = [line for line in [detection_beyond,
                                localization_beyond_outputs(versus)
                                if versus is not None and len(versus) else None] if line]
    if beyond:
        topics["Beyond the outputs"] = beyond
    sanity = sanity_sentences(table1, sanity_families, list(blind), n_references=n_references)
    if sanity:
        topics["Sanity checks (Adebayo et al. 2018)"] = sanity
    return topics


def summary_basis(suite, families: pd.DataFrame | None, power: pd.DataFrame | None) -> str:
    """What the summary's detections rest on: the verdicts' test and its null models, or the
    paper's rule (``zoo.paper_rule_basis``)."""
    seeds = seeds_per_configuration(suite)
    if families is None or not len(families):
        return paper_rule_basis(len(suite.references), seeds)
    test = str(families["test"].iloc[0])
    nulls = int(power["k"].iloc[0]) if power is not None and len(power) else len(suite.null_fit)
    return (f"verdicts of the {test} test against {nulls} held-out clean models, "
            f"{_plural(seeds, 'seed')} per configuration and {len(suite.references)} references")


# Where the summary's sentences say a verdict, the colour it has in the tables: (a regular
# expression on the escaped sentence, its class)
# (a method's verdict: "missed with power by ...", or the control's: "control: detected 1.00")
VERDICT_MARKS = [(rf"{re.escape(FINDING_WORDS[verdict])} {'for' if verdict == INCONCLUSIVE else 'by'}"
                  rf"|(?<=control: ){re.escape(FINDING_WORDS[verdict])}", name)
                 for verdict, name in [(DETECTED, "v-detected"), (NOT_DETECTED, "v-not-detected"),
                                       (INCONCLUSIVE, "v-inconclusive")]]
LOCALIZATION_MARKS = [(r"localized by \d+ of \d+ methods?", "v-localized"),
                      (r"within its chance band \[[^\]]*\]", "v-within-chance")]


def paper_rule_marks(n_references: int) -> list[tuple[str, str]]:
    """The caution beside each detection by the paper's rule, in that rule's colour."""
    return [(re.escape(escape(paper_rule_caution(n_references))), "v-paper-rule")]


def marked(line: str, marks: Sequence[tuple[str, str]]) -> str:
    """``line`` escaped for HTML, each match of ``marks`` wrapped in its verdict's colour."""
    text = escape(line)
    for pattern, name in marks:
        text = re.sub(pattern, lambda found: f'<span class="{name}">{found.group(0)}</span>', text)
    return text


def summary_section(report) -> str:
    """The report's summary, from the tables the report shows ("" without a Table 1)."""
    if report.optional_table("detection") is None:
        return ""
    localization = versus = None
    if report.localizable:
        localization = report.table("localization-per-model")
        versus = report.optional_table("localization-vs-outputs-per-model")
    sanity = [name for name in FAMILIES.names() if FAMILIES.get(name).sanity_check]
    families = report.optional_table("detection-families")
    topics = summary_sentences(report.table("detection"), localization, versus,
                               n_references=len(report.references), families=families,
                               sanity_families=sanity, model_blind=blind_methods(
                                   report.optional_table("detection-model-blind"),
                                   DETECTION_CONSEQUENCE))
    verdicts = families is not None and len(families) > 0
    marks = [*(VERDICT_MARKS if verdicts else []), *paper_rule_marks(len(report.references)),
             *LOCALIZATION_MARKS]
    blocks = "".join(f"<h3>{escape(topic)}</h3><ul>"
                     + "".join(f"<li>{marked(line, marks)}</li>" for line in lines) + "</ul>"
                     for topic, lines in topics.items())
    basis = summary_basis(report.suite, families, report.optional_table("detection-power"))
    shown = [name for name in VERDICTS if f'class="{name}"' in blocks]  # the legend of what shows
    detects = ("A method detects a family when its verdict says so: the rate of its models whose "
               "null p-value is significant, with an exact interval that starts above alpha "
               "(the Verdicts section)" if verdicts else
               "A method detects a model, by the paper's rule, when the model's mean anomaly "
               "score exceeds every reference's (Table 1)")
    return (f'<section id="{SECTION_ID}"><h2>What this run found</h2>'
            f'<p id="summary-basis"><b>Basis:</b> {escape(basis)}.</p>'
            f'<p class="note">{escape(detects)}. A method localizes a model when abnormal inputs '
            f"score higher than normal ones with AUROC at least {LOCALIZED_AUROC:g} and above "
            "that model's own chance band (Table 2). The outputs-only control scores the "
            "model's outputs alone: an explanation adds something only where it beats that "
            "control.</p>" + blocks + (legend(*shown) if shown else "") + "</section>")
