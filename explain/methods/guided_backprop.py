"""Guided Backpropagation (Springenberg et al. 2015) with captum's ``GuidedBackprop``.

Parameters (``SaliencyParams``): explained class, gradient space (the paper: the normalised
input), renderer.
"""
from __future__ import annotations

import torch
from captum.attr import GuidedBackprop as CaptumGuidedBackprop
from torch import nn

from counteraudit.explain.base import METHODS, AttributionMethod
from counteraudit.explain.input_space import in_gradient_space


@METHODS.register
class GuidedBackprop(AttributionMethod):
    name = "guided_backprop"
    default_batch_size = 32
    groups_models = True

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        model, images = in_gradient_space(model, images, self.params.gradient_space, self.name)
        return CaptumGuidedBackprop(model).attribute(images, target=targets)
