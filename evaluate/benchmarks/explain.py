"""Throughput of the explanation methods: batched vs the original code's one image at a time.

    python evaluate/benchmarks/explain.py [--images 16] [--caricature-steps 64] [--threads 1]

Part 1, images/s per method on a small_resnet checkpoint saved to disk:
- batched: load the model once, ``method.run(model, images, batch_size)``;
- one at a time: for every image, reload the model from disk and run on that image alone (the
  paper's code loaded the model per image and method);
- one at a time with the model loaded once (how much of the gain is batching alone).
Part 2, Caricatures of 1 image, and of 4 (the method's default batch), at every layer of the
architecture (7 layers):
- all layers x images in ONE optimisation batch (this package);
- one render per layer and image with this package (``layers=[layer]``, one image);
- one ``lucent.optvis.render.render_vis`` call per layer and image (the paper's code: lucent
  hooks every module; same objective, parameterisation, transforms, steps and image size).
Each timing is the best of ``--repeats`` runs (the machine may be shared), after one warm-up run
that pays one-off costs (library imports, kernel selection for new shapes).
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
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.explain.base import METHODS, build_method
from counteraudit.explain.base import seeded_rng
from counteraudit.train.architectures import ARCHITECTURES, build_model, layer_name, resolve_layer
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld

with warnings.catch_warnings():  # lucent's render scripts a function with torch.jit: a notice
    warnings.filterwarnings("ignore", r"`torch.jit.script` is deprecated", FutureWarning)
    from lucent.optvis import objectives, param, render

ARCHITECTURE = "small_resnet"
CARICATURE = "caricature"  # timed on its own in part 2


def part_one_methods() -> list[str]:
    """Every registered method but Caricatures."""
    return [name for name in METHODS if name != CARICATURE]


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("explanation throughput", __doc__, add_help)
    parser.add_argument("--images", type=int, default=16,
                        help="images per method (16: a few seconds a method one at a time)")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="batch of the batched runs (16: every image in one batch)")
    parser.add_argument("--caricature-steps", type=int, default=64,
                        help="steps per Caricature (the method's default is 512; the ratio does "
                             "not depend on it, the time per render grows linearly)")
    parser.add_argument("--caricature-images", type=int, nargs="+", default=[1, 4],
                        help="image counts for the Caricature comparison (4 = the method's "
                             "default batch size)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 is stable on a shared CPU)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs per figure, the best counts (2: enough after the "
                             "warm-up run on an idle machine; more on a shared one)")
    return parser


def best_time(function: Callable[[], object], repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def load_model(checkpoint: Path, world: SyntheticWorld) -> torch.nn.Module:
    model = build_model(ARCHITECTURE, world.num_classes, world.mean, world.std)
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return model.eval()


def methods_table(checkpoint: Path, world: SyntheticWorld, images: torch.Tensor,
                  batch_size: int, repeats: int) -> list[tuple[str, float, float, float]]:
    """(method, images/s batched, one at a time reloading the model, one at a time without)."""
    rows = []
    for name in part_one_methods():
        method = build_method(name)

        def batched():
            method.run(load_model(checkpoint, world), images, batch_size=batch_size)

        def one_at_a_time_reloading():
            for i in range(len(images)):
                method.run(load_model(checkpoint, world), images[i:i + 1], batch_size=1)

        def one_at_a_time_loaded_once():
            model = load_model(checkpoint, world)
            for i in range(len(images)):
                method.run(model, images[i:i + 1], batch_size=1)

        seconds = [best_time(batched, repeats), best_time(one_at_a_time_reloading, repeats),
                   best_time(one_at_a_time_loaded_once, repeats)]
        rows.append((name, *(len(images) / s for s in seconds)))
        print(f"  {name}: " + ", ".join(f"{s:.2f}s" for s in seconds), flush=True)
    return rows


def render_vis_per_layer(model: torch.nn.Module, image: torch.Tensor, layers, steps: int) -> None:
    """The paper's code: one lucent render_vis per layer, <f_l(x'), f_l(x)> as the objective."""
    for layer in layers:
        module = resolve_layer(model, layer)
        features = {}
        handle = module.register_forward_hook(lambda m, i, o: features.__setitem__("x", o))
        with torch.no_grad():
            model(image)
        handle.remove()
        direction = features["x"][0].detach()
        lucent_name = "_".join(["backbone"] + layer_name(layer).split("."))

        @objectives.wrap_objective()
        def caricature_objective(layer_key=lucent_name, direction=direction):
            return lambda hook: -(hook(layer_key)[0] * direction).sum()

        size = image.shape[-1]
        render.render_vis(model, caricature_objective(), lambda: param.image(size),
                          thresholds=(steps,), preprocess=False, fixed_image_size=size,
                          show_image=False, progress=False)


def caricature_table(checkpoint: Path, world: SyntheticWorld, images: torch.Tensor, steps: int,
                     repeats: int) -> list[tuple[str, float]]:
    """Seconds to render every layer of ``images``, three ways."""
    layers = ARCHITECTURES.get(ARCHITECTURE).caricature_layers
    model = load_model(checkpoint, world)

    def all_layers_one_batch():
        build_method(CARICATURE, {"steps": steps}).run(model, images, batch_size=len(images))

    def one_render_per_layer():
        for i in range(len(images)):
            for layer in layers:
                build_method(CARICATURE, {"steps": steps, "layers": [layer]}).run(
                    model, images[i:i + 1])

    def lucent_render_vis_per_layer():
        with seeded_rng(0):
            for i in range(len(images)):
                render_vis_per_layer(model, images[i:i + 1], layers, steps)

    return [(label, best_time(function, repeats)) for label, function in [
        ("all layers x images, one batch", all_layers_one_batch),
        ("one render per layer and image", one_render_per_layer),
        ("render_vis per layer and image (paper)", lucent_render_vis_per_layer)]]


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    with tempfile.TemporaryDirectory() as tmp:
        world = SyntheticWorld(SyntheticConfig(num_train=args.images, num_val=args.images),
                               cache_dir=tmp, verbose=False)
        images = world.split("val").load(np.arange(args.images))
        torch.manual_seed(0)
        checkpoint = Path(tmp) / "small_resnet.pt"
        torch.save(build_model(ARCHITECTURE, world.num_classes, world.mean, world.std).state_dict(),
                   checkpoint)
        print(f"small_resnet, {args.images} images {tuple(images.shape[1:])}, "
              f"{args.threads} thread(s), best of {args.repeats}", flush=True)
        rows = methods_table(checkpoint, world, images, args.batch_size, args.repeats)
        caricatures = {n: caricature_table(checkpoint, world, images[:n], args.caricature_steps,
                                           args.repeats) for n in args.caricature_images}

    print(f"\nimages/s{'batched':>22}{'one at a time':>16}{'speed-up':>10}"
          f"{'one at a time,':>17}{'speed-up':>10}")
    print(f"{'':<30}{'model reloaded':>16}{'':>10}{'model kept':>17}")
    for name, batched, reloading, loaded_once in rows:
        print(f"{name:<22}{batched:>8.1f}{reloading:>16.1f}{batched / reloading:>9.1f}x"
              f"{loaded_once:>17.1f}{batched / loaded_once:>9.1f}x")
    num_layers = len(ARCHITECTURES.get(ARCHITECTURE).caricature_layers)
    for n, table in caricatures.items():
        print(f"\nCaricatures of {n} image(s) x {num_layers} layers, {args.caricature_steps} steps")
        fastest = table[0][1]
        for label, seconds in table:
            print(f"{label:<40}{seconds:>8.2f}s{seconds / fastest:>7.1f}x the one-batch time")


if __name__ == "__main__":
    run_cli(main, get_args_parser())
