"""Implant checks, the training stage's last step: did each planted defect take? A backdoor that does not fire is not a
counter-audit, so every anomalous model is measured with its family's figure, next to the same
figure on every reference, and judged against the family's threshold.

Results: ``implant-<references>.json`` in each anomalous model's store folder, one per set of
references it was judged against (a suite with other references judges it anew, from cached
figures); the references' figures are cached in their folders under ``implant-figures/`` (one file
per family and parameters), so adding an anomaly measures the references once more only for that
anomaly, and a suite sharing references with another measures nothing twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path
from typing import Any

from counteraudit.slurm.executor import ExecutorConfig, default_local_jobs
from counteraudit.train.checkpoint import is_trained, model_dir, read_metrics
from counteraudit.train.core.artifacts import (artifact_lock, atomic_write_json, find_or_make, stable_hash)
from counteraudit.train.core.payloads import read_json_object
from counteraudit.train.core.registries import FAMILIES
from counteraudit.train.core.stage import StageItem, plan_stage, resolved_runs_dir, run_stage
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds import World, build_world


def implant_path(suite: Suite, spec: ModelSpec, runs_root=None) -> Path:
    """Where the implant record of ``spec`` judged against ``suite``'s references is stored."""
    references = stable_hash([reference.key for reference in suite.references])
    return model_dir(runs_root, spec) / f"implant-{references}.json"


def _figures(family, spec: ModelSpec, directory: Path, world: World, device) -> dict[str, float]:
    model = load_trained_model(directory, spec, world, device)
    return family.measure(model, device=device)


def _cached_figures(family, anomaly: ModelSpec, measured: ModelSpec, directory: Path,
                    world: World, device) -> dict[str, float]:
    key = stable_hash({"family": anomaly.family, "params": anomaly.params, "world": anomaly.world,
                       "images": family.verify_images, "measure": family.measure_version})
    cache = directory / "implant-figures" / f"{anomaly.family}-{key}.json"
    cached = read_json_object(cache, "implant figures")
    if cached is not None:
        return cached
    figures = _figures(family, measured, directory, world, device)
    atomic_write_json(cache, figures)
    return figures


@dataclass(frozen=True, kw_only=True)
class VerifyItem(StageItem):
    """One trained anomalous model whose implant is checked."""
    model: str
    device: str | None = None


def verify_one(item: VerifyItem) -> dict[str, Any]:
    """Work item: the implant record of one trained anomalous model (read if already made)."""
    suite, runs_root = item.suite, item.runs_dir
    spec = suite.model(item.model)
    directory = model_dir(runs_root, spec)
    # two runs that need the record at once measure the models once; the second reads it
    return find_or_make(lambda: read_implant(suite, spec, runs_root),
                        lambda: _check_implant(suite, spec, runs_root, item.device),
                        artifact_lock(directory, "implant.lock", "verify",
                                      f"checking the implant of {spec.name} ({directory})"))


def _check_implant(suite: Suite, spec: ModelSpec, runs_root, device: str | None) -> dict[str, Any]:
    """Measure the model and the suite's references, judge, store the record."""
    directory = model_dir(runs_root, spec)
    path = implant_path(suite, spec, runs_root)
    device = pick_device(device)
    world = build_world(suite.world, runs_root=runs_root)
    reference_dirs = [(ref, model_dir(runs_root, ref)) for ref in suite.references]
    family = FAMILIES.get(spec.family)(spec.params, world, spec.seed)
    # Cached in each measured model's folder: a suite with other references measures only them.
    figures = _cached_figures(family, spec, spec, directory, world, device)
    reference_figures = [_cached_figures(family, spec, ref, d, world, device)
                         for ref, d in reference_dirs]
    verdict = family.judge(figures, reference_figures)
    reference_accuracy = [read_metrics(d)["val_accuracy"] for _, d in reference_dirs]
    record = {"name": spec.name, "family": spec.family, "params": spec.params,
              "passed": verdict.passed, "summary": verdict.summary, "details": verdict.details,
              "figures": figures, "reference_figures": reference_figures,
              "val_accuracy": read_metrics(directory)["val_accuracy"],
              "reference_val_accuracy_mean": sum(reference_accuracy) / len(reference_accuracy)}
    atomic_write_json(path, record)
    return record


def verify_implants(suite: Suite, runs_root=None, device: str | None = None,
                    models: list[str] | None = None, config=None) -> list[dict[str, Any]]:
    """Implant records of every trained anomalous model (or those named), made where missing,
    one work item per model through the stage executor (default: local, one process per core)."""
    missing = [ref.name for ref in suite.references if not is_trained(model_dir(runs_root, ref))]
    if missing:
        raise RuntimeError(f"implant checks compare with the references; not trained yet: {missing}")
    specs = [s for s in suite.anomalies if (models is None or s.name in models)
             and is_trained(model_dir(runs_root, s))]
    records = {s.name: read_implant(suite, s, runs_root) for s in specs}
    records = {name: record for name, record in records.items() if record}  # made before: no job
    plan = plan_stage(specs, lambda spec: spec.name in records)
    config = config or ExecutorConfig(local_jobs=default_local_jobs())
    if plan.missing:  # checks run inside the training command: silent when all are stored
        made = run_stage("verify", verify_one, plan, config,
                         to_items=lambda todo: [VerifyItem(suite=suite, runs_dir=resolved_runs_dir(runs_root),
                                                           model=spec.name, device=device) for spec in todo],
                         item_name=lambda item: item.model)
        if made.dry_run:
            return []
        records.update(zip([item.model for item in made.items], made.results, strict=True))
    return [records[s.name] for s in specs]


def read_implant(suite: Suite, spec: ModelSpec, runs_root=None) -> dict[str, Any] | None:
    """The stored implant record of ``spec`` against the suite's references (named as the suite
    names the model), or None."""
    record = read_json_object(implant_path(suite, spec, runs_root), "implant record")
    return {**record, "name": spec.name} if record else None


def format_implant_report(records: list[dict[str, Any]]) -> str:
    lines = ["| model | family | val acc (refs) | implant check | took |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['name']} | {r['family']} | {r['val_accuracy']:.3f} "
                     f"({r['reference_val_accuracy_mean']:.3f}) | {r['summary']} | "
                     f"{'yes' if r['passed'] else '**NO**'} |")
    failed = [r for r in records if not r["passed"]]
    if failed:
        bar = "!" * 78
        lines += ["", bar, f"IMPLANT FAILED for {len(failed)} model(s): "
                  f"{', '.join(r['name'] for r in failed)}",
                  "These are not counter-audits: their defect did not take. Check their parameters",
                  "(poison fraction, epochs) before reading any detection result about them.", bar]
    return "\n".join(lines)
