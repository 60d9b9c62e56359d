"""A model-blind control: the Sobel gradient magnitude of the image, the same for every model.

It never looks at the model, so every reference pair's maps are identical and every anomaly score
undefined (0 / 0): detection is impossible by construction, and the scoring tables flag it as
model-blind instead of ranking it (evaluate/scoring/model_blind.py). Localization can still work
where an abnormal input is visibly different (a backdoor trigger has strong edges): Table 2 then
measures what the image alone gives away, the baseline Casper et al. (2023) and XAI-TRIS found
edge detectors set for attribution methods. The map is rendered as a CAM (min-max scaled to
[0, 1] per image) so the distance compares it like Grad-CAM's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from counteraudit.explain.base import METHODS, AttributionMethod
from counteraudit.train.core.params import NoParams
from counteraudit.explain.renderers import CAMS

SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


def sobel_magnitude(images: torch.Tensor) -> torch.Tensor:
    """(n, 3, H, W) images -> (n, H, W) Sobel gradient magnitude of their grey level, in [0, 1]
    per image (a constant image gives zeros)."""
    grey = images.detach().to("cpu", torch.float32).mean(dim=1, keepdim=True)
    kernels = torch.stack([SOBEL_X, SOBEL_X.T])[:, None]
    gradients = F.conv2d(F.pad(grey, (1, 1, 1, 1), mode="replicate"), kernels)
    magnitude = gradients.pow(2).sum(dim=1).sqrt()
    low = magnitude.amin(dim=(1, 2), keepdim=True)
    span = magnitude.amax(dim=(1, 2), keepdim=True) - low
    return (magnitude - low) / span.clamp_min(1e-12)


@METHODS.register
class EdgeMap(AttributionMethod):
    """Control: Sobel edges of the input, ignoring the model on purpose (module docstring)."""
    name = "edge_map"
    default_batch_size = 64
    renders = CAMS
    Params = NoParams

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        return sobel_magnitude(images)
