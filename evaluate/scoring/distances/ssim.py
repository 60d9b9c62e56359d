"""1 - SSIM (Wang et al. 2004): a weight-free distance for machines without LPIPS backbone weights.

Gaussian window (sigma 1.5, 11 taps), K1 = 0.01, K2 = 0.03, data range 255, per RGB channel, averaged
over channels and over the window positions that fit inside the image (no padding). This is
skimage's ``structural_similarity(a, b, channel_axis=-1, data_range=255, gaussian_weights=True,
sigma=1.5, use_sample_covariance=False)``. The features cache each image's local means and second
moments, so a pair only costs the local mean of a*b.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from counteraudit.evaluate.scoring.distances.base import (DISTANCES, Features, WeightFreeDistance, check_images,
                                                           chunk_length)

SIGMA = 1.5
RADIUS = 5  # scipy's gaussian_filter with truncate=3.5 at sigma 1.5, as skimage uses
K1, K2 = 0.01, 0.03
DATA_RANGE = 255.0


def gaussian_taps(sigma: float = SIGMA, radius: int = RADIUS) -> torch.Tensor:
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    taps = torch.exp(-0.5 * (offsets / sigma) ** 2)
    return taps / taps.sum()


def local_mean(images: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian mean over 'valid' positions of (N, C, H, W) float64 images."""
    channels = images.shape[1]
    across_rows = taps.view(1, 1, -1, 1).expand(channels, 1, -1, 1).contiguous()
    across_cols = taps.view(1, 1, 1, -1).expand(channels, 1, 1, -1).contiguous()
    return F.conv2d(F.conv2d(images, across_rows, groups=channels), across_cols, groups=channels)


@DISTANCES.register
class SSIMDistance(WeightFreeDistance):
    name = "ssim"

    def __init__(self, **options):
        super().__init__(**options)
        self.taps = gaussian_taps()
        self.c1 = (K1 * DATA_RANGE) ** 2
        self.c2 = (K2 * DATA_RANGE) ** 2

    def features(self, images: np.ndarray) -> Features:
        images = check_images(images, self.name, min_size=2 * RADIUS + 1)
        pixels = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).double()
        mean = local_mean(pixels, self.taps)
        second_moment = local_mean(pixels * pixels, self.taps)
        return Features(self.name, (pixels, mean, second_moment),
                        (int(images.shape[1]), int(images.shape[2])))

    def paired(self, features_a: Features, features_b: Features) -> np.ndarray:
        self._check_pair(features_a, features_b)
        pixels_a, mean_a, moment_a = features_a.tensors
        pixels_b, mean_b, moment_b = features_b.tensors
        result = np.empty(len(features_a), dtype=np.float64)
        step = chunk_length(8 * pixels_a[0].nelement() * 4)
        for start in range(0, len(features_a), step):
            part = slice(start, start + step)
            mu_a, mu_b = mean_a[part], mean_b[part]
            covariance = local_mean(pixels_a[part] * pixels_b[part], self.taps) - mu_a * mu_b
            variance_a = moment_a[part] - mu_a * mu_a
            variance_b = moment_b[part] - mu_b * mu_b
            ssim_map = ((2 * mu_a * mu_b + self.c1) * (2 * covariance + self.c2)
                        / ((mu_a * mu_a + mu_b * mu_b + self.c1) * (variance_a + variance_b + self.c2)))
            result[part] = (1.0 - ssim_map.mean(dim=(1, 2, 3))).numpy()
        return result
