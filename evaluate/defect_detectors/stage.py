"""The inspect stage: every (model, detector) of a suite -> a stored inspection.

A result is stored once, in the store every suite shares, in a folder named by the hash of its
key -- the detector, its version and parameters, the model key, the world, the evidence's
settings and the image sets it was given: ``runs/store/inspections/<detector>/<key hash>/`` holds
``inspection.json`` (statistic, per-input scores, mask, training scores, the detector's own
score and flag, its cost) and ``params.json`` (the key and the SHA-256 of ``inspection.json``,
written last, so it marks completion; ``train/core/keyed_store.py``). JSON keeps every float64
exactly (shortest round-trip repr).

One work item is one model with every detector it still lacks (the model is loaded and its
evidence built once); items run through ``slurm.executor.run_items``, locally or on Slurm, and a
rerun computes only what is missing. What cannot run is refused before any work: an unknown
detector (the registry's error lists the valid names) and a detector that needs training data on
a model whose training data is unknown (``check_detectors``).
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from counteraudit.evaluate.defect_detectors.detectors import DETECTORS, Detector, Inspection, build_detector
from counteraudit.evaluate.defect_detectors.evidence import (CLEAN_IMAGES, TRAINING_IMAGES, evidence_for,
                                                             training_data_problem, training_sample)
from counteraudit.explain.stage import load_image_sets, method_run_context, sets_for
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.artifacts import (atomic_write_json, find_or_make, lock_beside, read_json,
                                               stable_hash, store_dir)
from counteraudit.train.core.keyed_store import KeyedArtifact
from counteraudit.train.core.payloads import json_fields
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.stage import (RunOptions, StageItem, executor_config, plan_stage,
                                           resolved_runs_dir, run_stage)
from counteraudit.train.core.suite import Suite
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds import build_world

INSPECTIONS = "inspections"
INSPECTION_FILE = "inspection.json"
PARAMS_FILE = "params.json"
DETECTOR_SEED = 0
INSPECTION_STORE = KeyedArtifact(payload=INSPECTION_FILE, marker=PARAMS_FILE,
                                 digest_field="inspection_sha256", what=INSPECTION_FILE,
                                 marker_what="stored index", fields={"key": dict},
                                 check=json_fields(statistic=list, per_input=dict, cost=dict))


class DetectorRefused(ValueError):
    """A detector that cannot run on a suite's models, said before any work."""


# ---------------------------------------------------------------- what runs
def check_detectors(suite: Suite, names: Sequence[str], models: Sequence[ModelSpec] | None = None
                    ) -> list[Detector]:
    """The detectors ``names`` built (an unknown name: the registry's error, with the valid
    names), after checking that each can run on every model: one error for every detector that
    needs training data on a model without it, naming the models and the fix."""
    detectors = [build_detector(name) for name in dict.fromkeys(names)]
    models = list(models) if models is not None else suite.models
    problems = []
    for detector in detectors:
        if detector.needs_training_data:
            problems += [f"detector {detector.name!r} needs the model's training data: {problem}"
                         for spec in models if (problem := training_data_problem(suite, spec))]
    if problems:
        raise DetectorRefused("; ".join(problems) + ". Drop that detector (--detector) or those "
                              "models; detectors that need no training data: " + ", ".join(
                                  n for n in DETECTORS.names()
                                  if not DETECTORS.get(n).needs_training_data))
    return detectors


# ---------------------------------------------------------------- the store
def inspection_key(suite: Suite, detector: Detector, spec: ModelSpec,
                   image_set_ids: dict[str, str]) -> dict[str, Any]:
    """What determines an inspection: ``Detector.describe()``, the model key, the world, the
    evidence's sizes and seed, and the ids of every image set of the suite (the clean images are
    drawn outside them; a detector that scores inputs scores the model's own sets)."""
    return {**detector.describe(), "model_id": spec.key, "world": dict(suite.world),
            "seed": DETECTOR_SEED, "clean_images": CLEAN_IMAGES,
            "training_images": TRAINING_IMAGES if detector.needs_training_data else 0,
            "image_sets": dict(sorted(image_set_ids.items())),
            "scored_sets": sets_for(suite, spec) if detector.scores_inputs else []}


def inspection_dir(runs_root, key: dict[str, Any]) -> Path:
    return store_dir(runs_root) / INSPECTIONS / key["detector"] / stable_hash(key, length=16)


def _floats(values: np.ndarray | None) -> list | None:
    return None if values is None else np.asarray(values, dtype=np.float64).tolist()


def save_inspection(directory: Path, key: dict[str, Any], inspection: Inspection,
                    cost: dict[str, float], training_changed: np.ndarray | None = None
                    ) -> dict[str, Any]:
    """``training_changed``: which training rows the family changed, where the detector read
    training data (the ground truth its training scores are compared with)."""
    payload = {"statistic": _floats(inspection.statistic),
               "score": None if math.isnan(inspection.score) else inspection.score,
               "flagged": inspection.flagged,
               "per_input": {name: _floats(values) for name, values in inspection.per_input.items()},
               "mask": _floats(inspection.mask), "training_scores": _floats(inspection.training_scores),
               "training_changed": None if training_changed is None else
               [bool(v) for v in training_changed],
               "notes": inspection.notes, "cost": cost}
    return INSPECTION_STORE.save(directory, key, lambda path: atomic_write_json(path, payload))


@dataclass(frozen=True)
class StoredInspection:
    """A stored inspection, what it cost (seconds, cpu_seconds) where it was computed and, for a
    detector that read training data, which of those rows the family changed."""
    inspection: Inspection
    cost: dict[str, float]
    training_changed: np.ndarray | None = None


