"""The ImageNet world's decoding paths (train/worlds/decoding.py) on JPEGs generated here: the
same crop box and flip from the same draw on every path, pixels within rounding of each other."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from counteraudit.evaluate.benchmarks.decode import get_args_parser, main
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world, decoding

pytestmark = pytest.mark.timeout(120)  # a loader worker that dies leaves the loader waiting

SIZES = [(500, 375), (375, 500), (333, 500), (120, 90)]


def smooth_jpeg(path: Path, width: int, height: int, seed: int, quality: int = 90) -> Path:
    """A photo-like JPEG: colour gradients and filled ellipses. Smooth, so resampling rounding
    stays small, yet a crop one pixel off or unflipped changes many pixels a lot."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x / width, y / height, (x + y) / (width + height)], -1) * 255
    image = Image.fromarray(pixels.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(8):
        x0, y0 = int(rng.integers(0, width - 10)), int(rng.integers(0, height - 10))
        draw.ellipse([x0, y0, x0 + int(rng.integers(5, width // 2)), y0 + int(rng.integers(5, height // 2))],
                     fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="JPEG", quality=quality)
    return path


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("jpegs")
    return [smooth_jpeg(base / f"{i}.JPEG", w, h, i) for i, (w, h) in enumerate(SIZES)]


@pytest.fixture(scope="module")
def imagefolder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("decode") / "imagenet"
    for split, count in (("train", 4), ("val", 1)):
        for c in range(2):
            for i in range(count):
                w, h = SIZES[(i + c) % len(SIZES)]
                smooth_jpeg(root / split / f"n0{c}" / f"{i}.JPEG", w // 4, h // 4, 10 * c + i)
    return root


def test_every_path_draws_the_same_box_and_flip_and_agrees_within_rounding(jpegs):
    for path in jpegs:
        pil_image = Image.open(path).convert("RGB")
        tensor_image = decoding.read_rgb(str(path))
        # the decoders themselves: torchvision.io's libjpeg-turbo and PIL's give the same pixels
        assert torch.equal(torch.from_numpy(np.array(pil_image)).permute(2, 0, 1), tensor_image)
        for seed in range(4):
            torch.manual_seed(seed)
            pil = decoding.pil_crop(pil_image, 64)
            torch.manual_seed(seed)
            tensor = decoding.tensor_crop(tensor_image, 64)
            torch.manual_seed(seed)
            plan = decoding.crop_plan(tensor_image.shape[1], tensor_image.shape[2])
            nvjpeg = decoding.decode_batch([decoding.read_bytes(str(path))], [plan], 64, "cpu")[0]
            # PIL's and torchvision's antialiased bilinear resize round apart by one level at most
            assert float((pil - tensor).abs().max()) <= 1 / 255 + 1e-6, (path, seed)
            assert float((pil - tensor).abs().mean()) < 1e-3
            # the batched (GPU) path, run here on the CPU: the same box, flip and resize
            assert float((nvjpeg - tensor).abs().max()) <= 1e-6
            # and a different draw is a different crop: the comparison can tell
            torch.manual_seed(seed + 100)
            assert float((decoding.tensor_crop(tensor_image, 64) - tensor).abs().mean()) > 0.01


def test_batches_of_the_tensor_path_match_the_pil_path(imagefolder, capsys, monkeypatch):
    monkeypatch.setattr(decoding, "_fallback_said", False)

    def batches(decode: str) -> list:
        world = build_world({"name": "imagenet", "root": str(imagefolder), "image_size": 32,
                             "resize_size": 36, "num_workers": 0, "decode": decode})
        return list(world.split("train").train_batches(4, seed=7, epoch=2))
    pil, tensor = batches("pil"), batches("tensor")
    assert len(pil) == len(tensor) == 2
    for a, b in zip(pil, tensor):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.labels, b.labels)
        assert float((a.images - b.images).abs().max()) <= 1 / 255 + 1e-6
    if torch.cuda.is_available():  # the batched GPU decode: the same crops, to rounding
        for a, b in zip(tensor, batches("nvjpeg")):
            assert float((a.images - b.images.cpu()).abs().max()) <= 2 / 255
    else:  # the CPU's tensor path instead, said once however many epochs ask
        assert all(torch.equal(a.images, b.images) for a, b in zip(tensor, batches("nvjpeg")))
        batches("nvjpeg")
        assert capsys.readouterr().err.count(
            "decode = 'nvjpeg' decodes on a CUDA GPU, and this machine has none; decoding on the "
            "CPU instead (decode = 'tensor')") == 1


def test_a_decode_option_on_the_synthetic_world_is_one_clear_error(tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text('name = "bad"\n[world]\nname = "synthetic"\ndecode = "tensor"\n')
    with pytest.raises(ValueError, match="synthetic world .* no JPEG files to decode; remove decode"):
        load_suite(suite)


def test_an_unknown_decode_path_is_named(imagefolder, tmp_path):
    suite = tmp_path / "bad.toml"
    suite.write_text(f'name = "bad"\n[world]\nname = "imagenet"\nroot = "{imagefolder}"\n'
                     'decode = "turbo"\n')
    with pytest.raises(ValueError, match="decode = 'turbo' is not a decoding path; valid: pil, "
                                         "tensor, nvjpeg"):
        load_suite(suite)


def test_decode_benchmark_times_each_path_on_generated_and_given_jpegs(jpegs, tmp_path, capsys):
    rates = main(get_args_parser().parse_args(["--images", "3", "--rounds", "1", "--crop", "32"]))
    assert set(rates) == {"pil", "tensor"} | ({"nvjpeg"} if torch.cuda.is_available() else set())
    assert all(rate > 0 for rate in rates.values())
    assert "images/s per core" in capsys.readouterr().out
    rates = main(get_args_parser().parse_args(["--jpegs", str(jpegs[0].parent), "--rounds", "1"]))
    assert "4 JPEGs (from" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .jpg/.jpeg files under it"):
        main(get_args_parser().parse_args(["--jpegs", str(tmp_path / "empty")]))


def test_a_change_made_on_pil_images_applies_on_the_tensor_path_too(imagefolder):
    """Blurred faces change the image in original pixels before cropping (a PIL-level change):
    the tensor path makes it too, and its crops still match the PIL path's."""
    def paint(image: Image.Image, index: int) -> Image.Image:
        image = image.copy()
        ImageDraw.Draw(image).rectangle([0, 0, image.width // 2, image.height // 2],
                                        fill=(255, 0, 255 * (index % 2)))
        return image

    def batches(decode: str) -> list:
        world = build_world({"name": "imagenet", "root": str(imagefolder), "image_size": 32,
                             "resize_size": 36, "num_workers": 0, "decode": decode})
        return list(world.split("train").with_pil_transform(paint).train_batches(8, seed=1, epoch=0))
    unpainted = build_world({"name": "imagenet", "root": str(imagefolder), "image_size": 32,
                             "resize_size": 36, "num_workers": 0, "decode": "tensor"})
    plain = next(unpainted.split("train").train_batches(8, seed=1, epoch=0))
    pil, tensor = batches("pil")[0], batches("tensor")[0]
    assert float((pil.images - tensor.images).abs().max()) <= 1 / 255 + 1e-6
    assert float((tensor.images - plain.images).abs().mean()) > 0.05  # the change was made


def test_the_nvjpeg_loader_plumbing_matches_the_tensor_path(imagefolder, monkeypatch):
    """The nvjpeg path's loader (bytes and crop plans from the workers, one batched decode in the
    main process), run with the batch decoded on the CPU since no GPU is here: the same batches
    as the tensor path. (On a GPU only the device differs.)"""
    def batches(decode: str, workers: int) -> list:
        world = build_world({"name": "imagenet", "root": str(imagefolder), "image_size": 32,
                             "resize_size": 36, "num_workers": workers, "decode": decode})
        return list(world.split("train").train_batches(3, seed=4, epoch=1, part=(1, 2)))
    tensor = batches("tensor", 0)
    monkeypatch.setattr(decoding, "effective_decode", lambda decode, pil_transform: decode)
    monkeypatch.setattr(decoding, "batch_device", lambda: torch.device("cpu"))
    nvjpeg = batches("nvjpeg", 2)
    assert len(tensor) == len(nvjpeg) == 2
    for a, b in zip(tensor, nvjpeg):
        assert torch.equal(a.indices, b.indices) and (a.offset, a.global_size) == (b.offset, b.global_size)
        assert float((a.images - b.images).abs().max()) <= 1e-6
