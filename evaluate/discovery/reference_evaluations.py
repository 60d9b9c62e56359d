"""The baseline models' statistics on every model's subgroups: the baseline of the relative
score.

The baseline (``baseline_models``) is the suite's references and, where the suite has held-out
references, the half that fits Table 1's null p-values (``Suite.null_fit``): clean models trained
like the references, so a subgroup's p-value has the power of the whole null population. The
checking half (``Suite.null_check``) is never part of it: each of its models is judged exactly as
an anomalous model is, which is what ``discovery-calibration`` reads. A suite without held-out
models has its references alone as the baseline, as before. Below, "reference" means a baseline
model.

For an auditor whose subgroups are the same for every model (``adaptive = False``: twise's
covering array, error_ratio's factor values), each reference's own stored result already holds
its statistic on every subgroup, on the same images. For an *adaptive* auditor (a search; a test
of the model's own errors) the references are evaluated on each model's subgroups here, after the
findings: one work item per reference loads it once and runs ``Auditor.reevaluate`` on every
model's result it still lacks.

Two stores, both in the store every suite shares:

- ``store/reference-findings/<auditor>/<hash>/``: one reference's findings on one model's
  subgroups (key: the model's findings key and the reference's model key), a keyed artifact like
  the findings themselves;
- ``store/subgroup-predictions/<hash of reference key and world>/``: the reference's predictions
  on each generated subgroup (``batch-*.npz``, one per work item, each written atomically), so a
  subgroup that several models' searches visit (surrogate_search's subdomains) is predicted once
  per reference, not once per model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


from counteraudit.evaluate.discovery.auditors import AUDITORS, AuditResult, Finding
from counteraudit.evaluate.discovery.prediction_cache import PredictionCache, predictions_dir
from counteraudit.evaluate.discovery.relative import DEFAULT_SCORE, MIN_REFERENCES, SCORES
from counteraudit.evaluate.discovery.relative_results import finding_key, relative_result
from counteraudit.evaluate.discovery.stage import (findings_dir, findings_key, load_findings, load_suite_findings,
                                                   planned, search_panel, suite_auditor, suite_auditors)
from counteraudit.explain.stage import method_run_context
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.artifacts import (atomic_write_json, read_json,
                                               stable_hash, store_dir)
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.payloads import json_fields
from counteraudit.train.core.stage import (RunOptions, StageItem, executor_config, plan_stage, resolved_runs_dir,
                                           run_stage)
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds import build_world

REFERENCE_FINDINGS = "reference-findings"
REFERENCE_FINDINGS_STORE = KeyedArtifact(payload="findings.json", marker="params.json",
                                         digest_field="findings_sha256",
                                         what="a reference's findings on a model's subgroups",
                                         marker_what="stored index", fields={"key": dict},
                                         check=json_fields(findings=list))


def baseline_models(suite: Suite) -> list[ModelSpec]:
    """The models every subgroup's relative score is measured against: the references, then the
    fitting held-out references (none where the suite has no held-out models)."""
    return [*suite.references, *suite.null_fit]


def reference_findings_key(findings_key: dict[str, Any], reference: ModelSpec) -> dict[str, Any]:
    """A reference's evaluation of one model's result: that result's key and the reference."""
    return {"findings": findings_key, "reference_id": reference.key}


def reference_findings_dir(runs_root, key: dict[str, Any]) -> Path:
    return (store_dir(runs_root) / REFERENCE_FINDINGS / key["findings"]["auditor"]
            / stable_hash(key, length=16))


def save_reference_findings(directory: Path, key: dict[str, Any], findings: list[Finding]) -> None:
    REFERENCE_FINDINGS_STORE.save(directory, key, lambda path: atomic_write_json(
        path, {"findings": [f.to_dict() for f in findings]}))


def load_reference_findings(directory: Path) -> list[Finding]:
    return [Finding.from_dict(f) for f in
            read_json(REFERENCE_FINDINGS_STORE.payload_path(directory))["findings"]]


# ---------------------------------------------------------------- the stage
@dataclass(frozen=True)
class ResultToEvaluate:
    """An adaptive auditor's stored result on one model, to evaluate a reference on."""
    auditor: str
    findings_directory: str
    findings_key: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ReferenceItem(StageItem):
    """One reference and every result it is evaluated on (the reference is loaded once)."""
    reference: str
    results: tuple[ResultToEvaluate, ...]
    device: str | None = None


def evaluate_reference(item: ReferenceItem) -> dict[str, int]:
    """Work item: one reference on every (auditor, model) result listed in ``item.results``."""
    suite, runs_root = item.suite, item.runs_dir
    reference = suite.model(item.reference)
    world = build_world(suite.world, runs_root=runs_root)
    device = pick_device(item.device)
    cache = PredictionCache(predictions_dir(runs_root, reference, suite.world))
    computed = 0
    with method_run_context(reference, device):
        model = load_trained_model(model_dir(runs_root, reference), reference, world, device)
        for result in item.results:
            findings_directory, findings_key = result.findings_directory, result.findings_key
            auditor = suite_auditor(suite, result.auditor)
            auditor.prediction_cache = cache
            findings = auditor.reevaluate(model, world, load_findings(Path(findings_directory)))
            key = reference_findings_key(findings_key, reference)
            save_reference_findings(reference_findings_dir(runs_root, key), key, findings)
            computed += 1
            cache.save()  # what is predicted is kept even if a later result fails
    return {"computed": computed}


