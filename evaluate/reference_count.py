"""Power: what the number of references, and of images, does to detection and localization,
measured on a finished run.

    python evaluate/reference_count.py                       # demo, after evaluate/localize.py
    python evaluate/reference_count.py --suite demo-full     # the paper's 12 references

A(f, E, x) divides by the references' mean pairwise distance on each image. With few references
that spread is a noisy estimate, and a noisy denominator pulls AUROCs towards 0.5. This script
recomputes every Table 2 AUROC with n of the suite's references, n = 2 .. all, averaged over
``--subsets`` random subsets of n references (seeded), on the same stored visualizations and
images, so the reference count is the only thing that changes. It reads stored visualizations and
computes each render pair's distance once; nothing is trained or explained.

Then power (evaluate/studies/power.py): detection against n (Table 1's rule with n random references, the
references scored leave-one-out among them), detection against m (random m of the detection
images) and localization against n and p (random p abnormal and p normal images), each as the
share of ``--subsets`` random subsets in which the method succeeds (detects; reaches AUROC
``--auroc-target``). It ends with the answer to "how many references and images does a method
need to see this defect?": the smallest n, m and p at which that share is at least ``--level`` at
that size and at every larger one.
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

from counteraudit.evaluate.pipeline_options import add_distance_args
from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args, run_cli

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit reference count", add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    add_common_args(parser)  # --suite, --runs-dir: a suite whose visualizations are stored
    add_distance_args(parser)
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only this method (repeatable; default: the suite's methods; per-layer "
                             "methods such as Caricatures are skipped)")
    parser.add_argument("--subsets", type=int, default=20,
                        help="random reference subsets averaged per n (20 keeps the mean's noise "
                             "well below the effect)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subset draws")
    parser.add_argument("--level", type=float, default=0.8,
                        help="power: a method 'sees' a defect at a size when it succeeds in at "
                             "least this share of the random subsets of that size (0.8, the usual "
                             "power)")
    parser.add_argument("--auroc-target", type=float, default=0.8,
                        help="power: a localization succeeds at this AUROC or above (0.8: clearly "
                             "above the chance band of ~25 + 25 images)")
    return parser


def distance_matrix(results: dict, names: list[str], distance) -> np.ndarray:
    """(N, k, k) distances between the renders of ``names`` (stored Explanations) on each image."""
    from counteraudit.evaluate.scoring.scores import reference_distance_matrix

    features = {name: distance.features(results[name].images) for name in names}
    return reference_distance_matrix(features, names, distance)


def aurocs_by_reference_count(matrix: np.ndarray, abnormal: np.ndarray, subsets: int,
                              rng: np.random.Generator) -> dict[int, np.ndarray]:
    """n -> the AUROC of each random n-subset of the references.

    ``matrix``: (N, n_all + 1, n_all + 1) distances on each image between the n_all references'
    renders and, last, the anomalous model's; ``abnormal``: bool per image. Scores are
    ``anomaly_scores``' (numerator / spread, flagged where the spread vanishes), and flagged images
    drop out as they do from Table 2."""
    from counteraudit.evaluate.scoring.localization import auroc
    from counteraudit.evaluate.scoring.scores import ZERO_SPREAD_TOLERANCE, mean_pair_distance, score_frame
    import numpy as np

    n_all = matrix.shape[1] - 1
    out = {}
    for n in range(2, n_all + 1):
        values = []
        draws = [np.arange(n_all)] if n == n_all else [rng.choice(n_all, n, replace=False)
                                                       for _ in range(subsets)]
        for chosen in draws:
            keep = np.zeros(n_all + 1, dtype=bool)
            keep[chosen] = True
            score = score_frame("", list(range(len(matrix))), matrix[:, n_all, keep].mean(axis=1),
                                mean_pair_distance(matrix, keep), n, False,
                                ZERO_SPREAD_TOLERANCE)["score"].to_numpy()
            usable = np.isfinite(score)
            values.append(auroc(score[usable & abnormal], score[usable & ~abnormal]))
        out[n] = np.asarray(values)
    return out


def main(args: argparse.Namespace) -> dict[str, pd.DataFrame]:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.anomalies.image_sets import DETECTION, abnormal_set_name, localizable, normal_images
    from counteraudit.evaluate.pipeline import scoring_distance, scoring_suite
    from counteraudit.evaluate.reporting.power import PowerSettings, power_tables, print_power
    from counteraudit.evaluate.reporting.tables import to_markdown, write_tables
    from counteraudit.evaluate.scoring.stage import tables_dir
    from counteraudit.evaluate.studies.power import detection_by_reference_count
    from counteraudit.explain.settings import method_specs
    from counteraudit.explain.stage import load_image_sets, load_results
    from counteraudit.train.core.stage import run_options
    from counteraudit.train.worlds import build_world
    import numpy as np
    import pandas as pd

    if not 0 < args.level <= 1 or not 0 < args.auroc_target <= 1 or args.subsets < 1:
        raise ValueError(f"--level {args.level} and --auroc-target {args.auroc_target} must be in "
                         f"(0, 1] (0.8 each recommended), --subsets {args.subsets} >= 1")
    suite = scoring_suite(args.suite, distance=args.distance)
    methods = list(method_specs(suite, args.method))
    runs_root = args.runs_dir
    distance, source = scoring_distance(suite, run_options(args), requested=args.distance is not None)
    distance_name = distance.name
    print(f"distance: {distance_name} ({source})")
    world = build_world(suite.world, runs_root=runs_root)
    image_sets = load_image_sets(suite, runs_root, world)
    references = [s.name for s in suite.references]
    anomalous = [s.name for s in suite.anomalies]
    specs = localizable(suite)
    normal = {spec.name: normal_images(suite, spec, world, image_sets) for spec in specs}
    rng = np.random.default_rng(args.seed)
    rows, located, detected = [], [], []
    for method in methods:
        # The detection set's renders serve as every model's normal images: load them, and
        # compute their distances, once per method.
        names = [*references, *anomalous]
        detection = load_results(suite, method, names, DETECTION, runs_root)
        if detection[references[0]].layers is not None:
            continue  # one render per layer: Table 2's per-layer rows, not scored here
        on_detection = distance_matrix(detection, names, distance)
        for spec in specs:
            keep = [*range(len(references)), names.index(spec.name)]
            triggered = load_results(suite, method, [*references, spec.name],
                                     abnormal_set_name(spec), runs_root)
            on_abnormal = distance_matrix(triggered, [*references, spec.name], distance)
            normal_set, positions = normal[spec.name]
            if normal_set == DETECTION:
                on_normal = on_detection[positions][:, keep][:, :, keep]
            else:  # its own normal folder ([image_sets] <model>-normal)
                on_normal = distance_matrix(load_results(suite, method, [*references, spec.name], normal_set,
                                                         runs_root), [*references, spec.name], distance)[positions]
            abnormal = np.r_[np.ones(len(on_abnormal), bool), np.zeros(len(on_normal), bool)]
            by_n = aurocs_by_reference_count(np.concatenate([on_abnormal, on_normal]), abnormal,
                                             args.subsets, rng)
            rows.append({"model": spec.name, "method": method,
                         **{f"n={n}": float(np.mean(v)) for n, v in by_n.items()}})
            located += [{"method": method, "model": spec.name, "n": n,
                         "fraction_reaching": float((v >= args.auroc_target).mean())}
                        for n, v in by_n.items()]
        if len(references) >= 3:
            detected.append(detection_by_reference_count(
                on_detection, len(references), anomalous, args.subsets, rng).assign(method=method))
    order = {spec.name: k for k, spec in enumerate(specs)}  # one block of methods per model
    table = (pd.DataFrame(rows).sort_values("model", key=lambda c: c.map(order), kind="stable")
             .reset_index(drop=True))
    print(f"\nLocalization AUROC with n of the {len(references)} references (distance: "
          f"{distance_name}; mean over {args.subsets} random subsets "
          "per n; all n: the suite's own Table 2 value)\n")
    print(to_markdown(table, float_format="{:.2f}"))
    settings = PowerSettings(subsets=args.subsets, level=args.level, auroc_target=args.auroc_target)
    tables = power_tables(suite, methods, distance, settings, runs_root,
                          detection_by_n=pd.concat(detected, ignore_index=True) if detected else None,
                          localization_by_n=pd.DataFrame(located) if located else None, rng=rng)
    print_power(tables, suite, settings)
    tables = {"localization-by-n": table, **tables}
    # runs/<suite>/tables/power-*: the report's power section reads them
    write_tables(suite, {f"power-{name}-{distance_name}": frame for name, frame in tables.items()},
                 runs_root, only_methods=args.method)
    print(f"\ntables: {tables_dir(suite, runs_root, args.method)}/power-*")
    return tables


if __name__ == "__main__":
    run_cli(main, get_args_parser())
