"""What the number of references does to localization, measured on a finished run.

    python evaluate/reference_count.py                       # demo, after evaluate/localize.py
    python evaluate/reference_count.py --suite demo-full     # the paper's 12 references

A(f, E, x) divides by the references' mean pairwise distance on each image. With few references
that spread is a noisy estimate, and a noisy denominator pulls AUROCs towards 0.5. This script
recomputes every Table 2 AUROC with n of the suite's references, n = 2 .. all, averaged over
``--subsets`` random subsets of n references (seeded), on the same stored visualizations and
images, so the reference count is the only thing that changes. It reads stored visualizations and
computes each render pair's distance once; nothing is trained or explained.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # the packages, not this folder

import argparse

import numpy as np
import pandas as pd

from train.stage import run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit reference count", add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--suite", default="demo",
                        help="a suite whose visualizations are stored (run evaluate/localize.py "
                             "first); demo-full has the paper's 12 references")
    parser.add_argument("--runs-dir", default=None, help="root of all artifacts (default: "
                        "$COUNTERAUDIT_RUNS or ./runs)")
    parser.add_argument("--distance", default="l2",
                        help="distance between renders (weight-free l2 works offline; lpips-alex is "
                             "the paper's when its weights are installed)")
    parser.add_argument("--weights-dir", default=None, help="LPIPS backbone weights folder")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only this method (repeatable; default: the suite's methods; per-layer "
                             "methods such as Caricatures are skipped)")
    parser.add_argument("--subsets", type=int, default=20,
                        help="random reference subsets averaged per n (20 keeps the mean's noise "
                             "well below the effect)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subset draws")
    return parser


def auroc_by_reference_count(renders: dict[str, np.ndarray], references: list[str], model: str,
                             abnormal: np.ndarray, distance, subsets: int,
                             rng: np.random.Generator) -> dict[int, float]:
    """n -> mean AUROC over random n-subsets of ``references``; ``abnormal``: bool per image."""
    from evaluate.localization import auroc
    from evaluate.scores import mean_pair_distance, reference_distance_matrix
    names = [*references, model]
    features = {name: distance.features(renders[name]) for name in names}
    matrix = reference_distance_matrix(features, names, distance)  # every pair once
    n_all = len(references)
    out = {}
    for n in range(2, n_all + 1):
        values = []
        draws = [np.arange(n_all)] if n == n_all else [rng.choice(n_all, n, replace=False)
                                                       for _ in range(subsets)]
        for chosen in draws:
            keep = np.zeros(n_all + 1, dtype=bool)
            keep[chosen] = True
            numerator = matrix[:, n_all, keep].mean(axis=1)
            spread = mean_pair_distance(matrix, keep)
            valid = np.isfinite(numerator) & (spread > 0)  # as Table 2: flagged images drop out
            score = numerator[valid] / spread[valid]
            values.append(auroc(score[abnormal[valid]], score[~abnormal[valid]]))
        out[n] = float(np.mean(values))
    return out


def main(args: argparse.Namespace) -> pd.DataFrame:
    from anomalies.image_sets import DETECTION, abnormal_set_name, localizable, normal_positions
    from evaluate.distances import build_distance
    from evaluate.tables import to_markdown
    from explain.pipeline import load_image_sets, load_results, suite_methods
    from train.suite import load_suite
    from train.worlds import build_world

    suite = load_suite(args.suite)
    methods = suite_methods(suite, args.method)
    distance = build_distance(args.distance, weights_dir=args.weights_dir)
    world = build_world(suite.world, runs_root=args.runs_dir)
    image_sets = load_image_sets(suite, args.runs_dir, world)
    references = [s.name for s in suite.references]
    rng = np.random.default_rng(args.seed)
    rows = []
    for spec in localizable(suite):
        normal = normal_positions(suite, spec, world, image_sets[DETECTION])
        for method in methods:
            names = [*references, spec.name]
            detection = load_results(suite, method, names, DETECTION, args.runs_dir)
            triggered = load_results(suite, method, names, abnormal_set_name(spec), args.runs_dir)
            if triggered[spec.name].layers is not None:
                continue  # one render per layer: Table 2's per-layer rows, not scored here
            renders = {m: np.concatenate([triggered[m].images, detection[m].images[normal]])
                       for m in names}
            abnormal = np.r_[np.ones(len(triggered[spec.name].images), bool),
                             np.zeros(len(normal), bool)]
            by_n = auroc_by_reference_count(renders, references, spec.name, abnormal, distance,
                                            args.subsets, rng)
            rows.append({"model": spec.name, "method": method, **{f"n={n}": v for n, v in by_n.items()}})
    table = pd.DataFrame(rows)
    print(f"\nLocalization AUROC with n of the {len(references)} references ({args.distance}; mean "
          f"over {args.subsets} random subsets per n; all n: the suite's own Table 2 value)\n")
    print(to_markdown(table, float_format="{:.2f}"))
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
