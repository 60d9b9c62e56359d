"""What the scoring scripts (detect.py, localize.py, report.py, dose.py, sensitivity.py) share once
their command line is parsed (its options: pipeline_options.py): the upstream stages run before
scoring (training with implant checks, image sets, explanations), so each script runs whatever is
missing."""
from __future__ import annotations

import argparse
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from counteraudit.evaluate.defect_detectors.scores import (detector_detection_scores, detector_localization_scores,
                                                           localizing_detectors)
from counteraudit.evaluate.defect_detectors.detectors import DETECTORS
from counteraudit.evaluate.defect_detectors.stage import check_detectors, inspect_suite, load_inspections
from counteraudit.evaluate.defect_detectors.tables import detector_tables
from counteraudit.evaluate.scoring.distances import DISTANCES, Distance, MissingBackboneWeightsError, build_distance
from counteraudit.evaluate.discovery.stage import auditor_problems
from counteraudit.evaluate.scoring.null_tests.base import null_test_problems
from counteraudit.evaluate.scoring.pairwise import Pair, pairs_for
from counteraudit.evaluate.scoring.stage import detection_scores, localization_scores
from counteraudit.explain.base import METHODS
from counteraudit.explain.method_choice import run_methods, with_method_parameters
from counteraudit.explain.settings import MethodSpec, method_problems, method_specs
from counteraudit.explain.stage import explain_suite, explained_images_line
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.core.stage import RunOptions, run_options
from counteraudit.train.core.suite import Suite, load_suite
from counteraudit.train.core.suite_checks import named_problems
from counteraudit.train.core.suite_schema import MIN_SCORED_REFERENCES, SuiteFileError, SuiteTable
from counteraudit.train.core.table_problems import problem_lines
from counteraudit.train.checked_training import train_and_check



# ---------------------------------------------------------------- the end-to-end run
def comparison_request(args: argparse.Namespace) -> list[Pair] | None:
    """The pairs of --method against --against, or None without --against; the run's
    --method then names both sides, so both are explained and scored. Names are checked against
    the method registry before any work."""
    if not args.against:
        return None
    against = [name.strip() for name in args.against.split(",") if name.strip()]
    if not args.method:
        raise ValueError(f"--against {args.against} compares the --method methods with these: "
                         "name the method to compare with --method NAME (repeatable)")
    detectors = [name for name in [*args.method, *against] if name in DETECTORS]
    for name in against:
        if name in detectors:
            continue
        try:
            METHODS.get(name)
        except UnknownNameError as error:  # the registry's sentence lists the valid names
            raise UnknownNameError(f"--against {args.against}: {error}; or a detector: "
                                   f"{', '.join(DETECTORS.names())}") from None
    pairs = pairs_for(args.method, against)
    # a detector on either side is inspected and scored as --detector runs it
    args.method = [n for n in dict.fromkeys([*args.method, *against]) if n not in detectors] or None
    args.detector = list(dict.fromkeys([*(getattr(args, "detector", None) or []), *detectors]))
    return pairs


