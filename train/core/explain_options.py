"""The options of the commands that explain (explain/run.py and the scoring scripts): --method
NAME[:key=value,...] with the outputs-only control brought along (--no-control),
--chunk-images and --model-group. The syntax of --method is checked as it is parsed; the names and the parameters
once the suite is read (explain/method_choice.py), against the method registry.

They live here, under train/core, beside the options every script shares: the scoring scripts
take them too, and building a parser loads no stage (train/core/command_line.py)."""
from __future__ import annotations

import argparse
import tomllib
from typing import Any

# The control every method is compared with (evaluate/scoring/baseline.py scores against it).
CONTROL_METHOD = "outputs_only"
TOML_OPENERS = ("[", "{", "\"", "'")
METHOD_HELP = (
    "only this method (repeatable); NAME:key=value,key=value sets its parameters as a "
    "[methods.NAME] table would, over the suite's table (values in TOML: 8, 0.5, true, [1, 2], "
    "{dpi = 16}; a bare word such as captum_figure or (4,0,3) is a string). A method the suite "
    "gives no table takes the settings the suite's methods of its kind share (renderer, "
    "gradient_space, aug_smooth_space; explain/README.md). The outputs-only control "
    "(outputs_only) runs too unless --no-control is given or it is listed; default: the suite's "
    "[explain] methods")


def method_choice(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value,key=value`` -> (NAME, {key: value}); a ValueError saying what
    is malformed."""
    name, _, assignments = text.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"--method {text!r}: give a method name before ':'")
    table: dict[str, Any] = {}
    for assignment in _top_level_parts(assignments) if assignments.strip() else []:
        key, equals, value = assignment.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key or not value:
            raise ValueError(f"--method {text!r}: {assignment.strip()!r} is not key=value "
                             "(write NAME:key=value,key=value)")
        if key in table:
            raise ValueError(f"--method {text!r}: {key} is given twice")
        table[key] = _toml_value(value, text)
    return name, table


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


def add_explain_stage_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--chunk-images", type=int, default=None, metavar="N",
        help="split the explain stage into work items of one (model, method, image set, image "
             "range) of N images each (rounded up to a multiple of the method's batch size, so "
             "results are bit for bit those of an unchunked run), stored as parts and gathered "
             "into the usual result; default: the suite's [explain] chunk_images, else no "
             "chunking (one item per (model, method): one model load each, best locally); 0: no "
             "chunking. On Slurm 16 is a good start (four batches of Caricatures, the slow "
             "method; cheap methods, whose batches are larger, stay one item per image set)")
    parser.add_argument(
        "--model-group", type=int, default=None, metavar="K",
        help="explain K models of one architecture in one grouped pass with the methods that "
             "allow it (the gradient methods: explain/README.md, \"Explaining models in "
             "groups\"); their results are keyed apart from solo ones; default: the suite's "
             "[explain] model_group, else 1 (each model alone, best on a CPU)")
    return parser


def _top_level_parts(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, braces, parentheses (a layer "(4,0,3)") and
    quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for position, character in enumerate(text):
        if quote:
            quote = None if character == quote else quote
        elif character in "\"'":
            quote = character
        elif character in "[{(":
            depth += 1
        elif character in "]})":
            depth -= 1
        elif character == "," and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    return [*parts, text[start:]]


def _toml_value(value: str, text: str) -> Any:
    try:
        return tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        if not value.startswith(TOML_OPENERS):  # a bare word: a string (a renderer, a layer)
            return value
        raise ValueError(f"--method {text!r}: {value!r} is not a TOML value (a number, "
                         "true/false, a \"string\", [a, list] or {an = inline_table})") from None
