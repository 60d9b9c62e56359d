"""What each registered null test can see, on a clean null and on one that a few clean models
contaminate: its false-positive rate and the effect it detects with power 0.8.

    python evaluate/benchmarks/null_tests.py                  # k = 10 and 20 nulls, alpha 0.05
    python evaluate/benchmarks/null_tests.py --nulls 10 20 40 --simulations 20000

A seeded simulation (``null_tests.base.power``): k null models' log Abars drawn from a normal
null, and, contaminated, one model in ten of them ``--outlier-shift`` SDs higher (a clean model
that trained unlike the others); the model tested is drawn from the clean distribution. The
false-positive rate is the share of clean models with p <= alpha (calibrated: at most alpha,
close to it); the detectable effect is how many clean-null SDs above the clean mean a model's log
Abar must lie for the test to flag it with probability 0.8. A test that keeps both on the
contaminated null is one that a single outlying clean model cannot capture (issue 49).
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import time

import pandas as pd

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.evaluate.reporting.tables import to_markdown
from counteraudit.evaluate.scoring.null_tests.base import NULL_TESTS, detectable_effect, power
from counteraudit.train.core import numerics
from counteraudit.train.core.command_line import run_cli


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("null tests", __doc__, add_help)
    parser.add_argument("--nulls", type=int, nargs="+", default=[10, 20],
                        help="null population sizes k to simulate")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--power", type=float, default=0.8)
    parser.add_argument("--simulations", type=int, default=20000)
    parser.add_argument("--outlier-shift", type=float, default=5.0,
                        help="how far (SDs) the contaminating clean models lie above the others")
    return parser


def measure(name: str, k: int, args: argparse.Namespace) -> dict:
    test = NULL_TESTS.get(name)()
    outliers = max(1, k // 10)
    started = time.perf_counter()
    row = {"test": name, "k": k, "outliers": outliers}
    for label, count in (("clean", 0), ("contaminated", outliers)):
        row[f"fpr_{label}"] = float(power(test, k, [0.0], alpha=args.alpha,
                                          simulations=args.simulations, outliers=count,
                                          outlier_shift=args.outlier_shift)[0])
        row[f"effect_{label}"] = detectable_effect(test, k, alpha=args.alpha,
                                                   target_power=args.power,
                                                   simulations=args.simulations,
                                                   outliers=count)
    row["seconds"] = time.perf_counter() - started
    return row


def main(args: argparse.Namespace) -> pd.DataFrame:
    rows = [measure(name, k, args) for k in args.nulls for name in NULL_TESTS.names()]
    table = pd.DataFrame(rows)
    print(f"Null tests at alpha {args.alpha}, power {args.power}, {args.simulations} simulations; "
          f"contaminated: one null in ten {args.outlier_shift} SDs higher; on "
          f"{numerics.cpu_model()}\n")
    print(to_markdown(table, float_format="{:.3f}"))
    print("\nfpr: share of clean models flagged (calibrated: about alpha or below); effect: "
          "clean-null SDs of log Abar a model needs to be flagged with the stated power (inf: "
          "never, as the empirical test with k + 1 < 1 / alpha)")
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