@dataclass(frozen=True)
class Prepared:
    """What a scoring script scores, once the upstream stages ran: the suite (the command line's
    overrides merged in), its methods, the distance built, where the distance was chosen, and
    how to run (the runs folder, the device, the executor)."""
    suite: Suite
    methods: dict[str, MethodSpec]
    distance: Distance
    source: str
    options: RunOptions
    detectors: tuple[str, ...] = ()  # --detector: checked against the suite's models

    @property
    def method_names(self) -> list[str]:
        return list(self.methods)

    @property
    def model_level_detectors(self) -> list[str]:
        """The run's detectors Table 2 does not apply to (they score no input)."""
        return [name for name in self.detectors if name not in localizing_detectors(self.detectors)]

    def tables_label(self, only_methods: list[str] | None) -> list[str] | None:
        """The names a run's tables folder is named by (``scoring.stage.tables_dir``): --method's,
        and with --detector the run's methods and detectors, so that tables holding detectors
        never replace the suite's own."""
        if not self.detectors:
            return only_methods
        return [*(only_methods or self.method_names), *self.detectors]

    def detection_scores(self) -> pd.DataFrame:
        """Table 1's scores: every method's (``scoring.stage.detection_scores``), then every
        detector's from its stored inspections (``defect_detectors.scores``)."""
        runs_root = self.options.runs_dir
        scores = detection_scores(self.suite, self.distance, self.method_names, runs_root, self.options)
        if not self.detectors:
            return scores
        detectors = detector_detection_scores(self.suite, self.detectors, self.inspections,
                                              self.distance.name)
        return pd.concat([scores, detectors], ignore_index=True)

    def localization_scores(self) -> pd.DataFrame:
        """Table 2's scores: the methods', then those of the detectors that score inputs."""
        runs_root = self.options.runs_dir
        scores = localization_scores(self.suite, self.distance, self.method_names, runs_root,
                                     self.options)
        if not self.detectors:
            return scores
        detectors = detector_localization_scores(self.suite, self.detectors, self.inspections,
                                                 self.distance.name, runs_root)
        return pd.concat([frame for frame in (scores, detectors) if len(frame)], ignore_index=True)

    @functools.cached_property
    def inspections(self):
        """(detector, model) -> its stored inspection, read once per run."""
        return load_inspections(self.suite, self.detectors, self.options.runs_dir)

    def detector_tables(self) -> dict[str, pd.DataFrame]:
        """The tables only detectors have (``defect_detectors.tables``); none without them."""
        if not self.detectors:
            return {}
        return detector_tables(self.suite, self.detectors, self.inspections, self.options.runs_dir)


def plugin_problems(settings: SuiteTable) -> list[str]:
    """What is wrong with the suite's tables of the layers above training: its explanation
    methods, its auditors, its distance and its null test, each checked by the layer that owns
    it. The composition root's check: ``load_suite`` adds them to the file's other problems."""
    return (method_problems(settings) + auditor_problems(settings)
            + named_problems([settings.evaluate.distance], DISTANCES, "[evaluate] distance")
            + null_test_problems(settings.references, settings.evaluate.p_value, "[evaluate] p_value"))


def load_checked_suite(name_or_path: str | Path) -> Suite:
    """The suite with every table checked, the plug-ins' too: one ``SuiteFileError`` lists the
    problems of the whole file before any work."""
    return load_suite(name_or_path, plugin_problems)


def scoring_suite(name: str, *, distance: str | None = None, p_value: str | None = None,
                  chunk_images: int | None = None, model_group: int | None = None) -> Suite:
    """The suite, its plug-in tables checked, with the command line's overrides of what it
    computes merged in once (--distance, --p-value, --chunk-images, --model-group; None: the
    suite's own) and checked as the file's own values are."""
    suite = load_checked_suite(name).with_settings(
        {"distance": "--distance", "p_value": "--p-value", "chunk_images": "--chunk-images",
         "model_group": "--model-group"},
        evaluate={"distance": distance, "p_value": p_value},
        explain={"chunk_images": chunk_images, "model_group": model_group})
    # the file's own values were checked when it was read: only what the command line changed
    problems = named_problems([distance], DISTANCES, "--distance") if distance else []
    problems += (null_test_problems(suite.settings.references, p_value, "--p-value") if p_value
                 else [])
    if problems:
        raise SuiteFileError(f"suite file {suite.path} with the command line's options has "
                             f"{problem_lines(problems)}")
    check_scorable(suite)
    return suite


