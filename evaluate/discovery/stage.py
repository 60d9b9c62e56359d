"""The discover stage: every (model, auditor) of a suite -> stored, ranked findings.

A result is stored once, in the store every suite shares, in a folder named by the hash of its
key -- the auditor, its version and parameters, the model key, the world, the image budget and the
seed: ``runs/store/findings/<auditor>/<key hash>/`` holds ``findings.json`` (the ranked findings,
images used, notes) and ``params.json`` (the key and the SHA-256 of ``findings.json``, written
last, so it marks completion; a findings file that does not match is set aside and recomputed).

One work item is one model with every auditor it still lacks (the model is loaded once); items run
through ``slurm.executor.run_items``, locally or on Slurm, and a rerun computes only what is
missing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from counteraudit.evaluate.discovery.prediction_cache import PredictionCache, predictions_dir
from counteraudit.evaluate.discovery.auditors import (AUDITORS, Auditor, AuditResult, Finding, Subgroup,
                                                      build_auditor)
from counteraudit.explain.stage import method_run_context
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.artifacts import (atomic_write_json, find_or_make, lock_beside, read_json,
                                               stable_hash, store_dir)
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.payloads import json_fields
from counteraudit.train.core.stage import (RunOptions, StageItem, executor_config, plan_stage, resolved_runs_dir,
                                           run_stage)
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.core.suite_checks import built_problems, named_problems
from counteraudit.train.core.suite_schema import SuiteTable
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds import build_world

FINDINGS = "findings"
FINDINGS_FILE = "findings.json"
PARAMS_FILE = "params.json"
DEFAULT_SEED = 0
# One result: its findings, marked by params.json (whose digest field the exhaustive reference's
# table, stored the same way, shares).
FINDINGS_STORE = KeyedArtifact(payload=FINDINGS_FILE, marker=PARAMS_FILE,
                               digest_field="findings_sha256", what=FINDINGS_FILE,
                               marker_what="stored index", fields={"key": dict},
                               check=json_fields(findings=list, images_used=int, notes=dict))


# ---------------------------------------------------------------- the store
def findings_key(description: dict[str, Any], spec: ModelSpec, world: dict[str, Any],
                 budget: int, seed: int, panel: list[ModelSpec] = ()) -> dict[str, Any]:
    """What determines a result: ``Auditor.describe()``, the model key, world, budget, seed, and
    for a search steered by the relative score the references it was steered against."""
    key = {**description, "model_id": spec.key, "world": dict(world), "budget": int(budget),
           "seed": int(seed)}
    if panel:
        key["steered_against"] = [reference.key for reference in panel]
    return key


def search_panel(suite: Suite, auditor, spec: ModelSpec, score: str) -> list[ModelSpec]:
    """The references a search steers by (all but the model itself): only for an auditor that
    ``searches_relative`` under the relative score, and with at least two of them."""
    if score != "relative" or not auditor.searches_relative:
        return []
    panel = [reference for reference in suite.references if reference.name != spec.name]
    return panel if len(panel) >= 2 else []


def findings_dir(runs_root, key: dict[str, Any]) -> Path:
    return store_dir(runs_root) / FINDINGS / key["auditor"] / stable_hash(key, length=16)


def save_findings(directory: Path, key: dict[str, Any], result: AuditResult) -> dict[str, Any]:
    findings = {"findings": [f.to_dict() for f in result.findings],
                "images_used": result.images_used, "notes": result.notes,
                "subgroups": [s.to_dict() for s in result.subgroups]}
    return FINDINGS_STORE.save(directory, key, lambda path: atomic_write_json(path, findings))


def is_stored(directory: Path, key: dict[str, Any]) -> bool:
    return FINDINGS_STORE.is_stored(directory, key)


def load_findings(directory: Path) -> AuditResult:
    data = read_json(FINDINGS_STORE.payload_path(directory))
    return AuditResult([Finding.from_dict(f) for f in data["findings"]], data["images_used"],
                       data["notes"], [Subgroup(**s) for s in data.get("subgroups", [])])


# ---------------------------------------------------------------- the suite's settings
def suite_auditors(suite: Suite, only: list[str] | None = None) -> list[str]:
    """The auditors the suite runs (``only``: a subset, --auditor): [discover] auditors, else
    every registered one; an unknown name lists the valid ones."""
    names = only or suite.discover.auditors or AUDITORS.names()
    for name in names:
        AUDITORS.get(name)
    return list(names)


def auditor_problems(settings: SuiteTable) -> list[str]:
    """What is wrong with a suite's auditor tables: an unknown name in [discover] auditors or
    budget, or an [auditors.<name>] table the auditor refuses."""
    discover = settings.discover
    problems = named_problems(discover.auditors or [], AUDITORS, "[discover] auditors")
    problems += named_problems(discover.budget, AUDITORS, "[discover] budget")
    return problems + built_problems(settings.auditors, AUDITORS, "auditors")


def suite_auditor(suite: Suite, name: str) -> Auditor:
    """The auditor ``name`` built with its ``[auditors.<name>]`` parameters (parsed into its
    typed ``Params``)."""
    return build_auditor(name, suite.auditor_tables.get(name))


def discover_score(suite: Suite) -> str:
    """How subgroups are ranked: [discover] score (--score merged in by discover.py)."""
    return suite.discover.score


def discover_seed(suite: Suite) -> int:
    return suite.discover.seed


def auditor_budget(suite: Suite, auditor, world) -> int:
    """[discover.budget] <name> in the suite, else the auditor's default for the world."""
    budget = suite.discover.budget.get(auditor.name)
    return auditor.default_budget(world, discover_seed(suite)) if budget is None else budget


