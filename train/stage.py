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
def _user_errors() -> tuple[type[BaseException], ...]:
    from slurm.errors import ExecutorError
    return (ValueError, LookupError, FileNotFoundError, ExecutorError)


def run_cli(main, parser: argparse.ArgumentParser):
    args = parser.parse_args()
    try:
        return main(args)
    except _user_errors() as error:
        message = error.args[0] if isinstance(error, LookupError) and error.args else error
        parser.exit(2, f"{parser.prog}: error: {message}\n")


def select_models(args: argparse.Namespace) -> tuple[Suite, list[ModelSpec]]:
    suite = load_suite(args.suite)
    names = getattr(args, "model", None)
    specs = [suite.model(n) for n in names] if names else suite.models
    return suite, specs


def train_one(item: dict[str, Any]) -> dict[str, Any]:
    """One work item of the training stage (picklable, so a Slurm job or a worker runs it too)."""
    from train.trainer import train_model
    suite = load_suite(item["suite"])
    spec = suite.model(item["model"])
    directory = model_dir(suite.root(item.get("runs_dir")), spec)
    return train_model(spec, directory, device=item.get("device"),
                       progress=item.get("progress", True), runs_root=item.get("runs_dir"))


def executor_config(suite: Suite, args: argparse.Namespace, stage: str):
    """The stage's executor: command line over the suite's [slurm] table; Slurm logs default to
    <runs>/<suite>/slurm-logs/<stage>/."""
    from slurm.executor import default_local_jobs, executor_config_from
    config = executor_config_from(args, suite.tables.get("slurm"), stage_name=stage)
    if config.local_jobs is None:
        config = config.with_changes(local_jobs=default_local_jobs())
    if config.log_dir is None:
        config = config.with_changes(log_dir=suite.root(args.runs_dir).resolve() / "slurm-logs")
    return config


def train_models(suite: Suite, specs: list[ModelSpec], args: argparse.Namespace) -> list[dict]:
    """Train what is missing, through the local or Slurm executor; returns every model's metrics."""
    from slurm.executor import run_items
    root = suite.root(args.runs_dir)
    config = executor_config(suite, args, "train")
    todo = [spec for spec in specs if not is_trained(model_dir(root, spec))]
    if todo and config.executor == "local" and not config.dry_run:
        from train.worlds import build_world
        build_world(suite.world, runs_root=args.runs_dir).prepare()  # once, not in every worker
    runs_dir = str(Path(args.runs_dir).resolve()) if args.runs_dir else None
    parallel = config.executor == "slurm" or (config.local_jobs or 1) > 1
    items = [{"suite": str(suite.path.resolve()), "model": spec.name, "runs_dir": runs_dir,
              "device": getattr(args, "device", None),
              "progress": not args.no_progress and not parallel} for spec in todo]
    run_items(train_one, items, config, "train", item_name=lambda item: item["model"])
    if config.dry_run:
        return []
    return [read_metrics(model_dir(root, spec)) for spec in specs]

