"""A random-map control: a smooth random CAM drawn from the image's pixels, the model's key and a
seed, never from what the model computes.

Its Table 1 row estimates the rule's false-positive rate for a method that sees nothing: each
model's maps are an independent draw, so an anomalous model's maps are exchangeable with its n
references' maps, and the rule calls it anomalous about 1/(n + 1) of the time (chance of ranking
first among n + 1). A method whose row is not clearly better than this one's detects nothing the
rule could not flag by chance.

Why the model's key enters the draw: maps drawn from the image and the seed alone would be the
same for every model, so the references' spread would be 0 on every image and every anomaly score
undefined, and the Table 1 row would read "0 detected" for a score that does not exist, not the
chance rate. The key is the model's name in the store, not its weights or outputs, so the map
still carries nothing the model computes. A run without a key (``run(..., model_id=None)``)
draws as if the key were empty: every such run gives the same maps.

Why not pytorch-grad-cam's ``RandomCAM``: it weights the layer's activation channels with random
weights, so its map is a random mix of what the model computes and changes with the model.
Here, the map is a ``grid`` x ``grid`` field of standard normal values, upsampled bilinearly to
the image and scaled to [0, 1] like a CAM (smooth at the scale of a layer-4 CAM: 7 x 7 is
ResNet-50's at 224 px), drawn from numpy's generator seeded by ``seed``, a hash of the model's
key and a hash of the image's float32 pixels: one model's map of one image is always the same,
another model or image gets another draw, and a batch changes nothing.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from counteraudit.explain.base import DEFAULT_RENDERERS, METHODS, AttributionMethod, BatchContext
from counteraudit.train.core.params import at_most
from counteraudit.explain.renderers import CAMS
from counteraudit.train.core import size_bounds as bounds


def words(data: bytes) -> list[int]:
    """Four 32-bit words hashed from ``data`` (seed material)."""
    digest = hashlib.blake2b(data, digest_size=16).digest()
    return [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]


def image_words(image: torch.Tensor) -> list[int]:
    """Four 32-bit words hashed from the image's float32 pixels."""
    return words(image.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())


def random_field(seed: int, model_id: str | None, image: torch.Tensor, grid: int) -> np.ndarray:
    """A (H, W) map in [0, 1]: a grid x grid normal field seeded by the seed, the model's key and
    the image, upsampled and min-max scaled."""
    rng = np.random.default_rng([seed, *words((model_id or "").encode()), *image_words(image)])
    coarse = torch.from_numpy(rng.standard_normal((1, 1, grid, grid)).astype(np.float32))
    field = F.interpolate(coarse, size=tuple(image.shape[-2:]), mode="bilinear",
                          align_corners=False)[0, 0].numpy()
    field = field - field.min()
    return field / max(float(field.max()), 1e-12)


@METHODS.register
class RandomMap(AttributionMethod):
    """Control: a smooth random CAM from the image, the model's key and the seed, never what the
    model computes (module docstring); its Table 1 row estimates the rule's false-positive rate,
    about 1/(n + 1) with n references."""
    name = "random_map"
    version = 2  # in every stored map's key: maps drawn without the model's key are never reused
    default_batch_size = 64
    renders = CAMS

    @dataclass(frozen=True)
    class Params:
        seed: int = 0
        grid: Annotated[int, at_most(bounds.GRID)] = 7  # cells per side of the random field before upsampling
        renderer: str = DEFAULT_RENDERERS[CAMS]
        renderer_options: dict[str, Any] | None = None

        def __post_init__(self) -> None:
            if self.grid < 1:
                raise ValueError(f"method 'random_map': grid = {self.grid} must be >= 1 (cells "
                                 "per side of the random field)")

    def attribute_batch(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                        context: BatchContext) -> torch.Tensor:
        return torch.from_numpy(np.stack([
            random_field(self.params.seed, context.model_id, image, self.params.grid)
            for image in images]))

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        """The maps a run without a model key draws."""
        return self.attribute_batch(model, images, targets, BatchContext(range(len(images))))