def evaluate_references(suite: Suite, options: RunOptions,
                        adaptive_results: list[tuple[Any, ModelSpec, Path, dict[str, Any]]]) -> int:
    """Every missing baseline model's evaluation of the adaptive auditors' results ((auditor,
    model spec, findings directory, findings key) each); one work item per baseline model.
    Returns how many were computed."""
    wanted = [(reference, auditor, spec, directory, key)
              for auditor, spec, directory, key in adaptive_results
              for reference in baseline_models(suite) if reference.name != spec.name]

    def stored(candidate) -> bool:
        reference, _, _, _, key = candidate
        reference_key = reference_findings_key(key, reference)
        return REFERENCE_FINDINGS_STORE.is_stored(reference_findings_dir(options.runs_dir, reference_key),
                                                  reference_key)

    def to_items(missing) -> list[ReferenceItem]:
        by_reference: dict[str, list[ResultToEvaluate]] = {}
        for reference, auditor, _, directory, key in missing:
            by_reference.setdefault(reference.name, []).append(
                ResultToEvaluate(auditor.name, str(directory), key))
        return [ReferenceItem(suite=suite, runs_dir=resolved_runs_dir(options.runs_dir), reference=name,
                              results=tuple(results), device=options.device)
                for name, results in by_reference.items()]
    todo = plan_stage(wanted, stored)
    outcome = run_stage("reference-evaluations", evaluate_reference, todo,
                        executor_config(suite, options, "discover"), to_items=to_items,
                        item_name=lambda item: f"{item.reference} on {len(item.results)} result(s)")
    return outcome.total("computed")


def reference_values(results: dict[tuple[str, str], AuditResult], references: list[str],
                     stored: dict[tuple[str, str, str], list[Finding]]
                     ) -> dict[tuple[str, str], dict[str, dict[tuple[str, str], float]]]:
    """(auditor, model) -> baseline model name -> {finding key: its statistic} (``references``:
    the baseline models' names): their own results for a non-adaptive auditor, else their stored evaluations of the
    model's subgroups (``stored``: (auditor, reference, model) -> findings)."""
    out = {}
    for (auditor, model) in results:
        adaptive = AUDITORS.get(auditor).adaptive
        values = {}
        for reference in references:
            if reference == model:
                continue
            findings = (stored[(auditor, reference, model)] if adaptive
                        else results[(auditor, reference)].findings)
            values[reference] = {finding_key(f): f.statistic for f in findings}
        out[(auditor, model)] = values
    return out


def adaptive_results(suite: Suite, runs_root, auditors: list[str] | None = None,
                     world=None, score: str = DEFAULT_SCORE
                     ) -> list[tuple[Any, ModelSpec, Path, dict[str, Any]]]:
    """(auditor, model spec, findings directory, findings key) of every adaptive auditor's
    stored result in the suite: what the references must be evaluated on."""
    world = world or build_world(suite.world, runs_root=runs_root)
    out = []
    for auditor, budget, seed in planned(suite, world, suite_auditors(suite, auditors)):
        if auditor.adaptive:
            for spec in suite.models:
                key = findings_key(auditor.describe(), spec, suite.world, budget, seed,
                                   search_panel(suite, auditor, spec, score))
                out.append((auditor, spec, findings_dir(runs_root, key), key))
    return out


def check_relative(suite: Suite, score: str) -> None:
    """A relative score needs references to be relative to: one clear error, before any work
    (the held-out models join the baseline, but a suite's relative scores rest on its
    references)."""
    if score not in SCORES:
        raise ValueError(f"{suite.path}: [discover] score = {score!r}; valid: {', '.join(SCORES)}")
    if score == "relative" and len(suite.references) < MIN_REFERENCES:
        raise ValueError(f"{suite.path}: [discover] score = \"relative\" scores each subgroup "
                         f"against the references, and this suite has {len(suite.references)} "
                         f"(at least {MIN_REFERENCES} needed for a spread); set [references] "
                         f"count >= {MIN_REFERENCES}, or score = \"absolute\" (--score absolute) "
                         "to rank by the statistic alone")


def scored_findings(suite: Suite, runs_root=None, auditors: list[str] | None = None, world=None,
                    score: str = DEFAULT_SCORE) -> dict[tuple[str, str], AuditResult]:
    """(auditor, model) -> the stored result, its findings re-scored against the baseline models
    (``score = "relative"``; a baseline model leave-one-out) or as stored (``"absolute"``)."""
    check_relative(suite, score)
    world = world or build_world(suite.world, runs_root=runs_root)
    results = load_suite_findings(suite, runs_root, auditors, world, score)
    if score == "absolute":
        return results
    baseline = baseline_models(suite)
    references = [s.name for s in baseline]
    stored = {}
    for auditor, spec, _, key in adaptive_results(suite, runs_root, auditors, world, score):
        for reference in baseline:
            if reference.name == spec.name:
                continue
            reference_key = reference_findings_key(key, reference)
            directory = reference_findings_dir(runs_root, reference_key)
            if not REFERENCE_FINDINGS_STORE.is_stored(directory, reference_key):
                raise FileNotFoundError(f"no evaluation of {reference.name} on {spec.name}'s "
                                        f"{auditor.name} subgroups; run python "
                                        f"evaluate/discover.py --suite {suite.name}")
            stored[(auditor.name, reference.name, spec.name)] = load_reference_findings(directory)
    return relative_results(results, references, stored)


def relative_results(results: dict[tuple[str, str], AuditResult], baseline: list[str],
                     stored: dict[tuple[str, str, str], list[Finding]]
                     ) -> dict[tuple[str, str], AuditResult]:
    """Every result re-scored against the ``baseline`` models' statistics on its subgroups
    (``reference_values``), a baseline model left out of its own; a model outside the baseline
    (an anomalous one, a checking held-out one) against all of it."""
    values = reference_values(results, baseline, stored)
    return {(auditor, model): relative_result(result, values[(auditor, model)],
                                              AUDITORS.get(auditor).spread_floor,
                                              leave_out=model if model in baseline else None)
            for (auditor, model), result in results.items()}
