"""The main job: does each explanation method detect each anomalous model? (the paper's Table 1)

    python evaluate/detect.py                 # the demo suite end to end, then Table 1
    python evaluate/detect.py --quick         # a smaller suite: a smoke test in a few minutes
    python evaluate/detect.py --suite paper --distance lpips-alex --weights-dir ~/weights

Runs whatever upstream work is missing (world, training with implant checks, image sets,
visualizations of the detection images: localize.py explains the abnormal ones), then scores
every model on the m detection images: Abar(f, E) is the mean anomaly
score, and E detects f when Abar(f, E) exceeds every reference's own (leave-one-out) Abar.
Tables are printed as Markdown and saved as .md/.csv/.tex under runs/<suite>/tables/.
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
    return pipeline_parser("counteraudit detection", add_help)


def main(args: argparse.Namespace) -> dict:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.anomalies.image_sets import DETECTION, set_sources
    from counteraudit.evaluate.pipeline import describe_distance, prepare
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.evaluate.scoring.baseline import DETECTION_VERSUS_CAPTION
    from counteraudit.evaluate.scoring.detection import margin_wide, paper_rule_caution
    from counteraudit.evaluate.scoring.explain_time import EXPLAIN_TIME, EXPLAIN_TIME_CAPTION
    from counteraudit.evaluate.scoring.model_blind import detection_blind
    from counteraudit.evaluate.scoring.provenance import PROVENANCE
    from counteraudit.evaluate.scoring.stage import tables_dir
    from counteraudit.evaluate.scoring.tables import stored_detection_tables

    run = prepare(args, detection_only=True)  # localize.py explains the abnormal sets
    suite, methods, distance, options = run.suite, run.method_names, run.distance, run.options
    distance_name = distance.name
    if options.dry_run:
        return {}
    started = time.perf_counter()
    scores = run.detection_scores()
    print(f"scored in {time.perf_counter() - started:.0f}s")
    references = [s.name for s in suite.references]
    tables = stored_detection_tables(suite, scores, distance_name, methods, options.runs_dir)
    summary, per_model = tables[f"detection-{distance_name}"], tables[f"detection-per-model-{distance_name}"]
    tables.update(run.detector_tables())
    label = run.tables_label(args.method)
    write_tables(suite, tables, options.runs_dir, only_methods=label, parameters=args.method_params)
    anomalous = per_model[per_model["role"] == "anomalous"]
    print(f"\nTable 1 -- fraction of each family's models detected by the paper's rule (Abar above every "
          f"reference's; {describe_distance(distance_name)};"
          f" {suite.name} suite, {len(references)} references; {set_sources(suite, [DETECTION])})\n")
    print(to_markdown(summary))
    if tables.get(f"detection-families-{distance_name}") is None:  # no null models: no verdicts
        print(f"\nEvery detection in Table 1 is {paper_rule_caution(len(references))} (with "
              f"{len(references)} references). Verdicts need null models: [references] held_out "
              "and [evaluate] p_value (the replicated suite has them).")
    for line in detection_blind(tables, distance_name).values():
        print(f"\n{line}")
    nulls = tables.get(f"detection-null-{distance_name}")
    if nulls is not None:
        print(f"\nNull row: {len(suite.held_out)} held-out references (seeds trained like the "
              f"references) scored as if anomalous; the fraction flagged is the rule's empirical "
              f"false-positive rate (exact 95% interval), beside 1/(n+1) = "
              f"{1 / (len(references) + 1):.3f}, the rate for a model exchangeable with the "
              f"{len(references)} references\n")
        print(to_markdown(nulls))
    print_verdicts(tables, distance_name)  # where the suite asked for null p-values
    print("\nPer model: margin = Abar(f) / max_i Abar(g_i), one column per method (> 1 means "
          "detected; printed with the digits it takes to show which side of 1 it is on)\n")
    print(to_markdown(margin_wide(anomalous)))
    intervals = tables[f"detection-intervals-{distance_name}"]
    if (intervals["n_models"] >= 2).any():
        print("\nTable 1 with exact (Clopper-Pearson) 95% intervals, for families of two models "
              "or more\n")
        print(to_markdown(intervals))
    ratios = tables.get(f"detection-vs-outputs-{distance_name}")
    if ratios is not None:
        print(f"\n{DETECTION_VERSUS_CAPTION}\n")
        print(to_markdown(ratios))
    print(f"\n{EXPLAIN_TIME_CAPTION}\n")
    print(to_markdown(tables[EXPLAIN_TIME], float_format="{:.3g}"))
    print("\nWhere these numbers were computed (numeric mode and CPU of scoring and training)\n")
    print(to_markdown(tables[PROVENANCE]))
    print_detector_tables(tables)
    print(f"\ntables: {tables_dir(suite, options.runs_dir, label, args.method_params)}/")
    return tables


def print_detector_tables(tables: dict) -> None:
    """The tables only a run with --detector has, each with its caption."""
    from counteraudit.evaluate.defect_detectors.tables import CAPTIONS as DETECTOR_CAPTIONS
    from counteraudit.evaluate.reporting.tables import to_markdown

    for name, caption in DETECTOR_CAPTIONS.items():
        table = tables.get(name)
        if table is not None and len(table):
            print(f"\n{caption}\n")
            print(to_markdown(table, float_format="{:.3g}"))


def print_verdicts(tables: dict, distance_name: str) -> None:
    """The verdict tables, where the suite asked for null p-values."""
    from counteraudit.evaluate.reporting.tables import to_markdown
    from counteraudit.evaluate.scoring.stability import OUTLYING_DISTANCE
    from counteraudit.evaluate.scoring.verdicts import findings

    verdicts = tables.get(f"detection-verdicts-{distance_name}")
    if verdicts is None:
        return
    power = tables[f"detection-power-{distance_name}"]
    test = power["test"].iloc[0] if len(power) else "null"
    print(f"\nTable 1 with verdicts: each family's detection rate under the {test} test, its exact "
          "95% interval and verdict (evaluate/scoring/verdicts.py states the rules), with the "
          "paper's rule's fraction over the same models\n")
    print(to_markdown(verdicts))
    configurations = tables[f"detection-verdicts-configurations-{distance_name}"]
    if len(configurations) > len(verdicts):  # a family of several configurations: each apart
        print("\nThe same per configuration (its replicates only)\n")
        print(to_markdown(configurations))
    families = tables[f"detection-families-{distance_name}"]
    print("\nWhat this run found:")
    for line in findings(families):
        print(f"- {line}")
    fragile = families[families["fragile"]]
    print(f"\nFragile verdicts (one model left out flips them; {len(fragile)} of {len(families)}):"
          + ("" if len(fragile) else " none"))
    for row in fragile.itertuples(index=False):
        print(f"- {row.family}, {row.method}: {row.verdict}; {row.flipped_by}")
    outlying = tables[f"detection-outlying-nulls-{distance_name}"]
    far = outlying[outlying["outlying_in"] != ""]
    print(f"\nHeld-out clean models more than {OUTLYING_DISTANCE} robust SDs of log Abar from the "
          "others" + (":" if len(far) else ": none"))
    for row in far.itertuples(index=False):
        print(f"- {row.model} ({row.role} null, val accuracy {row.val_accuracy:.3f}): far in "
              f"{row.outlying_in}" + (f"; leaving it out flips {row.moves}" if row.moves else ""))
    print("\nEach method's null population (fitting held-out references) and power: a model is "
          "detected with probability 0.8 once its Abar reaches power_level (as a margin over the "
          "references' highest Abar: power_level_margin)\n")
    print(to_markdown(power))
    calibration = tables[f"detection-calibration-{distance_name}"]
    if len(calibration):
        print("\nCalibration: clean held-out models tested against nulls they were not fitted to "
              "(halves: the checking half against the fitting half, and swapped; leave-one-out: each "
              "against all the others); the share flagged is each test's false-positive rate (exact "
              "95% interval)\n")
        print(to_markdown(calibration))


if __name__ == "__main__":
    run_cli(main, get_args_parser())
