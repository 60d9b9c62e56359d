"""The ``counteraudit`` command: every stage script as a subcommand, with the same options.

    counteraudit detect --quick           # = python evaluate/detect.py --quick
    counteraudit train --suite paper --executor slurm --partition gpu --dry-run
    counteraudit report --help

Each subcommand takes its options from its script's own ``get_args_parser(add_help=False)``, so
the two forms never drift apart.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from counteraudit.train.core.stage import ScriptHelpFormatter, run_cli

# subcommand -> the module of its stage script (get_args_parser + main)
STAGE_SCRIPTS = {
    "train": "counteraudit.train.train",
    "explain": "counteraudit.explain.run",
    "detect": "counteraudit.evaluate.detect",
    "localize": "counteraudit.evaluate.localize",
    "compare": "counteraudit.evaluate.compare",
    "report": "counteraudit.evaluate.report",
    "reference-count": "counteraudit.evaluate.reference_count",
    "dose": "counteraudit.evaluate.dose",
    "discover": "counteraudit.evaluate.discover",
    "sensitivity": "counteraudit.evaluate.sensitivity",
    "reproducibility": "counteraudit.evaluate.reproducibility",
    "population": "counteraudit.evaluate.population",
    "record": "counteraudit.evaluate.record",
    "leaderboard": "counteraudit.evaluate.leaderboard",
}


def _summary(module) -> str:
    """The first sentence of the script's docstring: its one line in ``counteraudit --help``."""
    return (module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    return _build_parsers(add_help)[0]


def _build_parsers(add_help: bool = True):
    """The command's parser, and each subcommand's parser by name (whose prog, "counteraudit
    detect", its errors name)."""
    parser = argparse.ArgumentParser(
        "counteraudit", add_help=add_help,
        description="Counter-audit model auditing methods: train reference and anomalous models, "
                    "explain them, and measure detection and localization. Each subcommand is a "
                    "stage script (train/train.py, explain/run.py, evaluate/*.py) with the same "
                    "options; each runs whatever upstream work is missing.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    by_name = {}
    for name, module_name in STAGE_SCRIPTS.items():
        module = importlib.import_module(module_name)
        own = module.get_args_parser(add_help=False)
        by_name[name] = commands.add_parser(
            name, parents=[own], help=_summary(module), description=module.__doc__,
            epilog=own.epilog, formatter_class=ScriptHelpFormatter)
    return parser, by_name


def main(argv: list[str] | None = None) -> int:
    parser, by_name = _build_parsers()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would blame the top-level command; the subcommand's usage helps more
        by_name[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    run_cli(importlib.import_module(STAGE_SCRIPTS[args.command]).main, by_name[args.command], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
