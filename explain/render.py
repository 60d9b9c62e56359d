"""How explanations become the images that distances compare (numpy only, deterministic): the
project's own fast renderers, registered as ``hot_overlay`` and ``jet_overlay`` in
explain/renderers/ (where ``captum_figure`` and ``show_cam_on_image`` give what the paper scored).

The anomaly score is an LPIPS distance between *rendered images*, so the renderer is part of the
measurement: it is the same for every model, documented here, and versioned. Every stored result
records ``RENDERER_VERSION``; bump it whenever any output pixel of this module can change, so old
results are recomputed rather than compared with new ones.

Saliency maps (guided backprop, integrated gradients, guided Grad-CAM), ``saliency_overlay``:
1. reduce over colour channels: sum of absolute values, ``sum_c |a_c|`` (a pixel whose channels
   have gradients of opposite signs still counts as salient; no cancellation);
2. normalise per image: divide by that image's 99th percentile of the map and clip to [0, 1]
   (the scale of gradients differs between models for reasons unrelated to *where* they look).
   Steps 1-2 are the PAIR saliency library's ``VisualizeImageGrayscale`` (used by Adebayo et al.'s
   sanity checks), except that it also subtracts the map's minimum. Captum's
   ``visualize_image_attr`` differs: it sums the channels with their signs, and divides by the
   value below which 98% of the map's total *mass* lies, so a map whose mass sits on a few pixels
   renders as those pixels alone;
3. colour: the fixed ``HOT`` table (black -> red -> yellow -> white, luminance rising with the
   value), indexed by ``round(255 * value)``;
4. overlay: ``(1 - alpha) * grey(image) + alpha * colour``, alpha = 0.8 so the heat dominates
   (captum's ``blended_heat_map`` uses 0.5), the image in grey so that its own colours are not
   read as heat. Every model's render of an image shares the grey part, so with the ``l2`` distance
   alpha cancels out of the anomaly score's ratio (up to uint8 rounding).

Grad-CAM, ``cam_overlay``: the class activation map (pytorch-grad-cam already scales it to
[0, 1] per image) through the fixed ``JET`` table, ``0.5 * colour + 0.5 * image`` in colour,
divided by its maximum: pytorch-grad-cam's ``show_cam_on_image`` with its defaults.

Float images in [0, 1] (Caricatures) become uint8 by ``round(255 * clip(x, 0, 1))``.
"""
from __future__ import annotations

import numpy as np

RENDERER_VERSION = 1

SALIENCY_PERCENTILE = 99.0
SALIENCY_ALPHA = 0.8
CAM_IMAGE_WEIGHT = 0.5
# ITU-R BT.601 luma weights for the grey background.
GREY_WEIGHTS = np.array([0.299, 0.587, 0.114])


def _lut_from_anchors(anchors: dict[str, list[tuple[float, float]]]) -> np.ndarray:
    """A (256, 3) float table in [0, 1] from piecewise-linear (position, value) anchors per channel."""
    positions = np.linspace(0.0, 1.0, 256)
    return np.stack([np.interp(positions, *zip(*anchors[c])) for c in ("red", "green", "blue")], 1)


# matplotlib's "hot" (its segment data), as a fixed table so no plotting library is involved.
HOT = _lut_from_anchors({
    "red": [(0.0, 0.0416), (0.365079, 1.0), (1.0, 1.0)],
    "green": [(0.0, 0.0), (0.365079, 0.0), (0.746032, 1.0), (1.0, 1.0)],
    "blue": [(0.0, 0.0), (0.746032, 0.0), (1.0, 1.0)],
})
# The classic jet (blue -> cyan -> yellow -> red), as OpenCV's COLORMAP_JET that
# pytorch-grad-cam uses: each channel is a trapezoid 1.5 - |4t - k|, clipped to [0, 1].
JET = _lut_from_anchors({
    "red": [(0.0, 0.0), (0.375, 0.0), (0.625, 1.0), (0.875, 1.0), (1.0, 0.5)],
    "green": [(0.0, 0.0), (0.125, 0.0), (0.375, 1.0), (0.625, 1.0), (0.875, 0.0), (1.0, 0.0)],
    "blue": [(0.0, 0.5), (0.125, 1.0), (0.375, 1.0), (0.625, 0.0), (1.0, 0.0)],
})


