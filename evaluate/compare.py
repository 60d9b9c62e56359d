"""Method against method, paired: is one explanation method better than another on the same
images and models?

    counteraudit compare --suite quick --method guided_gradcam --against gradcam,guided_backprop
    counteraudit compare --suite replicated --method mine:k=4 --plugins my_method.py --against gradcam

For every pair (each --method against each --against; default: the outputs-only control) on the
same images and models: McNemar's exact test of their detections over the anomalous models
(Holm-adjusted over the pairs), Table 1's paired margin ratio per model with its bootstrap
interval and verdict (adds, same, less, neither), Table 2's paired dAUROC per localizable model,
and, on a suite with null models and replicates, each family's difference of detection rates
with Newcombe's paired interval (Bonferroni over the rows shown) and McNemar's p (Holm over the
rows shown). Runs whatever upstream work is missing for these methods (and the control, as
every --method run, unless --no-control); the tables go under runs/<suite>/tables/method-<names>/
as compare-<methods>-vs-<against>-*.
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

from counteraudit.evaluate.pipeline_options import add_against_arg, pipeline_parser
from counteraudit.train.core.command_line import run_cli

if TYPE_CHECKING:
    from counteraudit.evaluate.scoring.pair_tables import Comparison


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = add_against_arg(pipeline_parser("counteraudit compare", add_help))
    parser.add_argument("--detection-only", action="store_true",
                        help="explain and score the detection images alone (what detect.py "
                             "needs), not the localizable models' abnormal sets: no paired "
                             "dAUROC, and the output says so")
    return parser


def main(args: argparse.Namespace) -> Comparison | None:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.anomalies.image_sets import localizable
    from counteraudit.evaluate.pipeline import comparison_request, describe_distance, prepare
    from counteraudit.evaluate.reporting.tables import write_tables
    from counteraudit.evaluate.scoring import pair_tables as part
    from counteraudit.evaluate.scoring.pair_tables import comparison_tables
    from counteraudit.evaluate.scoring.stage import tables_dir
    from counteraudit.evaluate.scoring.tables import stored_detection_tables
    from counteraudit.evaluate.scoring.verdicts import null_plan

    pairs = comparison_request(args)  # a bad name or no pair fails before any work
    if pairs is None:
        raise ValueError("--against names no method: give one or more registered method names, "
                         "comma-separated (default: outputs_only)")
    run = prepare(args, detection_only=args.detection_only)
    suite, methods, distance, options = run.suite, run.method_names, run.distance, run.options
    distance_name, runs_root = distance.name, options.runs_dir
    if options.dry_run:
        return None
    detection = run.detection_scores()
    tables = stored_detection_tables(suite, detection, distance_name, methods, runs_root)
    localization = (run.localization_scores()
                    if localizable(suite) and not args.detection_only else None)
    comparison = comparison_tables(suite, tables, detection, localization, pairs, distance_name,
                                   localizable=bool(localizable(suite)), plan=null_plan(suite))
    if args.detection_only and localizable(suite):
        comparison.notes[part.LOCALIZATION] = part.DETECTION_ONLY
    label = run.tables_label(args.method)
    write_tables(suite, comparison.frames, runs_root, only_methods=label, parameters=args.method_params)
    print_comparison(comparison, suite, describe_distance(distance_name))
    print(f"\ntables: {tables_dir(suite, runs_root, label, args.method_params)}/"
          f"{part.comparison_key(comparison.label, '*', distance_name)}")
    return comparison


def print_comparison(comparison: Comparison, suite, distance: str) -> None:
    from counteraudit.evaluate.reporting.tables import to_markdown
    from counteraudit.evaluate.scoring import pair_tables as part
    from counteraudit.evaluate.scoring.pair_tables import significant_lines

    print(f"\nMethod against method on the {suite.name} suite ({distance}): "
          + "; ".join(f"{m} vs {a}" for m, a in comparison.pairs))
    for table, caption in [(part.MCNEMAR, part.MCNEMAR_CAPTION),
                           (part.DETECTION_COUNTS, part.COUNTS_CAPTION),
                           (part.DETECTION, part.DETECTION_CAPTION),
                           (part.LOCALIZATION, part.LOCALIZATION_CAPTION),
                           (part.FAMILIES, comparison.family_caption)]:
        frame = comparison.get(table)
        if frame is not None:
            print(f"\n{caption}\n")
            print(to_markdown(frame, float_format="{:.3g}"))
        if table in comparison.notes:
            print(f"\n{comparison.notes[table]}")
    differences = comparison.get(part.FAMILIES)
    if differences is not None:
        print("\nWhich differences are significant after Holm:")
        for line in significant_lines(differences):
            print(f"- {line}")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
