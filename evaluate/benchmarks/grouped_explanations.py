"""Explaining k trained models in grouped passes ([explain] model_group; explain/model_groups.py)
against explaining them one after the other, with the explain stage's own code on both sides.

    python evaluate/benchmarks/grouped_explanations.py --suite demo --runs-dir runs
    python evaluate/benchmarks/grouped_explanations.py --k 4 --method guided_backprop --threads 2

For each method (default: every method that can group models, with the suite's
``[methods.<name>]`` parameters and batch sizes) and each k, the suite's first k trained models
explain the same ``--images`` validation images: ``method.run`` on each model (alone), and
``run_models`` with group size k (grouped). The two run interleaved (``--repeats`` rounds after a
warm-up), so a drifting load falls on both. It prints images explained per second, all k models
together (k x images over the median round), the ratio, how many rendered pixel values differ
between the two ways, out of all, and by how many levels at most. The models must be trained
(``counteraudit train --suite ...``); nothing is written.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

import counteraudit.train  # noqa: E402, F401, I001

import argparse
import statistics
import warnings

import numpy as np

from counteraudit.evaluate.benchmarks import benchmark_parser, interleaved_seconds
from counteraudit.explain.base import METHODS
from counteraudit.explain.model_groups import run_models
from counteraudit.explain.settings import method_specs
from counteraudit.explain.stage import QUIET
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.command_line import add_common_args, run_cli
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.threads import torch_threads
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds import build_world


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("grouped explanations", __doc__, add_help)
    add_common_args(parser)
    parser.add_argument("--k", type=int, action="append", default=None,
                        help="models per grouped pass (repeatable; default 1, 2, 4, 8)")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="method that can group models (repeatable; default: all of them)")
    parser.add_argument("--images", type=int, default=32, help="validation images per model")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--device", default="cpu",
                        help="where the models run: cpu, cuda, cuda:1, ... (each result comes "
                             "back to the CPU, so a GPU's timings include its synchronisation)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up")
    return parser


def main(args: argparse.Namespace) -> None:
    suite = load_suite(args.suite)
    counts = sorted(set(args.k or [1, 2, 4, 8]))
    names = args.method or [name for name in METHODS.names() if METHODS.get(name).groups_models]
    specs = method_specs(suite, names)
    if len(suite.models) < max(counts):
        raise SystemExit(f"error: suite {suite.name!r} has {len(suite.models)} models; "
                         f"--k {max(counts)} needs as many")
    world = build_world(suite.world, runs_root=args.runs_dir)
    device = pick_device(args.device)
    models = [load_trained_model(model_dir(args.runs_dir, spec), spec, world, device)
              for spec in suite.models[:max(counts)]]
    images = next(iter(world.split("val").eval_batches(args.images))).images
    print(f"CPU: {cpu_model()}; device {device}; suite {suite.name}, {args.images} val images per model, "
          f"{args.threads} thread(s), median of {args.repeats} interleaved rounds")
    print(f"{'method':<22} {'k':>3} {'alone img/s':>12} {'grouped img/s':>14} {'ratio':>6} "
          f"{'rendered values differing':>21} {'max levels':>10}")
    with torch_threads(args.threads), warnings.catch_warnings():
        for action, message, category in QUIET:  # captum's notices, as the explain stage
            warnings.filterwarnings(action, message=message, category=category)
        for name, spec in specs.items():
            method = spec.build()
            if not method.groups_models:
                raise SystemExit(f"error: method {name!r} cannot group models")
            for k in counts:
                group = models[:k]
                results = {}

                def alone(group=group):
                    results["alone"] = [method.run(model, images, spec.batch_size)
                                        for model in group]

                def grouped(group=group, k=k):
                    results["grouped"] = run_models(method, group, images, k, spec.batch_size)
                seconds = interleaved_seconds({"alone": alone, "grouped": grouped}, args.repeats)
                rate = {way: k * args.images / statistics.median(times)
                        for way, times in seconds.items()}
                levels = [np.abs(a.images.astype(int) - b.images.astype(int))
                          for a, b in zip(results["alone"], results["grouped"])]
                differing = sum(int((level > 0).sum()) for level in levels)
                total = sum(level.size for level in levels)
                print(f"{name:<22} {k:>3} {rate['alone']:>12.1f} {rate['grouped']:>14.1f} "
                      f"{rate['grouped'] / rate['alone']:>6.2f} {differing:>8} of {total:<9} "
                      f"{max(int(level.max()) for level in levels):>9}")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
