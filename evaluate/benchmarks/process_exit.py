"""What a process's exit costs: the interpreter's final garbage collections against the heap frozen
at exit (train/core/process_exit.py, what every counteraudit process does), and no teardown at all.

    python evaluate/benchmarks/process_exit.py
    python evaluate/benchmarks/process_exit.py --module counteraudit.train.stage --runs 9

Each run is a fresh interpreter that imports ``--module`` (as a command, a local worker or a Slurm
task does before its first item), reads its own CPU time, and exits in one of three ways, the ways
interleaved run by run:

- ``collected``: Python's own exit, with the final collections (the handler unregistered);
- ``frozen``: Python's own exit after ``gc.freeze()``, as shipped;
- ``os._exit``: no teardown at all (a lower bound; it skips ``atexit`` too, so it is no option).

The table gives, per way, the median CPU seconds (user and system) of the whole process and of its
exit alone (the whole less what the process had spent when it finished importing).
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import resource
import statistics
import subprocess

import pandas as pd

from counteraudit.evaluate.benchmarks import benchmark_parser, machine_at_the_end
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.train.core.command_line import run_cli

SPENT = "import resource; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
EXITS = {
    "collected": "import atexit, gc; atexit.unregister(gc.freeze)",
    "frozen": "",
    "os._exit": "import os, sys; sys.stdout.flush(); os._exit(0)",
}


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("process exit", __doc__, add_help)
    parser.add_argument("--module", action="append", default=None, metavar="MODULE",
                        help="a module the process imports (repeatable; default: "
                             "counteraudit.explain.stage)")
    parser.add_argument("--runs", type=int, default=7, help="runs per way and module (the median is kept)")
    return parser


def program(module: str, way: str) -> str:
    """The ``python -c`` program: counteraudit first, then ``module``, its CPU so far, the exit."""
    return "; ".join(filter(None, ["import counteraudit.train", f"import {module}", SPENT, EXITS[way]]))


def cpu_seconds(code: str) -> tuple[float, float]:
    """(the whole process's CPU seconds, those it had spent before its exit) for one run of ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    whole = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return whole, float(done.stdout.split()[-1])


def main(args: argparse.Namespace) -> pd.DataFrame:
    if args.runs < 1:
        raise ValueError(f"--runs {args.runs}: give 1 or more")
    rows = []
    for module in args.module or ["counteraudit.explain.stage"]:
        measured: dict[str, list[tuple[float, float]]] = {way: [] for way in EXITS}
        for _ in range(args.runs):
            for way in EXITS:
                measured[way].append(cpu_seconds(program(module, way)))
        for way, runs in measured.items():
            rows.append({"module": module, "exit": way,
                         "process CPU-s": statistics.median(whole for whole, _ in runs),
                         "exit CPU-s": statistics.median(whole - spent for whole, spent in runs)})
    table = pd.DataFrame(rows)
    print(f"\nCPU seconds per process, median of {args.runs} fresh runs each way (interleaved); "
          f"{machine_at_the_end()}\n")
    print(to_markdown(table, float_format="{:.2f}"))
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