def to_uint8(images: np.ndarray) -> np.ndarray:
    """Float images in [0, 1] (any shape) -> uint8, rounding to nearest."""
    return np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)


def to_hwc(images: np.ndarray) -> np.ndarray:
    """(N, 3, H, W) -> (N, H, W, 3), float64."""
    images = np.asarray(images, dtype=np.float64)
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images (N, 3, H, W), got shape {images.shape}")
    return images.transpose(0, 2, 3, 1)


def apply_lut(values: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Values in [0, 1], shape (...), -> colours (..., 3) from a (256, 3) table."""
    index = np.round(np.clip(values, 0.0, 1.0) * 255.0).astype(np.int64)
    return lut[index]


def saliency_heat(attributions: np.ndarray, percentile: float = SALIENCY_PERCENTILE) -> np.ndarray:
    """(N, C, H, W) attributions -> (N, H, W) heat in [0, 1]: sum_c |a_c| / per-image percentile."""
    attributions = np.asarray(attributions, dtype=np.float64)
    if attributions.ndim != 4:
        raise ValueError(f"expected attributions (N, C, H, W), got shape {attributions.shape}")
    magnitude = np.abs(attributions).sum(axis=1)
    scale = np.percentile(magnitude.reshape(len(magnitude), -1), percentile, axis=1)
    # An all-zero map (a dead model) stays all zero instead of dividing by zero.
    scale = np.where(scale > 0, scale, 1.0)[:, None, None]
    return np.clip(magnitude / scale, 0.0, 1.0)


def saliency_overlay(attributions: np.ndarray, images: np.ndarray) -> np.ndarray:
    """Attributions (N, C, H, W) over images (N, 3, H, W) in [0, 1] -> uint8 (N, H, W, 3)."""
    heat = saliency_heat(attributions)
    grey = (to_hwc(images) @ GREY_WEIGHTS)[..., None]
    blended = (1.0 - SALIENCY_ALPHA) * grey + SALIENCY_ALPHA * apply_lut(heat, HOT)
    return to_uint8(blended)


def cam_overlay(cams: np.ndarray, images: np.ndarray) -> np.ndarray:
    """Class activation maps (N, H, W) in [0, 1] over images (N, 3, H, W) -> uint8 (N, H, W, 3)."""
    cams = np.asarray(cams, dtype=np.float64)
    if cams.ndim != 3:
        raise ValueError(f"expected CAMs (N, H, W), got shape {cams.shape}")
    blended = (1.0 - CAM_IMAGE_WEIGHT) * apply_lut(cams, JET) + CAM_IMAGE_WEIGHT * to_hwc(images)
    peak = blended.reshape(len(blended), -1).max(axis=1)[:, None, None, None]
    return to_uint8(blended / np.where(peak > 0, peak, 1.0))


def probability_bars(probabilities: np.ndarray, height: int, width: int) -> np.ndarray:
    """Class probabilities (N, K) -> uint8 bar charts (N, height, width, 3).

    Column x shows the classes [x*K/W, (x+1)*K/W) (each class gets a band of columns when K < W):
    a bar from the bottom, as tall as the largest probability among them (so a peak among 1000
    classes stays visible), coloured by class position with ``JET``, on black.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 2:
        raise ValueError(f"expected probabilities (N, K), got shape {probabilities.shape}")
    n, k = probabilities.shape
    first = (np.arange(width) * k) // width
    last = np.maximum(((np.arange(width) + 1) * k) // width, first + 1)  # exclusive, >= 1 class
    column_value = np.stack([probabilities[:, a:b].max(axis=1) for a, b in zip(first, last)], 1)
    bar_top = height - np.round(column_value * height)  # (N, W): rows >= bar_top are filled
    rows = np.arange(height)[None, :, None]
    filled = rows >= bar_top[:, None, :]  # (N, H, W)
    colours = apply_lut((first + 0.5) / k, JET)  # (W, 3)
    return to_uint8(filled[..., None] * colours[None, None])
