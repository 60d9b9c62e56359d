"""Images/s per CPU core of the ImageNet world's decoding paths, on JPEGs generated here.

    python evaluate/benchmarks/decode.py                 # 48 JPEGs of sizes around 500x375
    python evaluate/benchmarks/decode.py --crop 160      # paper-fast's first resolution

Each path does what a loader worker does for one training image: read the file, decode it,
draw the random-resized crop and flip from the image's own seed, crop, resize to --crop, flip, and
make a float tensor (train/worlds/decoding.py). One thread, one process: the figure is per core,
and a loader with W workers on W free cores scales it by about W. The paths take turns on the
same files, --rounds times, and each reports its fastest round, so a load on a shared machine
does not fall on one path only. nvjpeg (the batched GPU decode) is timed where CUDA is present.

The generated images are photo-like (gradients, shapes and noise, JPEG quality 90), about
110 kB each, the mean size of ILSVRC2012's training JPEGs (138 GB for 1.28M files). Decoding
time follows the file's entropy, so real photos may decode a little slower or faster: time a
sample of your own data with --jpegs DIR.
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
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from counteraudit.evaluate.benchmarks import benchmark_parser
from counteraudit.train.core.command_line import run_cli
from counteraudit.train.core.numerics import cpu_model
from counteraudit.train.worlds import decoding

# ImageNet's commonest shapes: 500x375 (4:3) and 375x500, with 500x333 and 333x500 (3:2) next.
SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (450, 350), (500, 400)]
# Noise (pixel levels) that gives the files about the size of ImageNet photos of these dimensions.
NOISE = 28.0


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = benchmark_parser("decoding", __doc__, add_help)
    parser.add_argument("--images", type=int, default=48,
                        help="JPEGs to generate, cycling through sizes around 500x375 (48: a few "
                             "seconds a round per path)")
    parser.add_argument("--jpegs", default=None, metavar="DIR",
                        help="time these JPEG files (any folder tree) instead of generated ones: "
                             "a sample of your own data, whose decoding time may differ")
    parser.add_argument("--crop", type=int, default=224,
                        help="training crop side (224: the paper's; 160/192: paper-fast's)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per path, interleaved; the fastest counts (3: steady on a "
                             "shared 2-core machine)")
    parser.add_argument("--batch", type=int, default=64,
                        help="images per nvjpeg call (64: a loader batch; GPU only)")
    return parser


def photo_like_jpeg(path: Path, width: int, height: int, seed: int, quality: int = 90) -> Path:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], -1) * 200
    image = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(30):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        draw.ellipse([x0, y0, x0 + int(rng.integers(5, width // 3)),
                      y0 + int(rng.integers(5, height // 3))],
                     fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    pixels = np.asarray(image, np.float32) + rng.normal(0, NOISE, (height, width, 3))  # texture
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, format="JPEG", quality=quality)
    return path


def _seeded(index: int):
    torch.manual_seed(index)


def pil_path(path: str, index: int, crop: int) -> torch.Tensor:
    with Image.open(path) as image:
        image = image.convert("RGB")
    _seeded(index)
    return decoding.pil_crop(image, crop)


def tensor_path(path: str, index: int, crop: int) -> torch.Tensor:
    image = decoding.read_rgb(path)
    _seeded(index)
    return decoding.tensor_crop(image, crop)


def time_paths(files: list[str], crop: int, rounds: int, batch: int) -> dict[str, float]:
    """Images/s of each path, the fastest of ``rounds`` interleaved rounds."""
    paths = {"pil": pil_path, "tensor": tensor_path}
    best = {name: float("inf") for name in paths}
    cuda = torch.cuda.is_available()
    if cuda:
        best["nvjpeg"] = float("inf")
    for _ in range(rounds):
        for name, run in paths.items():
            tic = time.perf_counter()
            for index, path in enumerate(files):
                run(path, index, crop)
            best[name] = min(best[name], time.perf_counter() - tic)
        if cuda:
            tic = time.perf_counter()
            for start in range(0, len(files), batch):
                chunk = files[start:start + batch]
                plans = []
                for index, path in enumerate(chunk, start):
                    _seeded(index)
                    plans.append(decoding.crop_plan(*decoding.image_size_from_header(path)))
                decoding.decode_batch([decoding.read_bytes(p) for p in chunk], plans, crop, "cuda")
            torch.cuda.synchronize()
            best["nvjpeg"] = min(best["nvjpeg"], time.perf_counter() - tic)
    return {name: len(files) / seconds for name, seconds in best.items()}


def main(args: argparse.Namespace) -> dict[str, float]:
    if args.images < 1 or args.rounds < 1 or args.crop < 8:
        raise ValueError(f"--images {args.images} and --rounds {args.rounds} must be >= 1, "
                         f"--crop {args.crop} >= 8")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        if args.jpegs:
            files = sorted(str(p) for p in Path(args.jpegs).rglob("*")
                           if p.suffix.lower() in (".jpg", ".jpeg"))
            if not files:
                raise ValueError(f"--jpegs {args.jpegs}: no .jpg/.jpeg files under it")
        else:
            files = [str(photo_like_jpeg(Path(scratch) / f"{i}.jpg", *SIZES[i % len(SIZES)], i))
                     for i in range(args.images)]
        kilobytes = np.mean([Path(f).stat().st_size for f in files]) / 1024
        rates = time_paths(files, args.crop, args.rounds, args.batch)
    print(f"CPU: {cpu_model()}; 1 thread; torch {torch.__version__}; {len(files)} JPEGs "
          f"({'from ' + args.jpegs if args.jpegs else 'generated, sizes ' + ', '.join(f'{w}x{h}' for w, h in SIZES)}"
          f"; mean {kilobytes:.0f} kB); crop {args.crop}; fastest of {args.rounds} rounds")
    for name, rate in rates.items():
        unit = "images/s on the GPU (batched)" if name == "nvjpeg" else "images/s per core"
        print(f"  {name:7s} {rate:7.1f} {unit} ({rate / rates['pil']:.2f}x pil)")
    if "nvjpeg" not in rates:
        print("  nvjpeg  not timed: no CUDA GPU here")
    return rates


if __name__ == "__main__":
    run_cli(main, get_args_parser())
