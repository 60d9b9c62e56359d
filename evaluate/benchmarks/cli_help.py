"""How long each --help takes: ``counteraudit --help``, ``counteraudit <command> --help`` for every
command, and ``python <stage script> --help`` for every stage script, each in a fresh process.

    python evaluate/benchmarks/cli_help.py                                  # this checkout
    python evaluate/benchmarks/cli_help.py --checkout /work/main --checkout .   # before and after
    python evaluate/benchmarks/cli_help.py --runs 5 --only detect --only train

Each command line runs ``--runs`` times (its output discarded); the table gives the median wall
time per checkout, whether that --help loaded torch (one more run, with Python's import-time
log), and the ratio of the first checkout's median to the last's. A checkout runs with its own
interpreter (<checkout>/.venv/bin/python, else this one) and its own ``counteraudit`` beside it.
The target (issue 47): every --help under 2 s on an idle machine.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import pandas as pd

from counteraudit.evaluate.benchmarks import benchmark_parser, machine_at_the_end
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.stage_scripts import STAGE_SCRIPTS
from counteraudit.train.core.command_line import run_cli

THIS_CHECKOUT = Path(__file__).resolve().parents[2]


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("cli help", __doc__, add_help)
    parser.add_argument("--checkout", action="append", type=Path, default=None, metavar="DIR",
                        help="a checkout to time, with its .venv (repeatable; the ratio column "
                             "is the first's median over the last's); default: this checkout")
    parser.add_argument("--runs", type=int, default=3, help="runs per command line (the median is kept)")
    parser.add_argument("--only", action="append", default=None, metavar="COMMAND",
                        help=f"only this command and its script (repeatable; {', '.join(STAGE_SCRIPTS)}); "
                             "`counteraudit --help` is always timed")
    return parser


def interpreter(checkout: Path) -> Path:
    """The checkout's own Python (its .venv), else this one."""
    own = checkout / ".venv" / "bin" / "python"
    return own if own.exists() else Path(sys.executable)


def command_lines(checkout: Path, commands: list[str]) -> dict[str, list[str]]:
    """label -> the argv that shows that --help in ``checkout``."""
    python = interpreter(checkout)
    counteraudit = str(python.with_name("counteraudit"))
    lines = {"counteraudit --help": [counteraudit, "--help"]}
    lines.update({f"counteraudit {name} --help": [counteraudit, name, "--help"] for name in commands})
    for name in commands:
        script = STAGE_SCRIPTS[name].removeprefix("counteraudit.").replace(".", "/") + ".py"
        lines[f"python {script} --help"] = [str(python), str(checkout / script), "--help"]
    return lines


def seconds(argv: list[str], runs: int, cwd: Path) -> float:
    """The median wall time of ``runs`` fresh runs of ``argv``; an error if one fails."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def loads_torch(argv: list[str], cwd: Path) -> bool:
    """Whether showing this --help imports torch (Python's import-time log names every module)."""
    logged = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    return any(line.split("|")[-1].strip() == "torch" for line in logged.stderr.splitlines())


def main(args: argparse.Namespace) -> pd.DataFrame:
    if args.runs < 1:
        raise ValueError(f"--runs {args.runs}: give 1 or more")
    commands = args.only or list(STAGE_SCRIPTS)
    unknown = sorted(set(commands) - set(STAGE_SCRIPTS))
    if unknown:
        raise ValueError(f"--only {', '.join(unknown)}: not a command; the commands: {', '.join(STAGE_SCRIPTS)}")
    checkouts = [path.resolve() for path in args.checkout or [THIS_CHECKOUT]]
    rows: dict[str, dict] = {}
    for checkout in checkouts:
        for label, argv in command_lines(checkout, commands).items():
            row = rows.setdefault(label, {"command line": label})
            row[f"{checkout} s"] = round(seconds(argv, args.runs, checkout), 2)
            row[f"{checkout} torch"] = "yes" if loads_torch(argv, checkout) else "no"
    table = pd.DataFrame(list(rows.values()))
    if len(checkouts) > 1:
        table["ratio"] = (table[f"{checkouts[0]} s"] / table[f"{checkouts[-1]} s"]).round(1)
    print(f"\n--help wall time, median of {args.runs} fresh runs each; {machine_at_the_end()}\n")
    print(to_markdown(table, float_format="{:.2f}"))
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
