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

from counteraudit.explain.method_choice import (CONTROL_METHOD, METHOD_HELP, method_choice, run_methods,
                                                with_method_parameters)
from counteraudit.explain.settings import method_problems, method_specs
from counteraudit.explain.stage import explain_suite, explained_images_line
from counteraudit.slurm.executor import add_executor_args
from counteraudit.train.core.stage import (ScriptHelpFormatter, add_common_args, run_cli, run_options,
                                           selected_models)
from counteraudit.train.core.suite import Suite, load_suite
from counteraudit.train.train import train_and_check


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit explanations", add_help=add_help,
                                     formatter_class=ScriptHelpFormatter)
    add_common_args(parser)
    add_method_args(parser)
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="only this model (repeatable); default: every model of the suite")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N; default: cuda when available, else cpu")
    add_chunk_images_arg(parser)
    add_executor_args(parser)
    return parser


def explain_overrides(suite: Suite, args: argparse.Namespace) -> Suite:
    """The suite with the command line's overrides of its [explain] and [methods] tables merged
    in, once."""
    suite = suite.with_settings({"chunk_images": "--chunk-images"},
                                explain={"chunk_images": args.chunk_images})
    return with_method_parameters(suite, run_methods(args.method, not args.no_control),
                                  args.method_params)


def main(args: argparse.Namespace) -> None:
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


class MethodOption(argparse.Action):
    """``--method NAME[:key=value,...]``: appends NAME to ``method`` and (text, table) to
    ``method_params``; the syntax is checked here, the parameters by the method's own ``Params``
    once the suite is read (``with_method_parameters``)."""

    def __call__(self, parser, namespace, text, option_string=None):
        try:
            name, table = method_choice(text)
        except ValueError as error:
            raise argparse.ArgumentError(self, str(error).removeprefix("--method ")) from None
        names = list(getattr(namespace, self.dest) or [])
        if name in names:
            raise argparse.ArgumentError(self, f"{name!r} is given twice; give its parameters "
                                               f"once, --method {name}:key=value,key=value")
        setattr(namespace, self.dest, [*names, name])
        if table:
            namespace.method_params = {**namespace.method_params, name: (text, table)}


def add_method_args(parser: argparse.ArgumentParser, help_text: str = METHOD_HELP) -> argparse.ArgumentParser:
    """--method and --no-control: the methods a run explains with, their parameters, and the
    control (``explain/method_choice.py``)."""
    parser.add_argument("--method", action=MethodOption, default=None,
                        metavar="NAME[:KEY=VALUE,...]", help=help_text)
    parser.add_argument("--no-control", action="store_true",
                        help=f"with --method: do not add the outputs-only control ({CONTROL_METHOD})")
    parser.set_defaults(method_params={})
    return parser


def add_chunk_images_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--chunk-images", type=int, default=None, metavar="N",
        help="split the explain stage into work items of one (model, method, image set, image "
             "range) of N images each (rounded up to a multiple of the method's batch size, so "
             "results are bit for bit those of an unchunked run), stored as parts and gathered "
             "into the usual result; default: the suite's [explain] chunk_images, else no "
             "chunking (one item per (model, method): one model load each, best locally); 0: no "
             "chunking. On Slurm 16 is a good start (four batches of Caricatures, the slow "
             "method; cheap methods, whose batches are larger, stay one item per image set)")
    return parser


if __name__ == "__main__":
    run_cli(main, get_args_parser())
