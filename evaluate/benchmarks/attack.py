"""The PGD attack in bf16 autocast against fp32, on this CPU: does it lower accuracy as much, and
how much faster is an adversarial training step?

The trainer runs the attack of adversarial training under the training's autocast (bf16 on CUDA,
and on a CPU where the recipe sets cpu_bf16), so the attack costs what the training step costs.
This script checks that the cheaper attack is as strong, on trained models of a suite:

    python evaluate/benchmarks/attack.py --suite demo --model adversarial-linf-8 --model reference-00

For each model it attacks the same val images with the adversarial family's eps and step count
(the training attack's steps and the verification attack's), once in fp32 and once under bf16
autocast, and prints the accuracy under each. Then it times one adversarial training step (PGD
under autocast, forward, backward, SGD step; the trainer's) in fp32 and in bf16, interleaved so a
load on a shared machine falls on both, and prints the ratio. Nothing is written.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import contextlib
import statistics

import torch
from torch import nn

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.common import accuracy, verification_indices
from counteraudit.anomalies.families.adversarial import pgd
from counteraudit.evaluate.benchmarks import benchmark_parser, interleaved_seconds
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.command_line import add_common_args, run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.training_parts import new_model
from counteraudit.train.worlds import build_world


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("attack precision", __doc__, add_help)
    add_common_args(parser)
    parser.add_argument("--model", action="append", required=True, metavar="NAME",
                        help="trained model of the suite to attack (repeatable; required): name "
                             "the adversarial model and a reference, whose drops differ")
    parser.add_argument("--attack", default=None, metavar="NAME",
                        help="adversarial model whose eps and steps to use; leave unset for the "
                             "first adversarial model among --model, else the suite's first")
    parser.add_argument("--images", type=int, default=500,
                        help="val images attacked per model (500: +-2 points of accuracy)")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed adversarial training steps per precision, interleaved "
                             "(7: the median is steady on a shared 2-core machine)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch of the timed step; leave unset for the attack model's "
                             "recipe's, the batch its training runs")
    return parser


def attack(model: nn.Module, family, images: torch.Tensor, labels: torch.Tensor, steps: int,
           bf16: bool, batch: int = 100) -> torch.Tensor:
    """``images`` attacked by the family's PGD with ``steps`` steps (model in eval mode), the
    attack run in fp32 or under bf16 autocast; the random start is the same in both."""
    p = family.params
    generator = torch.Generator().manual_seed(0)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    attacked = []
    model.eval()
    for start in range(0, len(images), batch):
        with autocast:
            attacked.append(pgd(model, images[start:start + batch], labels[start:start + batch],
                                p.norm, p.eps, steps, family.step_size(steps), generator))
    return torch.cat(attacked)


def time_training_steps(spec, world, family, batch_size: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of one adversarial training step (the trainer's: the family's PGD under the
    autocast, then forward, loss, backward and SGD step), fp32 and bf16, interleaved."""
    batch = next(world.split("train").train_batches(batch_size, seed=0, epoch=0))
    steps = {}
    for name, autocast in (("fp32", contextlib.nullcontext),
                           ("bf16", lambda: torch.autocast("cpu", dtype=torch.bfloat16))):
        model = new_model(spec, world).to(memory_format=torch.channels_last).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

        def step(model=model, optimizer=optimizer, autocast=autocast):
            generator = torch.Generator().manual_seed(1)
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                images, labels = family.training_inputs(model, batch.images, batch.labels,
                                                        generator)
            images = images.contiguous(memory_format=torch.channels_last)
            with autocast():
                loss = nn.functional.cross_entropy(model(images).float(), labels)
            loss.backward()
            optimizer.step()
        steps[name] = step
    return interleaved_seconds(steps, repeats)


def main(args: argparse.Namespace) -> dict:
    if args.images < 10 or args.repeats < 1:
        raise ValueError(f"--images {args.images} must be >= 10 and --repeats {args.repeats} >= 1")
    suite = load_suite(args.suite)
    specs = [suite.model(name) for name in args.model]
    adversarial = [s for s in specs if s.family == "adversarial"] or \
        [s for s in suite.anomalies if s.family == "adversarial"]
    attack_spec = suite.model(args.attack) if args.attack else (adversarial or [None])[0]
    if attack_spec is None or attack_spec.family != "adversarial":
        raise ValueError(f"suite {suite.name!r}: no adversarial model to take eps and steps from;"
                         " name one with --attack")
    world = build_world(suite.world, runs_root=args.runs_dir)
    family = FAMILIES.get("adversarial")(attack_spec.params, world, attack_spec.seed)
    threads = attack_spec.recipe.cpu_threads
    torch.set_num_threads(threads)
    p = family.params
    print(f"CPU: {cpu_model()}; {threads} thread(s); torch {torch.__version__}; attack of "
          f"{attack_spec.name}: {p.norm} eps={p.eps:.4g}")
    val = world.split("val")
    idx = verification_indices(val, count=args.images)
    images, labels = val.load(idx), torch.as_tensor(val.labels[idx])
    results: dict = {"models": {}}
    for spec in specs:
        model = load_trained_model(model_dir(args.runs_dir, spec), spec, world)
        row = {"clean": accuracy(model, images, labels)}
        for steps in sorted({p.steps, p.eval_steps}):
            for bf16 in (False, True):
                row[f"pgd{steps}_{'bf16' if bf16 else 'fp32'}"] = accuracy(
                    model, attack(model, family, images, labels, steps, bf16), labels)
        results["models"][spec.name] = row
        print(f"{spec.name}: accuracy on {len(idx)} val images: " +
              ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    batch_size = args.batch_size or attack_spec.recipe.batch_size
    seconds = time_training_steps(attack_spec, world, family, batch_size, args.repeats)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    results["step_seconds"] = seconds
    print(f"one adversarial training step ({attack_spec.architecture}, batch {batch_size}, "
          f"{p.steps} PGD steps), median of {args.repeats} interleaved: fp32 {median['fp32']:.3f} s, "
          f"bf16 {median['bf16']:.3f} s; bf16 is {median['fp32'] / median['bf16']:.2f}x as fast")
    return results


if __name__ == "__main__":
    run_cli(main, get_args_parser())