def usable(auditor, world) -> bool:
    """Whether the auditor runs on this world (a generator-based one needs a generator)."""
    return world.has_generator or not auditor.needs_generator


def planned(suite: Suite, world, names: list[str]) -> list[tuple[Any, int, int]]:
    """(auditor, budget, seed) of each usable auditor."""
    seed = discover_seed(suite)
    out = []
    for name in names:
        auditor = suite_auditor(suite, name)
        if usable(auditor, world):
            out.append((auditor, auditor_budget(suite, auditor, world), seed))
    return out


# ---------------------------------------------------------------- work items
@dataclass(frozen=True, kw_only=True)
class DiscoverItem(StageItem):
    """One model and the auditors it lacks (the model is loaded once for all of them)."""
    model: str
    auditors: tuple[str, ...]
    score: str
    device: str | None = None


def discover_one(item: DiscoverItem) -> dict[str, int]:
    """Work item: one model, every auditor of ``item.auditors`` it lacks."""
    suite, runs_root, score = item.suite, item.runs_dir, item.score
    spec = suite.model(item.model)
    world = build_world(suite.world, runs_root=runs_root)
    device = pick_device(item.device)
    counts, model = {"computed": 0, "stored": 0}, None
    panels: dict[str, tuple[Any, PredictionCache]] = {}  # the references, loaded once

    def reference_panel(panel: list[ModelSpec]) -> list[tuple[Any, PredictionCache]]:
        for reference in panel:
            if reference.name not in panels:
                panels[reference.name] = (
                    load_trained_model(model_dir(runs_root, reference), reference, world, device),
                    PredictionCache(predictions_dir(runs_root, reference, suite.world)))
        return [panels[reference.name] for reference in panel]
    with method_run_context(spec, device):
        for auditor, budget, seed in planned(suite, world, list(item.auditors)):
            panel = search_panel(suite, auditor, spec, score)
            key = findings_key(auditor.describe(), spec, suite.world, budget, seed, panel)
            directory = findings_dir(runs_root, key)

            def audit() -> str:
                nonlocal model
                if model is None:  # once per item, and only if something is missing
                    model = load_trained_model(model_dir(runs_root, spec), spec, world, device)
                auditor.reference_panel = reference_panel(panel) if panel else None
                result = auditor.run(model, world, budget, seed)
                for _, cache in auditor.reference_panel or ():
                    cache.save()  # the references' predictions, for the next model's search
                save_findings(directory, key, result)
                return "computed"
            # two runs that need the findings at once compute them once; the second reads them
            lock = lock_beside(directory, "discover", f"auditing {spec.name} with {auditor.name} "
                                                      f"({directory})")
            counts[find_or_make(lambda: "stored" if is_stored(directory, key) else None, audit,
                                lock)] += 1
    return counts


