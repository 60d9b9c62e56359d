"""The benchmark scripts: each times one part of the pipeline against another way of doing it
and prints the figures; none writes a result the stages read.

One command-line convention, that of torchvision's reference scripts (and of the stage scripts):
a module docstring that says what is timed and how to run it, ``get_args_parser(add_help=True)``
built on ``benchmark_parser``, ``main(args)``, and, run as a file,
``run_cli(main, get_args_parser())``. Run one as ``python evaluate/benchmarks/<name>.py --help``.
"""
from __future__ import annotations

import argparse

from counteraudit.train.core.command_line import ScriptHelpFormatter


def benchmark_parser(title: str, docstring: str, add_help: bool = True) -> argparse.ArgumentParser:
    """The parser a benchmark script adds its options to: named "counteraudit <title> benchmark"
    (its errors say so), its --help the script's docstring as written and each option's default."""
    return argparse.ArgumentParser(f"counteraudit {title} benchmark", add_help=add_help,
                                   description=docstring, formatter_class=ScriptHelpFormatter)
