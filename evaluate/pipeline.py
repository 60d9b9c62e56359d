"""From stored visualizations to score tables, and the end-to-end run the main job makes.

Scores are one tidy table per (distance, method, image set):
``runs/<suite>/scores/<distance>/<method>/<image set>.csv`` with columns distance, method, layer,
image_set, model, image, score, numerator, spread, n_references, is_reference, flag. Beside it a
``.json`` holds the keys of the visualizations it came from; a table is recomputed only when one
of them changed. Each visualization goes through the distance's backbone once; every distance
between two visualizations is computed from those cached features.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pandas as pd

from anomalies.image_sets import DETECTION, abnormal_set_name, localizable, normal_positions
from evaluate.distances import build_distance, resolve_distance_name
from evaluate.scores import anomaly_scores
from explain.pipeline import load_results, result_dir, suite_methods
from explain.store import stored_key
from train.artifacts import atomic_write_json, atomic_write_text, read_json, stable_hash
from train.suite import Suite

SCORES = "scores"
TABLES = "tables"
NO_LAYER = ""


def score_set(suite: Suite, distance, distance_name: str, method: str, image_set: str,
              models: list[str], runs_root=None) -> pd.DataFrame:
    """Anomaly scores of ``models`` (references are scored leave-one-out) on one image set."""
    root = suite.root(runs_root)
    references = [s.name for s in suite.references]
    needed = list(dict.fromkeys([*references, *models]))
    keys = {m: stored_key(result_dir(root, method, m, image_set)) for m in needed}
    missing = [m for m, k in keys.items() if k is None]
    if missing:
        raise FileNotFoundError(f"no {method} visualizations of {missing} on {image_set}; run "
                                f"python explain/run.py --suite {suite.name} --method {method}")
    table_path = root / SCORES / distance_name / method / f"{image_set}.csv"
    key = {"distance": distance_name, "models": models, "references": references,
           "visualizations": stable_hash(keys)}
    key_path = table_path.with_suffix(".json")
    if table_path.is_file() and key_path.is_file() and read_json(key_path) == key:
        return pd.read_csv(table_path, keep_default_na=False, na_values=[""]).astype({"layer": str})
    results = load_results(suite, method, needed, image_set, runs_root)
    first = results[references[0]]
    layers = list(first.layers) if first.layers is not None else [NO_LAYER]
    frames = []
    for position, layer in enumerate(layers):
        images = {m: (r.images[position] if r.layers is not None else r.images) for m, r in results.items()}
        features = {m: distance.features(images[m]) for m in needed}  # one backbone pass each
        frames.append(anomaly_scores(features, references, distance, models=needed,
                                     labels={"distance": distance_name, "method": method,
                                             "layer": layer, "image_set": image_set}))
    table = pd.concat(frames, ignore_index=True)
    table = table[table["model"].isin(models)].reset_index(drop=True)
    atomic_write_text(table_path, table.to_csv(index=False))
    atomic_write_json(key_path, key)  # after the table: a key always describes a finished table
    return table


def detection_scores(suite: Suite, distance, distance_name: str, methods: list[str],
                     runs_root=None) -> pd.DataFrame:
    models = [s.name for s in suite.models]
    return pd.concat([score_set(suite, distance, distance_name, method, DETECTION, models, runs_root)
                      for method in methods], ignore_index=True)


def localization_scores(suite: Suite, distance, distance_name: str, methods: list[str],
                        runs_root=None) -> pd.DataFrame:
    """For each localizable anomaly: its scores on its abnormal set (abnormal = True) and on the
    detection images that count as normal for it (abnormal = False)."""
    from train.worlds import build_world
    from explain.pipeline import load_image_sets
    world = build_world(suite.world, runs_root=runs_root)
    image_sets = load_image_sets(suite, runs_root, world)
    frames = []
    for method in methods:
        detection = score_set(suite, distance, distance_name, method, DETECTION,
                              [s.name for s in suite.models], runs_root)
        for spec in localizable(suite):
            normal = normal_positions(suite, spec, world, image_sets[DETECTION])
            rows = detection[(detection["model"] == spec.name) & detection["image"].isin(normal)]
            abnormal = score_set(suite, distance, distance_name, method, abnormal_set_name(spec),
                                 [spec.name], runs_root)
            frames += [rows.assign(abnormal=False), abnormal.assign(abnormal=True)]
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------- the end-to-end run
def pipeline_parser(prog: str, add_help: bool = True) -> argparse.ArgumentParser:
    """The options detect.py and localize.py share: suite, upstream stages, executor."""
    from slurm.executor import add_executor_args
    from train.stage import add_common_args
    parser = argparse.ArgumentParser(prog, add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_args(parser)
    add_pipeline_args(parser)
    add_executor_args(parser)
    return parser


def add_pipeline_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--quick", action="store_true",
                        help="run the small 'quick' suite instead (a smoke test in a few minutes)")
    parser.add_argument("--distance", default=None,
                        help="lpips-alex (the paper's; default when its backbone weights are "
                             "available), lpips-vgg, lpips-squeeze, ssim (weight-free; the default "
                             "offline, said in every table)")
    parser.add_argument("--weights-dir", default=None,
                        help="folder holding torchvision's ImageNet backbone weights for LPIPS "
                             "(e.g. alexnet-owt-7be5be79.pth); also searched: $TORCH_HOME/hub/checkpoints")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only this explanation method (repeatable)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    return parser


def prepare(args: argparse.Namespace) -> tuple[Suite, list[str], Any, str, str | None]:
    """Everything upstream of scoring that is missing: world, training, implant checks,
    image sets, visualizations. Returns (suite, methods, distance, its name, fallback note);
    the distance is built first, so missing LPIPS weights fail before any work."""
    from explain.pipeline import explain_suite
    from train.stage import train_models
    from train.suite import load_suite
    from train.train import check_implants, print_summary
    if args.quick and args.suite not in ("demo", "quick"):
        raise ValueError(f"--quick runs the 'quick' suite; drop --suite {args.suite} or --quick")
    suite = load_suite("quick" if args.quick else args.suite)
    distance_name, note = resolve_distance_name(args.distance, weights_dir=args.weights_dir)
    distance = build_distance(distance_name, weights_dir=args.weights_dir)
    methods = suite_methods(suite, args.method)
    started = time.perf_counter()
    _stage(f"1/3 training {len(suite.models)} models of suite {suite.name!r} (skips trained ones)")
    metrics = train_models(suite, suite.models, args)
    print_summary(suite.name, metrics, time.perf_counter() - started)
    check_implants(suite, suite.models, args)
    _stage(f"2/3 explaining with {', '.join(methods)}")
    counts = explain_suite(suite, args, methods=methods)
    print(f"{counts['computed']} visualization set(s) computed, {counts['stored']} already stored")
    _stage(f"3/3 scoring with {distance_name}" + (f" ({note})" if note else ""))
    return suite, methods, distance, distance_name, note


def _stage(text: str) -> None:
    print(f"\n== {text}", flush=True)


def write_tables(suite: Suite, tables: dict[str, pd.DataFrame], runs_root=None) -> list[Path]:
    from evaluate.tables import write_table
    written = []
    for name, frame in tables.items():
        written += write_table(frame, suite.root(runs_root) / TABLES / name)
    return written


def describe_distance(distance_name: str, note: str | None) -> str:
    return f"distance: {distance_name}" + (f" -- {note}" if note else "")
