"""Score tables -> the paper's Tables 1 and 2, with their per-model, per-layer, null-row and
outputs-only comparisons, keyed by the file names ``write_tables`` gives them."""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import pandas as pd

from counteraudit.anomalies.image_sets import localizable, set_sizes
from counteraudit.evaluate.scoring.baseline import (BASELINE, delta_table, detection_versus_baseline,
                                                    fraction_intervals, fraction_table,
                                                    localization_versus_baseline, null_rate_table)
from counteraudit.evaluate.scoring.detection import (NO_LAYER, NULL_FAMILY, ROLE_ANOMALOUS, detection_table,
                                                     null_rates, table1)
from counteraudit.evaluate.scoring.localization import (NOT_APPLICABLE, PAPER_SUCCESS_AUROC,
                                                        localization_table, paper_layout,
                                                        replicate_localization_table, table2)
from counteraudit.evaluate.scoring.explain_time import EXPLAIN_TIME, explain_time_table
from counteraudit.evaluate.scoring.model_blind import (detection_blind, localization_blind, mark_columns,
                                                       mark_rows, model_blind_table)
from counteraudit.evaluate.scoring.provenance import PROVENANCE, provenance_table
from counteraudit.evaluate.scoring.zoo import paper_rule_basis, summary_caption, zoo_summary
from counteraudit.evaluate.scoring.stability import outlying_nulls, with_stability
from counteraudit.evaluate.scoring.verdicts import calibration, method_power, null_plan, verdict_table
from counteraudit.train.checkpoint import trained_metrics
from counteraudit.train.core.model_spec import PAPER_REFERENCES
from counteraudit.train.core.suite_schema import PAPER_LOCALIZATION_IMAGES
from counteraudit.train.core.suite import Suite
from counteraudit.train.implant_checks import read_implant



def configurations(suite: Suite) -> dict[str, str]:
    """Every anomalous model -> the configuration it is a replicate of (itself, if none)."""
    return {spec.name: spec.configuration_name for spec in suite.anomalies}


def seeds_per_configuration(suite: Suite) -> int:
    """The most replicates (seeds) any anomalous configuration has: 1 without replicates."""
    return max(Counter(configurations(suite).values()).values(), default=1)


def detection_tables(suite: Suite, scores: pd.DataFrame, distance_name: str, *,
                     implants: dict[str, dict | None] | None = None,
                     accuracies: Mapping[str, float] | None = None) -> dict[str, pd.DataFrame]:
    """Table 1 (families in registry order, stark first), the per-model detection table (the
    replicates of a configuration side by side, its ``configuration`` column) and the per-layer
    rows of layered methods, keyed by the file names ``write_tables`` gives them. With a null
    plan (``[evaluate] p_value``): the verdict tables too (``verdict_tables``)."""
    references = [s.name for s in suite.references]
    families, order = suite.table_rows()  # a family, or a row of one (adversarial_linf)
    nulls = [s.name for s in suite.held_out]
    per_model = detection_table(scores, references, families=families, null_models=nulls)
    configuration = configurations(suite)
    per_model.insert(per_model.columns.get_loc("model") + 1, "configuration",
                     [configuration.get(m, m) for m in per_model["model"]])
    per_layer = detection_table(scores, references, families=families, per_layer=True,
                                null_models=nulls)
    per_layer = per_layer[per_layer["layer"] != NO_LAYER]
    summary = table1(per_model, family_order=order)
    tables = {}
    if nulls:  # Table 1's last row: how often the rule flags a normal model
        rates = null_rates(per_model, len(references))
        tables[f"detection-null-{distance_name}"] = null_rate_table(rates)
        row = {"family": NULL_FAMILY, "n_models": len(nulls),
               **dict(zip(rates["method"], rates["false_positive_rate"]))}
        summary = pd.concat([summary, pd.DataFrame([row])], ignore_index=True)
    tables[f"detection-model-blind-{distance_name}"] = model_blind_table(scores)
    blind = detection_blind(tables, distance_name)  # said in words, never read as "missed"
    tables = {f"detection-{distance_name}": mark_columns(summary, blind), **tables,
              f"detection-per-model-{distance_name}": per_model,
              f"detection-per-layer-{distance_name}": per_layer,
              f"detection-intervals-{distance_name}": mark_columns(
                  fraction_table(fraction_intervals(per_model), order), blind)}
    if BASELINE in set(per_model["method"]) and len(set(per_model["method"]) - set(blind)) > 1:
        versus = detection_versus_baseline(scores[~scores["method"].isin(list(blind))],
                                           per_model[~per_model["method"].isin(list(blind))])
        tables[f"detection-vs-outputs-per-model-{distance_name}"] = versus
        tables[f"detection-vs-outputs-{distance_name}"] = delta_table(
            versus[versus["role"] == ROLE_ANOMALOUS], value="margin_ratio", low="ratio_low",
            high="ratio_high", signed=False)
    plan = null_plan(suite)
    if plan is not None:
        tables.update(verdict_tables(suite, per_model[~per_model["method"].isin(list(blind))],
                                     plan, distance_name, implants or {}, accuracies))
    return tables


