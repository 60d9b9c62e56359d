"""Write the record of each method of a finished run: one JSON file per method, named by its SHA-256.

    counteraudit record --suite replicated --runs-dir runs --out evaluate/leaderboard/records
    counteraudit record --suite replicated --method mine --plugins mine.py --out records

A record (evaluate/records/schema.py) holds one method on one population: the method and its
parameters, the population's id (that of its release), the distance, numeric mode, code and
hardware, each family's detection rate with its exact interval and verdict, each localizable
configuration's mean AUROC with its interval and chance band, the paired differences with the
controls and the explanations' cost. The run must be finished (counteraudit detect and counteraudit
localize, with the same --method and --distance; with --detection-only, detect alone, and the
record says Table 2 was not run) and its suite must ask for verdicts ([references]
held_out and [evaluate] p_value); nothing is trained, explained or written otherwise. Its
population must be a known one (evaluate/records/populations.toml). `counteraudit leaderboard`
builds the leaderboard from a folder of records.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
from pathlib import Path

from counteraudit.evaluate.pipeline_options import pipeline_parser
from counteraudit.evaluate.records.populations_file import KNOWN_POPULATIONS
from counteraudit.train.core.command_line import run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = pipeline_parser("counteraudit record", add_help)
    parser.add_argument("--out", required=True, metavar="RECORDS_DIR",
                        help="the folder the records are written to, one <id>.json per method "
                             "(the leaderboard's: evaluate/leaderboard/records)")
    parser.add_argument("--populations", default=None, metavar="TOML",
                        help="the known populations: suite name -> population_id and "
                             f"exported_with (default: {KNOWN_POPULATIONS.name} of "
                             "evaluate/records)")
    parser.add_argument("--detection-only", action="store_true",
                        help="record from detect's tables alone: each localizable configuration "
                             "says Table 2 was not run (for a population where localizing every "
                             "method costs too much)")
    return parser


def main(args: argparse.Namespace) -> list[Path]:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.evaluate.pipeline import scoring_run
    from counteraudit.evaluate.records.build import build_records, check_recordable
    from counteraudit.evaluate.records.populations import check_population, known_populations, run_population_id
    from counteraudit.evaluate.records.store import write_record
    from counteraudit.train.core.artifacts import runs_dir

    run = scoring_run(args)  # the suite, its methods and parameters, the distance: no work run
    suite, options = run.suite, run.options
    root = runs_dir(options.runs_dir)
    check_recordable(suite, run.distance.name, run.method_names, options.runs_dir,
                     args.detection_only)
    known = known_populations(args.populations)
    population = run_population_id(suite, root, known)
    check_population(suite.name, population, known, f"the run of suite {suite.name!r} in {root}",
                     args.populations)
    records = build_records(suite, run.distance, run.methods, population, options.runs_dir,
                            options, detection_only=args.detection_only)
    paths = [write_record(record, args.out) for record in records]
    for record, path in zip(records, paths):
        print(f"{record.method.name}: {path}")
    print(f"{len(paths)} record(s) of population {population} (suite {suite.name}) in {args.out}")
    return paths


if __name__ == "__main__":
    run_cli(main, get_args_parser())