class Audit(NamedTuple):
    """One (model, auditor) result the stage needs."""
    spec: ModelSpec
    auditor: Any
    budget: int
    seed: int


def discover_suite(suite: Suite, options: RunOptions, auditors: list[str] | None = None,
                   models: list[str] | None = None) -> dict[str, int]:
    """Every missing (model, auditor) result of the suite, through the local or Slurm executor;
    returns counts of results ``computed`` now and ``stored`` before."""
    names = suite_auditors(suite, auditors)
    specs = [suite.model(m) for m in models] if models else suite.models
    runs_root = options.runs_dir
    world = build_world(suite.world, runs_root=runs_root)
    started = time.perf_counter()
    plan = planned(suite, world, names)  # in this process: covering arrays are built once
    print(f"[discover] {', '.join(f'{a.name} (budget {b} images)' for a, b, _ in plan)}; "
          f"planned in {time.perf_counter() - started:.1f}s", flush=True)
    audits = [Audit(spec, *planned_auditor) for spec in specs for planned_auditor in plan]
    score = discover_score(suite)
    todo = plan_stage(audits, lambda audit: is_stored(*_where(
        runs_root, audit.auditor, audit.spec, suite, audit.budget, audit.seed, score)))

    def to_items(missing: list[Audit]) -> list[DiscoverItem]:
        """One item per model, with every auditor it lacks (the model is loaded once)."""
        lacking: dict[str, list[str]] = {}
        for audit in missing:
            lacking.setdefault(audit.spec.name, []).append(audit.auditor.name)
        return [DiscoverItem(suite=suite, runs_dir=resolved_runs_dir(runs_root), model=model,
                             auditors=tuple(auditor_names), device=options.device, score=score)
                for model, auditor_names in lacking.items()]
    outcome = run_stage("discover", discover_one, todo, executor_config(suite, options, "discover"),
                        to_items=to_items, item_name=lambda item: f"{item.model}/{'+'.join(item.auditors)}")
    return {"computed": outcome.total("computed"), "stored": todo.stored}


def _where(runs_root, auditor, spec, suite, budget, seed,
           score: str) -> tuple[Path, dict[str, Any]]:
    key = findings_key(auditor.describe(), spec, suite.world, budget, seed,
                       search_panel(suite, auditor, spec, score))
    return findings_dir(runs_root, key), key


def load_suite_findings(suite: Suite, runs_root=None, auditors: list[str] | None = None,
                        world=None, score: str = "absolute") -> dict[tuple[str, str], AuditResult]:
    """(auditor, model) -> stored result, for every usable auditor and model of the suite (a
    search steered by the relative score is another result than one steered by its
    statistic: ``score`` says which)."""
    world = world or build_world(suite.world, runs_root=runs_root)
    out = {}
    for auditor, budget, seed in planned(suite, world, suite_auditors(suite, auditors)):
        for spec in suite.models:
            directory, key = _where(runs_root, auditor, spec, suite, budget, seed, score)
            if not is_stored(directory, key):
                raise FileNotFoundError(f"no {auditor.name} findings for {spec.name}; run "
                                        f"python evaluate/discover.py --suite {suite.name}")
            out[(auditor.name, spec.name)] = load_findings(directory)
    return out
