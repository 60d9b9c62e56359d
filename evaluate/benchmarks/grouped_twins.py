"""Models of a suite trained alone and with the grouped engine (train/group_trainer.py), side by
side: each grouped model's validation accuracy and implant figure against its solo twin's, and
against the seed-to-seed spread of the suite's references trained alone; and each engine's
training images per second per model.

    python evaluate/benchmarks/grouped_twins.py --suite quick --runs-dir /tmp/twins \\
        --model reference-00 --model backdoor --references 3

Everything is trained into ``--runs-dir``, which should be a scratch runs folder: the solo models
are the suite's own (its recipe with engine = "alone"; a runs folder that holds them already is
read, not trained again), their twins the same specs with engine = "grouped" and
``--group-size`` (default: the recipe's), trained in groups as the training stage makes them. The
references (the first ``--references`` of the suite, default all) are trained alone: their spread
is what "within the seed-to-seed spread" means. It trains 2 x the models named plus the references:
on the demo, hours of CPU; name a few models, or use a small suite.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import statistics
from dataclasses import replace

import torch

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.command_line import add_common_args, run_cli, suite_name
from counteraudit.train.core.model_spec import ModelSpec
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.core.registries import FAMILIES
from counteraudit.train.core.suite import load_suite
from counteraudit.train.stage import training_items
from counteraudit.train.engines import train_models_together
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.worlds import World, build_world


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("grouped twins", __doc__, add_help)
    add_common_args(parser)
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="a model of the suite to train alone and grouped (repeatable; "
                             "default: every model the grouped engine takes)")
    parser.add_argument("--references", type=int, default=None, metavar="N",
                        help="the suite's first N references make the spread (default: all)")
    parser.add_argument("--group-size", type=int, default=None, metavar="K",
                        help="models per grouped network (default: the suite's recipe's)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    return parser


def alone(spec: ModelSpec) -> ModelSpec:
    return replace(spec, recipe=replace(spec.recipe, engine="alone"))


def grouped(spec: ModelSpec, size: int | None) -> ModelSpec:
    return replace(spec, recipe=replace(spec.recipe, engine="grouped",
                                        group_size=size or spec.recipe.group_size))


def train(specs: list[ModelSpec], world: World, runs_dir, progress: bool) -> dict[str, dict]:
    """Each spec's metrics, trained as the training stage's work items group them."""
    metrics = {}
    for item in training_items(specs):
        results = train_models_together(list(item), [model_dir(runs_dir, spec) for spec in item],
                                        world=world, progress=progress, runs_root=runs_dir)
        metrics.update({spec.name: result for spec, result in zip(item, results)})
    return metrics


def implant_figure(spec: ModelSpec, measured: ModelSpec, world: World, runs_dir) -> float | None:
    """``spec``'s family's headline figure, measured on ``measured`` (None: a reference, or a
    family without one)."""
    if spec.is_reference:
        return None
    family = FAMILIES.get(spec.family)(spec.params, world, spec.seed)
    if family.headline_figure is None:
        return None
    model = load_trained_model(model_dir(runs_dir, measured), measured, world)
    return float(family.measure(model)[family.headline_figure])


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    return (f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f} "
            f"[{min(values):.3f}, {max(values):.3f}]")


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    suite = load_suite(suite_name(args))
    world = build_world(suite.world, runs_root=args.runs_dir)
    references = [alone(spec) for spec in suite.references[:args.references]]
    names = args.model or [spec.name for spec in suite.models if spec.checkpoint is None]
    solo = [alone(suite.model(name)) for name in names]
    twins = [grouped(spec, args.group_size) for spec in solo]
    progress = not args.no_progress
    solo_metrics = train([*references, *[s for s in solo if s.key not in
                                         {r.key for r in references}]], world, args.runs_dir, progress)
    twin_metrics = train(twins, world, args.runs_dir, progress)
    accuracy = [solo_metrics[spec.name]["val_accuracy"] for spec in references]
    print(f"CPU: {cpu_model()}; suite {suite.name}, {args.threads} thread(s); grouped: group_size "
          f"{twins[0].recipe.group_size}; references alone ({len(references)}): val accuracy "
          f"{_spread(accuracy)}")
    print("| model | val acc alone | grouped | difference | implant figure alone | grouped | "
          "references' figure | img/s per model alone | grouped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec, twin in zip(solo, twins):
        own, other = solo_metrics[spec.name], twin_metrics[twin.name]
        figures = [implant_figure(spec, measured, world, args.runs_dir) for measured in (spec, twin)]
        reference_figures = ([] if figures[0] is None else
                             [implant_figure(spec, ref, world, args.runs_dir) for ref in references])
        figure_text = (" | ".join(f"{value:.3f}" for value in figures) + f" | {_spread(reference_figures)}"
                       if figures[0] is not None else "- | - | -")
        print(f"| {spec.name} | {own['val_accuracy']:.3f} | {other['val_accuracy']:.3f} | "
              f"{other['val_accuracy'] - own['val_accuracy']:+.3f} | {figure_text} | "
              f"{own['images_per_second']:.0f} | {other['images_per_second']:.0f} |")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
