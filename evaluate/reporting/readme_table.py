"""The README's table of what the demo finds, rendered from a finished run's Tables 1 and 2.

    python -m counteraudit.evaluate.reporting.readme_table              # runs/demo/tables/
    python -m counteraudit.evaluate.reporting.readme_table --runs-dir /path/to/runs

One row per anomalous model, one column per method; a cell says whether the method detects the
model (Table 1's rule) and, for a model with abnormal images, its localization AUROC (Table 2;
Caricatures: the layer average). tests/test_readme_table.py checks that README.md's table is this
function's output on the demo tables stored in tests/data/demo_tables/.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
from pathlib import Path

import pandas as pd

from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.train.core.artifacts import inside_runs, runs_dir
from counteraudit.train.core.command_line import run_cli

# Table 2's row for a method with one AUROC per layer: the average over its layers.
LAYER_AVERAGE = "{method} layer average"
TABLE_FILES = ("detection-per-model-{distance}.csv", "localization-{distance}.csv")


def findings_table(detection_per_model: pd.DataFrame, localization: pd.DataFrame) -> str:
    """Markdown: a row per anomalous model (in Table 1's order), a column per method, cells
    ``yes``/``no`` (detected) followed by the AUROC in brackets where the model localizes."""
    anomalous = detection_per_model[detection_per_model["role"] == "anomalous"]
    methods = list(dict.fromkeys(anomalous["method"]))
    models = list(dict.fromkeys(anomalous["model"]))
    detected = anomalous.set_index(["method", "model"])["detected"]
    aurocs = localization.set_index("method")
    rows = []
    for model in models:
        row = {"model": model}
        for method in methods:
            cell = "yes" if bool(detected[(method, model)]) else "no"
            auroc_row = LAYER_AVERAGE.format(method=method)
            auroc_row = auroc_row if auroc_row in aurocs.index else method
            if model in aurocs.columns and auroc_row in aurocs.index:
                cell += f" ({aurocs.at[auroc_row, model]:.2f})"
            row[method] = cell
        rows.append(row)
    return to_markdown(pd.DataFrame(rows, columns=["model", *methods]))


def findings_table_from(tables: Path, distance: str = "l2") -> str:
    """The table from a run's ``tables/`` folder (Table 1's per-model file and Table 2)."""
    detection, localization = (tables / name.format(distance=distance) for name in TABLE_FILES)
    for path in (detection, localization):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run python evaluate/localize.py (it runs "
                                    "detection first) for this suite and distance")
    return findings_table(pd.read_csv(inside_runs(detection, reading=True)),
                          pd.read_csv(inside_runs(localization, reading=True)))


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit README table", description=__doc__,
                                     add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="demo", help="the suite whose tables are read")
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="the runs folder (default: $COUNTERAUDIT_RUNS, else ./runs)")
    parser.add_argument("--distance", default="l2",
                        help="the distance the tables were scored with (their file names' suffix)")
    return parser


def main(args: argparse.Namespace) -> str:
    table = findings_table_from(runs_dir(args.runs_dir) / args.suite / "tables", args.distance)
    print(table)
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
