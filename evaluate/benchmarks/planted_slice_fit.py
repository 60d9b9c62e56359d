"""Did a planted slice's model learn its slice, and where did the failure go? For each trained
planted_slice model of a suite, next to one reference of ``--reference-suite``:

    python evaluate/benchmarks/planted_slice_fit.py --suite slices --runs-dir runs

- ``n train`` / ``affected``: the slice's training images, and how many of them were relabelled;
- ``fit``: the share of the model's *own relabelled training images* it answers with their new
  class (near 0: the slice was not learnt, the relabelled images were treated as label noise;
  near 1: learnt, or memorised);
- ``slice``: accuracy on the slice's val images (the model / the reference);
- ``near``: accuracy on the val images meeting every condition of the slice but one (its near
  misses: where a model that learnt part of the conjunction fails too), count, model / reference;
- ``far``: the other val images, model / reference;
- ``took``: the stored implant verdict (``-`` where not checked).

Models not trained yet are skipped. Nothing is written.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse

import numpy as np
import torch

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.common import predict
from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.train.checkpoint import is_trained, model_dir
from counteraudit.train.core.command_line import add_common_args, run_cli
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.core.suite import load_suite
from counteraudit.train.implant_checks import read_implant
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.worlds import build_world


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("planted slice fit", __doc__, add_help)
    add_common_args(parser)
    parser.add_argument("--reference-suite", default=None, metavar="SUITE",
                        help="the suite whose first reference is the comparison (default: --suite)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    return parser


def val_accuracy(model, split, positions: np.ndarray) -> float:
    if len(positions) == 0:
        return float("nan")
    return float((predict(model, split.load(positions)).numpy() == split.labels[positions]).mean())


def slice_fit(family, model, reference, train, val) -> dict[str, float]:
    """The figures of one planted_slice model (module docstring)."""
    chosen, new_labels = family.affected(train)
    met = family.conditions_met(val)
    arity = len(family.conditions)
    inside, near, far = (np.flatnonzero(met == arity), np.flatnonzero(met == arity - 1),
                         np.flatnonzero(met < arity - 1))
    fit = float((predict(model, train.load(chosen)).numpy() == new_labels).mean()) if len(chosen) else float("nan")
    return {"n_train": len(family.in_slice(train)), "affected": len(chosen), "fit": fit,
            "slice": val_accuracy(model, val, inside), "slice_reference": val_accuracy(reference, val, inside),
            "near_n": len(near), "near": val_accuracy(model, val, near),
            "near_reference": val_accuracy(reference, val, near),
            "far": val_accuracy(model, val, far), "far_reference": val_accuracy(reference, val, far)}


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    suite = load_suite(args.suite)
    world = build_world(suite.world, runs_root=args.runs_dir)
    train, val = world.split("train"), world.split("val")
    reference_spec = load_suite(args.reference_suite or args.suite).references[0]
    reference = load_trained_model(model_dir(args.runs_dir, reference_spec), reference_spec, world, "cpu")
    print(f"CPU: {cpu_model()}; suite {suite.name}; reference {reference_spec.name}")
    print(f"{'model':<62} {'n train':>7} {'affected':>8} {'fit':>5} {'slice':>11} "
          f"{'near':>16} {'far':>11} {'took':>5}")
    for spec in suite.anomalies:
        if spec.family != "planted_slice" or not is_trained(model_dir(args.runs_dir, spec)):
            continue
        family = FAMILIES.get(spec.family)(spec.params, world, spec.seed)
        model = load_trained_model(model_dir(args.runs_dir, spec), spec, world, "cpu")
        row = slice_fit(family, model, reference, train, val)
        implant = read_implant(suite, spec, args.runs_dir)
        took = "-" if implant is None else "yes" if implant["passed"] else "no"
        print(f"{spec.name:<62} {row['n_train']:>7} {row['affected']:>8} {row['fit']:>5.2f} "
              f"{row['slice']:>5.2f}/{row['slice_reference']:.2f} "
              f"{row['near_n']:>5} {row['near']:.2f}/{row['near_reference']:.2f} "
              f"{row['far']:>5.2f}/{row['far_reference']:.2f} {took:>5}")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