def stored_detection_tables(suite: Suite, scores: pd.DataFrame, distance_name: str,
                            methods: Sequence[str], runs_root=None,
                            implants: dict[str, dict | None] | None = None
                            ) -> dict[str, pd.DataFrame]:
    """``detection_tables`` with what the store holds beside the scores: the implant records
    (read here unless given), the held-out models' accuracies, each method's explanation time
    and the run's provenance (``provenance.provenance_table``: numeric mode and CPU of scoring
    and training); each model's metrics.json is read once for the last two."""
    if implants is None:
        implants = {s.name: read_implant(suite, s, runs_root) for s in suite.anomalies}
    metrics = trained_metrics(suite.models, runs_root)
    accuracies = {s.name: float(metrics[s.name]["val_accuracy"]) for s in suite.held_out
                  if s.name in metrics}
    tables = detection_tables(suite, scores, distance_name, implants=implants,
                              accuracies=accuracies)
    tables[EXPLAIN_TIME] = explain_time_table(suite, methods, runs_root)
    tables[PROVENANCE] = provenance_table(len(suite.models), metrics.values())
    return tables


def verdict_tables(suite: Suite, per_model: pd.DataFrame, plan, distance_name: str,
                   implants: dict[str, dict | None],
                   accuracies: Mapping[str, float] | None = None) -> dict[str, pd.DataFrame]:
    """Table 1 with rates, exact intervals and verdicts (``detection-verdicts``), its long form
    (``detection-families``), the same per configuration (``detection-verdicts-configurations``:
    a family of two strengths read apart), the per-model verdicts with every test's p-value
    (``detection-verdicts-per-model``), each method's null population and power
    (``detection-power``), the tests' calibration on the checking nulls
    (``detection-calibration``) and the held-out clean models' distances from each other
    (``detection-outlying-nulls``, with ``accuracies``: validation accuracy by model). Every
    verdict says whether one model left out flips it (``stability.with_stability``)."""
    passed = {name: (None if record is None else bool(record["passed"]))
              for name, record in implants.items()}
    verdicts, families, per_configuration = with_stability(
        per_model, plan, configurations=configurations(suite), implants_passed=passed,
        family_order=suite.table_rows()[1])
    return {f"detection-verdicts-{distance_name}": verdict_table(families),
            f"detection-verdicts-configurations-{distance_name}":
                verdict_table(per_configuration, row="configuration"),
            f"detection-families-{distance_name}": families,
            f"detection-verdicts-per-model-{distance_name}": verdicts,
            f"detection-power-{distance_name}": method_power(per_model, plan),
            f"detection-calibration-{distance_name}": calibration(per_model, plan),
            f"detection-outlying-nulls-{distance_name}": outlying_nulls(per_model, plan,
                                                                        accuracies, families)}


