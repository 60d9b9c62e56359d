"""The training stage as every entry script runs it before its own work (train/train.py, and the
explain and evaluate scripts): train what is missing, print the summary, check the implants."""
from __future__ import annotations

import time

from counteraudit.train.checkpoint import is_trained, model_dir
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.stage import RunOptions, executor_config
from counteraudit.train.core.suite import Suite
from counteraudit.train.implant_checks import format_implant_report, verify_implants
from counteraudit.train.stage import train_models
from counteraudit.train.trainer import summarize_references


def train_and_check(suite: Suite, specs: list[ModelSpec], options: RunOptions) -> list[dict]:
    """The training stage as every entry script runs it before its own work: train what is
    missing (through the options' executor), print the summary, check the anomalies' implants.
    Returns the models' metrics ([] on a dry run)."""
    started = time.perf_counter()
    results = train_models(suite, specs, options)
    if not results:  # --dry-run
        return results
    print_summary(suite.name, results, time.perf_counter() - started)
    check_implants(suite, specs, options)
    return results


def check_implants(suite: Suite, specs: list[ModelSpec], options: RunOptions) -> list[dict]:
    """Verify the anomalies just trained (needs the references) and say loudly which failed."""
    anomalies = [s.name for s in specs if not s.is_reference]
    if not anomalies:
        return []
    if not all(is_trained(model_dir(options.runs_dir, r)) for r in suite.references):
        print("implant checks skipped: they compare with the references, which are not all trained "
              "yet (python train/train.py --suite " + suite.name + " --references-only)")
        return []
    config = executor_config(suite, options, "verify")
    if config.dry_run:
        return []
    records = verify_implants(suite, options.runs_dir, options.device, models=anomalies, config=config)
    print("\nImplant checks (did each planted defect take?)\n" + format_implant_report(records))
    return records


def print_summary(suite_name: str, results: list[dict], seconds: float) -> None:
    print(f"\n{suite_name}: {len(results)} model(s) ready in {seconds:.1f}s")
    print("| model | family | val accuracy | train s | img/s |\n|---|---|---|---|---|")
    for m in results:
        print(f"| {m['name']} | {m['family']} | {m['val_accuracy']:.4f} | "
              f"{m.get('train_seconds', float('nan')):.1f} | {m.get('images_per_second', float('nan')):.0f} |")
    refs = summarize_references(results)
    if refs:
        print(f"references: mean {refs['mean']:.4f}, seed-to-seed std {refs['std']:.4f}, "
              f"range [{refs['min']:.4f}, {refs['max']:.4f}] over {refs['count']} seeds")
