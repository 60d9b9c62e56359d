"""One self-contained HTML report of a suite's results: tables, implant checks, example
visualizations, score distributions and ROC curves.

    python evaluate/report.py                  # the demo suite end to end, then the report
    python evaluate/report.py --quick
    python evaluate/report.py --suite paper --distance lpips-alex --output ~/report.html

Runs whatever upstream work is missing (like detect.py and localize.py, whose score functions and
tables it reuses and whose table files it writes too), then writes ONE HTML file (default
runs/<suite>/report/report.html): inline CSS, images as PNG data URIs, plots as inline SVG, no
external resources, so it can be mailed or opened offline. The output depends only on the run's
artifacts (no date), so the same run gives the same bytes.

Contents: a header (suite, the distance and where it was chosen, model counts); Table 1 with the
per-model and per-layer detection tables; Table 2 with the per-model localization table (AUROC,
bootstrap interval, chance band); each anomalous model's implant check with its family's figures
against the references'; example visualizations (for every anomalous model and method: the
detection image with the model's median anomaly score, a reference's visualization of it and the
model's, with their scores; for every localizable model: normal and abnormal inputs explained by a
reference and by the model, as in the paper's Figures 2-4); per-method score distributions; ROC
curves per localizable model and method.

Layered methods (Caricatures): the example images show the FIRST layer only, with that layer's
scores (the tables and plots use the overall score, the mean over layers, and list every layer).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file: the code is imported as counteraudit.* (pip install -e .); this folder's
    # modules (train.py, ...) must not shadow other packages of the same name.
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse

from counteraudit.evaluate.pipeline_options import add_against_arg, pipeline_parser
from counteraudit.evaluate.reporting.page_defaults import DEFAULT_EXAMPLES, DEFAULT_IMAGE_SIDE
from counteraudit.train.core.command_line import run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = pipeline_parser("counteraudit report", add_help)
    parser.add_argument("--output", default=None, metavar="PATH",
                        help="the HTML file to write (default: runs/<suite>/report/report.html; "
                             "with --method, report-method-<names>.html beside it)")
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES,
                        help="normal and abnormal example inputs per localizable model")
    parser.add_argument("--image-side", type=int, default=DEFAULT_IMAGE_SIDE,
                        help="embedded images larger than this (pixels a side) are downscaled")
    return add_against_arg(parser, default=None)


def report_path(suite, args: argparse.Namespace, names: list[str] | None) -> Path:
    """Where the report goes: --output as given, else in the suite's report/ folder, checked to
    lie in the runs folder. A --method (or --detector) run's report goes beside the suite's
    (report-method-<names>.html, ``names`` its methods and detectors), as its tables do."""
    from counteraudit.evaluate.scoring.stage import only_methods_label
    from counteraudit.train.core.artifacts import inside_runs

    if args.output:
        return Path(args.output)
    label = only_methods_label(names, args.method_params)
    return inside_runs(suite.root(args.runs_dir) / "report" /
                       (f"report-{label}.html" if label else "report.html"))


def main(args: argparse.Namespace) -> Path | None:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.anomalies.image_sets import localizable
    from counteraudit.evaluate.pipeline import comparison_request, prepare
    from counteraudit.evaluate.reporting.page import Report
    from counteraudit.evaluate.reporting.sensitivity import stored_sensitivity
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.evaluate.scoring.model_blind import detection_blind
    from counteraudit.evaluate.scoring.pair_tables import comparison_tables
    from counteraudit.evaluate.scoring.stage import model_level_methods
    from counteraudit.evaluate.scoring.tables import (localization_tables, stored_detection_tables,
                                                      zoo_summary_caption, zoo_summary_tables)
    from counteraudit.evaluate.scoring.verdicts import null_plan
    from counteraudit.evaluate.studies.dose_response import suite_dose
    from counteraudit.explain.stage import load_image_sets
    from counteraudit.train.core.artifacts import atomic_write_text
    from counteraudit.train.implant_checks import read_implant

    if args.examples < 1 or args.image_side < 8:
        raise ValueError(f"--examples {args.examples} must be >= 1 and --image-side {args.image_side} >= 8")
    request = comparison_request(args)  # --against: its section "Method against method"
    run = prepare(args)
    suite, methods, distance, options = run.suite, run.method_names, run.distance, run.options
    distance_name, runs_root = distance.name, options.runs_dir
    if options.dry_run:
        return None
    # a link in its way fails before scoring and rendering
    output = report_path(suite, args, run.tables_label(args.method))
    detection = run.detection_scores()
    implants = {s.name: read_implant(suite, s, runs_root) for s in suite.anomalies}
    tables = stored_detection_tables(suite, detection, distance_name, methods, runs_root,
                                     implants=implants)
    model_level = model_level_methods(methods) + run.model_level_detectors
    localization = None
    if localizable(suite):
        localization = run.localization_scores()
        tables.update(localization_tables(localization, distance_name, suite,
                                          not_applicable=model_level))
        tables.update(zoo_summary_tables(tables, distance_name, len(suite.references),
                                         not_localized=model_level))
    comparison = None if request is None else comparison_tables(
        suite, tables, detection, localization, request, distance_name,
        localizable=bool(localizable(suite)), plan=null_plan(suite))
    tables.update(comparison.frames if comparison else {})
    if suite.sweeps:  # dose-response: one panel per sweep
        dose, limits = suite_dose(suite, detection, localization, implants)
        tables.update({f"dose-{distance_name}": dose, f"dose-thresholds-{distance_name}": limits})
    tables.update(run.detector_tables())
    write_tables(suite, tables, runs_root, only_methods=run.tables_label(args.method),
                 parameters=args.method_params)
    summary = tables.get(f"zoo-summary-{distance_name}")
    if summary is not None:
        caption = zoo_summary_caption(suite, tables.get(f"detection-families-{distance_name}"),
                                      distance_name)
        print(f"\n{caption}\n\n{to_markdown(summary, float_format='{:.2f}')}")
        for line in detection_blind(tables, distance_name).values():
            print(f"\n{line}")
    discovery = stored_discovery(suite, runs_root)
    report = Report(suite=suite, methods=methods, distance_name=distance_name, source=run.source,
                    detection=detection, localization=localization, tables=tables,
                    implants=implants,
                    image_sets=load_image_sets(suite, runs_root, classes=bool(model_level)),
                    runs_root=runs_root,
                    examples=args.examples, image_side=args.image_side, discovery=discovery,
                    sensitivity=stored_sensitivity(suite, distance_name, runs_root),
                    comparison=comparison)
    text = report.html()
    atomic_write_text(output, text, chosen_by_user=bool(args.output))
    print(f"\nreport ({len(text.encode()) / 1e6:.2f} MB, {report.image_count} images): {output}")
    return output


def stored_discovery(suite, runs_root=None):
    """(findings, tables, world) of the failure-discovery auditors when evaluate/discover.py has
    run for this suite, else None (the report then says how to add them)."""
    from counteraudit.evaluate.discovery.reference_evaluations import scored_findings
    from counteraudit.evaluate.discovery.search_study import search_study
    from counteraudit.evaluate.discovery.stage import FINDINGS, discover_score, discover_seed
    from counteraudit.evaluate.discovery.tables import discovery_tables
    from counteraudit.train.core.artifacts import store_dir
    from counteraudit.train.worlds import build_world

    if not any((store_dir(runs_root) / FINDINGS).glob("*/*")):
        return None  # never run: don't build covering arrays only to find nothing
    world = build_world(suite.world, runs_root=runs_root)
    score = discover_score(suite)
    try:
        results = scored_findings(suite, runs_root, world=world, score=score)
    except FileNotFoundError:
        return None
    tables = discovery_tables(suite, results, world, runs_root, score)
    tables.update(search_study(suite, results, world, runs_root, discover_seed(suite)).get(
        "tables", {}))
    return results, tables, world


if __name__ == "__main__":
    run_cli(main, get_args_parser())
