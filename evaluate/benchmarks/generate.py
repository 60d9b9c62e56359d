"""How fast does a world generate images on conditions (``World.generate``, what the auditors
draw), against how fast it makes its own splits? Prints images/s; writes only into a temporary
cache, so nothing is read back from an earlier run.

    python evaluate/benchmarks/generate.py                 # the demo's world, 2,000 images a call
    python evaluate/benchmarks/generate.py --images 4000 --suite quick

Three figures, each from a cold cache: the factor pool (made once per world, then cached), one
large conditional draw (worker processes, as the auditors' bigger draws use), 200 small draws of 16
images (one process each, as the demo's twise draws its 20 rows per class), and the world's own val split
made at the same moment, for the ratio (compare ratios, not absolute figures, across machines).
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import tempfile
import time

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.worlds import build_world
from counteraudit.train.worlds.synthetic_images import generate

SMALL_DRAWS = 200  # the demo's twise: 20 covering-array rows for each of its 10 classes


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("generation", __doc__, add_help)
    parser.add_argument("--suite", default="demo",
                        help="suite whose world is measured (its [world] table); demo: the world "
                             "the auditors draw from in the demo, quick: a smaller one")
    parser.add_argument("--images", type=int, default=2000,
                        help="images of the large conditional draw (2,000: well past the size "
                             "from which generation uses worker processes)")
    return parser


def main(args: argparse.Namespace) -> None:
    suite = load_suite(args.suite)
    with tempfile.TemporaryDirectory() as runs:
        world = build_world(suite.world, runs_root=runs)
        if not world.has_generator:
            raise ValueError(f"suite {suite.name!r}: the {suite.world.get('name')} world has no "
                             "generator to measure")
        print(f"CPU: {cpu_model()}; world of suite {suite.name!r}")
        started = time.perf_counter()
        world.factor_pool()
        print(f"factor pool (once per world, then cached): {time.perf_counter() - started:.1f}s")
        started = time.perf_counter()
        world.generate({"face": "present"}, args.images, seed=123)
        seconds = time.perf_counter() - started
        print(f"generate(face=present, {args.images}): {args.images / seconds:.0f} images/s")
        started = time.perf_counter()
        for k in range(SMALL_DRAWS):
            world.generate({"class": world.class_names[k % len(world.class_names)],
                            "clutter": str(k % 3)}, 16, seed=1000 + k)
        seconds = time.perf_counter() - started
        print(f"{SMALL_DRAWS} subgroups x 16 images (one process each, as the demo's twise): "
              f"{SMALL_DRAWS * 16 / seconds:.0f} images/s")
        started = time.perf_counter()
        generate(world.config, "val")
        seconds = time.perf_counter() - started
        count = world.config.num_val
        print(f"the world's own val split ({count} images), for the ratio: "
              f"{count / seconds:.0f} images/s")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
