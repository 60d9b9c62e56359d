"""How the ImageNet world turns JPEG files into training crops: three paths, chosen by the world's
``decode`` option.

- ``pil``: PIL decodes, torchvision.transforms crops and flips the PIL image (torchvision's
  reference recipe, and the default).
- ``tensor``: torchvision.io decodes to a uint8 tensor (libjpeg-turbo), transforms.v2 crops and
  flips the tensor (images/s per core of each path: evaluate/benchmarks/decode.py, evaluate/benchmarks/README.md).
- ``nvjpeg``: the loader workers read only the file bytes and draw each image's crop box from its
  header's size; the main process decodes the whole batch on the GPU at once
  (``decode_jpeg(list, device="cuda")``) and crops and flips it there. Where CUDA is absent it
  says so once and uses ``tensor``.

torchvision 0.29 marks torchvision.io's decoders deprecated in favour of TorchCodec (a
DeprecationWarning, which Python shows only under test runners); they are what the benchmark in
evaluate/benchmarks/README.md lists, and a TorchCodec path would be one more entry here.

Every path draws the crop box and the flip from the same seeded RNG with the same calls in the
same order, so a given (seed, epoch, image) gets the same box and flip whichever path decodes it;
the pixels then differ only by the decoders' and resamplers' rounding (tests/test_decoding.py
bounds it). Evaluation images (val, image sets, explanations) always take the PIL path, so every
model is measured and explained on the same pixels.

Every path reads a file as 8-bit RGB the same way (train/core/image_files.py): a 16-bit PNG's
samples scaled to 8 bits (``load_rgb``, ``to_uint8``), a file of more pixels than
``image_files.MAX_PIXELS`` refused, naming it.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from counteraudit.train.core.image_files import header_size, open_rgb, to_8bit, to_rgb

DECODE_PATHS = ("pil", "tensor", "nvjpeg")
# torchvision's RandomResizedCrop defaults (the paper's recipe).
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
_JPEG_MAGIC = b"\xff\xd8"
_fallback_said = False


def check_decode(decode: str) -> str:
    if decode not in DECODE_PATHS:
        raise ValueError(f"imagenet world: decode = {decode!r} is not a decoding path; valid: "
                         f"{', '.join(DECODE_PATHS)} ('tensor' on CPUs, 'nvjpeg' on GPUs)")
    return decode


def effective_decode(decode: str, pil_transform: Callable | None) -> str:
    """The path a split actually takes: nvjpeg needs CUDA (else tensor, said once), and a change
    made on PIL images before cropping (blurred faces) needs a CPU decode (tensor)."""
    global _fallback_said
    if decode != "nvjpeg":
        return decode
    if not torch.cuda.is_available():
        if not _fallback_said:
            print("counteraudit: decode = 'nvjpeg' decodes on a CUDA GPU, and this machine has "
                  "none; decoding on the CPU instead (decode = 'tensor')", file=sys.stderr,
                  flush=True)
            _fallback_said = True
        return "tensor"
    return "tensor" if pil_transform is not None else "nvjpeg"


def batch_device() -> torch.device:
    """Where the nvjpeg path decodes: this process's GPU (a DDP process's own)."""
    return torch.device("cuda", torch.cuda.current_device())


# ---------------------------------------------------------------- crop draws
def pil_crop(image: Image.Image, size: int) -> torch.Tensor:
    """PIL path: random-resized crop and flip from the global torch RNG, float CHW in [0, 1]."""
    return T.Compose([T.RandomResizedCrop(size, CROP_SCALE, CROP_RATIO), T.RandomHorizontalFlip(),
                      T.ToTensor()])(image)


def tensor_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """Tensor path: the same draws as ``pil_crop`` (transforms.v2 makes the same RNG calls), on
    a uint8 CHW tensor; float CHW in [0, 1]."""
    return v2.Compose([v2.RandomResizedCrop(size, CROP_SCALE, CROP_RATIO, antialias=True),
                       v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])(image)


def crop_plan(height: int, width: int) -> tuple[int, int, int, int, bool]:
    """(top, left, height, width, flip) as ``pil_crop`` would draw them for an image of this size,
    without the image: the nvjpeg path draws in the loader workers and crops after decoding."""
    top, left, h, w = T.RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(1, height, width),
                                                     list(CROP_SCALE), list(CROP_RATIO))
    return top, left, h, w, bool(torch.rand(1) < 0.5)


# ---------------------------------------------------------------- decoding
def load_rgb(path: str) -> Image.Image:
    """PIL path: a file decoded whole to 8-bit RGB (``image_files.open_rgb``); the ImageNet
    world's ImageFolder loader."""
    return open_rgb(path)


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """A decoded tensor as uint8: torchvision.io gives a 16-bit PNG as uint16, scaled here to
    8 bits as ``image_files.to_rgb`` scales it on the PIL path."""
    if image.dtype == torch.uint8:
        return image
    return torch.from_numpy(to_8bit(image.numpy() if image.device.type == "cpu" else image.cpu().numpy()))


def read_rgb(path: str) -> torch.Tensor:
    """A file decoded to uint8 RGB CHW by torchvision.io (JPEG, and the few PNGs named .JPEG);
    one of more than ``MAX_PIXELS`` pixels is refused from its header."""
    image_size_from_header(path)
    return to_uint8(decode_image(read_file(path), mode=ImageReadMode.RGB))


def read_bytes(path: str) -> bytes:
    """A file's bytes, as plain bytes: a loader worker sends them to the main process by value
    (torchvision.io.read_file's tensors cannot be shared across processes: their storage has no
    file descriptor to pass, and the worker dies with EBADF)."""
    with open(path, "rb") as handle:
        return handle.read()


def image_size_from_header(path: str) -> tuple[int, int]:
    """(height, width) from the file's header, without decoding it; a file of more than
    ``MAX_PIXELS`` pixels is refused (``image_files.header_size``)."""
    width, height = header_size(path)
    return height, width


def to_pil(image: torch.Tensor) -> Image.Image:
    return Image.fromarray(image.permute(1, 2, 0).contiguous().numpy())


def from_pil(image: Image.Image) -> torch.Tensor:
    return F.pil_to_tensor(to_rgb(image))


def decode_batch(files: list[bytes], plans: list[tuple[int, int, int, int, bool]],
                 size: int, device: torch.device | str) -> torch.Tensor:
    """nvjpeg path: the batch's file bytes decoded together on ``device`` (one nvjpeg call on
    CUDA), each cropped to its planned box, resized to ``size`` and flipped there; float NCHW in
    [0, 1]. Files that are not JPEG (ImageNet has a few PNGs named .JPEG) decode on the CPU."""
    device = torch.device(device)
    jpeg = [i for i, data in enumerate(files) if data[:2] == _JPEG_MAGIC]
    files = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in files]
    decoded: list[Any] = [None] * len(files)
    if jpeg:
        images = decode_jpeg([files[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)
        for i, image in zip(jpeg, images):
            decoded[i] = image
    for i in set(range(len(files))) - set(jpeg):
        decoded[i] = to_uint8(decode_image(files[i], mode=ImageReadMode.RGB)).to(device)
    crops = []
    for image, (top, left, h, w, flip) in zip(decoded, plans):
        crop = F.resized_crop(image, top, left, h, w, [size, size], antialias=True)
        crops.append(F.horizontal_flip(crop) if flip else crop)
    return torch.stack(crops).float().div_(255)

