"""Localization: is each method's anomaly score higher on the inputs where the anomalous model
misbehaves? (the paper's Table 2)

    python evaluate/localize.py               # the demo suite end to end, then Table 2
    python evaluate/localize.py --quick

For every localizable anomalous model (backdoor, spurious, missing class, blurred faces): AUROC of
A(f, E, x) for its p abnormal vs p normal images, a bootstrap 95% interval, and the band an AUROC
falls in by chance at these set sizes (label permutations). Runs whatever upstream work is missing.
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
import time

from counteraudit.evaluate.pipeline_options import pipeline_parser
from counteraudit.train.core.command_line import run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    return pipeline_parser("counteraudit localization", add_help)


def main(args: argparse.Namespace) -> dict:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.anomalies.image_sets import set_sources
    from counteraudit.evaluate.pipeline import describe_distance, prepare
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.evaluate.scoring.model_blind import localization_blind
    from counteraudit.evaluate.scoring.stage import model_level_methods, tables_dir
    from counteraudit.evaluate.scoring.tables import chance_band_note, localization_power_note, localization_tables

    run = prepare(args)
    suite, methods, distance, options = run.suite, run.method_names, run.distance, run.options
    distance_name = distance.name
    if options.dry_run:
        return {}
    started = time.perf_counter()
    scores = run.localization_scores()
    print(f"scored in {time.perf_counter() - started:.0f}s")
    model_level = model_level_methods(methods) + run.model_level_detectors
    tables = localization_tables(scores, distance_name, suite, not_applicable=model_level)
    summary = tables[f"localization-{distance_name}"]
    per_model = tables[f"localization-per-model-{distance_name}"]
    label = run.tables_label(args.method)
    write_tables(suite, tables, options.runs_dir, only_methods=label, parameters=args.method_params)
    print(f"\nTable 2 -- localization AUROC, abnormal vs normal inputs "
          f"({describe_distance(distance_name)}; {suite.name} suite; images: {set_sources(suite)})\n")
    print(to_markdown(summary, float_format="{:.2f}"))
    for line in localization_blind(tables, distance_name).values():
        print(f"\n{line}")
    if model_level:
        print(f"\n{', '.join(model_level)}: not applicable (a model-level method explains "
              "the model, one image per class, and a model-level detector inspects the whole "
              "model: neither says anything of an input; detection only)")
    if not per_model.empty:
        print(f"\n{chance_band_note(per_model)}")
    replicated = tables.get(f"localization-replicates-{distance_name}")
    if replicated is not None:
        print("\nTable 2 over replicates: each configuration's mean AUROC over its seeds, 95% "
              "interval resampling models, then images\n")
        print(to_markdown(replicated, float_format="{:.2f}"))
    versus = tables.get(f"localization-vs-outputs-{distance_name}")
    if versus is not None:
        print("\nAgainst the outputs-only control: AUROC(method) - AUROC(outputs_only) on the same "
              "images, paired bootstrap 95% interval; 'adds' = the explanation localizes better "
              "than the outputs alone, 'same' = no better, 'less' = worse\n")
        print(to_markdown(versus))
    power = localization_power_note(suite)
    if power:
        print(power)
    print(f"tables: {tables_dir(suite, options.runs_dir, label, args.method_params)}/")
    return tables


if __name__ == "__main__":
    run_cli(main, get_args_parser())
