"""Records from a finished run: one per method, each computed from that method's scores alone
(schema.py says why), from the score tables detect.py and localize.py stored."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from counteraudit.anomalies.image_sets import localizable
from counteraudit.evaluate.records.schema import (SCHEMA_V1, Code, Comparison, Cost, FamilyResult, Hardware,
                                                  LocalizationResult, Method, Numerics, Population,
                                                  Record, RecordV1, Verdicts, sha256_of)
from counteraudit.evaluate.release.provenance import code_version
from counteraudit.evaluate.scoring.explain_time import explain_time_table
from counteraudit.evaluate.scoring.localization import replicate_localization_table
from counteraudit.evaluate.scoring.model_blind import model_blind_table
from counteraudit.evaluate.scoring.pairwise import family_rate_differences
from counteraudit.evaluate.scoring.stage import (detection_score_tables, detection_scores,
                                                 localization_score_tables, localization_scores,
                                                 localized_methods, unscored_tables)
from counteraudit.evaluate.scoring.tables import configurations, stored_detection_tables
from counteraudit.evaluate.scoring.verdicts import null_plan
from counteraudit.evaluate.scoring.zoo import CONTROLS
from counteraudit.explain.settings import MethodSpec
from counteraudit.explain.base import METHODS
from counteraudit.train.core import numerics
from counteraudit.train.core.plugin_files import plugin_digest
from counteraudit.train.core.suite import Suite
from counteraudit.train.implant_checks import read_implant

NOT_APPLICABLE_REASON = "not applicable: a model-level method explains the model, not an input"
MODEL_BLIND_REASON = "model-blind: its maps are the same for every model, so it has no AUROC"
NO_SCORES_REASON = "no scores: every anomaly score of its images is flagged"
NOT_RUN_REASON = ("not run: the record was made from the detection images alone "
                  "(counteraudit record --detection-only); run counteraudit localize for Table 2")


class UnfinishedRunError(ValueError):
    """A run a record cannot be made from yet; the message says what is missing and the fix."""


def check_recordable(suite: Suite, distance_name: str, methods: Sequence[str], runs_root=None,
                     detection_only: bool = False) -> None:
    """One ``UnfinishedRunError`` before any work unless the suite asks for verdicts (null models
    and ``[evaluate] p_value``) and the run stored every score table the records read (detect.py's
    and, unless ``detection_only``, localize.py's)."""
    if null_plan(suite) is None:
        raise UnfinishedRunError(
            f"suite file {suite.path}: a record holds each family's verdict, which needs null "
            "p-values: set [references] held_out (2 or more clean models) and [evaluate] p_value "
            "(or give --p-value), then run counteraudit detect. Nothing was written.")
    wanted = detection_score_tables(suite, list(methods)) + (
        [] if detection_only else localization_score_tables(suite, localized_methods(list(methods))))
    missing = unscored_tables(suite, distance_name, wanted, runs_root)
    if missing:
        where = f"--suite {suite.name}" + (f" --runs-dir {runs_root}" if runs_root else "")
        raise UnfinishedRunError(
            f"the run of suite {suite.name!r} is not finished: {len(missing)} score table(s) of "
            f"distance {distance_name} are not stored ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}); run counteraudit detect {where}"
            + ("" if detection_only else f" and counteraudit localize {where} (or record with "
               "--detection-only)") + " with the same --method and --distance first. "
            "Nothing was written.")


def hardware() -> Hardware:
    """The machine writing the record: its CPU, the CPU's vector extensions, its GPU if any."""
    flags = sorted(flag for flag in numerics.cpu_flags() if flag.startswith("avx") or flag == "fma")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return Hardware(cpu=numerics.cpu_model(), cpu_flags=flags, gpu=gpu)


def method_entry(spec: MethodSpec) -> Method:
    """The method as it ran: its parameters (the suite's [methods.<name>] table with the method's
    defaults filled in, as ``method_specs`` types them), their digest and the plug-in file that
    defined it."""
    parameters = _json_data(dataclasses.asdict(spec.params))
    return Method(name=spec.name, parameters=parameters, parameters_sha256=sha256_of(parameters),
                  plugin_sha256=plugin_digest(METHODS.get(spec.name)))


def _json_data(value: Any) -> Any:
    """A TOML table as JSON data (tuples as lists)."""
    if isinstance(value, Mapping):
        return {str(k): _json_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_data(v) for v in value]
    return value


def _number(value: Any) -> float | None:
    return None if value is None or not np.isfinite(float(value)) else float(value)


def family_results(families: pd.DataFrame) -> list[FamilyResult]:
    return [FamilyResult(family=str(row.family), n_models=int(row.n_models),
                         n_detected=int(row.n_detected), n_not_detected=int(row.n_not_detected),
                         n_inconclusive=int(row.n_inconclusive),
                         n_implant_failed=int(row.n_implant_failed), rate=_number(row.rate),
                         ci_low=_number(row.ci_low), ci_high=_number(row.ci_high),
                         verdict=str(row.verdict), paper_rate=_number(row.paper_rate),
                         fragile=bool(getattr(row, "fragile", False)))
            for row in families.itertuples(index=False)]


def localization_results(suite: Suite, scores: pd.DataFrame | None,
                         reason: str | None) -> list[LocalizationResult]:
    """Per localizable configuration of the suite: the mean AUROC over its replicates with its
    interval and chance band, or ``reason`` (or ``NO_SCORES_REASON``) where there is none."""
    configurations_of = {spec.configuration_name: spec.family for spec in localizable(suite)}
    measured = {}
    if reason is None and scores is not None and len(scores):
        table = replicate_localization_table(scores, configurations(suite))
        measured = {row.configuration: row for row in table.itertuples(index=False)}
    results = []
    for configuration, family in configurations_of.items():
        row = measured.get(configuration)
        if row is None or _number(row.mean_auroc) is None:
            results.append(LocalizationResult(
                family=family, configuration=configuration, n_models=0, mean_auroc=None,
                ci_low=None, ci_high=None, chance_low=None, chance_high=None,
                reason=reason or NO_SCORES_REASON))
            continue
        results.append(LocalizationResult(
            family=family, configuration=configuration, n_models=int(row.n_models),
            mean_auroc=float(row.mean_auroc), ci_low=float(row.ci_low), ci_high=float(row.ci_high),
            chance_low=float(row.chance_low), chance_high=float(row.chance_high), reason=None))
    return results


def cost(times: pd.DataFrame) -> Cost:
    row = times.iloc[0]
    return Cost(results=int(row["results"]), timed_results=int(row["timed_results"]),
                images=int(row["images"]), seconds=_number(row["seconds"]),
                cpu_seconds=_number(row["cpu_seconds"]))


def control_comparisons(name: str, own_verdicts: Mapping[str, pd.DataFrame],
                        alpha: float) -> list[Comparison]:
    """The method's paired differences of detection rates with each control of the run (outputs
    only, random maps), per family (``pairwise.family_rate_differences``), each side's per-model
    verdicts from its own table; Holm's adjustment and the simultaneous intervals run over this
    record's rows alone."""
    controls = [control for control in CONTROLS if control != name and control in own_verdicts]
    if name not in own_verdicts or not controls:
        return []
    verdicts = pd.concat([own_verdicts[name], *(own_verdicts[c] for c in controls)],
                         ignore_index=True)
    table = family_rate_differences(verdicts, [(name, control) for control in controls],
                                    alpha=alpha)
    return [Comparison(against=str(row.against), family=str(row.family),
                       rate_difference=float(row.difference), ci_low=float(row.low),
                       ci_high=float(row.high), p_holm=float(row.p_holm))
            for row in table.itertuples(index=False)]


def build_records(suite: Suite, distance, methods: Mapping[str, MethodSpec], population_id: str,
                  runs_root=None, options=None, detection_only: bool = False) -> list[Record]:
    """One record per method of ``methods`` (name -> its spec, as ``method_specs`` gives them;
    ``check_recordable`` first) on the run of ``suite`` in ``runs_root`` whose population id is
    ``population_id``; ``detection_only``: no Table 2, each localizable configuration's entry
    says so (``NOT_RUN_REASON``)."""
    names = list(methods)
    distance_name = distance.name
    check_recordable(suite, distance_name, names, runs_root, detection_only)
    plan = null_plan(suite)
    scores = detection_scores(suite, distance, names, runs_root, options)
    located = localized_methods(names)
    located_scores = (localization_scores(suite, distance, located, runs_root, options)
                      if located and not detection_only else None)
    implants = {spec.name: read_implant(suite, spec, runs_root) for spec in suite.anomalies}
    blind, families, own_verdicts = {}, {}, {}
    for name in names:
        own = scores[scores["method"] == name]
        blind[name] = bool(model_blind_table(own)["model_blind"].all()) if len(own) else False
        if not blind[name]:  # its verdicts from its own table: BH over its own models (schema.py)
            tables = stored_detection_tables(suite, own, distance_name, [name], runs_root, implants)
            families[name] = family_results(tables[f"detection-families-{distance_name}"])
            own_verdicts[name] = tables[f"detection-verdicts-per-model-{distance_name}"]
    shared = dict(
        population=Population(suite=suite.name, population_id=population_id,
                              n_references=len(suite.references), n_null_fit=len(plan.fit),
                              n_null_check=len(plan.check)),
        distance=distance_name,
        numerics=Numerics(mode=numerics.requested_mode(), key=numerics.key_tag()["numerics"]),
        code=Code(**code_version()), hardware=hardware(),
        verdicts=Verdicts(test=plan.test, alpha=plan.alpha, power=plan.power))
    records = []
    for name in names:
        reason = (NOT_APPLICABLE_REASON if name not in located else
                  MODEL_BLIND_REASON if blind[name] else
                  NOT_RUN_REASON if detection_only else None)
        own_located = (located_scores[located_scores["method"] == name]
                       if located_scores is not None and reason is None else None)
        records.append(RecordV1(
            schema=SCHEMA_V1, method=method_entry(methods[name]), model_blind=blind[name],
            families=families.get(name, []),
            localization=localization_results(suite, own_located, reason),
            comparisons=control_comparisons(name, own_verdicts, plan.alpha),
            cost=cost(explain_time_table(suite, [name], runs_root)), **shared))
    return records
