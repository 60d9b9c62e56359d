"""The counter-audit of failure-discovery auditors: Table 3 (detection) and Table 4 (recovery of
the planted slice).

Detection (Table 1's rule, ``evaluate.detection.detection_rule``): an auditor's model-level
statistic is its top finding's strength on its main objective (error_ratio: the largest error
ratio; twise: the largest median 1 - f(y|x)). It detects a model when that is strictly above every
reference's own, with the margin statistic / max over references and the rank p-value.

Identification: each anomalous model's family declares its planted slice (``planted_slice``); a
finding lies in the slice when it fixes every factor the slice fixes to the slice's value. The
rank of the slice is the rank of the first such finding in the model's ranking (1 = top), next to
the same rank in every reference's ranking; precision@k is the share of the top k findings that
lie in the slice (dcbench's slice-discovery metric, on subgroups). A family whose cue is no world
factor is "not expressible" (a miss by design); one whose slice uses a factor the world lacks is
"not in this world"; stark families have no slice. Beside each verdict, ``top_finding_relation``
says what the top finding has to do with the planted slice (``finding_relation``), so a detection
made through something else than the planted defect shows as such; ``relation_counts`` counts
them per family.

Under the relative score every finding is scored against the baseline models
(``reference_evaluations.baseline_models``: the references and the fitting held-out references),
while Table 3's rule stays Table 1's paper rule: above every *reference's* statistic (Table 1
keeps the null population for its p-values, not for the rule). ``calibration_frame`` judges the
held-out references: the checking half (never in the baseline) and the fitting half (each left
out of its own baseline).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.base import NOT_EXPRESSIBLE
from counteraudit.evaluate.discovery.auditors import AUDITORS, AuditResult, Finding, ranked
from counteraudit.evaluate.discovery.relative import SIGNIFICANCE_FDR, significant
from counteraudit.evaluate.discovery.relative_results import baseline_count
from counteraudit.evaluate.discovery.stage import planned
from counteraudit.evaluate.scoring.detection import ROLE_ANOMALOUS, ROLE_REFERENCE, detection_rule
from counteraudit.train.implant_checks import read_implant

PRECISION_AT = (1, 5, 10)
# A verdict is saturated when the references' statistic is this close to the statistic's ceiling:
# no model can then exceed them by more than this factor, so a "detected" says nothing.
SATURATION_HEADROOM = 1.02
RANKABLE = ("ranked", "not found")  # Table 4 statuses of a slice made of the world's factors
OUTSIDE_GRID = "outside the auditor's factors"  # a slice on a factor the auditor never varies
ROLE_HELD_OUT = "held-out reference"  # a null model: judged as anomalous, a detection is false
TOP_K = (1, 5)  # recovery rates: the planted slice first, and within the first five
# What a model's top finding has to do with its planted slice (``finding_relation``)
IN_SLICE, SHARES_FACTOR, UNRELATED = "in the slice", "shares a factor", "unrelated"
NO_SLICE, NO_FINDING = "no slice", "no finding"
RELATIONS = (IN_SLICE, SHARES_FACTOR, UNRELATED, NO_FINDING, NO_SLICE)
# The held-out references' halves in discovery-calibration
CHECKING_HALF, FITTING_HALF = "checking half", "fitting half"
# discovery-calibration's tests, as discovery_notes words them: (column prefix, count column,
# the rule, what the auditor claims by it)
CALIBRATED_TESTS = (("table3", "table3_false_positives", "Table 3's rule (above every reference)",
                     "detections"),
                    ("any_significant", "any_significant", "a significant finding",
                     "significant findings"))


def model_statistic(result: AuditResult, objective: str, null: float = float("nan")) -> float:
    """The top finding's strength on the objective (``null`` without any finding)."""
    findings = ranked(result.findings, objective)
    return findings[0].statistic if findings else null


def slice_rank(result: AuditResult, objective: str, planted: dict[str, str]) -> float:
    """1-based rank of the first finding inside the slice (NaN: none is)."""
    for position, finding in enumerate(ranked(result.findings, objective), start=1):
        if finding.covers(planted):
            return float(position)
    return float("nan")


def precision_at(result: AuditResult, objective: str, planted: dict[str, str], k: int) -> float:
    top = ranked(result.findings, objective)[:k]
    return sum(f.covers(planted) for f in top) / k if top else float("nan")


