"""Train the models of a suite: every model not trained yet, or the ones named with --model.

    python train/train.py --suite demo                 # references + anomalies of the demo suite
    python train/train.py --suite demo --model reference-00
    python train/train.py --suite paper --executor slurm --partition gpu --gpus-per-node 8

Finished models are skipped (their metrics.json exists); an interrupted model resumes from its
last epoch checkpoint.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    # Run as a file: the code is imported as counteraudit.* (pip install -e .); this folder's
    # modules (train.py, ...) must not shadow other packages of the same name.
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import time

from counteraudit.slurm.executor import add_executor_args
from counteraudit.train.checkpoint import is_trained, model_dir
from counteraudit.train.core.stage import (RunOptions, ScriptHelpFormatter, add_common_args, executor_config,
                                            run_cli, run_options, selected_models)
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.suite import Suite, load_suite
from counteraudit.train.implant_checks import format_implant_report, verify_implants
from counteraudit.train.stage import train_models
from counteraudit.train.trainer import summarize_references


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit training", add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="train only this model (repeatable); default: every model of the suite")
    parser.add_argument("--references-only", action="store_true",
                        help="train only the reference models (the anomalies need them for "
                             "their implant checks)")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N; default: cuda when available, else cpu")
    add_executor_args(parser)
    return parser


def main(args: argparse.Namespace) -> list[dict]:
    suite = load_suite(args.suite)  # what training reads; the explain and evaluate scripts check the rest
    specs = selected_models(suite, args.model)
    if args.references_only:
        specs = [s for s in specs if s.is_reference]
    return train_and_check(suite, specs, run_options(args))


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


if __name__ == "__main__":
    run_cli(main, get_args_parser())
