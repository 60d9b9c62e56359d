"""How surrogate_search's Table 3 statistic spreads over a suite's clean models, and whether the
references sit where the held-out references do:

    python evaluate/benchmarks/null_statistic_spread.py --suite slices --runs-dir runs

Table 3 detects a model when its statistic (its top relative score) is above every reference's.
For a model exchangeable with the R references that happens with probability 1/(R+1), but only
averaged over draws of the references: with R = 5 the threshold is one draw of the maximum of 5.
This script takes the search out of the question: every clean model (references and held-out
references) is evaluated on every subdomain of surrogate_search's grid (the exhaustive tables of
``evaluate/discovery/exhaustive.py``, stored and reused), and each model's statistic is its
largest relative score over the whole grid against all the other clean models. Printed:

- each clean model's statistic and the subdomain that gives it, lowest first;
- the share of held-out references whose statistic is above every reference's (Table 3's rule
  with the whole grid as the search; nominal 1/(R+1));
- a one-sided Mann-Whitney test that the references' statistics are lower than the held-out
  references' (were the references an unlucky draw, or are they different models?).

Models not trained yet are an error (train the suite first); the exhaustive tables it lacks are
evaluated and stored.
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
from scipy.stats import mannwhitneyu

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.evaluate.discovery.exhaustive import exhaustive_table
from counteraudit.evaluate.discovery.relative import relative_score
from counteraudit.evaluate.discovery.stage import suite_auditor
from counteraudit.train.checkpoint import is_trained, model_dir
from counteraudit.train.core.command_line import add_common_args, run_cli
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world

AUDITOR = "surrogate_search"


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("null statistic spread", __doc__, add_help)
    add_common_args(parser)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    return parser


def grid_statistics(rates: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(statistic, argmax) per model: ``rates`` is (models, subdomains) failure rates; a model's
    statistic is its largest relative score over the subdomains against all the other models."""
    statistics, where = np.empty(len(rates)), np.empty(len(rates), dtype=int)
    for model in range(len(rates)):
        others = np.delete(rates, model, axis=0)
        scores = [relative_score(rates[model, i], others[:, i], floor)
                  for i in range(rates.shape[1])]
        where[model] = int(np.nanargmax(scores))
        statistics[model] = scores[where[model]]
    return statistics, where


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    suite = load_suite(args.suite)
    nulls = [*suite.references, *suite.held_out]
    missing = [s.name for s in nulls if not is_trained(model_dir(args.runs_dir, s))]
    if missing or not suite.held_out:
        raise SystemExit(f"{suite.path}: needs trained references and held-out references "
                         f"([references] held_out); not trained: {', '.join(missing) or 'none'}; "
                         f"run python train/train.py --suite {args.suite} --references-only")
    world = build_world(suite.world, runs_root=args.runs_dir)
    auditor = suite_auditor(suite, AUDITOR)
    tables = [exhaustive_table(suite, spec, world, auditor, args.runs_dir) for spec in nulls]
    rates = np.array([np.divide(t["failures"], t["n"]) for t in tables])
    statistics, where = grid_statistics(rates, auditor.spread_floor)
    is_reference = np.array([s in suite.references for s in nulls])
    print(f"CPU: {cpu_model()}; suite {suite.name}; {AUDITOR}, {rates.shape[1]} subdomains; "
          f"{is_reference.sum()} references, {len(suite.held_out)} held-out references")
    print(f"{'model':<16} {'role':<10} {'statistic':>9}  subdomain")
    for i in np.argsort(statistics, kind="stable"):
        row = tables[0]["rows"][where[i]]
        print(f"{nulls[i].name:<16} {'reference' if is_reference[i] else 'held-out':<10} "
              f"{statistics[i]:>9.3f}  {' & '.join(f'{k}={v}' for k, v in row.items())}")
    reference_max = statistics[is_reference].max()
    above = int((statistics[~is_reference] > reference_max).sum())
    print(f"held-out references above every reference: {above} of {(~is_reference).sum()} "
          f"(nominal 1/{is_reference.sum() + 1} = {1 / (is_reference.sum() + 1):.3f})")
    test = mannwhitneyu(statistics[is_reference], statistics[~is_reference], alternative="less")
    print(f"references lower than the held-out references: Mann-Whitney U = {test.statistic:g}, "
          f"one-sided p = {test.pvalue:.3f}")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