def localization_tables(scores: pd.DataFrame, distance_name: str,
                        suite: Suite | None = None,
                        not_applicable: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """Table 2 (Caricatures per layer, then their layer average), the per-model localization table
    (AUROC, bootstrap interval, chance band) and the per-layer rows of layered methods, keyed by the
    file names ``write_tables`` gives them. A ``suite`` with replicated configurations adds Table 2
    over replicates (``localization-replicates``): each configuration's mean AUROC, its interval
    resampling models, then images. ``not_applicable``: methods localization does not apply to
    (model-level ones, whose ``scores`` hold none): Table 2 gives each a row of
    ``NOT_APPLICABLE``."""
    if scores.empty:  # only model-level methods: nothing to localize
        empty = localization_table(pd.DataFrame(columns=["method", "model", "image", "score",
                                                         "abnormal"]))
        models = [spec.name for spec in localizable(suite)] if suite is not None else []
        return {f"localization-{distance_name}": with_not_applicable(
                    pd.DataFrame(columns=["method", *models]), not_applicable),
                f"localization-per-model-{distance_name}": empty,
                f"localization-per-layer-{distance_name}": empty.assign(layer=NO_LAYER)}
    per_model = localization_table(scores)
    per_layer = localization_table(scores, per_layer=True)
    per_layer = per_layer[per_layer["layer"] != NO_LAYER]
    blind_tables = {f"localization-model-blind-{distance_name}": model_blind_table(scores)}
    blind = localization_blind(blind_tables, distance_name)  # no AUROC: said, not left blank
    # the paper's layout: Caricatures one row per layer, their layer average an extra row
    tables = {f"localization-{distance_name}": mark_rows(with_not_applicable(
                  table2(paper_layout(per_model, per_layer)), not_applicable), blind),
              f"localization-per-model-{distance_name}": per_model,
              f"localization-per-layer-{distance_name}": per_layer, **blind_tables}
    if suite is not None and any(spec.replicate is not None for spec in suite.anomalies):
        replicated = replicate_localization_table(scores, configurations(suite))
        tables[f"localization-replicates-{distance_name}"] = replicated
    if BASELINE in set(scores["method"]) and len(set(scores["method"]) - set(blind)) > 1:
        versus = localization_versus_baseline(scores[~scores["method"].isin(list(blind))])
        tables[f"localization-vs-outputs-per-model-{distance_name}"] = versus
        tables[f"localization-vs-outputs-{distance_name}"] = delta_table(versus)
    return tables


def with_not_applicable(table: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """Table 2 (``table2``: a "method" column, one column per model) with a row per method of
    ``methods`` reading ``NOT_APPLICABLE`` in every model's column (or in a column "localization"
    where the table has no model column): visibly not computed, never a NaN that reads like a
    failed run."""
    if not methods:
        return table
    models = [column for column in table.columns if column != "method"] or ["localization"]
    rows = pd.DataFrame([{"method": method, **{model: NOT_APPLICABLE for model in models}}
                         for method in methods])
    return pd.concat([table.astype({model: object for model in models if model in table}), rows],
                     ignore_index=True)


def chance_band_note(per_model: pd.DataFrame) -> str:
    """What the per-model chance bands (their median, over the models) say an AUROC must exceed:
    the paper's 0.7 only where the band lies below it (with p = 40 it is about [0.37, 0.63]; with
    p = 10, [0.24, 0.76])."""
    low, high = per_model[["chance_low", "chance_high"]].median()
    said = (f"At these set sizes an AUROC inside [{low:.2f}, {high:.2f}] cannot be told from "
            "chance (95% of label permutations; the median band over the models, each model's own "
            f"in the per-model table), so a method localizes only above {high:.2f}")
    if high < PAPER_SUCCESS_AUROC:
        return f"{said}; the paper's mark of success, {PAPER_SUCCESS_AUROC}, lies above the band."
    return (f"{said}: the paper's mark of success, {PAPER_SUCCESS_AUROC}, lies inside the band "
            "at these set sizes (more images narrow it).")


def localization_power_note(suite: Suite) -> str | None:
    """Why a suite with fewer references or images than the paper localizes less sharply, or None."""
    references, (_, p) = len(suite.references), set_sizes(suite)
    if references >= PAPER_REFERENCES and p >= PAPER_LOCALIZATION_IMAGES:
        return None
    return (f"This suite uses {references} references and p = {p} images per set (the paper: "
            f"{PAPER_REFERENCES} and {PAPER_LOCALIZATION_IMAGES}). The anomaly score divides by "
            f"the references' spread on each image, here estimated from "
            f"{references * (references - 1) // 2} pairs: with fewer references that estimate is "
            "noisier, which pulls AUROCs towards 0.5, and with fewer images each AUROC varies more "
            "from one draw of images to the next.")


def zoo_summary_tables(tables: dict[str, pd.DataFrame], distance_name: str,
                       n_references: int,
                       not_localized: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """``zoo-summary-<distance>`` (``zoo.zoo_summary``: methods ranked by the defects they detect
    and localize beyond outputs-only) where ``tables`` holds both Table 1's per-model rows and the
    localization comparison with outputs-only, else nothing; ranked by the family verdicts where
    ``tables`` holds them (a suite with null models), else by the paper's rule.
    ``not_localized``: the model-level methods, whose localization columns read "not
    applicable"."""
    per_model = tables.get(f"detection-per-model-{distance_name}")
    detection = tables.get(f"detection-vs-outputs-per-model-{distance_name}")
    localization = tables.get(f"localization-vs-outputs-per-model-{distance_name}")
    if per_model is None or localization is None or BASELINE not in set(per_model["method"]):
        return {}
    summary = zoo_summary(per_model, localization, n_references, detection_versus=detection,
                          not_localized=not_localized,
                          model_blind=list(detection_blind(tables, distance_name)),
                          families=tables.get(f"detection-families-{distance_name}"))
    times = tables.get(EXPLAIN_TIME)
    if times is not None:  # each method's cost beside what it finds
        summary = summary.merge(times[["method", "cpu_seconds"]].rename(
            columns={"cpu_seconds": "explain_cpu_seconds"}), on="method", how="left")
    return {f"zoo-summary-{distance_name}": summary}


def zoo_summary_caption(suite: Suite, families: pd.DataFrame | None, distance_name: str) -> str:
    """The zoo summary's caption (``zoo.summary_caption``) for this suite: the verdicts' test
    where ``families`` (the family verdicts) is given, else the paper's rule and what it rests
    on (``zoo.paper_rule_basis``)."""
    if families is not None and len(families):
        return summary_caption(distance_name, test=str(families["test"].iloc[0]))
    return summary_caption(distance_name, basis=paper_rule_basis(
        len(suite.references), seeds_per_configuration(suite)))