def load_inspection(directory: Path) -> StoredInspection:
    data = read_json(INSPECTION_STORE.payload_path(directory))

    def array(values):
        return None if values is None else np.asarray(values, dtype=np.float64)
    inspection = Inspection(
        statistic=array(data["statistic"]),
        score=float("nan") if data.get("score") is None else float(data["score"]),
        flagged=data.get("flagged"),
        per_input={name: array(values) for name, values in data["per_input"].items()},
        mask=array(data.get("mask")), training_scores=array(data.get("training_scores")),
        notes=dict(data.get("notes") or {}))
    changed = data.get("training_changed")
    return StoredInspection(inspection, dict(data["cost"]),
                            None if changed is None else np.asarray(changed, dtype=bool))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------- work items
@dataclass(frozen=True, kw_only=True)
class InspectItem(StageItem):
    """One model and the detectors it lacks (the model is loaded and its evidence built once)."""
    model: str
    detectors: tuple[str, ...]
    device: str | None = None


def inspect_one(item: InspectItem) -> dict[str, int]:
    """Work item: one model, every detector of ``item.detectors`` it lacks."""
    suite, runs_root = item.suite, item.runs_dir
    spec = suite.model(item.model)
    world = build_world(suite.world, runs_root=runs_root)
    device = pick_device(item.device)
    image_sets = load_image_sets(suite, runs_root, world)
    detectors = check_detectors(suite, item.detectors, [spec])
    counts, model, evidence = {"computed": 0, "stored": 0}, None, {}
    with method_run_context(spec, device):
        for detector in detectors:
            key = inspection_key(suite, detector, spec, {n: s.id for n, s in image_sets.items()})
            directory = inspection_dir(runs_root, key)

            def inspect() -> str:
                nonlocal model
                if model is None:  # once per item, and only if something is missing
                    model = load_trained_model(model_dir(runs_root, spec), spec, world, device)
                with_training = detector.needs_training_data
                # the clean images and image sets once per item; the training sample added to
                # them once, for the detectors that read it
                if False not in evidence:
                    evidence[False] = evidence_for(suite, spec, world, model, image_sets,
                                                   with_training=False, seed=DETECTOR_SEED)
                if with_training and True not in evidence:
                    evidence[True] = replace(evidence[False],
                                             training=training_sample(spec, world, model))
                wall, cpu = time.perf_counter(), _cpu_seconds()
                inspection = detector.run(model, evidence[with_training], seed=DETECTOR_SEED)
                training = evidence[with_training].training
                save_inspection(directory, key, inspection,
                                {"seconds": time.perf_counter() - wall, "cpu_seconds": _cpu_seconds() - cpu},
                                None if training is None else training.changed)
                return "computed"
            # two runs that need one inspection at once compute it once; the second reads it
            lock = lock_beside(directory, "inspect", f"inspecting {spec.name} with {detector.name} "
                                                     f"({directory})")
            counts[find_or_make(lambda: "stored" if INSPECTION_STORE.is_stored(directory, key)
                                else None, inspect, lock)] += 1
    return counts


def _image_set_ids(suite: Suite, runs_root) -> dict[str, str]:
    return {name: image_set.id for name, image_set in load_image_sets(suite, runs_root).items()}


def inspect_suite(suite: Suite, options: RunOptions, names: Sequence[str],
                  models: Sequence[str] | None = None) -> dict[str, int]:
    """Every missing (model, detector) inspection of the suite, through the local or Slurm
    executor; counts of inspections ``computed`` now and ``stored`` before."""
    specs = [suite.model(m) for m in models] if models else suite.models
    detectors = check_detectors(suite, names, specs)
    runs_root = options.runs_dir
    ids = _image_set_ids(suite, runs_root)
    wanted = [(spec, detector) for spec in specs for detector in detectors]
    todo = plan_stage(wanted, lambda pair: INSPECTION_STORE.is_stored(
        inspection_dir(runs_root, key := inspection_key(suite, pair[1], pair[0], ids)), key))

    def to_items(missing: list[tuple[ModelSpec, Detector]]) -> list[InspectItem]:
        lacking: dict[str, list[str]] = {}
        for spec, detector in missing:
            lacking.setdefault(spec.name, []).append(detector.name)
        return [InspectItem(suite=suite, runs_dir=resolved_runs_dir(runs_root), model=model,
                            detectors=tuple(names_), device=options.device)
                for model, names_ in lacking.items()]
    outcome = run_stage("inspect", inspect_one, todo, executor_config(suite, options, "inspect"),
                        to_items=to_items,
                        item_name=lambda item: f"{item.model}/{'+'.join(item.detectors)}")
    return {"computed": outcome.total("computed") if not outcome.dry_run else 0,
            "stored": todo.stored}


def load_inspections(suite: Suite, names: Sequence[str], runs_root=None
                     ) -> dict[tuple[str, str], StoredInspection]:
    """(detector, model) -> stored inspection, for every model of the suite."""
    ids = _image_set_ids(suite, runs_root)
    out = {}
    for detector in check_detectors(suite, names):
        for spec in suite.models:
            key = inspection_key(suite, detector, spec, ids)
            directory = inspection_dir(runs_root, key)
            if not INSPECTION_STORE.is_stored(directory, key):
                raise FileNotFoundError(f"no {detector.name} inspection of {spec.name}; run "
                                        f"counteraudit detect --suite {suite.name} --detector "
                                        f"{detector.name}")
            out[(detector.name, spec.name)] = load_inspection(directory)
    return out
