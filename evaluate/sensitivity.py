"""Do the benchmark's conclusions survive the protocol's choices? (beyond the paper)

    python evaluate/sensitivity.py                    # the demo, every protocol choice
    python evaluate/sensitivity.py --quick            # the small 'quick' suite
    python evaluate/sensitivity.py --suite demo --choice ig_baseline --choice renderer

A finished suite is explained and scored once more under each alternative of each protocol choice
(evaluate/studies/protocol_choices.py: the saliency renderer, Integrated Gradients' baseline, the gradient
space, Caricature noise, the explained class), one choice changed at a time. Each alternative is a
suite file derived from the suite's own (runs/<suite>/sensitivity/<choice>-<value>.toml), so the
store shares everything a choice does not touch: the models, the image sets, and the
visualizations of every method the choice leaves alone; only the methods whose parameters change
are explained again, and a rerun computes nothing.

Printed, and saved under runs/<suite>/tables/ as sensitivity-detection-<distance> and
sensitivity-localization-<distance>: Table 1's margins and Table 2's AUROCs under the suite's own
protocol and under each alternative, side by side, with a "!" where a verdict changes:
detection (Abar above every reference's), localization (AUROC above the chance band of label
permutations), and whether the method localizes better than the outputs-only control (the paired
bootstrap's adds / same / less).
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
    parser = pipeline_parser("counteraudit sensitivity", add_help)
    # The choices are not listed here: their registry loads the methods (torch); evaluate/README.md
    # lists them, and a name not registered is answered with the list before any work.
    parser.add_argument("--choice", action="append", default=None, metavar="NAME",
                        help="only this protocol choice (repeatable; a registered one: "
                             "evaluate/README.md, 'What each choice changes'); default: every "
                             "choice that applies to the suite's methods. Each alternative "
                             "re-explains only the methods it changes")
    return parser


def main(args: argparse.Namespace) -> dict[str, pd.DataFrame]:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.evaluate.pipeline import describe_distance, prepare
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.evaluate.scoring.baseline import BASELINE
    from counteraudit.evaluate.studies.sensitivity import CHANGED, compare, plan_variants, scored_tables, side_by_side
    from counteraudit.evaluate.studies.protocol_choices import PROTOCOL_CHOICES
    import pandas as pd

    for name in args.choice or []:
        PROTOCOL_CHOICES.get(name)  # an unknown name lists the registered ones, before any work
    run = prepare(args)
    suite, methods, distance, options = run.suite, run.method_names, run.distance, run.options
    distance_name = distance.name
    variants, skipped = plan_variants(suite, methods, args.choice, options.runs_dir)
    if options.dry_run:
        for variant in variants:
            print(f"{variant.choice} = {variant.value}: would explain {', '.join(variant.methods)}")
        return {}
    print(f"\n== sensitivity: {len(variants)} alternative protocol(s) on suite {suite.name!r} "
          f"({describe_distance(distance_name)})")
    for line in skipped:
        print(f"skipped {line}")
    base = scored_tables(suite, methods, distance, options)
    detections, localizations = [], []
    for variant in variants:
        if not variant.methods:
            print(f"{variant.choice} = {variant.value}: changes no method's results; nothing to run")
            continue
        print(f"\n-- {variant.choice} = {variant.value}: explaining {', '.join(variant.methods)}",
              flush=True)
        # the outputs-only control rides along (stored, never recomputed): the "adds over the
        # outputs" verdict needs it on the same images
        variant_methods = variant.methods + ([BASELINE] if BASELINE in methods and BASELINE not in
                                             variant.methods else [])
        other = scored_tables(variant.suite, variant_methods, distance, options)
        det, loc = compare(base, other, variant)
        detections.append(det)
        localizations.append(loc)
    if not detections:
        print("no alternative changes a result")
        return {}
    tables = {f"sensitivity-detection-{distance_name}": pd.concat(detections, ignore_index=True),
              f"sensitivity-localization-{distance_name}": pd.concat(localizations, ignore_index=True)}
    write_tables(suite, tables, options.runs_dir, only_methods=args.method,
                 parameters=args.method_params)
    detection, localization = tables.values()
    print(f"\nTable 1 margins, the suite's protocol -> the alternative ({CHANGED}: the detection "
          f"verdict changes)\n")
    anomalous = detection[detection["family"] != "reference"]
    print(to_markdown(side_by_side(anomalous, "margin", ["detection_changed"])))
    print(f"\nTable 2 AUROCs, the suite's protocol -> the alternative ({CHANGED}: above the chance "
          "band or not, or adds / same / less against outputs-only, changes)\n")
    print(to_markdown(side_by_side(localization, "auroc",
                                   ["localization_changed", "versus_outputs_changed"])))
    flips = (int(detection["detection_changed"].sum()),
             int(localization["localization_changed"].sum()),
             int(localization.get("versus_outputs_changed", pd.Series(dtype=bool)).sum()))
    print(f"\nverdicts changed: {flips[0]} detection, {flips[1]} localization, {flips[2]} against "
          f"outputs-only, of {len(detection)} detection and {len(localization)} localization cells")
    return tables


if __name__ == "__main__":
    run_cli(main, get_args_parser())
