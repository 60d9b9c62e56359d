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

from counteraudit.slurm.executor_config import add_executor_args
from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args, run_cli


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
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.train.checked_training import train_and_check
    from counteraudit.train.core.stage import run_options, selected_models
    from counteraudit.train.core.suite import load_suite

    suite = load_suite(args.suite)  # what training reads; the explain and evaluate scripts check the rest
    specs = selected_models(suite, args.model)
    if args.references_only:
        specs = [s for s in specs if s.is_reference]
    return train_and_check(suite, specs, run_options(args))


if __name__ == "__main__":
    run_cli(main, get_args_parser())
