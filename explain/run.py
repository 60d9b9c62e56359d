"""Compute every visualization a suite needs: each (model, method) on its image sets.

    python explain/run.py --suite demo                      # everything missing
    python explain/run.py --suite demo --method gradcam     # one method (e.g. a new one) and outputs_only
    python explain/run.py --suite demo --method saliency:explained_class=label --no-control
    python explain/run.py --suite paper --executor slurm --partition gpu --gpus-per-node 1
    python explain/run.py --suite paper --executor slurm --gpus-per-node 1 --chunk-images 16

Models that are not trained yet are trained first (with their implant checks), through the same
executor. Every model is explained on the detection set; each localizable anomalous model and every
reference on that model's abnormal set. One work item is one (model, method): the model is loaded
once and its images go through the method in batches. With --chunk-images N, one work item is
one (model, method, image set, range of N images), stored as a part; the parts of a set are
gathered into the same result an unchunked run stores, bit for bit, and a rerun after a partial
failure submits only the missing parts. Each result (model, method, image set) is stored once,
with the parameters that made them, in the store every suite shares
(<runs-dir>/store/visualizations/<method>/<key hash>/), and linked from
<runs-dir>/<suite>/visualizations/<method>/<model>/<image set>; a rerun does no work, adding a
method computes only that method, and a suite finds what another computed.
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
import time
from typing import TYPE_CHECKING

from counteraudit.slurm.executor_config import add_executor_args
from counteraudit.train.core.command_line import ScriptHelpFormatter, add_common_args, run_cli
from counteraudit.train.core.explain_options import add_explain_stage_args, add_method_args

if TYPE_CHECKING:
    from counteraudit.train.core.suite import Suite


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit explanations", add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    add_common_args(parser)
    add_method_args(parser)
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="only this model (repeatable); default: every model of the suite")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N; default: cuda when available, else cpu")
    add_explain_stage_args(parser)
    add_executor_args(parser)
    return parser


def explain_overrides(suite: Suite, args: argparse.Namespace) -> Suite:
    """The suite with the command line's overrides of its [explain] and [methods] tables merged
    in, once."""
    from counteraudit.explain.method_choice import run_methods, with_method_parameters

    suite = suite.with_settings({"chunk_images": "--chunk-images", "model_group": "--model-group"},
                                explain={"chunk_images": args.chunk_images,
                                         "model_group": args.model_group})
    return with_method_parameters(suite, run_methods(args.method, not args.no_control),
                                  args.method_params)


def main(args: argparse.Namespace) -> None:
    # The stage loads here, not at the top: --help needs the parser alone (evaluate/cli.py).
    from counteraudit.explain.method_choice import run_methods
    from counteraudit.explain.settings import method_problems, method_specs
    from counteraudit.explain.stage import explain_suite, explained_images_line
    from counteraudit.train.checked_training import train_and_check
    from counteraudit.train.core.stage import run_options, selected_models
    from counteraudit.train.core.suite import load_suite

    suite = explain_overrides(load_suite(args.suite, method_problems), args)
    options = run_options(args)
    methods = method_specs(suite, run_methods(args.method, not args.no_control))
    # This stage needs trained models, and the blurred-faces image set needs the implant checks:
    # whatever is missing runs first, through the same executor, instead of failing (a no-op when
    # everything is there).
    train_and_check(suite, selected_models(suite, args.model), options)
    started = time.perf_counter()
    done = explain_suite(suite, options, methods=methods, models=args.model)
    parts = f" (from {done['parts']} new part(s))" if done.get("parts") else ""
    print(f"{suite.name}: {done['computed']} visualization set(s) computed{parts}, {done['stored']} "
          f"already stored, in {time.perf_counter() - started:.1f}s; {explained_images_line(done)}")




if __name__ == "__main__":
    run_cli(main, get_args_parser())
