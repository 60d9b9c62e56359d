"""Dose-response: each family's strength against its implant figure, every method's detection
margin and localization AUROC, and each method's threshold (the weakest defect it detects).

    python evaluate/dose.py --suite dose       # the shipped sweep suite, end to end
    python evaluate/dose.py --suite my.toml    # any suite with [[sweeps]]

Runs whatever upstream work is missing (like detect.py: training with implant checks, explaining,
scoring), then prints one block per sweep: a row per strength with the implant figure (the
model's, the references' mean, whether the check passed), each method's margin Abar(f) / max_i
Abar(g_i) (a star marks detected: above every reference) and, for localizable families, its
AUROC with the 95% bootstrap band over images; then each method's thresholds. The tables are saved
under runs/<suite>/tables/ (dose-*.csv) and the report (evaluate/report.py) draws one panel per
sweep.
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
from typing import TYPE_CHECKING

from counteraudit.evaluate.pipeline_options import pipeline_parser
from counteraudit.train.core.command_line import run_cli

if TYPE_CHECKING:
    import pandas as pd


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = pipeline_parser("counteraudit dose", add_help)
    parser.set_defaults(suite="dose")
    return parser


def suite_dose_tables(suite, methods, distance, runs_root=None, options=None):
    """(dose table, thresholds) of a suite with [[sweeps]], from its detection and localization
    score tables (computed when missing) and its implant records."""
    from counteraudit.anomalies.image_sets import localizable
    from counteraudit.evaluate.scoring.stage import detection_scores, localization_scores
    from counteraudit.evaluate.studies.dose_response import suite_dose
    from counteraudit.train.implant_checks import read_implant

    if not suite.sweeps:
        raise ValueError(f"suite {suite.name!r} declares no [[sweeps]]; run --suite dose, or add "
                         "[[sweeps]] entries (family, values, params) to your suite file")
    detection = detection_scores(suite, distance, methods, runs_root, options)
    localization = (localization_scores(suite, distance, methods, runs_root, options)
                    if localizable(suite) else None)
    implants = {s.name: read_implant(suite, s, runs_root) for s in suite.anomalies}
    return suite_dose(suite, detection, localization, implants)


def main(args: argparse.Namespace) -> dict[str, pd.DataFrame]:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.evaluate.pipeline import describe_distance, prepare
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.evaluate.scoring.stage import tables_dir
    from counteraudit.evaluate.studies.dose_response import sweep_table, threshold_text

    run = prepare(args)
    suite, methods, distance, options = run.suite, run.method_names, run.distance, run.options
    distance_name = distance.name
    if options.dry_run:
        return {}
    dose, limits = suite_dose_tables(suite, methods, distance, options.runs_dir, options)
    print(f"\nDose-response ({describe_distance(distance_name)}; {suite.name} suite, "
          f"{len(suite.references)} references). margin = Abar(f) / max_i Abar(g_i), * = detected "
          "(above every reference); AUROC [95% bootstrap band over images]")
    for sweep in suite.sweeps:
        print(f"\n### {sweep.name}: {sweep.family}, {sweep.parameter} = "
              f"{', '.join(f'{v:g}' for v in sweep.values)}\n")
        print(to_markdown(sweep_table(dose, sweep.name)))
    shown = limits.assign(
        detects_from=[threshold_text(v, m) for v, m in
                      zip(limits["detection_threshold"], limits["detection_monotone"])],
        localizes_from=[threshold_text(v, m) for v, m in
                        zip(limits["localization_threshold"], limits["localization_monotone"])])
    print("\nThresholds: the weakest strength each method detects (localizes: the weakest whose "
          "AUROC band lies above 0.5); 'none': no strength of the sweep; 'not monotone': a stronger "
          "model is missed again\n")
    wide = shown.pivot(index="sweep", columns="method", values="detects_from")
    wide = wide.reindex(index=[s.name for s in suite.sweeps], columns=list(dict.fromkeys(shown["method"])))
    print("detection\n")
    print(to_markdown(wide.rename_axis(None, axis=1).reset_index()))
    located = shown[shown["localizes_from"] != "n/a"]
    if len(located):
        wide = located.pivot(index="sweep", columns="method", values="localizes_from")
        wide = wide.reindex(index=[s.name for s in suite.sweeps if s.name in set(located["sweep"])],
                            columns=list(dict.fromkeys(located["method"])))
        print("\nlocalization\n")
        print(to_markdown(wide.rename_axis(None, axis=1).reset_index()))
    tables = {f"dose-{distance_name}": dose, f"dose-thresholds-{distance_name}": limits}
    write_tables(suite, tables, options.runs_dir, only_methods=args.method,
                 parameters=args.method_params)
    print(f"\ntables: {tables_dir(suite, options.runs_dir, args.method, args.method_params)}/")
    return tables


if __name__ == "__main__":
    run_cli(main, get_args_parser())
