"""The ``counteraudit`` command: every stage script as a subcommand, with the same options.

    counteraudit detect --quick           # = python evaluate/detect.py --quick
    counteraudit train --suite paper --executor slurm --partition gpu --dry-run
    counteraudit report --help

Each subcommand takes its options from its script's own ``get_args_parser(add_help=False)``, so
the two forms never drift apart. Only the script the command line names is imported: the list of
commands reads each script's docstring from its source, so ``counteraudit --help`` loads no
stage (and no torch).
"""
from __future__ import annotations

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: F401, I001

import argparse
import importlib
import sys

from counteraudit.evaluate.stage_scripts import STAGE_SCRIPTS
from counteraudit.train.core.command_line import ScriptHelpFormatter, run_cli
from counteraudit.train.core.module_sources import module_docstring


def _summary(docstring: str) -> str:
    """The first sentence of the script's docstring: its one line in ``counteraudit --help``."""
    return docstring.strip().split("\n\n")[0].replace("\n", " ")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    return _build_parsers(add_help)[0]


def _build_parsers(add_help: bool = True, only: str | None = None):
    """The command's parser, and each subcommand's parser by name (whose prog, "counteraudit
    detect", its errors name). With ``only``, that subcommand alone gets its options (its script
    imported); the others are listed by name and summary."""
    parser = argparse.ArgumentParser(
        "counteraudit", add_help=add_help,
        description="Counter-audit model auditing methods: train reference and anomalous models, "
                    "explain them, and measure detection and localization. Each subcommand is a "
                    "stage script (train/train.py, explain/run.py, evaluate/*.py) with the same "
                    "options; each runs whatever upstream work is missing.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    by_name = {}
    for name, module_name in STAGE_SCRIPTS.items():
        docstring = module_docstring(module_name)
        if only is not None and name != only:
            by_name[name] = commands.add_parser(name, help=_summary(docstring), add_help=False)
            continue
        own = importlib.import_module(module_name).get_args_parser(add_help=False)
        by_name[name] = commands.add_parser(
            name, parents=[own], help=_summary(docstring), description=docstring,
            epilog=own.epilog, formatter_class=ScriptHelpFormatter)
    return parser, by_name


def named_command(argv: list[str]) -> str | None:
    """The subcommand a command line names: its first word that is no option (the command itself
    takes none but --help)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = named_command(argv)
    parser, by_name = _build_parsers(only=command if command in STAGE_SCRIPTS else "")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would blame the top-level command; the subcommand's usage helps more
        by_name[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    run_cli(importlib.import_module(STAGE_SCRIPTS[args.command]).main, by_name[args.command], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
