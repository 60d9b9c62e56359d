"""Time anomaly scoring with cached features against one LPIPS call per pair (the original code's way).

    python evaluate/benchmarks/scoring.py                        # 64-px renders
    python evaluate/benchmarks/scoring.py --size 64 --size 224   # and the paper's 224 px

Setup: n references + k anomalous models, m rendered images each (random uint8 renders), LPIPS with
a randomly initialised backbone (timings do not depend on the weights' values; no download needed).
Work timed on both sides: every reference scored leave-one-out and every anomalous model scored.
- cached: ``features`` once per render (batched), then ``anomaly_scores`` from the cache;
- per pair: ``lpips.LPIPS()(a, b)`` once per distinct pair of renders of an image (reference pairs
  and anomalous-to-reference pairs: C(n,2) + k n calls per image), two backbone passes per call.
Building the networks is excluded on both sides. Both sides' scores are compared, so the speed-up
is for the same numbers. ``--baseline-calls`` times only that many per-pair calls and extrapolates.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import time
import warnings
from itertools import combinations

import lpips
import numpy as np
import pandas as pd
import torch

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.scoring.distances import DISTANCES, build_distance
from counteraudit.evaluate.scoring.distances.base import DISTANCE_THREADS
from counteraudit.evaluate.scoring.distances.lpips_features import LPIPSDistance
from counteraudit.evaluate.scoring.scores import anomaly_scores
from counteraudit.train.core.artifacts import atomic_write_json
from counteraudit.train.core.command_line import run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("scoring", __doc__, add_help)
    parser.add_argument("--size", type=int, action="append",
                        help="render side in pixels (repeatable); leave unset for 64, the demo's "
                             "renders; 224 is the paper's")
    parser.add_argument("--references", type=int, default=12,
                        help="reference models (12: the paper's count; the per-pair calls grow "
                             "with its square)")
    parser.add_argument("--anomalous", type=int, default=1,
                        help="anomalous models scored (1 is enough: each adds n per-pair calls "
                             "an image)")
    parser.add_argument("--images", type=int, default=50,
                        help="renders per model (50: the paper's detection images)")
    parser.add_argument("--net", default="alex", choices=lpips_nets(),
                        help="LPIPS backbone (alex: the distance the paper scores with)")
    parser.add_argument("--baseline-calls", type=int, default=None,
                        help="time only this many per-pair LPIPS calls and extrapolate; leave "
                             "unset to time them all and compare the two sides' scores")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random renders and backbones (any: the timings do not "
                             "depend on it)")
    parser.add_argument("--json", default=None,
                        help="also write the results to this JSON file (for a record across "
                             "machines)")
    return parser


def random_renders(names: list[str], n_images: int, size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (n_images, size, size, 3)).astype(np.float32)
    # every model's renders are noisy copies of shared ones, like visualisations of one image
    return {name: np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8) for name in names}


def time_cached(renders, references, net: str, seed: int):
    distance = build_distance(f"lpips-{net}", random_backbone=True, seed=seed)
    start, start_cpu = time.perf_counter(), time.process_time()
    features = {name: distance.features(images) for name, images in renders.items()}
    after_features = time.perf_counter()
    scores = anomaly_scores(features, references, distance)
    end, end_cpu = time.perf_counter(), time.process_time()
    feature_bytes = sum(f.nbytes for f in features.values())
    return scores, end - start, end_cpu - start_cpu, after_features - start, feature_bytes


def time_per_pair(renders, references, anomalous, net: str, seed: int, call_limit: int | None):
    torch.manual_seed(seed)
    metric = lpips.LPIPS(pretrained=True, pnet_rand=True, net=net, verbose=False)
    as_tensor = {name: torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0
                 for name, images in renders.items()}
    n_images = len(next(iter(renders.values())))
    pairs = [(references[i], references[j]) for i, j in combinations(range(len(references)), 2)]
    pairs += [(model, reference) for model in anomalous for reference in references]
    calls = [(image, a, b) for image in range(n_images) for a, b in pairs]
    timed = calls if call_limit is None else calls[:call_limit]
    distances: dict[tuple, float] = {}
    start, start_cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for image, a, b in timed:
            value = metric(as_tensor[a][image:image + 1], as_tensor[b][image:image + 1])
            distances[(image, a, b)] = distances[(image, b, a)] = float(value)
    elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    factor = len(calls) / len(timed)
    return distances, elapsed * factor, elapsed_cpu * factor, len(calls), len(timed) < len(calls)


def scores_from_pair_distances(distances, references, anomalous, n_images) -> pd.DataFrame:
    rows = []
    for image in range(n_images):
        for model in [*references, *anomalous]:
            others = [r for r in references if r != model]
            numerator = np.mean([distances[(image, model, r)] for r in others])
            spread = np.mean([distances[(image, a, b)] for a, b in combinations(others, 2)])
            rows.append({"model": model, "image": image, "score": numerator / spread})
    return pd.DataFrame(rows)


def run(size: int, n_references: int, n_anomalous: int, n_images: int, net: str, seed: int,
        call_limit: int | None) -> dict:
    references = [f"reference_{k}" for k in range(n_references)]
    anomalous = [f"anomalous_{k}" for k in range(n_anomalous)]
    renders = random_renders([*references, *anomalous], n_images, size, seed)
    scores, cached_s, cached_cpu_s, feature_s, feature_bytes = time_cached(renders, references, net, seed)
    distances, per_pair_s, per_pair_cpu_s, n_calls, extrapolated = time_per_pair(
        renders, references, anomalous, net, seed, call_limit)
    # CPU seconds (one thread) are the fairer comparison on a shared machine, where wall time
    # also counts other processes' load, which can change between the two runs
    result = {"size": size, "net": net, "references": n_references, "anomalous": n_anomalous,
              "images": n_images, "cached_wall_s": cached_s, "cached_cpu_s": cached_cpu_s,
              "cached_features_wall_s": feature_s, "feature_MiB": feature_bytes / 2**20,
              "per_pair_calls": n_calls, "per_pair_wall_s": per_pair_s, "per_pair_cpu_s": per_pair_cpu_s,
              "per_pair_extrapolated": extrapolated, "speedup_wall": per_pair_s / cached_s,
              "speedup_cpu": per_pair_cpu_s / cached_cpu_s}
    if not extrapolated:
        baseline = scores_from_pair_distances(distances, references, anomalous, n_images)
        merged = scores.merge(baseline, on=["model", "image"], suffixes=("", "_per_pair"))
        result["max_abs_score_difference"] = float((merged["score"] - merged["score_per_pair"]).abs().max())
    return result


def lpips_nets() -> list[str]:
    """The backbones of the registered LPIPS distances (``lpips-<net>``)."""
    return [DISTANCES.get(name).torchvision_backbone.lpips_net for name in DISTANCES
            if issubclass(DISTANCES.get(name), LPIPSDistance)]


def main(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(DISTANCE_THREADS)  # both sides on the threads every distance runs on
    warnings.filterwarnings("ignore", category=UserWarning, module="torchvision")
    results = [run(size, args.references, args.anomalous, args.images, args.net, args.seed,
                   args.baseline_calls) for size in (args.size or [64])]
    print(f"torch {torch.__version__}, {DISTANCE_THREADS} CPU thread(s), LPIPS-{args.net} with a "
          "random backbone")
    print(to_markdown(pd.DataFrame(results), float_format="{:.3g}"))
    if args.json:
        atomic_write_json(args.json, results, chosen_by_user=True)
    return results


if __name__ == "__main__":
    run_cli(main, get_args_parser())
