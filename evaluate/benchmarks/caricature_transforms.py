"""Caricatures with lucent's own transform chain against the fused resampling (``transforms``).

    python evaluate/benchmarks/caricature_transforms.py [--steps 12] [--images 4] [--threads 1]

The same small_resnet (random weights, seed 0), the same images and the same steps for both
paths (explain/caricature_transforms.py: "lucent" runs lucent's standard_transforms and
render_vis's upsample; "fused" resamples once with the same draws), with the demo suite's
Caricature table (layers, noise, quantisation) and the demo's 64-px images:
- demo: canvas of the input's size (64 px), as demo.toml;
- 128 -> 224 (``--no-large`` skips it): lucent's 128-px canvas upsampled to a 224-px input (the
  demo's images resized), as the paper suite renders, with the same layers and steps.
Per case: seconds for one batch of ``--images`` images (best of ``--repeats``, the two paths
taking turns, after a warm-up),
the ratio lucent / fused, and how far apart the two paths are:
- model input: one augmentation step of a high-frequency canvas (uniform noise) under the same
  numpy seeds, mean and max |lucent - fused| over ``--draws`` draws, next to the canvas's standard
  deviation;
- Caricature: the final uint8 images of the two runs, mean and max |lucent - fused| in [0, 1].
"""
from __future__ import annotations

import sys

if __package__ in (None, ""):
    sys.path.pop(0)

# First, before torch and NumPy load: the numeric mode (train/core/numerics.py).
import counteraudit.train  # noqa: E402, F401, I001

import argparse
import tempfile
import warnings
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from counteraudit.evaluate.benchmarks import benchmark_parser, interleaved_seconds
from counteraudit.explain.base import build_method
from counteraudit.explain.caricature_transforms import AUGMENTATIONS
from counteraudit.train.architectures import build_model
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds.synthetic import SyntheticConfig, SyntheticWorld

ARCHITECTURE = "small_resnet"
PATHS = ("lucent", "fused")
MODEL_ID = "benchmark"  # noise = "per_model" seeds each row from the model's key


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("Caricature transforms", __doc__, add_help)
    parser.add_argument("--steps", type=int, default=12,
                        help="steps per Caricature (12: the demo's; the time grows linearly)")
    parser.add_argument("--images", type=int, default=4,
                        help="images in the batch (4: the method's default batch size)")
    parser.add_argument("--large", action=argparse.BooleanOptionalAction, default=True,
                        help="also the 128-px canvas upsampled to a 224-px input")
    parser.add_argument("--draws", type=int, default=20,
                        help="augmentation draws for the model-input difference")
    parser.add_argument("--device", default="cpu",
                        help="where the model runs (lucent puts its tensors on cuda:0 when there "
                             "is a GPU: hide it with CUDA_VISIBLE_DEVICES= to time the CPU)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 is stable on a shared CPU)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs per figure, the best counts (after one warm-up run)")
    return parser


def best_times(functions: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best of ``repeats`` seconds per function, the functions taking turns within each repeat
    (a load that drifts on a shared machine hits both), after one warm-up run of each."""
    return {name: min(seconds) for name, seconds in interleaved_seconds(functions, repeats).items()}


def input_difference(canvas: int, size: int, draws: int, device: torch.device
                     ) -> tuple[float, float, float]:
    """(mean, max |lucent - fused|, the canvas's std) of one augmentation of a uniform-noise
    canvas, over ``draws`` numpy seeds (the two paths draw the same parameters from a seed)."""
    image = torch.rand(1, 3, canvas, canvas, generator=torch.Generator().manual_seed(0)).to(device)
    differences = []
    for seed in range(draws):
        augmented = {}
        for path in PATHS:
            np.random.seed(seed)
            augmented[path] = AUGMENTATIONS[path](canvas, canvas, (size, size))(image)
        differences.append((augmented["lucent"] - augmented["fused"]).abs())
    difference = torch.stack(differences)
    return difference.mean().item(), difference.max().item(), image.std().item()


def run_case(label: str, model: torch.nn.Module, images: torch.Tensor, params: dict,
             args: argparse.Namespace) -> None:
    canvas = params.get("canvas") or images.shape[-1]
    methods = {path: build_method("caricature", {**params, "transforms": path}) for path in PATHS}
    renders = {path: (lambda method=method: method.run(model, images, batch_size=len(images),
                                                       model_id=MODEL_ID))
               for path, method in methods.items()}
    seconds = best_times(renders, args.repeats)
    rendered = {path: render().images.astype(np.float64) / 255 for path, render in renders.items()}
    mean_input, max_input, spread = input_difference(canvas, images.shape[-1], args.draws,
                                                 images.device)
    caricature = np.abs(rendered["lucent"] - rendered["fused"])
    print(f"\n{label}: canvas {canvas} -> input {images.shape[-1]}, {len(images)} images x "
          f"{len(params['layers'])} layers, {args.steps} steps, noise {params['noise']!r}")
    for path in PATHS:
        print(f"  {path:<7}{seconds[path]:>8.2f}s")
    print(f"  lucent / fused: {seconds['lucent'] / seconds['fused']:.2f}x")
    print(f"  model input, noise canvas (std {spread:.3f}): |lucent - fused| mean {mean_input:.4f}, "
          f"max {max_input:.4f}")
    print(f"  final Caricature: |lucent - fused| mean {caricature.mean():.4f}, "
          f"max {caricature.max():.4f}")


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    params = {**load_suite("demo").method_tables.get("caricature", {}), "steps": args.steps}
    params.pop("steps_by_layer", None)  # the same steps for every layer in both cases
    with tempfile.TemporaryDirectory() as tmp:
        world = SyntheticWorld(SyntheticConfig(num_train=args.images, num_val=args.images),
                               cache_dir=tmp, verbose=False)
        images = world.split("val").load(np.arange(args.images))
    torch.manual_seed(0)
    model = build_model(ARCHITECTURE, world.num_classes, world.mean, world.std).eval()
    model, images = model.to(args.device), images.to(args.device)
    print(f"{ARCHITECTURE} (random weights) on {args.device}, {args.threads} thread(s), best of "
          f"{args.repeats}", flush=True)
    run_case("demo", model, images, params, args)
    if args.large:
        resized = F.interpolate(images, size=(224, 224), mode="bilinear", align_corners=True)
        run_case("128 -> 224", model, resized, {**params, "canvas": 128}, args)


if __name__ == "__main__":
    run_cli(main, get_args_parser())
