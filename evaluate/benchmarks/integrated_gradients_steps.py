"""Integrated gradients with fewer steps, measured against 50 (captum's default and the paper's),
on a suite's trained models: how far each step count's attributions are from the 50-step ones,
how well each keeps IG's completeness, and what it costs.

    python evaluate/benchmarks/integrated_gradients_steps.py --suite demo --runs-dir runs
    python evaluate/benchmarks/integrated_gradients_steps.py --steps 8 --steps 16 --model reference-00

Each model explains the same ``--images`` validation images for its own top class, with the
suite's ``[methods.integrated_gradients]`` parameters (baseline, gradient space, quadrature) and
only ``n_steps`` changed. Per step count it prints, averaged over models and images:
- ``rel. L2 to 50``: ||A_n - A_50|| / ||A_50|| of each image's attribution (0: the same map);
- ``top-10% overlap``: the share of the 50-step map's 10% largest-|A| pixels that are also among
  the n-step map's (what a rendered saliency map shows);
- ``completeness gap``: |sum A_n - (f(x) - f(x0))| / |f(x) - f(x0)| for the explained logit (IG's
  axiom; the 50-step gap is the quadrature's own error);
- CPU seconds per image (the process's CPU time: steady on a loaded machine).
The models must be trained (``counteraudit train --suite ...``); nothing is written.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import time

import torch

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.explain.base import build_method
from counteraudit.explain.input_space import baseline_image, on_normalized_input
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.core.command_line import add_common_args, run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.worlds import build_world

METHOD = "integrated_gradients"
REFERENCE_STEPS = 50


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("integrated gradients steps", __doc__, add_help)
    add_common_args(parser)
    parser.add_argument("--steps", type=int, action="append", default=None, metavar="N",
                        help="step counts compared with 50 (repeatable; default 8, 16, 24, 32)")
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="trained model of the suite (repeatable; default: its first three)")
    parser.add_argument("--images", type=int, default=16, help="validation images per model")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    return parser


def explained_logit_change(model, method, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """f(x) - f(x0) for the explained class, in the space the method integrates in."""
    normalized = method.params.gradient_space == "normalized"
    function, inputs = (on_normalized_input(model, images, METHOD) if normalized else (model, images))
    baseline = baseline_image(model, inputs, method.params.baseline, normalized, METHOD)
    with torch.no_grad():
        rows = torch.arange(len(targets))
        return function(inputs)[rows, targets] - function(baseline.expand_as(inputs))[rows, targets]


def top_share(reference: torch.Tensor, other: torch.Tensor, share: float = 0.1) -> torch.Tensor:
    """Per image, the fraction of ``reference``'s top-``share`` pixels (|A| summed over
    channels) that are among ``other``'s."""
    a, b = reference.abs().sum(1).flatten(1), other.abs().sum(1).flatten(1)
    count = max(1, int(share * a.shape[1]))
    top_a, top_b = a.topk(count, 1).indices, b.topk(count, 1).indices
    return torch.tensor([len(set(x.tolist()) & set(y.tolist())) / count
                         for x, y in zip(top_a, top_b)])


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    suite = load_suite(args.suite)
    world = build_world(suite.world, runs_root=args.runs_dir)
    names = args.model or [spec.name for spec in suite.models[:3]]
    specs = [suite.model(name) for name in names]
    table = suite.method_tables.get(METHOD, {})
    counts = sorted(set(args.steps or [8, 16, 24, 32])) + [REFERENCE_STEPS]
    images = next(iter(world.split("val").eval_batches(args.images))).images
    rows = {n: {"l2": [], "top": [], "gap": [], "seconds": 0.0} for n in counts}
    for spec in specs:
        model = load_trained_model(model_dir(args.runs_dir, spec), spec, world)
        with torch.no_grad():
            targets = model(images).argmax(1)
        change = None
        maps = {}
        for n in counts:
            method = build_method(METHOD, {**table, "n_steps": n})
            started = time.process_time()
            maps[n] = method.attribute(model, images, targets).detach()
            rows[n]["seconds"] += time.process_time() - started
            if change is None:
                change = explained_logit_change(model, method, images, targets)
            rows[n]["gap"].append((maps[n].flatten(1).sum(1) - change).abs() / change.abs())
        for n in counts:
            difference = (maps[n] - maps[REFERENCE_STEPS]).flatten(1).norm(dim=1)
            rows[n]["l2"].append(difference / maps[REFERENCE_STEPS].flatten(1).norm(dim=1))
            rows[n]["top"].append(top_share(maps[REFERENCE_STEPS], maps[n]))
    print(f"CPU: {cpu_model()}; suite {suite.name}, models {', '.join(names)}, {args.images} val "
          f"images each, {args.threads} thread(s); [methods.{METHOD}] {table or '(defaults)'}")
    print(f"{'n_steps':>7}  {'rel. L2 to 50':>13}  {'top-10% overlap':>15}  "
          f"{'completeness gap':>16}  {'CPU s/image':>11}")
    for n in counts:
        row = rows[n]
        print(f"{n:>7}  {torch.cat(row['l2']).mean():>13.4f}  {torch.cat(row['top']).mean():>15.3f}  "
              f"{torch.cat(row['gap']).median():>16.4f}  "
              f"{row['seconds'] / (len(specs) * args.images):>11.4f}")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
