"""What the stage scripts share: suite/model selection arguments and the training stage's work."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from train.checkpoint import is_trained, model_dir, read_metrics
from train.suite import ModelSpec, Suite, available_suites, load_suite


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--suite", default="demo",
                        help=f"suite name ({', '.join(available_suites())}) or path to a .toml "
                             "file; 'demo' is the synthetic world and runs on a laptop CPU")
    parser.add_argument("--runs-dir", default=None,
                        help="root of all artifacts (default: $COUNTERAUDIT_RUNS or ./runs); "
                             "each suite writes under <runs-dir>/<suite>/")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (for logs and CI)")
    return parser


# Errors a user causes (bad names, paths, parameters): shown as one line, not a traceback.
USER_ERRORS = (ValueError, LookupError, FileNotFoundError)


def run_cli(main, parser: argparse.ArgumentParser):
    args = parser.parse_args()
    try:
        return main(args)
    except USER_ERRORS as error:
        message = error.args[0] if isinstance(error, LookupError) and error.args else error
        parser.exit(2, f"{parser.prog}: error: {message}\n")


def select_models(args: argparse.Namespace) -> tuple[Suite, list[ModelSpec]]:
    suite = load_suite(args.suite)
    names = getattr(args, "model", None)
    specs = [suite.model(n) for n in names] if names else suite.models
    return suite, specs


def train_one(item: dict[str, Any]) -> dict[str, Any]:
    """One work item of the training stage (picklable, so Slurm can run it too)."""
    from train.trainer import train_model
    suite = load_suite(item["suite"])
    spec = suite.model(item["model"])
    directory = model_dir(suite.root(item.get("runs_dir")), spec)
    return train_model(spec, directory, device=item.get("device"),
                       progress=item.get("progress", True), runs_root=item.get("runs_dir"))


def train_models(suite: Suite, specs: list[ModelSpec], args: argparse.Namespace) -> list[dict]:
    """Train what is missing (references first: anomaly implant checks compare against them)."""
    root = suite.root(args.runs_dir)
    ordered = sorted(specs, key=lambda s: not s.is_reference)
    results = []
    for spec in ordered:
        directory = model_dir(root, spec)
        if is_trained(directory):
            results.append(read_metrics(directory))
            continue
        results.append(train_one({"suite": str(suite.path), "model": spec.name,
                                  "runs_dir": args.runs_dir, "device": getattr(args, "device", None),
                                  "progress": not args.no_progress}))
    return results


def trained_dirs(suite: Suite, runs_root: str | Path | None = None) -> dict[str, Path]:
    root = suite.root(runs_root)
    return {spec.name: model_dir(root, spec) for spec in suite.models}
