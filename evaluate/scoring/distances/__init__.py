"""Image distances d(z, z') for the anomaly score, one file per distance, registered on import.

Adding a distance takes one new file in this folder that subclasses ``Distance`` and decorates it
with ``@DISTANCES.register``; ``DISTANCES`` imports every module here on first lookup, so nothing
else changes.

    distance = build_distance("lpips-alex", weights_dir="~/weights")
    feats = {model: distance.features(images[model]) for model in images}   # one pass per image
    d = distance.paired(feats["g1"], feats["g2"])                            # (N,) from the cache
"""
from __future__ import annotations

from counteraudit.evaluate.scoring.distances.backbone_weights import MissingBackboneWeightsError
from counteraudit.evaluate.scoring.distances.base import DISTANCES, Distance, Features

DEFAULT_DISTANCE = "lpips-alex"  # the paper's main-text distance
WEIGHT_FREE_FALLBACK = "l2"


def build_distance(name: str = DEFAULT_DISTANCE, **options) -> Distance:
    """An instance of the registered distance ``name``; options go to its constructor
    (LPIPS: weights_dir, download, random_backbone, seed, device, batch_size)."""
    return DISTANCES.get(name)(**options)


def available(name: str, weights_dir: str | None = None, download: bool = True) -> bool:
    """Whether ``name`` can be built on this machine (LPIPS: its backbone weights can be found or
    downloaded). Drivers use it to fall back to ``WEIGHT_FREE_FALLBACK`` only when the user did not
    ask for LPIPS explicitly; an explicit request should call ``build_distance`` and let it raise."""
    return DISTANCES.get(name).available(weights_dir=weights_dir, download=download)


def resolve_distance_name(requested: str | None, weights_dir: str | None = None,
                          download: bool = True) -> tuple[str, str | None]:
    """The distance to use and, when it differs from the default, why.

    ``requested`` None means the user did not choose: the default if available, else the weight-free
    fallback with a note to print. An explicit request is returned as is (building it raises
    ``MissingBackboneWeightsError`` with the fix when weights are missing): never a silent swap.
    """
    if requested is not None:
        DISTANCES.get(requested)  # unknown names fail here, listing the valid ones
        return requested, None
    if available(DEFAULT_DISTANCE, weights_dir, download):
        return DEFAULT_DISTANCE, None
    return WEIGHT_FREE_FALLBACK, (f"backbone weights for {DEFAULT_DISTANCE} are missing, so scores use "
                                  f"{WEIGHT_FREE_FALLBACK!r}; request --distance {DEFAULT_DISTANCE} to "
                                  f"see how to install them")


__all__ = ["DISTANCES", "DEFAULT_DISTANCE", "WEIGHT_FREE_FALLBACK", "Distance", "Features",
           "MissingBackboneWeightsError", "available", "build_distance", "resolve_distance_name"]
