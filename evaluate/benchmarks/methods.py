"""Every registered explanation method in one table: its parameters, what it renders, whether it is
batch invariant, and its cost per image on this CPU.

    python evaluate/benchmarks/methods.py                  # the demo's small_resnet at 64 px
    python evaluate/benchmarks/methods.py --large          # also ResNet-50 at 224 px (the paper's)
    python evaluate/benchmarks/methods.py --no-timing      # the table of parameters alone

The rows come from the registry (a new method in explain/methods/ is a new row): the parameters
are the fields of the method's ``Params`` dataclass with their defaults. The timing runs each
method on ``--images`` random images, in the method's default batch size, with the parameters of
the suite's ``[methods.<name>]`` table (the demo's for the small model, the paper's for --large;
a method the suite does not set runs with its defaults), after a warm-up run on one image; it is
the best of ``--repeats`` runs divided by the number of images, in CPU seconds of the process (a
loaded machine slows wall time, not them). The model's weights are random: the cost of a method
does not depend on them. explain/README.md holds this script's table.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import dataclasses
import datetime
import json
import time
import warnings
from typing import Any

import torch

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.explain.base import METHODS, build_method
from counteraudit.explain.base import AttributionMethod
from counteraudit.train.architectures import build_model
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.numerics import cpu_model

# (label, architecture, image side, the suite whose [methods] tables parameterise the timing)
SMALL = ("small_resnet, 64 px", "small_resnet", 64, "demo")
LARGE = ("resnet50, 224 px", "resnet50", 224, "paper")
NUM_CLASSES = 10
MODEL_ID = "benchmark"
# What a method's output is: attribution maps and CAMs go through a renderer (explain/renderers/);
# the others produce their images themselves.
IMAGES = "images"
COLUMNS = ("method", "parameters (defaults)", "renders", "batch invariant")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("explanation methods", __doc__, add_help)
    parser.add_argument("--images", type=int, default=4,
                        help="images each method explains per timed run")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed runs per method (the best is kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--large", action="store_true",
                        help="also time ResNet-50 at 224 px with the paper suite's parameters "
                             "(minutes: the paper's Caricatures take 512 to 1024 steps)")
    parser.add_argument("--no-timing", action="store_true",
                        help="print the table without timing anything")
    parser.add_argument("--method", action="append", default=None, metavar="NAME",
                        help="only this method (repeatable); default: every registered method")
    return parser


# ---------------------------------------------------------------- the table, from the registry
def default_value(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def parameter_text(field: dataclasses.Field) -> str:
    """``name = default`` as a suite file writes it (a string in quotes); unset: no default
    (None: the method fills it in, e.g. from the model's architecture)."""
    value = default_value(field)
    if value is dataclasses.MISSING:
        return f"`{field.name}` (required)"
    if value is None:
        return f"`{field.name}` (unset)"
    return f"`{field.name} = {json.dumps(value)}`"


def method_facts(name: str) -> dict[str, str]:
    """One method's row without the timing: its name, its parameters with their defaults, what it
    renders (attributions or CAMs through a renderer, or images it makes itself) and whether an
    image's result is independent of its batch."""
    method = METHODS.get(name)
    parameters = [parameter_text(f) for f in dataclasses.fields(method.Params)]
    renders = method.renders if issubclass(method, AttributionMethod) else IMAGES
    return {"method": f"`{name}`", "parameters (defaults)": ", ".join(parameters) or "none",
            "renders": renders, "batch invariant": "yes" if method.batch_invariant else "no"}


def markdown_table(rows: list[dict[str, str]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]).replace("|", "\\|") for c in columns) + " |"
              for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- timing
def seconds_per_image(name: str, params: dict[str, Any], model: torch.nn.Module,
                      images: torch.Tensor, repeats: int) -> float:
    method = build_method(name, params)
    # warm-up: library imports, kernel selection for new shapes. A model id, as the explain stage
    # gives, for methods that draw their randomness per model (Caricatures' noise = "per_model").
    method.run(model, images[:1], model_id=MODEL_ID)
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        method.run(model, images, model_id=MODEL_ID)
        best = min(best, time.process_time() - started)
    return best / len(images)


def timed_column(names: list[str], setting: tuple[str, str, int, str], count: int,
                 repeats: int) -> dict[str, str]:
    """Seconds per image of each method on the ``setting``'s model and image size."""
    label, architecture, side, suite_name = setting
    suite = load_suite(suite_name)
    torch.manual_seed(0)
    model = build_model(architecture, NUM_CLASSES, (0.5,) * 3, (0.25,) * 3).eval()
    images = torch.rand(count, 3, side, side, generator=torch.Generator().manual_seed(1))
    column = {}
    for name in names:
        seconds = seconds_per_image(name, suite.method_tables.get(name, {}), model, images, repeats)
        column[name] = f"{seconds:.3g}"
        print(f"  {name}, {label}: {seconds:.3g} CPU s per image", flush=True)
    return column


def set_by_suite(names: list[str], suite_name: str) -> dict[str, str]:
    """The parameters a suite's ``[methods.<name>]`` table sets (the timing's, where they differ
    from the defaults of the parameters column)."""
    suite = load_suite(suite_name)
    return {name: ", ".join(f"`{key} = {json.dumps(value)}`"
                            for key, value in suite.method_tables.get(name, {}).items()) or "none"
            for name in names}


def main(args: argparse.Namespace) -> str:
    if args.images < 1 or args.repeats < 1 or args.threads < 1:
        raise ValueError(f"--images {args.images}, --repeats {args.repeats} and --threads "
                         f"{args.threads} must each be >= 1")
    names = args.method or METHODS.names()
    for name in names:
        METHODS.get(name)  # an unknown name fails here, with the valid ones
    rows = [method_facts(name) for name in names]
    caption = "Parameters from each method's `Params` (explain/methods/)."
    if not args.no_timing:
        torch.set_num_threads(args.threads)
        warnings.filterwarnings("ignore")
        for setting in [SMALL, LARGE] if args.large else [SMALL]:
            column = timed_column(names, setting, args.images, args.repeats)
            settings = set_by_suite(names, setting[3])
            for row, name in zip(rows, names):
                row[f"timed with, from [methods] of {setting[3]}.toml"] = settings[name]
                row[f"CPU s / image, {setting[0]}"] = column[name]
        caption += (f" CPU seconds per image (the process's: steadier than wall time on a shared "
                    f"machine, the same on an idle one at 1 thread): {args.images} random images, "
                    f"each method's default batch size, best of {args.repeats}, "
                    f"{args.threads} thread(s), on {cpu_model()}, "
                    f"{datetime.date.today().isoformat()} "
                    "(`python evaluate/benchmarks/methods.py`).")
    table = markdown_table(rows)
    print(f"\n{table}\n\n{caption}")
    return table


if __name__ == "__main__":
    run_cli(main, get_args_parser())
