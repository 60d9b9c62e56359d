"""What every image distance provides: features computed once per visualisation, distances from them.

The anomaly score compares every model's visualisation of an image with every reference's. Running a
backbone once per *pair* (the original code's way, ``lpips.LPIPS()(a, b)``) repeats the same forward
pass dozens of times; here a distance first turns a batch of rendered images into cached
``Features`` (one pass per image), and ``paired``/``pairwise`` only combine cached features.
"""
from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
import torch

from counteraudit.train.core.registry import Registry
from counteraudit.train.core.threads import torch_threads

# Image distances: one module each in this package, imported on the first lookup.
DISTANCES: Registry = Registry("distance", plugins="counteraudit.evaluate.scoring.distances")

__all__ = ["DISTANCES", "DEFAULT_CHUNK_BYTES", "Distance", "Features", "WeightFreeDistance",
           "check_images", "chunk_length"]

# Bounds the temporary (difference) tensors a distance allocates while combining features, so
# 224x224 VGG features of many images never need one huge intermediate.
DEFAULT_CHUNK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Features:
    """Cached per-image features of one distance. Every tensor's first axis is the image."""

    distance: str  # name of the distance that made them; mixing two distances' features is an error
    tensors: tuple[torch.Tensor, ...]
    image_size: tuple[int, int]  # (H, W) of the rendered images they came from

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.element_size() * t.nelement() for t in self.tensors)

    def select(self, index: Sequence[int] | slice | np.ndarray) -> "Features":
        """The features of a subset of the images, in the given order."""
        if not isinstance(index, slice):
            index = torch.as_tensor(np.asarray(index, dtype=np.int64))
        return Features(self.distance, tuple(t[index] for t in self.tensors), self.image_size)

    def broadcast_one(self, position: int, count: int) -> "Features":
        """Image ``position`` repeated ``count`` times, as views (no copy), for pairwise rows."""
        return Features(self.distance,
                        tuple(t[position:position + 1].expand(count, *t.shape[1:]) for t in self.tensors),
                        self.image_size)

    @staticmethod
    def concat(parts: Sequence["Features"]) -> "Features":
        if not parts:
            raise ValueError("Features.concat needs at least one Features object")
        first = parts[0]
        for part in parts[1:]:
            if part.distance != first.distance or part.image_size != first.image_size:
                raise ValueError(f"cannot concatenate features of {part.distance!r} {part.image_size} "
                                 f"with {first.distance!r} {first.image_size}")
        return Features(first.distance,
                        tuple(torch.cat(group) for group in zip(*(p.tensors for p in parts))),
                        first.image_size)


# The CPU threads every distance computes on. Its bits must not depend on the machine's cores: with
# more threads, ATen splits a sum over an image's values into per-thread partial sums and oneDNN
# splits some convolutions, so lpips-squeeze and lpips-vgg gave other distances on 2, 3, 4, 8 ...
# threads than on one (96 px and up; lpips-alex, l2 and ssim the same there). The score stage's
# workers spread the tables over the cores instead.
DISTANCE_THREADS = 1


def _on_distance_threads(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with torch_threads(DISTANCE_THREADS):
            return method(*args, **kwargs)
    return wrapped


class Distance(ABC):
    """An image distance d(z, z'). Subclasses register themselves in ``DISTANCES`` under ``name``.

    ``features``, ``paired`` and ``pairwise`` of every subclass (a plug-in's too) run on
    ``DISTANCE_THREADS`` CPU threads, so one commit gives the same distances on any machine."""

    name: ClassVar[str]
    needs_weights: ClassVar[bool] = False  # True when the distance needs downloadable backbone weights

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("features", "paired", "pairwise"):
            method = cls.__dict__.get(name)  # its own: an inherited one is wrapped already
            if callable(method):
                setattr(cls, name, _on_distance_threads(method))

    @classmethod
    def available(cls, weights_dir: str | None = None, download: bool = False) -> bool:
        """Whether this distance can be built here (weight-free distances always can)."""
        return True

    @abstractmethod
    def features(self, images: np.ndarray) -> Features:
        """Features of rendered images, a uint8 array (N, H, W, 3); one backbone pass per image."""

    @abstractmethod
    def paired(self, features_a: Features, features_b: Features) -> np.ndarray:
        """d(a_k, b_k) for k = 0..N-1, shape (N,), float64."""

    def pairwise(self, features_a: Features, features_b: Features) -> np.ndarray:
        """d(a_i, b_j) for every i, j, shape (Na, Nb), float64; rows reuse ``paired`` on views."""
        self._check_features(features_a)
        self._check_features(features_b)
        result = np.empty((len(features_a), len(features_b)), dtype=np.float64)
        for row in range(len(features_a)):
            result[row] = self.paired(features_a.broadcast_one(row, len(features_b)), features_b)
        return result

    # -- helpers for subclasses -------------------------------------------------------------
    def _check_features(self, features: Features) -> None:
        if not isinstance(features, Features):
            raise TypeError(f"{self.name}: expected Features from {type(self).__name__}.features(), "
                            f"got {type(features).__name__}")
        if features.distance != self.name:
            raise ValueError(f"features were made by distance {features.distance!r}, not {self.name!r}; "
                             f"compute them with this distance's features()")

    def _check_pair(self, features_a: Features, features_b: Features) -> None:
        self._check_features(features_a)
        self._check_features(features_b)
        if len(features_a) != len(features_b):
            raise ValueError(f"{self.name}.paired needs the same number of images on both sides, got "
                             f"{len(features_a)} and {len(features_b)}; use pairwise() for all pairs")
        if features_a.image_size != features_b.image_size:
            raise ValueError(f"{self.name}: image sizes differ ({features_a.image_size} vs "
                             f"{features_b.image_size}); render every model's visualisations at one size")


class WeightFreeDistance(Distance):
    """A distance computed from the pixels alone. It takes the LPIPS options and ignores them, so a
    driver can build any distance with one call; any other option is a typo and fails."""

    IGNORED_OPTIONS = frozenset({"weights_dir", "download", "random_backbone", "seed", "device", "batch_size"})

    def __init__(self, **options):
        unknown = sorted(set(options) - self.IGNORED_OPTIONS)
        if unknown:
            raise TypeError(f"{self.name} got unknown options {unknown}; it takes none "
                            f"(accepted and ignored: {sorted(self.IGNORED_OPTIONS)})")


def check_images(images: np.ndarray, distance_name: str, min_size: int = 1) -> np.ndarray:
    """Rendered visualisations must be uint8 (N, H, W, 3); say exactly what is wrong otherwise."""
    images = np.asarray(images)
    if images.ndim == 3 and images.shape[-1] == 3:
        raise ValueError(f"{distance_name}: got one image of shape {images.shape}; pass a batch "
                         f"(N, H, W, 3), e.g. images[None]")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"{distance_name}: images must have shape (N, H, W, 3), got {images.shape}")
    if images.dtype != np.uint8:
        raise ValueError(f"{distance_name}: images must be uint8 renders in 0..255, got dtype "
                         f"{images.dtype}; convert with (np.clip(x, 0, 1) * 255).round().astype(np.uint8)")
    if len(images) == 0:
        raise ValueError(f"{distance_name}: got an empty batch of images")
    if min(images.shape[1:3]) < min_size:
        raise ValueError(f"{distance_name}: images of {images.shape[1]}x{images.shape[2]} are too "
                         f"small; this distance needs at least {min_size}x{min_size}")
    return images


def chunk_length(bytes_per_item: int, budget: int = DEFAULT_CHUNK_BYTES) -> int:
    return max(1, budget // max(1, bytes_per_item))