def scoring_distance(suite: Suite, options: RunOptions, requested: bool = False) -> tuple[Distance, str]:
    """The distance the scores use, built (``suite.evaluate.distance``: --distance merged into the
    suite's), and where it was chosen (``requested``: by --distance). An LPIPS distance whose
    backbone weights are missing fails here, before any work, with the fix (--download-weights
    downloads them); nothing is downloaded unasked, so a run gives the same tables online and
    offline."""
    name = suite.evaluate.distance
    source = ("--distance" if requested else
              "the suite's [evaluate] distance" if "distance" in suite.evaluate.model_fields_set
              else "the default: the suite sets no [evaluate] distance")
    try:
        distance = build_distance(name, weights_dir=options.weights_dir, download=options.download_weights)
    except MissingBackboneWeightsError as error:
        where = "--distance" if requested else f"suite file {suite.path}: [evaluate] distance"
        raise MissingBackboneWeightsError(f"{where} = {name!r}: {error}") from error
    return distance, source


def prepare(args: argparse.Namespace, detection_only: bool = False) -> Prepared:
    """Everything upstream of scoring that is missing: world, training, implant checks,
    image sets, visualizations (``detection_only``: on the detection sets alone, all Table 1
    scores). The distance is built first, so missing LPIPS weights fail before any work."""
    run = scoring_run(args)
    suite, methods, options = run.suite, run.methods, run.options
    started = time.perf_counter()
    _stage(f"1/3 training {len(suite.models)} models of suite {suite.name!r} (skips trained ones)")
    train_and_check(suite, suite.models, options)
    print(f"training and implant checks: {time.perf_counter() - started:.0f}s")
    _stage(f"2/3 explaining with {', '.join(methods)}"
           + (" (the detection sets: Table 1's)" if detection_only else ""))
    started = time.perf_counter()
    counts = explain_suite(suite, options, methods=methods, detection_only=detection_only)
    print(f"{counts['computed']} visualization set(s) computed, {counts['stored']} already stored, "
          f"in {time.perf_counter() - started:.0f}s; {explained_images_line(counts)}")
    if run.detectors:
        _stage(f"inspecting with the detectors {', '.join(run.detectors)}")
        started = time.perf_counter()
        counts = inspect_suite(suite, options, run.detectors)
        print(f"{counts['computed']} inspection(s) computed, {counts['stored']} already stored, "
              f"in {time.perf_counter() - started:.0f}s")
    _stage(f"3/3 scoring with distance {run.distance.name} ({run.source})")
    return run


def scoring_run(args: argparse.Namespace) -> Prepared:
    """What ``prepare`` scores, read from the command line (``pipeline_parser``'s options: the
    suite with its overrides, --method and its parameters, the distance built), with no upstream
    work run: for a script that reads a finished run and runs nothing missing."""
    suite = scoring_suite(args.suite, distance=args.distance, p_value=args.p_value,
                          chunk_images=args.chunk_images, model_group=args.model_group)
    options = run_options(args)
    distance, source = scoring_distance(suite, options, requested=args.distance is not None)
    names = run_methods(args.method, not args.no_control)
    suite = with_method_parameters(suite, names, args.method_params)
    detectors = tuple(d.name for d in check_detectors(suite, getattr(args, "detector", None) or []))
    return Prepared(suite, method_specs(suite, names), distance, source, options, detectors)


def check_scorable(suite: Suite) -> None:
    """Fail before training when the score stage could not use the suite's references."""
    if len(suite.references) < MIN_SCORED_REFERENCES:
        raise SuiteFileError(
            f"suite file {suite.path}: [references] count = {len(suite.references)} is too few to "
            f"score: each reference is scored against the others with it left out, so at least "
            f"{MIN_SCORED_REFERENCES} are needed; set count = {MIN_SCORED_REFERENCES} or more (the "
            "paper: 12, the demo: 5). Nothing was run.")


def _stage(text: str) -> None:
    print(f"\n== {text}", flush=True)


def describe_distance(distance_name: str) -> str:
    """How a table's caption names its distance (the run said once where it came from)."""
    return f"distance: {distance_name}"