def finding_relation(finding: Finding | None, planted: Any, factors: dict[str, list[str]]) -> str:
    """What a (top) finding has to do with a model's planted slice: "in the slice" (it fixes
    every factor the slice fixes, to the slice's value: ``Finding.covers``), "shares a factor"
    (it fixes some of them to the slice's value), "unrelated", "no finding", or "no slice" (a
    model without a slice made of the world's factors: a reference, a stark family, a cue no
    factor expresses)."""
    if not isinstance(planted, dict) or not planted or any(f not in factors for f in planted):
        return NO_SLICE
    if finding is None:
        return NO_FINDING
    if finding.covers(planted):
        return IN_SLICE
    if any(finding.conditions.get(factor) == value for factor, value in planted.items()):
        return SHARES_FACTOR
    return UNRELATED


def detection_frame(results: dict[tuple[str, str], AuditResult], references: list[str],
                    families: dict[str, str], held_out: list[str] = (),
                    score: str = "absolute", slices: dict[str, Any] | None = None,
                    factors: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """One row per (auditor, model): statistic, top finding, what it has to do with the model's
    planted slice (``top_finding_relation``; ``slices``: model -> planted slice, ``factors``: the
    world's), and the verdict for anomalous and held-out models (a held-out reference is judged
    as an anomalous model would be: a "detection" of it is a false positive)."""
    slices, factors = slices or {}, factors or {}
    rows = []
    for auditor in sorted({a for a, _ in results}):
        objective, null = AUDITORS.get(auditor).objective, AUDITORS.get(auditor).null_statistic
        ceiling = AUDITORS.get(auditor).statistic_ceiling
        if score == "relative":  # no finding: nothing worse than the references; no ceiling
            null, ceiling = 0.0, float("inf")
        reference_stats = [model_statistic(results[(auditor, r)], objective, null)
                           for r in references]
        for (name, model), result in results.items():
            if name != auditor:
                continue
            statistic = model_statistic(result, objective, null)
            top = ranked(result.findings, objective)
            is_reference = model in references
            verdict = ({"max_reference": np.nan, "margin": np.nan, "p_value": np.nan,
                        "detected": np.nan} if is_reference else
                       _verdict(detection_rule(statistic, reference_stats)))
            role = (ROLE_REFERENCE if is_reference else ROLE_HELD_OUT if model in held_out
                    else ROLE_ANOMALOUS)
            rows.append({"auditor": auditor, "model": model,
                         "family": families.get(model, role),
                         "role": role,
                         "statistic": statistic, "top_finding": top[0].label() if top else "",
                         "top_finding_relation": finding_relation(top[0] if top else None,
                                                                  slices.get(model), factors),
                         # excess: how far above the highest reference (a relative score
                         # can be negative, where a ratio margin means nothing)
                         **verdict, "excess": statistic - verdict["max_reference"],
                         "saturated": (np.nan if is_reference else
                                                  saturated(verdict["max_reference"], ceiling)),
                         "images_used": result.images_used})
    return pd.DataFrame(rows)


def saturated(max_reference: float, ceiling: float) -> bool:
    """Whether the references' statistic leaves less than SATURATION_HEADROOM below the
    statistic's ceiling (no margin above it could then mean anything)."""
    return bool(np.isfinite(max_reference) and max_reference > 0
                and ceiling / max_reference < SATURATION_HEADROOM)


def discovery_notes(detections: pd.DataFrame, recovery: pd.DataFrame,
                    suite_name: str | None = None,
                    calibration: pd.DataFrame | None = None) -> list[str]:
    """Warnings to print under Tables 3 and 4: auditors whose statistic saturates (their verdicts
    rest on margins that cannot mean anything), auditors whose false-positive rate on the
    checking held-out models is above its nominal level beyond doubt (``calibration``: the
    95% Wilson interval's lower end above it), and a suite none of whose models has a slice made
    of the world's factors (Table 4 then has nothing to rank)."""
    notes = []
    checking = (calibration[calibration["design"] == CHECKING_HALF]
                if calibration is not None and len(calibration) else pd.DataFrame())
    for row in checking.to_dict("records"):
        for test, count, rule, claims in CALIBRATED_TESTS:
            low, nominal = row.get(f"{test}_low", np.nan), row.get(f"{test}_nominal", np.nan)
            if np.isfinite(low) and low > nominal:
                notes.append(f"MISCALIBRATED: {row['auditor']} flags {int(row[count])} of "
                             f"{row['held_out']} clean checking models by {rule}, nominal "
                             f"{nominal:.3f}, 95% interval {low:.2f}-{row[f'{test}_high']:.2f}: "
                             f"on this suite its {claims} do not tell a defect from a clean model.")
    anomalous = detections[detections["role"] == ROLE_ANOMALOUS]
    if "saturated" in anomalous:
        for auditor, rows in anomalous[anomalous["saturated"].astype(bool)].groupby("auditor", sort=True):
            ceiling = AUDITORS.get(auditor).statistic_ceiling
            said = ", ".join(f"{m} {'yes' if d else 'no'} at margin {g:.3f}"
                             for m, d, g in zip(rows["model"], rows["detected"].astype(bool),
                                                rows["margin"]))
            notes.append(f"SATURATED: {auditor}'s statistic is at most {ceiling:g} and the "
                         f"references' already reaches {rows['max_reference'].max():.3f}, so no "
                         f"margin can exceed {ceiling / rows['max_reference'].max():.3f}: its "
                         f"verdicts ({said}) cannot tell these models from the references.")
    statuses = set(recovery["status"]) if "status" in recovery else set()
    if not statuses & set(RANKABLE):
        why = (", ".join(f"{f}: {s}" for f, s in
                         recovery.drop_duplicates("family")[["family", "status"]].itertuples(index=False))
               if len(recovery) else "its anomalous models are global defects with no slice")
        suite = f"The {suite_name} suite" if suite_name else "This suite"
        notes.append(f"{suite} has no localizable model, no anomalous model whose "
                     f"planted slice is made of the world's factors ({why}): Table 4 has no slice "
                     "to rank. A missing_class model has one (its class; the demo suite's "
                     "missing-star).")
    return notes


def _verdict(rule: dict[str, Any]) -> dict[str, Any]:
    return {"max_reference": rule["max_reference_abar"], "margin": rule["margin"],
            "p_value": rule["p_value"], "detected": rule["detected"]}


def table3(detections: pd.DataFrame, family_order: list[str]) -> pd.DataFrame:
    """Table 3 in Table 1's layout: rows = family (n_models), columns = auditor, values = the
    fraction of the family's models detected."""
    anomalous = detections[detections["role"] == ROLE_ANOMALOUS]
    wide = (anomalous.assign(detected=anomalous["detected"].astype(bool))
            .pivot_table(index="family", columns="auditor", values="detected", aggfunc="mean",
                         sort=False))
    wide.columns.name = None
    wide.insert(0, "n_models", anomalous.groupby("family", sort=False)["model"].nunique())
    wide = wide.reindex([f for f in family_order if f in wide.index])
    return wide.reset_index()


def relation_counts(detections: pd.DataFrame, family_order: list[str]) -> pd.DataFrame:
    """Table 3's detections by what their top finding has to do with the planted slice: per
    (family, auditor), the anomalous models detected and how many of those top findings lie in
    the slice, share a factor with it, are unrelated to it, are none (a relative score of 0 can
    top references that all score below it), or have no slice to relate to."""
    anomalous = detections[detections["role"] == ROLE_ANOMALOUS]
    rows = []
    for (family, auditor), group in anomalous.groupby(["family", "auditor"], sort=False):
        hits = group[group["detected"].astype(bool)]
        relations = hits["top_finding_relation"]
        rows.append({"family": family, "auditor": auditor, "n_models": len(group),
                     "n_detected": len(hits),
                     **{f"detected_{relation.replace(' ', '_')}": int((relations == relation).sum())
                        for relation in RELATIONS}})
    table = pd.DataFrame(rows)
    if len(table):
        rank = {family: position for position, family in enumerate(family_order)}
        table = table.sort_values(
            ["family", "auditor"], kind="stable",
            key=lambda column: column.map(rank).fillna(len(rank)) if column.name == "family"
            else column).reset_index(drop=True)
    return table


def recovery_frame(results: dict[tuple[str, str], AuditResult], references: list[str],
                   slices: dict[str, Any], families: dict[str, str], factors: dict[str, list[str]],
                   not_expressible: str, strengths: dict[str, Any] | None = None,
                   expresses: dict[str, Any] | None = None,
                   took: dict[str, bool | None] | None = None) -> pd.DataFrame:
    """Table 4: one row per (auditor, anomalous model): the planted slice, its rank in the
    model's ranking and in each reference's, and precision@k."""
    rows = []
    for auditor in sorted({a for a, _ in results}):
        objective = AUDITORS.get(auditor).objective
        for model, planted in slices.items():
            row: dict[str, Any] = {"auditor": auditor, "model": model,
                                   "family": families[model]}
            if planted is None:
                continue  # a global defect (stark families): no slice to recover
            if planted == not_expressible:
                rows.append({**row, "planted_slice": "", "status": not_expressible})
                continue
            label = " & ".join(f"{k}={v}" for k, v in planted.items())
            if any(f not in factors for f in planted):
                rows.append({**row, "planted_slice": label, "status": "not in this world"})
                continue
            reach = (expresses or {}).get(auditor)
            if reach is not None and not reach(planted):  # e.g. a surrogate grid without it
                rows.append({**row, "planted_slice": label, "arity": len(planted),
                             "strength": (strengths or {}).get(model, np.nan),
                             "implant_took": (took or {}).get(model), "status": OUTSIDE_GRID})
                continue
            result = results[(auditor, model)]
            reference_ranks = [slice_rank(results[(auditor, r)], objective, planted)
                               for r in references]
            rank = slice_rank(result, objective, planted)
            row.update(planted_slice=label, arity=len(planted),
                       strength=(strengths or {}).get(model, np.nan),
                       implant_took=(took or {}).get(model),
                       status="ranked" if np.isfinite(rank) else "not found",
                       rank=rank, best_reference_rank=np.nanmin(reference_ranks)
                       if np.isfinite(reference_ranks).any() else np.nan,
                       reference_ranks=" ".join("-" if np.isnan(r) else str(int(r))
                                                for r in reference_ranks),
                       first_for_no_reference=bool(all(r != 1 for r in reference_ranks)),
                       n_findings=len(ranked(result.findings, objective)))
            for k in PRECISION_AT:
                row[f"precision@{k}"] = precision_at(result, objective, planted, k)
            rows.append(row)
    frame = pd.DataFrame(rows)
    for column in ("rank", "best_reference_rank", "n_findings"):  # whole numbers, NaN allowed
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame


def recovery_rates(recovery: pd.DataFrame) -> pd.DataFrame:
    """Table 4 over many models: per auditor, slice arity and strength, the share of models whose
    planted slice ranks first (top-1) and within the first five (top-5), with 95% Wilson
    intervals. A slice no finding lies in counts as a miss; a model whose implant check failed
    (``implant_took`` False: no defect to find) is left out."""
    rows = []
    # a family's strength is on its own scale (a share of the slice, a blur radius): by family
    for (auditor, family, arity, strength), group in _took(_rankable(recovery)).groupby(
            ["auditor", "family", "arity", "strength"], sort=True, dropna=False):
        rows.append({"auditor": auditor, "family": family, "arity": int(arity),
                     "strength": strength, **_top_k_rates(group)})
    return pd.DataFrame(rows)


def recovery_by_arity(recovery: pd.DataFrame) -> pd.DataFrame:
    """``recovery_rates`` pooled over strengths: per auditor, family and slice arity, the models
    whose implant took and that the auditor can express, how many distinct slices they hold (a
    slice's models at two strengths are not independent draws), top-1 and top-5 with 95% Wilson
    intervals, and ``outside``: the models that took but lie outside the auditor's factors
    (``OUTSIDE_GRID``, a miss by design, counted apart)."""
    took = _took(recovery[recovery["status"].isin((*RANKABLE, OUTSIDE_GRID))])
    rows = []
    for (auditor, family, arity), group in took.groupby(["auditor", "family", "arity"],
                                                        sort=True):
        expressible = group[group["status"].isin(RANKABLE)]
        row = {"auditor": auditor, "family": family, "arity": int(arity),
               "n_slices": expressible["planted_slice"].nunique()}
        row.update(_top_k_rates(expressible) if len(expressible) else
                   {"n_models": 0, **{f"top{k}{part}": np.nan for k in TOP_K
                                      for part in ("", "_low", "_high")}})
        rows.append({**row, "outside": int((group["status"] == OUTSIDE_GRID).sum())})
    return pd.DataFrame(rows)


def _rankable(recovery: pd.DataFrame) -> pd.DataFrame:
    return recovery[recovery["status"].isin(RANKABLE)] if "status" in recovery else recovery


def _took(recovery: pd.DataFrame) -> pd.DataFrame:
    """The rows whose implant took (or was not checked): a slice whose implant did not take holds
    no defect to find."""
    if "implant_took" not in recovery:
        return recovery
    return recovery[recovery["implant_took"].astype("boolean").fillna(True).astype(bool)]


def _top_k_rates(group: pd.DataFrame) -> dict[str, Any]:
    """n_models, and for each k of TOP_K the share whose slice ranks within the first k with its
    95% Wilson interval (a slice not found is a miss)."""
    ranks = group["rank"].astype("float64")
    row: dict[str, Any] = {"n_models": len(group)}
    for k in TOP_K:
        hits = int((ranks <= k).sum())  # NaN (not found) is never <= k
        low, high = proportion_confint(hits, len(group), alpha=0.05, method="wilson")
        row.update({f"top{k}": hits / len(group), f"top{k}_low": low, f"top{k}_high": high})
    return row


def calibration_frame(detections: pd.DataFrame, results: dict[tuple[str, str], AuditResult],
                      references: list[str], checking: list[str], fitting: list[str],
                      score: str) -> pd.DataFrame:
    """Each auditor's false-positive rates on the held-out references (null models: no planted
    defect), beside their nominal levels: Table 3's rule (above every reference; nominal 1/(R+1)
    under exchangeability) and "any significant finding" (relative: Benjamini-Hochberg at
    SIGNIFICANCE_FDR over the model's subgroups, whose family-wise error under the global null
    is at most that level; absolute: only for an auditor that keeps significant findings only,
    any finding), with 95% Wilson intervals.

    One row per auditor and half (``design``): the checking half (``checking``: never part of
    the baseline, judged exactly as an anomalous model) and the fitting half (``fitting``: under
    the relative score each is in the baseline and left out of its own, as a reference is, so
    it is one more model like the others; a half with no model gives no row). ``baseline``
    names the models the half's relative scores were measured against and ``df`` the fewest
    Student-t degrees of freedom of its p-values (NaN under the absolute score)."""
    rows = []
    nulls = detections[detections["role"] == ROLE_HELD_OUT]
    relative = score == "relative"
    for auditor in sorted({a for a, _ in results}):
        cls = AUDITORS.get(auditor)
        for design, models in ((CHECKING_HALF, checking), (FITTING_HALF, fitting)):
            rule = nulls[(nulls["auditor"] == auditor) & nulls["model"].isin(list(models))]
            if not len(rule):
                continue
            flagged = int(rule["detected"].astype(bool).sum())
            low, high = proportion_confint(flagged, len(rule), alpha=0.05, method="wilson")
            counts = [baseline_count(results[(auditor, m)]) for m in models] if relative else []
            row = {"auditor": auditor, "design": design, "held_out": len(rule),
                   "baseline": (baseline_text(len(references), len(fitting), design)
                                if relative else "references' statistics"),
                   "df": min(counts) - 1 if counts else np.nan,
                   "table3_false_positives": flagged,
                   "table3_rate": flagged / len(rule), "table3_low": low, "table3_high": high,
                   "table3_nominal": 1 / (len(references) + 1)}
            any_significant = [_any_significant(results[(auditor, m)], cls, score) for m in models]
            known = [a for a in any_significant if a is not None]
            if known:
                hits = sum(known)
                low, high = proportion_confint(hits, len(known), alpha=0.05, method="wilson")
                row.update(any_significant=hits, any_significant_rate=hits / len(known),
                           any_significant_low=low, any_significant_high=high,
                           any_significant_nominal=SIGNIFICANCE_FDR)
            rows.append(row)
    return pd.DataFrame(rows)


def baseline_text(references: int, fitting: int, design: str) -> str:
    """Which models a half's relative scores were measured against, in words."""
    pooled = f"{references} references" + (f" + {fitting} fitting held-out" if fitting else "")
    return pooled + (", each model left out of its own" if design == FITTING_HALF else "")


def _any_significant(result: AuditResult, cls, score: str) -> bool | None:
    """Whether a result has a significant finding on the auditor's main objective, its p-values
    against the baseline it was scored against (None: no test defines one for it under this
    score)."""
    findings = ranked(result.findings, cls.objective)
    if score == "relative":
        return any(significant(findings, baseline_count(result)))
    return bool(findings) if cls.filters_findings else None


def false_positive_rates(results: dict[tuple[str, str], AuditResult],
                         references: list[str]) -> pd.DataFrame:
    """For auditors whose findings pass a test (caption_lift): the share of references with any
    finding, the method's false-positive rate (a reference has no planted defect)."""
    rows = []
    for auditor in sorted({a for a, _ in results}):
        if not AUDITORS.get(auditor).filters_findings:
            continue
        flagged = [r for r in references if results[(auditor, r)].findings]
        rows.append({"auditor": auditor, "references": len(references),
                     "with_a_finding": len(flagged), "false_positive_rate":
                     len(flagged) / len(references) if references else np.nan,
                     "flagged": " ".join(flagged)})
    return pd.DataFrame(rows)


def top_findings(results: dict[tuple[str, str], AuditResult], count: int = 5) -> pd.DataFrame:
    """The top ``count`` findings of each (auditor, model) on the auditor's main objective."""
    rows = []
    for (auditor, model), result in results.items():
        objective = AUDITORS.get(auditor).objective
        for position, finding in enumerate(ranked(result.findings, objective)[:count], start=1):
            rows.append({"auditor": auditor, "model": model, "rank": position,
                         "subgroup": finding.label(), "statistic": finding.statistic,
                         "low": finding.low, "high": finding.high, "n_images": finding.n_images})
    return pd.DataFrame(rows)


def planted_slices(suite, world, runs_root=None,
                   implants: dict[str, dict | None] | None = None) -> dict[str, Any]:
    """Each anomalous model's planted slice (``AnomalyFamily.planted_slice``), from its implant
    record (``implants``: already read, by model name; else read here)."""
    implants = implants if implants is not None else implant_records(suite, runs_root)
    slices = {}
    for spec in suite.anomalies:
        family = FAMILIES.get(spec.family)(spec.params, world, spec.seed)
        slices[spec.name] = family.planted_slice(implants[spec.name])
    return slices


def implant_records(suite, runs_root=None) -> dict[str, dict | None]:
    """Each anomalous model's stored implant record (None: not checked yet)."""
    return {spec.name: read_implant(suite, spec, runs_root) for spec in suite.anomalies}


def localizable(slices: dict[str, Any], factors: dict[str, list[str]]) -> list[str]:
    """The models whose planted slice is made of the world's factors."""
    return [m for m, s in slices.items() if isinstance(s, dict) and all(f in factors for f in s)]


def model_strengths(suite) -> dict[str, Any]:
    """Each anomalous model's strength: the value of its family's ``strength`` parameter (its
    default where the entry leaves it out); NaN for a family without one."""
    out = {}
    for spec in suite.anomalies:
        family = FAMILIES.get(spec.family)
        knob = family.strength
        out[spec.name] = (np.nan if knob is None else
                          spec.params.get(knob, getattr(family.Params(), knob, np.nan)))
    return out


def discovery_tables(suite, results: dict[tuple[str, str], AuditResult], world,
                     runs_root=None, score: str = "relative") -> dict[str, pd.DataFrame]:
    """Table 3, the per-model detections, Table 4 (per model and as recovery rates), the
    held-out references' false-positive rates and the top findings, keyed by file name.
    ``results`` are scored as ``score`` says (``relative.scored_results``)."""
    references = [s.name for s in suite.references]
    held_out = [s.name for s in suite.held_out]
    families, order = suite.table_rows()  # a family, or a row of one (adversarial_linf)
    implants = implant_records(suite, runs_root)
    slices = planted_slices(suite, world, runs_root, implants)
    detections = detection_frame(results, references, families, held_out, score, slices,
                                 world.factors())
    expresses = {auditor.name: (lambda planted, auditor=auditor: auditor.expresses(planted, world))
                 for auditor, _, _ in planned(suite, world, sorted({a for a, _ in results}))}
    took = {name: (record or {}).get("passed") for name, record in implants.items()}
    recovery = recovery_frame(results, references, slices, families, world.factors(),
                              NOT_EXPRESSIBLE, model_strengths(suite), expresses, took)
    return {"discovery-detection": table3(detections, order),
            "discovery-detection-per-model": detections,
            "discovery-detection-relations": relation_counts(detections, order),
            "discovery-recovery": recovery,
            "discovery-recovery-rates": recovery_rates(recovery) if "arity" in recovery
            else pd.DataFrame(),
            "discovery-recovery-by-arity": recovery_by_arity(recovery) if "arity" in recovery
            else pd.DataFrame(),
            "discovery-calibration": calibration_frame(
                detections, results, references, [s.name for s in suite.null_check],
                [s.name for s in suite.null_fit], score),
            "discovery-top-findings": top_findings(results),
            "discovery-false-positives": false_positive_rates(results, references)}

