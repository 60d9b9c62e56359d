"""The benchmark scripts: each times one part of the pipeline against another way of doing it
and prints the figures; none writes a result the stages read.

One command-line convention, that of torchvision's reference scripts (and of the stage scripts):
a module docstring that says what is timed and how to run it, ``get_args_parser(add_help=True)``
built on ``benchmark_parser``, ``main(args)``, and, run as a file,
``run_cli(main, get_args_parser())``. Run one as ``python evaluate/benchmarks/<name>.py --help``.
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from counteraudit.train.core import numerics
from counteraudit.train.core.command_line import ScriptHelpFormatter


def benchmark_parser(title: str, docstring: str, add_help: bool = True) -> argparse.ArgumentParser:
    """The parser a benchmark script adds its options to: named "counteraudit <title> benchmark"
    (its errors say so), its --help the script's docstring as written and each option's default."""
    return argparse.ArgumentParser(f"counteraudit {title} benchmark", add_help=add_help,
                                   description=docstring, formatter_class=ScriptHelpFormatter)


def interleaved_seconds(functions: dict[str, Callable[[], object]],
                        repeats: int) -> dict[str, list[float]]:
    """Seconds of each of ``repeats`` calls of every function, after one warm-up call of each
    (first-call kernel setup, allocations). The functions take turns within each round, so a load
    that drifts on a shared machine falls on all of them."""
    for function in functions.values():
        function()
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            started = time.perf_counter()
            function()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def machine_at_the_end() -> str:
    """The CPU, how many this process sees and the load average now, for a table's heading: the
    figures are this machine's, and a load above zero means something else ran beside them."""
    return (f"{numerics.cpu_model()}, {os.cpu_count()} CPU(s), load average "
            f"{os.getloadavg()[0]:.1f} at the end")
