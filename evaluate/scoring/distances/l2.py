"""Root-mean-square pixel difference: the weight-free distance, the demo's (the same on every machine).

    d(a, b) = sqrt(mean over pixels and RGB channels of (a - b)^2) / 255,   in [0, 1]

The L2 baseline of the LPIPS paper (Zhang et al. 2018), on the rendered visualisations. Sums of
squared uint8 differences are exact integers, so the distance is bit-identical however images are
batched or chunked.

Why it, and not SSIM, is the demo's stand-in for LPIPS: a visualisation says *how much* each region
matters, and SSIM's contrast and structure terms are normalised by the local standard deviations,
so a map that keeps the references' layout at a lower gain reads as nearly the same map. That is
exactly what a backdoored model's saliency map looks like on a triggered image: the saturated
trigger dims everything else by the per-image normalisation of the render. L2, like LPIPS's
unnormalised squared feature differences, counts the change in magnitude. SSIM is also unstable on
near-constant renders (probability bars, dark maps), where its local variances are ~0 and a small
reference spread can blow the score up (an outputs-only reference reached a mean score of 175 on
the demo). SSIM remains available (``--distance ssim``) as a robustness check.
"""
from __future__ import annotations

import numpy as np
import torch

from counteraudit.evaluate.scoring.distances.base import (DISTANCES, Features, WeightFreeDistance, check_images,
                                                           chunk_length)


@DISTANCES.register
class L2Distance(WeightFreeDistance):
    name = "l2"

    def features(self, images: np.ndarray) -> Features:
        images = check_images(images, self.name)
        return Features(self.name, (torch.from_numpy(np.ascontiguousarray(images)),),
                        (int(images.shape[1]), int(images.shape[2])))

    def paired(self, features_a: Features, features_b: Features) -> np.ndarray:
        self._check_pair(features_a, features_b)
        (pixels_a,), (pixels_b,) = features_a.tensors, features_b.tensors
        values = pixels_a[0].nelement()
        result = np.empty(len(features_a), dtype=np.float64)
        step = chunk_length(8 * values)
        for start in range(0, len(features_a), step):
            part = slice(start, start + step)
            difference = pixels_a[part].to(torch.int32) - pixels_b[part].to(torch.int32)
            squares = (difference * difference).flatten(1).sum(1, dtype=torch.int64)  # exact
            result[part] = np.sqrt(squares.numpy() / values) / 255.0
        return result
