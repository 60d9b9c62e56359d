"""Guided Backpropagation (Springenberg et al. 2015) with captum's ``GuidedBackprop``."""
from __future__ import annotations

import torch
from captum.attr import GuidedBackprop as CaptumGuidedBackprop
from torch import nn

from counteraudit.explain.base import AttributionMethod, register_method


@register_method
class GuidedBackprop(AttributionMethod):
    name = "guided_backprop"
    default_batch_size = 32

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        return CaptumGuidedBackprop(model).attribute(images, target=targets)
