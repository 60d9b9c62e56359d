"""What starting a stage's local worker processes costs: spawned (a fresh interpreter each, which
imports torch, torchvision and the stage) against preloaded (forks of one server per run that
imported them once; slurm/worker_pool.py).

    python evaluate/benchmarks/worker_start.py
    python evaluate/benchmarks/worker_start.py --pools 4 --jobs 2 --repeats 3

Each start method runs in a fresh process: ``--pools`` pools one after the other (a run's
stages), each of ``--jobs`` workers given one item each, an item that sleeps a second (so every
worker gets one) and says which process ran it. The figures, the median of ``--repeats`` runs:
that process's wall time, and the CPU seconds the whole machine was busy meanwhile
(``/proc/stat``; the server and its workers are not children the run waits for, so only this
counts them). Run it on an idle machine: busy CPU counts everything.
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

# What a stage's worker imports to run its item: torch, torchvision and the stage's own modules.
import counteraudit.explain.stage  # noqa: F401
from counteraudit.evaluate.benchmarks import benchmark_parser, machine_at_the_end
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.slurm.worker_pool import PRELOADED, worker_pool
from counteraudit.train.core.command_line import run_cli

METHODS = ("spawn", PRELOADED)


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("worker start", __doc__, add_help)
    parser.add_argument("--pools", type=int, default=3, help="pools one after the other, per run")
    parser.add_argument("--jobs", type=int, default=2, help="workers per pool")
    parser.add_argument("--repeats", type=int, default=1, help="runs per start method (the median is kept)")
    parser.add_argument("--run-pools", choices=METHODS, default=None, help=argparse.SUPPRESS)
    return parser


ITEM_SECONDS = 1.0  # long enough that every worker of a pool gets an item


def which_process(_item: int) -> tuple[int, int]:
    time.sleep(ITEM_SECONDS)
    return os.getpid(), os.getppid()


def run_pools(start_method: str, pools: int, jobs: int) -> None:
    """The measured run: ``pools`` pools of ``jobs`` workers, each worker given one item."""
    workers = set()
    for _ in range(pools):
        with worker_pool(jobs, start_method, preload=(__name__,)) as pool:
            ran = list(pool.map(which_process, range(jobs)))
        workers |= {pid for pid, _ in ran}
        parents = {parent for _, parent in ran}
        if (start_method == "spawn") != (parents == {os.getpid()}):
            raise RuntimeError(f"{start_method} workers' parents are {parents}, this run is {os.getpid()}")
    print(len(workers))


def busy_seconds() -> float:
    """CPU seconds this machine has been busy since boot, all cores (``/proc/stat``)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def timed_run(start_method: str, pools: int, jobs: int) -> tuple[float, float, int]:
    """Wall seconds, machine-busy CPU seconds and workers started, of one run in a fresh process."""
    busy, started = busy_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--run-pools", start_method, "--pools", str(pools),
                           "--jobs", str(jobs)], capture_output=True, text=True, check=True)
    return time.perf_counter() - started, busy_seconds() - busy, int(done.stdout.split()[-1])


def main(args: argparse.Namespace) -> pd.DataFrame | None:
    if args.run_pools:
        run_pools(args.run_pools, args.pools, args.jobs)
        return None
    if min(args.pools, args.jobs, args.repeats) < 1:
        raise ValueError("--pools, --jobs and --repeats: give 1 or more")
    rows = []
    for method in METHODS:
        runs = [timed_run(method, args.pools, args.jobs) for _ in range(args.repeats)]
        rows.append({"start method": method, "workers started": runs[0][2],
                     "wall s": statistics.median(run[0] for run in runs),
                     "busy CPU-s": statistics.median(run[1] for run in runs)})
    table = pd.DataFrame(rows)
    # the run's own start and the server's are in both figures: this is the whole run's ratio
    table["CPU ratio to spawn"] = table["busy CPU-s"] / table["busy CPU-s"][0]
    print(f"\n{args.pools} pools of {args.jobs} workers, one trivial item each, median of "
          f"{args.repeats} run(s); {machine_at_the_end()}\n")
    print(to_markdown(table, float_format="{:.2f}"))
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
