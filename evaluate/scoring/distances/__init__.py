"""Image distances d(z, z') for the anomaly score, one file per distance, registered on import.

Adding a distance takes one new file in this folder that subclasses ``Distance`` and decorates it
with ``@DISTANCES.register``; ``DISTANCES`` imports every module here on first lookup, so nothing
else changes.

    distance = build_distance("lpips-alex", weights_dir="~/weights")  # or download=True
    feats = {model: distance.features(images[model]) for model in images}   # one pass per image
    d = distance.paired(feats["g1"], feats["g2"])                            # (N,) from the cache
"""
from __future__ import annotations

from counteraudit.evaluate.scoring.distances.backbone_weights import MissingBackboneWeightsError
from counteraudit.evaluate.scoring.distances.base import DISTANCES, Distance, Features

PAPER_DISTANCE = "lpips-alex"  # the paper's main-text distance


def build_distance(name: str = PAPER_DISTANCE, **options) -> Distance:
    """An instance of the registered distance ``name``; options go to its constructor
    (LPIPS: weights_dir, download, random_backbone, seed, device, batch_size). LPIPS downloads
    its backbone weights only with ``download=True``; without them it raises
    ``MissingBackboneWeightsError`` with the fix."""
    return DISTANCES.get(name)(**options)


def available(name: str, weights_dir: str | None = None, download: bool = False) -> bool:
    """Whether ``name`` can be built on this machine (LPIPS: its backbone weights are here, or,
    with ``download``, can be downloaded)."""
    return DISTANCES.get(name).available(weights_dir=weights_dir, download=download)


__all__ = ["DISTANCES", "PAPER_DISTANCE", "Distance", "Features", "MissingBackboneWeightsError",
           "available", "build_distance"]
