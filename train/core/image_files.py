"""One image file of a user's folder, decoded the one way every reader uses: whole (a truncated
file fails here, not half-read), bounded in pixels (a decompression bomb is refused from its
header, before it is decoded), and converted to 8-bit RGB with 16-bit samples scaled to 8 bits
(PIL's own ``convert("RGB")`` clips them, so a 16-bit PNG turned white).

The check of an ``[image_sets]`` folder at suite load (train/core/image_folders.py), the set read
from it, and the ImageNet world's decoders (train/worlds/decoding.py) all go through here, so
what the check passes is what training and explaining read.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from PIL import Image

# PIL's own default bound (Image.MAX_IMAGE_PIXELS, 89.5 megapixels, about 268 MB as RGB): more
# than any photo this benchmark reads, far less than a bomb's gigapixels. Held here so no other
# setting of PIL's global lifts it.
MAX_PIXELS = 89_478_485
SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})
_SIXTEEN_BIT_MAX = 65535
# What a decoder raises on a file it cannot read (UnidentifiedImageError is an OSError; a bad
# PNG chunk can surface as SyntaxError, a short file as EOFError).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


class ImageFileError(ValueError):
    """An image file that cannot be read as an 8-bit RGB image; the message names it and why."""


def to_8bit(values: np.ndarray) -> np.ndarray:
    """16-bit samples (0..65535) as 8-bit ones, rounded: 65535 -> 255, v * 257 -> v."""
    return ((values.astype(np.uint32) * 255 + _SIXTEEN_BIT_MAX // 2) // _SIXTEEN_BIT_MAX).astype(np.uint8)


def to_rgb(image: Image.Image, path: str | os.PathLike = "the image") -> Image.Image:
    """``image`` as 8-bit RGB: 16-bit grey (PIL modes I;16*, and I as PNG's 16-bit grey opens
    in older PIL) scaled to 8 bits; every other mode by PIL's ``convert``."""
    if image.mode not in SIXTEEN_BIT_MODES:
        return image.convert("RGB")
    values = np.asarray(image)
    if values.size and (values.min() < 0 or values.max() > _SIXTEEN_BIT_MAX):
        raise ImageFileError(f"{path} holds {image.mode}-mode samples outside 0..65535 "
                             f"({values.min()}..{values.max()}); save it as an 8- or 16-bit "
                             "PNG or a JPEG")
    return Image.fromarray(to_8bit(values), "L").convert("RGB")


def open_rgb(path: str | os.PathLike) -> Image.Image:
    """The file decoded whole, as 8-bit RGB (``to_rgb``); an ImageFileError naming the file and
    what is wrong: not an image, corrupt, truncated, or more than ``MAX_PIXELS`` pixels."""
    with _decode_errors_named(path), _opened(path) as image:
        image.load()
        return to_rgb(image, path)


def header_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) from the file's header, not decoded; an ImageFileError as ``open_rgb``'s
    for a file that is not an image or has more than ``MAX_PIXELS`` pixels."""
    with _decode_errors_named(path), _opened(path) as image:
        return image.size


@contextmanager
def _opened(path: str | os.PathLike) -> Iterator[Image.Image]:
    """The file opened by PIL (its header read), refused when it has more than ``MAX_PIXELS``."""
    with warnings.catch_warnings():  # PIL warns from half its own bound: the check below says it
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(path) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise ImageFileError(f"{path} is {width}x{height} px ({width * height:,} pixels), "
                                     f"more than the {MAX_PIXELS:,} an image may decode to (a "
                                     "decompression bomb, or far larger than any image this "
                                     "benchmark reads): remove it or shrink it")
            yield image


@contextmanager
def _decode_errors_named(path: str | os.PathLike) -> Iterator[None]:
    """What PIL raises on a file it cannot read, as an ImageFileError naming the file."""
    try:
        yield
    except Image.DecompressionBombError as error:  # over twice PIL's bound: refused by PIL's open
        raise ImageFileError(f"{path} is refused as a decompression bomb (PIL: {error}); an image "
                             f"may decode to at most {MAX_PIXELS:,} pixels: remove it or shrink "
                             "it") from None
    except ImageFileError:
        raise
    except _DECODE_ERRORS as error:
        raise ImageFileError(f"{path} cannot be decoded ({type(error).__name__}: {error}); it is "
                             "corrupt, truncated or not a PNG/JPEG: replace or remove it") from None
