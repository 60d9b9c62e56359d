"""What the scoring scripts (detect.py, localize.py, report.py, dose.py, sensitivity.py) share: their
command-line options, and the upstream stages run before scoring (training with implant checks,
image sets, explanations), so each script runs whatever is missing."""
from __future__ import annotations

import argparse
import time
from typing import Any

from counteraudit.evaluate.scoring.distances import MissingBackboneWeightsError, build_distance
from counteraudit.evaluate.scoring.null_tests.base import describe_tests
from counteraudit.explain.stage import (add_chunk_images_arg, explain_suite, explained_images_line,
                                        suite_methods)
from counteraudit.slurm.executor import add_executor_args
from counteraudit.train.core.stage import ScriptHelpFormatter, add_common_args, suite_name
from counteraudit.train.core.suite import Suite, load_suite
from counteraudit.train.core.suite_checks import null_problems
from counteraudit.train.core.suite_schema import DEFAULT_SUITE_DISTANCE, MIN_SCORED_REFERENCES, SuiteFileError
from counteraudit.train.train import train_and_check



# ---------------------------------------------------------------- the end-to-end run
def pipeline_parser(prog: str, add_help: bool = True) -> argparse.ArgumentParser:
    """The options detect.py, localize.py and report.py share: suite, upstream stages, executor."""
    parser = argparse.ArgumentParser(prog, add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    add_common_args(parser)
    add_pipeline_args(parser)
    add_executor_args(parser)
    return parser


def add_pipeline_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_distance_args(parser)
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only this explanation method (repeatable); its tables go to "
                             "runs/<suite>/tables/method-<names>/, beside the suite's, never over them")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--p-value", default=None, metavar="TEST",
                        help="test each model's Abar against the null population of held-out "
                             "references ([references] held_out, 2 or more) and give each a "
                             f"verdict: {describe_tests()}; default: the suite's [evaluate] "
                             "p_value, else the paper's rule alone")
    add_chunk_images_arg(parser)  # the explain stage's work items
    return parser


def add_distance_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--distance", default=None,
                        help="the image distance of the anomaly score: l2 or ssim (weight-free), "
                             "lpips-alex (the paper's), lpips-vgg, lpips-squeeze; default: the "
                             "suite's [evaluate] distance (the demo's: l2; the paper's: lpips-alex)")
    parser.add_argument("--download-weights", action="store_true",
                        help="let an LPIPS distance download torchvision's backbone weights into "
                             "$TORCH_HOME/hub/checkpoints when they are missing; without it nothing "
                             "is downloaded, and a missing file stops the run with the fix")
    parser.add_argument("--weights-dir", default=None,
                        help="folder holding torchvision's ImageNet backbone weights for LPIPS "
                             "(e.g. alexnet-owt-7be5be79.pth); also searched: $TORCH_HOME/hub/checkpoints")
    return parser


def scoring_distance(suite: Suite, args: argparse.Namespace) -> tuple[Any, str, str]:
    """The distance the scores use, built: --distance over the suite's [evaluate] distance.
    Returns (distance, its name, where it was chosen). An LPIPS distance whose backbone weights
    are missing fails here, before any work, with the fix (--download-weights downloads them);
    nothing is downloaded unasked, so a run gives the same tables online and offline."""
    requested = getattr(args, "distance", None)
    name = requested or suite.tables.get("evaluate", {}).get("distance", DEFAULT_SUITE_DISTANCE)
    source = ("--distance" if requested else
              "the suite's [evaluate] distance" if "distance" in suite.tables.get("evaluate", {})
              else "the default: the suite sets no [evaluate] distance")
    try:
        distance = build_distance(name, weights_dir=getattr(args, "weights_dir", None),
                                  download=getattr(args, "download_weights", False))
    except MissingBackboneWeightsError as error:
        where = "--distance" if requested else f"suite file {suite.path}: [evaluate] distance"
        raise MissingBackboneWeightsError(f"{where} = {name!r}: {error}") from error
    return distance, name, source


def prepare(args: argparse.Namespace) -> tuple[Suite, list[str], Any, str, str]:
    """Everything upstream of scoring that is missing: world, training, implant checks,
    image sets, visualizations. Returns (suite, methods, distance, its name, where it was chosen);
    the distance is built first, so missing LPIPS weights fail before any work."""
    suite = load_suite(suite_name(args))
    check_scorable(suite)
    check_null_request(suite, getattr(args, "p_value", None))
    distance, distance_name, source = scoring_distance(suite, args)
    methods = suite_methods(suite, args.method)
    started = time.perf_counter()
    _stage(f"1/3 training {len(suite.models)} models of suite {suite.name!r} (skips trained ones)")
    train_and_check(suite, suite.models, args)
    print(f"training and implant checks: {time.perf_counter() - started:.0f}s")
    _stage(f"2/3 explaining with {', '.join(methods)}")
    started = time.perf_counter()
    counts = explain_suite(suite, args, methods=methods)
    print(f"{counts['computed']} visualization set(s) computed, {counts['stored']} already stored, "
          f"in {time.perf_counter() - started:.0f}s; {explained_images_line(counts)}")
    _stage(f"3/3 scoring with distance {distance_name} ({source})")
    return suite, methods, distance, distance_name, source


def check_scorable(suite: Suite) -> None:
    """Fail before training when the score stage could not use the suite's references."""
    if len(suite.references) < MIN_SCORED_REFERENCES:
        raise SuiteFileError(
            f"suite file {suite.path}: [references] count = {len(suite.references)} is too few to "
            f"score: each reference is scored against the others with it left out, so at least "
            f"{MIN_SCORED_REFERENCES} are needed; set count = {MIN_SCORED_REFERENCES} or more (the "
            "paper: 12, the demo: 5). Nothing was run.")


def check_null_request(suite: Suite, p_value: str | None) -> None:
    """Fail before training when --p-value names no test or the suite has too few held-out
    references to fit it."""
    problems = null_problems(len(suite.held_out), suite.held_out_check, p_value, "--p-value")
    if p_value is not None and problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise SuiteFileError(f"suite file {suite.path} cannot give null p-values; nothing was "
                             f"run:\n{lines}")


def _stage(text: str) -> None:
    print(f"\n== {text}", flush=True)


def describe_distance(distance_name: str) -> str:
    """How a table's caption names its distance (the run said once where it came from)."""
    return f"distance: {distance_name}"
