"""Convert a checkpoint you trust into a weights-only state dict, for a suite's ``checkpoint =``.

    python train/convert_checkpoint.py downloaded.pth downloaded-weights.pth

counteraudit reads every checkpoint with ``torch.load(weights_only=True)``: tensors, numbers,
strings, lists and dicts only. Many published checkpoints also pickle Python objects (an
``argparse.Namespace`` of training options, numpy arrays, a whole model), and unpickling a file
runs whatever code its author put there, so such a file is refused with this command. This script
unpickles it in full, once, on your say-so, and saves only the backbone's tensors (the layout
``load_backbone_weights`` takes: ``clean_state_dict`` removes "state_dict"/"model" wrappers and
"module."-style prefixes) as a plain state dict, then checks that the result loads as weights only.
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    # Run as a file: the code is imported as counteraudit.* (pip install -e .); this folder's
    # modules (checkpoint.py, ...) must not shadow other packages of the same name.
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
from pathlib import Path

import torch

from counteraudit.train.core.artifacts import atomic_torch_save
from counteraudit.train.core.weights import backbone_tensors, load_weights_only


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("counteraudit checkpoint conversion", add_help=add_help,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path,
                        help="the checkpoint to convert; it is unpickled in full, which can run "
                             "code: give only a file you trust (your own, or from its publisher)")
    parser.add_argument("output", type=Path,
                        help="where to write the weights-only state dict (a new file: the source "
                             "is kept); give this path as the suite's checkpoint =")
    return parser


def convert_checkpoint(source: Path, output: Path) -> dict[str, torch.Tensor]:
    """Save the tensors of a trusted full-pickle checkpoint as a weights-only state dict."""
    source, output = Path(source), Path(output)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {source} does not exist")
    if output.resolve() == source.resolve():
        raise ValueError(f"output {output} is the source checkpoint; give a new file, so the "
                         "original stays as it was")
    raw = torch.load(source, map_location="cpu", weights_only=False)  # trusted by the user
    if isinstance(raw, torch.nn.Module):  # a whole pickled model
        raw = raw.state_dict()
    state = backbone_tensors(raw, f"checkpoint {source}")
    atomic_torch_save(output, state, chosen_by_user=True)
    load_weights_only(output)  # what counteraudit will read
    return state


def main(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    state = convert_checkpoint(args.source, args.output)
    print(f"wrote {len(state)} tensors of {args.source} to {args.output} (weights only); give it "
          f"to a suite as checkpoint = \"{args.output}\"")
    return state


if __name__ == "__main__":
    from counteraudit.train.core.command_line import run_cli
    run_cli(main, get_args_parser())
